/* reference/relu2.c: float64 VJP of y = relu(x)^2: d_x = 2 relu(x) dy
 * (the derivative is continuous; it is 0 at x = 0). The terms' scale: one
 * product, |d_x| itself. */
#include "model/module.h"
#include "reference/ref_classes.h"
#include "reference/ref_util.h"

static double relu2_grad(double x, int variant) {
  (void)variant; /* the terms' magnitude is the value itself (x > 0) */
  return x <= 0 ? 0.0 : x + x;
}

/* The float64 VJP from the math above (a qc_vjp_fn): every gradient the contract makes
 * differentiable into grads; QC_EINPUT naming what is wrong with bad input. */
static int ref_relu2(const qc_ctx *ctx, const qc_module *m, const qc_tensor *dy, qc_tset *grads) {
  return qc_refu_pointwise(ctx, m, dy, grads, relu2_grad, 0);
}

/* The class's reference, its one export (src/classes/registry.c pairs it
 * with src/modules/relu2.c). */
const qc_reference qc_reference_relu2 = {.vjp = ref_relu2, .terms = 1};
