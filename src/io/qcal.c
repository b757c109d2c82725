/* qcal.c: calibration files (qcal.h) read whole into memory and indexed. */
#include "io/qcal.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/file.h"
#include "core/qc.h"

/* The largest calibration file read (whole, into memory): captured
 * activations of a few layers are a few GB. */
#define QCAL_MAX ((size_t)32 << 30)

static uint32_t rd32(const uint8_t *p) { uint32_t v; memcpy(&v, p, 4); return v; }
static int64_t rd64(const uint8_t *p) { int64_t v; memcpy(&v, p, 8); return v; }

/* Copy a fixed-width, NUL-padded name. */
static void name_of(char *dst, const uint8_t *src, size_t n) {
  memcpy(dst, src, n);
  dst[n] = 0;
}

int qc_qcal_read(const char *path, qc_qcal *q) {
  memset(q, 0, sizeof *q);
  char *text = NULL;
  size_t n = 0;
  /* a FIFO or device (also one inside a calibration folder) is refused unopened */
  int rc = qc_read_file(path, "calibration file", QCAL_MAX, &text, &n);
  if (rc) return rc;
  q->buf = (uint8_t *)text;
  rc = QC_EINPUT;
  long len = (long)n;
  if (len < 8) {
    rc = qc_err("calibration file '%s': too short or unreadable: expected the magic QCAL0001", path);
    goto done;
  }
  if (memcmp(q->buf, "QCAL0001", 8) != 0) { rc = qc_err("calibration file '%s': bad magic: expected QCAL0001", path); goto done; }
  /* two passes: count, then index */
  for (int pass = 0; pass < 2; pass++) {
    int ni = 0, no = 0;
    for (size_t pos = 8; pos < (size_t)len;) {
      if ((size_t)len - pos < 16) { rc = qc_err("calibration file '%s': chunk header at offset %zu runs past the end", path, pos); goto done; }
      uint32_t tag = rd32(q->buf + pos);
      uint64_t blen = (uint64_t)rd64(q->buf + pos + 8);
      const uint8_t *b = q->buf + pos + 16;
      if (blen > (uint64_t)len - pos - 16) { rc = qc_err("calibration file '%s': chunk at offset %zu runs past the end", path, pos); goto done; }
      if (tag == 1) {
        if (blen < 56) { rc = qc_err("calibration file '%s': input chunk at offset %zu is too short", path, pos); goto done; }
        uint32_t dt = rd32(b + 4);
        int64_t rows = rd64(b + 8), cols = rd64(b + 16);
        size_t es = dt == 1 ? 2 : 4;
        if (dt > 1 || rows < 1 || cols < 1 || rows > (1ll << 31) || cols > (1ll << 31) ||
            (uint64_t)rows * (uint64_t)cols * es != blen - 56) {
          rc = qc_err("calibration file '%s': input chunk at offset %zu: dtype %u, [%lld, %lld] does not match its %llu bytes",
                      path, pos, dt, (long long)rows, (long long)cols, (unsigned long long)blen);
          goto done;
        }
        if (pass) {
          qc_qcal_input *in = &q->in[ni];
          in->id = rd32(b);
          in->dtype = dt ? QC_BF16 : QC_F32;
          in->rows = rows;
          in->cols = cols;
          name_of(in->name, b + 24, 32);
          in->data = b + 56;
        }
        ni++;
      } else if (tag == 2) {
        if (blen < 72) { rc = qc_err("calibration file '%s': output chunk at offset %zu is too short", path, pos); goto done; }
        uint32_t flags = rd32(b + 52);
        int64_t nq = rd64(b + 56), ns = rd64(b + 64);
        if (nq < 0 || ns < 0 || (uint64_t)nq + (uint64_t)ns + (flags & 1 ? 4u : 0u) != blen - 72) {
          rc = qc_err("calibration file '%s': output chunk at offset %zu: sizes do not add up", path, pos);
          goto done;
        }
        if (pass) {
          qc_qcal_output *o = &q->out[no];
          name_of(o->profile, b, 24);
          name_of(o->format, b + 24, 24);
          uint32_t id = rd32(b + 48);
          for (int i = 0; i < q->nin && !o->in; i++)
            if (q->in[i].id == id) o->in = &q->in[i];
          if (!o->in) { rc = qc_err("calibration file '%s': output chunk at offset %zu names input %u, which is not in the file", path, pos, id); goto done; }
          o->nq = nq;
          o->ns = ns;
          o->payload = b + 72;
          o->scale = b + 72 + nq;
          o->has_g = (int)(flags & 1);
          if (o->has_g) memcpy(&o->g, b + 72 + nq + ns, 4);
        }
        no++;
      } else {
        rc = qc_err("calibration file '%s': unknown chunk tag %u at offset %zu", path, tag, pos);
        goto done;
      }
      pos += 16 + (size_t)blen;
    }
    if (!pass) {
      q->nin = ni;
      q->nout = no;
      if (!(q->in = qc_calloc((size_t)ni + 1, sizeof *q->in, "calibration inputs")) ||
          !(q->out = qc_calloc((size_t)no + 1, sizeof *q->out, "calibration outputs"))) { rc = QC_ESYS; goto done; }
    }
  }
  rc = QC_OK;
done:
  if (rc) qc_qcal_free(q);
  return rc;
}

void qc_qcal_free(qc_qcal *q) {
  free(q->buf);
  free(q->in);
  free(q->out);
  memset(q, 0, sizeof *q);
}
