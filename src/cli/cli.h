/* cli.h: the verb signature and the small option parser every verb uses. */
#ifndef QC_CLI_H
#define QC_CLI_H

/* A verb: argv[0] is the verb name. Returns the exit status (0, 1, 2). */
typedef int (*qc_verb_fn)(int argc, char **argv);

typedef struct qc_verb {
  const char *name;
  qc_verb_fn fn;
  const char *help;   /* one line for `qatcheck --help` */
} qc_verb;

/* Options common to verbs, filled by qc_opt_common. */
typedef struct qc_common_opts {
  const char *json;     /* --json PATH */
  const char *junit;    /* --junit PATH */
  const char *markdown; /* --markdown PATH */
  const char *device;   /* --device cpu|cuda[:N] (default cpu) */
  const char *profile;  /* --profile NAME (default: the case's, else vllm) */
} qc_common_opts;

/* If argv[*i] is a common option (--json, --junit, --markdown, --device,
 * --profile, --quiet, --verbose), consume it (and its value) and return 1;
 * 0 if not one; -1 on a missing value (message set). */
int qc_opt_common(int argc, char **argv, int *i, qc_common_opts *o);
/* If argv[*i] is `--name VALUE` or `--name=VALUE`, set *val, advance, return
 * 1; 0 if not; -1 when the value is missing (message set). */
int qc_opt_value(int argc, char **argv, int *i, const char *name, const char **val);
/* 1 if argv[*i] is --help or -h. */
int qc_opt_help(const char *arg);
/* Print the common options' help block. */
void qc_common_help(void);

#endif
