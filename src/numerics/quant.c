/* quant.c: the quantizers of spec/numerics.md (see quant.h). One generic
 * pass walks the scale grid: per block, the amax, then the scale rule of
 * (format, profile), then the element encoder. fp8_block128_ue8m0 under the
 * vllm-family profiles runs two passes (quantize, dequantize, requantize). */
#include "numerics/quant.h"

#include <float.h>
#include <math.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "core/qc.h"
#include "numerics/formats.h"
#include "numerics/minifloat.h"
#include "core/par.h"

static const char *const g_fmt_names[QC_QF_COUNT] = {
    "none", "fp8_tensor", "fp8_token", "fp8_channel", "fp8_group128", "fp8_group128_ue8m0",
    "fp8_block128", "fp8_block128_ue8m0", "nvfp4", "mxfp8", "mxfp4"};
static const char *const g_prof_names[QC_QP_COUNT] = {"vllm", "vllm_native", "te", "ocp", "modelopt"};

const char *qc_qfmt_name(qc_qfmt f) { return (unsigned)f < QC_QF_COUNT ? g_fmt_names[f] : "?"; }
const char *qc_qprof_name(qc_qprof p) { return (unsigned)p < QC_QP_COUNT ? g_prof_names[p] : "?"; }

int qc_qfmt_parse(const char *name, qc_qfmt *out) {
  for (int i = 0; i < QC_QF_COUNT; i++)
    if (strcmp(name, g_fmt_names[i]) == 0) { *out = (qc_qfmt)i; return QC_OK; }
  qc_hint("known formats: none, fp8_tensor, fp8_token, fp8_channel, fp8_group128, fp8_group128_ue8m0, "
          "fp8_block128, fp8_block128_ue8m0, nvfp4, mxfp8, mxfp4");
  return qc_err("format '%s': unknown quantization format", name);
}

int qc_qprof_parse(const char *name, qc_qprof *out) {
  for (int i = 0; i < QC_QP_COUNT; i++)
    if (strcmp(name, g_prof_names[i]) == 0) { *out = (qc_qprof)i; return QC_OK; }
  qc_hint("known profiles: %s", QC_PROFILES);
  return qc_err("profile '%s': unknown quantizer profile", name);
}

int qc_quant_known(const char *fmt) {
  for (int i = 0; i < QC_QF_COUNT; i++)
    if (strcmp(fmt, g_fmt_names[i]) == 0) return 1;
  return 0;
}

/* ---- scale rules ------------------------------------------------------- */

typedef enum {
  R_TENSOR,        /* s = amax/448, x*rcp(s) */
  R_TOKEN,         /* s = max(amax/448, 1/229376), x/s */
  R_GROUP,         /* s = max(amax, 1e-10)/448, x/s */
  R_GROUP_UE8M0,   /* s = ceil2(max(amax/448, 1e-10)), x*rcp(s) */
  R_NATIVE_UE8M0,  /* s = max(exp2(ceil(log2(amax/448))), 1/229376), x/s */
  R_BLOCK,         /* s = max(amax, 1e-4)/448, x*rcp(s) */
  R_BLOCK_UE8M0,   /* second stage: s = ceil2(max(amax, 1e-4)/448), x*rcp(s) */
  R_TE,            /* scale = 448/amax (amax 0 -> 1, Inf -> FLT_MAX), x*scale, s = rcp(scale) */
  R_TE_POW2,       /* the same, scale truncated to a power of two */
  R_NVFP4,         /* vllm: sf = e4m3(min(g*(bmax*rcp(6)), 448)) */
  R_NVFP4_TE,      /* te: sf = e4m3(bmax*(g*rcp(6))) */
  R_NVFP4_MODELOPT,/* sf = e4m3(bmax/(6*wsf2)), 0 -> 1.0; x/(sf*wsf2) */
  R_MX,            /* s = ceil2(amax/emax_val) as e8m0, x*rcp(s) */
  R_MX_OCP         /* s = 2^(floor(log2(amax)) - emax_elem), x*rcp(s) */
} rule_t;

