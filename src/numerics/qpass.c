/* qpass.c: the quantizers' machinery (see qpass.h): plans, scale rules,
 * element encoders, and the generic pass that walks the scale grid: per
 * block, the amax, then the scale rule of (format, profile), then the
 * element encoder. fp8_block128_ue8m0 under the vllm-family profiles runs
 * two passes (quantize, dequantize, requantize). */
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

/* ---- scale rules ------------------------------------------------------- */





plan_t qq_make_plan(qc_qfmt f, qc_qprof p) {
  plan_t pl = {1, 0, 0, R_TENSOR, QC_F32, 0};
  int te = p == QC_QP_TE;
  switch (f) {
    case QC_QF_NONE: break;
    case QC_QF_FP8_TENSOR: pl.br = 0; pl.rule = te ? R_TE : R_TENSOR; break;
    case QC_QF_FP8_TOKEN:
    case QC_QF_FP8_CHANNEL: pl.rule = te ? R_TE : R_TOKEN; break;
    case QC_QF_FP8_GROUP128: pl.bc = 128; pl.rule = te ? R_TE : R_GROUP; break;
    case QC_QF_FP8_GROUP128_UE8M0:
      pl.bc = 128;
      pl.rule = te ? R_TE_POW2 : p == QC_QP_VLLM_NATIVE ? R_NATIVE_UE8M0 : R_GROUP_UE8M0;
      break;
    case QC_QF_FP8_BLOCK128: pl.br = pl.bc = 128; pl.rule = te ? R_TE : R_BLOCK; break;
    case QC_QF_FP8_BLOCK128_UE8M0:
      pl.br = pl.bc = 128;
      pl.rule = te ? R_TE_POW2 : R_BLOCK;
      pl.two_stage = !te;
      break;
    case QC_QF_NVFP4:
      pl.bc = 16; pl.fp4 = 1; pl.sdt = QC_E4M3;
      pl.rule = te ? R_NVFP4_TE : p == QC_QP_MODELOPT ? R_NVFP4_MODELOPT : R_NVFP4;
      break;
    case QC_QF_MXFP8:
    case QC_QF_MXFP4:
      pl.bc = 32; pl.fp4 = f == QC_QF_MXFP4; pl.sdt = QC_E8M0;
      pl.rule = p == QC_QP_OCP ? R_MX_OCP : R_MX;
      break;
    default: break;
  }
  return pl;
}



static float fmax_(float a, float b) { return a > b ? a : b; }

/* floor(log2(a)) for a finite a > 0, exactly, from the bits. */
static int floor_log2(float a) {
  uint32_t u = fbits(a), e = u >> 23;
  if (e) return (int)e - 127;
  return 31 - __builtin_clz(u & 0x7fffffu) - 149;
}

/* 2^(b-127) for an E8M0 byte b < 255, from the bits (0 is the subnormal
 * 2^-127); the quantizers never produce 255. */
static float e8m0_val(uint8_t b) { return bitsf(b ? (uint32_t)b << 23 : 0x00400000u); }

static float te_scale(float amax) {
  if (amax == 0.0f || !isfinite(amax)) return 1.0f;
  float sc = 448.0f / amax;
  return isinf(sc) ? FLT_MAX : sc;
}

/* The scale of a block with absolute maximum amax (g: nvfp4 global scale). */
bscale qq_block_scale(rule_t r, int fp4, float amax, float g) {
  bscale b = {1.0f, 0, 1.0f, 0};
  float s;
  switch (r) {
    case R_TENSOR:
      s = amax / 448.0f;
      b.k = s > 0.0f ? 1.0f / s : 0.0f; /* all-zero tensor: payload 0, scale 0 */
      b.deq = s;
      break;
    case R_TOKEN: s = fmax_(amax / 448.0f, 1.0f / 229376.0f); b.k = b.deq = s; b.div = 1; break;
    case R_GROUP: s = fmax_(amax, 1e-10f) / 448.0f; b.k = b.deq = s; b.div = 1; break;
    case R_GROUP_UE8M0: s = qc_ceil2(fmax_(amax / 448.0f, 1e-10f)); b.k = 1.0f / s; b.deq = s; break;
    case R_NATIVE_UE8M0:
      s = fmax_(exp2f(ceilf(log2f(amax / 448.0f))), 1.0f / 229376.0f);
      b.k = b.deq = s; b.div = 1;
      break;
    case R_BLOCK: s = fmax_(amax, 1e-4f) / 448.0f; b.k = 1.0f / s; b.deq = s; break;
    case R_BLOCK_UE8M0: s = qc_ceil2(fmax_(amax, 1e-4f) / 448.0f); b.k = 1.0f / s; b.deq = s; break;
    case R_TE: b.k = te_scale(amax); b.deq = 1.0f / b.k; break;
    case R_TE_POW2: b.k = bitsf(fbits(te_scale(amax)) & 0xff800000u); b.deq = 1.0f / b.k; break;
    case R_NVFP4:
    case R_NVFP4_TE: {
      float v = r == R_NVFP4 ? fminf(g * (amax * (1.0f / 6.0f)), 448.0f) : amax * (g * (1.0f / 6.0f));
      b.byte = qc_f32_to_e4m3(v);
      float sf = qc_e4m3_to_f32(b.byte);
      b.k = sf != 0.0f ? 1.0f / (sf * (1.0f / g)) : 0.0f;
      b.deq = sf / g;
      break;
    }
    case R_NVFP4_MODELOPT: { /* g holds wsf2 = amax_tensor / 2688 */
      float v = amax / (6.0f * g);
      b.byte = qc_f32_to_e4m3(v == 0.0f ? 1.0f : v);
      float d = qc_e4m3_to_f32(b.byte) * g;
      b.k = d; b.div = 1; b.deq = d;
      if (d == 0.0f) { b.k = 0.0f; b.div = 0; } /* an underflowed scale: payload 0 */
      break;
    }
    case R_MX:
      b.byte = qc_e8m0_ceil(amax / (fp4 ? 6.0f : 448.0f));
      b.deq = e8m0_val(b.byte);
      b.k = 1.0f / b.deq;
      break;
    case R_MX_OCP: {
      int e = amax > 0.0f ? floor_log2(amax) - (fp4 ? 2 : 8) : -127;
      if (e < -127) e = -127;
      if (e > 127) e = 127;
      b.byte = (uint8_t)(e + 127);
      b.deq = e8m0_val(b.byte);
      b.k = 1.0f / b.deq;
      break;
    }
  }
  return b;
}

