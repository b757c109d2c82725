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
#include "model/modinfo.h"
#include "model/tol.h"
#include "report/prov.h"
#include "report/sbuf.h"

struct qc_gate;

/* ---- the reports of one run ------------------------------------------------ */

enum { QC_REP_JSON = 0, QC_REP_JUNIT, QC_REP_MARKDOWN, QC_REP_HTML, QC_REP_KINDS };

/* A file written with the reports (a plot beside a Markdown report). */
typedef struct qc_report_file {
  char *path;                     /* malloc'd */
  qc_sbuf doc;
} qc_report_file;

typedef struct qc_report_out {
  const char *path[QC_REP_KINDS]; /* the requested paths (NULL: not asked) */
  qc_sbuf doc[QC_REP_KINDS];      /* their rendered texts */
  int want_json;                  /* render the JSON without a path: a baseline compares it */
  int nextra, capextra;           /* more files, committed with the reports */
  qc_report_file *extra;
  qc_prov *prov;                  /* the provenance every report records (NULL: none) */
  struct qc_gate *gate;           /* the regression gate applied at the commit (NULL: none) */
} qc_report_out;

/* Set the requested paths (any may be NULL); no provenance, no gate. */
void qc_report_out_init(qc_report_out *o, const char *json, const char *junit, const char *markdown);
/* Hand o the run's provenance and regression gate (report/run.h's
 * qc_run_out does, for the run of `verb`): the reports record prov, and
 * with a baseline for the verb the JSON is rendered for the comparison. */
void qc_report_out_run(qc_report_out *o, const char *verb, qc_prov *prov, struct qc_gate *gate);
/* Set the HTML path (the `report` verb's audit document). */
void qc_report_out_html(qc_report_out *o, const char *html);
/* 1 when report `kind` is to be rendered: asked for, or (the JSON) needed
 * by the run's --baseline. */
int qc_report_wants(const qc_report_out *o, int kind);
/* Add a file to the same all-or-none commit (path copied; doc's text taken
 * over and doc cleared). QC_OK or QC_ESYS. */
int qc_report_add_file(qc_report_out *o, const char *path, qc_sbuf *doc);
/* Write every rendered report and added file: a temporary file (mkstemp)
 * beside each path,
 * all of them written and fsync'd before the first rename. With a
 * --baseline, the JSON is first compared with it and the regressions added
 * to each report (baseline.h). On failure no temporary is left, nothing is
 * renamed after the failure, and the error names the path; the run then
 * exits 2 and qc_run_end (run.h) replaces every requested path with its error
 * report. */
int qc_report_commit(qc_report_out *o);
void qc_report_out_free(qc_report_out *o);

/* The folder of a report path (malloc'd; "." for a bare name), NULL out of memory. */
char *qc_report_dir(const char *path);


/* The error report of a run that cannot be judged, at every path[k]
 * (QC_REP_KINDS of them, NULL: none) the run may write (run.h): JSON
 * {"verdict": "error", "error": ...} of the current error message, JUnit
 * with one <error> testcase, Markdown (with prov) and HTML saying so; a
 * path that cannot take it is removed if it holds a regular file. */
void qc_report_error_commit(const char *verb, const char *const *path, qc_prov *prov);

/* A new JSON object holding the envelope (qatcheck_report, tool_version,
 * source_commit, verb, verdict: 0 "pass", 1 "fail", 2 "error") and the run's provenance
 * prov (command_line, inputs; empty when NULL), NULL out of memory; and
 * its rendering, newline-terminated, into out (root is deleted). */
struct cJSON;
struct cJSON *qc_report_envelope(qc_prov *prov, const char *verb, int verdict);
int qc_report_json_render(struct cJSON *root, qc_sbuf *out);
/* The Markdown line naming the tool: "- qatcheck 0.1.0, source commit
 * `abc1234`" (qc_build_commit: the commit the binary was built from). */
void qc_report_tool_md(qc_sbuf *b);
/* "totals": {"checks", "passed", "failed", "errors"} on root. */
void qc_report_totals(struct cJSON *root, int checks, int failed, int errors);

/* The limits on a JSON report read back (`qatcheck report`, --baseline),
 * sized from what qatcheck writes: at most QC_REPORT_MAX_BYTES, the
 * largest text cJSON prints (its print buffer stops at INT_MAX bytes, so
 * no verb can write a larger report: a vjp report of a whole model, about
 * 6 KB a module, stays under it to some 350,000 modules), and at most one
 * JSON value per QC_REPORT_BYTES_PER_VALUE bytes of the file, never fewer
 * than QC_REPORT_MIN_VALUES (qatcheck's reports hold one per 16 to 33
 * bytes; a file of tiny values, which cJSON would turn into a tree 32
 * times its size, is refused before it is parsed). */
#define QC_REPORT_MAX_BYTES ((size_t)2147483647) /* INT_MAX */
#define QC_REPORT_BYTES_PER_VALUE 8
#define QC_REPORT_MIN_VALUES 4000000L

/* What a report's checks say (qc_report_rejudge). */
typedef struct qc_report_counts {
  int checks;                /* its checks (its "totals" when it holds no list of them) */
  int failed;                /* those whose word is not the pass word */
  int judged;                /* those that carry a verdict (a step check may be "unjudged") */
} qc_report_counts;

