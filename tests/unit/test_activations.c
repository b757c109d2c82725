/* test_activations.c: swiglu (with and without the clamp, both at_limit
 * choices), relu2 and gelu (erf, tanh): the builtin VJP against the float64
 * reference, planted defects, bad input. */
#include <criterion/criterion.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend/backend.h"
#include "class_harness.h"
#include "engine/fd.h"
#include "core/qc.h"

#define ACT_TOL 1e-6 /* cases/swiglu.json, relu2.json, gelu.json */

static const char *shapes[] = {"1,4096", "127,1000", "256,4096", "3,5"};

Test(swiglu, builtin_matches_reference) {
  const char *clamp[] = {"limit=7", NULL};
  const char *block[] = {"limit=7", "at_limit=block", NULL};
  const char *const *sets[] = {NULL, clamp, block};
  h_sweep("swiglu", shapes, 4, sets, 3, 41, ACT_TOL, ACT_TOL);
}

Test(relu2, builtin_matches_reference) {
  const char *const *sets[] = {NULL};
  h_sweep("relu2", shapes, 4, sets, 1, 51, ACT_TOL, ACT_TOL);
}

Test(gelu, builtin_matches_reference) {
  const char *tanh_[] = {"approximate=tanh", NULL};
  const char *const *sets[] = {NULL, tanh_};
  h_sweep("gelu", shapes, 4, sets, 2, 61, ACT_TOL, ACT_TOL);
}

/* Elementwise defect: replace d_<name> by dy * f(x) for one input. */
static void replace_pointwise(const qc_module *m, const qc_tensor *dy, qc_tset *grads, const char *in_name,
                              double (*f)(const qc_module *, int64_t i, const double *a, const double *b)) {
  const qc_tensor *a = qc_tset_get(&m->inputs, in_name);
  const qc_tensor *b = qc_tset_get(&m->inputs, strcmp(in_name, "gate") == 0 ? "up" : strcmp(in_name, "up") == 0 ? "gate" : "x");
  double *A = h_f64(a), *B = h_f64(b), *G = h_f64(dy);
  for (int64_t i = 0; i < qc_numel(a); i++) G[i] *= f(m, i, A, B);
  char name[64];
  snprintf(name, sizeof name, "d_%s", in_name);
  h_set(grads, name, G, qc_numel(a));
  free(A); free(B); free(G);
}

static double sig(double z) { return 1 / (1 + exp(-z)); }

/* swiglu: the clamp's derivative passed through (values clamped, masks not applied) */
static double up_grad_passthrough(const qc_module *m, int64_t i, const double *up, const double *gate) {
  (void)up;
  double L = qc_contract_num(&m->contract, "limit", 0), g = fmin(gate[i], L);
  return g * sig(g);
}
static int swiglu_clamp_passthrough(const qc_ctx *ctx, const qc_module *m, const qc_tensor *dy, qc_tset *grads) {
  int rc = m->cls->production(ctx, m, dy, grads);
  if (!rc) replace_pointwise(m, dy, grads, "up", up_grad_passthrough);
  return rc;
}

/* swiglu: silu'(z) taken as sigmoid(z) (the z s (1 - s) term dropped) */
static double gate_grad_sigmoid_only(const qc_module *m, int64_t i, const double *gate, const double *up) {
  (void)m;
  return up[i] * sig(gate[i]);
}
static int swiglu_silu_deriv_wrong(const qc_ctx *ctx, const qc_module *m, const qc_tensor *dy, qc_tset *grads) {
  int rc = m->cls->production(ctx, m, dy, grads);
  if (!rc) replace_pointwise(m, dy, grads, "gate", gate_grad_sigmoid_only);
  return rc;
}

/* swiglu: derivative 0 at exactly +-L although the contract says pass */
static int swiglu_blocks_at_limit(const qc_ctx *ctx, const qc_module *m, const qc_tensor *dy, qc_tset *grads) {
  return h_prod_with(ctx, m, dy, grads, "at_limit=block");
}