/* ---- element encoders ------------------------------------------------ */

static float g_e4m3_mag[128], g_e2m1_mag[8];
float qq_e4m3_val[256], qq_e2m1_val[16];
static pthread_once_t g_tab_once = PTHREAD_ONCE_INIT;

static void tables_fill(void) {
  for (int i = 0; i < 128; i++) g_e4m3_mag[i] = qc_e4m3_to_f32((uint8_t)i);
  for (int i = 0; i < 8; i++) g_e2m1_mag[i] = qc_e2m1_to_f32((uint8_t)i);
  for (int i = 0; i < 256; i++) qq_e4m3_val[i] = qc_e4m3_to_f32((uint8_t)i);
  for (int i = 0; i < 16; i++) qq_e2m1_val[i] = qc_e2m1_to_f32((uint8_t)i);
}

/* Decode tables of the element magnitudes, filled once (thread safe). */
void qq_tables_init(void) { pthread_once(&g_tab_once, tables_fill); }

/* Stochastic rounding of v (finite) to the element format: the magnitude
 * rounds up to the next representable value when u < (|v| - lo)/(hi - lo)
 * (float32), u = r24 * 2^-24; at or beyond the largest value it saturates. */
static uint8_t enc_sr(float v, int fp4, uint32_t r24) {
  uint8_t code = fp4 ? qc_f32_to_e2m1(v) : qc_f32_to_e4m3(v);
  uint8_t smask = fp4 ? 0x8 : 0x80, maxmag = fp4 ? 0x7 : 0x7e;
  const float *tab = fp4 ? g_e2m1_mag : g_e4m3_mag;
  uint8_t sign = code & smask, mag = code & (uint8_t)(smask - 1);
  float a = fabsf(v), m = tab[mag];
  if (m == a) return code;
  uint8_t lo, hi;
  if (m < a) {
    if (mag == maxmag) return code;
    lo = mag; hi = (uint8_t)(mag + 1);
  } else {
    hi = mag; lo = (uint8_t)(mag - 1);
  }
  float frac = (a - tab[lo]) / (tab[hi] - tab[lo]);
  float u = (float)r24 * 0x1p-24f;
  return (uint8_t)(sign | (u < frac ? hi : lo));
}

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
 * into scratch (float32 q * s1), then requantize with s2 = ceil2(max(amax2,
 * 1e-4)/448), round to nearest; the block's deq and byte become stage 2's. */
void qq_stage2_block(int64_t r0, int64_t r1, int64_t c0, int64_t c1, int64_t cols, uint8_t *codes, float *deq,
                         uint8_t *sb, float *scratch) {
  int64_t w = c1 - c0;
  float s1 = *deq;
  for (int64_t r = r0; r < r1; r++) {
    const uint8_t *q = codes + r * cols + c0;
    float *o = scratch + (r - r0) * w;
    for (int64_t c = 0; c < w; c++) o[c] = qq_e4m3_val[q[c]] * s1;
  }
  bscale b = qq_block_scale(R_BLOCK_UE8M0, 0, bitsf(qq_abs_max_bits(scratch, (r1 - r0) * w)), 0.0f);
  *deq = b.deq;
  *sb = b.byte;
  for (int64_t r = r0; r < r1; r++) qq_enc_run(scratch + (r - r0) * w, codes + r * cols + c0, w, b.k, b.div, 0);
}

/* Quantize in[rows, cols] by plan pl into codes[rows*cols] (one element a
 * byte, unpacked), per-block dequant multipliers deq[gr*gc] and scale bytes
 * sb[gr*gc]. rule overrides pl->rule. scratch (br*bc floats) is given for
 * the two-stage format: each block then goes through qq_stage2_block. Returns
 * 1 (outputs unfinished) as soon as a block holds a non-finite value, else 0. */