typedef struct {
  int br, bc;        /* block rows, cols; 0 = the whole extent */
  int fp4;           /* element E2M1 (else E4M3) */
  rule_t rule;
  qc_dtype sdt;      /* stored scale dtype */
  int two_stage;     /* fp8_block128_ue8m0, vllm family */
} plan_t;

static plan_t make_plan(qc_qfmt f, qc_qprof p) {
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

/* One block's scale: the element transform and the dequant multiplier. */
typedef struct {
  float k;        /* element factor */
  int div;        /* element = x / k (else x * k) */
  float deq;      /* value = decode(q) * deq */
  uint8_t byte;   /* stored scale byte (e4m3 for nvfp4, e8m0 for mx) */
} bscale;

static uint32_t fbits(float x) { uint32_t u; memcpy(&u, &x, 4); return u; }
static float bitsf(uint32_t u) { float x; memcpy(&x, &u, 4); return x; }
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
static bscale block_scale(rule_t r, int fp4, float amax, float g) {
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

static float g_e4m3_mag[128], g_e2m1_mag[8], g_e4m3_val[256], g_e2m1_val[16];
static pthread_once_t g_tab_once = PTHREAD_ONCE_INIT;

static void tables_fill(void) {
  for (int i = 0; i < 128; i++) g_e4m3_mag[i] = qc_e4m3_to_f32((uint8_t)i);
  for (int i = 0; i < 8; i++) g_e2m1_mag[i] = qc_e2m1_to_f32((uint8_t)i);
  for (int i = 0; i < 256; i++) g_e4m3_val[i] = qc_e4m3_to_f32((uint8_t)i);
  for (int i = 0; i < 16; i++) g_e2m1_val[i] = qc_e2m1_to_f32((uint8_t)i);
}

/* Decode tables of the element magnitudes, filled once (thread safe). */
static void tables_init(void) { pthread_once(&g_tab_once, tables_fill); }

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
static uint32_t abs_max_bits(const float *x, int64_t n) {
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

static void enc_run(const float *x, uint8_t *q, int64_t n, float k, int div, int fp4) {
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
static void stage2_block(int64_t r0, int64_t r1, int64_t c0, int64_t c1, int64_t cols, uint8_t *codes, float *deq,
                         uint8_t *sb, float *scratch) {
  int64_t w = c1 - c0;
  float s1 = *deq;
  for (int64_t r = r0; r < r1; r++) {
    const uint8_t *q = codes + r * cols + c0;
    float *o = scratch + (r - r0) * w;
    for (int64_t c = 0; c < w; c++) o[c] = g_e4m3_val[q[c]] * s1;
  }
  bscale b = block_scale(R_BLOCK_UE8M0, 0, bitsf(abs_max_bits(scratch, (r1 - r0) * w)), 0.0f);
  *deq = b.deq;
  *sb = b.byte;
  for (int64_t r = r0; r < r1; r++) enc_run(scratch + (r - r0) * w, codes + r * cols + c0, w, b.k, b.div, 0);
}

/* Quantize in[rows, cols] by plan pl into codes[rows*cols] (one element a
 * byte, unpacked), per-block dequant multipliers deq[gr*gc] and scale bytes
 * sb[gr*gc]. rule overrides pl->rule. scratch (br*bc floats) is given for
 * the two-stage format: each block then goes through stage2_block. Returns
 * 1 (outputs unfinished) as soon as a block holds a non-finite value, else 0. */
static int quant_pass(const plan_t *pl, rule_t rule, int64_t rows, int64_t cols, const float *in, const qc_sr *sr,
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
        uint32_t m = abs_max_bits(in + r * cols + c0, c1 - c0);
        mb = m > mb ? m : mb;
      }
      if (mb >= 0x7f800000u) return 1;
      float amax = bitsf(mb);
      bscale b = block_scale(rule, pl->fp4, amax, g);
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
          enc_run(x + c0, q + c0, c1 - c0, b.k, b.div, pl->fp4);
        }
      }
      if (scratch) stage2_block(r0, r1, c0, c1, cols, codes, deq + bi * gc + bj, sb + bi * gc + bj, scratch);
    }
  }
  return 0;
}

