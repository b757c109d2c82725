/* cli.h: the verb signature, the run of a verb, and the helpers the verbs
 * share (their options: cli/opts.h). */
#ifndef QC_CLI_H
#define QC_CLI_H

#include <stddef.h>

#include "cli/opts.h"

struct qc_run;

/* A verb: run is its run (report/run.h: its inputs, baselines and reports
 * go to it), argv[0] the verb name. Returns the exit status (0, 1, 2). */
typedef int (*qc_verb_fn)(struct qc_run *run, int argc, char **argv);

typedef struct qc_verb {
  const char *name;
  qc_verb_fn fn;
  const char *help;   /* one line for `qatcheck --help` */
} qc_verb;

/* The verbs, one file each in src/cli/ (main.c's table): each parses its
 * options (its table, cli/opts.h), runs as `run`, and returns the exit
 * status. */
int qc_cmd_vjp(struct qc_run *run, int argc, char **argv);
int qc_cmd_contract(struct qc_run *run, int argc, char **argv);
int qc_cmd_tol(struct qc_run *run, int argc, char **argv);
int qc_cmd_fd(struct qc_run *run, int argc, char **argv);
int qc_cmd_quant(struct qc_run *run, int argc, char **argv);
int qc_cmd_report(struct qc_run *run, int argc, char **argv);
int qc_cmd_sft(struct qc_run *run, int argc, char **argv);
int qc_cmd_step(struct qc_run *run, int argc, char **argv);
int qc_cmd_classes(struct qc_run *run, int argc, char **argv);

/* Run verb v (argv[0] its name) as one run (report/run.h): its report
 * paths are checked before it does any work, and an exit 2 replaces them
 * with its error report. Returns the exit status (0, 1, 2). */
int qc_cli_run(const qc_verb *v, int argc, char **argv);
/* Run verb v as qc_cli_run does; started by a process manager (mpirun),
 * with the run's --timeout armed, its report paths registered with the
 * watchdog and --rank-timeout applied before MPI starts, so a job that
 * never finishes starting (a rank stopped inside MPI_Init) ends as a run
 * does: one line, exit 2, the error report (cli/job.c). */
int qc_cli_job(const qc_verb *v, int argc, char **argv);
/* Before anything else in main(): run the dump sandbox's child when this
 * process is one (argv[1] is its marker: never returns), else let the
 * dump reader exec its children from this binary (io/dump.h). */
void qc_cli_sandbox(int argc, char **argv);

/* The device of this rank: under mpirun, a plain "cuda" is the node's GPU
 * of this rank's local index ("cuda:<local rank>", written into buf);
 * anything else as given. */
const char *qc_opt_rank_device(const char *device, char *buf, size_t n);
/* --device for a verb with no device work: NULL and "cpu" are QC_OK;
 * "cuda" or "cuda:N" is refused as "<verb>: --device cuda is not supported:
 * <why>"; anything else with qc_backend_open's message. Never loads the
 * CUDA backend. */
int qc_opt_cpu_only(const char *verb, const char *device, const char *why);

/* quant's options, parsed once (quant.c) for each of its modes. */
typedef struct qc_quant_args {
  qc_common_opts co;
  const char *dump, *module, *modules, *format, *checkpoint, *master;
  const char *cal[16];
  int ncal, identify;
} qc_quant_args;
/* quant's many-module modes (quant_many.c): --checkpoint DEPLOYED --master
 * MASTER, or --dump without --module (the run is a->co.run). Returns the
 * exit status. */
int qc_quant_many(const qc_quant_args *a);

/* tol --dump's derive options, as a case's {"derive": true, ...} takes
 * them: margin (0: the class's), rounded_operands (-1: the class's),
 * format (NULL: none). */
typedef struct qc_tol_dump_opts {
  double margin;
  int rounded_operands;
  const char *format;
} qc_tol_dump_opts;

/* tol's --dump mode (tol_dump.c): every gradient of the module derived
 * exactly as vjp's {"derive": true} derives it (qc_audit_derive) under
 * dopt; the run is co->run. Returns the exit status. */
int qc_tol_dump(const qc_common_opts *co, const char *dump, const char *module, const qc_tol_dump_opts *dopt);

#endif
