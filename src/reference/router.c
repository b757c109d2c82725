/* reference/router.c: float64 VJP of the routing weights, from the math.
 *
 * With ids fixed (the forward's selection; no gradient through it), the
 * weights of token t are w_j = c s_{id_j} / D, D = sum_j s_{id_j} + eps
 * (normalize = yes; D = 1 otherwise). The chain rule:
 *   dL/ds_e = sum_j dy_j dw_j/ds_e,  dw_j/ds_e = c (1[e = id_j] / D - s_{id_j} 1[e selected] / D^2)
 *   dL/dlogit_e = sum_f dL/ds_f ds_f/dlogit_e with
 *     softmax:       ds_f/dlogit_e = s_f (1[e = f] - s_e)
 *     sigmoid:       s_e (1 - s_e) on the diagonal
 *     sqrt(softplus): sigma(x) / (2 sqrt(softplus(x))), which tends to
 *                     exp(x/2)/2 as x -> -inf (used below x = -36, where
 *                     the two agree to double precision)
 * The selection bias (params/bias, or params/e_score_correction_bias as
 * transformers names it) gets no gradient: it only selects, as does the
 * group limit (n_group groups of E/n_group experts, topk_group of them
 * kept: DeepSeek-V3's noaux_tc); the weights are the unbiased scores of
 * the selected experts, so the gradient is the same. The selection itself
 * is judged apart (ref_router_select below: saved/topk_ids against the
 * top-k the contract defines, recomputed in float64).
 * The terms' scale (ctx->terms): the same chain with every sum and
 * difference taken over its terms' magnitudes: dL/ds from |c dy| / D and
 * |c dy| s / D^2, the softmax's s |dL/ds| + s sum |dL/ds| s, the
 * sigmoid's s (1 + s) (1 - s is a difference), the sqrt-softplus factor
 * as is (one product). */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "model/module.h"
#include "reference/ref_classes.h"
#include "core/qc.h"
#include "reference/ref_util.h"
#include "numerics/decode.h"

static double softplus(double x) { return x > 0 ? x + log1p(exp(-x)) : log1p(exp(x)); }
static double sigmoid(double x) { return x >= 0 ? 1 / (1 + exp(-x)) : exp(x) / (1 + exp(x)); }

/* The scores s [E] of one token's logits x [E] under score function fn;
 * returns the largest logit (softmax's shift). */
static double scores(const char *fn, const double *x, int64_t E, double *s) {
  double mx = x[0], z = 0;
  for (int64_t e = 1; e < E; e++) mx = x[e] > mx ? x[e] : mx;
  if (strcmp(fn, "softmax") == 0) {
    for (int64_t e = 0; e < E; e++) z += exp(x[e] - mx);
    for (int64_t e = 0; e < E; e++) s[e] = exp(x[e] - mx) / z;
  } else {
    for (int64_t e = 0; e < E; e++) s[e] = strcmp(fn, "sigmoid") == 0 ? sigmoid(x[e]) : sqrt(softplus(x[e]));
  }
  return mx;
}

/* The contract's selection settings of a router with E experts, top k. */
typedef struct rt_cfg {
  const char *score;           /* softmax | sigmoid | sqrt_softplus */
  int64_t ng, tg;              /* n_group, topk_group (0 in the contract: every group) */
  int group_max;               /* 1: a group scored by its largest key, 0: by the sum of its top two */
  int ties_lowest;             /* 1: exact ties to the lower index (tie_break lowest_index); 0: open (any) */
} rt_cfg;

/* The settings of m (E, k: its logits' and ids' widths) into *cf (the
 * group score `auto`: the top two's sum with a selection bias, the largest
 * without). QC_EINPUT naming the key that cannot hold. */
