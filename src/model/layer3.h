/* layer3.h: layer 3's data model, shared by `qatcheck sft` and `qatcheck
 * step`: an arm's per-step log as a table, the controlled variables read
 * from an arm's config, and the results of both verbs (docs/layer3.md).
 *
 * A log is one row per optimizer step (ascending, distinct) and one column
 * per metric. A cell is absent or holds a double; a NaN or an Inf is data (a
 * non-finite event), never an absent cell. The readers of io/ fill a log
 * through the builder below in file order:
 *
 *   qc_l3_log_row(l, step);             a record at `step` begins
 *   qc_l3_log_set(l, "loss", 4, 2.31);  one of its values
 *   ...
 *   qc_l3_log_finish(l);                rows sorted, same steps merged
 *
 * A record at the step of the row before it adds to that row; a value set
 * twice for one (step, metric) keeps the last, and counts as a duplicate
 * when the two differ (a repeat of the same value, as the epoch in the
 * train and eval entries of a trainer_state.json, is not). */
#ifndef QC_LAYER3_H
#define QC_LAYER3_H

#include <stddef.h>
#include <stdint.h>

#include "model/check.h"

#define QC_L3_NAME 128  /* metric, tag, arm and config key names */
#define QC_L3_PATH 1024
#define QC_L3_MAXARMS 8

/* ---- per-step logs ----------------------------------------------------------- */

typedef struct qc_l3_col {
  char name[QC_L3_NAME];
  double *v;       /* [cap] the value at row i */
  uint8_t *has;    /* [cap] 1 when row i holds the metric */
  double roundoff; /* the coarsest unit roundoff of its stored values (a TensorBoard float32: 2^-24); 0: exact or float64 text */
} qc_l3_col;

typedef struct qc_l3_log {
  char path[QC_L3_PATH];
  char format[24];           /* "jsonl", "csv", "tfevents", "megatron", "hf_trainer_state" */
  int64_t n, cap;            /* rows */
  int64_t *step;             /* [n] ascending and distinct after qc_l3_log_finish */
  int ncol, capcol;
  qc_l3_col *col;
  /* duplicates: values set twice for one (step, metric), records that did
   * so, and the first such step */
  int64_t dup_values, dup_records, first_dup_step;
  /* the step: the case's step key when it names one (step_want; "" reads
   * the known keys, io/l3log.h), and the key the steps came from */
  int64_t *dup_steps;        /* the steps re-logged with a different value, ascending, distinct (after finish) */
  int64_t ndup_steps, capdup;
  char step_want[QC_L3_NAME];
  char step_key[QC_L3_NAME];
  int64_t placeholders;      /* Megatron "nan" placeholders read as absent values */
  int nskipped;              /* top-level scalars that are no metric (Megatron's iteration_timing_avg) */
  /* builder state */
  int hint;                  /* the column the next key probably names */
  int unsorted;              /* a row was started below the one before it */
  int rec_dup;               /* the current record overwrote a value */
  double set_roundoff;       /* the unit roundoff of the value qc_l3_log_set stores next (a reader's stored type; 0: exact) */
} qc_l3_log;

/* Start a record at `step`: a new row, or the last row when it has the same
 * step. QC_OK or QC_ESYS. */
int qc_l3_log_row(qc_l3_log *l, int64_t step);
/* Set metric name[0..len) of the current row (a column is made on first
 * use). Needs a row. QC_OK, QC_EINPUT (no row, a name too long) or QC_ESYS. */
int qc_l3_log_set(qc_l3_log *l, const char *name, size_t len, double v);
/* Sort the rows by step (stable) and merge rows of equal steps, the later
 * value winning; count the duplicates. QC_OK or QC_ESYS. */
int qc_l3_log_finish(qc_l3_log *l);
/* 1 when `step` was re-logged with a different value (a duplicate), after
 * qc_l3_log_finish. */
int qc_l3_log_is_dup(const qc_l3_log *l, int64_t step);
/* Index of column `name`, or -1. */
int qc_l3_log_col(const qc_l3_log *l, const char *name);
/* Rename column `from` to `to` (a case's tag mapping). QC_OK when done or
 * `from` is absent (*found 0); QC_EINPUT when `to` exists already. */
int qc_l3_log_rename(qc_l3_log *l, const char *from, const char *to, int *found);
void qc_l3_log_free(qc_l3_log *l);

