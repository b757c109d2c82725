/* norm.h: the float32 core shared by the RMSNorm and LayerNorm classes
 * (modules/rmsnorm.c defines it; center = 1 is LayerNorm). Each function
 * is the class operation of the same name with the centering as an
 * argument, and returns QC_OK or a status with qc_err set. */
#ifndef QC_MODULES_NORM_H
#define QC_MODULES_NORM_H

#include <stdint.h>

#include "model/module.h"

int qc_mod_norm_vjp(const qc_ctx *ctx, const qc_module *m, const qc_tensor *dy, qc_tset *grads, int center);
int qc_mod_norm_forward(const qc_module *m, const qc_module *branch, qc_tensor *y, int center);
int qc_mod_norm_generate(const qc_gen *gp, struct qc_rng *rng, qc_module *m, int *ondim, int64_t *oshape, int center);
/* the class validate (qc_validate_fn): the view and dY, as the VJP refuses them */
int qc_mod_norm_validate(const qc_module *m, const qc_tensor *dy, int center);
int qc_mod_norm_tol_model(const qc_module *m, const qc_tensor *dy, const char *grad, qc_tol_model *tm, int center);
/* d_x in float64 with a term dropped (the diagnosis hypotheses): drop_proj
 * leaves out xh mean(g xh), drop_mean leaves out mean(g). */
int qc_mod_norm_dx_without(const qc_module *m, const qc_tensor *dy, int center, int drop_proj, int drop_mean,
                           qc_tensor *pred);

#endif
