/* l3report.h: the reports of layer 3's verbs (docs/layer3.md):
 * `qatcheck sft` (JSON "verb": "sft", JUnit one testcase per pair and
 * metric, Markdown with the config-diff table, the three-arm table and one
 * SVG plot per judged metric written beside it) and `qatcheck step` (JSON
 * "verb": "step" with its checks and norms, JUnit, Markdown), and their
 * console tables. Rendered from model types into a qc_report_out. */
#ifndef QC_L3REPORT_H
#define QC_L3REPORT_H

#include "model/l3case.h"
#include "model/layer3.h"
#include "report/report.h"

/* What an sft run hands its reports. */
typedef struct qc_sft_view {
  const qc_sft_case *cs;
  const qc_l3_log *logs;          /* [cs->narm], tags mapped */
  const int *has_cfg;             /* [cs->narm] */
  const qc_sft_cfgrow *rows;
  int nrow;
  const qc_sft_pair_res *pairs;   /* [cs->npair] */
  const char *missing_arms;       /* the method's arms the case lacks, ", "-separated ("" none) */
  int verdict;                    /* 0 pass, 1 not */
  double t_read, t_judge;
} qc_sft_view;

/* Render the asked reports; with --markdown, the plots are added to o as
 * files beside it (<markdown stem>.<n>.<metric>.svg). */
int qc_report_sft(qc_report_out *o, const qc_sft_view *v);
void qc_report_sft_table(const qc_sft_view *v);
/* The Markdown report and its plots (sft_md.c). */
int qc_report_sft_markdown(qc_report_out *o, const qc_sft_view *v);
/* The mean of metric m of log l over [w0, w1] on the case's axis, and its
 * last value there (NAN when none; sft_md.c, used by both views). */
void qc_report_sft_summary(const qc_sft_view *v, int arm, const char *metric, double *mean, double *last);

typedef struct qc_step_view {
  const qc_step_case *cs;
  const qc_step_arm *arms;
  int narm;
  const qc_step_res *res;
  double t_read, t_judge;
} qc_step_view;

int qc_report_step(qc_report_out *o, const qc_step_view *v);
void qc_report_step_table(const qc_step_view *v);

#endif
