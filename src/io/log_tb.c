/* log_tb.c: TensorBoard event files without TensorFlow or a protobuf
 * library. The framing is TFRecord: per record a little-endian u64 length,
 * the masked CRC-32C of those 8 bytes, the data, the masked CRC-32C of the
 * data; both CRCs are checked. The data is an Event message, of which this
 * reader decodes what scalars need (field numbers of TensorFlow's
 * event.proto, summary.proto, tensor.proto, tensor_shape.proto):
 *
 *   Event        2 step (int64)       5 summary (Summary)
 *   Summary      1 value (repeated Value)
 *   Value        1 tag (string)       2 simple_value (float)   8 tensor (TensorProto)
 *   TensorProto  1 dtype (enum)       2 tensor_shape           4 tensor_content (bytes)
 *                5 float_val (packed) 6 double_val (packed)    7 int_val   10 int64_val
 *                13 half_val (int32 holding float16 / bfloat16 bits)
 *   TensorShape  2 dim (repeated Dim: 1 size)
 *
 * A value holding one float, double, half, bfloat16 or integer is a scalar;
 * other values (histograms, images, text, tensors of several elements) are
 * not metrics and are passed over, as are events without a summary. Wire
 * types 0 (varint), 1 (64-bit), 2 (length-delimited) and 5 (32-bit) are
 * skipped when unknown; anything else is a corrupt record. */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include "core/crc32c.h"
#include "core/qc.h"
#include "io/l3log.h"
#include "numerics/decode.h"

typedef struct {
  const uint8_t *p, *e;
} pb;

/* One varint; 0 on success. */
static inline int varint(pb *b, uint64_t *v) {
  if (b->p < b->e && *b->p < 0x80) { *v = *b->p++; return 0; } /* one byte: keys and short lengths */
  uint64_t r = 0;
  for (int s = 0; s < 64 && b->p < b->e; s += 7) {
    uint8_t c = *b->p++;
    r |= (uint64_t)(c & 0x7f) << s;
    if (!(c & 0x80)) { *v = r; return 0; }
  }
  return -1;
}

/* The next field: its number and wire type; for wire type 2 the payload in
 * *sub, for 0 the value in *v, for 1 and 5 the bytes in *sub. 0 on success,
 * 1 at the end, -1 when malformed. */
static inline int next_field(pb *b, uint32_t *num, int *wt, uint64_t *v, pb *sub) {
  if (b->p >= b->e) return 1;
  uint64_t key;
  if (varint(b, &key) || (key >> 3) == 0 || (key >> 3) > 0x1fffffff) return -1;
  *num = (uint32_t)(key >> 3);
  *wt = (int)(key & 7);
  switch (*wt) {
    case 0: return varint(b, v);
    case 1: case 5: {
      size_t n = *wt == 1 ? 8 : 4;
      if ((size_t)(b->e - b->p) < n) return -1;
      sub->p = b->p;
      sub->e = b->p + n;
      b->p += n;
      return 0;
    }
    case 2: {
      uint64_t n;
      if (varint(b, &n) || n > (uint64_t)(b->e - b->p)) return -1;
      sub->p = b->p;
      sub->e = b->p + n;
      b->p += n;
      return 0;
    }
    default: return -1;
  }
}

static float rd_f32(const uint8_t *p) { float f; memcpy(&f, p, 4); return f; }
static double rd_f64(const uint8_t *p) { double d; memcpy(&d, p, 8); return d; }
static uint64_t rd_u64(const uint8_t *p) { uint64_t v; memcpy(&v, p, 8); return v; }
static uint32_t rd_u32(const uint8_t *p) { uint32_t v; memcpy(&v, p, 4); return v; }

/* tensorflow DataType values this reader decodes */
enum { DT_FLOAT = 1, DT_DOUBLE = 2, DT_INT32 = 3, DT_INT64 = 9, DT_BFLOAT16 = 14, DT_HALF = 19 };

