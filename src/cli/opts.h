/* opts.h: options as data. Each verb declares its options in one table
 * (git's parse-options style) and qc_opts_parse reads argv against it;
 * the verb's --help lists the same table (qc_opts_help), so what a verb
 * takes and what its help says cannot drift apart.
 *
 *   qc_opt opts[] = {
 *       QC_OPT_STRING("case", &case_path, "PATH", "the case file"),
 *       QC_OPT_BOOL("allow-weak-tolerances", &allow_weak, "run a case whose bounds ..."),
 *       QC_OPTS_COMMON(&co, QC_HELP_MARKDOWN | QC_HELP_PROFILE),
 *       QC_OPT_END(),
 *   };
 *   qc_opts p = {.verb = "vjp", .opt = opts, .help = help};
 *   int rc = qc_opts_parse(&p, argc, argv);
 *
 * The parser takes `--name VALUE` and `--name=VALUE`, the short aliases the
 * table names (-q, -v), -h / --help (the verb's help printed, p.done set)
 * and `--` (every argument after it is positional). An unknown option is
 * "<verb>: unknown option '--x'" with the hint "run 'qatcheck <verb>
 * --help'"; a missing value "option '--x' needs a value". A value given as
 * the next argument may not start with '-' (that is the next option, the
 * value forgotten: `qatcheck vjp --json --case x.json`), but for a negative
 * number of a NUMBER option; `--name=-x` gives such a value.
 *
 * The table is the one reading of the command line. Before it stores
 * anything, qc_opts_parse reads argv with the same table once more,
 * storing nothing and skipping unknown options (the pre-pass,
 * qc_opts_scan, as git's PARSE_OPT_KEEP_UNKNOWN): the verb's run
 * (report/run.h) gets the report paths read so and --timeout is armed. A
 * run stopped by a bad option still replaces its reports with its error
 * report, and never writes one at a path the parse does not take as one.
 * Verbs with sub-modes (quant, tol) parse one table holding every mode's
 * options, tagged with the modes they belong to, choose the mode from the
 * values parsed, and ask qc_opts_outside for an option given that the mode
 * does not take. docs/architecture.md ("Options") has the contributor's
 * view. */
#ifndef QC_CLI_OPTS_H
#define QC_CLI_OPTS_H

#include "core/number.h"
#include "core/qc.h"
#include "core/watchdog.h"
#include "dist/dist.h"
#include "report/report.h"

struct qc_run;

typedef enum {
  QC_OT_END = 0,  /* the table's end */
  QC_OT_BOOL,     /* a flag: *(int *)value = 1 */
  QC_OT_STRING,   /* *(const char **)value = VALUE (a pointer into argv); the last wins */
  QC_OT_NUMBER,   /* a number in [lo, hi] (QC_OPT_WHOLE: a whole one; QC_OPT_ABOVE: lo excluded): handed to
                   * num(opt, it) when the entry has one (value is then num's data), else *(double *)value = it */
  QC_OT_CALLBACK, /* fn(opt, VALUE) (VALUE NULL under QC_OPT_NOARG): checks and stores it itself */
  QC_OT_GROUP,    /* help only: a heading line ("common options:"; none when NULL); col > 0 sets the
                   * help column from here on */
  QC_OT_TEXT      /* help only: text printed as it is, between the options */
} qc_optype;

/* Flags of an option. */
enum {
  QC_OPT_HIDDEN = 1, /* parsed, not listed by --help (an option the verb refuses with its reason) */
  QC_OPT_NOARG = 2,  /* a CALLBACK option that takes no value */
  QC_OPT_WHOLE = 4,  /* a NUMBER option that must be a whole number */
  QC_OPT_COMMON = 8, /* one of QC_OPTS_COMMON's (tol leaves them out of the command line it records) */
  QC_OPT_HELPNUM = 16, /* the help is a printf format taking one double, help_num ("default %g") */
  QC_OPT_ABOVE = 32    /* a NUMBER option's lo is excluded: a number above lo */
};

typedef struct qc_opt qc_opt;
/* A CALLBACK option's handler: VALUE as given (NULL for a QC_OPT_NOARG
 * option); QC_OK, or an error with its message set (qc_err). */
typedef int (*qc_opt_fn)(const qc_opt *o, const char *arg);
/* A NUMBER option's handler: the number, in the entry's range; QC_OK or an
 * error with its message set. */
typedef int (*qc_opt_num)(const qc_opt *o, double v);

