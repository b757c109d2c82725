/* test_refcost.c: the cost model of --reference auto (backend/refcost.h):
 * with an H100's rates it picks the Ozaki scheme (4 slices) for the prefill
 * shape's two reference GEMMs and DGEMM at decode shapes (k = 16 tokens:
 * the int32 products are memory-bound), as measured (docs/gpu.md); the
 * 10% margin; no usable rates, no fast reference. */
#include <criterion/criterion.h>
#include <math.h>

#include "backend/backend.h"
#include "backend/refcost.h"

/* An H100 SXM's, about: DGEMM 57 TFLOP/s (16.9 ms for the prefill pair),
 * int8 1000 TOP/s, 2.8 TB/s, 5 us a call, a self-check of 0.05 ns per
 * element and k. */
static const qc_refcost_rates h100 = {
    .dgemm_flops = 57e12, .i8_ops = 1000e12, .split_bw = 2.0e12, .bw = 2.8e12, .call_s = 5e-6, .check_s = 5e-11};

/* The fused audit's two reference GEMMs of [M tokens, K in, N out]:
 * d_x = dY W_ref (C[M, K], contraction N), d_weight = dY^T X (C[N, K], contraction M). */
static int pick_dx(const qc_refcost_rates *r, int64_t M, int64_t K, int64_t N, double *td, double *tf) {
  return qc_refcost_pick(r, M, K, N, QC_REF_FAST_SLICES, td, tf);
}
static int pick_dw(const qc_refcost_rates *r, int64_t M, int64_t K, int64_t N, double *td, double *tf) {
  return qc_refcost_pick(r, N, K, M, QC_REF_FAST_SLICES, td, tf);
}

Test(refcost, prefill_takes_the_fast_reference) {
  double td, tf, td2, tf2;
  cr_expect_eq(pick_dx(&h100, 8192, 7168, 4096, &td, &tf), QC_REF_FAST_SLICES, "d_x: DGEMM %.3f ms, fast %.3f ms", td * 1e3, tf * 1e3);
  cr_expect_eq(pick_dw(&h100, 8192, 7168, 4096, &td2, &tf2), QC_REF_FAST_SLICES, "d_weight: DGEMM %.3f ms, fast %.3f ms", td2 * 1e3,
               tf2 * 1e3);
  /* the measured pair: DGEMM 16.9 ms, 4 slices 11.2 ms; the model within 25% of both */
  cr_expect(fabs((td + td2) * 1e3 - 16.9) < 0.25 * 16.9, "DGEMM pair predicted %.3f ms", (td + td2) * 1e3);
  cr_expect(fabs((tf + tf2) * 1e3 - 11.2) < 0.25 * 11.2, "fast pair predicted %.3f ms", (tf + tf2) * 1e3);
}

Test(refcost, decode_keeps_dgemm) {
  double td, tf;
  cr_expect_eq(pick_dw(&h100, 16, 7168, 4096, &td, &tf), 0, "d_weight at 16 tokens: DGEMM %.3f ms, fast %.3f ms", td * 1e3, tf * 1e3);
  cr_expect(tf > 2 * td, "the thin GEMM's int32 products make the fast one slower: %.3f against %.3f ms", tf * 1e3, td * 1e3);
  cr_expect_eq(pick_dx(&h100, 16, 7168, 4096, &td, &tf), 0, "d_x at 16 tokens: DGEMM %.3f ms, fast %.3f ms", td * 1e3, tf * 1e3);
  /* small products: the fixed costs of the fast one's calls dominate */
  cr_expect_eq(pick_dx(&h100, 64, 256, 128, NULL, NULL), 0);
  cr_expect_eq(pick_dw(&h100, 1, 1, 1, NULL, NULL), 0);
}

Test(refcost, the_margin_is_ten_percent) {
  /* a device whose DGEMM is so fast that the fast reference is predicted
   * a little faster, but not 10%: DGEMM */
  const int64_t m = 8192, n = 7168, k = 4096;
  qc_refcost_rates r = h100;
  double tf = qc_refcost_fast_s(&r, m, n, k, 4);
  /* DGEMM's compute time set so that it is 5% slower than the fast one */
  r.dgemm_flops = 2.0 * m * n * k / (1.05 * tf - r.call_s);
  double td = qc_refcost_dgemm_s(&r, m, n, k);
  cr_assert(td > tf && td < tf / QC_REFCOST_MARGIN, "the set-up: DGEMM %.4g s, fast %.4g s", td, tf);
  cr_expect_eq(qc_refcost_pick(&r, m, n, k, 4, NULL, NULL), 0, "5%% faster is not enough");
  r.dgemm_flops = 2.0 * m * n * k / (1.2 * tf - r.call_s);
  cr_expect_eq(qc_refcost_pick(&r, m, n, k, 4, NULL, NULL), 4, "20%% faster is");
}

Test(refcost, more_slices_cost_more) {
  const double t3 = qc_refcost_fast_s(&h100, 8192, 7168, 4096, 3), t4 = qc_refcost_fast_s(&h100, 8192, 7168, 4096, 4),
               t5 = qc_refcost_fast_s(&h100, 8192, 7168, 4096, 5);
  cr_expect(t3 < t4 && t4 < t5, "%g %g %g", t3, t4, t5);
  /* a contraction longer than one chunk costs its chunks' combines too */
  const int64_t kc = qc_refcost_chunk(4);
  cr_expect(kc > 0 && kc % 16 == 0 && 4 * kc * 127 * 127 < 2147483648.0, "chunk %lld", (long long)kc);
  cr_expect(qc_refcost_fast_s(&h100, 256, 256, 2 * kc, 4) > 2 * qc_refcost_fast_s(&h100, 256, 256, kc, 4) - 1e-4);
}

Test(refcost, no_usable_rates_no_fast_reference) {
  qc_refcost_rates r = h100;
  double td = 0, tf = 0;
  r.i8_ops = 0; /* a probe that could not time the int8 GEMM */
  cr_expect_eq(qc_refcost_pick(&r, 8192, 7168, 4096, 4, &td, &tf), 0);
  cr_expect(isnan(td) && isnan(tf));
  r = h100;
  r.bw = NAN;
  cr_expect_eq(qc_refcost_pick(&r, 8192, 7168, 4096, 4, NULL, NULL), 0);
  cr_expect_eq(qc_refcost_pick(NULL, 8192, 7168, 4096, 4, NULL, NULL), 0);
  cr_expect_eq(qc_refcost_pick(&h100, 8192, 7168, 4096, 0, NULL, NULL), 0, "0 slices: DGEMM");
  cr_expect(qc_refcost_ok(&h100));
}
