/* test_attention.c: the builtin attention VJP (flash-attention backward from
 * the saved O and LSE) against the float64 reference (its own softmax):
 * causal and not, GQA, base-2 LSE, explicit scale, S = 1, D not a multiple
 * of 8, large logits; planted defects in the backward (wrong softmax scale,
 * LSE read in the wrong base, GQA reduction missing, causal mask off by one)
 * and in the saved intermediates (an LSE saved in log2 under lse_base = e,
 * an O saved from a different scale); the sliding window (both sides of its
 * edge) and the logit softcap, with GQA, and their planted defects (window
 * off by one either way, the tanh derivative forgotten, P from the uncapped
 * logits); bad input. */
#include <criterion/criterion.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend/backend.h"
#include "class_harness.h"
#include "engine/fd.h"
#include "core/qc.h"

#define ATT_TOL 6.61e-6          /* cases/attention.json d_k, d_v (d_q: 3.31e-6) */
#define ATT_TOL_HEAVY 2e-5       /* heavy_tail inputs: logits up to 20x (measured <= 1e-5) */
#define ATT_TOL_SPECIAL 2e-4     /* q x 64: logits in the hundreds, P nearly one-hot (measured <= 6e-5) */
#define LOG2E 1.4426950408889634

Test(attention, builtin_matches_reference) {
  const char *shapes[] = {"1,1,1,1,16", "2,8,2,37,20", "1,4,1,200,64", "1,2,2,9,7"};
  const char *causal[] = {NULL};
  const char *gqa[] = {"causal=false", "softmax_scale=0.3", NULL};
  const char *const *sets[] = {causal, gqa};
  h_sweep("attention", shapes, 4, sets, 2, 301, ATT_TOL_HEAVY, ATT_TOL_SPECIAL);
}

/* Sliding window, softcap and both, with GQA (8/2, 4/1), W below, at and
 * beyond S, a cap that bends the normal logits (m = 1.5) and one that
 * bends the special ones (logits in the hundreds, m = 30, Gemma 2's value). */
Test(attention, window_softcap_match_reference) {
  const char *shapes[] = {"1,1,1,1,16", "2,8,2,37,20", "1,4,1,200,64", "1,2,2,9,7"};
  const char *win[] = {"window=5", NULL};
  const char *win1[] = {"window=1", "softcap=1.5", NULL};
  const char *cap[] = {"softcap=1.5", "softmax_scale=0.5", NULL};
  const char *both[] = {"window=9", "softcap=30", NULL};
  const char *wide[] = {"window=4096", "softcap=50", NULL};
  const char *const *sets[] = {win, win1, cap, both, wide};
  h_sweep("attention", shapes, 4, sets, 5, 331, ATT_TOL_HEAVY, ATT_TOL_SPECIAL);
}

/* An instance whose contract says lse_base = "2" (a string, as a case file
 * writes it; --set would read 2 as a number). */
static void make_base2(h_inst *in, const char *shape, uint64_t seed, const char *values, int causal) {
  qc_contract c = {0};
  cr_assert_eq(qc_contract_set(&c, "lse_base", "2", 0, 0), QC_OK);
  cr_assert_eq(qc_contract_set(&c, "causal", causal ? "true" : "false", 0, 0), QC_OK);
  h_make_with(in, "attention", shape, seed, values, &c);
  for (int64_t i = 0; i < qc_numel(&in->dy); i++) ((float *)in->dy.data)[i] = (float)sin(0.7 * (double)i + 0.3);
}

Test(attention, base2_lse_matches_reference) {
  const char *shapes[] = {"1,1,1,1,8", "2,8,2,37,20", "1,4,1,160,36"};
  for (int s = 0; s < 3; s++)
    for (int causal = 0; causal < 2; causal++) {
      h_inst in;
      make_base2(&in, shapes[s], 40 + (uint64_t)s, "normal", causal);
      cr_expect(strcmp(qc_contract_str(&in.m.contract, "lse_base", "e"), "2") == 0);
      h_expect_pass(&in, ATT_TOL);
      h_free(&in);
    }
}

