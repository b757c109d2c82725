/* refcost.c: the cost model of --reference auto (refcost.h). A roofline per
 * call: max(arithmetic / rate, bytes moved / bandwidth) + a fixed cost. The
 * fast reference's calls are those of src/backend/cuda/ozaki.cu's
 * cu_ozaki_gemm: two splits, per contraction chunk S (S + 1) / 2 int8 GEMMs
 * (one per slice pair (t, u), t + u <= S + 1, the pairs of a level summed
 * into one int32 product with beta 1) and one combine, then the self-check. */
#include <math.h>

#include "backend/refcost.h"

static int64_t up16(int64_t v) { return (v + 15) & ~(int64_t)15; }
static double dmax(double a, double b) { return a > b ? a : b; }

double qc_refcost_dgemm_s(const qc_refcost_rates *r, int64_t m, int64_t n, int64_t k) {
  const double flops = 2.0 * (double)m * (double)n * (double)k;
  const double bytes = 8.0 * ((double)m * (double)k + (double)k * (double)n + (double)m * (double)n);
  return dmax(flops / r->dgemm_flops, bytes / r->bw) + r->call_s;
}

double qc_refcost_fast_s(const qc_refcost_rates *r, int64_t m, int64_t n, int64_t k, int S) {
  const double mp = (double)up16(m), np = (double)up16(n), kp = (double)up16(k);
  const int64_t kmax = qc_refcost_chunk(S);
  const double pairs = S * (S + 1) / 2.0;
  /* the splits: each float64 element read, S int8 digits written */
  double t = ((double)m * (double)k + (double)n * (double)k) * (8.0 + S) / r->split_bw + 2 * r->call_s;
  for (int64_t k0 = 0; k0 < up16(k); k0 += kmax) {
    const double kc = kp - (double)k0 < (double)kmax ? kp - (double)k0 : (double)kmax;
    const double ops = 2.0 * mp * np * kc;
    /* a level's first pair writes its int32 product, the others read and write it */
    t += S * (dmax(ops / r->i8_ops, 4.0 * mp * np / r->bw) + r->call_s);
    t += (pairs - S) * (dmax(ops / r->i8_ops, 8.0 * mp * np / r->bw) + r->call_s);
    /* the combine: the S int32 levels read, C written (and read, after the first chunk) */
    t += (4.0 * S * mp * np + (k0 ? 16.0 : 8.0) * (double)m * (double)n) / r->bw + r->call_s;
  }
  const double ns = (double)m * (double)n < QC_REFCOST_CHECK_NS ? (double)m * (double)n : QC_REFCOST_CHECK_NS;
  return t + ns * (double)k * r->check_s + r->call_s;
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
