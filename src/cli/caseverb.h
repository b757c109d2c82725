/* caseverb.h: the options of a host-only verb that takes `--case PATH` and
 * the common options (`sft`, `step`). */
#ifndef QC_CASEVERB_H
#define QC_CASEVERB_H

#include "cli/cli.h"

/* Parse argv: --help (help() printed: *done 1), --case, the common options.
 * --device must be cpu (`no_device` says why), --profile is refused
 * (`no_profile` says why). QC_OK with *case_path set, or QC_EINPUT. */
int qc_case_verb_opts(int argc, char **argv, const char *verb, void (*help)(void), const char *example, const char *no_device,
                      const char *no_profile, qc_common_opts *co, const char **case_path, int *done);

#endif
