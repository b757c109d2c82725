/* test_producer_edges.c: what each producer path gives at the edge cases
 * that tell paths apart (an all-zero group, a subnormal amax, an amax under
 * the floor, the format's maximum, a quotient that is exactly a power of
 * two, NaN and Inf; for the element cast, ties, saturation, zeros and the
 * element of a block whose scale is 0), table-driven. Every expected value
 * is written from the producer's own source at the version
 * docs/conformance.md pins ("Producer sources"), not from qatcheck: a rule
 * that parts from the producer's source fails here.
 *
 * The input is one row of 128 float32: v at index 7 (the block's amax), x at
 * index 5 (the element whose code is checked), big at index 100 (another
 * block for nvfp4 and mx: the tensor's amax), the rest zero. Checked: the
 * first block's scale (float32 bits, or the e4m3 / e8m0 byte), the code of
 * element 5 and nvfp4's global scale. */
#include <criterion/criterion.h>
#include <math.h>
#include <stdint.h>
#include <string.h>

#include "core/qc.h"
#include "numerics/quant.h"

typedef struct {
  const char *prof, *fmt, *edge;
  float v, x, big;
  uint32_t scale;  /* expected scale: float32 bits, or the scale byte; REFUSED: the input is refused */
  int code;        /* expected code of element 5 (e4m3 byte or e2m1 nibble); -1: not checked */
  uint32_t g;      /* expected nvfp4 global scale bits; 0: not checked */
  const char *src; /* where the expectation comes from */
} edge_row;

#define REFUSED 0xffffffffu
#define NOPE "refused (docs/numerics.md: never mapped)"
#define CUDA "vLLM per_token_group_quant.cu (ComputeGroupScale, register kernels) @0f5257e"
#define CUDAQ "vLLM per_token_group_quant.cu (QuantizeGroup, register kernel: x / y_s, no fast math) @0f5257e"
#define TRITON "vLLM fp8_utils.py _per_token_group_quant_fp8 @007d500"
#define TE8 "TE recipe_common.cuh compute_scale_from_amax + current_scaling.cu (scale_inv = __frcp_rn) @d0067d0"
#define TEB "TE quantize_transpose_square_blockwise.cu (compute_scale_from_types, pow2: bits & 0xff800000) @d0067d0"
#define TENV "TE core_nvfp4.cuh + quantize_transpose_nvfp4.cuh (S_enc min FLT_MAX, block inverse min FLT_MAX) @d0067d0"
#define MO "ModelOpt nvfp4_tensor.py NVFP4QTensor (get_weights_scaling_factor, quantize, _cast_fp4) @5a4242f"
#define DG "DeepGEMM deep_gemm/utils/math.py per_block_cast_to_fp8, ceil_to_ue8m0 @54e2261"
#define NAT "vLLM input_quant_fp8.py QuantFP8.forward_native, _quantize_group_native @014af6b (Inductor: t / 448 = t * RN(1/448))"
#define NV4 "vLLM nvfp4_utils.cuh cvt_warp_fp16_to_fp4 (reciprocal_approximate_ftz = rcp.approx.ftz.f32) @2c9ff65"
#define OCP "OCP MX v1.0 6.3 (X = 2^(floor(log2 amax) - emax), V / X exact): microxcaling mx_ops.py _quantize_mx @3b429a8, torchao to_mx FLOOR @050515e"
#define TAO "torchao mx_tensor.py to_mx, ScaleCalculationMode.EVEN (bits + 2^21, exponent - 2) @050515e"
#define CT "compressed-tensors helpers.py generate_gparam, calculate_qparams, _get_dtype_eps; forward_helpers.py _quantize @ac8e2ba (0.18.0)"
#define NA 0.0f, 0.0f

