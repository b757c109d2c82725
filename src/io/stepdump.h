/* stepdump.h: the one-step update dump of `qatcheck step` (docs/layer3.md),
 * read into the model's arms (model/layer3.h). */
#ifndef QC_STEPDUMP_H
#define QC_STEPDUMP_H

#include "model/layer3.h"

/* Read the arm groups of step dump `path` (want[nwant]: the names to read;
 * nwant 0: every top-level group) and append them to *arms (realloc'd;
 * *narm counts). An arm already in *arms (from another file) is an error
 * naming both files. */
int qc_step_dump_read(const char *path, const char *const *want, int nwant, qc_step_arm **arms, int *narm);

#endif
