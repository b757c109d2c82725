/* fakequant.c: dequant(quant(x)) straight to float64, block rows in
 * parallel on qc_par_for's threads (qc_fake_quant_f64, qc_fake_quant_f64_dt
 * in quant.h): bit-equal to qc_fake_quant widened. */
#include "numerics/quant.h"

#include <float.h>
#include <math.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "core/par.h"
#include "core/qc.h"
#include "numerics/formats.h"
#include "numerics/minifloat.h"
#include "numerics/qpass.h"

/* ---- fused, parallel fake-quant to float64 (qc_fake_quant_f64) ------------
 * The same blocks, recipes and encoder as qq_quant_pass + qq_dequant_pass, one
 * block at a time: a block's codes go to a small per-thread buffer and come
 * straight back as values, out[r, c] = (double)(decode(code) * s) with the
 * float32 product qq_dequant_pass forms, so the result is qc_fake_quant's
 * widened, bit for bit. Block rows run in parallel (qc_par_for); a
 * single-block format (fp8_tensor) splits its rows instead. */

typedef struct fq_ctx {
  plan_t pl;
  int64_t rows, cols, br, bc, gc, ldo;
  qc_dtype dt;                 /* element type of in: float32, float64, float16 or bfloat16 */
  const void *in;
  double *out;
  float g;                     /* nvfp4 global scale */
  bscale one;                  /* the single block's scale (fp8_tensor path) */
  uint32_t amax[QC_PAR_MAX];   /* per-piece amax bits (reductions) */
  int bad[QC_PAR_MAX];         /* per-piece: a block held a non-finite value / no memory */
} fq_ctx;

/* out row segment = decode(codes) * s, widened. */
static void fq_emit(const uint8_t *codes, int64_t w, float s, int fp4, double *o) {
  if (fp4)
    for (int64_t c = 0; c < w; c++) o[c] = (double)(qq_e2m1_val[codes[c] & 0xf] * s);
  else
    for (int64_t c = 0; c < w; c++) o[c] = (double)(qq_e4m3_val[codes[c]] * s);
}

/* Rows [r0, r0 + nr) of the input as float32: in place for float32 input,
 * else converted into tile (nr x cols floats; float64 rounds to nearest). */
static const float *fq_rows_f32(const fq_ctx *x, int64_t r0, int64_t nr, float *tile) {
  const int64_t n = nr * x->cols, o = r0 * x->cols;
  switch (x->dt) {
    case QC_F64: for (int64_t i = 0; i < n; i++) tile[i] = (float)((const double *)x->in)[o + i]; return tile;
    case QC_F16: for (int64_t i = 0; i < n; i++) tile[i] = qc_f16_to_f32(((const uint16_t *)x->in)[o + i]); return tile;
    case QC_BF16: { /* the bits shifted into place, 8 at a time so the compiler keeps them in vector lanes */
      const uint16_t *h = (const uint16_t *)x->in + o;
      uint32_t *u = (uint32_t *)(void *)tile;
      int64_t i = 0;
      for (; i + 8 <= n; i += 8)
        for (int j = 0; j < 8; j++) u[i + j] = (uint32_t)h[i + j] << 16;
      for (; i < n; i++) u[i] = (uint32_t)h[i] << 16;
      return tile;
    }
    default: return (const float *)x->in + o;
  }
}

