/* test_moe.c: the builtin routed-experts VJP against the float64 reference
 * (swiglu with and without the clamp, relu2; an empty expert, repeated
 * routing, tied weights), what the generator plants, planted defects (a
 * wrong inverse permutation, repeated-token contributions overwritten, no
 * d_topk_weights, relu's derivative under relu2), and bad input. */
#include <criterion/criterion.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend/backend.h"
#include "class_harness.h"
#include "engine/fd.h"
#include "model/modinfo.h"
#include "model/sink.h"
#include "core/qc.h"

/* The unit tests' dY is float32 N(0,1), which the production rounds to bf16
 * (one more operand rounding than the shipped cases, whose dY is bf16): 3
 * operands at u/sqrt(3) each, sqrt(3) x 2.26e-3 = 3.9e-3 rms, with margin 3
 * as the cases' d_topk_weights: each of its elements is one length-H dot
 * with random-signed dY (cancellation), and small shapes have few of them
 * (measured up to 8.9e-3 at [5, 64, 32, 3, 3]: 15 elements). The planted
 * defects below are off by 0.1 or more. */
#define MOE_TOL 1.2e-2

Test(moe, builtin_matches_reference) {
  const char *shapes[] = {"1,64,32,16,8", "37,96,48,9,4", "5,64,32,3,3", "64,128,40,6,2"};
  const char *sw[] = {NULL};
  const char *swc[] = {"limit=7", NULL};
  const char *swb[] = {"limit=2", "at_limit=block", NULL};
  const char *r2[] = {"activation=relu2", NULL};
  const char *const *sets[] = {sw, swc, swb, r2};
  h_sweep("moe", shapes, 4, sets, 4, 301, MOE_TOL, MOE_TOL);
}

/* The generator plants an empty expert (E/2, in the middle: the first and
 * the last experts are used), repeated routing (tokens 1, 5, ...: slot 1 =
 * slot 0) and tied weights (token 0: 1/k each). */
Test(moe, generator_plants_empty_expert_repeats_and_ties) {
  h_inst in;
  h_make(&in, "moe", "9,16,8,5,3", 7, "normal", NULL);
  const int64_t *id = qc_tset_get(&in.m.saved, "topk_ids")->data;
  const float *w = qc_tset_get(&in.m.inputs, "topk_weights")->data;
  int used_last = 0, used_first = 0;
  for (int i = 0; i < 9 * 3; i++) {
    cr_expect(id[i] >= 0 && id[i] < 5 && id[i] != 2, "id %lld in 0..4 but not 2 (expert 2 empty)", (long long)id[i]);
    used_last |= id[i] == 4;
    used_first |= id[i] == 0;
  }
  cr_expect(used_first && used_last, "the first and the last expert are routed to");
  cr_expect_eq(id[3], id[4], "token 1 routed twice to one expert");
  cr_expect_eq(id[15], id[16], "token 5 routed twice to one expert");
  cr_expect(w[0] == w[1] && w[1] == w[2], "token 0 has tied weights");
  double s = w[3] + w[4] + w[5];
  cr_expect(fabs(s - 1) < 1e-6, "token 1's weights are softmax-normalized (sum %g)", s);
  /* the empty expert's gradients are exactly zero in both implementations */
  qc_ctx ctx = {.be = qc_backend_cpu(), .profile = "vllm"};
  qc_tset a = {0}, b = {0};
  cr_assert_eq(in.row->reference(&ctx, &in.m, &in.dy, &a), QC_OK);
  cr_assert_eq(in.row->cls->production(&ctx, &in.m, &in.dy, &b), QC_OK);
  const double *ra = qc_tset_get(&a, "d_w1")->data;
  const float *pb = qc_tset_get(&b, "d_w1")->data;
  const int64_t per = 16 * 16;
  for (int64_t i = 2 * per; i < 3 * per; i++) cr_expect(ra[i] == 0 && pb[i] == 0);
  qc_tset_free(&a);
  qc_tset_free(&b);
  h_free(&in);
}

/* The terms' scale with only its norm read (ctx.terms 2): d_w1 and d_w2
 * come as each expert's block's norm [E] (the shared ones [1]) from the
 * rows' Gram matrices, and each equals the norm of the block the full
 * terms run (ctx.terms 1) makes, to rounding; an empty expert's is 0; the
 * other gradients are the same tensors. Shapes: an empty expert (9 tokens),
 * the Gram path (few rows an expert) and the shared experts' block path
 * (64 tokens, more than the Gram saves at H = 128). */
