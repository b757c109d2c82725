/* reference/layernorm.c: the float64 LayerNorm VJP; the math is shared with
 * RMSNorm in reference/rmsnorm.c (centered = 1 adds the mean's Jacobian
 * term and d_bias). */
#include "model/module.h"
#include "reference/ref_classes.h"

int qc_ref_layernorm(const qc_ctx *ctx, const qc_module *m, const qc_tensor *dy, qc_tset *grads) {
  (void)ctx;
  return qc_ref_norm(m, dy, grads, 1);
}
