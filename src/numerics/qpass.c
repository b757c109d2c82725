/* qpass.c: the quantizers' machinery (see qpass.h): the producer paths
 * (which recipe each profile runs for each format), element encoders, and
 * the generic pass that walks the scale grid: per block, the amax, then the
 * recipe's scale (numerics/recipe.h), then the element encoder.
 * fp8_block128_ue8m0 runs two stages (quantize, dequantize, requantize)
 * except under te. */
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

/* ---- producer paths ------------------------------------------------------ */

/* The format's own block geometry and stored scale dtype. */
static plan_t geometry(qc_qfmt f) {
  plan_t pl;
  memset(&pl, 0, sizeof pl);
  pl.br = 1;
  pl.sdt = QC_F32;
  switch (f) {
    case QC_QF_FP8_TENSOR: pl.br = 0; break;
    case QC_QF_FP8_GROUP128:
    case QC_QF_FP8_GROUP128_UE8M0: pl.bc = 128; break;
    case QC_QF_FP8_BLOCK128:
    case QC_QF_FP8_BLOCK128_UE8M0: pl.br = pl.bc = 128; break;
    case QC_QF_NVFP4: pl.bc = 16; pl.fp4 = 1; pl.sdt = QC_E4M3; break;
    case QC_QF_MXFP8:
    case QC_QF_MXFP4: pl.bc = 32; pl.fp4 = f == QC_QF_MXFP4; pl.sdt = QC_E8M0; break;
    default: break;
  }
  return pl;
}

/* Recipes as initializers: {kind, sop, pow2, eop, gop, sfop, nop, mop, fp4, afloor, sfloor, pfloor}. */
#define FP8(af, so, p2, sf, eo) {QR_FP8, so, p2, eo, 0, 0, 0, 0, 0, af, sf, 0.0f}
#define FP8P(af, so, pf, p2, eo) {QR_FP8, so, p2, eo, 0, 0, 0, 0, 0, af, 0.0f, pf} /* a scale floor before pow2 */
#define NV(go, so, no) {QR_NVFP4, 0, 0, 0, go, so, no, 0, 1, 0.0f, 0.0f, 0.0f}
#define MX(mo, f4) {QR_MX, 0, 0, 0, 0, 0, 0, mo, f4, 0.0f, 0.0f, 0.0f}
#define TE(p2) {QR_TE, 0, p2, 0, 0, 0, 0, 0, 0, 0.0f, 0.0f, 0.0f}
#define NO {QR_NONE, 0, 0, 0, 0, 0, 0, 0, 0, 0.0f, 0.0f, 0.0f}
#define C229 (1.0f / 229376.0f) /* RN(1/229376) */

/* Every producer path that a profile defines itself (docs/numerics.md,
 * "Profiles"): stage 1's recipe and, for the two-stage fp8_block128_ue8m0,
 * stage 2's. A (profile, format) not listed takes its base profile's row. */
