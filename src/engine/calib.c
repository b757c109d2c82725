/* calib.c: calibration files against qatcheck's quantizers (calib.h). */
#include "engine/calib.h"

#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "core/qc.h"
#include "io/qcal.h"
#include "numerics/formats.h"
#include "numerics/quant.h"

/* The row of (profile, format), appended when new. */
static qc_calib_row *row_for(qc_calib_row **rows, int *n, int *cap, const char *prof, const char *fmt) {
  for (int i = 0; i < *n; i++)
    if (!strcmp((*rows)[i].profile, prof) && !strcmp((*rows)[i].format, fmt)) return &(*rows)[i];
  if (*n == *cap) {
    int nc = *cap ? 2 * *cap : 16;
    qc_calib_row *r = realloc(*rows, (size_t)nc * sizeof *r);
    if (!r) return NULL;
    *rows = r;
    *cap = nc;
  }
  qc_calib_row *r = &(*rows)[(*n)++];
  memset(r, 0, sizeof *r);
  snprintf(r->profile, sizeof r->profile, "%s", prof);
  snprintf(r->format, sizeof r->format, "%s", fmt);
  return r;
}

/* Count the differing bytes of two n-byte arrays; the first one is noted. */
static int64_t diff(const uint8_t *a, const uint8_t *b, int64_t n, const char *part, const char *where, qc_calib_row *r) {
  int64_t bad = 0;
  for (int64_t i = 0; i < n; i++)
    if (a[i] != b[i]) {
      if (!bad && !r->first[0])
        snprintf(r->first, sizeof r->first, "%s: %s byte %lld: producer 0x%02x qatcheck 0x%02x", where, part, (long long)i,
                 a[i], b[i]);
      bad++;
    }
  return bad;
}

/* One record: quantize its input, compare. */
static int check_one(const qc_qcal_output *o, const qc_backend *be, const char *file, qc_calib_row *r, float *x) {
  qc_qfmt f;
  qc_qprof p;
  int rc;
  char where[512];
  snprintf(where, sizeof where, "%s: %s/%s on input '%s'", file, o->profile, o->format, o->in->name);
  if ((rc = qc_qfmt_parse(o->format, &f)) || (rc = qc_qprof_parse(o->profile, &p))) return rc;
  const int64_t rows = o->in->rows, cols = o->in->cols, n = rows * cols;
  /* the values sit in the file's buffer wherever their chunk starts (not
   * aligned for a float or a uint16_t): each is copied out, never read
   * through a cast pointer */
  const unsigned char *in = o->in->data;
  for (int64_t i = 0; i < n; i++) {
    if (o->in->dtype == QC_BF16) {
      uint16_t h;
      memcpy(&h, in + 2 * i, sizeof h);
      x[i] = qc_bf16_to_f32(h);
    } else {
      memcpy(&x[i], in + 4 * i, sizeof x[i]);
    }
  }
  qc_dtype qdt, sdt;
  int64_t qs[2], ss[2];
  int sn, gn;
  qc_quant_layout(f, p, rows, cols, &qdt, qs, &sdt, &sn, ss, &gn);
  int64_t nq = qs[0] * qs[1], ns = (sn == 1 ? 1 : ss[0] * ss[1]) * (int64_t)qc_dtype_size(sdt);
  if (o->nq != nq || o->ns != ns || o->has_g != gn)
    return qc_err("%s: the record holds %lld payload and %lld scale bytes%s: expected %lld and %lld%s", where,
                  (long long)o->nq, (long long)o->ns, o->has_g ? " and a global scale" : "", (long long)nq, (long long)ns,
                  gn ? " and a global scale" : "");
  const uint8_t *q, *s;
  float g = 0.0f;
  qc_quantized z;
  qc_qout qo;
  memset(&z, 0, sizeof z);
  memset(&qo, 0, sizeof qo);
  if (!be) {
    if ((rc = qc_quantize(f, p, rows, cols, x, NULL, &z, where))) return rc;
    q = z.q.data;
    s = z.scale.data;
    if (gn) g = *(const float *)z.gscale.data;
  } else {
    int64_t nsg = sn == 1 ? 1 : ss[0] * ss[1];
    qo.q = qc_malloc((size_t)nq + 1, "calibration payload");
    qo.scale = qc_malloc((size_t)nsg * 4 + 4, "calibration scales");
    qo.scale_b = qc_malloc((size_t)nsg + 1, "calibration scale bytes");
    if (!qo.q || !qo.scale || !qo.scale_b) rc = QC_ESYS;
    else if (!be->quantize) rc = qc_err("%s: backend '%s' has no quantizer", where, be->name);
    else rc = be->quantize(be, o->format, o->profile, rows, cols, x, &qo);
    q = qo.q;
    s = sdt == QC_F32 ? (const uint8_t *)qo.scale : qo.scale_b;
    g = qo.gscale;
  }
  if (!rc) {
    r->bad_payload += diff(o->payload, q, nq, "payload", where, r);
    r->bad_scale += diff(o->scale, s, ns, "scale", where, r);
    if (gn) r->bad_global += diff((const uint8_t *)&o->g, (const uint8_t *)&g, 4, "global scale", where, r);
    r->values += n;
    r->records++;
  }
  free(qo.q);
  free(qo.scale);
  free(qo.scale_b);
  qc_quantized_free(&z);
  return rc;
}

