/* modules/gelu.c: the production GELU VJP, closed form in float32.
 *
 *   approximate = none:  y = x Phi(x),  d_x = dy (Phi(x) + x phi(x))
 *   approximate = tanh:  y = x/2 (1 + tanh(k (x + 0.044715 x^3))), k = sqrt(2/pi)
 *                        d_x = dy (1/2 (1 + t) + x/2 (1 - t^2) k (1 + 3 * 0.044715 x^2)) */
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "core/qc.h"
#include "model/module.h"
#include "modules/classes.h"
#include "modules/mod_util.h"

static float gelu_deriv(float x, int tanh_approx) {
  if (tanh_approx) {
    const float k = 0.7978845608028654f, c = 0.044715f;
    float t = tanhf(k * (x + c * x * x * x));
    return 0.5f * (1.0f + t) + 0.5f * x * (1.0f - t * t) * k * (1.0f + 3.0f * c * x * x);
  }
  float cdf = 0.5f * (1.0f + erff(x * 0.70710678118654752f));
  return cdf + x * 0.3989422804014327f * expf(-0.5f * x * x);
}

static int gelu_variant(const qc_module *m) { return strcmp(qc_contract_str(&m->contract, "approximate", "none"), "tanh") == 0; }

static int gelu_vjp(const qc_ctx *ctx, const qc_module *m, const qc_tensor *dy, qc_tset *grads) {
  (void)ctx;
  return qc_mod_unary_vjp(m, dy, grads, gelu_deriv, gelu_variant(m));
}

static double gelu_fn(double x, double bx, int tanh_approx) {
  (void)bx;
  if (tanh_approx) return 0.5 * x * (1.0 + tanh(sqrt(2.0 / M_PI) * (x + 0.044715 * x * x * x)));
  return 0.5 * x * erfc(-x / sqrt(2.0));
}

static int gelu_forward(const qc_module *m, const qc_module *branch, qc_tensor *y) {
  return qc_mod_unary_forward(m, branch, y, gelu_fn, gelu_variant(m));
}

/* The error model: elementwise float32 (K = 1), ~6 roundings plus erff and
 * expf (<= 2 ulp each): lambda 4. */
static int gelu_tol_model(const qc_module *m, const qc_tensor *dy, const char *grad, qc_tol_model *tm) {
  (void)dy;
  if (strcmp(grad, "d_x") != 0) return qc_err("%s: class gelu has no gradient '%s'", m->path, grad);
  qc_mod_tm(tm, 1, 4, 0, 0, "elementwise (K = 1): Phi(x) + x phi(x) in float32, ~6 roundings plus erff and expf; lambda 4");
  return QC_OK;
}

/* Hypothesis: the other GELU form (tanh approximation for exact, or the reverse). */
static int gelu_other_form(const qc_module *m, qc_module *alt, char *detail, size_t n) {
  int tanh_ = gelu_variant(m);
  snprintf(detail, n, "the contract says approximate = %s", tanh_ ? "tanh" : "none");
  return qc_contract_set(&alt->contract, "approximate", tanh_ ? "none" : "tanh", 0, 0);
}

static const qc_hypothesis gelu_hyps[] = {
    {"other_form", "/d_x/", "the other GELU form (tanh approximation vs exact erf)", gelu_other_form, 0, NULL, 0},
    {NULL, NULL, NULL, NULL, 0, NULL, 0}};

/* Generated gelu: [T, F], x ~ 2 N(0,1) bf16 with exact zeros (see mod_util.h). */
static int gelu_generate(const qc_gen *gp, qc_rng *rng, qc_module *m, int *ondim, int64_t *oshape) {
  return qc_mod_unary_generate("gelu", gp, rng, m, ondim, oshape, 2.0);
}

static const qc_key_spec gelu_keys[] = {
    {"approximate", "none|tanh", "none", "none: exact erf GELU; tanh: the tanh approximation"},
    {NULL, NULL, NULL, NULL}};

const qc_class qc_class_gelu = {
    .name = "gelu",
    .summary = "y = x Phi(x) (erf) or its tanh approximation: d_x",
    .tensors = "inputs/x outputs/y",
    .grads = "d_x",
    .shape_help = "[T, F]: tokens, features",
    .keys = gelu_keys,
    .generate = gelu_generate,
    .production = gelu_vjp,
    .not_checked = "",
    .forward = gelu_forward,
    .fd_shape = "9,21",
    .tol_model = gelu_tol_model,
    .validate = qc_mod_unary_validate,
    .round_ops = 1, /* reference variant: every op in bf16 (torch 1.13 on the CPU) */
    .hypotheses = "factor sign rows zero dy_precision nonfinite",
    .hyps = gelu_hyps,
};
