/* qgrid.c: the quantizers' generic pass (see qpass.h), over the scale
 * grid of a plan (qpass.c): per block, the amax, then the recipe's scale
 * (numerics/recipe.h), then the element encoder; fp8_block128_ue8m0 runs
 * two stages (quantize, dequantize, requantize) except under te. Block
 * rows run on qc_par_for's threads, each block alone, so the bytes do not
 * depend on the thread count; the dequantization likewise by rows. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "core/par.h"
#include "core/qc.h"
#include "numerics/formats.h"
#include "numerics/minifloat.h"
#include "numerics/qpass.h"

/* ---- the generic pass -------------------------------------------------- */

/* Largest |x[i]| as float32 bits (for non-negative floats the integer order
 * is the float order; >= 0x7f800000 means an Inf or NaN is present). Four
 * accumulators, so the compiler can keep them in vector lanes. */
uint32_t qq_abs_max_bits(const float *x, int64_t n) {
  uint32_t m0 = 0, m1 = 0, m2 = 0, m3 = 0;
  int64_t i = 0;
  for (; i + 4 <= n; i += 4) {
    uint32_t u0 = fbits(x[i]) & 0x7fffffffu, u1 = fbits(x[i + 1]) & 0x7fffffffu;
    uint32_t u2 = fbits(x[i + 2]) & 0x7fffffffu, u3 = fbits(x[i + 3]) & 0x7fffffffu;
    m0 = u0 > m0 ? u0 : m0;
    m1 = u1 > m1 ? u1 : m1;
    m2 = u2 > m2 ? u2 : m2;
    m3 = u3 > m3 ? u3 : m3;
  }
  for (; i < n; i++) {
    uint32_t u = fbits(x[i]) & 0x7fffffffu;
    m0 = u > m0 ? u : m0;
  }
  m0 = m1 > m0 ? m1 : m0;
  m2 = m3 > m2 ? m3 : m2;
  return m2 > m0 ? m2 : m0;
}

/* q[i] = encode(x[i] / k) or encode(x[i] * k), round to nearest, four
 * lanes at a time with GCC vector extensions (the same branch-free formulas
 * as qc_enc_e4m3 / qc_enc_e2m1 in minifloat.h, which handle the tail).
 * Inputs are finite (checked before), so the NaN lane of the scalar code
 * is not needed; an Inf from x * k saturates like the scalar code. */
typedef float v4sf __attribute__((vector_size(16)));
typedef int32_t v4si __attribute__((vector_size(16)));

void qq_enc_run(const float *x, uint8_t *q, int64_t n, float k, int div, int fp4) {
  const v4sf kk = {k, k, k, k};
  /* per format: normal threshold, saturation threshold and code, the
   * exponent rebias, dropped mantissa bits, subnormal scale */
  const int32_t minnorm = fp4 ? 0x3f800000 : 0x3c800000, satb = fp4 ? 0x40c00000 : 0x43e00000;
  const int32_t satc = fp4 ? 0x7 : 0x7e, rebias = fp4 ? (126 << 23) : (120 << 23), drop = fp4 ? 22 : 20;
  const int32_t signshift = fp4 ? 28 : 24, signbit = fp4 ? 0x8 : 0x80;
  const float subscale = fp4 ? 2.0f : 512.0f;
  const int32_t half = (1 << (drop - 1)) - 1;
  int64_t i = 0;
  for (; i + 4 <= n; i += 4) {
    v4sf v;
    memcpy(&v, x + i, sizeof v);
    v = div ? v / kk : v * kk;
    v4si u = (v4si)v, a = u & 0x7fffffff;
    v4si sign = ((v4si)((__typeof__(u))((uint32_t __attribute__((vector_size(16))))u >> signshift))) & signbit;
    v4si r = a - rebias;
    r = (r + half + ((r >> drop) & 1)) >> drop;
    v4si sub = (v4si)((v4sf)a * subscale + 12582912.0f) - 0x4b400000;
    v4si mnorm = a >= minnorm, msat = a >= satb;
    v4si c = (r & mnorm) | (sub & ~mnorm);
    c = (satc & msat) | (c & ~msat);
    c |= sign;
    q[i] = (uint8_t)c[0];
    q[i + 1] = (uint8_t)c[1];
    q[i + 2] = (uint8_t)c[2];
    q[i + 3] = (uint8_t)c[3];
  }
  for (; i < n; i++) {
    float v = div ? x[i] / k : x[i] * k;
    q[i] = fp4 ? qc_enc_e2m1(v) : qc_enc_e4m3(v);
  }
}

