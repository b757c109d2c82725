/* reference/gelu.c: float64 GELU VJP, from the math.
 *   exact (erf):  d/dx [x Phi(x)] = Phi(x) + x phi(x),  phi(x) = exp(-x^2/2)/sqrt(2 pi)
 *   tanh:         u = sqrt(2/pi) (x + 0.044715 x^3), y = x (1 + tanh u)/2,
 *                 dy/dx = (1 + tanh u)/2 + x sech^2(u) u'(x) / 2,
 *                 u'(x) = sqrt(2/pi) (1 + 0.134145 x^2)
 * Variant ctx->round_ops (a bf16 model): the tanh form with every op in
 * bf16, as Debian's torch 1.13 computes bf16 gelu(approximate="tanh") and
 * its backward on the CPU (measured: all of 2^18 elements equal), with
 * b() a rounding to bf16 and its constants bf16 (beta = sqrt(2/pi),
 * kappa = 0.044715, 3 kappa):
 *   forward  x3 = b(b(x x) x), t = b(tanh(b(beta b(x + b(kappa x3))))),
 *            y = b(b(x / 2) b(1 + t))
 *   backward d = b(b(1 + t) / 2) + b(b(b(x / 2) b(1 - b(t t)))
 *                b(beta b(1 + b(b(3 kappa) b(x x))))), d_x = b(dy b(d))
 * For large x the exact y is just below x and rounds up to it: a
 * systematic error (bias z -5.9 on a tiny bf16 Gemma 2 at 2 x 4096
 * tokens) only the rounded arithmetic reproduces.
 * The erf form in bf16, as torch 1.13 computes it where oneDNN's bf16
 * path is off (GeluKernelImpl and GeluBackwardKernelImpl in
 * aten/src/ATen/native/cpu/Activation.cpp at v1.13.1, scalar_t BFloat16;
 * gelu_out_cpu in aten/src/ATen/native/Activation.cpp takes oneDNN only
 * where mkldnn_bf16_device_check() finds avx512bw, avx512vl and avx512dq;
 * measured on Debian's 1.13.1+dfsg-4, an AVX2 AMD
 * EPYC: all of 2^22 elements equal, forward and backward), constants
 * alpha = b(sqrt(1/2)) = 0.70703125 and beta = b(1/sqrt(2 pi)) =
 * 0.3984375 (1.3e-3 below; the derivative's bias z -55 at 4M elements
 * against the float64 reference):
 *   forward  y = b(b(x / 2) b(1 + b(erf(b(alpha x)))))
 *   backward c = b(b(1 + b(erf(b(alpha x)))) / 2),
 *            p = b(beta b(exp(b(b(x x) (-1/2))))), d = b(c + b(x p))
 * With oneDNN (AVX-512) the erf form is computed in float32 and rounded
 * once, which the bias test's q(r) already models. Torch 2 computes both
 * forms in float32. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "core/qc.h"
#include "model/module.h"
#include "numerics/formats.h"
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

static double bfr(double x) { return (double)qc_round_bf16((float)x); }

/* The tanh form with every op in bf16: y (fwd) or d (the derivative's
 * bf16 value) at x. */
static double gelu_tanh_bf16(double x, int fwd) {
  const double beta = bfr(sqrt(2.0 / M_PI)), kappa = bfr(0.044715), k3 = bfr(3.0 * kappa);
  const double xx = bfr(x * x), t = bfr(tanh(bfr(beta * bfr(x + bfr(kappa * bfr(xx * x)))))), half = bfr(0.5 * x);
  if (fwd) return bfr(half * bfr(1.0 + t));
  const double inner = bfr(beta * bfr(1.0 + bfr(k3 * xx)));
  return bfr(bfr(0.5 * bfr(1.0 + t)) + bfr(bfr(half * bfr(1.0 - bfr(t * t))) * inner));
}

/* The erf form with every op in bf16 (torch 1.13 without oneDNN): y (fwd)
 * or d (the derivative's bf16 value) at x. */
static double gelu_erf_bf16(double x, int fwd) {
  const double alpha = bfr(sqrt(0.5)), beta = bfr(1.0 / sqrt(2.0 * M_PI));
  const double one_erf = bfr(1.0 + bfr(erf(bfr(alpha * x))));
  if (fwd) return bfr(bfr(0.5 * x) * one_erf);
  const double c = bfr(0.5 * one_erf), p = bfr(beta * bfr(exp(bfr(bfr(x * x) * -0.5))));
  return bfr(c + bfr(x * p));
}

static int gelu_tanh(const qc_module *m) { return strcmp(qc_contract_str(&m->contract, "approximate", "none"), "tanh") == 0; }

/* Either form's bf16 derivative (the variant's grad for qc_refu_pointwise;
 * variant bit 0: the tanh form). */
static double gelu_grad_bf16(double x, int variant) { return variant & 1 ? gelu_tanh_bf16(x, 0) : gelu_erf_bf16(x, 0); }

/* The float64 VJP from the math above (a qc_vjp_fn): every gradient the contract makes
 * differentiable into grads; QC_EINPUT naming what is wrong with bad input. */
static int ref_gelu(const qc_ctx *ctx, const qc_module *m, const qc_tensor *dy, qc_tset *grads) {
  if (ctx && ctx->round_ops && !ctx->terms)
    return qc_refu_pointwise_dev(ctx, m, dy, grads, gelu_grad_bf16, QC_REFU_BF16 | gelu_tanh(m), QC_PW_GELU);
  return qc_refu_pointwise_dev(ctx, m, dy, grads, gelu_grad, gelu_tanh(m), QC_PW_GELU);
}

/* The forward y = gelu(x) in float64 (a qc_fwd_ref_fn), or under the
 * variant above; tm left zero: the engine takes the class's error model. */
static int ref_gelu_forward(const qc_ctx *ctx, const qc_module *m, qc_tensor *y, qc_tol_model *tm) {
  const qc_tensor *xt;
  int rc;
  memset(tm, 0, sizeof *tm);
  if ((rc = qc_module_need(m, "inputs", "x", 1, QC_MAXDIM, &xt))) return rc;
  const int tf = gelu_tanh(m), rb = ctx && ctx->round_ops && !ctx->terms;
  double *X = qc_refu_load(xt, "reference x");
  rc = QC_ESYS;
  if (!X) goto done;
  if ((rc = qc_tensor_alloc(y, "y", QC_F64, xt->ndim, xt->shape))) goto done;
  for (int64_t i = 0; i < qc_numel(xt); i++) {
    const double x = X[i];
    ((double *)y->data)[i] = rb   ? (tf ? gelu_tanh_bf16(x, 1) : gelu_erf_bf16(x, 1))
                             : tf ? 0.5 * x * (1.0 + tanh(sqrt(2.0 / M_PI) * (x + 0.044715 * x * x * x)))
                                  : 0.5 * x * erfc(-x / M_SQRT2);
  }
  rc = QC_OK;
done:
  free(X);
  return rc;
}

/* The class's reference, its one export (src/classes/registry.c pairs it
 * with src/modules/gelu.c). */
const qc_reference qc_reference_gelu = {.vjp = ref_gelu, .forward = ref_gelu_forward, .terms = 1};
