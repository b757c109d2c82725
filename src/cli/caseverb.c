/* caseverb.c: options of the host-only case verbs (see caseverb.h). */
#include "cli/caseverb.h"

#include <string.h>

#include "core/qc.h"

int qc_case_verb_opts(int argc, char **argv, const char *verb, void (*help)(void), const char *example, const char *no_device,
                      const char *no_profile, qc_common_opts *co, const char **case_path, int *done) {
  *done = 0;
  *case_path = NULL;
  memset(co, 0, sizeof *co);
  for (int i = 1; i < argc; i++) {
    int r;
    if (qc_opt_help(argv[i])) {
      help();
      *done = 1;
      return QC_OK;
    }
    if ((r = qc_opt_common(argc, argv, &i, co)) || (r = qc_opt_value(argc, argv, &i, "--case", case_path))) {
      if (r < 0) return QC_EINPUT;
      continue;
    }
    qc_hint("run 'qatcheck %s --help'", verb);
    return qc_err("%s: unknown option '%s'", verb, argv[i]);
  }
  if (!*case_path) {
    qc_hint("%s", example);
    return qc_err("%s: option '--case' is required", verb);
  }
  int rc = qc_opt_cpu_only(verb, co->device, no_device);
  if (rc) return rc;
  if (co->profile) return qc_err("%s: '--profile' does not apply: %s", verb, no_profile);
  return QC_OK;
}
