/* opts.c: the run of a verb (cli.h) and the one option parser of every verb
 * (opts.h): argv read against the verb's table, its help printed from it. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend/backend.h"
#include "core/number.h"
#include "core/qc.h"
#include "core/watchdog.h"
#include "cli/cli.h"
#include "dist/dist.h"
#include "io/dump.h"
#include "report/run.h"

void qc_cli_sandbox(int argc, char **argv) {
  if (argc > 1 && strcmp(argv[1], QC_DUMP_SANDBOX_ARG) == 0) qc_dump_sandbox_main(argc - 1, argv + 1);
  qc_dump_sandbox_exec();
}

int qc_cli_run(const qc_verb *v, int argc, char **argv) {
  int rc = qc_dist_begin();                 /* started by mpirun: join the job */
  int later = qc_dist_rank() != 0;
  if (later) qc_quiet = 1;                  /* rank 0 alone speaks and writes */
  qc_run run = {0};                         /* the run, handed to the verb (report/run.h) */
  if (!rc) rc = qc_run_begin(&run, v->name, argc, argv);
  if (later) qc_run_no_files(&run);
  if (!rc) rc = v->fn(&run, argc, argv);    /* its option parse starts the run (qc_opts_parse) */
  rc = qc_dist_finish(rc);                  /* every rank: the agreed error, or rank 0's verdict */
  rc = qc_run_end(&run, rc);
  /* the run has ended, its reports written: a signal from here on (mpirun
   * ending the job once a rank exits 2) must not add a second error line */
  qc_watchdog_quiet(1);
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

/* ---- the parser (opts.h) -------------------------------------------------------- */

/* The entry of t whose long name is the n bytes at name, or NULL. */
static const qc_opt *find_long(const qc_opt *t, const char *name, size_t n) {
  for (; t->type != QC_OT_END; t++)
    if (t->name && strlen(t->name) == n && strncmp(t->name, name, n) == 0) return t;
  return NULL;
}

/* The entry of t whose one-letter alias is c, or NULL. */
static const qc_opt *find_alias(const qc_opt *t, char c) {
  for (; t->type != QC_OT_END; t++)
    if (t->alias && t->alias == c && t->name) return t;
  return NULL;
}

/* A NUMBER entry's range flags, as core/number.h reads them. */
static unsigned num_how(const qc_opt *o) {
  return ((o->flags & QC_OPT_WHOLE) ? QC_NUM_WHOLE : 0u) | ((o->flags & QC_OPT_ABOVE) ? QC_NUM_ABOVE : 0u);
}

int qc_opt_number(const qc_opt *o, const char *s, double *out) {
  if (!(o->hi >= o->lo)) return qc_err_sys("option '--%s': its table entry declares no range", o->name); /* hi forgotten */
  if (qc_num_read(s, o->lo, o->hi, num_how(o), out)) return QC_OK;
  char want[96];
  return qc_err("option '--%s' is '%s': expected %s", o->name, s, qc_num_expected(want, sizeof want, o->lo, o->hi, num_how(o)));
}

/* Store v for option o: QC_OK or an error set. */
static int store(const qc_opt *o, const char *v) {
  switch (o->type) {
    case QC_OT_BOOL:
      if (o->value) *(int *)o->value = 1;
      return QC_OK;
    case QC_OT_STRING:
      *(const char **)o->value = v;
      return QC_OK;
    case QC_OT_NUMBER: {
      double d;
      int rc = qc_opt_number(o, v, &d);
      if (rc || o->num) return rc ? rc : o->num(o, d);
      *(double *)o->value = d;
      return QC_OK;
    }
    case QC_OT_CALLBACK:
      return o->fn(o, v) ? QC_EINPUT : QC_OK;
    default:
      return QC_OK;
  }
}

/* Does option o take a value? */
static int takes_value(const qc_opt *o) {
  return o->type == QC_OT_STRING || o->type == QC_OT_NUMBER || (o->type == QC_OT_CALLBACK && !(o->flags & QC_OPT_NOARG));
}

/* Can argument a be the value of option o, given as the next argument? Not
 * when it starts with '-' (the next option: the value was forgotten), but
 * for a NUMBER option's negative number. */
static int value_ok(const qc_opt *o, const char *a) {
  if (a[0] != '-') return 1;
  char *end;
  (void)strtod(a, &end);
  return o->type == QC_OT_NUMBER && end != a && !*end;
}

/* The one reading of argv[1..argc) against p->opt, filling p->which. The
 * parse (val NULL) stores each value as it is read and refuses an unknown
 * option or a stray argument; the pre-pass (val set) stores nothing, skips
 * those as one argument each, and leaves in val[e] the last value of entry
 * e. Both stop at -h / --help (the parse prints the help, p->done) and at
 * the first error. */
