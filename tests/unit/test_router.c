/* test_router.c: the builtin router VJP against the float64 reference
 * (softmax, sigmoid, sqrt_softplus; with and without normalization; ties;
 * a zero score among the selected), planted defects (ids recomputed in the
 * backward, the normalizer detached, the naive sqrt(softplus) derivative),
 * bad input. */
#include <criterion/criterion.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "backend/backend.h"
#include "class_harness.h"
#include "engine/fd.h"
#include "core/qc.h"

#define ROUTER_TOL 2e-6 /* cases/router.json */

Test(router, builtin_matches_reference) {
  const char *shapes[] = {"1,8,2", "127,64,6", "4096,256,8", "5,4,4"};
  const char *sm[] = {"score=softmax", NULL};
  const char *smn[] = {"score=softmax", "normalize=yes", NULL};
  const char *sg[] = {"score=sigmoid", "normalize=yes", "route_scale=2.5", NULL};
  const char *sp[] = {"score=sqrt_softplus", "normalize=yes", NULL};
  const char *const *sets[] = {sm, smn, sg, sp};
  h_sweep("router", shapes, 4, sets, 4, 81, ROUTER_TOL, ROUTER_TOL);
}

/* The generator plants a tie (token 0: all logits equal; ties go to the
 * lower index) and a zero score among token 1's selected experts. */
Test(router, generator_plants_ties_and_zero_score) {
  const char *sg[] = {"score=sigmoid", NULL};
  h_inst in;
  h_make(&in, "router", "4,8,3", 3, "normal", sg);
  const int64_t *id = qc_tset_get(&in.m.saved, "topk_ids")->data;
  const float *x = qc_tset_get(&in.m.inputs, "logits")->data, *b = qc_tset_get(&in.m.params, "bias")->data;
  /* all scores tie: the order is bias descending, then the lower index */
  int used[8] = {0};
  for (int j = 0; j < 3; j++) {
    int best = -1;
    for (int e = 0; e < 8; e++)
      if (!used[e] && (best < 0 || b[e] > b[best])) best = e;
    used[best] = 1;
    cr_expect_eq(id[j], best, "token 0 pick %d: expected expert %d, got %lld", j, best, (long long)id[j]);
  }
  for (int e = 1; e < 8; e++) cr_expect_eq(x[e], x[0]);
  int zero = 0;
  for (int j = 0; j < 3; j++) zero |= id[3 + j] == 0 && 1 / (1 + exp(-(double)x[8])) == 0;
  cr_expect(zero, "token 1 selects expert 0 whose score is 0");
  h_free(&in);
}

/* The candidate re-ran top-k in the backward, without the selection bias:
 * the gradient flows to experts the forward did not pick. */
static int router_ids_recomputed(const qc_ctx *ctx, const qc_module *m, const qc_tensor *dy, qc_tset *grads) {
  qc_module tmp = *m;
  qc_tset saved = {0};
  const qc_tensor *ids = qc_tset_get(&m->saved, "topk_ids"), *lt = qc_tset_get(&m->inputs, "logits");
  qc_tensor t = {0};
  cr_assert_eq(qc_tensor_copy(&t, ids), QC_OK);
  const int64_t T = lt->shape[0], E = lt->shape[1], k = ids->shape[1];
  double *x = h_f64(lt);
  for (int64_t r = 0; r < T; r++)
    for (int64_t j = 0; j < k; j++) {
      int64_t best = -1;
      for (int64_t e = 0; e < E; e++)
        if (x[r * E + e] > -INFINITY && (best < 0 || x[r * E + e] > x[r * E + best])) best = e;
      ((int64_t *)t.data)[r * k + j] = best;
      x[r * E + best] = -INFINITY;
    }
  free(x);
  cr_assert_eq(qc_tset_add(&saved, &t), QC_OK);
  tmp.saved = saved;
  int rc = m->cls->production(ctx, &tmp, dy, grads);
  qc_tset_free(&saved);
  return rc;
}

/* normalize = yes, but the denominator treated as a constant (detached) */
static int router_denominator_detached(const qc_ctx *ctx, const qc_module *m, const qc_tensor *dy, qc_tset *grads) {
  int rc = m->cls->production(ctx, m, dy, grads);
  if (rc) return rc;
  const qc_tensor *lt = qc_tset_get(&m->inputs, "logits"), *ids = qc_tset_get(&m->saved, "topk_ids");
  const int64_t T = lt->shape[0], E = lt->shape[1], k = ids->shape[1];
  double *x = h_f64(lt), *g = h_f64(dy), *d = calloc((size_t)(T * E), sizeof *d);
  const int64_t *id = ids->data;
  for (int64_t r = 0; r < T; r++) {
    double D = 0;
    for (int64_t j = 0; j < k; j++) D += 1 / (1 + exp(-x[r * E + id[r * k + j]]));
    for (int64_t j = 0; j < k; j++) {
      double s = 1 / (1 + exp(-x[r * E + id[r * k + j]]));
      d[r * E + id[r * k + j]] = g[r * k + j] / D * s * (1 - s);
    }
  }
  h_set(grads, "d_logits", d, T * E);
  free(x); free(g); free(d);
  return QC_OK;
}

/* sqrt(softplus) differentiated naively: sigma(x) / (2 sqrt(softplus(x)))
 * in float32 with no guard, NaN where the score underflows to 0 */
static int router_naive_sqrt(const qc_ctx *ctx, const qc_module *m, const qc_tensor *dy, qc_tset *grads) {
  int rc = m->cls->production(ctx, m, dy, grads);
  if (rc) return rc;
  const qc_tensor *lt = qc_tset_get(&m->inputs, "logits");
  qc_tensor *d = qc_tset_get_mut(grads, "d_logits");
  const float *x = lt->data;
  float *dd = d->data;
  for (int64_t i = 0; i < qc_numel(lt); i++) {
    float s = sqrtf(log1pf(expf(x[i])));
    if (s == 0.0f) dd[i] = dd[i] * (1.0f / (1.0f + expf(-x[i]))) / (2.0f * s); /* 0 * 0/0 */
  }
  return QC_OK;
}

Test(router, planted_defects_fail_naming_tensor) {
  const char *sm[] = {"score=softmax", NULL};
  const char *sg[] = {"score=sigmoid", "normalize=yes", NULL};
  const char *sp[] = {"score=sqrt_softplus", "normalize=yes", NULL};
  h_inst in;
  h_make(&in, "router", "127,64,6", 15, "normal", sm);
  h_expect_fail(&in, router_ids_recomputed, ROUTER_TOL, "d_logits");
  h_free(&in);
  h_make(&in, "router", "127,64,6", 16, "normal", sg);
  h_expect_fail(&in, router_denominator_detached, ROUTER_TOL, "d_logits");
  h_free(&in);
  h_make(&in, "router", "127,64,6", 17, "normal", sp);
  h_expect_fail(&in, router_naive_sqrt, ROUTER_TOL, "d_logits");
  h_free(&in);
}

Test(router, bad_input_is_refused) {
  h_inst in;
  h_make(&in, "router", "3,6,2", 1, "normal", NULL);
  int64_t *id = qc_tset_get_mut(&in.m.saved, "topk_ids")->data, keep = id[1];
  id[1] = id[0]; /* the same expert twice */
  h_expect_refused(&in, "topk_ids");
  id[1] = 6; /* out of range */
  h_expect_refused(&in, "topk_ids");
  id[1] = keep;
  h_free(&in);
}