/* Dequantize codes with per-block multipliers deq into out. */
static void dequant_pass(const plan_t *pl, int64_t rows, int64_t cols, const uint8_t *codes, const float *deq,
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
        for (int64_t c = c0; c < c1; c++) o[c] = g_e2m1_val[q[c] & 0xf] * s;
      else
        for (int64_t c = c0; c < c1; c++) o[c] = g_e4m3_val[q[c]] * s;
    }
  }
}

static void grid(const plan_t *pl, int64_t rows, int64_t cols, int64_t *gr, int64_t *gc) {
  int64_t br = pl->br ? pl->br : rows, bc = pl->bc ? pl->bc : cols;
  *gr = br ? (rows + br - 1) / br : 0;
  *gc = bc ? (cols + bc - 1) / bc : 0;
}

/* Refuse non-finite input, naming the first offender. */
static int check_finite(const float *in, int64_t n, const char *what) {
  for (int64_t i = 0; i < n; i++)
    if (!isfinite(in[i]))
      return qc_err("%s: non-finite value %g at flat index %lld: a quantizer never maps NaN or Inf silently", what,
                    (double)in[i], (long long)i);
  return QC_OK;
}

/* The nvfp4 global scale of the profile (see quant.h). */
static float nvfp4_g(qc_qprof p, float amax) {
  if (amax == 0.0f) return 1.0f; /* all-zero tensor: no scale in the sources; payload 0 either way */
  return p == QC_QP_MODELOPT ? amax / 2688.0f : 2688.0f / amax;
}
static float nvfp4_global(qc_qprof p, const float *in, int64_t n) { return nvfp4_g(p, bitsf(abs_max_bits(in, n))); }

/* Core: codes, per-block deq multipliers, scale bytes and the global scale.
 * Buffers: codes [rows*cols], deq and sb [grid]. */
static int quant_core(qc_qfmt f, qc_qprof p, int64_t rows, int64_t cols, const float *in, const qc_sr *sr,
                      uint8_t *codes, float *deq, uint8_t *sb, float *gout, const char *what) {
  tables_init();
  plan_t pl = make_plan(f, p);
  if (f == QC_QF_NVFP4 && abs_max_bits(in, rows * cols) >= 0x7f800000u) return check_finite(in, rows * cols, what);
  float g = f == QC_QF_NVFP4 ? nvfp4_global(p, in, rows * cols) : 0.0f;
  if (gout) *gout = g;
  float *scratch = NULL;
  if (pl.two_stage && !(scratch = qc_malloc((size_t)(pl.br * pl.bc) * sizeof *scratch, "two-stage block buffer")))
    return QC_ESYS;
  /* the two-stage format: stage 1 is fp8_block128 (SR applies there) */
  int bad = quant_pass(&pl, pl.two_stage ? R_BLOCK : pl.rule, rows, cols, in, sr, g, codes, deq, sb, scratch);
  free(scratch);
  return bad ? check_finite(in, rows * cols, what) : QC_OK;
}

void qc_quant_layout(qc_qfmt fmt, qc_qprof prof, int64_t rows, int64_t cols, qc_dtype *q_dt, int64_t q_shape[2],
                     qc_dtype *s_dt, int *s_ndim, int64_t s_shape[2], int *g_ndim) {
  plan_t pl = make_plan(fmt, prof);
  int64_t gr, gc;
  grid(&pl, rows, cols, &gr, &gc);
  *q_dt = pl.fp4 ? QC_E2M1X2 : QC_E4M3;
  q_shape[0] = rows;
  q_shape[1] = pl.fp4 ? (cols + 1) / 2 : cols;
  *s_dt = pl.sdt;
  if (fmt == QC_QF_FP8_TENSOR) {
    *s_ndim = 1;
    s_shape[0] = 1;
    s_shape[1] = 1;
  } else {
    *s_ndim = 2;
    s_shape[0] = gr;
    s_shape[1] = gc;
  }
  *g_ndim = fmt == QC_QF_NVFP4 ? 1 : 0;
}