/* ---- a test-local flash backward with knobs, for planted defects ---- */
typedef struct {
  double scale_mul;   /* scale actually used = contract scale x scale_mul */
  int lse_as_base2;   /* read the (natural) saved LSE as if it were log2 */
  int mask_shift;     /* causal: keys j <= i + mask_shift are visible */
  int no_gqa_sum;     /* d_k, d_v from the last query head of a group only (overwrite, no sum) */
  int win_shift;      /* window W: keys j >= i - W + 1 - win_shift are visible (0: the contract's) */
  int no_tanh_grad;   /* softcap: dS not multiplied by 1 - tanh^2 */
  int uncapped_p;     /* softcap: P from the raw logit c q.k, not m tanh(c q.k / m) */
} knobs;

static int flash(const qc_module *m, const qc_tensor *dy, qc_tset *grads, const knobs *kn) {
  const qc_tensor *qt = qc_tset_get(&m->inputs, "q"), *kt = qc_tset_get(&m->inputs, "k"), *vt = qc_tset_get(&m->inputs, "v");
  const qc_tensor *ot = qc_tset_get(&m->saved, "out"), *lt = qc_tset_get(&m->saved, "lse");
  const int64_t B = qt->shape[0], Hq = qt->shape[1], S = qt->shape[2], D = qt->shape[3], Hkv = kt->shape[1], grp = Hq / Hkv;
  const int causal = strcmp(qc_contract_str(&m->contract, "causal", "true"), "true") == 0;
  double sc = qc_contract_has(&m->contract, "softmax_scale") ? qc_contract_num(&m->contract, "softmax_scale", 0) : 1 / sqrt((double)D);
  sc *= kn->scale_mul;
  const int64_t W = (int64_t)qc_contract_num(&m->contract, "window", 0);
  const double cap = qc_contract_num(&m->contract, "softcap", 0);
  double *q = h_f64(qt), *k = h_f64(kt), *v = h_f64(vt), *o = h_f64(ot), *l = h_f64(lt), *g = h_f64(dy);
  double *dq = calloc((size_t)qc_numel(qt), sizeof *dq), *dk = calloc((size_t)qc_numel(kt), sizeof *dk),
         *dv = calloc((size_t)qc_numel(vt), sizeof *dv);
  double *dkh = calloc((size_t)(S * D), sizeof *dkh), *dvh = calloc((size_t)(S * D), sizeof *dvh);
  for (int64_t b = 0; b < B; b++)
    for (int64_t h = 0; h < Hq; h++) {
      const int64_t qo = (b * Hq + h) * S * D, ko = (b * Hkv + h / grp) * S * D;
      memset(dkh, 0, (size_t)(S * D) * sizeof *dkh);
      memset(dvh, 0, (size_t)(S * D) * sizeof *dvh);
      for (int64_t i = 0; i < S; i++) {
        double delta = 0;
        for (int64_t d = 0; d < D; d++) delta += g[qo + i * D + d] * o[qo + i * D + d];
        int64_t jn = causal ? i + 1 + kn->mask_shift : S;
        if (jn > S) jn = S;
        int64_t j0 = W > 0 ? i - W + 1 - kn->win_shift : 0;
        if (j0 < 0) j0 = 0;
        for (int64_t j = j0; j < jn; j++) {
          double s = 0, dp = 0;
          for (int64_t d = 0; d < D; d++) {
            s += q[qo + i * D + d] * k[ko + j * D + d];
            dp += g[qo + i * D + d] * v[ko + j * D + d];
          }
          const double L = l[(b * Hq + h) * S + i];
          double x = sc * s, dcap = 1; /* the logit and its derivative */
          if (cap > 0) {
            const double t = tanh(x / cap);
            if (!kn->uncapped_p) x = cap * t;
            if (!kn->no_tanh_grad) dcap = 1 - t * t;
          }
          const double p = kn->lse_as_base2 ? exp2(LOG2E * x - L) : exp(x - L);
          const double ds = sc * p * (dp - delta) * dcap;
          for (int64_t d = 0; d < D; d++) {
            dq[qo + i * D + d] += ds * k[ko + j * D + d];
            dkh[j * D + d] += ds * q[qo + i * D + d];
            dvh[j * D + d] += p * g[qo + i * D + d];
          }
        }
      }
      for (int64_t e = 0; e < S * D; e++) {
        if (kn->no_gqa_sum) {
          dk[ko + e] = dkh[e];
          dv[ko + e] = dvh[e];
        } else {
          dk[ko + e] += dkh[e];
          dv[ko + e] += dvh[e];
        }
      }
    }
  const qc_tensor *src[3] = {qt, kt, vt};
  double *dd[3] = {dq, dk, dv};
  const char *names[3] = {"d_q", "d_k", "d_v"};
  for (int t = 0; t < 3; t++) {
    qc_tensor x = {0};
    cr_assert_eq(qc_tensor_alloc(&x, names[t], QC_F32, 4, src[t]->shape), QC_OK);
    for (int64_t i = 0; i < qc_numel(src[t]); i++) ((float *)x.data)[i] = (float)dd[t][i];
    cr_assert_eq(qc_tset_add(grads, &x), QC_OK);
  }
  free(q); free(k); free(v); free(o); free(l); free(g); free(dq); free(dk); free(dv); free(dkh); free(dvh);
  return QC_OK;
}