static int rt_cfg_get(const qc_module *m, int64_t E, int64_t k, rt_cfg *cf) {
  memset(cf, 0, sizeof *cf);
  cf->score = qc_contract_str(&m->contract, "score", "softmax");
  const double ngd = qc_contract_num(&m->contract, "n_group", 1), tg0 = qc_contract_num(&m->contract, "topk_group", 0);
  const double tgd = tg0 == 0 ? ngd : tg0; /* 0: every group */
  if (!(ngd >= 1) || ngd != floor(ngd) || ngd > (double)E || E % (int64_t)ngd != 0)
    return qc_err("%s: contract key 'n_group' = %g: expected a whole number dividing E = %lld", m->path, ngd, (long long)E);
  if (!(tgd >= 1) || tgd != floor(tgd) || tgd > ngd)
    return qc_err("%s: contract key 'topk_group' = %g: expected 1..n_group = %g", m->path, tgd, ngd);
  cf->ng = (int64_t)ngd;
  cf->tg = (int64_t)tgd;
  if (k > cf->tg * (E / cf->ng))
    return qc_err("%s: 'saved/topk_ids': k = %lld experts do not fit in topk_group = %lld groups of %lld", m->path, (long long)k,
                  (long long)cf->tg, (long long)(E / cf->ng));
  const char *gs = qc_contract_str(&m->contract, "group_score", "auto");
  const int has_bias = qc_tset_get(&m->params, "bias") || qc_tset_get(&m->params, "e_score_correction_bias");
  cf->group_max = strcmp(gs, "max") == 0 || (strcmp(gs, "auto") == 0 && !has_bias);
  cf->ties_lowest = strcmp(qc_contract_str(&m->contract, "tie_break", "any"), "lowest_index") == 0;
  return QC_OK;
}

/* The float64 VJP from the math above (a qc_vjp_fn): every gradient the contract makes
 * differentiable into grads; QC_EINPUT naming what is wrong with bad input. */
static int ref_router(const qc_ctx *ctx, const qc_module *m, const qc_tensor *dy, qc_tset *grads) {
  const int ab = ctx && ctx->terms;
  const qc_tensor *lt, *it;
  int rc;
  if ((rc = qc_module_need(m, "inputs", "logits", 2, 2, &lt))) return rc;
  if ((rc = qc_module_need(m, "saved", "topk_ids", 2, 2, &it))) return rc;
  const int64_t T = lt->shape[0], E = lt->shape[1], k = it->shape[1];
  if (it->shape[0] != T || k > E) return qc_err("%s: 'saved/topk_ids': expected [%lld, k <= %lld]", m->path, (long long)T, (long long)E);
  if ((rc = qc_module_check_dy(m, dy, T * k, k, "the shape of saved/topk_ids [T, k]"))) return rc;
  rt_cfg cf;
  if ((rc = rt_cfg_get(m, E, k, &cf))) return rc;
  const char *fn = cf.score;
  const int norm = strcmp(qc_contract_str(&m->contract, "normalize", "no"), "yes") == 0;
  const double eps = qc_contract_num(&m->contract, "norm_eps", 1e-20), c = qc_contract_num(&m->contract, "route_scale", 1);
  int64_t *id = NULL;
  double *X = NULL, *G = NULL, *s = NULL, *gs = NULL, *dl;
  if ((rc = qc_refu_ids(m, it, "saved/topk_ids", &id))) return rc;
  rc = QC_ESYS;
  if (!(X = qc_refu_load(lt, "reference router logits")) || !(G = qc_refu_load(dy, "reference router dY"))) goto done;
  if (!(s = qc_malloc((size_t)E * sizeof *s, "reference scores")) || !(gs = qc_malloc((size_t)E * sizeof *gs, "reference dL/ds"))) goto done;
  if ((rc = qc_refu_out(grads, "d_logits", 2, lt->shape, &dl))) goto done;
  for (int64_t t = 0; t < T; t++) {
    const double *x = X + t * E, *g = G + t * k;
    const int64_t *sel = id + t * k;
    for (int64_t j = 0; j < k; j++) {
      if (sel[j] < 0 || sel[j] >= E) { rc = qc_err("%s: 'saved/topk_ids'[%lld, %lld] = %lld: expected 0..%lld", m->path, (long long)t, (long long)j, (long long)sel[j], (long long)(E - 1)); goto done; }
      for (int64_t i = j + 1; i < k; i++)
        if (sel[i] == sel[j]) { rc = qc_err("%s: 'saved/topk_ids' row %lld repeats expert %lld: expected distinct ids", m->path, (long long)t, (long long)sel[j]); goto done; }
    }
    scores(fn, x, E, s);
    /* dL/ds through the (optional) normalization */
    double D = 1.0;
    if (norm) {
      D = eps;
      for (int64_t j = 0; j < k; j++) D += s[sel[j]];
    }
    for (int64_t e = 0; e < E; e++) gs[e] = 0;
    for (int64_t j = 0; j < k; j++) {
      const double cg = ab ? fabs(c * g[j]) : c * g[j], sub = ab ? -1.0 : 1.0;
      gs[sel[j]] += cg / D;
      for (int64_t i = 0; norm && i < k; i++) gs[sel[i]] -= sub * cg * s[sel[j]] / (D * D);
    }
    /* dL/dlogits through the score function */
    double *d = dl + t * E;
    if (strcmp(fn, "softmax") == 0) {
      double sg = 0;
      for (int64_t f = 0; f < E; f++) sg += gs[f] * s[f];
      for (int64_t e = 0; e < E; e++) d[e] = ab ? s[e] * gs[e] + s[e] * sg : s[e] * gs[e] - s[e] * sg;
    } else if (strcmp(fn, "sigmoid") == 0) {
      for (int64_t e = 0; e < E; e++) d[e] = gs[e] * s[e] * (ab ? 1 + s[e] : 1 - s[e]);
    } else {
      for (int64_t e = 0; e < E; e++)
        d[e] = gs[e] * (x[e] < -36 ? 0.5 * exp(0.5 * x[e]) : sigmoid(x[e]) / (2 * s[e])); /* gs >= 0 under ab */
    }
  }
  rc = QC_OK;
done:
  free(id); free(X); free(G); free(s); free(gs);
  return rc;
}

