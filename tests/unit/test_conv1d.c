/* test_conv1d.c: the builtin causal depthwise conv1d VJP (float32) against
 * the float64 reference: shapes with and without a bias, L = 1, K = 1,
 * special and heavy-tailed values; the index convention on a hand example
 * (tap K-1 reads the current step); planted defects, each the production
 * VJP with one gradient replaced (the kernel flipped in d_x, d_weight one
 * step late, d_bias summed over a channels-first view of dy), each failing
 * on its own tensor; fd; bad input. */
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


Test(conv1d, builtin_matches_reference) {
  const char *shapes[] = {"1,1,8,4", "2,37,13,4", "3,50,7,3,0", "1,20,5,1", "2,9,6,9"};
  const char *dflt[] = {NULL};
  const char *const *sets[] = {dflt};
  h_sweep("conv1d", shapes, 5, sets, 1, 701, CONV_TOL, CONV_TOL);
}

/* The planted defects are the production VJP with one gradient taken from
 * its run on altered data: a trainer's slip the class must catch, built
 * from the production code without a switch in it. */

/* A copy of set s with tensor `name` altered by fn (row-major, elem bytes
 * an element, along its last dimension of n): the module a defect reads. */
static void altered(const qc_tset *s, const char *name, void (*fn)(uint8_t *row, int64_t n, size_t elem, int64_t rows),
                    qc_tset *out) {
  memset(out, 0, sizeof *out);
  for (int i = 0; i < s->n; i++) {
    qc_tensor t;
    cr_assert_eq(qc_tensor_copy(&t, &s->t[i]), QC_OK);
    if (strcmp(t.name, name) == 0) {
      const int64_t n = t.shape[t.ndim - 1];
      fn(t.data, n, qc_dtype_size(t.dtype), qc_numel(&t) / (n ? n : 1));
    }
    cr_assert_eq(qc_tset_add(out, &t), QC_OK);
  }
}

/* Each row's n elements reversed: weight[c, k] -> weight[c, K-1-k]. */
static void flip_rows(uint8_t *p, int64_t n, size_t elem, int64_t rows) {
  uint8_t tmp[16];
  for (int64_t r = 0; r < rows; r++)
    for (int64_t a = 0, b = n - 1; a < b; a++, b--) {
      uint8_t *x = p + (r * n + a) * elem, *y = p + (r * n + b) * elem;
      memcpy(tmp, x, elem);
      memcpy(x, y, elem);
      memcpy(y, tmp, elem);
    }
}

/* x [B, L, C] one step late: x'[b, t] = x[b, t-1], x'[b, 0] = 0 (here the
 * last dimension is C; L is read from the module). */
static int64_t g_shift_L;
static void shift_steps(uint8_t *p, int64_t C, size_t elem, int64_t rows) {
  const int64_t L = g_shift_L, row = C * (int64_t)elem;
  for (int64_t b = 0; b < rows / L; b++) {
    uint8_t *x = p + b * L * row;
    memmove(x + row, x, (size_t)((L - 1) * row));
    memset(x, 0, (size_t)row);
  }
}

/* The production VJP into g, then gradient `grad` replaced by the one the
 * production VJP gives on m with `name` of `set` altered by fn. */
static int with_altered(const qc_ctx *c, const qc_module *m, const qc_tensor *dy, qc_tset *g, int params, const char *name,
                        void (*fn)(uint8_t *, int64_t, size_t, int64_t), const char *grad) {
  int rc = m->cls->production(c, m, dy, g);
  if (rc) return rc;
  qc_module alt = *m; /* shallow but for the altered set */
  qc_tset *set = params ? &alt.params : &alt.inputs, a2 = {0};
  altered(params ? &m->params : &m->inputs, name, fn, set);
  if (!(rc = m->cls->production(c, &alt, dy, &a2))) {
    const qc_tensor *t = qc_tset_get(&a2, grad);
    double *d = h_f64(t);
    h_set(g, grad, d, qc_numel(t));
    free(d);
  }
  qc_tset_free(set);
  qc_tset_free(&a2);
  return rc;
}

/* d_x with the kernel flipped: a convolution where the forward is a correlation. */
static int d_flipped(const qc_ctx *c, const qc_module *m, const qc_tensor *dy, qc_tset *g) {
  return with_altered(c, m, dy, g, 1, "weight", flip_rows, "d_x");
}

/* d_weight reading x one step late (padding K-2 instead of K-1). */
static int d_shift(const qc_ctx *c, const qc_module *m, const qc_tensor *dy, qc_tset *g) {
  g_shift_L = qc_tset_get(&m->inputs, "x")->shape[1];
  return with_altered(c, m, dy, g, 0, "x", shift_steps, "d_weight");
}

/* d_bias summed as if dy were channels first [B, C, L] (float32, in order). */
static int d_bias_axis(const qc_ctx *c, const qc_module *m, const qc_tensor *dy, qc_tset *g) {
  int rc = m->cls->production(c, m, dy, g);
  if (rc) return rc;
  const int64_t B = dy->shape[0], L = dy->shape[1], C = dy->shape[2];
  double *y = h_f64(dy), *gb = malloc((size_t)C * sizeof *gb);
  cr_assert(gb);
  for (int64_t ch = 0; ch < C; ch++) {
    float acc = 0.0f;
    for (int64_t b = 0; b < B; b++)
      for (int64_t t = 0; t < L; t++) acc += (float)y[b * L * C + ch * L + t];
    gb[ch] = acc;
  }
  h_set(g, "d_bias", gb, C);
  free(y);
  free(gb);
  return QC_OK;
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
  cr_expect_eq(h_compare(&in, in.row->cls->production, CONV_TOL, fail, sizeof fail, &w), 1, "the production VJP fails on %s (%.3g)",
               fail, w);
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