static int flash_ok(const qc_ctx *c, const qc_module *m, const qc_tensor *dy, qc_tset *g) {
  (void)c;
  knobs k = {1, 0, 0, 0, 0, 0, 0};
  return flash(m, dy, g, &k);
}
/* the trainer used 1/D instead of 1/sqrt(D) (here: the scale x 1/sqrt(D)) */
static int flash_wrong_scale(const qc_ctx *c, const qc_module *m, const qc_tensor *dy, qc_tset *g) {
  (void)c;
  const double D = (double)qc_tset_get(&m->inputs, "q")->shape[3];
  knobs k = {1 / sqrt(D), 0, 0, 0, 0, 0, 0};
  return flash(m, dy, g, &k);
}
static int flash_base2(const qc_ctx *c, const qc_module *m, const qc_tensor *dy, qc_tset *g) {
  (void)c;
  knobs k = {1, 1, 0, 0, 0, 0, 0};
  return flash(m, dy, g, &k);
}
static int flash_no_gqa(const qc_ctx *c, const qc_module *m, const qc_tensor *dy, qc_tset *g) {
  (void)c;
  knobs k = {1, 0, 0, 1, 0, 0, 0};
  return flash(m, dy, g, &k);
}
static int flash_mask_plus1(const qc_ctx *c, const qc_module *m, const qc_tensor *dy, qc_tset *g) {
  (void)c;
  knobs k = {1, 0, 1, 0, 0, 0, 0};
  return flash(m, dy, g, &k);
}
static int flash_mask_minus1(const qc_ctx *c, const qc_module *m, const qc_tensor *dy, qc_tset *g) {
  (void)c;
  knobs k = {1, 0, -1, 0, 0, 0, 0};
  return flash(m, dy, g, &k);
}
/* the sliding window one key wider (the key at i - W attended) or narrower */
static int flash_win_wide(const qc_ctx *c, const qc_module *m, const qc_tensor *dy, qc_tset *g) {
  (void)c;
  knobs k = {1, 0, 0, 0, 1, 0, 0};
  return flash(m, dy, g, &k);
}
static int flash_win_narrow(const qc_ctx *c, const qc_module *m, const qc_tensor *dy, qc_tset *g) {
  (void)c;
  knobs k = {1, 0, 0, 0, -1, 0, 0};
  return flash(m, dy, g, &k);
}
/* softcap: the backward forgets the tanh derivative */
static int flash_no_tanh_grad(const qc_ctx *c, const qc_module *m, const qc_tensor *dy, qc_tset *g) {
  (void)c;
  knobs k = {1, 0, 0, 0, 0, 1, 0};
  return flash(m, dy, g, &k);
}
/* softcap: the backward recomputes P from the uncapped logits */
static int flash_uncapped_p(const qc_ctx *c, const qc_module *m, const qc_tensor *dy, qc_tset *g) {
  (void)c;
  knobs k = {1, 0, 0, 0, 0, 0, 1};
  return flash(m, dy, g, &k);
}
/* the builtin run with window W + 1 or W - 1 (the trainer's mask i - j <= W
 * or i - j < W - 1) under a contract of window W */
