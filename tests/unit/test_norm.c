/* test_norm.c: rmsnorm and layernorm: the builtin (production) VJP agrees
 * with the float64 reference within the case tolerance over small and large
 * token counts, unaligned widths and special values; planted defects fail
 * naming the tensor; bad input is refused. */
#include <criterion/criterion.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "backend/backend.h"
#include "class_harness.h"
#include "core/qc.h"

#define NORM_TOL 2e-5 /* cases/rmsnorm.json, cases/layernorm.json */

static const char *shapes[] = {"1,4096", "127,1000", "1024,4096", "5,7"};

Test(rmsnorm, builtin_matches_reference) {
  const char *eps[] = {"eps=1e-5", NULL};
  const char *zc[] = {"zero_centered=true", NULL}; /* Gemma's (1 + w) */
  const char *const *sets[] = {NULL, eps, zc};
  h_sweep("rmsnorm", shapes, 4, sets, 3, 11, NORM_TOL, NORM_TOL);
}

Test(layernorm, builtin_matches_reference) {
  const char *const *sets[] = {NULL};
  const char *nobias[] = {"33,65,0"}; /* no params/bias: no d_bias */
  h_sweep("layernorm", shapes, 4, sets, 1, 21, NORM_TOL, NORM_TOL);
  h_sweep("layernorm", nobias, 1, sets, 1, 3, NORM_TOL, NORM_TOL);
}

/* Per-row statistics in float64: mu (0 when !center) and rstd. */
static void row_stats(const double *x, int64_t D, int center, double eps, double *mu, double *rstd) {
  double m = 0, v = 0;
  for (int64_t i = 0; center && i < D; i++) m += x[i] / (double)D;
  for (int64_t i = 0; i < D; i++) v += (x[i] - m) * (x[i] - m) / (double)D;
  *mu = m;
  *rstd = 1 / sqrt(v + eps);
}

/* Defect: d_x without the mean term, rstd * (dy * w) (or, for layernorm,
 * without the xh * mean(g xh) term, keeping the centering). */
static int norm_no_mean_term(const qc_ctx *ctx, const qc_module *m, const qc_tensor *dy, qc_tset *grads) {
  int rc = m->cls->production(ctx, m, dy, grads);
  if (rc) return rc;
  const qc_tensor *xt = qc_tset_get(&m->inputs, "x");
  const int center = strcmp(m->cls->name, "layernorm") == 0;
  double *x = h_f64(xt), *w = h_f64(qc_tset_get(&m->params, "weight")), *g = h_f64(dy);
  const int64_t D = xt->shape[1], R = xt->shape[0];
  for (int64_t r = 0; r < R; r++) {
    double mu, rstd, sg = 0;
    row_stats(x + r * D, D, center, qc_contract_num(&m->contract, "eps", 1e-6), &mu, &rstd);
    for (int64_t i = 0; i < D; i++) sg += g[r * D + i] * w[i] / (double)D;
    for (int64_t i = 0; i < D; i++) g[r * D + i] = rstd * (g[r * D + i] * w[i] - (center ? sg : 0));
  }
  h_set(grads, "d_x", g, R * D);
  free(x); free(w); free(g);
  return QC_OK;
}

/* Defect: d_weight from the raw x instead of the normalized xh. */
static int norm_dw_raw_x(const qc_ctx *ctx, const qc_module *m, const qc_tensor *dy, qc_tset *grads) {
  int rc = m->cls->production(ctx, m, dy, grads);
  if (rc) return rc;
  const qc_tensor *xt = qc_tset_get(&m->inputs, "x");
  double *x = h_f64(xt), *g = h_f64(dy);
  const int64_t D = xt->shape[1], R = xt->shape[0];
  double *dw = calloc((size_t)D, sizeof *dw);
  for (int64_t r = 0; r < R; r++)
    for (int64_t i = 0; i < D; i++) dw[i] += g[r * D + i] * x[r * D + i];
  h_set(grads, "d_weight", dw, D);
  free(x); free(g); free(dw);
  return QC_OK;
}

/* Defect: layernorm without d_bias. */
static int ln_drop_bias(const qc_ctx *ctx, const qc_module *m, const qc_tensor *dy, qc_tset *grads) {
  qc_module tmp = *m;
  qc_tset params = {0};
  qc_tensor w = {0};
  cr_assert_eq(qc_tensor_copy(&w, qc_tset_get(&m->params, "weight")), QC_OK);
  cr_assert_eq(qc_tset_add(&params, &w), QC_OK);
  tmp.params = params;
  int rc = m->cls->production(ctx, &tmp, dy, grads);
  qc_tset_free(&params);
  return rc;
}

/* d_x scaled by w where the contract's zero_centered scale is (1 + w) */
static int norm_zc_raw_w(const qc_ctx *ctx, const qc_module *m, const qc_tensor *dy, qc_tset *grads) {
  return h_prod_with(ctx, m, dy, grads, "zero_centered=false");
}

Test(rmsnorm, planted_defects_fail_naming_tensor) {
  h_inst in;
  h_make(&in, "rmsnorm", "127,1000", 5, "normal", NULL);
  h_expect_fail(&in, norm_no_mean_term, NORM_TOL, "d_x");
  h_expect_fail(&in, norm_dw_raw_x, NORM_TOL, "d_weight");
  h_free(&in);
  /* Gemma's zero-centred weight: a backward that scales by w, not 1 + w, fails on d_x */
  const char *zc[] = {"zero_centered=true", NULL};
  h_make(&in, "rmsnorm", "127,1000", 6, "normal", zc);
  h_expect_pass(&in, NORM_TOL);
  h_expect_fail(&in, norm_zc_raw_w, NORM_TOL, "d_x");
  h_free(&in);
}

Test(layernorm, planted_defects_fail_naming_tensor) {
  h_inst in;
  h_make(&in, "layernorm", "127,1000", 6, "normal", NULL);
  h_expect_fail(&in, norm_no_mean_term, NORM_TOL, "d_x");
  h_expect_fail(&in, norm_dw_raw_x, NORM_TOL, "d_weight");
  h_expect_fail(&in, ln_drop_bias, NORM_TOL, "missing d_bias");
  h_free(&in);
}

Test(rmsnorm, bad_input_is_refused) {
  h_inst in;
  h_make(&in, "rmsnorm", "4,8", 1, "normal", NULL);
  qc_tensor *w = qc_tset_get_mut(&in.m.params, "weight");
  w->shape[0] = 7; /* weight of the wrong length */
  h_expect_refused(&in, "params/weight");
  w->shape[0] = 8;
  in.dy.shape[1] = 7; /* dY of the wrong size */
  h_expect_refused(&in, "dY");
  in.dy.shape[1] = 8;
  h_free(&in);
}
