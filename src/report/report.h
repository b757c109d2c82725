/* report.h: the views of a run's results: JSON (the report envelope of
 * the interfaces doc), JUnit XML, Markdown and the stdout table. Every
 * writer takes the results as model/ defines them and writes its file whole
 * (qc_write_atomic) or not at all. */
#ifndef QC_REPORT_H
#define QC_REPORT_H

#include <stddef.h>

#include "model/check.h"

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