static int prod_win_wide(const qc_ctx *c, const qc_module *m, const qc_tensor *dy, qc_tset *g) {
  char kv[64];
  snprintf(kv, sizeof kv, "window=%.0f", qc_contract_num(&m->contract, "window", 0) + 1);
  return h_prod_with(c, m, dy, g, kv);
}
static int prod_win_narrow(const qc_ctx *c, const qc_module *m, const qc_tensor *dy, qc_tset *g) {
  char kv[64];
  snprintf(kv, sizeof kv, "window=%.0f", qc_contract_num(&m->contract, "window", 0) - 1);
  return h_prod_with(c, m, dy, g, kv);
}
/* the builtin without the softcap under a contract with one */
static int prod_no_cap(const qc_ctx *c, const qc_module *m, const qc_tensor *dy, qc_tset *g) {
  return h_prod_with(c, m, dy, g, "softcap=0");
}

/* the builtin, told the saved LSE is base 2 while the contract says e */
static int prod_reads_base2(const qc_ctx *c, const qc_module *m, const qc_tensor *dy, qc_tset *g) {
  qc_module tmp = *m;
  cr_assert_eq(qc_contract_set(&tmp.contract, "lse_base", "2", 0, 0), QC_OK);
  return m->cls->production(c, &tmp, dy, g);
}
/* the builtin with softmax_scale 1/D under a default (1/sqrt(D)) contract */
static int prod_wrong_scale(const qc_ctx *c, const qc_module *m, const qc_tensor *dy, qc_tset *g) {
  char kv[64];
  snprintf(kv, sizeof kv, "softmax_scale=%.17g", 1.0 / (double)qc_tset_get(&m->inputs, "q")->shape[3]);
  return h_prod_with(c, m, dy, g, kv);
}

/* h_expect_fail, logging the worst rel_l2 the defect reached */
static void expect_fail(h_inst *in, qc_vjp_fn cand, const char *what, const char *tensor) {
  char fail[256];
  double w;
  h_compare(in, cand, ATT_TOL, fail, sizeof fail, &w);
  cr_log_info("attention defect %-40s fails on %s, worst rel_l2 %.3g", what, fail, w);
  h_expect_fail(in, cand, ATT_TOL, tensor);
}

Test(attention, planted_defects_fail_naming_tensor) {
  h_inst in;
  h_make(&in, "attention", "2,8,2,37,20", 11, "normal", NULL);
  /* the test-local flash backward without a defect passes: the defects below fail for their own reason */
  char fail[256];
  double w;
  cr_expect_eq(h_compare(&in, flash_ok, ATT_TOL, fail, sizeof fail, &w), 1, "clean flash backward fails on %s (%.3g)", fail, w);
  expect_fail(&in, flash_wrong_scale, "scale 1/D (flash)", "d_q");
  expect_fail(&in, prod_wrong_scale, "scale 1/D (builtin)", "d_q");
  expect_fail(&in, flash_base2, "LSE read as log2 (flash)", "d_q");
  expect_fail(&in, prod_reads_base2, "LSE read as log2 (builtin)", "d_q");
  expect_fail(&in, flash_no_gqa, "GQA sum missing", "d_k"); /* d_q is right: only the group sum is missing */
  expect_fail(&in, flash_mask_plus1, "causal mask j <= i+1", "d_q");
  expect_fail(&in, flash_mask_minus1, "causal mask j < i", "d_q");
  h_free(&in);
}

/* Window and softcap defects, GQA 8/2: each fails on its own gradient; the
 * clean test-local backward passes under the same contract. */