static const edge_row g_rows[] = {
    /* vLLM fp8_group128_ue8m0: CUDA floors the scale (fmaxf(amax / 448, 1e-10), then the power of two: 2^-33 at
     * least); Triton floors the amax only (exp2(ceil(log2(max(amax, 1e-10) / 448))): 2^-42 at least) */
    {"vllm_cuda", "fp8_group128_ue8m0", "all-zero group", NA, 0, 0x2f000000u, -1, 0, CUDA},
    {"vllm", "fp8_group128_ue8m0", "all-zero group", NA, 0, 0x2f000000u, -1, 0, CUDA " (vllm's default on CUDA)"},
    {"vllm_triton", "fp8_group128_ue8m0", "all-zero group", NA, 0, 0x2a800000u, -1, 0, TRITON},
    {"vllm_cuda", "fp8_group128_ue8m0", "subnormal amax 1e-40", 1e-40f, 0, 0, 0x2f000000u, -1, 0, CUDA},
    {"vllm_triton", "fp8_group128_ue8m0", "subnormal amax 1e-40", 1e-40f, 0, 0, 0x2a800000u, -1, 0, TRITON},
    {"vllm_cuda", "fp8_group128_ue8m0", "amax 1e-9 (scale under 1e-10)", 1e-9f, 0, 0, 0x2f000000u, -1, 0, CUDA},
    {"vllm_triton", "fp8_group128_ue8m0", "amax 1e-9 (scale under 1e-10)", 1e-9f, 0, 0, 0x2c800000u, -1, 0, TRITON " (2^-38)"},
    {"vllm_cuda", "fp8_group128_ue8m0", "amax at the format max 448", 448.0f, 0, 0, 0x3f800000u, -1, 0, CUDA},
    {"vllm_triton", "fp8_group128_ue8m0", "amax at the format max 448", 448.0f, 0, 0, 0x3f800000u, -1, 0, TRITON},
    {"vllm_cuda", "fp8_group128_ue8m0", "tie: amax / 448 = 2^-7 exactly", 3.5f, 0, 0, 0x3c000000u, -1, 0, CUDA},
    {"vllm_triton", "fp8_group128_ue8m0", "tie: amax / 448 = 2^-7 exactly", 3.5f, 0, 0, 0x3c000000u, -1, 0, TRITON},
    {"vllm_cuda", "fp8_group128_ue8m0", "NaN", NAN, 0, 0, REFUSED, -1, 0, NOPE},
    {"vllm_triton", "fp8_group128_ue8m0", "+Inf", INFINITY, 0, 0, REFUSED, -1, 0, NOPE},
    /* vLLM fp8_group128 (float32 scales): CUDA RN(max(amax, 1e-10) / 448), elements x / y_s (div.rn: the file is
     * built without --use_fast_math); Triton max(amax, 1e-10) / 448, computed as a product by RN(1/448) */
    {"vllm_cuda", "fp8_group128", "all-zero group", NA, 0, 0x2a7b5123u, -1, 0, CUDA},
    {"vllm_triton", "fp8_group128", "all-zero group", NA, 0, 0x2a7b5124u, -1, 0, TRITON},
    {"vllm_cuda", "fp8_group128", "amax 1e-9", 1e-9f, 0, 0, 0x2c1d12b6u, -1, 0, CUDA},
    {"vllm_cuda", "fp8_group128", "amax at the format max 448", 448.0f, 0, 0, 0x3f800000u, -1, 0, CUDA},
    {"vllm_cuda", "fp8_group128", "-Inf", -INFINITY, 0, 0, REFUSED, -1, 0, NOPE},
    /* amax 1.078125 (bf16): s = RN(amax / 448); element 0x38cf0000 (bf16): x / s -> 0x12, x * RN(1/s) -> 0x13 */
    {"vllm", "fp8_group128", "element x / s (not x * rcp(s))", 1.078125f, 9.870529174804688e-05f, 0, 0x3b1db6dbu, 0x12, 0,
     CUDAQ},
    {"vllm_cuda", "fp8_group128", "element x / s (not x * rcp(s))", 1.078125f, 9.870529174804688e-05f, 0, 0x3b1db6dbu, 0x12,
     0, CUDAQ},

    /* Transformer Engine current scaling: scale = 448 / amax (__fdiv_rn), amax 0 -> 1, an infinite scale ->
     * FLT_MAX (per tensor; blockwise: the input type's max, FLT_MAX for float32 input), no epsilon by default;
     * stored scale_inv = RN(1 / scale); elements static_cast<fp8>(x * scale) (SATFINITE) */
    {"te", "fp8_tensor", "all-zero tensor", NA, 0, 0x3f800000u, 0x00, 0, TE8},
    {"te", "fp8_tensor", "subnormal amax 1e-40 (scale FLT_MAX)", 1e-40f, 0, 0, 0x00200000u, -1, 0, TE8},
    {"te", "fp8_tensor", "amax 1e-9", 1e-9f, 0, 0, 0x2c1d12b6u, -1, 0, TE8},
    {"te", "fp8_tensor", "amax at the format max 448", 448.0f, 0, 0, 0x3f800000u, -1, 0, TE8},
    {"te", "fp8_tensor", "power of two: 448 / 3.5 = 128", 3.5f, 0, 0, 0x3c000000u, -1, 0, TE8},
    {"te", "fp8_tensor", "tie 1.0625 (scale 1) -> 1.0", 448.0f, 1.0625f, 0, 0x3f800000u, 0x38, 0, TE8 " (RNE)"},
    {"te", "fp8_tensor", "tie 1.1875 (scale 1) -> 1.25", 448.0f, 1.1875f, 0, 0x3f800000u, 0x3a, 0, TE8 " (RNE)"},
    /* amax 0x3f801d04: amax * RN(448 / amax) = 0x43e00001 > 448: SATFINITE gives 448, not NaN */
    {"te", "fp8_tensor", "x * scale just over 448 saturates", 1.0008854866027832f, 1.0008854866027832f, 0, 0x3b126a4du, 0x7e, 0,
     TE8 " (SATFINITE)"},
    {"te", "fp8_tensor", "NaN", NAN, 0, 0, REFUSED, -1, 0, NOPE},
    {"te", "fp8_block128_ue8m0", "pow2 scale: 448 / 3 truncated to 128", 3.0f, 0, 0, 0x3c000000u, -1, 0, TEB},
    {"te", "fp8_block128_ue8m0", "subnormal amax: FLT_MAX truncated to 2^127", 1e-40f, 0, 0, 0x00400000u, -1, 0, TEB},
    {"te", "fp8_block128", "all-zero block", NA, 0, 0x3f800000u, -1, 0, TEB},
    /* TE NVFP4: S_enc = min(2688 / amax, FLT_MAX), amax 0 -> 1; S_dec_b = e4m3(bmax * (S_enc * RN(1/6)));
     * elements cvt.rn.satfinite(x * min(1 / (S_dec_b * (1 / S_enc)), FLT_MAX)) */
    {"te", "nvfp4", "amax 6: S_enc 448, block scale 448", 6.0f, 6.0f, 0, 0x7e, 0x7, 0x43e00000u, TENV},
    {"te", "nvfp4", "block scale 0: x * FLT_MAX saturates to 6", 1e-6f, 1e-6f, 6.0f, 0x00, 0x7, 0x43e00000u, TENV},
    {"te", "nvfp4", "subnormal tensor amax: S_enc = FLT_MAX", 1e-40f, -1e-40f, 0, 0x03, 0x8, 0x7f7fffffu, TENV},

    /* ModelOpt NVFP4 export: w = amax / 2688 (eager: amax * RN(1/2688)); sf = e4m3(bmax / (6 * w)), 0 -> 1.0,
     * no lower clamp (under 2^-10 the byte is 0); elements _cast_fp4(x / (sf * w)): sign (v < 0), magnitude by
     * searchsorted over the midpoints with ties to even, NaN -> 7, +-Inf -> 6 */
    {"modelopt", "nvfp4", "amax 6: block scale 448", 6.0f, 6.0f, 0, 0x7e, 0x7, 0x3b124925u, MO},
    {"modelopt", "nvfp4", "block scale under 2^-10: byte 0, x / 0 -> 6", 1e-6f, 1e-6f, 6.0f, 0x00, 0x7, 0x3b124925u, MO},
    {"modelopt", "nvfp4", "block scale 0: a zero element, 0 / 0 -> 6", 1e-6f, 0.0f, 6.0f, 0x00, 0x7, 0x3b124925u, MO},
    {"modelopt", "nvfp4", "negative zero: sign bit (v < 0) is 0", 6.0f, -0.0f, 0, 0x7e, 0x0, 0x3b124925u, MO},
    {"modelopt", "nvfp4", "tie 2.5 -> 2 (ties to even)", 6.0f, 2.5f, 0, 0x7e, 0x4, 0x3b124925u, MO},

    /* compressed-tensors NVFP4 (scale_dtype e4m3 in the preset): g = 2688 / max(amax, FLT_MIN) as Tensor.__rtruediv__,
     * RN(1/a) * 2688, NaN/Inf -> 1; sf = e4m3(min(g * (bmax / 6), 448)) with a 0 replaced by the e4m3 eps 0.125
     * (byte 0x20); elements cast_to_fp4(x / (sf / g)), RNE, clamped to +-6 */
    {"compressed_tensors", "nvfp4", "amax 6: g 448, block scale 448", 6.0f, 6.0f, 0, 0x7e, 0x7, 0x43e00000u, CT},
    {"compressed_tensors", "nvfp4", "block scale 0 -> e4m3 eps 0.125 (0x20)", 0x1.0c6f7ap-20f, 0x1.0c6f7ap-20f, 6.0f, 0x20,
     0x0, 0x43e00000u, CT},
    {"compressed_tensors", "nvfp4", "amax 1e-36: 2688 / amax overflows, g 1", 0x1.54484ap-120f, 0x1.54484ap-120f, 0, 0x20,
     0x0, 0x3f800000u, CT},
    {"compressed_tensors", "nvfp4", "subnormal amax: clamped to FLT_MIN, g 1", 0x1.16c2p-133f, 0x1.16c2p-133f, 0, 0x20, 0x0,
     0x3f800000u, CT},
    /* sf 384, g 0x433bf1e8: x / RN(sf / g) is just under 0.75 (code 1); x * rcp(sf * rcp(g)) reaches it (code 2) */
    {"compressed_tensors", "nvfp4", "element x / (sf / g), not x * rcp(sf * rcp(g))", 0x1.848a3p+3f, 0x1.8848fap+0f,
     0x1.c9aa7ap+3f, 0x7c, 0x1, 0x433bf1e8u, CT},

    /* DeepGEMM's reference (torch: per_block_cast_to_fp8(use_ue8m0=False); deepgemm: ceil_to_ue8m0's bit rule):
     * amax.clamp(1e-4) / 448 (eager: * RN(1/448)); elements x * (1.0 / sf) */
    {"torch", "fp8_block128", "all-zero block: 1e-4 * RN(1/448)", NA, 0, 0x346facadu, -1, 0, DG},
    {"torch", "fp8_block128", "power of two: 3.5 / 448 = 2^-7", 3.5f, 0, 0, 0x3c000000u, -1, 0, DG},
    {"torch", "fp8_block128", "amax at the format max 448", 448.0f, 0, 0, 0x3f800000u, -1, 0, DG},
    {"deepgemm", "fp8_block128_ue8m0", "all-zero block: bit rule of 1e-4 * RN(1/448)", NA, 0, 0x34800000u, -1, 0, DG},

    /* vLLM's torch-native QuantFP8 (vllm_native): (amax / 448).clamp(min=1/(448*512)), the group path's UE8M0
     * exp2(ceil(log2(.))) BEFORE that clamp, so a small group's scale is RN(1/229376) itself, not a power of two */
    {"vllm_native", "fp8_token", "all-zero row: the clamp RN(1/229376)", NA, 0, 0x36924925u, -1, 0, NAT},
    {"vllm_native", "fp8_tensor", "amax 1e-9: the clamp RN(1/229376)", 1e-9f, 0, 0, 0x36924925u, -1, 0, NAT},
    {"vllm_native", "fp8_group128_ue8m0", "all-zero group: clamp after the power of two", NA, 0, 0x36924925u, -1, 0, NAT},
    {"vllm_native", "fp8_group128_ue8m0", "amax 0.01: ceil2_log(0.01 * RN(1/448)) = 2^-15", 0.01f, 0, 0, 0x38000000u, -1, 0, NAT},

    /* vLLM's CUDA nvfp4 kernel: SF = e4m3(g * (bmax * rcp.approx.ftz(6))), factor rcp.approx.ftz(SF * rcp.approx.ftz(g)):
     * for a tensor amax of 2^-116, g = 2688 * 2^116 and rcp.approx.ftz(g) flushes to 0, so the factor is Inf and
     * x = 2^-117 saturates to 6 (without the flush: 3.0, code 5) */
    {"vllm_cuda_nvfp4", "nvfp4", "global scale over 2^126: ftz reciprocal 0, x saturates", 0x1p-116f, 0x1p-117f, 0, 0x7e, 0x7,
     0x7f280000u, NV4},
    {"vllm_cuda_nvfp4", "nvfp4", "amax 6: g 448, block scale 448", 6.0f, 6.0f, 0, 0x7e, 0x7, 0x43e00000u, NV4},

    /* OCP MX: X = 2^(floor(log2(amax)) - emax) (8 for e4m3, 2 for e2m1), clamped at 2^-127, elements V / X exactly:
     * in a byte-0 block, x = 17 * 2^-131 gives 1.0625 exactly, a tie that rounds to 1.0 (0x38); dividing by
     * exp2f(-127) = 0x003fffff instead gives just above 1.0625, 1.125 (0x39) */
    {"ocp", "mxfp8", "byte-0 block: x * 2^127 exactly (tie 1.0625 -> 1.0)", 0x1.8p-120f, 0x1.1p-127f, 0, 0x00, 0x38, 0, OCP},
    {"ocp", "mxfp8", "amax 1: floor(log2 1) - 8, element 256", 1.0f, 1.0f, 0, 0x77, 0x78, 0, OCP},
    {"ocp", "mxfp4", "amax 7: floor(log2 7) - 2 = 0, element saturates to 6", 7.0f, 7.0f, 0, 0x7f, 0x7, 0, OCP},
    /* torchao's EVEN rule (qatcheck's torch and vllm mxfp4): 7 + 2^21 ulp crosses to 8, exponent 3 - 2 = 1 */
    {"torch", "mxfp4", "amax 7: EVEN rounds the exponent up", 7.0f, 0, 0, 0x80, -1, 0, TAO},
};