struct qc_opt {
  qc_optype type;
  const char *name;   /* the long name without "--" */
  char alias;         /* a one-letter alias (-q) or 0 */
  void *value;        /* where the value goes (see qc_optype); a CALLBACK's own data */
  const char *argh;   /* the value's name in the help ("PATH"); NULL for flags */
  const char *help;   /* the help; '\n' starts a continuation line, indented to the column */
  unsigned flags;     /* QC_OPT_* */
  qc_opt_fn fn;       /* CALLBACK: the handler */
  qc_opt_num num;     /* NUMBER: the handler, or NULL to store into value */
  double lo, hi;      /* NUMBER (and a CALLBACK reading numbers, qc_opt_number): the range taken, both declared */
  int report;         /* STRING: a report path, QC_REP_<KIND> + 1 (0: none); the pre-pass hands it to the run */
  double help_num;    /* QC_OPT_HELPNUM: the number the help prints */
  unsigned modes;     /* the sub-modes that take it (a bit each, the verb's own); 0: every mode */
  int col;            /* GROUP: the help column from here on (0: unchanged) */
};

#define QC_OPT_END() {.type = QC_OT_END}
#define QC_OPT_BOOL(n, v, h) {.type = QC_OT_BOOL, .name = (n), .value = (v), .help = (h)}
#define QC_OPT_STRING(n, v, a, h) {.type = QC_OT_STRING, .name = (n), .value = (v), .argh = (a), .help = (h)}
#define QC_OPT_NUMBER(n, v, a, lo_, hi_, h) \
  {.type = QC_OT_NUMBER, .name = (n), .value = (v), .argh = (a), .help = (h), .lo = (lo_), .hi = (hi_)}
/* A report path (kind: QC_REP_JSON, ...). */
#define QC_OPT_REPORT(n, v, kind, h) \
  {.type = QC_OT_STRING, .name = (n), .value = (v), .argh = "PATH", .help = (h), .report = (kind) + 1}
#define QC_OPT_CALLBACK(n, v, a, f, h) {.type = QC_OT_CALLBACK, .name = (n), .value = (v), .argh = (a), .help = (h), .fn = (f)}
#define QC_OPT_GROUP(h, c) {.type = QC_OT_GROUP, .help = (h), .col = (c)}
#define QC_OPT_TEXT(h) {.type = QC_OT_TEXT, .help = (h)}

/* What QC_OPTS_COMMON fills. */
typedef struct qc_common_opts {
  const char *json;     /* --json PATH */
  const char *junit;    /* --junit PATH */
  const char *markdown; /* --markdown PATH */
  const char *device;   /* --device cpu|cuda[:N] (default cpu) */
  const char *profile;  /* --profile NAME (default: the case's, else vllm) */
  struct qc_run *run;   /* the verb's run (report/run.h), set before the parse: the regression gate's
                         * options (--baseline, --fail-on, --regression-factor) go to it */
} qc_common_opts;

/* The help of QC_OPTS_COMMON, by flags: --markdown and --profile listed when
 * flags name them (parsed always: a verb refuses them with its reason),
 * --device as cpu only under QC_HELP_CPU_ONLY, the regression gate left out
 * under QC_HELP_NO_BASELINE, the heading "common options:" left out under
 * QC_HELP_NO_HEADING. */
enum {
  QC_HELP_MARKDOWN = 1,
  QC_HELP_PROFILE = 2,
  QC_HELP_CPU_ONLY = 4,
  QC_HELP_NO_BASELINE = 8,
  QC_HELP_NO_HEADING = 16
};

/* Handlers of the common options that do more than store a value: the
 * watchdog re-armed (--timeout), the regression gate kept by the run
 * (--baseline, --fail-on, --regression-factor: report/run.h; the entry's
 * value is the verb's qc_common_opts, whose run field names the run). */
int qc_opt_timeout(const qc_opt *o, double seconds);
/* --rank-timeout: the job's stall check (dist/dist.h) set. */
int qc_opt_rank_timeout(const qc_opt *o, double seconds);
int qc_opt_baseline(const qc_opt *o, const char *arg);
int qc_opt_fail_on(const qc_opt *o, const char *arg);
int qc_opt_regression_factor(const qc_opt *o, double factor);

/* The ranges of the common numeric options. */
#define QC_TIMEOUT_MAX 1e9      /* --timeout, --rank-timeout: seconds (0: no limit, off) */
#define QC_REGRESSION_MAX 1e15  /* --regression-factor: above 1 */

/* The entries of --timeout and --regression-factor, also for a verb that
 * lists the common options its own way (report); fl: QC_OPT_* added. */
