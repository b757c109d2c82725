/* test_producer_edges.c: the scale each producer path gives at the edge
 * cases that tell paths apart (an all-zero group, a subnormal amax, an amax
 * under the floor, the format's maximum, a quotient that is exactly a power
 * of two, NaN and Inf), table-driven. Every expected value is written from
 * the producer's own source at the version docs/conformance.md pins ("Edge
 * cases"), not from qatcheck: a rule that parts from the producer's source
 * fails here. The group holds one value v, the other 127 are zero. */
#include <criterion/criterion.h>
#include <math.h>
#include <stdint.h>
#include <string.h>

#include "core/qc.h"
#include "numerics/quant.h"

typedef struct {
  const char *prof, *fmt, *edge;
  float v;         /* the group's one non-zero value (0: all zero) */
  uint32_t scale;  /* expected float32 scale bits; 0: the input is refused */
  const char *src; /* where the expectation comes from */
} edge_row;

#define CUDA "vLLM per_token_group_quant.cu (ComputeGroupScale, register kernels) @0f5257e"
#define TRITON "vLLM fp8_utils.py _per_token_group_quant_fp8 @007d500"
static const edge_row g_rows[] = {
    /* fp8_group128_ue8m0: CUDA floors the scale (fmaxf(amax / 448, 1e-10), then the power of two: 2^-33 at
     * least); Triton floors the amax only (exp2(ceil(log2(max(amax, 1e-10) / 448))): 2^-42 at least) */
    {"vllm_cuda", "fp8_group128_ue8m0", "all-zero group", 0.0f, 0x2f000000u, CUDA},
    {"vllm", "fp8_group128_ue8m0", "all-zero group", 0.0f, 0x2f000000u, CUDA " (vllm's default on CUDA)"},
    {"vllm_triton", "fp8_group128_ue8m0", "all-zero group", 0.0f, 0x2a800000u, TRITON},
    {"vllm_cuda", "fp8_group128_ue8m0", "subnormal amax 1e-40", 1e-40f, 0x2f000000u, CUDA},
    {"vllm_triton", "fp8_group128_ue8m0", "subnormal amax 1e-40", 1e-40f, 0x2a800000u, TRITON},
    {"vllm_cuda", "fp8_group128_ue8m0", "amax 1e-9 (scale under 1e-10)", 1e-9f, 0x2f000000u, CUDA},
    {"vllm_triton", "fp8_group128_ue8m0", "amax 1e-9 (scale under 1e-10)", 1e-9f, 0x2c800000u, TRITON " (2^-38)"},
    {"vllm_cuda", "fp8_group128_ue8m0", "amax at the format max 448", 448.0f, 0x3f800000u, CUDA},
    {"vllm_triton", "fp8_group128_ue8m0", "amax at the format max 448", 448.0f, 0x3f800000u, TRITON},
    {"vllm_cuda", "fp8_group128_ue8m0", "tie: amax / 448 = 2^-7 exactly", 3.5f, 0x3c000000u, CUDA},
    {"vllm_triton", "fp8_group128_ue8m0", "tie: amax / 448 = 2^-7 exactly", 3.5f, 0x3c000000u, TRITON},
    {"vllm_cuda", "fp8_group128_ue8m0", "NaN", NAN, 0, "refused (docs/numerics.md: never mapped)"},
    {"vllm_triton", "fp8_group128_ue8m0", "+Inf", INFINITY, 0, "refused (docs/numerics.md: never mapped)"},
    /* fp8_group128 (float32 scales): CUDA RN(max(amax, 1e-10) / 448); Triton max(amax, 1e-10) / 448, which
     * Triton computes as a product by RN(1/448) (measured: docs/conformance.md) */
    {"vllm_cuda", "fp8_group128", "all-zero group", 0.0f, 0x2a7b5123u, CUDA},
    {"vllm_triton", "fp8_group128", "all-zero group", 0.0f, 0x2a7b5124u, TRITON},
    {"vllm_cuda", "fp8_group128", "amax 1e-9", 1e-9f, 0x2c1d12b6u, CUDA},
    {"vllm_cuda", "fp8_group128", "amax at the format max 448", 448.0f, 0x3f800000u, CUDA},
    {"vllm_cuda", "fp8_group128", "-Inf", -INFINITY, 0, "refused (docs/numerics.md: never mapped)"},
};

Test(producer_edges, scales_follow_the_producers_source) {
  for (size_t i = 0; i < sizeof g_rows / sizeof g_rows[0]; i++) {
    const edge_row *e = &g_rows[i];
    qc_qfmt f;
    qc_qprof p;
    cr_assert_eq(qc_qfmt_parse(e->fmt, &f), QC_OK);
    cr_assert_eq(qc_qprof_parse(e->prof, &p), QC_OK, "%s", qc_err_msg());
    float x[128] = {0};
    x[77] = e->v;
    qc_quantized z;
    int rc = qc_quantize(f, p, 1, 128, x, NULL, &z, "edge");
    if (!e->scale) {
      cr_expect_eq(rc, QC_EINPUT, "%s/%s %s: not refused", e->prof, e->fmt, e->edge);
      qc_err_clear();
      continue;
    }
    cr_assert_eq(rc, QC_OK, "%s/%s %s: %s", e->prof, e->fmt, e->edge, qc_err_msg());
    cr_assert_eq(z.scale.dtype, QC_F32);
    uint32_t got;
    memcpy(&got, z.scale.data, 4);
    cr_expect_eq(got, e->scale, "%s/%s %s: scale 0x%08x, the producer's source gives 0x%08x (%s)", e->prof, e->fmt,
                 e->edge, got, e->scale, e->src);
    qc_quantized_free(&z);
  }
}
