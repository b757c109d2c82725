/* modules/layernorm.c: the production LayerNorm VJP. The math and the
 * float32 core are shared with rmsnorm (modules/rmsnorm.c, center = 1):
 *
 *   forward  y = (x - mean(x)) * rstd * w + b,  rstd = 1/sqrt(var(x) + eps)
 *   d_x      rstd * (g - mean(g) - xh * mean(g * xh)),  g = dy * w
 *   d_weight sum_t dy * xh;  d_bias sum_t dy (when params/bias exists) */
#include "model/module.h"
#include "modules/classes.h"
#include "modules/norm.h"

static int layernorm_tol_model(const qc_module *m, const qc_tensor *dy, const char *grad, qc_tol_model *tm) {
  return qc_mod_norm_tol_model(m, dy, grad, tm, 1);
}

/* Hypotheses: d_x without the projection term, or without the mean term. */
static int ln_no_proj(const qc_ctx *ctx, const qc_module *m, const qc_tensor *dy, const char *grad, const qc_tensor *cand, qc_tensor *pred,
                      char *detail, size_t n) {
  (void)ctx; (void)grad; (void)cand; (void)detail; (void)n;
  return qc_mod_norm_dx_without(m, dy, 1, 1, 0, pred);
}
static int ln_no_mean(const qc_ctx *ctx, const qc_module *m, const qc_tensor *dy, const char *grad, const qc_tensor *cand, qc_tensor *pred,
                      char *detail, size_t n) {
  (void)ctx; (void)grad; (void)cand; (void)detail; (void)n;
  return qc_mod_norm_dx_without(m, dy, 1, 0, 1, pred);
}

static const qc_hypothesis layernorm_hyps[] = {
    {"no_projection_term", "/d_x/", "d_x without the term -xh mean(g xh) (the gradient through rstd dropped)", NULL, 0,
     ln_no_proj, 0},
    {"no_mean_term", "/d_x/", "d_x without the term -mean(g) (the gradient through the mean dropped)", NULL, 0,
     ln_no_mean, 0},
    {NULL, NULL, NULL, NULL, 0, NULL, 0}};

static int layernorm_vjp(const qc_ctx *ctx, const qc_module *m, const qc_tensor *dy, qc_tset *grads) {
  return qc_mod_norm_vjp(ctx, m, dy, grads, 1);
}

static int layernorm_forward(const qc_module *m, const qc_module *branch, qc_tensor *y) {
  return qc_mod_norm_forward(m, branch, y, 1);
}

static int layernorm_generate(const qc_gen *gp, struct qc_rng *rng, qc_module *m, int *ondim, int64_t *oshape) {
  return qc_mod_norm_generate(gp, rng, m, ondim, oshape, 1);
}

static const qc_key_spec layernorm_keys[] = {
    {"eps", NULL, "1e-5", "added to the variance inside the square root"},
    {NULL, NULL, NULL, NULL}};

static int layernorm_validate(const qc_module *m, const qc_tensor *dy) { return qc_mod_norm_validate(m, dy, 1); }

const qc_class qc_class_layernorm = {
    .name = "layernorm",
    .summary = "y = (x - mean) / sqrt(var + eps) * w + b: d_x, d_weight, d_bias with float32 statistics",
    .tensors = "inputs/x params/weight params/bias outputs/y",
    .grads = "d_x d_weight d_bias",
    .shape_help = "[T, D] or [T, D, 0] (no bias): tokens, hidden size",
    .keys = layernorm_keys,
    .generate = layernorm_generate,
    .production = layernorm_vjp,
    .not_checked = "",
    .forward = layernorm_forward,
    .fd_shape = "7,33",
    .tol_model = layernorm_tol_model,
    .validate = layernorm_validate,
    .hypotheses = "factor sign rows zero dy_precision nonfinite",
    .hyps = layernorm_hyps,
};