/* The code of element i: a byte, or a nibble of two a byte (fp4). */
static int code_at(const qc_quantized *z, int fp4, int i) {
  const uint8_t *q = z->q.data;
  return fp4 ? (q[i / 2] >> (4 * (i & 1))) & 0xF : q[i];
}

Test(producer_edges, scales_and_codes_follow_the_producers_source) {
  for (size_t i = 0; i < sizeof g_rows / sizeof g_rows[0]; i++) {
    const edge_row *e = &g_rows[i];
    qc_qfmt f;
    qc_qprof p;
    cr_assert_eq(qc_qfmt_parse(e->fmt, &f), QC_OK);
    cr_assert_eq(qc_qprof_parse(e->prof, &p), QC_OK, "%s", qc_err_msg());
    float x[128] = {0};
    x[7] = e->v;
    x[5] = e->x;
    x[100] = e->big;
    qc_quantized z;
    int rc = qc_quantize(f, p, 1, 128, x, NULL, &z, "edge");
    if (e->scale == REFUSED) {
      cr_expect_eq(rc, QC_EINPUT, "%s/%s %s: not refused", e->prof, e->fmt, e->edge);
      qc_err_clear();
      continue;
    }
    cr_assert_eq(rc, QC_OK, "%s/%s %s: %s", e->prof, e->fmt, e->edge, qc_err_msg());
    uint32_t got = 0;
    if (z.scale.dtype == QC_F32) memcpy(&got, z.scale.data, 4);
    else got = ((const uint8_t *)z.scale.data)[0];
    cr_expect_eq(got, e->scale, "%s/%s %s: scale 0x%08x, the producer's source gives 0x%08x (%s)", e->prof, e->fmt,
                 e->edge, got, e->scale, e->src);
    int fp4 = f == QC_QF_NVFP4 || f == QC_QF_MXFP4;
    if (e->code >= 0)
      cr_expect_eq(code_at(&z, fp4, 5), e->code, "%s/%s %s: element code 0x%x, the producer's source gives 0x%x (%s)",
                   e->prof, e->fmt, e->edge, code_at(&z, fp4, 5), e->code, e->src);
    if (e->g) {
      uint32_t g;
      memcpy(&g, z.gscale.data, 4);
      cr_expect_eq(g, e->g, "%s/%s %s: global scale 0x%08x, the producer's source gives 0x%08x (%s)", e->prof, e->fmt,
                   e->edge, g, e->g, e->src);
    }
    qc_quantized_free(&z);
  }
}
