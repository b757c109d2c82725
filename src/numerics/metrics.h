/* metrics.h: the comparison of one candidate gradient g with its reference r,
 * computed in one float64 pass. Numerics, not model: every backend computes
 * these sums (the CUDA one on the device); the verdict on them is
 * model/check.h's qc_judge. */
#ifndef QC_METRICS_H
#define QC_METRICS_H

#include <stdint.h>

typedef struct qc_metrics {
  double max_abs;        /* max |g - r| over finite pairs */
  int64_t worst;         /* flat index of max_abs (-1 if none) */
  double rel_l2;         /* ||g - r|| / max(||r||, eps) */
  double norm_ratio;     /* ||g|| / ||r|| (NAN when ||r|| = 0) */
  double cosine;         /* <g, r> / (||g|| ||r||) */
  int cosine_null;       /* 1 when a norm is zero: cosine undefined */
  double sqnr_db;        /* 10 log10(||r||^2 / ||g - r||^2); +INF when equal */
  int64_t nonfinite;     /* non-finite values in g */
  int64_t ref_nonfinite; /* non-finite values in r: the run cannot be judged */
  double norm_g, norm_r, norm_diff;
  double noise_multiple; /* error / noise floor (NAN when not computed) */
  double noise_floor;    /* rel-L2 of the reference rounded to the candidate dtype */
} qc_metrics;

#define QC_EPS_NORM 1e-30

/* Compute metrics of g against r (n elements each), float64 throughout. */
void qc_metrics_compute(const double *g, const double *r, int64_t n, qc_metrics *out);
/* The same metrics with the sums formed over fixed chunks of 65536 elements
 * on qc_par_for's threads and added in chunk order: the same result for any
 * thread count; within rounding (a few ulps) of qc_metrics_compute. */
void qc_metrics_compute_par(const double *g, const double *r, int64_t n, qc_metrics *m);
/* Fill out->rel_l2-style fields from accumulated sums (for backends that
 * accumulate in parts): ss_g = sum g^2, ss_r = sum r^2, ss_d = sum (g-r)^2,
 * dot = sum g r. */
void qc_metrics_finish(double ss_g, double ss_r, double ss_d, double dot, qc_metrics *out);

#endif