void qc_quantized_free(qc_quantized *z) {
  qc_tensor_free(&z->q);
  qc_tensor_free(&z->scale);
  qc_tensor_free(&z->gscale);
}

int qc_quantize(qc_qfmt fmt, qc_qprof prof, int64_t rows, int64_t cols, const float *in, const qc_sr *sr,
                qc_quantized *out, const char *what) {
  memset(out, 0, sizeof *out);
  if (fmt == QC_QF_NONE || (unsigned)fmt >= QC_QF_COUNT) return qc_err("%s: format '%s' has no deployed form", what, qc_qfmt_name(fmt));
  if (rows < 1 || cols < 1) return qc_err("%s: cannot quantize an empty [%lld, %lld] matrix", what, (long long)rows, (long long)cols);
  qc_dtype qdt, sdt;
  int64_t qs[2], ss[2], one = 1, gr, gc;
  int sn, gn;
  qc_quant_layout(fmt, prof, rows, cols, &qdt, qs, &sdt, &sn, ss, &gn);
  plan_t pl = make_plan(fmt, prof);
  grid(&pl, rows, cols, &gr, &gc);
  uint8_t *codes = NULL;
  float *deq = qc_malloc((size_t)(gr * gc) * sizeof *deq, "block scales");
  uint8_t *sb = qc_malloc((size_t)(gr * gc), "block scale bytes");
  float g = 0.0f;
  int rc = QC_ESYS;
  if (!deq || !sb) goto done;
  if ((rc = qc_tensor_alloc(&out->q, "weight_q", qdt, 2, qs))) goto done;
  if ((rc = qc_tensor_alloc(&out->scale, "weight_scale", sdt, sn, ss))) goto done;
  /* e4m3 codes go straight into the payload; e2m1 codes are packed after */
  rc = QC_ESYS;
  if (pl.fp4 && !(codes = qc_malloc((size_t)(rows * cols), "quantized codes"))) goto done;
  uint8_t *qp = out->q.data;
  if ((rc = quant_core(fmt, prof, rows, cols, in, sr, pl.fp4 ? codes : qp, deq, sb, &g, what))) goto done;
  if (pl.fp4)
    for (int64_t r = 0; r < rows; r++) {
      const uint8_t *c8 = codes + r * cols;
      uint8_t *o = qp + r * qs[1];
      for (int64_t c = 0; c + 1 < cols; c += 2) o[c / 2] = (uint8_t)((c8[c] & 0xf) | (c8[c + 1] << 4));
      if (cols & 1) o[cols / 2] = c8[cols - 1] & 0xf;
    }
  if (sdt == QC_F32) memcpy(out->scale.data, deq, (size_t)(gr * gc) * sizeof *deq);
  else memcpy(out->scale.data, sb, (size_t)(gr * gc));
  if (gn) {
    if ((rc = qc_tensor_alloc(&out->gscale, "weight_global_scale", QC_F32, 1, &one))) goto done;
    *(float *)out->gscale.data = g;
  }
  rc = QC_OK;
done:
  if (rc) qc_quantized_free(out);
  free(codes); free(deq); free(sb);
  return rc;
}