Test(moe, terms_norms_equal_the_blocks_norms) {
  const char *sh[] = {"shared_experts=2", NULL};
  const char *qw[] = {"shared_experts=1", "shared_gate=true", "limit=7", NULL};
  const char *r2[] = {"activation=relu2", NULL};
  const struct { const char *shape; const char *const *sets; } cs[] = {
      {"9,16,8,5,3", NULL}, {"64,128,40,6,2", sh}, {"37,96,48,9,4", qw}, {"64,128,40,6,2", r2}};
  static const char *const names[] = {"d_w1", "d_w2", "d_shared_w1", "d_shared_w2"};
  for (size_t c = 0; c < sizeof cs / sizeof cs[0]; c++) {
    h_inst in;
    h_make(&in, "moe", cs[c].shape, 11 + c, "normal", cs[c].sets);
    qc_ctx full = {.be = qc_backend_cpu(), .profile = "vllm", .terms = 1}, nrm = full;
    nrm.terms = 2;
    qc_tset a = {0}, b = {0};
    cr_assert_eq(in.row->reference(&full, &in.m, &in.dy, &a), QC_OK, "%s", qc_err_msg());
    cr_assert_eq(in.row->reference(&nrm, &in.m, &in.dy, &b), QC_OK, "%s", qc_err_msg());
    cr_assert_eq(a.n, b.n, "%s: the same gradients", cs[c].shape);
    for (int i = 0; i < a.n; i++) {
      const qc_tensor *ta = &a.t[i], *tb = qc_tset_get(&b, ta->name);
      cr_assert(tb, "%s: %s under terms 2", cs[c].shape, ta->name);
      int blocks = -1;
      for (int j = 0; j < 4; j++) blocks = strcmp(ta->name, names[j]) == 0 ? j : blocks;
      if (blocks < 0) { /* d_x, d_topk_weights, d_shared_gate: the same */
        cr_assert(qc_shape_eq(ta, tb) && memcmp(ta->data, tb->data, ta->nbytes) == 0, "%s: %s", cs[c].shape, ta->name);
        continue;
      }
      const int64_t nb = blocks < 2 ? ta->shape[0] : 1, per = qc_numel(ta) / nb;
      cr_assert(tb->ndim == 1 && tb->shape[0] == nb, "%s: %s is [%lld]", cs[c].shape, ta->name, (long long)nb);
      const double *x = ta->data, *y = tb->data;
      int zero = 0;
      for (int64_t e = 0; e < nb; e++) {
        double ss = 0;
        for (int64_t q = 0; q < per; q++) ss += x[e * per + q] * x[e * per + q];
        zero += ss == 0;
        cr_expect(fabs(y[e] - sqrt(ss)) <= 1e-13 * sqrt(ss) && (ss > 0 || y[e] == 0), "%s: %s block %lld: %.17g, the block's %.17g",
                  cs[c].shape, ta->name, (long long)e, y[e], sqrt(ss));
      }
      if (c == 0 && blocks < 2) cr_expect_eq(zero, 1, "%s: the empty expert's norm 0", ta->name);
    }
    qc_tset_free(&a);
    qc_tset_free(&b);
    h_free(&in);
  }
}

/* A sink (model/sink.h) that keeps what it is handed: the rows of the
 * gradients it takes (`take`), in the order given, into whole buffers. */
typedef struct keep_sink {
  const char *take;            /* "/d_w1/d_w2/" */
  int fail_at;                 /* > 0: the fail_at-th call of rows fails */
  int calls, n;
  char name[4][QC_NAMELEN];
  int64_t next[4], rows[4], cols[4];
  double *buf[4];
} keep_sink;

static int ks_find(const keep_sink *k, const char *grad) {
  for (int i = 0; i < k->n; i++)
    if (strcmp(k->name[i], grad) == 0) return i;
  return -1;
}

static int ks_begin(const qc_grad_sink *s, const char *grad, int ndim, const int64_t *shape) {
  keep_sink *k = s->arg;
  char key[QC_NAMELEN + 2];
  snprintf(key, sizeof key, "/%s/", grad);
  if (!strstr(k->take, key) || k->n == 4) return 0;
  int64_t n = 1;
  for (int d = 0; d < ndim; d++) n *= shape[d];
  snprintf(k->name[k->n], sizeof k->name[0], "%s", grad);
  k->cols[k->n] = shape[ndim - 1], k->rows[k->n] = n / shape[ndim - 1], k->next[k->n] = 0;
  k->buf[k->n] = calloc((size_t)n, sizeof(double));
  return ++k->n;
}