/* ---- the selection: saved/topk_ids against the contract's top-k ----
 *
 * Per token, in float64: the selection keys key_e = s_e + b_e (b the
 * selection bias, 0 without one), each known to within d_e, what the dump
 * leaves open:
 *   d_e = 2 (u_x |x_e| |s'(x_e)| + u_c (4 + w) s_e + u_b |b_e| + 2 u_c |key_e|)
 * u_x the unit roundoff of the logits' dtype (a logit is known to its
 * precision), u_b the bias's, u_c the score arithmetic's (float32 2^-24;
 * bfloat16 2^-8 under compute_dtype); softmax: |x_e| |s'| is s_e (|x_e| +
 * |max x|) (the shift) and w = E (its sum), else w = 0. With group-limited
 * routing (1 < topk_group < n_group) each group's score is the sum of its
 * top two keys (or its largest: group_score) and the topk_group best are
 * kept; then the top k keys among the kept groups' experts. On intervals
 * [key - d, key + d]: one certainly beats another when wholly above it,
 * possibly beats it when they meet. Exact twins (the same logit and bias:
 * every implementation computes the same key) are settled by tie_break
 * (lowest_index: the lower index beats) or left open (any: each possibly
 * beats the other). An expert is possibly selected when its group is
 * possibly kept and fewer than k experts of certainly kept groups
 * certainly beat it; certainly selected when its group is certainly kept
 * and fewer than k experts of possibly kept groups possibly beat it (groups
 * alike, with topk_group). The saved ids pass when they hold every
 * certain expert and only possible ones; a token with fewer certain than
 * possible experts is ambiguous (either way taken). Without uncertainty or
 * ties both sets are the one exact top-k. */

typedef struct rt_iv {
  double v, lo, hi;            /* the value (key or group score) and its interval */
  double x, b;                 /* an expert's logit and bias (its twins); groups: the value and lo */
} rt_iv;

/* f (index fi) beats e (index ei): certainly (want 0) or possibly (1). */
static int beats(const rt_iv *f, int64_t fi, const rt_iv *e, int64_t ei, int lowest, int possibly) {
  if (f->x == e->x && f->b == e->b) return lowest ? fi < ei : possibly; /* twins: the tie rule */
  return possibly ? f->hi >= e->lo : f->lo > e->hi;
}

