/* sft.h: layer 3, the three-arm proxy-SFT comparison (docs/layer3.md):
 * the arms' logs and configs loaded, the config-diff table of the
 * controlled variables, each declared pair of arms judged check by check
 * (pointwise, cumulative mean, equivalence, noise band), its verdict
 * (pass, deviates, inconclusive), first deviation and localization
 * (forward, backward, late). */
#ifndef QC_ENGINE_SFT_H
#define QC_ENGINE_SFT_H

#include "model/l3case.h"
#include "model/layer3.h"

typedef struct qc_sft_run {
  const qc_sft_case *cs;
  int keep_series;                  /* keep the aligned series (for plots) */
  qc_l3_log logs[QC_L3_MAXARMS];    /* per arm, tags mapped to canonical names */
  int has_cfg[QC_L3_MAXARMS];
  qc_l3_config cfg[QC_L3_MAXARMS];
  int nrow;
  qc_sft_cfgrow *rows;              /* the config-diff table */
  qc_sft_pair_res pairs[QC_L3_MAXPAIRS];
  char missing_arms[64];            /* the method's arms the case lacks, ", "-separated ("" none) */
  int verdict;                      /* 0 every pair passed, 1 one deviates or is inconclusive */
  double t_read, t_judge;           /* seconds */
} qc_sft_run;

/* Read every arm's log and config and build the config-diff table. QC_OK,
 * or QC_EINPUT / QC_ESYS (an unreadable log or config: the run cannot be
 * judged). */
int qc_sft_load(qc_sft_run *r, const qc_sft_case *cs);
/* Judge every pair (noise logs are read here). QC_OK with r->verdict set,
 * or QC_EINPUT / QC_ESYS. */
int qc_sft_judge(qc_sft_run *r);
void qc_sft_run_free(qc_sft_run *r);

/* ---- the pieces (sft_check.c), exposed for tests -------------------------------- */

/* Judge one check of a pair on the logs la and lb (noise: the check's
 * noise logs, loaded, or NULL). */
int qc_sft_judge_check(const qc_sft_case *cs, const qc_sft_check *k, const qc_l3_log *la, const qc_l3_log *lb, const qc_l3_log *noise,
                 int keep_series, qc_sft_check_res *res);

/* The 1 - 2 alpha percentile interval of the mean of d[n] under a circular
 * moving-block bootstrap (blocks of `block` points, B resamples, seeded):
 * the same seed gives the same interval. */
int qc_sft_bootstrap(const double *d, int64_t n, int block, int B, uint64_t seed, double alpha, double *lo, double *hi);

/* Where the difference series d[m] (at ascending x[m], the points of a
 * check up to and including its first failure) began to change: the best
 * of two one-change-point least-squares fits, a drift (flat, then a ramp
 * from x[k]: a hinge, the CUSUM of a trend) and a shift (one level, then
 * another from x[k]: the CUSUM of the mean), kept when it beats no change
 * by BIC (m ln(SSE0 / SSE1) > 3 ln m). *k is the onset's index, kind
 * "drift", "shift", or "none" (no change found: *k = m - 1, the failure
 * itself). QC_OK or QC_ESYS. */
int qc_sft_onset(const double *x, const double *d, int64_t m, int64_t *k, char kind[8]);

/* s, which filled its buffer of n bytes (a message cut by snprintf), cut
 * instead at a word boundary and marked " ...": a message is never cut
 * mid-word. Unchanged when it did not fill the buffer. */
void qc_sft_clip_words(char *s, size_t n);

#endif
