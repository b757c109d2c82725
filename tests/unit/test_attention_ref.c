/* test_attention_ref.c: the attention reference (src/reference/attention.c,
 * its products blocked GEMMs of at most 256 query rows) against a naive
 * evaluation of its file comment's math, one query and one key at a time:
 * the gradients, the terms' scale (ctx->terms), the saved O and LSE and
 * the LSE's terms. S is not a multiple of the block (300, 520, 270), so the
 * last block is short, the causal offset moves the diagonal across a block
 * edge (+3; -5: the first queries see no key), the window starts the later
 * blocks' keys past 0 (the skipped key ranges), the softcap bends the
 * logits, GQA sums two query heads into a kv head, Dv differs from D
 * (MLA), and O read in bfloat16 for Delta. */
#include <criterion/criterion.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend/backend.h"
#include "class_harness.h"
#include "core/qc.h"
#include "numerics/formats.h"

typedef struct {
  int64_t B, Hq, Hkv, S, D, Dv, W, off;
  double sc, cap;
  int causal;
} dims;

/* The visible keys [*lo, *hi) of query i. */
static void keys(const dims *d, int64_t i, int64_t *lo, int64_t *hi) {
  *hi = d->causal ? i + 1 + d->off : d->S;
  if (*hi > d->S) *hi = d->S;
  *lo = d->W > 0 && i - d->W + 1 > 0 ? i - d->W + 1 : 0;
}

static double dot(const double *x, const double *y, int64_t n, int absolute) {
  double s = 0;
  for (int64_t e = 0; e < n; e++) s += absolute ? fabs(x[e] * y[e]) : x[e] * y[e];
  return s;
}

/* The VJP (ab 0) or its terms (ab 1) into dq, dk, dv (zeroed); so: the
 * saved O read in bfloat16 for Delta, or NULL. */
static void naive_vjp(const dims *d, const double *Q, const double *K, const double *V, const double *G,
                      const double *so, int ab, double *dq, double *dk, double *dv) {
  const int64_t S = d->S, D = d->D, Dv = d->Dv, grp = d->Hq / d->Hkv;
  double *s = malloc((size_t)(6 * S) * sizeof *s), *t = s + S, *dp = t + S, *w = dp + S, *pa = w + S, *P = pa + S;
  cr_assert(s);
  for (int64_t bh = 0; bh < d->B * d->Hq; bh++) {
    const int64_t kv = (bh / d->Hq) * d->Hkv + (bh % d->Hq) / grp;
    const double *q = Q + bh * S * D, *g = G + bh * S * Dv, *k = K + kv * S * D, *v = V + kv * S * Dv;
    for (int64_t i = 0; i < S; i++) {
      int64_t lo, hi;
      keys(d, i, &lo, &hi);
      if (hi <= lo) continue;
      double mx = -INFINITY, z = 0, pd = 0, pda = 0;
      for (int64_t j = lo; j < hi; j++) {
        const double r = d->sc * dot(q + i * D, k + j * D, D, 0);
        s[j] = d->cap > 0 ? d->cap * tanh(r / d->cap) : r;
        t[j] = d->cap > 0 ? 1 - tanh(r / d->cap) * tanh(r / d->cap) : 1;
        dp[j] = dot(g + i * Dv, v + j * Dv, Dv, 0);
        w[j] = 1 + d->sc * dot(q + i * D, k + j * D, D, 1);
        pa[j] = dot(g + i * Dv, v + j * Dv, Dv, 1);
        mx = fmax(mx, s[j]);
      }
      for (int64_t j = lo; j < hi; j++) z += exp(s[j] - mx);
      for (int64_t j = lo; j < hi; j++) {
        P[j] = exp(s[j] - mx) / z;
        pd += P[j] * dp[j];
        pda += P[j] * pa[j];
        w[j] += fabs(mx);
      }
      if (so && !ab) {
        pd = 0;
        for (int64_t e = 0; e < Dv; e++) {
          double o = 0;
          for (int64_t j = lo; j < hi; j++) o += P[j] * v[j * Dv + e];
          pd += g[i * Dv + e] * qc_round_to(o, QC_BF16);
        }
      }
      for (int64_t j = lo; j < hi; j++) {
        const double ds = ab ? P[j] * (pa[j] + pda + w[j] * fabs(dp[j] - pd)) * fabs(t[j]) : P[j] * (dp[j] - pd) * t[j];
        for (int64_t e = 0; e < D; e++) {
          dq[(bh * S + i) * D + e] += d->sc * ds * (ab ? fabs(k[j * D + e]) : k[j * D + e]);
          dk[(kv * S + j) * D + e] += d->sc * ds * (ab ? fabs(q[i * D + e]) : q[i * D + e]);
        }
        for (int64_t e = 0; e < Dv; e++)
          dv[(kv * S + j) * Dv + e] += (ab ? P[j] * w[j] * fabs(g[i * Dv + e]) : P[j] * g[i * Dv + e]);
      }
    }
  }
  free(s);
}

/* The forward: O [B, Hq, S, Dv], LSE [B, Hq, S] (-inf without a key) and
 * the LSE's terms T [B, Hq, S]. */