int qq_quant_pass(const plan_t *pl, rule_t rule, int64_t rows, int64_t cols, const float *in, const qc_sr *sr,
                      float g, uint8_t *codes, float *deq, uint8_t *sb, float *scratch) {
  int64_t br = pl->br ? pl->br : rows, bc = pl->bc ? pl->bc : cols;
  int64_t gr = (rows + br - 1) / br, gc = (cols + bc - 1) / bc;
  int use_sr = sr && sr->on;
  for (int64_t bi = 0; bi < gr; bi++) {
    int64_t r0 = bi * br, r1 = r0 + br < rows ? r0 + br : rows;
    for (int64_t bj = 0; bj < gc; bj++) {
      int64_t c0 = bj * bc, c1 = c0 + bc < cols ? c0 + bc : cols;
      uint32_t mb = 0;
      for (int64_t r = r0; r < r1; r++) {
        uint32_t m = qq_abs_max_bits(in + r * cols + c0, c1 - c0);
        mb = m > mb ? m : mb;
      }
      if (mb >= 0x7f800000u) return 1;
      float amax = bitsf(mb);
      bscale b = qq_block_scale(rule, pl->fp4, amax, g);
      deq[bi * gc + bj] = b.deq;
      sb[bi * gc + bj] = b.byte;
      for (int64_t r = r0; r < r1; r++) {
        const float *x = in + r * cols;
        uint8_t *q = codes + r * cols;
        if (use_sr) {
          for (int64_t c = c0; c < c1; c++) {
            float v = b.div ? x[c] / b.k : x[c] * b.k;
            q[c] = enc_sr(v, pl->fp4, qc_sr_bits(sr, sr->base + (uint64_t)(r * cols + c)));
          }
        } else {
          qq_enc_run(x + c0, q + c0, c1 - c0, b.k, b.div, pl->fp4);
        }
      }
      if (scratch) qq_stage2_block(r0, r1, c0, c1, cols, codes, deq + bi * gc + bj, sb + bi * gc + bj, scratch);
    }
  }
  return 0;
}

/* Dequantize codes with per-block multipliers deq into out. */
void qq_dequant_pass(const plan_t *pl, int64_t rows, int64_t cols, const uint8_t *codes, const float *deq,
                         float *out) {
  int64_t br = pl->br ? pl->br : rows, bc = pl->bc ? pl->bc : cols;
  int64_t gc = (cols + bc - 1) / bc;
  for (int64_t r = 0; r < rows; r++) {
    const float *d = deq + (r / br) * gc;
    const uint8_t *q = codes + r * cols;
    float *o = out + r * cols;
    for (int64_t j = 0, c0 = 0; j < gc; j++, c0 += bc) {
      int64_t c1 = c0 + bc < cols ? c0 + bc : cols;
      float s = d[j];
      if (pl->fp4)
        for (int64_t c = c0; c < c1; c++) o[c] = qq_e2m1_val[q[c] & 0xf] * s;
      else
        for (int64_t c = c0; c < c1; c++) o[c] = qq_e4m3_val[q[c]] * s;
    }
  }
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

/* The nvfp4 global scale of the profile (see quant.h). */
float qq_nvfp4_g(qc_qprof p, float amax) {
  if (amax == 0.0f) return 1.0f; /* all-zero tensor: no scale in the sources; payload 0 either way */
  return p == QC_QP_MODELOPT ? amax / 2688.0f : 2688.0f / amax;
}
static float nvfp4_global(qc_qprof p, const float *in, int64_t n) { return qq_nvfp4_g(p, bitsf(qq_abs_max_bits(in, n))); }

/* Core: codes, per-block deq multipliers, scale bytes and the global scale.
 * Buffers: codes [rows*cols], deq and sb [qq_grid]. */
int qq_quant_core(qc_qfmt f, qc_qprof p, int64_t rows, int64_t cols, const float *in, const qc_sr *sr,
                      uint8_t *codes, float *deq, uint8_t *sb, float *gout, const char *what) {
  qq_tables_init();
  plan_t pl = qq_make_plan(f, p);
  if (f == QC_QF_NVFP4 && qq_abs_max_bits(in, rows * cols) >= 0x7f800000u) return qq_check_finite(in, rows * cols, what);
  float g = f == QC_QF_NVFP4 ? nvfp4_global(p, in, rows * cols) : 0.0f;
  if (gout) *gout = g;
  float *scratch = NULL;
  if (pl.two_stage && !(scratch = qc_malloc((size_t)(pl.br * pl.bc) * sizeof *scratch, "two-stage block buffer")))
    return QC_ESYS;
  /* the two-stage format: stage 1 is fp8_block128 (SR applies there) */
  int bad = qq_quant_pass(&pl, pl.two_stage ? R_BLOCK : pl.rule, rows, cols, in, sr, g, codes, deq, sb, scratch);
  free(scratch);
  return bad ? qq_check_finite(in, rows * cols, what) : QC_OK;
}
