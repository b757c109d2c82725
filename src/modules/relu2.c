/* modules/relu2.c: the production squared-ReLU VJP (Nemotron's routed
 * experts), closed form in float32.
 *
 *   forward  y = max(x, 0)^2
 *   d_x      dy * 2 max(x, 0)        (0 at x = 0 from both sides: no kink in y') */
#include <stdio.h>
#include <string.h>

#include "core/qc.h"
#include "model/module.h"
#include "modules/classes.h"
#include "modules/mod_util.h"

static float relu2_deriv(float x, int variant) {
  (void)variant;
  return x > 0.0f ? 2.0f * x : 0.0f;
}

static int relu2_vjp(const qc_ctx *ctx, const qc_module *m, const qc_tensor *dy, qc_tset *grads) {
  (void)ctx;
  return qc_mod_unary_vjp(m, dy, grads, relu2_deriv, 0);
}

/* The ReLU's side is taken from the unperturbed point (branch). */
static double relu2_fn(double x, double bx, int variant) {
  (void)variant;
  return bx > 0 ? x * x : 0.0;
}

static int relu2_forward(const qc_module *m, const qc_module *branch, qc_tensor *y) {
  return qc_mod_unary_forward(m, branch, y, relu2_fn, 0);
}

/* Generated relu2: [T, F], x ~ N(0,1) bf16 with exact zeros (see mod_util.h). */
static int relu2_generate(const qc_gen *gp, qc_rng *rng, qc_module *m, int *ondim, int64_t *oshape) {
  return qc_mod_unary_generate("relu2", gp, rng, m, ondim, oshape, 1.0);
}

/* The error model: elementwise, one float32 rounding (K = 1, lambda 1). */
static int relu2_tol_model(const qc_module *m, const qc_tensor *dy, const char *grad, qc_tol_model *tm) {
  (void)dy;
  if (strcmp(grad, "d_x") != 0) return qc_err("%s: class relu2 has no gradient '%s'", m->path, grad);
  qc_mod_tm(tm, 1, 1, 0, 0, "elementwise (K = 1): 2 relu(x) dY, one float32 rounding");
  return QC_OK;
}

static const qc_key_spec relu2_keys[] = {{NULL, NULL, NULL, NULL}};

const qc_class qc_class_relu2 = {
    .name = "relu2",
    .summary = "y = max(x, 0)^2: d_x",
    .tensors = "inputs/x outputs/y",
    .grads = "d_x",
    .shape_help = "[T, F]: tokens, features",
    .keys = relu2_keys,
    .generate = relu2_generate,
    .production = relu2_vjp,
    .not_checked = "",
    .forward = relu2_forward,
    .fd_shape = "9,21",
    .tol_model = relu2_tol_model,
    .validate = qc_mod_unary_validate,
    .hypotheses = "factor sign rows zero dy_precision nonfinite",
};
