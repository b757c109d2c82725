/* run.c: the run's report paths, inputs and baselines (run.h). The top of
 * report/: it calls the committer (commit.c), the gate (baseline.c), the
 * report reader (json.c) and the provenance (prov.c); none calls back. */
#include "report/run.h"

#include <cjson/cJSON.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "core/qc.h"
#include "core/watchdog.h"

static const char *const kind_opt[QC_REP_KINDS] = {"--json", "--junit", "--markdown", "--html"};

void qc_run_no_files(qc_run *run) {
  for (int k = 0; k < QC_REP_KINDS; k++) run->refused[k] = 1;
}

/* What a file type is called in a message. */
static const char *type_name(mode_t m) {
  return S_ISDIR(m) ? "a directory" : S_ISCHR(m) ? "a character device" : S_ISBLK(m) ? "a block device"
       : S_ISFIFO(m) ? "a FIFO" : S_ISSOCK(m) ? "a socket" : S_ISLNK(m) ? "a symbolic link" : "not a regular file";
}

/* A report path (path[kind]) is a regular file or absent, in a folder we
 * may write, and no earlier kind's path: QC_OK, or QC_EINPUT / QC_ESYS with
 * the message set. */
static int check_report_path(const char *const path[QC_REP_KINDS], int kind) {
  const char *opt = kind_opt[kind], *p = path[kind];
  struct stat st;
  if (!p[0]) return qc_err("%s '': expected a file path", opt);
  if (p[strlen(p) - 1] == '/') return qc_err("%s '%s': names a folder: a report path must be a regular file or absent", opt, p);
  if (lstat(p, &st) == 0) {
    if (!S_ISREG(st.st_mode))
      return qc_err("%s '%s': is %s: a report path must be a regular file or absent", opt, p, type_name(st.st_mode));
  } else if (errno != ENOENT) {
    return qc_err("%s '%s': cannot use: %s", opt, p, strerror(errno));
  }
  char *dir = qc_report_dir(p);
  if (!dir) return qc_err_sys("out of memory");
  int rc = QC_OK;
  if (stat(dir, &st) != 0 || !S_ISDIR(st.st_mode)) {
    rc = qc_err("%s '%s': folder '%s' does not exist", opt, p, dir);
    qc_hint("create it first (mkdir -p '%s')", dir);
  } else if (access(dir, W_OK | X_OK) != 0) {
    rc = qc_err("%s '%s': folder '%s' is not writable: %s", opt, p, dir, strerror(errno));
  }
  free(dir);
  for (int k = 0; !rc && k < kind; k++) {
    struct stat a, b;
    if (path[k] && (strcmp(path[k], p) == 0 ||
                    (stat(path[k], &a) == 0 && stat(p, &b) == 0 && a.st_dev == b.st_dev && a.st_ino == b.st_ino)))
      rc = qc_err("%s and %s name the same file '%s': each report needs its own path", kind_opt[k], opt, p);
  }
  return rc;
}

/* Replace every report path run may write with the error report of the
 * current error message (the hashes not yet done are left out). */
static void error_reports(qc_run *run) {
  const char *path[QC_REP_KINDS];
  for (int k = 0; k < QC_REP_KINDS; k++) path[k] = run->refused[k] ? NULL : run->path[k];
  qc_prov_stop(&run->prov); /* an error report carries no hashes worth waiting for */
  qc_report_error_commit(run->verb[0] ? run->verb : "qatcheck", path, &run->prov);
}

/* --timeout expired or a signal came (core/watchdog.h; on the watchdog's
 * thread, while no report is being committed; ctx is the run registered
 * by qc_run_begin): the requested paths get the error report, as at any
 * exit 2. */
static void on_timeout(void *ctx, const char *msg, const char *hint) {
  qc_run *run = ctx;
  qc_err_clear(); /* replaced: the timeout is the run's error */
  qc_err("%s", msg);
  qc_hint("%s", hint);
  error_reports(run);
}

int qc_run_begin(qc_run *run, const char *verb, int argc, char **argv) {
  memset(run, 0, sizeof *run);
  run->begun = 1;
  snprintf(run->verb, sizeof run->verb, "%s", verb);
  qc_prov_init(&run->prov, argc, argv);
  run->gate.factor = 1.1;
  qc_watchdog_hook(on_timeout, run); /* the one process-wide pointer to the run: the watchdog's threads need it */
  return QC_OK;
}

int qc_run_reports(qc_run *run, const char *const path[QC_REP_KINDS]) {
  int rc = QC_OK, bad[QC_REP_KINDS] = {0};
  for (int k = 0; k < QC_REP_KINDS; k++) {
    if (!path[k]) continue;
    int r = check_report_path(path, k);
    if (r) {
      bad[k] = 1;
      if (!rc) rc = r;
    }
  }
  qc_watchdog_hold(); /* the watchdog's error report reads the paths */
  for (int k = 0; k < QC_REP_KINDS; k++) {
    run->path[k] = path[k];
    run->refused[k] |= bad[k];
  }
  qc_watchdog_release(0);
  return rc;
}