static const struct path_row {
  qc_qprof p;
  qc_qfmt f;
  qc_recipe r1, r2;
} g_paths[] = {
    {QC_QP_EXACT, QC_QF_FP8_TENSOR, FP8(0, QS_DIV, QP_NONE, 0, QE_DIV), NO},
    {QC_QP_EXACT, QC_QF_FP8_TOKEN, FP8(0, QS_DIV, QP_NONE, C229, QE_DIV), NO},
    {QC_QP_EXACT, QC_QF_FP8_CHANNEL, FP8(0, QS_DIV, QP_NONE, C229, QE_DIV), NO},
    {QC_QP_EXACT, QC_QF_FP8_GROUP128, FP8(1e-10f, QS_DIV, QP_NONE, 0, QE_DIV), NO},
    {QC_QP_EXACT, QC_QF_FP8_GROUP128_UE8M0, FP8(1e-10f, QS_DIV, QP_CEIL2, 0, QE_DIV), NO},
    {QC_QP_EXACT, QC_QF_FP8_BLOCK128, FP8(1e-4f, QS_DIV, QP_NONE, 0, QE_DIV), NO},
    {QC_QP_EXACT, QC_QF_FP8_BLOCK128_UE8M0, FP8(1e-4f, QS_DIV, QP_NONE, 0, QE_DIV), FP8(1e-4f, QS_DIV, QP_CEIL2, 0, QE_DIV)},
    {QC_QP_EXACT, QC_QF_NVFP4, NV(QG_DIV, QF_EXACT, QN_DIVG), NO},
    {QC_QP_EXACT, QC_QF_MXFP8, MX(QM_CEIL2_DIV, 0), NO},
    {QC_QP_EXACT, QC_QF_MXFP4, MX(QM_CEIL2_DIV, 1), NO},

    {QC_QP_VLLM, QC_QF_FP8_TENSOR, FP8(0, QS_DIV, QP_NONE, 0, QE_RCP), NO},            /* CUDA per-tensor kernel */
    {QC_QP_VLLM, QC_QF_FP8_TOKEN, FP8(0, QS_DIV, QP_NONE, C229, QE_DIV), NO},          /* CUDA per-token kernel */
    {QC_QP_VLLM, QC_QF_FP8_CHANNEL, FP8(0, QS_DIV, QP_NONE, C229, QE_DIV), NO},
    /* vLLM's CUDA per-token-group kernels with float32 scales (per_token_group_quant.cu @0f5257e:
     * QuantizeGroup and the register kernel) DIVIDE, x / y_s; the file is built without fast math
     * (CMakeLists.txt: only three other sources get --use_fast_math), so '/' is div.rn. */
    {QC_QP_VLLM, QC_QF_FP8_GROUP128, FP8(1e-10f, QS_DIV, QP_NONE, 0, QE_DIV), NO},
    /* vLLM's CUDA per-token-group kernels (csrc/quantization/w8a8/fp8/per_token_group_quant.cu,
     * ComputeGroupScale and the register kernels): the amax starts at eps = 1e-10, s = amax / 448,
     * then the SCALE is floored, s = max(s, 1e-10), before the power of two: minimum 2^-33. (The
     * Triton kernel floors only the amax: 2^-42; vllm_triton.) */
    {QC_QP_VLLM, QC_QF_FP8_GROUP128_UE8M0, FP8P(1e-10f, QS_DIV, 1e-10f, QP_CEIL2, QE_RCP), NO},
    /* vLLM's per_block_cast_to_fp8 (vllm/utils/deep_gemm.py @00620f9): amax.clamp(1e-4) / 448, use_ue8m0:
     * pow(2, ceil(log2(|sf|))), elements x * (1.0 / sf); under Inductor t / 448 = t * RN(1/448), 1.0 / t = rcpa */
    {QC_QP_VLLM, QC_QF_FP8_BLOCK128, FP8(1e-4f, QS_MUL, QP_NONE, 0, QE_RCPA), NO},
    {QC_QP_VLLM, QC_QF_FP8_BLOCK128_UE8M0, FP8(1e-4f, QS_MUL, QP_NONE, 0, QE_RCPA), FP8(1e-4f, QS_MUL, QP_CEIL2_LOG, 0, QE_RCPA)},
    {QC_QP_VLLM, QC_QF_NVFP4, NV(QG_EAGER, QF_VLLM, QN_RCP), NO},                     /* the eager reference */
    {QC_QP_VLLM, QC_QF_MXFP8, MX(QM_LOG_MUL, 0), NO},
    {QC_QP_VLLM, QC_QF_MXFP4, MX(QM_EVEN, 1), NO},

    /* vLLM's QuantFP8.forward_native (input_quant_fp8.py @014af6b; _FP8_MAX 448 from quant_utils.py
     * get_fp8_min_max @01693a6) under Inductor: (amax / 448).clamp(min=1/(448*512)), elements
     * x * scale.reciprocal(); _quantize_group_native: absmax / 448, UE8M0 exp2(ceil(log2(.))) BEFORE the
     * same clamp, elements x / scale (Inductor: x * rcpa(s)), clamped to +-448 */
    {QC_QP_VLLM_NATIVE, QC_QF_FP8_TENSOR, FP8(0, QS_MUL, QP_NONE, C229, QE_RCPA), NO},
    {QC_QP_VLLM_NATIVE, QC_QF_FP8_TOKEN, FP8(0, QS_MUL, QP_NONE, C229, QE_RCPA), NO},
    {QC_QP_VLLM_NATIVE, QC_QF_FP8_CHANNEL, FP8(0, QS_MUL, QP_NONE, C229, QE_RCPA), NO},
    {QC_QP_VLLM_NATIVE, QC_QF_FP8_GROUP128, FP8(0, QS_MUL, QP_NONE, C229, QE_RCPA), NO},
    {QC_QP_VLLM_NATIVE, QC_QF_FP8_GROUP128_UE8M0, FP8(0, QS_MUL, QP_CEIL2_LOG, C229, QE_RCPA), NO},
    {QC_QP_VLLM_TRITON, QC_QF_FP8_GROUP128, FP8(1e-10f, QS_MUL, QP_NONE, 0, QE_RCPA), NO},
    {QC_QP_VLLM_TRITON, QC_QF_FP8_GROUP128_UE8M0, FP8(1e-10f, QS_MUL, QP_CEIL2_LOG, 0, QE_RCPA), NO},
    /* vLLM's CUDA nvfp4 kernel (csrc/quantization/fp4/nvfp4_utils.cuh @2c9ff65, cvt_warp_fp16_to_fp4):
     * SF = e4m3 SATFINITE(g * (bmax * rcp.approx.ftz(6))) (rcpa(6) = RN(1/6)); factor SF != 0 ?
     * rcp.approx.ftz(SF * rcp.approx.ftz(g)) : 0; cvt.rn.satfinite.e2m1x2. g is given (eager rule here) */
    {QC_QP_VLLM_CUDA_NVFP4, QC_QF_NVFP4, NV(QG_EAGER, QF_VLLM, QN_RCPA), NO},

    {QC_QP_TORCH, QC_QF_FP8_TENSOR, FP8(0, QS_MUL, QP_NONE, 0, QE_RCP), NO},
    {QC_QP_TORCH, QC_QF_FP8_TOKEN, FP8(0, QS_MUL, QP_NONE, C229, QE_RCP), NO},
    {QC_QP_TORCH, QC_QF_FP8_CHANNEL, FP8(0, QS_MUL, QP_NONE, C229, QE_RCP), NO},
    {QC_QP_TORCH, QC_QF_FP8_GROUP128, FP8(1e-10f, QS_MUL, QP_NONE, 0, QE_RCP), NO},
    {QC_QP_TORCH, QC_QF_FP8_GROUP128_UE8M0, FP8(1e-10f, QS_MUL, QP_CEIL2_LOG, 0, QE_RCP), NO},
    {QC_QP_TORCH, QC_QF_FP8_BLOCK128, FP8(1e-4f, QS_MUL, QP_NONE, 0, QE_RCP), NO},
    {QC_QP_TORCH, QC_QF_FP8_BLOCK128_UE8M0, FP8(1e-4f, QS_MUL, QP_NONE, 0, QE_RCP), FP8(1e-4f, QS_MUL, QP_CEIL2_LOG, 0, QE_RCP)},
    {QC_QP_TORCH, QC_QF_NVFP4, NV(QG_EAGER, QF_VLLM, QN_RCP), NO},
    {QC_QP_TORCH, QC_QF_MXFP8, MX(QM_LOG_MUL, 0), NO},
    {QC_QP_TORCH, QC_QF_MXFP4, MX(QM_EVEN, 1), NO},

    {QC_QP_DEEPGEMM, QC_QF_FP8_BLOCK128_UE8M0, FP8(1e-4f, QS_MUL, QP_NONE, 0, QE_RCPA), FP8(1e-4f, QS_MUL, QP_CEIL2, 0, QE_RCPA)},
    /* ModelOpt (modelopt/torch/quantization/qtensor/nvfp4_tensor.py @5a4242f, NVFP4QTensor):
     * w = amax / 2688 (eager: amax * RN(1/2688)); sf = e4m3(bmax / (6 * w)), 0 -> 1.0, no lower
     * clamp; elements _cast_fp4(x / (sf * w)) */
    {QC_QP_MODELOPT, QC_QF_NVFP4, NV(QG_MULINV, QF_MODELOPT, QN_DIVM), NO},
    /* compressed-tensors @ac8e2ba (0.18.0; the NVFP4 preset, quant_scheme.py, sets scale_dtype e4m3):
     * helpers.py generate_gparam: g = 2688 / max(amax, FLT_MIN), Tensor.__rtruediv__ = RN(1/a) * 2688, NaN/Inf -> 1;
     * calculate_qparams: sf = e4m3(clamp(g * (bmax / 6), +-448)) (on CUDA / 6 is * RN(1/6)), a 0 -> _get_dtype_eps
     * 0.125; forward_helpers.py _quantize: cast_to_fp4(clamp(x / (sf / g), +-6)), RNE */
    {QC_QP_COMPRESSED_TENSORS, QC_QF_NVFP4, NV(QG_CT, QF_CT, QN_DIVG), NO},

    {QC_QP_TE, QC_QF_FP8_TENSOR, TE(QP_NONE), NO},
    {QC_QP_TE, QC_QF_FP8_TOKEN, TE(QP_NONE), NO},
    {QC_QP_TE, QC_QF_FP8_CHANNEL, TE(QP_NONE), NO},
    {QC_QP_TE, QC_QF_FP8_GROUP128, TE(QP_NONE), NO},
    {QC_QP_TE, QC_QF_FP8_BLOCK128, TE(QP_NONE), NO},
    {QC_QP_TE, QC_QF_FP8_GROUP128_UE8M0, TE(QP_TRUNC), NO}, /* one stage */
    {QC_QP_TE, QC_QF_FP8_BLOCK128_UE8M0, TE(QP_TRUNC), NO},
    /* Transformer Engine's NVFP4 (cast/nvfp4/core_nvfp4.cuh, quantize_transpose_nvfp4.cuh @d0067d0):
     * S_enc = min(2688 / amax, FLT_MAX) (amax 0: 1); S_dec_b = e4m3(bmax * (S_enc * RN(1/6)));
     * elements x * min(1 / (S_dec_b * (1 / S_enc)), FLT_MAX), cvt.rn.satfinite */
    {QC_QP_TE, QC_QF_NVFP4, NV(QG_TE, QF_TE, QN_RCP_TE), NO},
    /* OCP MX v1.0 sec. 6.3: X = 2^(floor(log2(amax)) - emax_elem), clamped at 2^-127, elements V / X exactly,
     * saturating (the floor from the bits, as torchao to_mx FLOOR @050515e; microxcaling mx_ops.py
     * _quantize_mx @3b429a8 takes it from a float log2, which can differ just under a power of two) */
    {QC_QP_OCP, QC_QF_MXFP8, MX(QM_OCP, 0), NO},
    {QC_QP_OCP, QC_QF_MXFP4, MX(QM_OCP, 1), NO},
};