/* A report read back is evidence, not a verdict. QC_OK, with its counts,
 * when the parsed report r (of `path`; errors read "<what> 'path': ...",
 * one line naming the check) is one qatcheck could have written: its verb
 * is one of qatcheck's; its "verdict" and every check's word are exactly
 * the words qatcheck writes; every check that says pass and records its
 * metrics and bounds passes them again under qc_judge (model/check.h;
 * contract rows against the report's thresholds, quant --calibration rows
 * by their mismatching bytes), and one that records none is a comparison
 * bit for bit that has no metric (vjp's deployed bytes, step's frozen and
 * master checks); its "totals" agree with its checks; a "pass" verdict
 * has at least one judged check and no failed one. A check that says fail
 * stays failed whatever its metrics say: its verdict may rest on more
 * than they show (a missing tensor, a shape, bits that differ). Otherwise
 * QC_EINPUT. */
int qc_report_rejudge(const struct cJSON *r, const char *what, const char *path, qc_report_counts *out);

/* Read the JSON report at `path` (a regular file, or refused unopened: a
 * FIFO never blocks) whole into a malloc'd NUL-terminated *text of *n
 * bytes, within the limits above (the file is read a few MB at a time and
 * refused at the first byte that cannot be in JSON text or the first value
 * over the limit, so a sparse or binary file costs no more than that), then
 * parse it into *tree (NULL when the text is not a JSON object with a
 * string "verb" and "qatcheck_report" or "format_version": the caller says
 * what it is not) and re-judge it (qc_report_rejudge; its counts in
 * *counts when not NULL). tree may be NULL: the parse is then freed.
 * Errors read "<what> 'path': ...". */
int qc_report_read_json(const char *path, const char *what, char **text, size_t *n, struct cJSON **tree,
                        qc_report_counts *counts);
/* The same, keeping only the text (--baseline's reader parses it itself). */
int qc_report_read_text(const char *path, const char *what, char **text, size_t *n);
/* A declared tolerance as JSON: its bounds and reasoning. */
struct cJSON *qc_report_tol_json(const qc_tol *t);

/* ---- vjp: layer 1 (json.c, text.c) ------------------------------------------ */

/* What the report envelope says about the run. */
typedef struct qc_report_info {
  const char *verb;          /* "vjp" */
  const char *case_name, *case_path, *case_sha256;
  const char *device;        /* "cpu" */
  const char *profile;
  const char *warnings;      /* NULL, or lines ("...\n" each) every report records (weak tolerances) */
  const qc_modinfos *modules; /* NULL, or each module instance described (model/modinfo.h) */
} qc_report_info;

/* The JUnit name of check k: "<dY>/<tensor>", or "deployed_bytes/weight_q"
 * for the check of a module's deployed bytes. */
const char *qc_report_check_name(const qc_check *k, char *buf, int n);
/* The GEMM that made check k's reference, in a few words: "float64",
 * "ozaki_int8:4" (the fast reference, kept), "float64 (ozaki_int8:3 fell
 * back)" (its self-check failed: recomputed with DGEMM). */
const char *qc_report_ref_name(const qc_check *k, char *buf, int n);

/* Render the asked reports of a vjp run: JSON (one check per module, dY and
 * tensor), JUnit (one testcase per check, suite the module), Markdown. */
int qc_report_vjp(qc_report_out *o, const qc_report_info *info, const qc_results *r);
int qc_report_json(qc_sbuf *out, qc_prov *prov, const qc_report_info *info, const qc_results *r);
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

/* ---- fd: finite differences (fd.c) --------------------------------------------- */

typedef struct qc_fd_info {
  const char *cls, *module, *shape, *values;
  const qc_fd_opts *o;
  const qc_fd_row *rows;
  int n, bad;
  double seconds;              /* wall time of the projections */
} qc_fd_info;

int qc_report_fd(qc_report_out *o, const qc_fd_info *fi);
void qc_report_fd_table(const qc_fd_info *fi);

/* ---- quant: deployed bytes (quant.c) ----------------------------------------- */

typedef struct qc_quant_info {
  const char *dump, *module, *format;
  int identify;                /* every profile tried */
  const qc_quant_cmp *c;
  int n, any, verdict;
  double seconds;              /* wall time of the comparisons */
  const char *why;             /* --identify: the reproducing profiles, or the closest and what differs */
} qc_quant_info;

int qc_report_quant(qc_report_out *o, const qc_quant_info *qi);
void qc_report_quant_table(const qc_quant_info *qi);

/* `quant --calibration`: producer paths against qatcheck's quantizers. */
typedef struct qc_calib_info {
  const char *const *paths;
  int npaths;
  const char *device;
  const qc_calib_row *rows;
  int n, verdict;
} qc_calib_info;

int qc_report_calib(qc_report_out *o, const qc_calib_info *ci);
/* The table on stdout: one line per path (profile, format, values, records,
 * mismatching payload, scale and global-scale bytes), then the first
 * mismatch of each failing path. */
void qc_report_calib_table(const qc_calib_info *ci);

/* Many modules (quant_many.c): a deployed checkpoint against its master
 * (master set), or every module of a dump with deployed bytes. */
typedef struct qc_quant_many_info {
  const char *deployed;        /* the deployed checkpoint, or the dump */
  const char *master;          /* the master checkpoint; NULL for a dump */
  const qc_quant_rows *rows;
  int fails, verdict;
} qc_quant_many_info;

int qc_report_quant_many(qc_report_out *o, const qc_quant_many_info *qi);
void qc_report_quant_many_table(const qc_quant_many_info *qi);

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
/* `tol --dump F --module PATH` (tol_module.c): {"tolerances": {every
 * gradient's member}} as JSON text (malloc'd; NULL out of memory), and the
 * reports (JSON: dump, module, each derivation, the merged member). */
char *qc_report_tol_members(const qc_tol_info *ti, int n);
int qc_report_tol_module(qc_report_out *o, const qc_tol_info *ti, int n, const char *dump, const char *module);

#endif