/* Of the n items iv (item i counted only where in[i]), fewer than lim beat
 * item e (certainly or possibly). */
static int fewer_beat(const rt_iv *iv, int64_t n, const unsigned char *in, int64_t e, int64_t lim, int lowest, int possibly) {
  int64_t c = 0;
  for (int64_t f = 0; f < n && c < lim; f++)
    if (f != e && in[f] && beats(&iv[f], f, &iv[e], e, lowest, possibly)) c++;
  return c < lim;
}

/* The exact top lim of iv[0..n) among in[] (ties to the lower index) into
 * out[lim]. */
static void exact_top(const rt_iv *iv, int64_t n, const unsigned char *in, int64_t lim, int64_t *out) {
  for (int64_t j = 0; j < lim; j++) {
    int64_t best = -1;
    for (int64_t e = 0; e < n; e++) {
      int used = 0;
      for (int64_t i = 0; i < j; i++) used |= out[i] == e;
      if (!used && in[e] && (best < 0 || iv[e].v > iv[best].v)) best = e;
    }
    out[j] = best;
  }
}

/* "[3, 7, 12]" (n ids, sorted) into buf[size]. */
static void ids_str(const int64_t *id, int64_t n, char *buf, size_t size) {
  int64_t prev = -1;
  size_t l = (size_t)snprintf(buf, size, "[");
  for (int64_t j = 0; j < n && l < size; j++) {
    int64_t next = INT64_MAX;
    for (int64_t i = 0; i < n; i++)
      if (id[i] > prev && id[i] < next) next = id[i];
    l += (size_t)snprintf(buf + l, size - l, "%s%lld", j ? ", " : "", (long long)next);
    prev = next;
  }
  if (l < size) snprintf(buf + l, size - l, "]");
}

/* The bias of m [E] (params/bias or params/e_score_correction_bias) into
 * *bt (NULL: none). QC_EINPUT when both, or one not of E values. */
static int rt_bias(const qc_module *m, int64_t E, const qc_tensor **bt) {
  const qc_tensor *a = qc_tset_get(&m->params, "bias"), *b = qc_tset_get(&m->params, "e_score_correction_bias");
  if (a && b)
    return qc_err("%s: params/bias and params/e_score_correction_bias are both present: expected one selection bias", m->path);
  *bt = a ? a : b;
  if (*bt && qc_numel(*bt) != E)
    return qc_err("%s: params/%s holds %lld values: expected one per expert (E = %lld)", m->path, (*bt)->name,
                  (long long)qc_numel(*bt), (long long)E);
  return QC_OK;
}

/* One token's keys with their intervals into iv[E] (QC_OK; QC_NA when a
 * key is not finite: the token is not judged). */
static int token_keys(const rt_cfg *cf, const double *x, const double *b, int64_t E, double ux, double ub, double uc, double *s,
                      rt_iv *iv) {
  const int sm = strcmp(cf->score, "softmax") == 0, sg = strcmp(cf->score, "sigmoid") == 0;
  const double mx = scores(cf->score, x, E, s), w = sm ? (double)E : 0;
  for (int64_t e = 0; e < E; e++) {
    const double be = b ? b[e] : 0, key = s[e] + be;
    if (!isfinite(key)) return QC_NA;
    const double dx = sm ? s[e] * (fabs(x[e]) + fabs(mx)) : fabs(x[e]) * (sg ? s[e] * (1 - s[e])
                                                                             : x[e] < -36 ? 0.5 * exp(0.5 * x[e])
                                                                                          : sigmoid(x[e]) / (2 * s[e]));
    const double d = 2 * (ux * dx + uc * (4 + w) * s[e] + ub * fabs(be) + 2 * uc * fabs(key));
    iv[e] = (rt_iv){.v = key, .lo = key - d, .hi = key + d, .x = x[e], .b = be};
  }
  return QC_OK;
}

