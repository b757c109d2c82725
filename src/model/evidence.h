/* evidence.h: what an audit document (`qatcheck report`) is assembled
 * from: the results of vjp, contract, sft and step as their JSON reports
 * hold them, read back into the model's types. Layer 1 comes back as checks
 * and module descriptions (check.h, modinfo.h), layer 2 as rows and class
 * summaries (layer2.h), layer 3 and the one-step update as the small types
 * below. The reader (report/audit_read.c) is tolerant: a field it does not
 * know is ignored, a field it misses is left at its default, so reports
 * of newer and older qatchecks, and of verbs still being written, mix. */
#ifndef QC_EVIDENCE_H
#define QC_EVIDENCE_H

#include "model/check.h"
#include "model/layer2.h"
#include "model/modinfo.h"

#define QC_EV_TEXT 256

/* One report read. */
typedef struct qc_ev_src {
  char path[1024];
  char verb[16];
  char verdict[16];          /* "pass", "fail", "error", ... as the report says */
  char title[QC_EV_TEXT];    /* the case's name, the dump, ... */
  char error[512];           /* an error report's message */
  char sha256[65];           /* of the report file */
  char commit[48];           /* the qatcheck source commit that wrote it ("" when the report names none) */
  int checks, failed;        /* what it judged */
  int judged;                /* its checks that carry a verdict (0: it judged nothing) */
} qc_ev_src;

/* Layer 1: one check (with the diagnosis of a failed check in c.diagnosis,
 * "" when the report has none; c.m.bias_z NaN when the report has none). */
typedef struct qc_ev_check {
  int src;
  qc_check c;
} qc_ev_check;

typedef struct qc_ev_mod {
  int src;
  qc_modinfo mi;
  char reference[QC_EV_TEXT];
} qc_ev_mod;

/* Layer 2: one contract report. */
typedef struct qc_ev_l2 {
  int src;
  qc_sweep s;                /* rows and classes as the report holds them */
  char formats[QC_EV_TEXT];  /* "weight: nvfp4, fp8_block128; activation: none" */
  char thresholds[QC_EV_TEXT];
  char outlier_rule[512];
} qc_ev_l2;

/* Layer 3: a curve of one arm (or of a pair's a and b) over x. */
typedef struct qc_ev_series {
  char label[64];
  int n;
  double *x, *y;
} qc_ev_series;

typedef struct qc_ev_sftcheck {
  char metric[64], verdict[16], bound[32], window[48];
  char why[QC_EV_TEXT];
  int has_fail;
  double fail_x, mean_diff, max_rel;
  int nser;
  qc_ev_series ser[4];       /* a, b, and the band's lo and hi when the report holds them */
} qc_ev_sftcheck;

typedef struct qc_ev_pair {
  char a[64], b[64], verdict[16], localization[16];
  int has_first;
  double first_x;
  char first_metric[64], first_bound[32];
  int n;
  qc_ev_sftcheck *m;
} qc_ev_pair;

typedef struct qc_ev_cfg {
  char key[64];
  char v[3][128];            /* under_test, gradient_reference, native_baseline ("" absent) */
  int differs, expected;
} qc_ev_cfg;

typedef struct qc_ev_sft {
  int src;
  char x[16];
  int has_window;
  double w0, w1;
  int ncfg, npair, ncurve;
  qc_ev_cfg *cfg;
  qc_ev_pair *pair;
  qc_ev_series *curve;       /* per arm and metric: label "metric: arm" */
} qc_ev_sft;

/* The one-step update: one check. */
typedef struct qc_ev_step {
  int src;
  char arm[130], param[QC_PATHLEN], kind[16], verdict[16], why[QC_EV_TEXT];
  int has_metrics;
  double rel_l2, cosine, norm_ratio, max_abs;
} qc_ev_step;

/* Everything read. */
typedef struct qc_evidence {
  int nsrc, nl1, nmod, nl2, nsft, nstep;
  qc_ev_src *src;
  qc_ev_check *l1;
  qc_ev_mod *mod;
  qc_ev_l2 *l2;
  qc_ev_sft *sft;
  qc_ev_step *step;
  char step_notes[1024];     /* grad_norm and clip_coef per arm, as the step reports give them */
} qc_evidence;

void qc_evidence_free(qc_evidence *e);

#endif