/* Block rows [lo, hi): every block's scale, codes and values. */
static void fq_blocks(void *p, int64_t lo, int64_t hi, int tid) {
  fq_ctx *x = p;
  const int64_t cols = x->cols, br = x->br, bc = x->bc;
  int64_t bh = br < x->rows ? br : x->rows, bw = bc < cols ? bc : cols;
  uint8_t *codes = malloc((size_t)(bh * bw));
  float *scratch = x->pl.two_stage ? malloc((size_t)(bh * bw) * sizeof *scratch) : NULL;
  float *tile = x->dt != QC_F32 ? malloc((size_t)(bh * cols) * sizeof *tile) : NULL;
  if (!codes || (x->pl.two_stage && !scratch) || (x->dt != QC_F32 && !tile)) { x->bad[tid] = 2; goto out; }
  for (int64_t bi = lo; bi < hi; bi++) {
    int64_t r0 = bi * br, r1 = r0 + br < x->rows ? r0 + br : x->rows;
    const float *blk = fq_rows_f32(x, r0, r1 - r0, tile); /* [r1 - r0, cols] */
    for (int64_t bj = 0; bj < x->gc; bj++) {
      int64_t c0 = bj * bc, c1 = c0 + bc < cols ? c0 + bc : cols, w = c1 - c0;
      uint32_t mb = 0;
      for (int64_t r = r0; r < r1; r++) {
        uint32_t m = qq_abs_max_bits(blk + (r - r0) * cols + c0, w);
        mb = m > mb ? m : mb;
      }
      if (mb >= 0x7f800000u) { x->bad[tid] = 1; goto out; }
      bscale b = qr_block_scale(&x->pl.rc, bitsf(mb), x->g);
      for (int64_t r = r0; r < r1; r++) qq_enc_run(blk + (r - r0) * cols + c0, codes + (r - r0) * w, w, b.k, b.div, x->pl.fp4);
      float s = b.deq;
      if (x->pl.two_stage) { /* stage 2 (see qq_stage2_block): requantize stage 1's values */
        for (int64_t i = 0; i < (r1 - r0) * w; i++) scratch[i] = qq_e4m3_val[codes[i]] * s;
        bscale b2 = qr_block_scale(&x->pl.rc2, bitsf(qq_abs_max_bits(scratch, (r1 - r0) * w)), 0.0f);
        for (int64_t r = r0; r < r1; r++) qq_enc_run(scratch + (r - r0) * w, codes + (r - r0) * w, w, b2.k, b2.div, 0);
        s = b2.deq;
      }
      for (int64_t r = r0; r < r1; r++) fq_emit(codes + (r - r0) * w, w, s, x->pl.fp4, x->out + r * x->ldo + c0);
    }
  }
out:
  free(codes);
  free(scratch);
  free(tile);
}

/* Rows [lo, hi): amax bits into x->amax[tid]. */
static void fq_amax(void *p, int64_t lo, int64_t hi, int tid) {
  fq_ctx *x = p;
  if (x->dt == QC_F32) { x->amax[tid] = qq_abs_max_bits((const float *)x->in + lo * x->cols, (hi - lo) * x->cols); return; }
  float *row = malloc((size_t)x->cols * sizeof *row);
  if (!row) { x->bad[tid] = 2; return; }
  uint32_t m = 0;
  for (int64_t r = lo; r < hi; r++) {
    uint32_t v = qq_abs_max_bits(fq_rows_f32(x, r, 1, row), x->cols);
    m = v > m ? v : m;
  }
  x->amax[tid] = m;
  free(row);
}

/* Rows [lo, hi) of the single-block format with scale x->one. */
static void fq_rows(void *p, int64_t lo, int64_t hi, int tid) {
  fq_ctx *x = p;
  uint8_t *codes = malloc((size_t)x->cols);
  float *row = x->dt != QC_F32 ? malloc((size_t)x->cols * sizeof *row) : NULL;
  if (!codes || (x->dt != QC_F32 && !row)) { x->bad[tid] = 2; goto out; }
  for (int64_t r = lo; r < hi; r++) {
    qq_enc_run(fq_rows_f32(x, r, 1, row), codes, x->cols, x->one.k, x->one.div, x->pl.fp4);
    fq_emit(codes, x->cols, x->one.deq, x->pl.fp4, x->out + r * x->ldo);
  }
out:
  free(codes);
  free(row);
}

