/* run.h: what one run of qatcheck knows about itself, for every report it
 * writes: one qc_run, begun and ended around the verb by cli/'s
 * qc_cli_run and handed to the verb, which hands it on (qc_run_out) to the
 * reports it renders. It sits on top of report/: run.c calls the
 * committer, the gate and the renderers' helpers, and none of them calls
 * back (they take the provenance and the gate as arguments). It holds:
 *
 * - the command line, as given;
 * - the report paths asked for (--json, --junit, --markdown, --html), handed
 *   over by the pre-pass of the verb's option parse (cli/opts.h), which
 *   reads argv with the verb's own table before anything is stored, so that
 *   a run stopped by a bad option still replaces them with its error report.
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
 * with an error report (qc_run_end) and touches no other file; so does a
 * run stopped by --timeout or a signal: the watchdog (core/watchdog.h)
 * keeps the one process-wide pointer to the run, registered by
 * qc_run_begin, because its threads cannot be handed it. */
#ifndef QC_REPORT_RUN_H
#define QC_REPORT_RUN_H

#include "report/baseline.h"
#include "report/prov.h"
#include "report/report.h"

typedef struct qc_run {
  int begun;                         /* qc_run_begin was called */
  char verb[32];                     /* "" before qc_run_begin */
  const char *path[QC_REP_KINDS];    /* the requested report paths (pointers into argv) */
  int refused[QC_REP_KINDS];         /* failed its check, or this process writes no file: never written */
  qc_prov prov;                      /* the command line and the inputs */
  qc_gate gate;                      /* the baselines, the rule, the regressions found */
} qc_run;

/* Begin run *run of `verb` (argv[0] is the verb; *run is overwritten):
 * records the command line and registers the run with the watchdog; its
 * report paths come later (qc_run_reports). QC_OK. A run whose
 * qc_run_begin was never called must be zeroed ({0}) before qc_run_end. */
int qc_run_begin(qc_run *run, const char *verb, int argc, char **argv);
/* The report paths the command line asks for (path[kind], NULL: none;
 * pointers into argv), from the option parse's pre-pass (cli/opts.h),
 * before the verb does any work: each is checked (above). QC_OK, or
 * QC_EINPUT / QC_ESYS with the first refused path's message (every path is
 * checked; those that pass still get the error report). */
int qc_run_reports(qc_run *run, const char *const path[QC_REP_KINDS]);
/* This process writes no file (a rank other than 0 of a job of several,
 * src/dist/): its reports, error reports included, are rank 0's to write. */
void qc_run_no_files(qc_run *run);

/* Record input file `path` in role `role` ("case", "dump", "plugin",
 * "report", "baseline"): its size now, its SHA-256 on a thread. A report
 * path naming the same file is refused (a report would overwrite an
 * input). QC_OK, QC_EINPUT (not a regular file, unreadable, a report path)
 * or QC_ESYS. */
int qc_run_input(qc_run *run, const char *role, const char *path);

/* --baseline PATH: read and parse the report now (an input of the run); it
 * must be a report of the running verb (any verb's for `report`), not an
 * error report, and only `report` takes several. */
int qc_run_baseline(qc_run *run, const char *path);
/* --fail-on WHAT: only "regression" (regressions then exit 1). */
int qc_run_fail_on(qc_run *run, const char *what);
/* --regression-factor F: the factor a metric may rise by (above 1: the
 * option's range, cli/opts.h). */
void qc_run_regression_factor(qc_run *run, double f);

/* Set the requested paths of o (qc_report_out_init) and hand it the run's
 * provenance and regression gate (qc_report_out_run); run may be NULL. */
void qc_run_out(qc_run *run, qc_report_out *o, const char *json, const char *junit, const char *markdown);

/* End the run with the verb's status rc (QC_OK, QC_FAIL, QC_EINPUT,
 * QC_ESYS) and return the exit status: on 2 (rc >= QC_EINPUT), every
 * requested report path the run may write is replaced with an error report
 * of the current error message (a path whose error report cannot be
 * written is removed if it holds a regular file); on 0 with regressions and
 * --fail-on regression, 1. Prints the regression summary (not under
 * --quiet). Unregisters the run from the watchdog and frees its state. */
int qc_run_end(qc_run *run, int rc);

#endif