/* ---- per-arm configs ---------------------------------------------------------- */

/* The controlled variables of the method, in the order the config-diff table
 * lists them; QC_L3_NCONTROLLED names. */
#define QC_L3_NCONTROLLED 16
extern const char *const qc_l3_controlled[QC_L3_NCONTROLLED];

/* One key's value in one arm's config: canonical JSON text (objects with
 * sorted keys, numbers as %.17g), so two values are equal when their texts
 * are. */
typedef struct qc_l3_cfgval {
  char key[QC_L3_NAME];      /* canonical key */
  char path[QC_L3_NAME];     /* where it was looked up ("optimizer.lr") */
  int present;
  char *json;                /* malloc'd; NULL when absent */
} qc_l3_cfgval;

typedef struct qc_l3_config {
  char path[QC_L3_PATH];
  int n;
  qc_l3_cfgval *v;           /* [n] */
} qc_l3_config;

void qc_l3_config_free(qc_l3_config *c);
/* The value of key `key`, or NULL when the key is not among c's. */
const qc_l3_cfgval *qc_l3_config_get(const qc_l3_config *c, const char *key);

/* One row of the config-diff table: a key's value in each arm (canonical
 * JSON; NULL when the arm's config lacks it or the arm has no config). */
typedef struct qc_sft_cfgrow {
  char key[QC_L3_NAME];
  int controlled;            /* one of qc_l3_controlled */
  const char *val[QC_L3_MAXARMS];
  int differs;               /* two arms' values differ (absent vs present included) */
  int expected;              /* declared in expected_differences */
  const char *reason;        /* its reason (NULL when not expected) */
} qc_sft_cfgrow;

/* ---- sft results ------------------------------------------------------------------ */

enum { QC_L3_PASS = 0, QC_L3_FAIL = 1, QC_L3_INCONCLUSIVE = 2 };
typedef enum { QC_LOC_NONE = 0, QC_LOC_FORWARD, QC_LOC_BACKWARD, QC_LOC_LATE } qc_l3_loc;

const char *qc_l3_verdict_name(int v);     /* "pass", "fail", "inconclusive" */
const char *qc_l3_pair_verdict_name(int v); /* "pass", "deviates", "inconclusive" */
const char *qc_l3_loc_name(qc_l3_loc l);   /* NULL, "forward", "backward", "late" */
/* What to check for a localization, in the method's words. */
const char *qc_l3_loc_advice(qc_l3_loc l);

/* One check (pair, metric, window, bounds) judged. The aligned points are
 * kept for the plots: x (the case's axis), step, a's and b's values, and
 * the pointwise band around b (lo, hi; NaN where none). */
typedef struct qc_sft_check_res {
  int verdict;               /* QC_L3_PASS / FAIL / INCONCLUSIVE */
  char why[512];             /* the failed bound or the reason it cannot be judged */
  char bound[24];            /* the bound that failed first ("pointwise_rel", ...) */
  int has_fail;
  double fail_x;             /* first x where a bound failed */
  int64_t fail_step;
  int64_t npoints;           /* aligned points judged */
  double mean_diff;          /* mean of a - b over the points */
  double max_abs;            /* max |a - b| */
  double max_rel;            /* max |a - b| / |b| */
  double cum_mean_end;       /* the cumulative mean difference at the window's end */
  int has_equiv;
  double eq_mean, eq_lo, eq_hi; /* the mean difference and its 1 - 2 alpha bootstrap interval */
  int eq_block;              /* the block length used */
  int nonfinite;             /* non-finite values in either arm over the window */
  /* the onset of a failure: where the difference a - b began to change
   * (a change point fitted to it up to the first failure), at or before
   * fail_x; kind "drift" (a ramp), "shift" (a step), or "none" (no
   * change found before the failure: the onset is the failure) */
  int has_onset;
  double onset_x;
  int64_t onset_step;
  char onset_kind[8];
  /* aligned series [npoints] (NULL when none) */
  double *x, *a, *b, *lo, *hi, *cum;
  int64_t *st;
} qc_sft_check_res;