static int walk(qc_opts *p, int argc, char **argv, const char **val) {
  int ended = 0; /* after "--": every argument is positional */
  for (int i = 1; i < argc; i++) {
    const char *a = argv[i];
    if (!ended && strcmp(a, "--") == 0) {
      ended = 1;
      continue;
    }
    if (ended || a[0] != '-' || !a[1]) { /* an argument, not an option ("-" is one: an input named so) */
      if (p->positional) {
        p->which[i] = QC_OPTS_ARG;
        continue;
      }
      if (val) continue; /* kept for the parse to refuse */
      if (ended) return qc_err("%s: unexpected argument '%s' after '--': it takes no arguments", p->verb, a);
      qc_hint("run 'qatcheck %s --help'", p->verb);
      return qc_err("%s: unknown option '%s'", p->verb, a);
    }
    if (strcmp(a, "--help") == 0 || strcmp(a, "-h") == 0) {
      if (val) return QC_OK;
      p->help(p);
      p->done = 1;
      return QC_OK;
    }
    const qc_opt *o = NULL;
    const char *eq = NULL;
    char opt[128];
    if (a[1] == '-') {
      eq = strchr(a + 2, '=');
      size_t n = eq ? (size_t)(eq - a - 2) : strlen(a + 2);
      o = find_long(p->opt, a + 2, n);
      snprintf(opt, sizeof opt, "--%.*s", (int)n, a + 2);
    } else if (!a[2]) {
      o = find_alias(p->opt, a[1]);
      snprintf(opt, sizeof opt, "%s", a);
    }
    if (!o) {
      if (val) continue; /* kept for the parse to refuse */
      qc_hint("run 'qatcheck %s --help'", p->verb);
      return qc_err("%s: unknown option '%s'", p->verb, a);
    }
    p->which[i] = (int)(o - p->opt);
    const char *v = NULL;
    if (takes_value(o)) {
      if (eq) v = eq + 1;
      else if (i + 1 >= argc) return qc_err("option '%s' needs a value", opt);
      else if (!value_ok(o, argv[i + 1]))
        return qc_err("option '%s' needs a value: '%s' starts with '-' (give it as %s=%s if it is one)", opt, argv[i + 1], opt,
                      argv[i + 1]);
      else p->which[++i] = QC_OPTS_VALUE, v = argv[i];
    } else if (eq) {
      return qc_err("option '%s' takes no value: '%s'", opt, a);
    }
    if (val) {
      val[o - p->opt] = v ? v : "";
      continue;
    }
    int rc = store(o, v);
    if (rc) return rc;
  }
  return QC_OK;
}

/* Set up p for a reading of argv: QC_OK or QC_ESYS. */
static int begin_reading(qc_opts *p, int argc, char **argv) {
  p->done = 0;
  p->argc = argc;
  p->argv = argv;
  free(p->which);
  p->which = qc_calloc((size_t)argc + 1, sizeof *p->which, "options");
  if (!p->which) return QC_ESYS;
  for (int i = 0; i <= argc; i++) p->which[i] = QC_OPTS_NONE;
  return QC_OK;
}

int qc_opts_scan(qc_opts *p, int argc, char **argv, const char **val) {
  int rc = begin_reading(p, argc, argv);
  return rc ? rc : walk(p, argc, argv, val);
}

/* Verbs that split their work among the ranks of an MPI job (src/dist/). */
static int distributes(const char *verb) { return strcmp(verb, "vjp") == 0 || strcmp(verb, "contract") == 0; }

/* Start p->run before the parse stores anything (qc_opts_parse): the
 * pre-pass's report paths to the run, --timeout armed, the environment
 * checked, several processes refused for a verb that runs as one. QC_OK, or
 * the first error (the pre-pass's own comes first; the report paths read
 * before it still get the error report). */
static int start_run(qc_opts *p, int argc, char **argv) {
  int n = 0;
  while (p->opt[n].type != QC_OT_END) n++;
  const char **val = qc_calloc((size_t)n + 1, sizeof *val, "options");
  if (!val) return QC_ESYS;
  int rc = qc_opts_scan(p, argc, argv, val);
  const char *path[QC_REP_KINDS] = {0};
  for (int e = 0; e < n; e++) {
    const qc_opt *o = &p->opt[e];
    double s;
    if (!val[e]) continue;
    if (o->type == QC_OT_STRING && o->report > 0 && o->report <= QC_REP_KINDS) path[o->report - 1] = val[e];
    /* --timeout starts now, before any option opens an input (--baseline); the parse re-arms it */
    if (o->type == QC_OT_NUMBER && o->num == qc_opt_timeout && qc_num_read(val[e], o->lo, o->hi, num_how(o), &s) &&
        qc_watchdog_arm(s) != QC_OK && !rc)
      rc = QC_ESYS;
  }
  free(val);
  int r = qc_run_reports(p->run, path);
  if (!rc) rc = r;
  if (!rc) rc = qc_env_check();
  if (!rc && qc_dist_size() > 1 && !distributes(p->verb)) {
    rc = qc_err("%s: runs as one process: started as %d processes (mpirun -np %d)", p->verb, qc_dist_size(), qc_dist_size());
    qc_hint("vjp and contract split their work among the ranks of an MPI job; run '%s' without mpirun", p->verb);
  }
  return rc;
}