static int ks_rows(const qc_grad_sink *s, const char *grad, int64_t r0, int64_t r1, const double *blk) {
  keep_sink *k = s->arg;
  const int i = ks_find(k, grad);
  if (++k->calls == k->fail_at) return qc_err("keep_sink: refused at call %d", k->calls);
  cr_assert(i >= 0 && r0 == k->next[i] && r1 > r0 && r1 <= k->rows[i], "%s: rows [%lld, %lld) after %lld", grad, (long long)r0,
            (long long)r1, (long long)(i >= 0 ? k->next[i] : -1));
  memcpy(k->buf[i] + r0 * k->cols[i], blk, (size_t)((r1 - r0) * k->cols[i]) * sizeof *blk);
  k->next[i] = r1;
  return QC_OK;
}

/* The reference hands d_w1 and d_w2 to a sink an expert at a time when
 * the sink takes them (the engine then never holds them whole): each
 * arrives in order, every row once, the same bits as the whole reference
 * (an empty expert's zero rows included), the set holding their shapes
 * without data; every other gradient as without a sink; a sink that takes
 * nothing changes nothing; an error from the sink is the reference's. */
Test(moe, streamed_blocks_are_the_whole_gradient) {
  const char *sh[] = {"shared_experts=2", NULL};
  const char *r2[] = {"activation=relu2", NULL};
  const struct { const char *shape; const char *const *sets; } cs[] = {
      {"9,16,8,5,3", NULL}, {"64,128,40,6,2", sh}, {"37,96,48,9,4", r2}};
  for (size_t c = 0; c < sizeof cs / sizeof cs[0]; c++) {
    h_inst in;
    h_make(&in, "moe", cs[c].shape, 21 + c, "normal", cs[c].sets);
    const char *takes[2] = {"/d_w1/d_w2/", "/none/"};
    qc_ctx plain = {.be = qc_backend_cpu(), .profile = "vllm"};
    qc_tset whole = {0};
    cr_assert_eq(in.row->reference(&plain, &in.m, &in.dy, &whole), QC_OK, "%s", qc_err_msg());
    for (int t = 0; t < 2; t++) {
      keep_sink k = {.take = takes[t]};
      qc_grad_sink sk = {.begin = ks_begin, .rows = ks_rows, .arg = &k};
      qc_ctx ctx = plain;
      ctx.sink = &sk;
      qc_tset got = {0};
      cr_assert_eq(in.row->reference(&ctx, &in.m, &in.dy, &got), QC_OK, "%s", qc_err_msg());
      cr_assert_eq(got.n, whole.n);
      cr_expect_eq(k.n, t == 0 ? 2 : 0, "%s: %d gradients streamed", cs[c].shape, k.n);
      for (int i = 0; i < whole.n; i++) {
        const qc_tensor *w = &whole.t[i], *g = qc_tset_get(&got, w->name);
        const int j = ks_find(&k, w->name);
        cr_assert(g && qc_shape_eq(g, w), "%s: %s", cs[c].shape, w->name);
        if (j < 0) {
          cr_expect(g->data && memcmp(g->data, w->data, w->nbytes) == 0, "%s: %s as without a sink", cs[c].shape, w->name);
          continue;
        }
        cr_expect(g->data == NULL, "%s: %s streamed has no data", cs[c].shape, w->name);
        cr_expect_eq(k.next[j], k.rows[j], "%s: %s: %lld of %lld rows", cs[c].shape, w->name, (long long)k.next[j],
                     (long long)k.rows[j]);
        cr_expect_eq(memcmp(k.buf[j], w->data, w->nbytes), 0, "%s: %s: the blocks are the whole reference", cs[c].shape, w->name);
      }
      cr_expect(t == 1 || k.calls == 2 * qc_tset_get(&in.m.params, "w1")->shape[0], "%s: one call an expert and gradient",
                cs[c].shape);
      for (int i = 0; i < k.n; i++) free(k.buf[i]);
      qc_tset_free(&got);
    }
    keep_sink k = {.take = "/d_w1/d_w2/", .fail_at = 3};
    qc_grad_sink sk = {.begin = ks_begin, .rows = ks_rows, .arg = &k};
    qc_ctx ctx = plain;
    ctx.sink = &sk;
    qc_tset got = {0};
    qc_err_clear();
    cr_expect_eq(in.row->reference(&ctx, &in.m, &in.dy, &got), QC_EINPUT, "the sink's error stops the reference");
    cr_expect(strstr(qc_err_msg(), "refused at call 3"), "%s", qc_err_msg());
    qc_err_clear();
    for (int i = 0; i < k.n; i++) free(k.buf[i]);
    qc_tset_free(&got);
    qc_tset_free(&whole);
    h_free(&in);
  }
}

enum { D_NONE, D_WRONG_INVERSE, D_OVERWRITE, D_NO_DWT, D_RELU_DERIV };