#define QC_OPT_TIMEOUT_ENTRY(fl)                                                                                       \
  {.type = QC_OT_NUMBER, .name = "timeout", .argh = "SECONDS", .num = qc_opt_timeout, .lo = 0, .hi = QC_TIMEOUT_MAX,  \
   .help = "stop with exit 2 after this long (default %.0f = 6 h; 0: no limit)", .help_num = QC_TIMEOUT_DEFAULT,      \
   .flags = QC_OPT_HELPNUM | (fl)}
#define QC_OPT_REGRESSION_FACTOR_ENTRY(co, h, fl)                                                                     \
  {.type = QC_OT_NUMBER, .name = "regression-factor", .value = (co), .argh = "F", .num = qc_opt_regression_factor,   \
   .lo = 1, .hi = QC_REGRESSION_MAX, .help = (h), .flags = QC_OPT_ABOVE | (fl)}

/* The common options (--json, --junit, --markdown, --device, --profile,
 * --timeout, --rank-timeout, --baseline, --fail-on, --regression-factor, --quiet,
 * --verbose, --help) as table entries filling *co; f: QC_HELP_* above. */
#define QC_OPT_HIDE_UNLESS(f, bit) (((f) & (bit)) ? 0u : (unsigned)QC_OPT_HIDDEN)
#define QC_OPTS_COMMON(co, f)                                                                                              \
  {.type = QC_OT_GROUP, .help = ((f) & QC_HELP_NO_HEADING) ? NULL : "common options:", .col = 21},                       \
  {.type = QC_OT_STRING, .name = "json", .value = &(co)->json, .argh = "PATH", .help = "write the JSON report (atomically)",  \
   .flags = QC_OPT_COMMON, .report = QC_REP_JSON + 1},                                                                     \
  {.type = QC_OT_STRING, .name = "junit", .value = &(co)->junit, .argh = "PATH", .help = "write a JUnit XML report",        \
   .flags = QC_OPT_COMMON, .report = QC_REP_JUNIT + 1},                                                                    \
  {.type = QC_OT_STRING, .name = "markdown", .value = &(co)->markdown, .argh = "PATH", .help = "write a Markdown report",   \
   .flags = QC_OPT_COMMON | QC_OPT_HIDE_UNLESS(f, QC_HELP_MARKDOWN), .report = QC_REP_MARKDOWN + 1},                        \
  {.type = QC_OT_STRING, .name = "device", .value = &(co)->device, .argh = "DEV",                                          \
   .help = ((f) & QC_HELP_CPU_ONLY) ? "cpu (the default and the only one: cuda[:N] is refused)" : "cpu (default) or cuda[:N]", \
   .flags = QC_OPT_COMMON},                                                                                                \
  {.type = QC_OT_STRING, .name = "profile", .value = &(co)->profile, .argh = "NAME",                                       \
   .help = "quantizer profile (default: the contract's, else vllm)",                                                      \
   .flags = QC_OPT_COMMON | QC_OPT_HIDE_UNLESS(f, QC_HELP_PROFILE)},                                                        \
  QC_OPT_TIMEOUT_ENTRY(QC_OPT_COMMON),                                                                                     \
  {.type = QC_OT_NUMBER, .name = "rank-timeout", .argh = "SECONDS", .num = qc_opt_rank_timeout, .lo = 0, .hi = QC_TIMEOUT_MAX, \
   .help = "under mpirun: end the job when a rank has not run for this long\n"                                            \
           "(stopped, frozen; default %.0f, or QATCHECK_RANK_TIMEOUT; 0: off)", .help_num = QC_RANK_TIMEOUT_DEFAULT,       \
   .flags = QC_OPT_COMMON | QC_OPT_HELPNUM},                                                                                \
  {.type = QC_OT_CALLBACK, .name = "baseline", .value = (co), .argh = "OLD", .fn = qc_opt_baseline,                       \
   .help = "compare every check with the report OLD.json of an earlier run;\n"                                            \
           "regressions are listed in every report (docs/ci.md: the rule)",                                                \
   .flags = QC_OPT_COMMON | (((f) & QC_HELP_NO_BASELINE) ? (unsigned)QC_OPT_HIDDEN : 0u)},                                 \
  {.type = QC_OT_CALLBACK, .name = "fail-on", .value = (co), .argh = "regression", .fn = qc_opt_fail_on,                    \
   .help = "exit 1 when a check regressed against --baseline",                                                              \
   .flags = QC_OPT_COMMON | (((f) & QC_HELP_NO_BASELINE) ? (unsigned)QC_OPT_HIDDEN : 0u)},                                 \
  QC_OPT_REGRESSION_FACTOR_ENTRY(co, "how far a metric may rise over its baseline (default 1.1)",                          \
                                 QC_OPT_COMMON | (((f) & QC_HELP_NO_BASELINE) ? (unsigned)QC_OPT_HIDDEN : 0u)),            \
  {.type = QC_OT_BOOL, .name = "quiet", .alias = 'q', .value = &qc_quiet, .help = "print nothing but errors",    \
   .flags = QC_OPT_COMMON},                                                                                                \
  {.type = QC_OT_BOOL, .name = "verbose", .alias = 'v', .value = &qc_verbose,                                   \
   .help = "print progress and timings on stderr", .flags = QC_OPT_COMMON},                                               \
  {.type = QC_OT_BOOL, .name = "help", .alias = 'h', .help = "this text", .flags = QC_OPT_COMMON}

