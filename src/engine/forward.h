/* forward.h: the forward check. Where a module's dump holds its output
 * (outputs/y), the forward the contract defines is recomputed (the class's
 * reference forward: quantizer formats, profile, rounding; else, for a
 * contract that quantizes nothing, the class's float64 forward) and the
 * output judged against it before any gradient, under a tolerance derived
 * from the output's dtype and the forward's arithmetic. A failed forward
 * is diagnosed: another profile or format (scale granularity), a stale
 * per-tensor scale, inputs rounded before their quantizer, a factor, moved
 * rows; the best fit first. */
#ifndef QC_FORWARD_H
#define QC_FORWARD_H

#include "engine/audit.h"

/* Add module m's forward check to a->res (tensor "y", dY "forward", kind
 * forward) when m holds a float outputs/y and its forward can be computed
 * (shape as the forward's); nothing otherwise. Then, for a dump, a check
 * of each saved tensor: a float one against the class's recomputation, an
 * integer one its reference judges as a selection (router's topk_ids:
 * kind "selection", forward_select.c). QC_OK, or an error of the
 * reference forward (QC_EINPUT: the module cannot be judged). */
int qc_forward_check(qc_audit *a, const qc_module *m);

/* Diagnose failed forward check k: candidate y against reference r
 * (float64) of module m, fwd the class's reference forward (NULL: none, so
 * only the predictions from r). Fills k's hypotheses and diagnosis. QC_OK,
 * or QC_ESYS out of memory. */
int qc_diagnose_forward(const qc_ctx *ctx, const qc_module *m, const qc_tensor *y, const qc_tensor *r, qc_fwd_ref_fn fwd,
                        qc_check *k);

/* Diagnose failed check k of saved tensor t against its recomputation r
 * (float64): the generic predictions only (a factor, such as log2(e) for
 * an LSE in the other base; moved or zeroed rows), since the class's
 * hypotheses predict outputs/y. QC_OK, or QC_ESYS out of memory. */
int qc_diagnose_saved(const qc_ctx *ctx, const qc_module *m, const qc_tensor *t, const qc_tensor *r, qc_check *k);

#endif
