/* test_conv1d.c: the builtin causal depthwise conv1d VJP (float32) against
 * the float64 reference: shapes with and without a bias, L = 1, K = 1,
 * special and heavy-tailed values; the index convention on a hand example
 * (tap K-1 reads the current step); planted defects in the production VJP
 * (the kernel flipped in d_x, d_weight one step late, d_bias summed over a
 * channels-first view of dy), each failing on its own tensor; fd; bad
 * input. */
#include <criterion/criterion.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend/backend.h"
#include "class_harness.h"
#include "modules/classes.h"
#include "core/qc.h"

#define CONV_TOL 4.68e-6 /* cases/conv1d.json d_weight, d_bias (B x L = 2048); d_x's is 2.15e-7 */
#define CONV_TOL_X 2.15e-7

/* src/modules/conv1d.c: the production VJP with a planted defect switched on
 * (qc_conv1d_vjp_defect, modules/classes.h) */
enum { CONV_OK = 0, CONV_FLIPPED = 1, CONV_SHIFT = 2, CONV_BIAS_AXIS = 3 };

Test(conv1d, builtin_matches_reference) {
  const char *shapes[] = {"1,1,8,4", "2,37,13,4", "3,50,7,3,0", "1,20,5,1", "2,9,6,9"};
  const char *dflt[] = {NULL};
  const char *const *sets[] = {dflt};
  h_sweep("conv1d", shapes, 5, sets, 1, 701, CONV_TOL, CONV_TOL);
}

static int d_ok(const qc_ctx *c, const qc_module *m, const qc_tensor *dy, qc_tset *g) {
  (void)c;
  return qc_conv1d_vjp_defect(m, dy, g, CONV_OK);
}
static int d_flipped(const qc_ctx *c, const qc_module *m, const qc_tensor *dy, qc_tset *g) {
  (void)c;
  return qc_conv1d_vjp_defect(m, dy, g, CONV_FLIPPED);
}
static int d_shift(const qc_ctx *c, const qc_module *m, const qc_tensor *dy, qc_tset *g) {
  (void)c;
  return qc_conv1d_vjp_defect(m, dy, g, CONV_SHIFT);
}
static int d_bias_axis(const qc_ctx *c, const qc_module *m, const qc_tensor *dy, qc_tset *g) {
  (void)c;
  return qc_conv1d_vjp_defect(m, dy, g, CONV_BIAS_AXIS);
}

/* h_expect_fail, logging the worst rel_l2 the defect reached */
static void expect_fail(h_inst *in, qc_vjp_fn cand, const char *what, const char *tensor) {
  char fail[256];
  double w;
  h_compare(in, cand, CONV_TOL, fail, sizeof fail, &w);
  cr_log_info("conv1d defect %-28s fails on %s, worst rel_l2 %.3g", what, fail, w);
  h_expect_fail(in, cand, CONV_TOL, tensor);
}

Test(conv1d, planted_defects_fail_naming_tensor) {
  h_inst in;
  char fail[256];
  double w;
  h_make(&in, "conv1d", "2,200,64,4", 11, "normal", NULL);
  cr_expect_eq(h_compare(&in, d_ok, CONV_TOL, fail, sizeof fail, &w), 1, "defect switch off fails on %s (%.3g)", fail, w);
  expect_fail(&in, d_flipped, "kernel flipped in d_x", "d_x");
  expect_fail(&in, d_shift, "d_weight one step late", "d_weight");
  expect_fail(&in, d_bias_axis, "d_bias over [B, C, L]", "d_bias");
  h_free(&in);
}

static uint16_t bf16_of(float f) {
  uint32_t u;
  memcpy(&u, &f, sizeof u);
  return (uint16_t)(u >> 16);
}

