/* job.c: a verb run as a rank of a process manager's job (cli.h,
 * qc_cli_job). MPI startup (qc_dist_begin, the first step of qc_cli_run)
 * waits for every rank of the job; a rank stopped, frozen or lost there
 * would hold the others with nothing armed but the 6-hour default limit,
 * before the verb's option parse has handed its run the report paths. So
 * before it, a run of its own is begun with what the common options say
 * (the report paths, --timeout, --rank-timeout, read by the pre-pass of
 * cli/opts.h against the common options' table): a job that never
 * finishes starting ends as any other run does, with one line, exit 2 and
 * the error report in place of an older report. */
#include <stdlib.h>
#include <string.h>

#include "cli/cli.h"
#include "cli/opts.h"
#include "core/qc.h"
#include "core/watchdog.h"
#include "dist/dist.h"
#include "report/run.h"

/* The common options of argv as the pre-pass reads them (a verb's own
 * options are skipped as unknown, their values as stray arguments): the
 * report paths into path, --timeout armed, --rank-timeout applied. What
 * they refuse is left to the verb's own parse, once MPI has started (so
 * every rank agrees on one line); sets no message. */
static void common_options(const char *verb, int argc, char **argv, const char *path[QC_REP_KINDS]) {
  qc_common_opts co = {0};
  qc_opt opt[] = {QC_OPTS_COMMON(&co, QC_HELP_MARKDOWN), QC_OPT_END()};
  int n = (int)(sizeof opt / sizeof opt[0]);
  const char *val[sizeof opt / sizeof opt[0]] = {0};
  qc_opts p = {.verb = verb, .opt = opt};
  qc_opts_scan(&p, argc, argv, val); /* what it read before an error it meets is still taken */
  for (int e = 0; e < n; e++) {
    const qc_opt *o = &opt[e];
    double s;
    if (!val[e]) continue;
    if (o->type == QC_OT_STRING && o->report > 0 && o->report <= QC_REP_KINDS) path[o->report - 1] = val[e];
    if (o->type == QC_OT_NUMBER && (o->num == qc_opt_timeout || o->num == qc_opt_rank_timeout) &&
        qc_opt_number(o, val[e], &s) == QC_OK) {
      if (o->num == qc_opt_timeout) qc_watchdog_arm(s);
      else qc_dist_rank_timeout(s);
    }
  }
  qc_opts_free(&p);
  qc_err_clear();
}

int qc_cli_job(const qc_verb *v, int argc, char **argv) {
  if (!qc_dist_launched()) return qc_cli_run(v, argc, argv);
  int later = qc_dist_env_rank() != 0;
  if (later) qc_watchdog_quiet(1); /* rank 0's line only, as once the job has started */
  qc_run start;
  const char *path[QC_REP_KINDS] = {0};
  qc_run_begin(&start, v->name, argc, argv);
  common_options(v->name, argc, argv, path);
  if (later) qc_run_no_files(&start);
  else qc_run_reports(&start, path); /* a path it refuses is never written; the verb's parse says why */
  qc_err_clear();
  int rc = qc_cli_run(v, argc, argv);
  /* MPI never started: qc_cli_run's run was not begun, so this one writes
   * the error reports of the exit 2 (rank 0's) */
  qc_run_end(&start, rc == 2 && !qc_dist_active() ? QC_ESYS : QC_OK);
  return rc;
}
