/* check.h: one judged comparison (module, dY, gradient tensor) and the
 * result list every report format is a view of. */
#ifndef QC_CHECK_H
#define QC_CHECK_H

#include <stdint.h>

#include "model/metrics.h"
#include "model/module.h"
#include "core/tensor.h"

typedef struct qc_check {
  char module[QC_PATHLEN];   /* "/model.layers.3.mlp.down_proj" */
  char cls[64];              /* "linear" */
  char dy[QC_NAMELEN];       /* "random", or a grad_out dataset name */
  char tensor[QC_NAMELEN];   /* "d_x", or "quantizer" */
  int ndim;
  int64_t shape[QC_MAXDIM];  /* the reference's shape */
  char cand_dtype[24];       /* the candidate's element type ("" when missing) */
  int has_metrics;
  qc_metrics m;
  int has_tol;
  qc_tol tol;
  int verdict;               /* QC_V_PASS / QC_V_FAIL */
  char why[512];
} qc_check;

typedef struct qc_results {
  int n, cap;
  qc_check *v;
} qc_results;

int qc_results_add(qc_results *r, const qc_check *c);
void qc_results_free(qc_results *r);
/* 0 pass (all passed and n > 0), 1 fail, 2 nothing checked. */
int qc_results_verdict(const qc_results *r);

/* What the report envelope says about the run. */
typedef struct qc_report_info {
  const char *verb;          /* "vjp" */
  const char *case_name, *case_path, *case_sha256;
  const char *device;        /* "cpu" */
  const char *profile;
} qc_report_info;

/* Write data to path whole or not at all: a temporary file beside it,
 * fsync'd, then renamed over path. */
int qc_write_atomic(const char *path, const char *data, size_t n);

int qc_report_json(const char *path, const qc_report_info *info, const qc_results *r);
/* For verbs with their own report body: a new object holding the envelope
 * (qatcheck_report, tool_version, verb, verdict: 0 "pass", 1 "fail"; a run
 * that exits 2 writes no report), NULL out of memory; and the writer that
 * prints it, newline-terminated, atomically to path and deletes it. */
struct cJSON;
struct cJSON *qc_report_envelope(const char *verb, int verdict);
int qc_report_json_write(const char *path, struct cJSON *root);
int qc_report_junit(const char *path, const qc_report_info *info, const qc_results *r);
int qc_report_markdown(const char *path, const qc_report_info *info, const qc_results *r);
/* The readable table on stdout: module, dY, tensor, rel-L2, cosine, norm
 * ratio, verdict, why; then the verdict line. */
void qc_report_table(const qc_report_info *info, const qc_results *r);

#endif