/* The groups' scores of one token (iv[E], groups of gs) into gv[ng]. */
static void group_scores(const rt_cfg *cf, const rt_iv *iv, int64_t gs, rt_iv *gv) {
  for (int64_t g = 0; g < cf->ng; g++) {
    double t[3][2]; /* the top two of the value, lo, hi */
    for (int q = 0; q < 3; q++) t[q][0] = t[q][1] = -INFINITY;
    for (int64_t e = g * gs; e < (g + 1) * gs; e++) {
      const double v[3] = {iv[e].v, iv[e].lo, iv[e].hi};
      for (int q = 0; q < 3; q++) {
        if (v[q] > t[q][0]) { t[q][1] = t[q][0]; t[q][0] = v[q]; }
        else if (v[q] > t[q][1]) t[q][1] = v[q];
      }
    }
    double r[3];
    for (int q = 0; q < 3; q++) r[q] = cf->group_max || gs == 1 ? t[q][0] : t[q][0] + t[q][1];
    gv[g] = (rt_iv){.v = r[0], .lo = r[1], .hi = r[2], .x = r[0], .b = r[1]};
  }
}

/* saved/topk_ids judged as a selection (a qc_select_ref_fn). */
static int ref_router_select(const qc_ctx *ctx, const qc_module *m, const char *name, qc_select_result *r) {
  (void)ctx;
  if (strcmp(name, "topk_ids") != 0) return QC_NA;
  const qc_tensor *lt, *it, *bt = NULL;
  int rc;
  if ((rc = qc_module_need(m, "inputs", "logits", 2, 2, &lt))) return rc;
  if ((rc = qc_module_need(m, "saved", "topk_ids", 2, 2, &it))) return rc;
  const int64_t T = lt->shape[0], E = lt->shape[1], k = it->shape[1];
  if (it->shape[0] != T || k > E) return qc_err("%s: 'saved/topk_ids': expected [%lld, k <= %lld]", m->path, (long long)T, (long long)E);
  rt_cfg cf;
  if ((rc = rt_cfg_get(m, E, k, &cf)) || (rc = rt_bias(m, E, &bt))) return rc;
  const int limited = cf.tg < cf.ng;
  const int64_t gs = E / cf.ng;
  const double ux = qc_dtype_unit(lt->dtype), ub = bt ? qc_dtype_unit(bt->dtype) : 0;
  const double uc = strcmp(qc_contract_str(&m->contract, "compute_dtype", "float32"), "bfloat16") == 0 ? 0x1p-8 : 0x1p-24;
  char grp[96] = "";
  if (limited)
    snprintf(grp, sizeof grp, ", in the best %lld of %lld groups by their %s", (long long)cf.tg, (long long)cf.ng,
             cf.group_max ? "largest key" : "top-2 key sum");
  snprintf(r->rule, sizeof r->rule, "top-%lld of %s(logits)%s%s, exact ties %s", (long long)k, cf.score, bt ? " + bias" : "", grp,
           cf.ties_lowest ? "to the lower index" : "either way");
  int64_t *id = NULL, *ex = NULL;
  double *X = NULL, *B = NULL, *s = NULL;
  rt_iv *iv = NULL, *gv = NULL;
  unsigned char *fl = NULL, *all, *gp, *gc, *inp, *inc, *ep, *ec;
  if ((rc = qc_refu_ids(m, it, "saved/topk_ids", &id))) return rc;
  rc = QC_ESYS;
  if (!(X = qc_refu_load(lt, "reference router logits")) || (bt && !(B = qc_refu_load(bt, "reference router bias")))) goto done;
  if (!(s = qc_malloc((size_t)E * sizeof *s, "reference scores")) || !(iv = qc_malloc((size_t)E * sizeof *iv, "reference keys")) ||
      !(gv = qc_malloc((size_t)cf.ng * sizeof *gv, "reference group scores")) ||
      !(ex = qc_malloc((size_t)(k + cf.tg) * sizeof *ex, "reference selection")) ||
      !(fl = qc_malloc((size_t)(3 * cf.ng + 4 * E), "reference selection flags")))
    goto done;
  all = fl, gp = all + cf.ng, gc = gp + cf.ng, inp = gc + cf.ng, inc = inp + E, ep = inc + E, ec = ep + E;
  memset(all, 1, (size_t)cf.ng);
  for (int64_t e = 0; B && e < E; e++)
    if (!isfinite(B[e])) {
      rc = qc_err("%s: params/%s[%lld] is %g: expected a finite selection bias", m->path, bt->name, (long long)e, B[e]);
      goto done;
    }
  r->unit = "tokens";
  r->rows = T;
  r->first = -1;
  for (int64_t t = 0; t < T; t++) {
    const int64_t *sel = id + t * k;
    for (int64_t j = 0; j < k; j++) {
      if (sel[j] < 0 || sel[j] >= E) {
        rc = qc_err("%s: 'saved/topk_ids'[%lld, %lld] = %lld: expected 0..%lld", m->path, (long long)t, (long long)j,
                    (long long)sel[j], (long long)(E - 1));
        goto done;
      }
      for (int64_t i = j + 1; i < k; i++)
        if (sel[i] == sel[j]) {
          rc = qc_err("%s: 'saved/topk_ids' row %lld repeats expert %lld: expected distinct ids", m->path, (long long)t,
                      (long long)sel[j]);
          goto done;
        }
    }
    if (token_keys(&cf, X + t * E, B, E, ux, ub, uc, s, iv) != QC_OK) { /* a non-finite key: not judged */
      r->unjudged++;
      continue;
    }
    /* the groups kept, possibly and certainly (all of them when not limited) */
    memset(gp, 1, (size_t)(2 * cf.ng));
    if (limited) {
      group_scores(&cf, iv, gs, gv);
      for (int64_t g = 0; g < cf.ng; g++) {
        gp[g] = (unsigned char)fewer_beat(gv, cf.ng, all, g, cf.tg, cf.ties_lowest, 0);
        gc[g] = (unsigned char)fewer_beat(gv, cf.ng, all, g, cf.tg, cf.ties_lowest, 1);
      }
    }
    for (int64_t e = 0; e < E; e++) inp[e] = gp[e / gs], inc[e] = gc[e / gs];
    int64_t np = 0, nc = 0, held = 1, nsel_c = 0;
    for (int64_t e = 0; e < E; e++) {
      ep[e] = (unsigned char)(inp[e] && fewer_beat(iv, E, inc, e, k, cf.ties_lowest, 0));
      ec[e] = (unsigned char)(inc[e] && fewer_beat(iv, E, inp, e, k, cf.ties_lowest, 1));
      np += ep[e];
      nc += ec[e];
    }
    for (int64_t j = 0; j < k; j++) {
      held &= ep[sel[j]];
      nsel_c += ec[sel[j]];
    }
    r->ambiguous += np > nc;
    if (held && nsel_c == nc) continue;
    if (r->differ++ == 0) { /* the first: its saved ids and the contract's exact selection */
      char a[160], c[160];
      if (limited) {
        exact_top(gv, cf.ng, all, cf.tg, ex + k);
        memset(gp, 0, (size_t)cf.ng);
        for (int64_t i = 0; i < cf.tg; i++) gp[ex[k + i]] = 1;
        for (int64_t e = 0; e < E; e++) inp[e] = gp[e / gs];
      }
      exact_top(iv, E, inp, k, ex);
      ids_str(sel, k, a, sizeof a);
      ids_str(ex, k, c, sizeof c);
      r->first = t;
      snprintf(r->first_says, sizeof r->first_says, "token %lld selects %s, the contract %s", (long long)t, a, c);
    }
  }
  rc = QC_OK;
done:
  free(id); free(ex); free(X); free(B); free(s); free(iv); free(gv); free(fl);
  return rc;
}

/* The class's reference, its one export (src/classes/registry.c pairs it
 * with src/modules/router.c). */
const qc_reference qc_reference_router = {.vjp = ref_router, .select = ref_router_select, .selected = "topk_ids", .terms = 1};
