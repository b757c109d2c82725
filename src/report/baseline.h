/* baseline.h: the regression gate. A run's JSON report is compared with a
 * baseline report of the same verb (`--baseline OLD.json`, typically the
 * last accepted main's): each check is matched by its identity, and a
 * check is a regression when
 *
 *   - it vanished (in the baseline, not in this run),
 *   - it fails now and did not (or is new and fails),
 *   - its metric rose beyond its noise model: now > F x before + slack, with
 *     F = --regression-factor (default 1.1) and the slack a per-metric
 *     absolute floor (the noise multiple: 0.05; rel_l2: 1e-9), so that an
 *     error at the noise floor may jitter but not grow, or
 *   - it became an outlier (layer 2).
 *
 * What a check is, per verb, is one row of the table in baseline.c: where
 * the checks are, their identity fields, what "passed" means, the metrics
 * judged (the first one both reports hold) and a flag that must not turn
 * on. Adding a verb is adding a row. */
#ifndef QC_REPORT_BASELINE_H
#define QC_REPORT_BASELINE_H

#include "report/report.h"
#include "report/sbuf.h"

struct cJSON;

/* A run's regression gate (run.h keeps one; qc_report_out's gate points to
 * it): the baselines given (--baseline: parsed, owned here), the rule
 * (--fail-on regression, --regression-factor) and the regressions found. */
typedef struct qc_gate {
  int nbase;
  struct cJSON *base[16];
  char *base_path[16];
  int fail_on;        /* --fail-on regression: regressions exit 1 */
  double factor;      /* --regression-factor (1.1 unless given) */
  int nreg;           /* the regressions found (qc_baseline_record) */
  qc_sbuf regs;       /* their lines for the console */
} qc_gate;

typedef enum { QC_REG_VANISHED = 0, QC_REG_FAILURE, QC_REG_RISE, QC_REG_FLAG } qc_reg_kind;

typedef struct qc_regress {
  qc_reg_kind kind;
  char id[512];      /* "module=/x dy=dy tensor=d_x" */
  char what[256];    /* "noise_multiple 1 -> 1.54 (> 1.1 x 1 + 0.05)" */
} qc_regress;

typedef struct qc_regress_list {
  int n, cap;
  qc_regress *v;
  int matched, added, vanished;  /* checks found in both, only now, only before */
  int supported;                 /* the verb has a row */
} qc_regress_list;

/* 1 when `verb` has a row (its reports can be compared). */
int qc_baseline_known(const char *verb);
/* 1 when gate g (NULL: none) has a baseline and `verb` has a row (its JSON
 * is then rendered for the comparison even without --json). */
int qc_baseline_applies(const qc_gate *g, const char *verb);
/* Compare report `cur` with `old` (same verb) under factor F into out.
 * QC_OK, QC_EINPUT (a verb without a row, or reports of two verbs), QC_ESYS. */
int qc_baseline_compare(const struct cJSON *old, const struct cJSON *cur, double factor, qc_regress_list *out);
void qc_regress_free(qc_regress_list *l);
/* The rule in words, for the reports. */
const char *qc_baseline_rule(double factor);
/* The run's comparison (qc_report_commit): compare o's JSON with the
 * baseline of o's gate, add "baseline" to the JSON, a section to the
 * Markdown, and (with --fail-on regression) a "baseline" testsuite to the
 * JUnit, one failed testcase per regression; record them with the gate. */
int qc_baseline_apply(qc_report_out *o);
/* Add n regressions found to gate g (they decide the exit status at the
 * run's end with --fail-on regression) and keep their lines (summary, may
 * be NULL) for the console summary. */
void qc_baseline_record(qc_gate *g, int n, const char *summary);
/* Free the baselines and lines of g; g is empty afterwards. */
void qc_gate_free(qc_gate *g);

#endif
