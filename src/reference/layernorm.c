/* reference/layernorm.c: the float64 LayerNorm VJP; the math is shared with
 * RMSNorm in reference/rmsnorm.c (centered = 1 adds the mean's Jacobian
 * term and d_bias). */
#include "model/module.h"
#include "reference/ref_classes.h"

/* The float64 VJP from the math above (a qc_vjp_fn): every gradient the contract makes
 * differentiable into grads; QC_EINPUT naming what is wrong with bad input. */
static int ref_layernorm(const qc_ctx *ctx, const qc_module *m, const qc_tensor *dy, qc_tset *grads) {
  return qc_ref_norm(ctx, m, dy, grads, 1);
}

/* The class's reference, its one export (src/classes/registry.c pairs it
 * with src/modules/layernorm.c). */
const qc_reference qc_reference_layernorm = {.vjp = ref_layernorm};