/* Check one part's dtype and shape against the expected layout. */
static int check_part(const qc_tensor *t, const char *part, qc_dtype dt, int ndim, const int64_t *shape, const char *what) {
  char a[64], b[64];
  if (t->dtype != dt)
    return qc_err("%s: %s '%s' has dtype %s: expected %s", what, part, t->name, qc_dtype_name(t->dtype), qc_dtype_name(dt));
  int64_t n = qc_shape_numel(ndim, shape);
  int ok = ndim == 1 && n == 1 ? qc_numel(t) == 1 : t->ndim == ndim && memcmp(t->shape, shape, (size_t)ndim * 8) == 0;
  if (!ok)
    return qc_err("%s: %s '%s' has shape %s: expected %s", what, part, t->name, qc_shape_str(t->ndim, t->shape, a, sizeof a),
                  qc_shape_str(ndim, shape, b, sizeof b));
  return QC_OK;
}

int qc_dequantize(qc_qfmt fmt, qc_qprof prof, int64_t rows, int64_t cols, const qc_quantized *z, float *out,
                  const char *what) {
  qc_dtype qdt, sdt;
  int64_t qs[2], ss[2], one = 1, gr, gc;
  int sn, gn, rc;
  if (fmt == QC_QF_NONE || (unsigned)fmt >= QC_QF_COUNT) return qc_err("%s: format '%s' has no deployed form", what, qc_qfmt_name(fmt));
  qc_quant_layout(fmt, prof, rows, cols, &qdt, qs, &sdt, &sn, ss, &gn);
  if ((rc = check_part(&z->q, "payload", qdt, 2, qs, what))) return rc;
  if ((rc = check_part(&z->scale, "scale", sdt, sn, ss, what))) return rc;
  if (gn && (rc = check_part(&z->gscale, "global scale", QC_F32, 1, &one, what))) return rc;
  tables_init();
  plan_t pl = make_plan(fmt, prof);
  grid(&pl, rows, cols, &gr, &gc);
  uint8_t *codes = qc_malloc((size_t)(rows * cols), "dequant codes");
  float *deq = qc_malloc((size_t)(gr * gc) * sizeof *deq, "dequant scales");
  rc = QC_ESYS;
  if (!codes || !deq) goto done;
  const uint8_t *qp = z->q.data;
  for (int64_t r = 0; r < rows; r++)
    for (int64_t c = 0; c < cols; c++)
      codes[r * cols + c] = pl.fp4 ? (uint8_t)((qp[r * qs[1] + c / 2] >> (4 * (c & 1))) & 0xf) : qp[r * cols + c];
  float g = gn ? *(const float *)z->gscale.data : 0.0f;
  for (int64_t i = 0; i < gr * gc; i++) {
    if (sdt == QC_F32) deq[i] = ((const float *)z->scale.data)[i];
    else if (sdt == QC_E8M0) deq[i] = qc_e8m0_to_f32(((const uint8_t *)z->scale.data)[i]);
    else {
      float sf = qc_e4m3_to_f32(((const uint8_t *)z->scale.data)[i]);
      deq[i] = prof == QC_QP_MODELOPT ? sf * g : sf / g;
    }
  }
  dequant_pass(&pl, rows, cols, codes, deq, out);
  rc = QC_OK;
done:
  free(codes); free(deq);
  return rc;
}

int qc_fake_quant_sr(const char *fmt, const char *profile, int64_t rows, int64_t cols, const float *in, float *out,
                     const qc_sr *sr, const char *what) {
  qc_qfmt f = QC_QF_NONE;
  qc_qprof p = QC_QP_VLLM;
  int rc;
  if ((rc = qc_qfmt_parse(fmt, &f))) return rc;
  if (profile && (rc = qc_qprof_parse(profile, &p))) return rc;
  if (f == QC_QF_NONE) {
    if ((rc = check_finite(in, rows * cols, what))) return rc;
    if (out != in) memmove(out, in, (size_t)(rows * cols) * sizeof *out);
    return QC_OK;
  }
  if (rows < 1 || cols < 1) return QC_OK;
  plan_t pl = make_plan(f, p);
  int64_t gr, gc;
  grid(&pl, rows, cols, &gr, &gc);
  uint8_t *codes = qc_malloc((size_t)(rows * cols), "fake-quant codes");
  float *deq = qc_malloc((size_t)(gr * gc) * sizeof *deq, "fake-quant scales");
  uint8_t *sb = qc_malloc((size_t)(gr * gc), "fake-quant scale bytes");
  rc = QC_ESYS;
  if (codes && deq && sb && !(rc = quant_core(f, p, rows, cols, in, sr, codes, deq, sb, NULL, what)))
    dequant_pass(&pl, rows, cols, codes, deq, out);
  free(codes); free(deq); free(sb);
  return rc;
}

