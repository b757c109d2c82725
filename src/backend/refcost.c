/* refcost.c: the cost model of --reference auto (refcost.h). A roofline per
 * call: max(arithmetic / rate, bytes moved / bandwidth) + a fixed cost (an
 * int8 GEMM's int32 output added after the max: i8_gemm_s). The
 * fast reference's calls are those of src/backend/cuda/ozaki.cu's
 * cu_ref_gemm with the full scheme's pairs (t, u), t + u <= S + 1: two
 * splits; the plan's evidence kernel on the self-check's sample (every
 * pair's product and the exact values), its download; per level L = 2..S +
 * 1 (L - 1 pairs, one contiguous run of slices) one int8 GEMM of
 * contraction (L - 1) k writing its int32 product once, where that cannot
 * overflow (qc_refcost_whole), else per contraction chunk one GEMM a pair
 * (a level's first writes the int32 product, the others read and write it
 * with beta 1); one combine per chunk; the self-check from the evidence's
 * exact values (two small kernels). */
#include <math.h>

#include "backend/refcost.h"

static int64_t up16(int64_t v) { return (v + 15) & ~(int64_t)15; }
static double dmax(double a, double b) { return a > b ? a : b; }

double qc_refcost_dgemm_s(const qc_refcost_rates *r, int64_t m, int64_t n, int64_t k) {
  const double flops = 2.0 * (double)m * (double)n * (double)k;
  const double bytes = 8.0 * ((double)m * (double)k + (double)k * (double)n + (double)m * (double)n);
  return dmax(flops / r->dgemm_flops, bytes / r->bw) + r->call_s;
}

/* One int8 GEMM C[mp, np] (int32) over contraction kc: the contraction
 * against its operands' reads, then the int32 product written (and read
 * first when `acc`, beta 1) by the epilogue, after the contraction: not
 * hidden behind it. (Measured on an H100 at the prefill shape, bench/
 * RESULTS.md: every pair as one GEMM a pair 11.1 to 11.2 ms, as one GEMM a
 * level 9.5 to 9.8 ms, the same operations; the difference is the per-pair
 * form's extra int32 traffic, which a max() with the contraction hides.) */
static double i8_gemm_s(const qc_refcost_rates *r, double mp, double np, double kc, int acc) {
  const double ops = 2.0 * mp * np * kc, bytes = (mp + np) * kc;
  return dmax(ops / r->i8_ops, bytes / r->bw) + (acc ? 8.0 : 4.0) * mp * np / r->bw + r->call_s;
}

/* The combine: the S int32 levels read, C written (and read when `acc`, after the first chunk). */
static double combine_s(const qc_refcost_rates *r, int64_t m, int64_t n, double mp, double np, int S, int acc) {
  return (4.0 * S * mp * np + (acc ? 16.0 : 8.0) * (double)m * (double)n) / r->bw + r->call_s;
}

double qc_refcost_fast_s(const qc_refcost_rates *r, int64_t m, int64_t n, int64_t k, int S) {
  const double mp = (double)up16(m), np = (double)up16(n), kp = (double)up16(k);
  const double ns = (double)m * (double)n < QC_REFCOST_CHECK_NS ? (double)m * (double)n : QC_REFCOST_CHECK_NS;
  /* the splits: each float64 element read, S int8 digits written */
  double t = ((double)m * (double)k + (double)n * (double)k) * (8.0 + S) / r->split_bw + 2 * r->call_s;
  /* the plan's evidence: the sample's exact values (and its pairs' products), its download */
  t += ns * (double)k * r->check_s + 2 * r->call_s;
  if (qc_refcost_whole(S, up16(k))) {
    for (int lv = 2; lv <= S + 1; lv++) t += i8_gemm_s(r, mp, np, (lv - 1) * kp, 0);
    t += combine_s(r, m, n, mp, np, S, 0);
  } else {
    const int64_t kmax = qc_refcost_chunk(S);
    for (int64_t k0 = 0; k0 < up16(k); k0 += kmax) {
      const double kc = kp - (double)k0 < (double)kmax ? kp - (double)k0 : (double)kmax;
      for (int lv = 2; lv <= S + 1; lv++) t += i8_gemm_s(r, mp, np, kc, 0) + (lv - 2) * i8_gemm_s(r, mp, np, kc, 1);
      t += combine_s(r, m, n, mp, np, S, k0 > 0);
    }
  }
  /* the self-check from the evidence's exact values: a kernel over the sample and its reduction */
  return t + 2 * r->call_s;
}

static int usable(double v) { return isfinite(v) && v > 0; }

int qc_refcost_ok(const qc_refcost_rates *r) {
  return r && usable(r->dgemm_flops) && usable(r->i8_ops) && usable(r->split_bw) && usable(r->bw) && isfinite(r->call_s) &&
         r->call_s >= 0 && isfinite(r->check_s) && r->check_s >= 0;
}

int qc_refcost_pick(const qc_refcost_rates *r, int64_t m, int64_t n, int64_t k, int S, double *t_dgemm, double *t_fast) {
  double td = NAN, tf = NAN;
  const int ok = qc_refcost_ok(r) && m > 0 && n > 0 && k > 0 && S > 0;
  if (ok) {
    td = qc_refcost_dgemm_s(r, m, n, k);
    tf = qc_refcost_fast_s(r, m, n, k, S);
  }
  if (t_dgemm) *t_dgemm = td;
  if (t_fast) *t_fast = tf;
  return ok && tf <= QC_REFCOST_MARGIN * td ? S : 0;
}
