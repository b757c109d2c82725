/* test_router.c: the builtin router VJP against the float64 reference
 * (softmax, sigmoid, sqrt_softplus; with and without normalization; ties;
 * a zero score among the selected), planted defects (ids recomputed in the
 * backward, the normalizer detached, the naive sqrt(softplus) derivative),
 * bad input; the selection check of saved/topk_ids (the reference against
 * the generator's ids, group-limited or not; moved ids). */
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

/* ---- group-limited routing with a score-correction bias (DeepSeek-V3's
 * noaux_tc): sigmoid scores, the bias and the group limit select, the
 * weights are the unbiased scores normalized over the k chosen, times the
 * routed scaling factor ---- */

static const char *const ds3[] = {"score=sigmoid", "normalize=yes", "route_scale=2.5", "n_group=8", "topk_group=2", NULL};

/* The plain top-k of score + bias (no group limit), ties to the lower index. */
static void plain_topk(const float *x, const float *b, int64_t E, int64_t k, int64_t *out) {
  double key[256];
  for (int64_t e = 0; e < E; e++) key[e] = 1 / (1 + exp(-(double)x[e])) + b[e];
  for (int64_t j = 0; j < k; j++) {
    int64_t best = -1;
    for (int64_t e = 0; e < E; e++)
      if (key[e] != -INFINITY && (best < 0 || key[e] > key[best])) best = e;
    out[j] = best;
    key[best] = -INFINITY;
  }
}

/* The group limit changes the selection: on most tokens the plain top-k of
 * score + bias spans more than topk_group groups, the generated ids never
 * do; both implementations agree on the group-limited ids. */
Test(router, group_limit_changes_selection) {
  h_inst in;
  h_make(&in, "router", "127,64,6", 21, "normal", ds3);
  const int64_t *id = qc_tset_get(&in.m.saved, "topk_ids")->data;
  const float *x = qc_tset_get(&in.m.inputs, "logits")->data, *b = qc_tset_get(&in.m.params, "bias")->data;
  int changed = 0;
  for (int64_t t = 0; t < 127; t++) {
    int64_t p[6], g0 = -1, g1 = -1, other = 0;
    plain_topk(x + t * 64, b, 64, 6, p);
    for (int j = 0; j < 6; j++) {
      int64_t g = id[t * 6 + j] / 8;
      if (g0 < 0 || g == g0) g0 = g;
      else if (g1 < 0 || g == g1) g1 = g;
      else other = 1;
    }
    cr_expect(!other, "token %lld: ids span more than 2 groups", (long long)t);
    int same = 1;
    for (int j = 0; j < 6; j++) same &= p[j] == id[t * 6 + j];
    changed += !same;
  }
  cr_log_info("router group limit: %d of 127 tokens select differently from the plain top-k", changed);
  cr_expect(changed > 10, "the group limit changed only %d selections", changed);
  h_expect_pass(&in, ROUTER_TOL);
  h_free(&in);
  const char *shapes[] = {"1,8,2", "127,64,6", "512,256,8"};
  const char *ds3b[] = {"score=sigmoid", "normalize=yes", "route_scale=2.5", "n_group=8", "topk_group=4", NULL};
  const char *const *sets[] = {ds3, ds3b};
  h_sweep("router", shapes, 3, sets, 2, 601, ROUTER_TOL, ROUTER_TOL);
}

/* Defect: the weights taken from the biased scores s + bias (the key that
 * selects) instead of s: w_j = c (s_j + b_j) / sum_i (s_i + b_i). */
static int router_biased_weights(const qc_ctx *ctx, const qc_module *m, const qc_tensor *dy, qc_tset *grads) {
  int rc = m->cls->production(ctx, m, dy, grads);
  if (rc) return rc;
  const qc_tensor *lt = qc_tset_get(&m->inputs, "logits"), *ids = qc_tset_get(&m->saved, "topk_ids");
  const int64_t T = lt->shape[0], E = lt->shape[1], k = ids->shape[1];
  const double c = qc_contract_num(&m->contract, "route_scale", 1);
  double *x = h_f64(lt), *g = h_f64(dy), *b = h_f64(qc_tset_get(&m->params, "bias")), *d = calloc((size_t)(T * E), sizeof *d);
  const int64_t *id = ids->data;
  for (int64_t r = 0; r < T; r++) {
    double D = 0, S = 0;
    for (int64_t j = 0; j < k; j++) {
      const int64_t e = id[r * k + j];
      const double sb = 1 / (1 + exp(-x[r * E + e])) + b[e];
      D += sb;
      S += g[r * k + j] * sb;
    }
    for (int64_t j = 0; j < k; j++) {
      const int64_t e = id[r * k + j];
      const double s = 1 / (1 + exp(-x[r * E + e]));
      d[r * E + e] = c * (g[r * k + j] / D - S / (D * D)) * s * (1 - s);
    }
  }
  h_set(grads, "d_logits", d, T * E);
  free(x); free(g); free(b); free(d);
  return QC_OK;
}

Test(router, biased_weights_fail) {
  h_inst in;
  h_make(&in, "router", "127,64,6", 22, "normal", ds3);
  char fail[256];
  double worst;
  h_compare(&in, router_biased_weights, ROUTER_TOL, fail, sizeof fail, &worst);
  cr_log_info("router defect biased_weights fails on %s, rel_l2 %.3g", fail, worst);
  h_expect_fail(&in, router_biased_weights, ROUTER_TOL, "d_logits");
  cr_expect(worst > 0.05, "biased weights: rel_l2 %g", worst);
  h_free(&in);
}