/* Stage 2 of fp8_block128_ue8m0 for one block (rows r0..r1, columns
 * c0..c1) whose stage-1 codes and multiplier s1 are in place: dequantize
 * into scratch (float32 q * s1), then requantize by stage 2's recipe
 * (a power-of-two scale; s_given: a stored one), round to nearest; the
 * block's deq and byte become stage 2's. */
static void qq_stage2_block(const plan_t *pl, int64_t r0, int64_t r1, int64_t c0, int64_t c1, int64_t cols, uint8_t *codes,
                            float *deq, uint8_t *sb, float *scratch, const float *s_given) {
  int64_t w = c1 - c0;
  float s1 = *deq;
  for (int64_t r = r0; r < r1; r++) {
    const uint8_t *q = codes + r * cols + c0;
    float *o = scratch + (r - r0) * w;
    for (int64_t c = 0; c < w; c++) o[c] = qq_e4m3_val[q[c]] * s1;
  }
  bscale b = s_given ? qr_scale_given(&pl->rc2, *s_given, 0, 0.0f)
                     : qr_block_scale(&pl->rc2, bitsf(qq_abs_max_bits(scratch, (r1 - r0) * w)), 0.0f);
  *deq = b.deq;
  *sb = b.byte;
  for (int64_t r = r0; r < r1; r++) qq_enc_run(scratch + (r - r0) * w, codes + r * cols + c0, w, b.k, b.div, 0);
}

/* Units of `per` elements each a qc_par_for piece takes at least: small
 * tensors stay on the calling thread. */
static int64_t qp_grain(int64_t per) { return per > 0 && per < (1 << 16) ? (1 << 16) / per : 1; }

/* One quantization pass's shared state (qq_quant_pass): the plan, the
 * input, the stored scales, the outputs, and per piece a flag: 1 a block
 * held a non-finite value, 2 no memory for the two-stage buffer. */
typedef struct qp_job {
  const plan_t *pl;
  int64_t rows, cols, br, bc, gc;
  const float *in;
  const qc_sr *sr;
  const float *ss;    /* stored float32 scales, or NULL */
  const uint8_t *sbs; /* stored scale bytes, or NULL */
  float g;
  uint8_t *codes;
  float *deq;
  uint8_t *sb;
  bscale one;         /* the single block's scale (qp_one_rows) */
  uint32_t amax[QC_PAR_MAX];
  int bad[QC_PAR_MAX];
} qp_job;

/* Rows [r0, r1), columns [c0, c1) of in encoded with block scale b into
 * codes: round to nearest, or stochastically under sr; ModelOpt's cast. */
static void qp_encode(const qp_job *j, int64_t r0, int64_t r1, int64_t c0, int64_t c1, bscale b) {
  const plan_t *pl = j->pl;
  const int64_t rows = j->rows, cols = j->cols;
  const int use_sr = j->sr && j->sr->on;
  for (int64_t r = r0; r < r1; r++) {
    const float *x = j->in + r * cols;
    uint8_t *q = j->codes + r * cols;
    if (use_sr) {
      for (int64_t c = c0; c < c1; c++) {
        float v = b.div ? x[c] / b.k : x[c] * b.k;
        q[c] = v != v ? 7
                      : qq_enc_sr(v, pl->fp4, qc_sr_bits(j->sr, qc_sr_index(j->sr, (uint64_t)(rows * cols), (uint64_t)(r * cols + c))));
      }
    } else {
      qq_enc_run(x + c0, q + c0, c1 - c0, b.k, b.div, pl->fp4);
    }
    if (b.div == 2) /* ModelOpt's cast: +-0 -> 0, NaN (0/0) -> 7 */
      for (int64_t c = c0; c < c1; c++) q[c] = qr_fp4_modelopt(x[c] / b.k, q[c]);
  }
}

/* Block rows [lo, hi): each block's amax, its recipe's scale (or the
 * stored one), its codes, and the two-stage format's second stage. Every
 * block is its own: the result does not depend on how rows are split. */
