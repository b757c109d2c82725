/* diagnose.h: what a failed check's signature says about the bug. Each
 * hypothesis that applies to the module's class (the generic ones its
 * qc_class lists in `hypotheses`, and its own `hyps` and `ratios`) predicts
 * the gradient the bug would produce; the candidate is compared with each
 * prediction against the noise level of a correct candidate. Runs for
 * failed checks only, at most one extra reference run per hypothesis. */
#ifndef QC_DIAGNOSE_H
#define QC_DIAGNOSE_H

#include "model/check.h"
#include "model/module.h"

/* Diagnose failed check k: candidate g (NULL when missing; any float
 * dtype), reference r (float64) of gradient k->tensor of module m under dY
 * dy; ref_names holds every gradient the reference computes (so a
 * hypothesis's reference run computes k->tensor alone); frozen lists the
 * gradients of parameters the dump marks frozen ("/d_weight/", or NULL).
 * Fills k->hyp, k->nhyp and k->diagnosis. A hypothesis that cannot be
 * tested is skipped, never an error: QC_OK, or QC_ESYS out of memory. */
int qc_diagnose(const qc_ctx *ctx, const qc_module *m, const qc_tensor *dy, const qc_tensor *g, const qc_tensor *r,
                const qc_tset *ref_names, const char *frozen, qc_check *k);

#endif