/* ---- inputs ---------------------------------------------------------------------- */

/* Record one input (qc_run_input), the watchdog held off by the caller. */
static int add_input(qc_run *run, const char *role, const char *path) {
  struct stat st;
  int fd = open(path, O_RDONLY | O_NONBLOCK | O_CLOEXEC);
  if (fd < 0) return qc_err("%s '%s': cannot read: %s", role, path, strerror(errno));
  int ok = fstat(fd, &st) == 0;
  close(fd);
  if (!ok || !S_ISREG(st.st_mode)) return qc_err("%s '%s': is %s, expected a regular file", role, path, type_name(st.st_mode));
  if (qc_prov_has(&run->prov, role, st.st_dev, st.st_ino)) return QC_OK;
  for (int k = 0; k < QC_REP_KINDS; k++) {
    struct stat rs;
    if (run->path[k] && !run->refused[k] && stat(run->path[k], &rs) == 0 && rs.st_dev == st.st_dev && rs.st_ino == st.st_ino) {
      run->refused[k] = 1; /* never written, not even with the error report */
      return qc_err("%s '%s' names the %s file '%s': a report would overwrite an input", kind_opt[k], run->path[k], role, path);
    }
  }
  return qc_prov_add(&run->prov, role, path, (long long)st.st_size, st.st_dev, st.st_ino);
}

int qc_run_input(qc_run *run, const char *role, const char *path) {
  qc_watchdog_hold(); /* the watchdog's error report reads the inputs */
  int rc = add_input(run, role, path);
  qc_watchdog_release(0);
  return rc;
}

/* ---- baselines --------------------------------------------------------------------- */

int qc_run_baseline(qc_run *run, const char *path) {
  qc_gate *g = &run->gate;
  int is_report = strcmp(run->verb, "report") == 0;
  if (!is_report && !qc_baseline_known(run->verb))
    return qc_err("%s: --baseline is not supported: its reports hold no checks to compare", run->verb);
  if (g->nbase && !is_report) return qc_err("--baseline given twice: expected one baseline report for '%s'", run->verb);
  if (g->nbase == (int)(sizeof g->base / sizeof g->base[0])) return qc_err("--baseline: at most %d baselines", g->nbase);
  char *text = NULL;
  size_t n = 0;
  int rc0 = qc_report_read_text(path, "--baseline", &text, &n); /* a FIFO is refused unopened */
  if (rc0) return rc0;
  cJSON *j = cJSON_ParseWithLength(text, n);
  free(text);
  int rc = QC_OK;
  const cJSON *v = j ? cJSON_GetObjectItemCaseSensitive(j, "verb") : NULL;
  const cJSON *vd = j ? cJSON_GetObjectItemCaseSensitive(j, "verdict") : NULL;
  if (!j || !cJSON_IsObject(j) || !cJSON_GetObjectItemCaseSensitive(j, "qatcheck_report") || !cJSON_IsString(v))
    rc = qc_err("--baseline '%s': not a qatcheck JSON report (expected \"qatcheck_report\" and \"verb\")", path);
  else if (!is_report && strcmp(v->valuestring, run->verb) != 0)
    rc = qc_err("--baseline '%s': is a '%s' report, expected a '%s' report", path, v->valuestring, run->verb);
  else if (cJSON_IsString(vd) && strcmp(vd->valuestring, "error") == 0)
    rc = qc_err("--baseline '%s': is the error report of a run that could not be judged: it holds no checks", path);
  if (!rc) rc = qc_run_input(run, "baseline", path);
  if (rc) {
    cJSON_Delete(j);
    return rc;
  }
  g->base_path[g->nbase] = strdup(path);
  g->base[g->nbase++] = j;
  return QC_OK;
}

int qc_run_fail_on(qc_run *run, const char *what) {
  if (strcmp(what, "regression") != 0) return qc_err("--fail-on '%s': expected 'regression'", what);
  run->gate.fail_on = 1;
  return QC_OK;
}

void qc_run_regression_factor(qc_run *run, double f) { run->gate.factor = f; }

void qc_run_out(qc_run *run, qc_report_out *o, const char *json, const char *junit, const char *markdown) {
  qc_report_out_init(o, json, junit, markdown);
  if (run) qc_report_out_run(o, run->verb, &run->prov, &run->gate);
}

/* ---- the end ------------------------------------------------------------------------------ */

int qc_run_end(qc_run *run, int rc) {
  int status = rc >= QC_EINPUT ? 2 : rc;
  if (!run->begun) return status; /* nothing recorded, nothing registered */
  qc_watchdog_hold(); /* the run ends here: released disarmed, the watchdog has no more to do */
  if (status == 2) {
    error_reports(run);
  } else {
    if (!qc_quiet && run->gate.regs.s) printf("%s", run->gate.regs.s);
    if (run->gate.nreg > 0 && run->gate.fail_on && status == 0) status = 1;
  }
  qc_prov_free(&run->prov);
  qc_gate_free(&run->gate);
  memset(run, 0, sizeof *run);
  qc_watchdog_release(1);
  return status;
}
