/* run.h: what one run of qatcheck knows about itself, for every report it
 * writes (process-wide; main.c begins and ends the run):
 *
 * - the command line, as given;
 * - the report paths asked for (--json, --junit, --markdown, --html), found
 *   by scanning the verb's arguments before the verb parses them, so that a
 *   run stopped by a bad option still replaces them with its error report.
 *   Each is checked before any work: a regular file or absent (a device, a
 *   FIFO, a directory or a symbolic link is refused), in an existing
 *   folder qatcheck may write to, no two reports at one path, and never an
 *   input of the run;
 * - its input files (path, size, SHA-256: hashed on a thread beside the
 *   run, joined when a report is rendered);
 * - the baselines (--baseline) and the regression rule (--fail-on
 *   regression, --regression-factor), and the regressions found.
 *
 * A run that exits 2 replaces every requested report path it may write
 * with an error report (qc_run_end) and touches no other file. */
#ifndef QC_REPORT_RUN_H
#define QC_REPORT_RUN_H

#include "report/sbuf.h"

struct cJSON;

/* Begin the run of `verb` (argv[0] is the verb). Records the command line,
 * finds and checks the report paths. QC_OK, or QC_EINPUT with the first
 * refused path's message (every path is checked; those that pass still get
 * the error report). */
int qc_run_begin(const char *verb, int argc, char **argv);
/* This process writes no file (a rank other than 0 of a job of several,
 * src/dist/): its reports, error reports included, are rank 0's to write. */
void qc_run_no_files(void);
/* The verb ("" before qc_run_begin). */
const char *qc_run_verb(void);
/* The requested path of report kind k (QC_REP_*), NULL when none. */
const char *qc_run_path(int kind);

/* Record input file `path` in role `role` ("case", "dump", "plugin",
 * "report", "baseline"): its size now, its SHA-256 on a thread. A report
 * path naming the same file is refused (a report would overwrite an
 * input). QC_OK, QC_EINPUT (not a regular file, unreadable, a report path)
 * or QC_ESYS. */
int qc_run_input(const char *role, const char *path);

/* --baseline PATH: read and parse the report now (an input of the run); it
 * must be a report of the running verb (any verb's for `report`), not an
 * error report, and only `report` takes several. */
int qc_run_baseline(const char *path);
/* --fail-on WHAT: only "regression" (regressions then exit 1). */
int qc_run_fail_on(const char *what);
/* --regression-factor F: the factor a metric may rise by (> 1). */
int qc_run_regression_factor(const char *v);
/* The baselines given (parsed JSON, owned by the run) and their paths. */
int qc_run_nbaselines(void);
const struct cJSON *qc_run_baseline_json(int i);
const char *qc_run_baseline_path(int i);
double qc_run_factor(void);
int qc_run_fails_on_regression(void);
/* Add n regressions found (they decide the exit status at qc_run_end with
 * --fail-on regression) and keep their lines for the console summary. */
void qc_run_regressions(int n, const char *summary);

/* Add the run's provenance to a JSON report: "command_line" (the argv as
 * given) and "inputs" ([{role, path, size, sha256}]: waits for the hashes). */
void qc_run_json(struct cJSON *root);
/* The same for Markdown: the command line and every input, as list items. */
void qc_run_markdown(qc_sbuf *b);
/* The command line as one shell-quoted string into b. */
void qc_run_cmdline(qc_sbuf *b);

/* End the run with the verb's status rc (QC_OK, QC_FAIL, QC_EINPUT,
 * QC_ESYS) and return the exit status: on 2 (rc >= QC_EINPUT), every
 * requested report path the run may write is replaced with an error report
 * of the current error message (a path whose error report cannot be
 * written is removed if it holds a regular file); on 0 with regressions and
 * --fail-on regression, 1. Prints the regression summary (not under
 * --quiet). Frees the run's state. */
int qc_run_end(int rc);

#endif