static int check_file(const char *file, const qc_backend *be, qc_calib_row **rows, int *n, int *cap) {
  qc_qcal c;
  int rc = qc_qcal_read(file, &c);
  if (rc) return rc;
  int64_t maxn = 1;
  for (int i = 0; i < c.nin; i++) maxn = c.in[i].rows * c.in[i].cols > maxn ? c.in[i].rows * c.in[i].cols : maxn;
  float *x = qc_malloc((size_t)maxn * sizeof *x, "calibration input");
  if (!x) rc = QC_ESYS;
  if (!rc && c.nout == 0) rc = qc_err("calibration file '%s': holds no producer output: nothing to compare", file);
  for (int i = 0; !rc && i < c.nout; i++) {
    qc_calib_row *r = row_for(rows, n, cap, c.out[i].profile, c.out[i].format);
    rc = r ? check_one(&c.out[i], be, file, r, x) : qc_err_sys("out of memory for calibration rows");
  }
  free(x);
  qc_qcal_free(&c);
  return rc;
}

static int cmp_str(const void *a, const void *b) { return strcmp(*(char *const *)a, *(char *const *)b); }

/* A folder's *.qcal files in name order, each compared. */
static int check_dir(const char *dir, const qc_backend *be, qc_calib_row **rows, int *n, int *cap) {
  DIR *d = opendir(dir);
  if (!d) return qc_err("calibration folder '%s': cannot open", dir);
  char **names = NULL;
  int nn = 0, rc = QC_OK;
  for (struct dirent *e; (e = readdir(d));) {
    size_t l = strlen(e->d_name);
    if (l < 6 || strcmp(e->d_name + l - 5, ".qcal") != 0) continue;
    char **nw = realloc(names, (size_t)(nn + 1) * sizeof *names);
    if (!nw) { rc = qc_err_sys("out of memory listing '%s'", dir); break; }
    names = nw;
    size_t need = strlen(dir) + l + 2;
    if (!(names[nn] = malloc(need))) { rc = qc_err_sys("out of memory listing '%s'", dir); break; }
    snprintf(names[nn++], need, "%s/%s", dir, e->d_name);
  }
  closedir(d);
  if (!rc && nn == 0) rc = qc_err("calibration folder '%s': no *.qcal file in it", dir);
  if (!rc) qsort(names, (size_t)nn, sizeof *names, cmp_str);
  for (int i = 0; !rc && i < nn; i++) rc = check_file(names[i], be, rows, n, cap);
  for (int i = 0; i < nn; i++) free(names[i]);
  free(names);
  return rc;
}

int qc_calib_check(const char *const *paths, int npaths, const qc_backend *be, qc_calib_row **rows, int *nrows) {
  int n = 0, cap = 0, rc = QC_OK;
  *rows = NULL;
  for (int i = 0; !rc && i < npaths; i++) {
    struct stat st;
    if (stat(paths[i], &st) != 0) rc = qc_err("calibration path '%s': not found", paths[i]);
    else if (S_ISDIR(st.st_mode)) rc = check_dir(paths[i], be, rows, &n, &cap);
    else rc = check_file(paths[i], be, rows, &n, &cap);
  }
  if (rc) {
    free(*rows);
    *rows = NULL;
    n = 0;
  }
  *nrows = n;
  return rc;
}
