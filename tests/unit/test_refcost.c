/* test_refcost.c: the cost model of --reference auto (backend/refcost.h):
 * with an H100's rates it picks the Ozaki scheme (4 slices) for the prefill
 * shape's two reference GEMMs and DGEMM at decode shapes (k = 16 tokens:
 * the int32 products are memory-bound), as measured (docs/gpu.md); it
 * prices the scheme as it runs (one int8 GEMM a level, its int32 product
 * written once; one a pair and chunk only past qc_refcost_whole), so a
 * short contraction with a large output, lost to the old per-pair pricing,
 * takes the fast reference; the 10% margin; no usable rates, no fast
 * reference. */
#include <criterion/criterion.h>
#include <math.h>

#include "backend/backend.h"
#include "backend/refcost.h"

/* An H100 SXM's, about: DGEMM 57 TFLOP/s (16.9 ms for the prefill pair),
 * 2.8 TB/s, 5 us a call, a self-check of 0.05 ns per element and k, and
 * int8 1500 TOP/s: the contraction rate at which the model's prefill pair
 * (every slice pair) lies just above both forms measured on an H100
 * (bench/RESULTS.md: one GEMM a level 9.54 to 9.79 ms, one a pair 11.1 to
 * 11.2 ms; the model 9.97 and 11.5). */
static const qc_refcost_rates h100 = {
    .dgemm_flops = 57e12, .i8_ops = 1500e12, .split_bw = 2.0e12, .bw = 2.8e12, .call_s = 5e-6, .check_s = 5e-11};

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
  /* the measured pair: DGEMM 16.9 ms, 4 slices (every pair, one GEMM a level) 9.54 to 9.79 ms: the model within
   * 10% of both, and not under the fast one's (it is an upper bound: the plan runs fewer pairs) */
  cr_expect(fabs((td + td2) * 1e3 - 16.9) < 0.1 * 16.9, "DGEMM pair predicted %.3f ms", (td + td2) * 1e3);
  cr_expect((tf + tf2) * 1e3 >= 9.79 && (tf + tf2) * 1e3 < 1.1 * 9.79, "fast pair predicted %.3f ms", (tf + tf2) * 1e3);
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
  const int64_t kc = qc_refcost_chunk(4);
  cr_expect(kc > 0 && kc % 16 == 0 && 4 * kc * 127 * 127 < 2147483648.0, "chunk %lld", (long long)kc);
}

Test(refcost, one_gemm_a_level_where_it_cannot_overflow) {
  /* ozaki.cu's condition: a level of 4 pairs is one GEMM up to a padded contraction of 131056 */
  cr_expect(qc_refcost_whole(4, 131056) && !qc_refcost_whole(4, 131072));
  cr_expect(qc_refcost_whole(1, 524272) && !qc_refcost_whole(1, 524288));
  /* past it, one GEMM a pair and chunk of 33280 (4 chunks: 40 GEMMs and 4 combines against 4 GEMMs and one):
   * on a small output the calls are the difference */
  const double t_whole = qc_refcost_fast_s(&h100, 256, 256, 131056, 4), t_pairs = qc_refcost_fast_s(&h100, 256, 256, 131072, 4);
  cr_expect(t_pairs - t_whole > 35 * h100.call_s, "one GEMM a level %.3f ms, a pair %.3f ms", t_whole * 1e3, t_pairs * 1e3);
  /* below it, a contraction twice as long costs less than twice (one level's call and output either way) */
  const int64_t k1 = qc_refcost_chunk(4);
  cr_expect(qc_refcost_fast_s(&h100, 256, 256, 2 * k1, 4) < 2 * qc_refcost_fast_s(&h100, 256, 256, k1, 4));
}

Test(refcost, a_short_contraction_with_a_large_output_takes_the_fast_reference) {
  /* d_weight of DeepSeek-V3's MLP down projection (K = 18432 in, N = 7168 out) at 1024 tokens: C[7168,
   * 18432], k 1024. One GEMM a pair (the old pricing) wrote the 528 MB int32 product 10 times and read it 6
   * (predicted 0.944 of DGEMM: DGEMM); one GEMM a level writes it 4 times */
  double td, tf;
  cr_expect_eq(pick_dw(&h100, 1024, 18432, 7168, &td, &tf), QC_REF_FAST_SLICES, "DGEMM %.3f ms, fast %.3f ms", td * 1e3, tf * 1e3);
  cr_expect(tf < 0.87 * td, "DGEMM %.3f ms, fast %.3f ms", td * 1e3, tf * 1e3);
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