/* The reference's selection check (saved/topk_ids) on generated instances,
 * whose ids are the generator's top-k of score + bias (ties to the lower
 * index, group-limited where the contract says): every token agrees, under
 * each score, group score and tie rule (token 0's logits all tie, the bias
 * levels too); the same ids under another contract, or moved, differ. */
static qc_select_result router_select_of(h_inst *in) {
  qc_select_result r;
  memset(&r, 0, sizeof r);
  cr_assert_not_null(in->row->select);
  cr_assert_eq(in->row->select(NULL, &in->m, "topk_ids", &r), QC_OK, "%s", qc_err_msg());
  return r;
}

Test(router, selection_check_accepts_the_generators_ids) {
  const char *sg[] = {"score=sigmoid", "normalize=yes", "route_scale=2.5", "n_group=8", "topk_group=4", NULL};
  const char *sx[] = {"score=sigmoid", "n_group=8", "topk_group=3", "group_score=max", NULL};
  const char *sm[] = {"score=softmax", "tie_break=lowest_index", NULL};
  const char *sp[] = {"score=sqrt_softplus", "n_group=4", "topk_group=2", NULL};
  const char *const *sets[] = {sg, sx, sm, sp};
  for (int i = 0; i < 4; i++)
    for (int v = 0; v < 3; v++) {
      h_inst in;
      h_make(&in, "router", "97,64,6", 11 + (uint64_t)i, v == 0 ? "normal" : v == 1 ? "special" : "heavy_tail", sets[i]);
      qc_select_result r = router_select_of(&in);
      cr_expect_eq(r.rows, 97);
      cr_expect_eq(r.differ, 0, "set %d values %d: %lld tokens differ: %s", i, v, (long long)r.differ, r.first_says);
      h_free(&in);
    }
}

Test(router, selection_check_fails_wrong_ids) {
  const char *sg[] = {"score=sigmoid", "normalize=yes", "n_group=8", "topk_group=4", NULL};
  h_inst in;
  h_make(&in, "router", "97,64,6", 5, "normal", sg);
  /* the same ids under a contract without the group limit: the keys of the groups it cut now compete */
  qc_contract_set(&in.m.contract, "topk_group", "8", 8, 1);
  qc_select_result r = router_select_of(&in);
  cr_expect_gt(r.differ, 10, "ids group-limited to 4 of 8 groups judged under topk_group 8: %lld differ", (long long)r.differ);
  qc_contract_set(&in.m.contract, "topk_group", "4", 4, 1);
  /* token 5's last id moved to an expert of its first id's group that it did not select */
  int64_t *id = qc_tset_get(&in.m.saved, "topk_ids")->data;
  r = router_select_of(&in);
  cr_assert_eq(r.differ, 0, "%s", r.first_says);
  for (int64_t e = (id[5 * 6] / 8) * 8, done = 0; !done && e < (id[5 * 6] / 8 + 1) * 8; e++) {
    int used = 0;
    for (int j = 0; j < 6; j++) used |= id[5 * 6 + j] == e;
    if (!used) { id[5 * 6 + 5] = e; done = 1; }
  }
  r = router_select_of(&in);
  cr_expect_eq(r.differ, 1);
  cr_expect_eq(r.first, 5);
  cr_expect(strstr(r.first_says, "token 5 selects") != NULL, "%s", r.first_says);
  h_free(&in);
}

/* ids across more groups than topk_group are a selection the contract
 * cannot give: the selection check fails on them (the VJPs, whose ids are
 * fixed, still take them); a n_group that does not divide E is refused by
 * both implementations. */
Test(router, group_limit_bad_input_is_refused) {
  h_inst in;
  h_make(&in, "router", "3,8,2", 1, "normal", NULL);
  int64_t *id = qc_tset_get_mut(&in.m.saved, "topk_ids")->data;
  id[0] = 0;
  id[1] = 7; /* groups 0 and 3 of n_group = 4 */
  cr_assert_eq(qc_fd_parse_set(&in.m.contract, "n_group=4"), QC_OK);
  cr_assert_eq(qc_fd_parse_set(&in.m.contract, "topk_group=1"), QC_OK);
  qc_select_result r = router_select_of(&in);
  cr_expect_geq(r.differ, 1);
  cr_expect_eq(r.first, 0, "token 0 spans two groups: %s", r.first_says);
  cr_assert_eq(qc_fd_parse_set(&in.m.contract, "n_group=3"), QC_OK);
  h_expect_refused(&in, "n_group");
  h_free(&in);
}

/* A token whose logits hold a NaN has no selection to judge: it is counted
 * as not judged, never as differing or ambiguous. */
Test(router, selection_check_names_unjudged_tokens) {
  const char *sg[] = {"score=sigmoid", NULL};
  h_inst in;
  h_make(&in, "router", "9,16,3", 2, "normal", sg);
  float *x = qc_tset_get_mut(&in.m.inputs, "logits")->data;
  x[4 * 16 + 7] = NAN;
  qc_select_result r = router_select_of(&in);
  cr_expect_eq(r.unjudged, 1);
  cr_expect_eq(r.differ, 0, "%s", r.first_says);
  h_free(&in);
}