/* Elements of a TensorShapeProto (1 for a scalar); -1 when malformed. */
static int64_t shape_numel(pb s) {
  int64_t n = 1;
  uint32_t num;
  int wt, r;
  uint64_t v;
  pb sub;
  while ((r = next_field(&s, &num, &wt, &v, &sub)) == 0) {
    if (num != 2 || wt != 2) continue;
    int64_t size = 1;
    pb d = sub;
    while ((r = next_field(&d, &num, &wt, &v, &sub)) == 0)
      if (num == 1 && wt == 0) size = (int64_t)v;
    if (r < 0) return -1;
    if (size < 0 || size > ((int64_t)1 << 40)) return -1;
    n *= size;
    if (n > ((int64_t)1 << 40)) return 2; /* large: not a scalar */
  }
  return r < 0 ? -1 : n;
}

/* A TensorProto holding one number: *ok 1, its value in *out and the unit
 * roundoff of its stored type in *ro (0: an integer). 0, or -1 when
 * malformed. */
static int tensor_scalar(pb t, double *out, int *ok, double *ro) {
  uint64_t dtype = 0, v;
  int64_t numel = 1;
  pb content = {0}, vals = {0}, sub;
  int vals_field = 0, vals_wt = -1, wt, r;
  uint32_t num;
  uint64_t scalar_v = 0;
  *ok = 0;
  while ((r = next_field(&t, &num, &wt, &v, &sub)) == 0) {
    if (num == 1 && wt == 0) dtype = v;
    else if (num == 2 && wt == 2) { if ((numel = shape_numel(sub)) < 0) return -1; }
    else if (num == 4 && wt == 2) content = sub;
    else if ((num == 5 || num == 6 || num == 7 || num == 10 || num == 13) && !vals_field) {
      vals_field = (int)num;
      vals_wt = wt;
      vals = sub;
      scalar_v = v;
    }
  }
  if (r < 0) return -1;
  if (numel != 1) return 0;
  size_t esize = dtype == DT_FLOAT || dtype == DT_INT32 ? 4 : dtype == DT_DOUBLE || dtype == DT_INT64 ? 8 :
                 dtype == DT_HALF || dtype == DT_BFLOAT16 ? 2 : 0;
  if (!esize) return 0; /* strings, booleans, complex: not a metric */
  *ro = dtype == DT_FLOAT ? qc_dtype_unit(QC_F32) : dtype == DT_DOUBLE ? qc_dtype_unit(QC_F64) : dtype == DT_HALF ? qc_dtype_unit(QC_F16)
        : dtype == DT_BFLOAT16 ? qc_dtype_unit(QC_BF16) : 0;
  if (content.p && (size_t)(content.e - content.p) == esize) {
    const uint8_t *c = content.p;
    switch (dtype) {
      case DT_FLOAT: *out = rd_f32(c); break;
      case DT_DOUBLE: *out = rd_f64(c); break;
      case DT_INT32: *out = (double)(int32_t)rd_u32(c); break;
      case DT_INT64: *out = (double)(int64_t)rd_u64(c); break;
      default: {
        qc_tensor h = {.dtype = dtype == DT_HALF ? QC_F16 : QC_BF16, .ndim = 1, .shape = {1}, .data = (void *)c, .nbytes = 2};
        if (qc_tensor_to_f64(&h, out)) return 0;
      }
    }
    *ok = 1;
    return 0;
  }
  if (!vals_field) return 0;
  /* repeated scalars: packed (wire type 2) or one unpacked element */
  pb e = vals;
  uint64_t iv = scalar_v;
  if (vals_wt == 2 && (vals_field == 7 || vals_field == 10 || vals_field == 13)) {
    if (varint(&e, &iv)) return -1;
  }
  switch (vals_field) {
    case 5:
      if ((dtype != DT_FLOAT) || (size_t)(e.e - e.p) < 4) return 0;
      *out = rd_f32(e.p);
      break;
    case 6:
      if (dtype != DT_DOUBLE || (size_t)(e.e - e.p) < 8) return 0;
      *out = rd_f64(e.p);
      break;
    case 7:
      if (dtype != DT_INT32) return 0;
      *out = (double)(int32_t)(uint32_t)iv;
      break;
    case 10:
      if (dtype != DT_INT64) return 0;
      *out = (double)(int64_t)iv;
      break;
    case 13: {
      if (dtype != DT_HALF && dtype != DT_BFLOAT16) return 0;
      uint16_t bits = (uint16_t)iv;
      qc_tensor h = {.dtype = dtype == DT_HALF ? QC_F16 : QC_BF16, .ndim = 1, .shape = {1}, .data = &bits, .nbytes = 2};
      if (qc_tensor_to_f64(&h, out)) return 0;
      break;
    }
  }
  *ok = 1;
  return 0;
}