/* The first non-finite element of in (n of dt) as the quantizers' error. */
static int fq_refuse(qc_dtype dt, const void *in, int64_t n, const char *what) {
  for (int64_t i = 0; i < n; i++) {
    double v = dt == QC_F64 ? ((const double *)in)[i]
               : dt == QC_F16 ? qc_f16_to_f32(((const uint16_t *)in)[i])
               : dt == QC_BF16 ? qc_bf16_to_f32(((const uint16_t *)in)[i]) : ((const float *)in)[i];
    if (!isfinite(v))
      return qc_err("%s: non-finite value %g at flat index %lld: a quantizer never maps NaN or Inf silently", what, v,
                    (long long)i);
  }
  return qc_err("%s: a non-finite value: a quantizer never maps NaN or Inf silently", what);
}

/* The tensor's amax bits, rows in parallel. */
static uint32_t fq_tensor_amax(fq_ctx *x) {
  memset(x->amax, 0, sizeof x->amax);
  qc_par_for(x->rows, 16, fq_amax, x);
  uint32_t m = 0;
  for (int i = 0; i < QC_PAR_MAX; i++) m = x->amax[i] > m ? x->amax[i] : m;
  return m;
}

int qc_fake_quant_f64(const char *fmt, const char *profile, int64_t rows, int64_t cols, const float *in, double *out,
                      int64_t ldo, const char *what) {
  return qc_fake_quant_f64_dt(fmt, profile, rows, cols, QC_F32, in, out, ldo, what);
}

int qc_fake_quant_f64_dt(const char *fmt, const char *profile, int64_t rows, int64_t cols, qc_dtype dt, const void *in,
                         double *out, int64_t ldo, const char *what) {
  qc_qfmt f = QC_QF_NONE;
  qc_qprof p = QC_QP_VLLM;
  int rc;
  if ((rc = qc_qfmt_parse(fmt, &f))) return rc;
  if (profile && (rc = qc_qprof_parse(profile, &p))) return rc;
  if (rows < 1 || cols < 1) return QC_OK;
  qq_tables_init();
  fq_ctx *x = calloc(1, sizeof *x);
  if (!x) return qc_err_sys("out of memory for a quantizer");
  x->pl = qq_make_plan(f, p);
  x->rows = rows;
  x->cols = cols;
  x->ldo = ldo;
  x->dt = dt;
  x->in = in;
  if (dt != QC_F32 && dt != QC_F64 && dt != QC_F16 && dt != QC_BF16) {
    free(x);
    return qc_err("%s: element type %s cannot be quantized: expected a float type", what, qc_dtype_name(dt));
  }
  x->out = out;
  x->br = x->pl.br ? x->pl.br : rows;
  x->bc = x->pl.bc ? x->pl.bc : cols;
  int64_t gr = (rows + x->br - 1) / x->br;
  x->gc = (cols + x->bc - 1) / x->bc;
  int bad = 0;
  if (f == QC_QF_NONE) {
    bad = fq_tensor_amax(x) >= 0x7f800000u;
    float *row = malloc((size_t)cols * sizeof *row);
    if (!row) bad = 2;
    for (int64_t r = 0; !bad && r < rows; r++) {
      const float *v = fq_rows_f32(x, r, 1, row);
      for (int64_t c = 0; c < cols; c++) out[r * ldo + c] = v[c];
    }
    free(row);
  } else if (f == QC_QF_NVFP4 || (gr == 1 && x->gc == 1 && !x->pl.two_stage)) {
    uint32_t m = fq_tensor_amax(x);
    bad = m >= 0x7f800000u;
    if (!bad && f == QC_QF_NVFP4) {
      x->g = qq_nvfp4_g(&x->pl, bitsf(m));
      qc_par_for(gr, 1, fq_blocks, x);
    } else if (!bad) {
      x->one = qr_block_scale(&x->pl.rc, bitsf(m), 0.0f);
      qc_par_for(rows, 16, fq_rows, x);
    }
  } else {
    qc_par_for(gr, 1, fq_blocks, x);
  }
  for (int i = 0; i < QC_PAR_MAX; i++) bad = bad ? bad : x->bad[i];
  free(x);
  if (bad == 2) return qc_err_sys("out of memory for a quantizer's block buffer");
  return bad ? fq_refuse(dt, in, rows * cols, what) : QC_OK;
}