static void qp_blocks(void *p, int64_t lo, int64_t hi, int tid) {
  qp_job *j = p;
  const plan_t *pl = j->pl;
  const int64_t rows = j->rows, cols = j->cols, br = j->br, bc = j->bc, gc = j->gc;
  float *scratch = NULL;
  if (pl->two_stage && !(scratch = malloc((size_t)(pl->br * pl->bc) * sizeof *scratch))) { j->bad[tid] = 2; return; }
  for (int64_t bi = lo; bi < hi; bi++) {
    int64_t r0 = bi * br, r1 = r0 + br < rows ? r0 + br : rows;
    for (int64_t bj = 0; bj < gc; bj++) {
      int64_t c0 = bj * bc, c1 = c0 + bc < cols ? c0 + bc : cols;
      uint32_t mb = 0;
      for (int64_t r = r0; r < r1; r++) {
        uint32_t m = qq_abs_max_bits(j->in + r * cols + c0, c1 - c0);
        mb = m > mb ? m : mb;
      }
      if (mb >= 0x7f800000u) { j->bad[tid] = 1; goto out; }
      const int64_t bk = bi * gc + bj;
      bscale b = (j->ss || j->sbs) && !pl->two_stage ? qr_scale_given(&pl->rc, j->ss ? j->ss[bk] : 0.0f, j->sbs ? j->sbs[bk] : 0, j->g)
                                                     : qr_block_scale(&pl->rc, bitsf(mb), j->g);
      j->deq[bk] = b.deq;
      j->sb[bk] = b.byte;
      qp_encode(j, r0, r1, c0, c1, b);
      if (scratch) qq_stage2_block(pl, r0, r1, c0, c1, cols, j->codes, j->deq + bk, j->sb + bk, scratch, j->ss ? j->ss + bk : NULL);
    }
  }
out:
  free(scratch);
}

/* Rows [lo, hi): their amax bits into j->amax[tid]. */
static void qp_amax(void *p, int64_t lo, int64_t hi, int tid) {
  qp_job *j = p;
  j->amax[tid] = qq_abs_max_bits(j->in + lo * j->cols, (hi - lo) * j->cols);
}

/* Rows [lo, hi) of the single block, encoded with its scale j->one. */
static void qp_one_rows(void *p, int64_t lo, int64_t hi, int tid) {
  (void)tid;
  qp_job *j = p;
  qp_encode(j, lo, hi, 0, j->cols, j->one);
}

/* The largest of in[rows, cols]'s |values| as float32 bits, rows in
 * parallel (qq_abs_max_bits; >= 0x7f800000: a non-finite value). */
static uint32_t qp_tensor_amax(qp_job *j) {
  memset(j->amax, 0, sizeof j->amax);
  qc_par_for(j->rows, qp_grain(j->cols), qp_amax, j);
  uint32_t m = 0;
  for (int i = 0; i < QC_PAR_MAX; i++) m = j->amax[i] > m ? j->amax[i] : m;
  return m;
}

/* Quantize in[rows, cols] by plan pl into codes[rows*cols] (one element a
 * byte, unpacked), per-block dequant multipliers deq[gr*gc] and scale bytes
 * sb[gr*gc], by stage 1's recipe, or with the stored scales of st (NULL:
 * derive; see qc_qstored); the two-stage format's blocks then go through
 * qq_stage2_block. Block rows run on qc_par_for's threads (a single block,
 * fp8_tensor's, splits its rows after its amax); every block is computed
 * alone, so the bytes do not depend on the thread count. Returns 1
 * (outputs unfinished) when a block holds a non-finite value, 2 when a
 * block buffer could not be allocated, else 0. */
static int qq_quant_pass(const plan_t *pl, int64_t rows, int64_t cols, const float *in, const qc_sr *sr, const qc_qstored *st,
                         float g, uint8_t *codes, float *deq, uint8_t *sb) {
  qp_job *j = calloc(1, sizeof *j);
  if (!j) return 2;
  *j = (qp_job){.pl = pl, .rows = rows, .cols = cols, .in = in, .sr = sr, .ss = st ? st->scale : NULL,
                .sbs = st ? st->scale_b : NULL, .g = g, .codes = codes, .deq = deq, .sb = sb};
  j->br = pl->br ? pl->br : rows;
  j->bc = pl->bc ? pl->bc : cols;
  const int64_t gr = (rows + j->br - 1) / j->br;
  j->gc = (cols + j->bc - 1) / j->bc;
  int bad = 0;
  if (gr == 1 && j->gc == 1 && !pl->two_stage) { /* one block: its amax, then its rows */
    uint32_t mb = qp_tensor_amax(j);
    if (mb >= 0x7f800000u) {
      bad = 1;
    } else {
      j->one = j->ss || j->sbs ? qr_scale_given(&pl->rc, j->ss ? j->ss[0] : 0.0f, j->sbs ? j->sbs[0] : 0, g)
                               : qr_block_scale(&pl->rc, bitsf(mb), g);
      deq[0] = j->one.deq;
      sb[0] = j->one.byte;
      qc_par_for(rows, qp_grain(cols), qp_one_rows, j);
    }
  } else {
    qc_par_for(gr, qp_grain(j->br * cols), qp_blocks, j);
  }
  for (int i = 0; i < QC_PAR_MAX; i++) bad = bad ? bad : j->bad[i];
  free(j);
  return bad;
}