/* The profile a profile takes a format from when its producer has no path
 * of its own for it (docs/numerics.md, "Profiles"). */
static qc_qprof base_of(qc_qprof p) {
  return p == QC_QP_MODELOPT || p == QC_QP_COMPRESSED_TENSORS ? QC_QP_TORCH : QC_QP_VLLM;
}

/* The row of (f, p) itself, or NULL. */
static const struct path_row *own_path(qc_qfmt f, qc_qprof p) {
  for (size_t i = 0; i < sizeof g_paths / sizeof g_paths[0]; i++)
    if (g_paths[i].p == p && g_paths[i].f == f) return &g_paths[i];
  return NULL;
}

int qc_qrecipe(qc_qfmt f, qc_qprof p, qc_recipe *r1, qc_recipe *r2) {
  memset(r1, 0, sizeof *r1);
  memset(r2, 0, sizeof *r2);
  if (f == QC_QF_NONE || (unsigned)f >= QC_QF_COUNT || (unsigned)p >= QC_QP_COUNT) return 0;
  const struct path_row *row = own_path(f, p);
  for (qc_qprof q = p; !row; q = base_of(q)) row = own_path(f, base_of(q));
  *r1 = row->r1;
  *r2 = row->r2;
  return r2->kind != QR_NONE;
}