typedef struct qc_sft_pair_res {
  int verdict;               /* QC_L3_PASS / FAIL (deviates) / INCONCLUSIVE */
  int has_first;             /* the first deviation */
  double first_x;
  int64_t first_step;
  int first_check;           /* index into checks */
  int has_onset;             /* the earliest onset among the failed checks (<= first_x) */
  double onset_x;
  int64_t onset_step;
  int onset_check;
  qc_l3_loc loc;             /* QC_LOC_NONE unless the pair deviates */
  int has_x0;
  int64_t x0, x1;            /* the first step both logs have, and the next (-1: none) */
  char reasons[2048];        /* pair-level reasons for inconclusive ("; "-separated) */
  char undeclared[512];      /* controlled variables that differ without a declared reason (", "-separated) */
  int ncheck;
  qc_sft_check_res *checks;  /* [ncheck], in the case's order */
} qc_sft_pair_res;

/* Free the pair's checks and their series. */
void qc_sft_pair_res_free(qc_sft_pair_res *p);

/* ---- the one-step update ------------------------------------------------------ */

typedef enum { QC_OPT_ADAMW = 0, QC_OPT_SGD = 1 } qc_opt_kind;

/* One parameter of one arm: float64 copies of what the dump holds (NULL
 * where absent). */
typedef struct qc_step_param {
  char name[QC_PATHLEN];
  int ndim;
  int64_t shape[QC_MAXDIM];
  int64_t n;
  double *before, *grad, *exp_avg, *exp_avg_sq, *momentum, *after, *after_master;
  char after_master_dtype[24];  /* the stored type of after_master ("bfloat16") */
  char after_dtype[24];         /* the stored type of after ("float32"): the derived update bound's precision */
} qc_step_param;

/* One arm group of a step dump. */
typedef struct qc_step_arm {
  char name[QC_L3_NAME];
  char file[QC_L3_PATH];
  qc_opt_kind opt;
  double lr, beta1, beta2, eps, weight_decay, max_grad_norm, grad_scale, momentum;
  int64_t step;              /* the optimizer's count before this step */
  int nfrozen;
  char (*frozen)[QC_PATHLEN];
  int nparam;
  qc_step_param *params;     /* from before/, in name order */
  int nstray;                /* gradients without a parameter (grad/ names not in before/) */
  char (*stray)[QC_PATHLEN];
} qc_step_arm;

void qc_step_arm_free(qc_step_arm *a);
/* 1 when `name` is in the arm's frozen list. */
int qc_step_arm_frozen(const qc_step_arm *a, const char *name);

typedef enum { QC_SK_UPDATE = 0, QC_SK_GRAD_PAIR, QC_SK_UPDATE_PAIR, QC_SK_FROZEN, QC_SK_MISSING, QC_SK_MASTER } qc_step_kind;
const char *qc_step_kind_name(qc_step_kind k);

/* One judged (or reported) comparison of `step`. */
typedef struct qc_step_check {
  char arm[2 * QC_L3_NAME + 2];   /* "under_test", or "under_test~gradient_reference" */
  char param[QC_PATHLEN];
  qc_step_kind kind;
  int judged;                /* a tolerance was declared or derived (updates); frozen, missing and master are always judged */
  int verdict;               /* QC_V_PASS / QC_V_FAIL (unjudged: PASS) */
  int has_metrics;
  qc_metrics m;
  int has_tol;
  qc_tol tol;
  double fit_scale;          /* update checks: the gradient factor that best explains the trainer's update (NAN: none) */
  char why[512];
} qc_step_check;

/* Per arm: the global gradient norm and clip coefficient, recomputed and as
 * implied by the trainer's update (has_implied 0 where it cannot be
 * inferred, with the reason). */
typedef struct qc_step_norms {
  char arm[QC_L3_NAME];
  double grad_norm, clip_coef;
  int has_implied;
  double implied_clip_coef, implied_grad_norm; /* implied_grad_norm NAN when only the factor is known */
  char implied_why[256];
} qc_step_norms;

typedef struct qc_step_res {
  int n, cap;
  qc_step_check *v;
  int nnorms;
  qc_step_norms norms[8];
  char localization[24];     /* "gradients", "update", or "" */
  char loc_text[512];
} qc_step_res;

int qc_step_res_add(qc_step_res *r, const qc_step_check *c);
void qc_step_res_free(qc_step_res *r);
/* 0 every judged check passed (and at least one was judged), 1 one failed, 2 none judged. */
int qc_step_res_verdict(const qc_step_res *r);

#endif