/* qq_dequant_pass's arguments, for its row pieces. */
typedef struct dq_job {
  const plan_t *pl;
  int64_t cols, br, bc, gc;
  const uint8_t *codes;
  const float *deq;
  float *out;
} dq_job;

/* Rows [lo, hi) of qq_dequant_pass. */
static void dq_rows(void *p, int64_t lo, int64_t hi, int tid) {
  (void)tid;
  const dq_job *j = p;
  const int64_t cols = j->cols, bc = j->bc;
  for (int64_t r = lo; r < hi; r++) {
    const float *d = j->deq + (r / j->br) * j->gc;
    const uint8_t *q = j->codes + r * cols;
    float *o = j->out + r * cols;
    for (int64_t k = 0, c0 = 0; k < j->gc; k++, c0 += bc) {
      int64_t c1 = c0 + bc < cols ? c0 + bc : cols;
      float s = d[k];
      if (j->pl->fp4)
        for (int64_t c = c0; c < c1; c++) o[c] = qq_e2m1_val[q[c] & 0xf] * s;
      else
        for (int64_t c = c0; c < c1; c++) o[c] = qq_e4m3_val[q[c]] * s;
    }
  }
}

/* Dequantize codes with per-block multipliers deq into out, rows on
 * qc_par_for's threads (each element alone). */
void qq_dequant_pass(const plan_t *pl, int64_t rows, int64_t cols, const uint8_t *codes, const float *deq,
                         float *out) {
  dq_job j = {.pl = pl, .cols = cols, .br = pl->br ? pl->br : rows, .bc = pl->bc ? pl->bc : cols, .codes = codes,
              .deq = deq, .out = out};
  if (rows < 1 || cols < 1) return;
  j.gc = (cols + j.bc - 1) / j.bc;
  qc_par_for(rows, qp_grain(cols), dq_rows, &j);
}

void qq_grid(const plan_t *pl, int64_t rows, int64_t cols, int64_t *gr, int64_t *gc) {
  int64_t br = pl->br ? pl->br : rows, bc = pl->bc ? pl->bc : cols;
  *gr = br ? (rows + br - 1) / br : 0;
  *gc = bc ? (cols + bc - 1) / bc : 0;
}

/* Refuse non-finite input, naming the first offender. */
int qq_check_finite(const float *in, int64_t n, const char *what) {
  for (int64_t i = 0; i < n; i++)
    if (!isfinite(in[i]))
      return qc_err("%s: non-finite value %g at flat index %lld: a quantizer never maps NaN or Inf silently", what,
                    (double)in[i], (long long)i);
  return QC_OK;
}

/* The nvfp4 global scale of the plan from the tensor's amax (see quant.h). */
float qq_nvfp4_g(const plan_t *pl, float amax) { return qr_nvfp4_g(&pl->rc, amax); }

/* Core: codes, per-block deq multipliers, scale bytes and the global scale
 * (st: stored scales, taken as stored). Buffers: codes [rows*cols], deq
 * and sb [qq_grid]. */
int qq_quant_core(qc_qfmt f, qc_qprof p, int64_t rows, int64_t cols, const float *in, const qc_sr *sr,
                  const qc_qstored *st, uint8_t *codes, float *deq, uint8_t *sb, float *gout, const char *what) {
  const float *g_in = st ? st->gscale : NULL;
  qq_tables_init();
  plan_t pl = qq_make_plan(f, p);
  float g = 0.0f;
  if (f == QC_QF_NVFP4) { /* the global scale from the tensor's amax (or the stored one) */
    qp_job a = {.rows = rows, .cols = cols, .in = in};
    uint32_t mb = qp_tensor_amax(&a);
    if (mb >= 0x7f800000u) return qq_check_finite(in, rows * cols, what);
    g = g_in ? *g_in : qq_nvfp4_g(&pl, bitsf(mb));
  }
  if (gout) *gout = g;
  /* the two-stage format: stage 1 is fp8_block128 (SR applies there) */
  int bad = qq_quant_pass(&pl, rows, cols, in, sr, st, g, codes, deq, sb);
  if (bad == 2) return qc_err_sys("out of memory for a quantizer's block buffer");
  return bad ? qq_check_finite(in, rows * cols, what) : QC_OK;
}