int qc_fake_quant(const char *fmt, const char *profile, int64_t rows, int64_t cols, const float *in, float *out,
                  const char *what) {
  return qc_fake_quant_sr(fmt, profile, rows, cols, in, out, NULL, what);
}

/* ---- fused, parallel fake-quant to float64 (qc_fake_quant_f64) ------------
 * The same blocks, scale rules and encoder as quant_pass + dequant_pass, one
 * block at a time: a block's codes go to a small per-thread buffer and come
 * straight back as values, out[r, c] = (double)(decode(code) * s) with the
 * float32 product dequant_pass forms, so the result is qc_fake_quant's
 * widened, bit for bit. Block rows run in parallel (qc_par_for); a
 * single-block format (fp8_tensor) splits its rows instead. */

typedef struct fq_ctx {
  plan_t pl;
  rule_t rule;                 /* stage 1's rule */
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
    for (int64_t c = 0; c < w; c++) o[c] = (double)(g_e2m1_val[codes[c] & 0xf] * s);
  else
    for (int64_t c = 0; c < w; c++) o[c] = (double)(g_e4m3_val[codes[c]] * s);
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
        uint32_t m = abs_max_bits(blk + (r - r0) * cols + c0, w);
        mb = m > mb ? m : mb;
      }
      if (mb >= 0x7f800000u) { x->bad[tid] = 1; goto out; }
      bscale b = block_scale(x->rule, x->pl.fp4, bitsf(mb), x->g);
      for (int64_t r = r0; r < r1; r++) enc_run(blk + (r - r0) * cols + c0, codes + (r - r0) * w, w, b.k, b.div, x->pl.fp4);
      float s = b.deq;
      if (x->pl.two_stage) { /* stage 2 (see stage2_block): requantize stage 1's values */
        for (int64_t i = 0; i < (r1 - r0) * w; i++) scratch[i] = g_e4m3_val[codes[i]] * s;
        bscale b2 = block_scale(R_BLOCK_UE8M0, 0, bitsf(abs_max_bits(scratch, (r1 - r0) * w)), 0.0f);
        for (int64_t r = r0; r < r1; r++) enc_run(scratch + (r - r0) * w, codes + (r - r0) * w, w, b2.k, b2.div, 0);
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
  if (x->dt == QC_F32) { x->amax[tid] = abs_max_bits((const float *)x->in + lo * x->cols, (hi - lo) * x->cols); return; }
  float *row = malloc((size_t)x->cols * sizeof *row);
  if (!row) { x->bad[tid] = 2; return; }
  uint32_t m = 0;
  for (int64_t r = lo; r < hi; r++) {
    uint32_t v = abs_max_bits(fq_rows_f32(x, r, 1, row), x->cols);
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
    enc_run(fq_rows_f32(x, r, 1, row), codes, x->cols, x->one.k, x->one.div, x->pl.fp4);
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
  tables_init();
  fq_ctx *x = calloc(1, sizeof *x);
  if (!x) return qc_err_sys("out of memory for a quantizer");
  x->pl = make_plan(f, p);
  x->rule = x->pl.two_stage ? R_BLOCK : x->pl.rule;
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
      x->g = nvfp4_g(p, bitsf(m));
      qc_par_for(gr, 1, fq_blocks, x);
    } else if (!bad) {
      x->one = block_scale(x->rule, x->pl.fp4, bitsf(m), 0.0f);
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
