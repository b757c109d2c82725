/* caseverb.c: options of the host-only case verbs (see caseverb.h). */
#include "cli/caseverb.h"

#include <string.h>

#include "core/qc.h"

int qc_case_verb_opts(const qc_case_verb *v, struct qc_run *run, int argc, char **argv, qc_common_opts *co,
                      const char **case_path, int *done) {
  *case_path = NULL;
  memset(co, 0, sizeof *co);
  co->run = run;
  qc_opt opts[] = {
      QC_OPT_STRING("case", case_path, "PATH", "the case file (docs/layer3.md)"),
      QC_OPTS_COMMON(co, QC_HELP_MARKDOWN | QC_HELP_CPU_ONLY),
      QC_OPT_END(),
  };
  qc_opts p = {.verb = v->verb, .opt = opts, .help = v->help, .run = run};
  int rc = qc_opts_parse(&p, argc, argv);
  qc_opts_free(&p);
  *done = p.done;
  if (rc || p.done) return rc;
  if (!*case_path) {
    qc_hint("%s", v->example);
    return qc_err("%s: option '--case' is required", v->verb);
  }
  if ((rc = qc_opt_cpu_only(v->verb, co->device, v->no_device))) return rc;
  if (co->profile) return qc_err("%s: '--profile' does not apply: %s", v->verb, v->no_profile);
  return QC_OK;
}