Test(attention, window_softcap_defects_fail) {
  h_inst in;
  char fail[256];
  double w;
  const char *win[] = {"window=6", NULL};
  h_make(&in, "attention", "2,8,2,37,20", 14, "normal", win);
  h_expect_pass(&in, ATT_TOL);
  cr_expect_eq(h_compare(&in, flash_ok, ATT_TOL, fail, sizeof fail, &w), 1, "clean flash (window) fails on %s (%.3g)", fail, w);
  expect_fail(&in, flash_win_wide, "window i - j <= W (flash)", "d_q");
  expect_fail(&in, flash_win_narrow, "window i - j < W - 1 (flash)", "d_q");
  expect_fail(&in, prod_win_wide, "window W + 1 (builtin)", "d_q");
  expect_fail(&in, prod_win_narrow, "window W - 1 (builtin)", "d_q");
  expect_fail(&in, flash_no_gqa, "GQA sum missing (window)", "d_k");
  h_free(&in);
  const char *cap[] = {"softcap=2", NULL};
  h_make(&in, "attention", "2,8,2,37,20", 15, "normal", cap);
  h_expect_pass(&in, ATT_TOL);
  cr_expect_eq(h_compare(&in, flash_ok, ATT_TOL, fail, sizeof fail, &w), 1, "clean flash (softcap) fails on %s (%.3g)", fail, w);
  expect_fail(&in, flash_no_tanh_grad, "softcap without 1 - tanh^2", "d_q");
  expect_fail(&in, flash_uncapped_p, "softcap: P from uncapped logits", "d_q");
  expect_fail(&in, prod_no_cap, "softcap ignored (builtin)", "d_q");
  h_free(&in);
  /* both, with the base-2 LSE the flash kernels save */
  qc_contract c = {0};
  cr_assert_eq(qc_contract_set(&c, "lse_base", "2", 0, 0), QC_OK);
  cr_assert_eq(qc_contract_set(&c, "window", "", 7, 1), QC_OK);
  cr_assert_eq(qc_contract_set(&c, "softcap", "", 3, 1), QC_OK);
  h_make_with(&in, "attention", "1,4,2,40,16", 16, "normal", &c);
  h_expect_pass(&in, ATT_TOL);
  expect_fail(&in, prod_win_wide, "window W + 1, softcap, base 2", "d_q");
  expect_fail(&in, prod_no_cap, "softcap ignored, window, base 2", "d_q");
  h_free(&in);
}

/* Run m's production (prod = 1) or its reference on in with dY zero but at
 * query row i of every head; d_v [B, Hkv, S, D] into dv (float64, numel). */
static void dv_of_row(h_inst *in, int prod, int64_t i, double *dv) {
  const int64_t S = in->dy.shape[2], D = in->dy.shape[3];
  float *y = in->dy.data;
  for (int64_t e = 0; e < qc_numel(&in->dy); e++)
    if ((e / D) % S != i) y[e] = 0.0f;
  qc_ctx ctx = {.be = qc_backend_cpu(), .profile = "vllm"};
  qc_tset g = {0};
  cr_assert_eq((prod ? in->row->cls->production : in->row->reference)(&ctx, &in->m, &in->dy, &g), QC_OK);
  const qc_tensor *t = qc_tset_get(&g, "d_v");
  double *x = h_f64(t);
  memcpy(dv, x, (size_t)qc_numel(t) * sizeof *dv);
  free(x);
  qc_tset_free(&g);
}

/* Both sides of the window edge (Hugging Face's mask: key j is visible to
 * query i when i - W < j <= i): with dY only on query row i, d_v_j = sum_h
 * P_ij dO_i is nonzero exactly for the keys row i attends. The key at
 * i - W + 1 is attended, the key at i - W is not, in the production and the
 * reference; rows before i - W and after i get nothing. */
Test(attention, window_edge_both_sides) {
  const int64_t S = 12, D = 8, W = 4, i = 9;
  for (int prod = 0; prod < 2; prod++) {
    h_inst in;
    const char *win[] = {"window=4", "softcap=20", NULL};
    h_make(&in, "attention", "1,2,1,12,8", 17, "normal", win);
    double dv[12 * 8];
    dv_of_row(&in, prod, i, dv);
    for (int64_t j = 0; j < S; j++) {
      double n = 0;
      for (int64_t d = 0; d < D; d++) n += fabs(dv[j * D + d]);
      const int attended = j > i - W && j <= i;
      cr_expect_eq(n > 0, attended, "%s: key %lld for query %lld under window %lld: %s (|d_v| %g)",
                   prod ? "production" : "reference", (long long)j, (long long)i, (long long)W,
                   attended ? "must be attended" : "must be masked", n);
    }
    h_free(&in);
  }
}

