/* ref_classes.h: what src/reference/ defines for the layers above it. Each
 * class's float64 reference is one file src/reference/<name>.c that
 * exports one object, `const qc_reference qc_reference_<name>` (its VJP,
 * optionally the forward the contract defines, and whether it gives the
 * terms' scale; model/module.h), its functions static. The class table
 * (src/classes/registry.c) declares it with QC_REFERENCE_DECLARE and pairs
 * it with its production class. Written from the math; never includes
 * src/modules/ (independence). */
#ifndef QC_REF_CLASSES_H
#define QC_REF_CLASSES_H

#include "model/module.h"

/* Declares class n's reference, qc_reference_<n> (src/reference/<n>.c):
 * the one declaration of every class's reference, expanded by the class
 * table's line. */
#define QC_REFERENCE_DECLARE(n) extern const qc_reference qc_reference_##n;

/* The RMSNorm (centered = 0) and LayerNorm (centered = 1) reference
 * together (reference/rmsnorm.c), on ctx's backend's device where it can. */
int qc_ref_norm(const qc_ctx *ctx, const qc_module *m, const qc_tensor *dy, qc_tset *grads, int centered);
/* Its two passes on be's device (reference/norm_dev.c): x [rows, n] and
 * dy as stored, W [n] the scale the forward applies; d_x [rows, n] (need
 * not be zeroed), d_weight [n] and d_bias [n] (or NULL) into the host's
 * arrays. QC_OK; QC_NA (no error set) where the device path is not taken:
 * the caller runs the host loops; or an error. */
int qc_ref_norm_dev(const struct qc_backend *be, const qc_tensor *xt, const qc_tensor *dy, const double *W, int centered,
                    double eps, double *dx, double *dw, double *db);
/* The logprob reference's rows on be's device (reference/logprob_dev.c):
 * logits lt [rows, V] as stored, gw [rows] each row's loss weight times
 * dY, id [rows] its token id or -1 (not counted: the row stays 0), K
 * vocab shards, temperature T, ab the terms' scale; d_logits [rows, V]
 * into the host's dl. QC_OK; QC_NA (no error set) where the device path is
 * not taken: the caller runs the host rows; or an error. */
int qc_ref_lp_dev(const struct qc_backend *be, const qc_tensor *lt, const double *gw, const int64_t *id, int64_t K, double T,
                  int ab, double *dl);

#endif