static void naive_fwd(const dims *d, const double *Q, const double *K, const double *V, double *O, double *L, double *T) {
  const int64_t S = d->S, D = d->D, Dv = d->Dv, grp = d->Hq / d->Hkv;
  double *s = malloc((size_t)S * sizeof *s);
  cr_assert(s);
  for (int64_t bh = 0; bh < d->B * d->Hq; bh++) {
    const int64_t kv = (bh / d->Hq) * d->Hkv + (bh % d->Hq) / grp;
    const double *q = Q + bh * S * D, *k = K + kv * S * D, *v = V + kv * S * Dv;
    for (int64_t i = 0; i < S; i++) {
      int64_t lo, hi;
      keys(d, i, &lo, &hi);
      double *o = O + (bh * S + i) * Dv, mx = -INFINITY, z = 0, amax = 0;
      memset(o, 0, (size_t)Dv * sizeof *o);
      L[bh * S + i] = -INFINITY;
      T[bh * S + i] = 0;
      if (hi <= lo) continue;
      for (int64_t j = lo; j < hi; j++) {
        const double r = d->sc * dot(q + i * D, k + j * D, D, 0);
        s[j] = d->cap > 0 ? d->cap * tanh(r / d->cap) : r;
        mx = fmax(mx, s[j]);
        amax = fmax(amax, d->sc * dot(q + i * D, k + j * D, D, 1));
      }
      for (int64_t j = lo; j < hi; j++) z += exp(s[j] - mx);
      for (int64_t j = lo; j < hi; j++)
        for (int64_t e = 0; e < Dv; e++) o[e] += exp(s[j] - mx) / z * v[j * Dv + e];
      L[bh * S + i] = mx + log(z);
      T[bh * S + i] = fabs(mx) + amax + 1;
    }
  }
  free(s);
}

/* got (a float64 tensor) against want [n]: every element within tol of
 * the tensor's largest magnitude; -inf where want is. */
static void expect_close(const qc_tensor *got, const double *want, int64_t n, double tol, const char *what) {
  cr_assert(got, "%s: missing", what);
  cr_assert_eq(qc_numel(got), n, "%s: %lld elements, expected %lld", what, (long long)qc_numel(got), (long long)n);
  const double *x = got->data;
  double big = 0;
  for (int64_t e = 0; e < n; e++)
    if (isfinite(want[e])) big = fmax(big, fabs(want[e]));
  cr_expect(big > 0, "%s: all zero", what);
  int64_t bad = 0, first = -1;
  for (int64_t e = 0; e < n; e++) {
    const int ok = isfinite(want[e]) ? fabs(x[e] - want[e]) <= tol * big : x[e] == want[e];
    if (!ok && !bad++) first = e;
  }
  cr_expect_eq(bad, 0, "%s: %lld of %lld elements off, the first [%lld] %.17g, expected %.17g", what, (long long)bad,
               (long long)n, (long long)first, first >= 0 ? x[first] : 0.0, first >= 0 ? want[first] : 0.0);
}