/* The saved intermediates disagree with the forward of q, k, v: the builtin
 * (correct backward formula) reads them, so its gradients are wrong and the
 * reference (which never reads them) catches it. */
Test(attention, stale_saved_intermediates_fail) {
  h_inst in;
  h_make(&in, "attention", "1,4,2,64,32", 12, "normal", NULL);
  h_expect_pass(&in, ATT_TOL);
  /* an LSE saved in log2 while the contract says "e" */
  qc_tensor *l = qc_tset_get_mut(&in.m.saved, "lse");
  float *lf = l->data;
  for (int64_t i = 0; i < qc_numel(l); i++) lf[i] = (float)(lf[i] * LOG2E);
  expect_fail(&in, h_prod("attention"), "saved lse in log2 under lse_base e", "d_q");
  for (int64_t i = 0; i < qc_numel(l); i++) lf[i] = (float)(lf[i] / LOG2E);
  h_expect_pass(&in, ATT_TOL);
  h_free(&in);
  /* an O saved by a forward with a different scale (1.25 / sqrt(D)); the LSE is right */
  h_inst a, b;
  const char *right[] = {"softmax_scale=0.1767766952966369", NULL}; /* 1/sqrt(32) */
  const char *other[] = {"softmax_scale=0.2209708691207961", NULL}; /* 1.25/sqrt(32) */
  h_make(&a, "attention", "1,4,2,64,32", 13, "normal", right);
  h_make(&b, "attention", "1,4,2,64,32", 13, "normal", other);
  h_expect_pass(&a, ATT_TOL);
  qc_tensor *oa = qc_tset_get_mut(&a.m.saved, "out");
  const qc_tensor *ob = qc_tset_get(&b.m.saved, "out");
  cr_assert_eq(qc_numel(oa), qc_numel(ob));
  memcpy(oa->data, ob->data, (size_t)qc_numel(oa) * sizeof(float));
  expect_fail(&a, h_prod("attention"), "saved out from scale 1.25/sqrt(D)", "d_q");
  h_free(&a);
  h_free(&b);
}

/* Edge cases: S = 1 and the causal first row (one visible key: the softmax
 * has no gradient, d_q is exactly 0 in both), large logits (no overflow),
 * GQA 4, D not a multiple of 8. */
Test(attention, edge_cases) {
  h_inst in;
  qc_ctx ctx = {.be = qc_backend_cpu(), .profile = "vllm"};
  qc_tset g = {0};
  h_make(&in, "attention", "2,8,2,1,13", 5, "normal", NULL);
  h_expect_pass(&in, ATT_TOL);
  cr_assert_eq(in.row->cls->production(&ctx, &in.m, &in.dy, &g), QC_OK);
  const qc_tensor *dq = qc_tset_get(&g, "d_q");
  for (int64_t i = 0; i < qc_numel(dq); i++) cr_expect_eq(((float *)dq->data)[i], 0.0f, "S = 1: d_q[%lld] != 0", (long long)i);
  qc_tset_free(&g);
  h_free(&in);
  /* causal first row: d_q row 0 of every head is exactly 0 */
  h_make(&in, "attention", "1,8,2,23,12", 6, "normal", NULL);
  h_expect_pass(&in, ATT_TOL);
  cr_assert_eq(in.row->cls->production(&ctx, &in.m, &in.dy, &g), QC_OK);
  dq = qc_tset_get(&g, "d_q");
  for (int64_t h = 0; h < 8; h++)
    for (int64_t d = 0; d < 12; d++) cr_expect_eq(((float *)dq->data)[h * 23 * 12 + d], 0.0f);
  qc_tset_free(&g);
  h_free(&in);
  /* large logits: head 0's queries x 64 give logits in the hundreds; exp of
   * them overflows float32, the LSE-based P does not */
  h_make(&in, "attention", "1,4,1,96,40", 7, "special", NULL);
  const qc_tensor *l = qc_tset_get(&in.m.saved, "lse");
  float mx = 0;
  for (int64_t i = 0; i < qc_numel(l); i++) mx = fmaxf(mx, ((float *)l->data)[i]);
  cr_expect(mx > 89.0f, "special values reach logits beyond expf's range (max LSE %g)", mx);
  h_expect_pass(&in, ATT_TOL_SPECIAL);
  h_free(&in);
}

