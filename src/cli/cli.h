/* cli.h: the verb signature and the small option parser every verb uses. */
#ifndef QC_CLI_H
#define QC_CLI_H

#include <stddef.h>

/* A verb: argv[0] is the verb name. Returns the exit status (0, 1, 2). */
typedef int (*qc_verb_fn)(int argc, char **argv);

typedef struct qc_verb {
  const char *name;
  qc_verb_fn fn;
  const char *help;   /* one line for `qatcheck --help` */
} qc_verb;

/* Run verb v (argv[0] its name) as one run (report/run.h): its report
 * paths are checked before it does any work, and an exit 2 replaces them
 * with its error report. Returns the exit status (0, 1, 2). */
int qc_cli_run(const qc_verb *v, int argc, char **argv);
/* Before anything else in main(): run the dump sandbox's child when this
 * process is one (argv[1] is its marker: never returns), else let the
 * dump reader exec its children from this binary (io/dump.h). */
void qc_cli_sandbox(int argc, char **argv);

/* Options common to verbs, filled by qc_opt_common. */
typedef struct qc_common_opts {
  const char *json;     /* --json PATH */
  const char *junit;    /* --junit PATH */
  const char *markdown; /* --markdown PATH */
  const char *device;   /* --device cpu|cuda[:N] (default cpu) */
  const char *profile;  /* --profile NAME (default: the case's, else vllm) */
} qc_common_opts;

/* If argv[*i] is a common option (--json, --junit, --markdown, --device,
 * --profile, --timeout, --quiet, --verbose; --baseline, --fail-on,
 * --regression-factor, which go to the run: report/run.h), consume it (and
 * its value) and return 1; 0 if not one; -1 on a missing or bad value
 * (message set). --timeout SECONDS re-arms the run's watchdog
 * (core/watchdog.h) at once. */
int qc_opt_common(int argc, char **argv, int *i, qc_common_opts *o);
/* If argv[*i] is `--name VALUE` or `--name=VALUE`, set *val, advance, return
 * 1; 0 if not; -1 when the value is missing (message set). */
int qc_opt_value(int argc, char **argv, int *i, const char *name, const char **val);
/* The device of this rank: under mpirun, a plain "cuda" is the node's GPU
 * of this rank's local index ("cuda:<local rank>", written into buf);
 * anything else as given. */
const char *qc_opt_rank_device(const char *device, char *buf, size_t n);
/* 1 if argv[*i] is --help or -h. */
int qc_opt_help(const char *arg);
/* Print the common options' help block (every option) and the exit statuses. */
void qc_common_help(void);
/* The common options' block only, for a verb that prints its own exit
 * statuses: --markdown and --profile listed when flags name them, --device
 * as cpu only under QC_HELP_CPU_ONLY. */
enum { QC_HELP_MARKDOWN = 1, QC_HELP_PROFILE = 2, QC_HELP_CPU_ONLY = 4, QC_HELP_NO_BASELINE = 8 };
void qc_common_help_opts(unsigned flags);
/* --device for a verb with no device work: NULL and "cpu" are QC_OK;
 * "cuda" or "cuda:N" is refused as "<verb>: --device cuda is not supported:
 * <why>"; anything else with qc_backend_open's message. Never loads the
 * CUDA backend. */
int qc_opt_cpu_only(const char *verb, const char *device, const char *why);

/* quant's many-module modes (quant_many.c): wanted when argv has
 * --checkpoint / --master, or --dump without --module. */
int qc_quant_many_wanted(int argc, char **argv);
int qc_cmd_quant_many(int argc, char **argv);
/* tol's --dump mode (tol_dump.c): wanted when argv has --dump. */
int qc_tol_dump_wanted(int argc, char **argv);
int qc_cmd_tol_dump(int argc, char **argv);
/* A number option value of at least lo, the whole string (tol.c). */
int qc_tol_num_arg(const char *opt, const char *v, double lo, double *out);

/* The verbs, one file each in src/cli/ (main.c's table): each parses its
 * own options and returns the process's exit status. */
int qc_cmd_vjp(int argc, char **argv);
int qc_cmd_contract(int argc, char **argv);
int qc_cmd_tol(int argc, char **argv);
int qc_cmd_fd(int argc, char **argv);
int qc_cmd_quant(int argc, char **argv);
int qc_cmd_report(int argc, char **argv);
int qc_cmd_sft(int argc, char **argv);
int qc_cmd_step(int argc, char **argv);

#endif
