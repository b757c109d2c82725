/* reference/gelu.c: float64 GELU VJP, from the math.
 *   exact (erf):  d/dx [x Phi(x)] = Phi(x) + x phi(x),  phi(x) = exp(-x^2/2)/sqrt(2 pi)
 *   tanh:         u = sqrt(2/pi) (x + 0.044715 x^3), y = x (1 + tanh u)/2,
 *                 dy/dx = (1 + tanh u)/2 + x sech^2(u) u'(x) / 2,
 *                 u'(x) = sqrt(2/pi) (1 + 0.134145 x^2) */
#include <math.h>
#include <string.h>

#include "model/module.h"
#include "reference/ref_classes.h"
#include "reference/ref_util.h"

/* The derivative at x (variant bit 0: the tanh form); with QC_REFU_TERMS
 * the sum of its terms' magnitudes: 1 + tanh u (or 1 + erf) is a
 * difference for x < 0, so (1 + |tanh u|)/2 + |x sech^2 u u'|/2 (or
 * (1 + |erf|)/2 + |x| phi(x)): the derivative cancels near x = -0.75 and
 * below, and float32 leaves an absolute error of u times those terms. */
static double gelu_grad(double x, int variant) {
  const int tanh_form = variant & 1, ab = (variant & QC_REFU_TERMS) != 0;
  if (tanh_form) {
    const double r = sqrt(2.0 / M_PI), u = r * (x + 0.044715 * x * x * x), ch = cosh(u);
    const double sech2 = isfinite(ch) ? 1.0 / (ch * ch) : 0.0;
    if (ab) return 0.5 * (1.0 + fabs(tanh(u))) + 0.5 * fabs(x) * sech2 * r * (1.0 + 0.134145 * x * x);
    return 0.5 * (1.0 + tanh(u)) + 0.5 * x * sech2 * r * (1.0 + 0.134145 * x * x);
  }
  if (ab) return 0.5 * (1.0 + fabs(erf(x / M_SQRT2))) + fabs(x) * exp(-0.5 * x * x) / sqrt(2.0 * M_PI);
  return 0.5 * erfc(-x / M_SQRT2) + x * exp(-0.5 * x * x) / sqrt(2.0 * M_PI);
}

int qc_ref_gelu(const qc_ctx *ctx, const qc_module *m, const qc_tensor *dy, qc_tset *grads) {
  return qc_refu_pointwise(ctx, m, dy, grads, gelu_grad, strcmp(qc_contract_str(&m->contract, "approximate", "none"), "tanh") == 0);
}