/* A second implementation of the production pipeline (sort by expert, per
 * expert products, restore), in float64 loops, with one defect planted. */
static int moe_variant(const qc_module *m, const qc_tensor *dy, qc_tset *grads, int defect) {
  const qc_tensor *xt = qc_tset_get(&m->inputs, "x"), *w1t = qc_tset_get(&m->params, "w1"),
                  *w2t = qc_tset_get(&m->params, "w2"), *it = qc_tset_get(&m->saved, "topk_ids"),
                  *wtt = qc_tset_get(&m->inputs, "topk_weights");
  const int relu2 = strcmp(qc_contract_str(&m->contract, "activation", "swiglu"), "relu2") == 0;
  const int64_t T = xt->shape[0], H = xt->shape[1], E = w2t->shape[0], F = w2t->shape[2], k = it->shape[1];
  const int64_t R = relu2 ? F : 2 * F, N = T * k;
  const int64_t *id = it->data;
  double *x = h_f64(xt), *w1 = h_f64(w1t), *w2 = h_f64(w2t), *wt = h_f64(wtt), *g = h_f64(dy);
  double *dx = calloc((size_t)(T * H), sizeof *dx), *dw1 = calloc((size_t)(E * R * H), sizeof *dw1);
  double *dw2 = calloc((size_t)(E * H * F), sizeof *dw2), *dwt = calloc((size_t)N, sizeof *dwt);
  double *h = malloc((size_t)R * sizeof *h), *a = malloc((size_t)F * sizeof *a), *da = malloc((size_t)F * sizeof *da);
  double *dh = malloc((size_t)R * sizeof *dh), *tmp = calloc((size_t)(T * H), sizeof *tmp);
  int64_t *perm = malloc((size_t)N * sizeof *perm), *inv = malloc((size_t)N * sizeof *inv), r = 0;
  char *touched = calloc((size_t)T, 1);
  for (int64_t e = 0; e < E; e++)
    for (int64_t s = 0; s < N; s++)
      if (id[s] == e) perm[r++] = s;
  for (int64_t i = 0; i < N; i++) inv[perm[i]] = i;
  for (int64_t row = 0; row < N; row++) {
    const int64_t s = perm[row], t = s / k, e = id[s];
    /* the restore target: the token of this sorted row */
    const int64_t dst = defect == D_WRONG_INVERSE ? inv[row] / k : t;
    for (int64_t q = 0; q < R; q++) {
      h[q] = 0;
      for (int64_t c = 0; c < H; c++) h[q] += w1[(e * R + q) * H + c] * x[t * H + c];
    }
    for (int64_t f = 0; f < F; f++) {
      double gg = h[f], u = relu2 ? 0 : h[F + f], sg = 1 / (1 + exp(-gg));
      a[f] = relu2 ? (gg > 0 ? gg * gg : 0) : gg * sg * u;
    }
    for (int64_t f = 0; f < F; f++) da[f] = 0;
    for (int64_t c = 0; c < H; c++) {
      double y = 0;
      for (int64_t f = 0; f < F; f++) {
        y += w2[(e * H + c) * F + f] * a[f];
        da[f] += wt[s] * g[t * H + c] * w2[(e * H + c) * F + f];
        dw2[(e * H + c) * F + f] += wt[s] * g[t * H + c] * a[f];
      }
      dwt[s] += g[t * H + c] * y;
    }
    for (int64_t f = 0; f < F; f++) {
      if (relu2) {
        dh[f] = h[f] > 0 ? da[f] * (defect == D_RELU_DERIV ? 1.0 : 2.0 * h[f]) : 0.0;
      } else {
        double gg = h[f], u = h[F + f], sg = 1 / (1 + exp(-gg));
        dh[f] = da[f] * u * sg * (1 + gg * (1 - sg));
        dh[F + f] = da[f] * gg * sg;
      }
    }
    for (int64_t q = 0; q < R; q++)
      for (int64_t c = 0; c < H; c++) dw1[(e * R + q) * H + c] += dh[q] * x[t * H + c];
    /* per-expert scatter buffer, flushed into d_x when the expert's group ends */
    for (int64_t c = 0; c < H; c++) {
      double v = 0;
      for (int64_t q = 0; q < R; q++) v += w1[(e * R + q) * H + c] * dh[q];
      if (defect == D_OVERWRITE) tmp[dst * H + c] = v; /* the same token twice in one expert: the first is lost */
      else tmp[dst * H + c] += v;
    }
    touched[dst] = 1;
    if (row + 1 == N || id[perm[row + 1]] != e)
      for (int64_t tt = 0; tt < T; tt++) {
        if (!touched[tt]) continue;
        for (int64_t c = 0; c < H; c++) dx[tt * H + c] += tmp[tt * H + c], tmp[tt * H + c] = 0;
        touched[tt] = 0;
      }
  }
  int64_t ws[2] = {T, k};
  qc_tensor td = {0}, t1 = {0}, t2 = {0}, tw = {0};
  cr_assert_eq(qc_tensor_alloc(&td, "d_x", QC_F32, 2, xt->shape), QC_OK);
  cr_assert_eq(qc_tensor_alloc(&t1, "d_w1", QC_F32, 3, w1t->shape), QC_OK);
  cr_assert_eq(qc_tensor_alloc(&t2, "d_w2", QC_F32, 3, w2t->shape), QC_OK);
  cr_assert_eq(qc_tensor_alloc(&tw, "d_topk_weights", QC_F32, 2, ws), QC_OK);
  cr_assert_eq(qc_tset_add(grads, &td), QC_OK);
  cr_assert_eq(qc_tset_add(grads, &t1), QC_OK);
  cr_assert_eq(qc_tset_add(grads, &t2), QC_OK);
  if (defect != D_NO_DWT) cr_assert_eq(qc_tset_add(grads, &tw), QC_OK);
  else qc_tensor_free(&tw);
  h_set(grads, "d_x", dx, T * H);
  h_set(grads, "d_w1", dw1, E * R * H);
  h_set(grads, "d_w2", dw2, E * H * F);
  if (defect != D_NO_DWT) h_set(grads, "d_topk_weights", dwt, N);
  free(x); free(w1); free(w2); free(wt); free(g); free(dx); free(dw1); free(dw2); free(dwt);
  free(h); free(a); free(da); free(dh); free(tmp); free(perm); free(inv); free(touched);
  return QC_OK;
}