plan_t qq_make_plan(qc_qfmt f, qc_qprof p) {
  plan_t pl = geometry(f);
  pl.two_stage = qc_qrecipe(f, p, &pl.rc, &pl.rc2);
  return pl;
}

int qc_qprof_makes(qc_qfmt f, qc_qprof p) {
  int mx = f == QC_QF_MXFP8 || f == QC_QF_MXFP4;
  if (p == QC_QP_VLLM_CUDA) /* vLLM's CUDA activation kernels: per tensor, token, channel, 1 x 128 group */
    return f == QC_QF_FP8_TENSOR || f == QC_QF_FP8_TOKEN || f == QC_QF_FP8_CHANNEL || f == QC_QF_FP8_GROUP128 ||
           f == QC_QF_FP8_GROUP128_UE8M0;
  return p == QC_QP_OCP ? mx : p == QC_QP_TE ? !mx : 1;
}

static int recipe_eq(const qc_recipe *a, const qc_recipe *b) {
  return a->kind == b->kind && a->sop == b->sop && a->pow2 == b->pow2 && a->eop == b->eop && a->gop == b->gop &&
         a->sfop == b->sfop && a->nop == b->nop && a->mop == b->mop && a->fp4 == b->fp4 &&
         fbits(a->afloor) == fbits(b->afloor) && fbits(a->sfloor) == fbits(b->sfloor) && fbits(a->pfloor) == fbits(b->pfloor);
}

int qc_qprof_same(qc_qfmt f, qc_qprof a, qc_qprof b) {
  plan_t x = qq_make_plan(f, a), y = qq_make_plan(f, b);
  return x.two_stage == y.two_stage && recipe_eq(&x.rc, &y.rc) && recipe_eq(&x.rc2, &y.rc2);
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
                      : enc_sr(v, pl->fp4, qc_sr_bits(j->sr, qc_sr_index(j->sr, (uint64_t)(rows * cols), (uint64_t)(r * cols + c))));
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
