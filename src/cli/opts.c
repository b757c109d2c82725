/* opts.c: option parsing shared by the verbs (see cli.h). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend/backend.h"
#include "core/qc.h"
#include "core/watchdog.h"
#include "cli/cli.h"
#include "dist/dist.h"
#include "io/dump.h"
#include "report/run.h"

/* Verbs that split their work among the ranks of an MPI job (src/dist/). */
static int distributes(const char *verb) { return strcmp(verb, "vjp") == 0 || strcmp(verb, "contract") == 0; }

void qc_cli_sandbox(int argc, char **argv) {
  if (argc > 1 && strcmp(argv[1], QC_DUMP_SANDBOX_ARG) == 0) qc_dump_sandbox_main(argc - 1, argv + 1);
  qc_dump_sandbox_exec();
}

int qc_cli_run(const qc_verb *v, int argc, char **argv) {
  int rc = qc_dist_begin();                 /* started by mpirun: join the job */
  int later = qc_dist_rank() != 0;
  if (later) qc_quiet = 1;                  /* rank 0 alone speaks and writes */
  if (!rc) rc = qc_run_begin(v->name, argc, argv);
  if (later) qc_run_no_files();
  if (!rc && qc_dist_size() > 1 && !distributes(v->name)) {
    rc = qc_err("%s: runs as one process: started as %d processes (mpirun -np %d)", v->name, qc_dist_size(), qc_dist_size());
    qc_hint("vjp and contract split their work among the ranks of an MPI job; run '%s' without mpirun", v->name);
  }
  if (!rc) rc = v->fn(argc, argv);
  rc = qc_dist_finish(rc);                  /* every rank: the agreed error, or rank 0's verdict */
  rc = qc_run_end(rc);
  if (later) qc_err_clear();                /* the error line is rank 0's to print */
  else if (qc_dist_size() > 1 && rc == 2 && qc_err_msg()[0]) {
    qc_err_print(); /* before the job ends: once a rank exits non-zero, mpirun may kill the others */
    qc_err_clear();
  }
  fflush(stdout);
  fflush(stderr);
  qc_dist_end(); /* every rank waits here for rank 0's output */
  return rc;
}

int qc_opt_value(int argc, char **argv, int *i, const char *name, const char **val) {
  const char *a = argv[*i];
  size_t n = strlen(name);
  if (strncmp(a, name, n) != 0) return 0;
  if (a[n] == '=') { *val = a + n + 1; return 1; }
  if (a[n] != 0) return 0;
  if (*i + 1 >= argc) { qc_err("option '%s' needs a value", name); return -1; }
  *val = argv[++*i];
  return 1;
}

int qc_opt_help(const char *arg) { return strcmp(arg, "--help") == 0 || strcmp(arg, "-h") == 0; }

int qc_opt_common(int argc, char **argv, int *i, qc_common_opts *o) {
  const char *a = argv[*i];
  if (strcmp(a, "--quiet") == 0 || strcmp(a, "-q") == 0) { qc_quiet = 1; return 1; }
  if (strcmp(a, "--verbose") == 0 || strcmp(a, "-v") == 0) { qc_verbose = 1; return 1; }
  int r;
  if ((r = qc_opt_value(argc, argv, i, "--json", &o->json))) return r;
  if ((r = qc_opt_value(argc, argv, i, "--junit", &o->junit))) return r;
  if ((r = qc_opt_value(argc, argv, i, "--markdown", &o->markdown))) return r;
  if ((r = qc_opt_value(argc, argv, i, "--device", &o->device))) return r;
  if ((r = qc_opt_value(argc, argv, i, "--profile", &o->profile))) return r;
  const char *t;
  if ((r = qc_opt_value(argc, argv, i, "--timeout", &t))) { /* the watchdog restarts from here */
    if (r < 0) return -1;
    char *end;
    double s = strtod(t, &end);
    if (end == t || *end || qc_watchdog_arm(s) != QC_OK) {
      if (!qc_err_msg()[0]) qc_err("--timeout '%s': expected a number of seconds (0: no limit)", t);
      return -1;
    }
    return 1;
  }
  /* the regression gate (report/baseline.h): kept by the run, applied when the reports are written */
  const char *v;
  if ((r = qc_opt_value(argc, argv, i, "--baseline", &v))) return r < 0 || qc_run_baseline(v) ? -1 : 1;
  if ((r = qc_opt_value(argc, argv, i, "--fail-on", &v))) return r < 0 || qc_run_fail_on(v) ? -1 : 1;
  if ((r = qc_opt_value(argc, argv, i, "--regression-factor", &v))) return r < 0 || qc_run_regression_factor(v) ? -1 : 1;
  return 0;
}

const char *qc_opt_rank_device(const char *device, char *buf, size_t n) {
  if (!device || strcmp(device, "cuda") != 0 || !qc_dist_active()) return device;
  snprintf(buf, n, "cuda:%d", qc_dist_local_rank()); /* one rank per GPU of its node */
  return buf;
}

/* "cuda" or "cuda:N", N a device index, as qc_backend_open reads it. */
static int is_cuda(const char *device) {
  if (strncmp(device, "cuda", 4) != 0) return 0;
  if (device[4] == 0) return 1;
  if (device[4] != ':' || !device[5]) return 0;
  char *end;
  long v = strtol(device + 5, &end, 10);
  return !*end && v >= 0 && v <= 1024;
}

int qc_opt_cpu_only(const char *verb, const char *device, const char *why) {
  if (!device || strcmp(device, "cpu") == 0) return QC_OK;
  if (is_cuda(device)) return qc_err("%s: --device cuda is not supported: %s", verb, why);
  /* not a device name at all: the backend's own words for it */
  const qc_backend *be = NULL;
  int rc = qc_backend_open(device, &be);
  if (rc) return rc;
  qc_backend_close(be); /* it took a name is_cuda did not: refuse it all the same */
  return qc_err("%s: --device '%s' is not supported: %s", verb, device, why);
}

void qc_common_help_opts(unsigned flags) {
  printf("common options:\n"
         "  --json PATH        write the JSON report (atomically)\n"
         "  --junit PATH       write a JUnit XML report\n");
  if (flags & QC_HELP_MARKDOWN) printf("  --markdown PATH    write a Markdown report\n");
  if (flags & QC_HELP_CPU_ONLY) printf("  --device DEV       cpu (the default and the only one: cuda[:N] is refused)\n");
  else printf("  --device DEV       cpu (default) or cuda[:N]\n");
  if (flags & QC_HELP_PROFILE) printf("  --profile NAME     quantizer profile (default: the contract's, else vllm)\n");
  printf("  --timeout SECONDS  stop with exit 2 after this long (default %.0f = 6 h; 0: no limit)\n", QC_TIMEOUT_DEFAULT);
  if (!(flags & QC_HELP_NO_BASELINE))
    printf("  --baseline OLD     compare every check with the report OLD.json of an earlier run;\n"
           "                     regressions are listed in every report (docs/ci.md: the rule)\n"
           "  --fail-on regression   exit 1 when a check regressed against --baseline\n"
           "  --regression-factor F  how far a metric may rise over its baseline (default 1.1)\n");
  printf("  --quiet            print nothing but errors\n"
         "  --verbose          print progress and timings on stderr\n"
         "  --help             this text\n");
}

void qc_common_help(void) {
  qc_common_help_opts(QC_HELP_MARKDOWN | QC_HELP_PROFILE);
  printf("exit status: 0 every check passed (and at least one ran), 1 a check failed,\n"
         "             2 the run could not be judged (bad input, nothing to check)\n");
}