/* The defect's worst rel_l2, logged (--verbose), then the expected failure. */
static void expect_fail_logged(h_inst *in, qc_vjp_fn cand, const char *what, const char *tensor) {
  char fail[256];
  double worst;
  h_compare(in, cand, MOE_TOL, fail, sizeof fail, &worst);
  cr_log_info("moe defect %-16s fails on %-24s worst rel_l2 %.3g (tol %.3g)", what, fail, worst, MOE_TOL);
  h_expect_fail(in, cand, MOE_TOL, tensor);
}

#define VARIANT(name, d) \
  static int name(const qc_ctx *ctx, const qc_module *m, const qc_tensor *dy, qc_tset *grads) { \
    (void)ctx; \
    return moe_variant(m, dy, grads, d); \
  }
VARIANT(moe_correct, D_NONE)
VARIANT(moe_wrong_inverse, D_WRONG_INVERSE)
VARIANT(moe_overwrite, D_OVERWRITE)
VARIANT(moe_no_dwt, D_NO_DWT)
VARIANT(moe_relu_deriv, D_RELU_DERIV)

Test(moe, planted_defects_fail_naming_tensor) {
  const char *sw[] = {NULL};
  const char *r2[] = {"activation=relu2", NULL};
  h_inst in;
  h_make(&in, "moe", "37,48,24,9,4", 41, "normal", sw);
  h_expect_pass(&in, MOE_TOL);
  /* the defect-free variant passes: each failure below is its defect's */
  char fail[256];
  double worst;
  cr_expect_eq(h_compare(&in, moe_correct, 1e-6, fail, sizeof fail, &worst), 1, "correct variant fails on %s (%g)", fail, worst);
  expect_fail_logged(&in, moe_wrong_inverse, "wrong_inverse", "d_x");
  expect_fail_logged(&in, moe_overwrite, "overwrite", "d_x");
  expect_fail_logged(&in, moe_no_dwt, "no_dwt", "missing d_topk_weights");
  h_free(&in);
  h_make(&in, "moe", "37,48,24,9,4", 42, "normal", r2);
  h_expect_pass(&in, MOE_TOL);
  cr_expect_eq(h_compare(&in, moe_correct, 1e-6, fail, sizeof fail, &worst), 1, "correct relu2 variant fails on %s (%g)", fail, worst);
  expect_fail_logged(&in, moe_relu_deriv, "relu_deriv", "d_x");
  expect_fail_logged(&in, moe_wrong_inverse, "wrong_inverse", "d_x");
  h_free(&in);
}

/* Without repeated routing the overwrite defect is invisible: it is the
 * repeated (token, expert) pairs that catch it. */