/* The index convention, by hand: C = 1, K = 3, L = 4, x = (1, 2, 3, 4),
 * weight = (w0, w1, w2). y_t = w0 x_{t-2} + w1 x_{t-1} + w2 x_t: a dY on
 * the last step gives d_weight = (x_1, x_2, x_3) = (2, 3, 4) and d_x =
 * (0, w0, w1, w2); a dY on step 0 gives d_weight = (0, 0, x_0) = (0, 0, 1)
 * and d_x = (w2, 0, 0, 0) (the padding reads nothing). The same in the
 * reference and the production VJP. */
Test(conv1d, index_convention_by_hand) {
  h_inst in;
  h_make(&in, "conv1d", "1,4,1,3", 3, "normal", NULL);
  qc_tensor *x = qc_tset_get_mut(&in.m.inputs, "x"), *wt = qc_tset_get_mut(&in.m.params, "weight");
  const float xs[4] = {1, 2, 3, 4}, ws[3] = {0.5f, -2.0f, 3.0f};
  for (int i = 0; i < 4; i++) ((uint16_t *)x->data)[i] = bf16_of(xs[i]);
  for (int i = 0; i < 3; i++) ((uint16_t *)wt->data)[i] = bf16_of(ws[i]);
  const double want_w[2][3] = {{2, 3, 4}, {0, 0, 1}};
  const double want_x[2][4] = {{0, 0.5, -2, 3}, {3, 0, 0, 0}};
  const int at[2] = {3, 0};
  qc_ctx ctx = {.be = qc_backend_cpu(), .profile = "vllm"};
  for (int c = 0; c < 2; c++) {
    float *dy = in.dy.data;
    for (int i = 0; i < 4; i++) dy[i] = i == at[c] ? 1.0f : 0.0f;
    for (int who = 0; who < 2; who++) {
      qc_tset g = {0};
      qc_vjp_fn f = who ? in.row->reference : in.row->cls->production;
      cr_assert_eq(f(&ctx, &in.m, &in.dy, &g), QC_OK, "%s", qc_err_msg());
      double *gw = h_f64(qc_tset_get(&g, "d_weight")), *gx = h_f64(qc_tset_get(&g, "d_x")), *gb = h_f64(qc_tset_get(&g, "d_bias"));
      for (int k = 0; k < 3; k++) cr_expect_eq(gw[k], want_w[c][k], "%s dY at %d: d_weight[%d] = %g", who ? "ref" : "prod", at[c], k, gw[k]);
      for (int s = 0; s < 4; s++) cr_expect_eq(gx[s], want_x[c][s], "%s dY at %d: d_x[%d] = %g", who ? "ref" : "prod", at[c], s, gx[s]);
      cr_expect_eq(gb[0], 1.0, "d_bias = sum of dY");
      free(gw); free(gx); free(gb);
      qc_tset_free(&g);
    }
  }
  h_free(&in);
}

Test(conv1d, fd_agrees) {
  static const char *const sets[][3] = {{NULL}};
  static const char *const shapes[] = {"2,9,5,4", "1,1,3,4", "1,12,2,1", "2,6,3,8"};
  h_fd_agrees("conv1d", shapes, 4, sets, 1, 41);
}

Test(conv1d, bad_input_is_refused) {
  h_inst in;
  h_make(&in, "conv1d", "2,10,6,4", 1, "normal", NULL);
  h_expect_pass(&in, CONV_TOL);
  qc_tensor *w = qc_tset_get_mut(&in.m.params, "weight"), *b = qc_tset_get_mut(&in.m.params, "bias");
  w->shape[0] = 5;
  h_expect_refused(&in, "params/weight");
  w->shape[0] = 6;
  b->shape[0] = 5;
  h_expect_refused(&in, "params/bias");
  b->shape[0] = 6;
  /* torch's [C, 1, K] layout is accepted; [C, 2, K] (not depthwise) is not */
  w->ndim = 3;
  w->shape[2] = 4;
  w->shape[1] = 1;
  h_expect_pass(&in, CONV_TOL);
  w->shape[1] = 2;
  w->shape[2] = 2;
  h_expect_refused(&in, "params/weight");
  h_free(&in);
}
