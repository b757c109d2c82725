/* opts.c: option parsing shared by the verbs (see cli.h). */
#include <stdio.h>
#include <string.h>

#include "../qc.h"
#include "cli.h"

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
  return 0;
}

void qc_common_help(void) {
  printf("common options:\n"
         "  --json PATH        write the JSON report (atomically)\n"
         "  --junit PATH       write a JUnit XML report\n"
         "  --markdown PATH    write a Markdown report\n"
         "  --device DEV       cpu (default) or cuda[:N]\n"
         "  --profile NAME     quantizer profile (default: the contract's, else vllm)\n"
         "  --quiet            print nothing but errors\n"
         "  --verbose          print progress and memory use\n"
         "  --help             this text\n"
         "exit status: 0 every check passed (and at least one ran), 1 a check failed,\n"
         "             2 the run could not be judged (bad input, nothing to check)\n");
}