Test(moe, overwrite_defect_needs_repeats) {
  h_inst in;
  h_make(&in, "moe", "1,32,16,6,3", 5, "normal", NULL); /* T = 1: token 0 only, no repeat */
  char fail[256];
  double worst;
  cr_expect_eq(h_compare(&in, moe_overwrite, 1e-6, fail, sizeof fail, &worst), 1, "%s %g", fail, worst);
  h_free(&in);
}

Test(moe, bad_input_is_refused) {
  h_inst in;
  h_make(&in, "moe", "6,8,4,5,2", 1, "normal", NULL);
  int64_t *id = qc_tset_get_mut(&in.m.saved, "topk_ids")->data, keep = id[3];
  id[3] = 5; /* out of range */
  h_expect_refused(&in, "topk_ids");
  id[3] = -1;
  h_expect_refused(&in, "topk_ids");
  id[3] = keep;
  /* w1 [E, 2F, H] under a relu2 contract (which needs [E, F, H]) */
  cr_assert_eq(qc_fd_parse_set(&in.m.contract, "activation=relu2"), QC_OK);
  h_expect_refused(&in, "w1");
  cr_assert_eq(qc_fd_parse_set(&in.m.contract, "activation=swiglu"), QC_OK);
  /* weights [T*k, 1] instead of [T, k] */
  qc_tensor *w = qc_tset_get_mut(&in.m.inputs, "topk_weights");
  w->shape[0] = 12;
  w->shape[1] = 1;
  h_expect_refused(&in, "topk_weights");
  w->shape[0] = 6;
  w->shape[1] = 2;
  /* a clamp under relu2 */
  cr_assert_eq(qc_fd_parse_set(&in.m.contract, "limit=7"), QC_OK);
  cr_assert_eq(qc_fd_parse_set(&in.m.contract, "activation=relu2"), QC_OK);
  h_expect_refused(&in, "limit");
  h_free(&in);
}

/* ---- shared experts (DeepSeek-V3: added unweighted; Qwen2-MoE: gated by
 * sigmoid(x . shared_gate)) ---- */

/* d_shared_gate sums one length-H dot <dY_t, ys_t> per token (times x_t):
 * with one token it is a single dot's cancellation (measured 1.5e-2 at
 * [1, 64, 32, 16, 8] with the unit tests' float32 dY), so the smallest
 * shape here has 5 tokens, as d_topk_weights' comment above. */
Test(moe, shared_experts_match_reference) {
  const char *shapes[] = {"5,64,32,16,8", "37,96,48,9,4", "64,128,40,6,2"};
  const char *ds[] = {"shared_experts=2", NULL};
  const char *qw[] = {"shared_experts=1", "shared_gate=true", NULL};
  const char *qwc[] = {"shared_experts=1", "shared_gate=true", "limit=7", NULL};
  const char *r2[] = {"activation=relu2", "shared_experts=2", "shared_gate=true", NULL};
  const char *const *sets[] = {ds, qw, qwc, r2};
  h_sweep("moe", shapes, 3, sets, 4, 501, MOE_TOL, MOE_TOL);
}

/* The generator draws the shared tensors after the routed ones: a seed's
 * routed data is the same with and without shared experts. */
/* Coverage: a module with shared experts shows the item "shared experts"
 * (it used to be missing whatever the data), one without does not; the
 * routing's items come from the class's own facts. */
Test(moe, coverage_shows_shared_experts) {
  const char *shared[] = {"shared_experts=1", NULL};
  for (int k = 0; k < 2; k++) {
    h_inst in;
    qc_modinfo mi;
    h_make(&in, "moe", "9,16,8,5,3", 7, "normal", k ? shared : NULL);
    cr_assert_eq(qc_modinfo_fill(&mi, &in.m, "generated", "builtin", "normal"), QC_OK);
    cr_expect_eq(mi.cover >> QC_COV_MOE_SHARED & 1, (unsigned)k, "shared_experts=%d: item moe_shared %s", k,
                 k ? "not shown" : "shown");
    cr_expect(mi.cover >> QC_COV_MOE_EMPTY & 1, "the generator's empty expert shows");
    cr_expect(mi.cover >> QC_COV_MOE_REPEAT & 1, "the generator's repeated routing shows");
    cr_expect(qc_cov_applies(QC_COV_MOE_SHARED, "moe", NULL), "moe_shared applies to moe");
    cr_expect(!qc_cov_applies(QC_COV_MOE_SHARED, "linear", NULL), "moe_shared does not apply to linear");
    h_free(&in);
  }
}

