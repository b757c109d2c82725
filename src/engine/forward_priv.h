/* forward_priv.h: the forward the contract defines and its error models
 * (forward_ref.c), shared by the forward check (forward.c) and its
 * diagnosis (forward_diag.c), so neither calls the other for them.
 * Engine-private. */
#ifndef QC_FORWARD_PRIV_H
#define QC_FORWARD_PRIV_H

#include "engine/audit.h"
#include "model/module.h"

/* The forward the contract defines of m into *r (float64) with its error
 * model *tm: the class's reference forward fwd (with its model, or the
 * default one when it leaves tm->k 0), else its float64 forward when the
 * contract quantizes nothing (the default model: the reduction over the
 * last dimension of the input of the class's first gradient, or that
 * gradient's model run forward where its accumulation term is the larger;
 * bf16 compute roundings where the contract says so). QC_NA when neither
 * applies. */
int qc_fwd_reference(const qc_ctx *ctx, const qc_module *m, qc_fwd_ref_fn fwd, qc_tensor *r, qc_tol_model *tm);

/* Saved tensor `name` of m recomputed by the class's fn (its registry
 * row's `saved`) into *r with its error model *tm: the class's, or the
 * default one above where it leaves tm->k 0. QC_NA: not one fn recomputes. */
int qc_fwd_saved(const qc_ctx *ctx, const qc_module *m, qc_saved_ref_fn fn, const char *name, qc_tensor *r,
                 qc_tol_model *tm);

/* k: the check of saved tensor t of m (tensor "saved/<name>", dY
 * "forward", no tolerance, t's dtype as the candidate's), of kind `kind`;
 * the caller sets the verdict and why. */
void qc_fwd_saved_init(qc_check *k, const qc_module *m, const qc_tensor *t, const char *kind);
/* Saved selection t of m (integer ids; its name one of row->selected)
 * judged by the class's reference (row->select) into a check of a->res:
 * tensor saved/<name>, dY "forward", kind "selection", no metrics; it
 * fails when any row selects otherwise than the contract, naming how many
 * and the first, and says how many rows were ambiguous (taken either
 * way). QC_OK, or the reference's error. */
int qc_fwd_select_check(qc_audit *a, const qc_module *m, const qc_registry_row *row, const qc_tensor *t);

#endif