Test(swiglu, planted_defects_fail_naming_tensor) {
  const char *clamp[] = {"limit=7", NULL};
  h_inst in;
  h_make(&in, "swiglu", "127,1000", 8, "normal", clamp);
  h_expect_fail(&in, swiglu_clamp_passthrough, ACT_TOL, "d_up");
  h_expect_fail(&in, swiglu_silu_deriv_wrong, ACT_TOL, "d_gate");
  h_free(&in);
  /* at_limit: a trainer that blocks at exactly +-L under a pass contract */
  h_make(&in, "swiglu", "64,256", 9, "special", clamp);
  h_expect_fail(&in, swiglu_blocks_at_limit, ACT_TOL, "d_gate");
  h_free(&in);
}

/* relu2: d_x = dy * 1[x > 0] (the 2x of the square's derivative dropped) */
static double relu_step(const qc_module *m, int64_t i, const double *x, const double *unused) {
  (void)m; (void)unused;
  return x[i] > 0;
}
static int relu2_missing_2x(const qc_ctx *ctx, const qc_module *m, const qc_tensor *dy, qc_tset *grads) {
  int rc = m->cls->production(ctx, m, dy, grads);
  if (!rc) replace_pointwise(m, dy, grads, "x", relu_step);
  return rc;
}

/* relu2: 2x without the ReLU mask (negatives leak) */
static double two_x(const qc_module *m, int64_t i, const double *x, const double *unused) {
  (void)m; (void)unused;
  return 2 * x[i];
}
static int relu2_leaks_negatives(const qc_ctx *ctx, const qc_module *m, const qc_tensor *dy, qc_tset *grads) {
  int rc = m->cls->production(ctx, m, dy, grads);
  if (!rc) replace_pointwise(m, dy, grads, "x", two_x);
  return rc;
}

Test(relu2, planted_defects_fail_naming_tensor) {
  h_inst in;
  h_make(&in, "relu2", "127,1000", 10, "normal", NULL);
  h_expect_fail(&in, relu2_missing_2x, ACT_TOL, "d_x");
  h_expect_fail(&in, relu2_leaks_negatives, ACT_TOL, "d_x");
  h_free(&in);
}

/* gelu: the tanh form's derivative under an erf contract */
static int gelu_wrong_form(const qc_ctx *ctx, const qc_module *m, const qc_tensor *dy, qc_tset *grads) {
  return h_prod_with(ctx, m, dy, grads, "approximate=tanh");
}

/* gelu: Phi(x) alone (the x phi(x) term dropped) */
static double phi_only(const qc_module *m, int64_t i, const double *x, const double *unused) {
  (void)m; (void)unused;
  return 0.5 * erfc(-x[i] / sqrt(2.0));
}
static int gelu_missing_density_term(const qc_ctx *ctx, const qc_module *m, const qc_tensor *dy, qc_tset *grads) {
  int rc = m->cls->production(ctx, m, dy, grads);
  if (!rc) replace_pointwise(m, dy, grads, "x", phi_only);
  return rc;
}

Test(gelu, planted_defects_fail_naming_tensor) {
  h_inst in;
  h_make(&in, "gelu", "127,1000", 12, "normal", NULL);
  h_expect_fail(&in, gelu_wrong_form, ACT_TOL, "d_x");
  h_expect_fail(&in, gelu_missing_density_term, ACT_TOL, "d_x");
  h_free(&in);
}

Test(activations, bad_input_is_refused) {
  h_inst in;
  h_make(&in, "swiglu", "4,6", 1, "normal", NULL);
  qc_tensor *up = qc_tset_get_mut(&in.m.inputs, "up");
  up->shape[1] = 5;
  h_expect_refused(&in, "inputs/up");
  up->shape[1] = 6;
  cr_assert_eq(qc_fd_parse_set(&in.m.contract, "limit=-1"), QC_OK);
  h_expect_refused(&in, "limit");
  h_free(&in);
  h_make(&in, "gelu", "4,6", 1, "normal", NULL);
  qc_tset_free(&in.m.inputs); /* no inputs/x */
  h_expect_refused(&in, "inputs/x");
  h_free(&in);
}
