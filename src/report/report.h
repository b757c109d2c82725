/* report.h: the views of a run's results. Every verb's reports are
 * rendered here from the result types of model/ (checks, layer-2 rows, fd
 * projections, deployed-byte comparisons, derived tolerances): the JSON of
 * the interfaces doc, JUnit XML, Markdown, and the stdout table.
 *
 * A run's reports are written all or none: the writers render into memory
 * (qc_report_out), then qc_report_commit writes every temporary file before
 * it renames any of them over the requested paths. */
#ifndef QC_REPORT_H
#define QC_REPORT_H

#include <stddef.h>

#include "model/check.h"
#include "model/deployed.h"
#include "model/fdcheck.h"
#include "model/layer2.h"
#include "model/tol.h"
#include "report/sbuf.h"

/* ---- the reports of one run ------------------------------------------------ */

enum { QC_REP_JSON = 0, QC_REP_JUNIT, QC_REP_MARKDOWN, QC_REP_KINDS };

typedef struct qc_report_out {
  const char *path[QC_REP_KINDS]; /* the requested paths (NULL: not asked) */
  qc_sbuf doc[QC_REP_KINDS];      /* their rendered texts */
} qc_report_out;

/* Set the requested paths (any may be NULL). */
void qc_report_out_init(qc_report_out *o, const char *json, const char *junit, const char *markdown);
/* 1 when report `kind` was asked for. */
int qc_report_wants(const qc_report_out *o, int kind);
/* Write every rendered report: a temporary file beside each path, all of
 * them written and fsync'd before the first rename. On any failure no
 * temporary is left and no requested path holds a report of this run or an
 * older one (each is removed), and the error names the path. */
int qc_report_commit(qc_report_out *o);
void qc_report_out_free(qc_report_out *o);

/* Write data to path whole or not at all: a temporary file beside it,
 * fsync'd, then renamed over path. */
int qc_write_atomic(const char *path, const char *data, size_t n);

/* A new JSON object holding the envelope (qatcheck_report, tool_version,
 * verb, verdict: 0 "pass", 1 "fail"), NULL out of memory; and its
 * rendering, newline-terminated, into out (root is deleted). */
struct cJSON;
struct cJSON *qc_report_envelope(const char *verb, int verdict);
int qc_report_json_render(struct cJSON *root, qc_sbuf *out);

/* ---- vjp: layer 1 (json.c, text.c) ------------------------------------------ */

/* What the report envelope says about the run. */
typedef struct qc_report_info {
  const char *verb;          /* "vjp" */
  const char *case_name, *case_path, *case_sha256;
  const char *device;        /* "cpu" */
  const char *profile;
  const char *warnings;      /* NULL, or lines ("...\n" each) every report records (weak tolerances) */
} qc_report_info;

/* Render the asked reports of a vjp run: JSON (one check per module, dY and
 * tensor), JUnit (one testcase per check, suite the module), Markdown. */
int qc_report_vjp(qc_report_out *o, const qc_report_info *info, const qc_results *r);
int qc_report_json(qc_sbuf *out, const qc_report_info *info, const qc_results *r);
int qc_report_junit(qc_sbuf *out, const qc_report_info *info, const qc_results *r);
int qc_report_markdown(qc_sbuf *out, const qc_report_info *info, const qc_results *r);
/* The next line of a "...\n"-separated text (info->warnings) into line
 * (cut at n - 1 characters); *p advances. 0 at the end. */
int qc_report_line(const char **p, char *line, size_t n);
/* The readable table on stdout: module, dY, tensor, rel-L2, cosine, norm
 * ratio, verdict, why; then the verdict line. */
void qc_report_table(const qc_report_info *info, const qc_results *r);

/* ---- contract: layer 2 (contract.c) ------------------------------------------ */

typedef struct qc_contract_info {
  const char *dump, *device, *profile, *modules;
  const char *wlist, *alist;   /* the formats as given */
  const qc_sweep_opts *o;
  int fails, outliers;
} qc_contract_info;

/* Render the asked reports: JSON (rows, classes, options, timing), JUnit
 * (one testcase per row, suite the class), Markdown (class table,
 * outliers, failed rows, every row). */
int qc_report_contract(qc_report_out *o, const qc_contract_info *ri, const qc_sweep *s);
/* The class table, failed rows and outliers on stdout. */
void qc_report_contract_table(const qc_contract_info *ri, const qc_sweep *s);
/* The outlier rule in words (model/layer2.h's QC_OUTLIER_*). */
const char *qc_report_outlier_rule(void);

/* ---- fd: finite differences (fd.c) --------------------------------------------- */

typedef struct qc_fd_info {
  const char *cls, *module, *shape, *values;
  const qc_fd_opts *o;
  const qc_fd_row *rows;
  int n, bad;
} qc_fd_info;

int qc_report_fd(qc_report_out *o, const qc_fd_info *fi);
void qc_report_fd_table(const qc_fd_info *fi);

/* ---- quant: deployed bytes (quant.c) ----------------------------------------- */

typedef struct qc_quant_info {
  const char *dump, *module, *format;
  int identify;                /* every profile tried */
  const qc_quant_cmp *c;
  int n, any, verdict;
} qc_quant_info;

int qc_report_quant(qc_report_out *o, const qc_quant_info *qi);
void qc_report_quant_table(const qc_quant_info *qi);

/* ---- tol: derived tolerances (tol.c) ----------------------------------------- */

typedef struct qc_tol_info {
  const char *tensor, *command, *reasoning;
  const qc_tol_spec *s;
  const qc_tol_terms *t;
} qc_tol_info;

/* The case-file member {"<tensor>": {...bounds, "reasoning"}} as JSON text
 * (malloc'd), NULL out of memory. */
char *qc_report_tol_member(const qc_tol_info *ti);
int qc_report_tol(qc_report_out *o, const qc_tol_info *ti);

#endif
