/* decode.c: tensors decoded to float64 (see decode.h). */
#include "numerics/decode.h"

#include <math.h>
#include <string.h>

#include "core/par.h"
#include "core/qc.h"
#include "numerics/formats.h"

/* A conversion of the float types (read directly) on qc_par_for's threads:
 * each element is converted alone, so the result does not depend on the
 * pieces. */
typedef struct conv {
  qc_dtype dt;
  const void *p;
  double *out;  /* float64 out, or */
  float *out32; /* float32 out (dt not float64) */
} conv;

static void conv_piece(void *ctx, int64_t lo, int64_t hi, int tid) {
  (void)tid;
  const conv *c = ctx;
  const uint16_t *h = c->p;
  if (c->out32) {
    switch (c->dt) {
      case QC_F32: memcpy(c->out32 + lo, (const float *)c->p + lo, (size_t)(hi - lo) * 4); break;
      case QC_F16: for (int64_t i = lo; i < hi; i++) c->out32[i] = qc_f16_to_f32(h[i]); break;
      case QC_BF16: for (int64_t i = lo; i < hi; i++) c->out32[i] = qc_bf16_to_f32(h[i]); break;
      default: break;
    }
    return;
  }
  switch (c->dt) {
    case QC_F64: memcpy(c->out + lo, (const double *)c->p + lo, (size_t)(hi - lo) * 8); break;
    case QC_F32: for (int64_t i = lo; i < hi; i++) c->out[i] = ((const float *)c->p)[i]; break;
    case QC_F16: for (int64_t i = lo; i < hi; i++) c->out[i] = qc_f16_to_f32(h[i]); break;
    case QC_BF16: for (int64_t i = lo; i < hi; i++) c->out[i] = qc_bf16_to_f32(h[i]); break;
    default: break;
  }
}

int qc_float_to_f64(qc_dtype dt, const void *src, int64_t n, double *dst) {
  if (dt != QC_F64 && dt != QC_F32 && dt != QC_F16 && dt != QC_BF16)
    return qc_err("cannot convert element type %s to a float", qc_dtype_name(dt));
  conv c = {dt, src, dst, NULL};
  qc_par_for(n, (int64_t)1 << 16, conv_piece, &c);
  return QC_OK;
}

int qc_float_to_f32(qc_dtype dt, const void *src, int64_t n, float *dst) {
  if (dt != QC_F32 && dt != QC_F16 && dt != QC_BF16)
    return qc_err("cannot convert element type %s to float32 exactly", qc_dtype_name(dt));
  conv c = {dt, src, NULL, dst};
  if (n > 0) qc_par_for(n, (int64_t)1 << 16, conv_piece, &c);
  return QC_OK;
}

typedef struct narrow {
  const double *src;
  float *dst;
} narrow;

static void narrow_piece(void *ctx, int64_t lo, int64_t hi, int tid) {
  (void)tid;
  const narrow *c = ctx;
  for (int64_t i = lo; i < hi; i++) c->dst[i] = (float)c->src[i];
}

void qc_f64_to_f32s(const double *src, int64_t n, float *dst) {
  narrow c = {src, dst};
  if (n > 0) qc_par_for(n, (int64_t)1 << 16, narrow_piece, &c);
}

int qc_tensor_to_f64(const qc_tensor *t, double *out) {
  int64_t n = qc_numel(t);
  const void *p = t->data;
  if (n >= ((int64_t)1 << 18) && (t->dtype == QC_F64 || t->dtype == QC_F32 || t->dtype == QC_F16 || t->dtype == QC_BF16))
    return qc_float_to_f64(t->dtype, p, n, out); /* a large float tensor: in pieces, beside the GEMMs it feeds */
  switch (t->dtype) {
    case QC_F64: memcpy(out, p, (size_t)n * 8); break;
    case QC_F32: for (int64_t i = 0; i < n; i++) out[i] = ((const float *)p)[i]; break;
    case QC_F16: for (int64_t i = 0; i < n; i++) out[i] = qc_f16_to_f32(((const uint16_t *)p)[i]); break;
    case QC_BF16: for (int64_t i = 0; i < n; i++) out[i] = qc_bf16_to_f32(((const uint16_t *)p)[i]); break;
    case QC_I32: for (int64_t i = 0; i < n; i++) out[i] = ((const int32_t *)p)[i]; break;
    case QC_I64: for (int64_t i = 0; i < n; i++) out[i] = (double)((const int64_t *)p)[i]; break;
    case QC_U8: for (int64_t i = 0; i < n; i++) out[i] = ((const uint8_t *)p)[i]; break;
    case QC_I8: for (int64_t i = 0; i < n; i++) out[i] = ((const int8_t *)p)[i]; break;
    case QC_E4M3: for (int64_t i = 0; i < n; i++) out[i] = qc_e4m3_to_f32(((const uint8_t *)p)[i]); break;
    case QC_E5M2: for (int64_t i = 0; i < n; i++) out[i] = qc_e5m2_to_f32(((const uint8_t *)p)[i]); break;
    case QC_E8M0: for (int64_t i = 0; i < n; i++) out[i] = qc_e8m0_to_f32(((const uint8_t *)p)[i]); break;
    case QC_E2M1X2:
      for (int64_t i = 0; i < n; i++) {
        uint8_t b = ((const uint8_t *)p)[i];
        out[2 * i] = qc_e2m1_to_f32(b & 0xf);
        out[2 * i + 1] = qc_e2m1_to_f32(b >> 4);
      }
      break;
    default: return qc_err("tensor '%s': unknown dtype %d", t->name, (int)t->dtype);
  }
  return QC_OK;
}

int qc_tensor_decode_f64(const qc_tensor *t, qc_tensor *out) {
  int64_t shape[QC_MAXDIM];
  memcpy(shape, t->shape, sizeof shape);
  if (t->dtype == QC_E2M1X2 && t->ndim > 0) shape[t->ndim - 1] *= 2;
  int rc = qc_tensor_alloc(out, t->name, QC_F64, t->ndim, shape);
  if (rc) return rc;
  rc = qc_tensor_to_f64(t, (double *)out->data);
  if (rc) qc_tensor_free(out);
  return rc;
}

double qc_dtype_unit(qc_dtype d) {
  static const int bits[QC_DTYPE_COUNT] = {[QC_F64] = 53, [QC_F32] = 24,  [QC_F16] = 11,
                                           [QC_BF16] = 8, [QC_E4M3] = 4, [QC_E5M2] = 3, [QC_E2M1X2] = 2};
  return d >= 0 && d < QC_DTYPE_COUNT && bits[d] ? ldexp(1.0, -bits[d]) : 0.0;
}