Test(moe, shared_generator_shapes_and_routed_data_unchanged) {
  const char *qw[] = {"shared_experts=2", "shared_gate=true", NULL};
  h_inst a, b;
  h_make(&a, "moe", "9,16,8,5,3", 7, "normal", NULL);
  h_make(&b, "moe", "9,16,8,5,3", 7, "normal", qw);
  const qc_tensor *w1 = qc_tset_get(&b.m.params, "shared_w1"), *w2 = qc_tset_get(&b.m.params, "shared_w2"),
                  *sg = qc_tset_get(&b.m.params, "shared_gate");
  cr_assert(w1 && w2 && sg);
  cr_expect(w1->shape[0] == 32 && w1->shape[1] == 16, "shared_w1 [2 Fs, H] = [32, 16]");
  cr_expect(w2->shape[0] == 16 && w2->shape[1] == 16, "shared_w2 [H, Fs] = [16, 16]");
  cr_expect(sg->shape[0] == 1 && sg->shape[1] == 16, "shared_gate [1, H]");
  cr_expect(memcmp(qc_tset_get(&a.m.params, "w1")->data, qc_tset_get(&b.m.params, "w1")->data, 5 * 16 * 16 * 2) == 0);
  cr_expect_null(qc_tset_get(&a.m.params, "shared_w1"));
  h_free(&a);
  h_free(&b);
}

/* rel_l2 of candidate tensor `name` against the reference on in. */
static double rel_of(h_inst *in, qc_vjp_fn cand, const char *name) {
  qc_ctx ctx = {.be = qc_backend_cpu(), .profile = "vllm"};
  qc_tset ref = {0}, got = {0};
  cr_assert_eq(in->row->reference(&ctx, &in->m, &in->dy, &ref), QC_OK);
  cr_assert_eq(cand(&ctx, &in->m, &in->dy, &got), QC_OK);
  const qc_tensor *r = qc_tset_get(&ref, name), *g = qc_tset_get(&got, name);
  cr_assert(r && g, "%s in both", name);
  double *gd = h_f64(g);
  qc_metrics mt;
  qc_metrics_compute(gd, r->data, qc_numel(r), &mt);
  free(gd);
  qc_tset_free(&ref);
  qc_tset_free(&got);
  return mt.rel_l2;
}

/* Defect: the shared path's d_x forgotten (only the routed experts' d_x):
 * the production run with the shared experts switched off supplies d_x. */
static int moe_shared_no_dx(const qc_ctx *ctx, const qc_module *m, const qc_tensor *dy, qc_tset *grads) {
  int rc = m->cls->production(ctx, m, dy, grads);
  if (rc) return rc;
  qc_module tmp = *m; /* shallow: the params without the shared tensors */
  qc_tset params = {0}, g2 = {0};
  for (int i = 0; i < m->params.n; i++)
    if (strncmp(m->params.t[i].name, "shared_", 7) != 0) {
      qc_tensor c = {0};
      cr_assert_eq(qc_tensor_copy(&c, &m->params.t[i]), QC_OK);
      cr_assert_eq(qc_tset_add(&params, &c), QC_OK);
    }
  tmp.params = params;
  cr_assert_eq(qc_fd_parse_set(&tmp.contract, "shared_experts=0"), QC_OK);
  cr_assert_eq(qc_fd_parse_set(&tmp.contract, "shared_gate=false"), QC_OK);
  if ((rc = m->cls->production(ctx, &tmp, dy, &g2)) == QC_OK) {
    const qc_tensor *d = qc_tset_get(&g2, "d_x");
    memcpy(qc_tset_get_mut(grads, "d_x")->data, d->data, (size_t)qc_numel(d) * sizeof(float));
  }
  qc_tset_free(&params);
  qc_tset_free(&g2);
  return rc;
}

/* Defect: the gate's derivative taken as sigmoid(z) instead of sigmoid(z)
 * (1 - sigmoid(z)), in d_shared_gate and in the gate's term of d_x
 * (swiglu, no clamp: the shared MLP replayed here in float64). */