/* One parse of a verb's argv against its table (the fields below "filled"
 * zero at first: a designated initializer). */
typedef struct qc_opts {
  const char *verb;        /* for the messages: "vjp" */
  const qc_opt *opt;       /* the table, ended by QC_OPT_END() */
  void (*help)(const struct qc_opts *p); /* prints the verb's --help (qc_opts_help(p->opt, ...) for the options) */
  int positional;          /* 1: arguments without a leading '-', "-" and all after `--` are the verb's (report's inputs) */
  struct qc_run *run;      /* the verb's run, started by the parse (qc_opts_parse); NULL: none (a test) */
  /* filled by qc_opts_parse */
  int done;                /* --help was given and printed: the verb returns 0 */
  int argc;
  char **argv;
  int *which;              /* per argv index: the table entry it names, or QC_OPTS_* below */
} qc_opts;
enum { QC_OPTS_ARG = -1 /* positional */, QC_OPTS_VALUE = -2 /* the value of the option before it */, QC_OPTS_NONE = -3 };

/* The exit statuses of a verb's help, where the verb has no words of its own. */
#define QC_HELP_EXIT                                                                \
  "exit status: 0 every check passed (and at least one ran), 1 a check failed,\n" \
  "             2 the run could not be judged (bad input, nothing to check)\n"

/* Parse argv[1..argc) against p->opt, storing every value as it goes (a
 * CALLBACK's or a NUMBER's bad value stops the parse there). With p->run,
 * the run is started first, before any value is stored: the pre-pass
 * (qc_opts_scan) hands it the report paths (entries with a report kind:
 * qc_run_reports checks them) and arms --timeout; then the numeric
 * environment variables are checked (core/number.h), and a verb other than
 * vjp and contract refuses to run as several processes (mpirun). QC_OK
 * (p->done set after --help), or QC_EINPUT / QC_ESYS with the message set.
 * Free p with qc_opts_free whatever it returns. */
int qc_opts_parse(qc_opts *p, int argc, char **argv);
/* The pre-pass: argv[1..argc) read against p->opt exactly as qc_opts_parse
 * reads it, but storing nothing and skipping an unknown option or a stray
 * argument as one argument (git's PARSE_OPT_KEEP_UNKNOWN): val[e] (a slot
 * per table entry, left NULL when not given) gets the last value of entry
 * e ("" for a flag). It stops at -h / --help and at the first error of the
 * reading itself (a value that starts with '-', a missing value, a value
 * given to a flag), whose message it sets; val holds what came before it.
 * QC_OK or QC_EINPUT. */
int qc_opts_scan(qc_opts *p, int argc, char **argv, const char **val);
/* s as a number in entry o's range (lo, hi, QC_OPT_WHOLE, QC_OPT_ABOVE),
 * for a CALLBACK that reads numbers (a pair, a suffix): QC_OK with *out
 * set, or QC_EINPUT with "option '--name' is 'S': expected ...". */
int qc_opt_number(const qc_opt *o, const char *s, double *out);
/* The positional arguments in order: *n of them into out (argc entries). */
void qc_opts_args(const qc_opts *p, const char **out, int *n);
/* The argv index of the first option given that none of the modes in
 * `modes` takes (an entry whose modes field has no bit of it), or 0. */
int qc_opts_outside(const qc_opts *p, unsigned modes);
/* 1 when the table entry with this long name was given. */
int qc_opts_given(const qc_opts *p, const char *name);
void qc_opts_free(qc_opts *p);
/* Print the table's help: GROUP headings, TEXT as it is, each shown option
 * as "  --name ARG" padded to col, its help after, continuation lines
 * indented to col. A name that reaches the column is followed by two spaces
 * and a one-line help, or by a new line and a longer help. */
void qc_opts_help(const qc_opt *opt, int col);

#endif