int qc_opts_parse(qc_opts *p, int argc, char **argv) {
  int rc = p->run ? start_run(p, argc, argv) : QC_OK;
  if (!rc) rc = begin_reading(p, argc, argv);
  return rc ? rc : walk(p, argc, argv, NULL);
}

void qc_opts_args(const qc_opts *p, const char **out, int *n) {
  *n = 0;
  for (int i = 1; i < p->argc; i++)
    if (p->which[i] == QC_OPTS_ARG) out[(*n)++] = p->argv[i];
}

int qc_opts_outside(const qc_opts *p, unsigned modes) {
  for (int i = 1; i < p->argc; i++) {
    int w = p->which[i];
    if (w >= 0 && p->opt[w].modes && !(p->opt[w].modes & modes))
      return i;
  }
  return 0;
}

int qc_opts_given(const qc_opts *p, const char *name) {
  for (int i = 1; i < p->argc; i++)
    if (p->which[i] >= 0 && strcmp(p->opt[p->which[i]].name, name) == 0) return 1;
  return 0;
}

void qc_opts_free(qc_opts *p) {
  free(p->which);
  p->which = NULL;
}

/* Print s indented by col after its first line (continuation lines). */
static void put_help(const char *s, int col) {
  for (const char *l = s; l;) {
    const char *nl = strchr(l, '\n');
    printf("%.*s\n", nl ? (int)(nl - l) : (int)strlen(l), l);
    l = nl ? nl + 1 : NULL;
    if (l) printf("%*s", col, "");
  }
}

void qc_opts_help(const qc_opt *t, int col) {
  int printed = 0;
  for (; t->type != QC_OT_END; t++) {
    if (t->type == QC_OT_GROUP) {
      if (t->col > 0) col = t->col;
      if (t->help) printf("%s%s\n", printed ? "\n" : "", t->help);
      printed |= t->help != NULL;
      continue;
    }
    if (t->type == QC_OT_TEXT) {
      fputs(t->help, stdout);
      printed = 1;
      continue;
    }
    if (t->flags & QC_OPT_HIDDEN) continue;
    char left[160], help[1024];
    int n = snprintf(left, sizeof left, "  --%s%s%s", t->name, t->argh ? " " : "", t->argh ? t->argh : "");
    if (t->flags & QC_OPT_HELPNUM) snprintf(help, sizeof help, t->help, t->help_num);
    const char *h = t->flags & QC_OPT_HELPNUM ? help : t->help;
    if (n + 2 <= col) printf("%s%*s", left, col - n, "");
    else if (strchr(h, '\n')) printf("%s\n%*s", left, col, ""); /* a long name over a paragraph: the help below it */
    else printf("%s  ", left);
    put_help(h, col);
    printed = 1;
  }
}

/* ---- the common options' handlers (QC_OPTS_COMMON) ---------------------------------- */

/* the range is the entry's (QC_TIMEOUT_MAX): what is left to fail is the watchdog's thread */
int qc_opt_timeout(const qc_opt *o, double s) {
  (void)o;
  return qc_watchdog_arm(s); /* the watchdog restarts from here */
}

int qc_opt_rank_timeout(const qc_opt *o, double s) {
  (void)o;
  return qc_dist_rank_timeout(s);
}

/* The run a regression-gate option goes to (o->value: the verb's
 * qc_common_opts), or NULL with the error set when the verb has none. */
static qc_run *gate_run(const qc_opt *o) {
  const qc_common_opts *co = o->value;
  if (co && co->run) return co->run;
  qc_err("--%s: no run to keep it", o->name);
  return NULL;
}

/* the regression gate (report/baseline.h): kept by the run, applied when the reports are written */
int qc_opt_baseline(const qc_opt *o, const char *v) {
  qc_run *run = gate_run(o);
  return !run || qc_run_baseline(run, v) ? QC_EINPUT : QC_OK;
}
int qc_opt_fail_on(const qc_opt *o, const char *v) {
  qc_run *run = gate_run(o);
  return !run || qc_run_fail_on(run, v) ? QC_EINPUT : QC_OK;
}
int qc_opt_regression_factor(const qc_opt *o, double f) {
  qc_run *run = gate_run(o);
  if (!run) return QC_EINPUT;
  qc_run_regression_factor(run, f);
  return QC_OK;
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