static int moe_gate_deriv(const qc_ctx *ctx, const qc_module *m, const qc_tensor *dy, qc_tset *grads) {
  int rc = m->cls->production(ctx, m, dy, grads);
  if (rc) return rc;
  const qc_tensor *xt = qc_tset_get(&m->inputs, "x"), *t1 = qc_tset_get(&m->params, "shared_w1"),
                  *t2 = qc_tset_get(&m->params, "shared_w2"), *tg = qc_tset_get(&m->params, "shared_gate");
  const int64_t T = xt->shape[0], H = xt->shape[1], Fs = t2->shape[1];
  double *x = h_f64(xt), *w1 = h_f64(t1), *w2 = h_f64(t2), *sg = h_f64(tg), *g = h_f64(dy);
  double *dsg = calloc((size_t)H, sizeof *dsg), *dx = h_f64(qc_tset_get(grads, "d_x")), *a = malloc((size_t)Fs * sizeof *a);
  for (int64_t t = 0; t < T; t++) {
    double z = 0, dot = 0;
    for (int64_t c = 0; c < H; c++) z += x[t * H + c] * sg[c];
    for (int64_t f = 0; f < Fs; f++) {
      double hg = 0, hu = 0;
      for (int64_t c = 0; c < H; c++) {
        hg += w1[f * H + c] * x[t * H + c];
        hu += w1[(Fs + f) * H + c] * x[t * H + c];
      }
      a[f] = hg / (1 + exp(-hg)) * hu;
    }
    for (int64_t c = 0; c < H; c++) {
      double y = 0;
      for (int64_t f = 0; f < Fs; f++) y += w2[c * Fs + f] * a[f];
      dot += g[t * H + c] * y;
    }
    const double s = 1 / (1 + exp(-z)), good = s * (1 - s) * dot, bad = s * dot;
    for (int64_t c = 0; c < H; c++) {
      dsg[c] += bad * x[t * H + c];
      dx[t * H + c] += (bad - good) * sg[c];
    }
  }
  h_set(grads, "d_shared_gate", dsg, H);
  h_set(grads, "d_x", dx, T * H);
  free(x); free(w1); free(w2); free(sg); free(g); free(dsg); free(dx); free(a);
  return QC_OK;
}

Test(moe, shared_planted_defects_fail_on_their_tensors) {
  const char *ds[] = {"shared_experts=2", NULL};
  const char *qw[] = {"shared_experts=1", "shared_gate=true", NULL};
  h_inst in;
  /* DeepSeek-V3 (ungated): the shared path's d_x forgotten fails d_x only */
  h_make(&in, "moe", "37,48,24,9,4", 43, "normal", ds);
  h_expect_pass(&in, MOE_TOL);
  expect_fail_logged(&in, moe_shared_no_dx, "shared_no_dx", "d_x");
  cr_expect(rel_of(&in, moe_shared_no_dx, "d_shared_w1") < MOE_TOL);
  cr_expect(rel_of(&in, moe_shared_no_dx, "d_shared_w2") < MOE_TOL);
  h_free(&in);
  /* Qwen2-MoE (gated): the same, and the gate's derivative wrong fails
   * d_shared_gate while the shared weights' gradients pass */
  h_make(&in, "moe", "37,48,24,9,4", 44, "normal", qw);
  h_expect_pass(&in, MOE_TOL);
  expect_fail_logged(&in, moe_shared_no_dx, "shared_no_dx", "d_x");
  double rg = rel_of(&in, moe_gate_deriv, "d_shared_gate");
  cr_log_info("moe defect gate_deriv: d_shared_gate rel_l2 %.3g", rg);
  cr_expect(rg > 0.1, "wrong gate derivative: d_shared_gate rel_l2 %g", rg);
  cr_expect(rel_of(&in, moe_gate_deriv, "d_shared_w1") < MOE_TOL);
  cr_expect(rel_of(&in, moe_gate_deriv, "d_shared_w2") < MOE_TOL);
  cr_expect(rel_of(&in, moe_gate_deriv, "d_topk_weights") < MOE_TOL);
  h_free(&in);
}

/* A shared tensor the contract does not use, or a shared shape that does
 * not fit, is refused by both implementations. */
Test(moe, shared_bad_input_is_refused) {
  const char *qw[] = {"shared_experts=1", "shared_gate=true", NULL};
  h_inst in;
  h_make(&in, "moe", "6,8,4,5,2", 1, "normal", qw);
  cr_assert_eq(qc_fd_parse_set(&in.m.contract, "shared_gate=false"), QC_OK);
  h_expect_refused(&in, "shared_gate");
  cr_assert_eq(qc_fd_parse_set(&in.m.contract, "shared_experts=0"), QC_OK);
  h_expect_refused(&in, "shared_");
  cr_assert_eq(qc_fd_parse_set(&in.m.contract, "shared_gate=true"), QC_OK);
  cr_assert_eq(qc_fd_parse_set(&in.m.contract, "shared_experts=3"), QC_OK); /* Fs = 4 not a multiple of 3 */
  h_expect_refused(&in, "shared_w2");
  cr_assert_eq(qc_fd_parse_set(&in.m.contract, "shared_experts=1"), QC_OK);
  cr_assert_eq(qc_fd_parse_set(&in.m.contract, "activation=relu2"), QC_OK); /* shared_w1 [2Fs, H] under relu2 */
  h_expect_refused(&in, "w1");
  h_free(&in);
}