Test(attention, fd_agrees) {
  static const char *const sets[][3] = {
      {NULL}, {"causal=false", "softmax_scale=0.4", NULL}, {"window=2", "softcap=1.2", NULL}, {"window=3", NULL}};
  static const char *const shapes[] = {"2,4,2,5,6", "1,4,1,6,9", "1,1,1,1,4"};
  h_fd_agrees("attention", shapes, 3, sets, 4, 21);
}

Test(attention, bad_input_is_refused) {
  h_inst in;
  h_make(&in, "attention", "1,4,2,5,8", 1, "normal", NULL);
  /* Hq not a multiple of Hkv: q claims 3 heads */
  qc_tensor *q = qc_tset_get_mut(&in.m.inputs, "q");
  q->shape[1] = 3;
  h_expect_refused(&in, "inputs/k");
  q->shape[1] = 4;
  /* lse of the wrong shape */
  qc_tensor *l = qc_tset_get_mut(&in.m.saved, "lse");
  l->shape[2] = 4;
  h_expect_refused(&in, "lse");
  l->shape[2] = 5;
  /* out of the wrong shape */
  qc_tensor *o = qc_tset_get_mut(&in.m.saved, "out");
  o->shape[3] = 7;
  h_expect_refused(&in, "out");
  o->shape[3] = 8;
  /* v of another shape than k */
  qc_tensor *v = qc_tset_get_mut(&in.m.inputs, "v");
  v->shape[2] = 4;
  h_expect_refused(&in, "inputs/v");
  v->shape[2] = 5;
  /* missing lse */
  snprintf(l->name, sizeof l->name, "lse_gone");
  h_expect_refused(&in, "lse");
  snprintf(l->name, sizeof l->name, "lse");
  h_expect_pass(&in, ATT_TOL);
  h_free(&in);
  /* unknown lse_base, causal not a bool, a scale that is no number: the contract is refused naming the key */
  const qc_class *cls = qc_registry_find("attention")->cls;
  const char *bad[][2] = {{"lse_base", "10"}, {"lse_base", "ten"}, {"causal", "maybe"}, {"softmax_scale", "big"},
                          {"window", "all"}, {"softcap", "none"}};
  for (int i = 0; i < 6; i++) {
    qc_contract c = {0};
    cr_assert_eq(qc_contract_set(&c, bad[i][0], bad[i][1], 0, 0), QC_OK);
    qc_err_clear();
    cr_expect_eq(qc_contract_validate(&c, cls->keys, "class 'attention'"), QC_EINPUT, "%s=%s accepted", bad[i][0], bad[i][1]);
    cr_expect(strstr(qc_err_msg(), bad[i][0]) != NULL, "message '%s' does not name %s", qc_err_msg(), bad[i][0]);
  }
  qc_err_clear();
  /* numbers the keys cannot take: both sides refuse, naming the key */
  const char *nums[][3] = {{"window=-1", NULL}, {"window=2.5", NULL}, {"window=3", "causal=false"}, {"softcap=-1", NULL}};
  for (int i = 0; i < 4; i++) {
    const char *sets[3] = {nums[i][0], nums[i][1], NULL};
    h_make(&in, "attention", "1,4,2,5,8", 1, "normal", NULL);
    for (int s = 0; sets[s]; s++) {
      char key[32];
      snprintf(key, sizeof key, "%.*s", (int)strcspn(sets[s], "="), sets[s]);
      const char *val = sets[s] + strlen(key) + 1;
      char *end;
      const double x = strtod(val, &end);
      cr_assert_eq(*end ? qc_contract_set(&in.m.contract, key, val, 0, 0) : qc_contract_set(&in.m.contract, key, "", x, 1), QC_OK);
    }
    h_expect_refused(&in, strchr(nums[i][0], 'w') ? "window" : "softcap");
    h_free(&in);
  }
}