/* One instance: the reference's gradients, terms, O, LSE (and its tm) against the naive ones. */
static void check(const char *shape, const char *const *sets, int bf16_out, uint64_t seed) {
  h_inst in;
  h_make(&in, "attention", shape, seed, "normal", sets);
  if (bf16_out) cr_assert_eq(qc_contract_set(&in.m.contract, "saved_out_dtype", "bfloat16", 0, 0), QC_OK);
  const qc_tensor *qt = qc_tset_get(&in.m.inputs, "q"), *kt = qc_tset_get(&in.m.inputs, "k");
  const qc_tensor *vt = qc_tset_get(&in.m.inputs, "v"), *ot = qc_tset_get(&in.m.saved, "out");
  const qc_contract *c = &in.m.contract;
  dims d = {.B = qt->shape[0], .Hq = qt->shape[1], .Hkv = kt->shape[1], .S = qt->shape[2], .D = qt->shape[3],
            .Dv = vt->shape[3], .W = (int64_t)qc_contract_num(c, "window", 0),
            .off = (int64_t)qc_contract_num(c, "causal_offset", 0), .cap = qc_contract_num(c, "softcap", 0),
            .causal = strcmp(qc_contract_str(c, "causal", "true"), "false") != 0};
  d.sc = qc_contract_has(c, "softmax_scale") ? qc_contract_num(c, "softmax_scale", 0) : 1.0 / sqrt((double)d.D);
  double *Q = h_f64(qt), *K = h_f64(kt), *V = h_f64(vt), *G = h_f64(&in.dy), *O = h_f64(ot);
  const int64_t nq = qc_numel(qt), nk = qc_numel(kt), nv = qc_numel(vt), no = qc_numel(ot), nl = nq / d.D;
  double *dq = calloc((size_t)nq, sizeof *dq), *dk = calloc((size_t)nk, sizeof *dk), *dv = calloc((size_t)nv, sizeof *dv);
  double *Of = malloc((size_t)no * sizeof *Of), *L = malloc((size_t)nl * sizeof *L), *T = malloc((size_t)nl * sizeof *T);
  cr_assert(dq && dk && dv && Of && L && T);
  for (int ab = 0; ab < 2; ab++) {
    qc_ctx ctx = {.be = qc_backend_cpu(), .profile = "vllm", .terms = ab};
    qc_tset g = {0};
    memset(dq, 0, (size_t)nq * sizeof *dq);
    memset(dk, 0, (size_t)nk * sizeof *dk);
    memset(dv, 0, (size_t)nv * sizeof *dv);
    naive_vjp(&d, Q, K, V, G, bf16_out ? O : NULL, ab, dq, dk, dv);
    cr_assert_eq(in.row->reference(ab ? &ctx : NULL, &in.m, &in.dy, &g), QC_OK, "%s", qc_err_msg());
    char what[160];
    const char *names[3] = {"d_q", "d_k", "d_v"};
    const double *want[3] = {dq, dk, dv};
    const int64_t n[3] = {nq, nk, nv};
    for (int e = 0; e < 3; e++) {
      snprintf(what, sizeof what, "%s %s%s", shape, names[e], ab ? " (terms)" : "");
      expect_close(qc_tset_get(&g, names[e]), want[e], n[e], 1e-11, what);
    }
    qc_tset_free(&g);
  }
  naive_fwd(&d, Q, K, V, Of, L, T);
  const char *sv[2] = {"out", "lse"};
  for (int e = 0; e < 2; e++) {
    qc_tensor r = {0};
    qc_tol_model tm;
    char what[160];
    snprintf(what, sizeof what, "%s saved/%s", shape, sv[e]);
    cr_assert_eq(in.row->saved(NULL, &in.m, sv[e], &r, &tm), QC_OK, "%s", qc_err_msg());
    expect_close(&r, e ? L : Of, e ? nl : no, 1e-12, what);
    qc_tensor_free(&r);
  }
  double tt = 0, tmax = 0;
  for (int64_t i = 0; i < nl; i++) {
    tt += T[i] * T[i];
    tmax = fmax(tmax, T[i]);
  }
  qc_tensor r = {0};
  qc_tol_model tm;
  cr_assert_eq(in.row->saved(NULL, &in.m, "lse", &r, &tm), QC_OK);
  cr_expect(fabs(tm.terms - sqrt(tt)) <= 1e-12 * sqrt(tt), "%s: LSE terms %.17g, expected %.17g", shape, tm.terms, sqrt(tt));
  cr_expect(fabs(tm.scale - tmax) <= 1e-12 * tmax, "%s: LSE scale %.17g, expected %.17g", shape, tm.scale, tmax);
  qc_tensor_free(&r);
  free(Q); free(K); free(V); free(G); free(O); free(dq); free(dk); free(dv); free(Of); free(L); free(T);
  h_free(&in);
}

Test(attention_ref, blocks_match_naive_offset_window_cap) {
  const char *sets[] = {"causal_offset=3", "window=40", "softcap=2", NULL};
  check("1,4,2,300,12,8", sets, 0, 71);
}

Test(attention_ref, blocks_match_naive_empty_rows_bf16_out) {
  const char *sets[] = {"causal_offset=-5", "window=100", NULL};
  check("1,2,1,520,12,8", sets, 1, 72);
}

Test(attention_ref, blocks_match_naive_not_causal) {
  const char *sets[] = {"causal=false", "softmax_scale=0.3", NULL};
  check("2,2,2,270,16", sets, 0, 73);
}

/* The host passes between the GEMMs run on qc_par_for's threads: 1 and 3
 * threads give the same bits (each row alone; d_k, d_v summed in a fixed
 * order), gradients and terms alike. A guard of the host passes only:
 * OpenBLAS's own thread count is not varied here, and the loops before the
 * GEMMs were thread-independent too. */
Test(attention_ref, threads_do_not_change_bits) {
  const char *sets[] = {"causal_offset=2", "window=50", "softcap=3", NULL};
  h_inst in;
  h_make(&in, "attention", "1,4,2,300,12,8", 74, "normal", sets);
  const char *names[3] = {"d_q", "d_k", "d_v"};
  for (int ab = 0; ab < 2; ab++) {
    qc_ctx ctx = {.be = qc_backend_cpu(), .profile = "vllm", .terms = ab};
    qc_tset g[2] = {{0}, {0}};
    for (int t = 0; t < 2; t++) {
      cr_assert_eq(setenv("QATCHECK_THREADS", t ? "3" : "1", 1), 0);
      cr_assert_eq(in.row->reference(&ctx, &in.m, &in.dy, &g[t]), QC_OK, "%s", qc_err_msg());
    }
    unsetenv("QATCHECK_THREADS");
    for (int e = 0; e < 3; e++) {
      const qc_tensor *a = qc_tset_get(&g[0], names[e]), *b = qc_tset_get(&g[1], names[e]);
      cr_assert(a && b);
      cr_expect(memcmp(a->data, b->data, (size_t)qc_numel(a) * sizeof(double)) == 0, "%s%s: 1 and 3 threads differ",
                names[e], ab ? " (terms)" : "");
    }
    qc_tset_free(&g[0]);
    qc_tset_free(&g[1]);
  }
  h_free(&in);
}
