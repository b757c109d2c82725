/* caseverb.h: the options of a host-only verb that takes `--case PATH` and
 * the common options (`sft`, `step`). */
#ifndef QC_CASEVERB_H
#define QC_CASEVERB_H

#include "cli/cli.h"

/* What a case verb is: its name, its help (printed around the option
 * table it is given), the example for a missing --case, why --device cuda
 * and --profile do not apply. */
typedef struct qc_case_verb {
  const char *verb;
  void (*help)(const qc_opts *p);
  const char *example, *no_device, *no_profile;
} qc_case_verb;

/* Parse argv against --case and the common options: QC_OK with *case_path
 * set (or *done 1: --help printed), else QC_EINPUT with the message set.
 * --case is required, --device must be cpu, --profile is refused. */
int qc_case_verb_opts(const qc_case_verb *v, struct qc_run *run, int argc, char **argv, qc_common_opts *co,
                      const char **case_path, int *done);

#endif
