/* qpass.c: the quantizers' machinery (see qpass.h): the producer paths
 * (which recipe each profile runs for each format) and the element
 * tables and stochastic encoder; qgrid.c has the pass over the scale grid
 * that runs them. */
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
uint8_t qq_enc_sr(float v, int fp4, uint32_t r24) {
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