/* One Summary: each scalar value becomes (step, tag, value). Returns QC_OK,
 * or -1 when malformed (the caller names the record). */
static int summary(pb s, int64_t step, qc_l3_log *out, int *rowed, int *rc) {
  uint32_t num;
  int wt, r;
  uint64_t v;
  pb sub;
  while ((r = next_field(&s, &num, &wt, &v, &sub)) == 0) {
    if (num != 1 || wt != 2) continue;
    pb val = sub, tag = {0}, tensor = {0};
    int has_simple = 0, has_tensor = 0;
    float simple = 0;
    while ((r = next_field(&val, &num, &wt, &v, &sub)) == 0) {
      if (num == 1 && wt == 2) tag = sub;
      else if (num == 2 && wt == 5) { simple = rd_f32(sub.p); has_simple = 1; }
      else if (num == 8 && wt == 2) { tensor = sub; has_tensor = 1; }
    }
    if (r < 0) return -1;
    double x = simple, ro = qc_dtype_unit(QC_F32); /* simple_value is a float32 */
    int ok = has_simple;
    if (!ok && has_tensor && tensor_scalar(tensor, &x, &ok, &ro) < 0) return -1;
    out->set_roundoff = ro;
    if (!ok || !tag.p) continue;
    if (!*rowed) {
      if ((*rc = qc_l3_log_row(out, step))) return 0;
      *rowed = 1;
    }
    if ((*rc = qc_l3_log_set(out, (const char *)tag.p, (size_t)(tag.e - tag.p), x))) return 0;
  }
  return r < 0 ? -1 : 0;
}

int qc_log_parse_tfevents(const char *buf, size_t n, qc_l3_log *out) {
  const uint8_t *p = (const uint8_t *)buf, *e = p + n;
  snprintf(out->format, sizeof out->format, "tfevents");
  for (long rec = 1; p < e; rec++) {
    size_t at = (size_t)(p - (const uint8_t *)buf);
    if (e - p < 12) return qc_err("log '%s': record %ld at byte %zu is truncated: %zu bytes left of a 12-byte header", out->path, rec, at, (size_t)(e - p));
    uint64_t len = rd_u64(p);
    if (qc_crc32c_mask(qc_crc32c(p, 8)) != rd_u32(p + 8))
      return qc_err("log '%s': record %ld at byte %zu: the length's CRC does not match (corrupt event file)", out->path, rec, at);
    if (len > (uint64_t)(e - p) - 12 || (uint64_t)(e - p) - 12 - len < 4)
      return qc_err("log '%s': record %ld at byte %zu is truncated: %llu data bytes and a CRC announced, %zu bytes left", out->path,
                    rec, at, (unsigned long long)len, (size_t)(e - p) - 12);
    const uint8_t *d = p + 12;
    if (qc_crc32c_mask(qc_crc32c(d, (size_t)len)) != rd_u32(d + len))
      return qc_err("log '%s': record %ld at byte %zu: the data's CRC does not match (corrupt event file)", out->path, rec, at);
    p = d + len + 4;
    /* the Event: its step and summary, in whatever order they come */
    pb ev = {d, d + len}, sub, sum = {0};
    uint32_t num;
    int wt, r, has_sum = 0;
    uint64_t v, step = 0;
    while ((r = next_field(&ev, &num, &wt, &v, &sub)) == 0) {
      if (num == 2 && wt == 0) step = v;
      else if (num == 5 && wt == 2) { sum = sub; has_sum = 1; }
    }
    if (r < 0) return qc_err("log '%s': record %ld at byte %zu: not an Event message (malformed protobuf)", out->path, rec, at);
    if (!has_sum) continue;
    int rowed = 0, rc = QC_OK;
    if (summary(sum, (int64_t)step, out, &rowed, &rc) < 0)
      return qc_err("log '%s': record %ld at byte %zu: a malformed Summary", out->path, rec, at);
    if (rc) return rc;
  }
  return QC_OK;
}
