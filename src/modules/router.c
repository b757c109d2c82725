/* modules/router.c: the production router-score VJP, as DS4 wrote it: an
 * FP32 replay of the score function and the normalization of the selected
 * weights, with the expert ids fixed from the forward.
 *
 *   logits [T, E], topk_ids [T, k] (saved by the forward), bias [E] (optional,
 *   selection only)
 *   s = score(logits): softmax over E | sigmoid | sqrt(softplus)
 *   forward  y[t,j] = c s[t, id_j] / D_t,  D_t = sum_j s[t, id_j] + norm_eps
 *            when normalize = yes (else D_t = 1), c = route_scale
 *   d_s[t, id_j]  = c (dy_j / D - sum_i dy_i s_i / D^2)   (normalize = yes)
 *                 = c dy_j                                 (normalize = no)
 *   d_logits      = the score function's VJP of d_s (zero at unselected
 *                   experts for sigmoid/sqrt_softplus; all experts for softmax)
 * The ids are never recomputed: ties resolve as the forward recorded them,
 * and no gradient flows through the selection (nor to the bias). With
 * group-limited routing (n_group, topk_group: DeepSeek-V3's noaux_tc) the
 * selection changes but not the weights, which come from the unbiased
 * scores; the ids are checked to lie in at most topk_group groups. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "model/modinfo.h"
#include "model/module.h"
#include "modules/classes.h"
#include "numerics/formats.h"
#include "core/qc.h"
#include "modules/mod_util.h"

static const qc_key_spec router_keys[] = {
    {"score", "softmax|sigmoid|sqrt_softplus", "softmax", "score function of the logits (softmax over all experts)"},
    {"normalize", "no|yes", "no", "yes: selected weights divided by their sum (+ norm_eps)"},
    {"norm_eps", NULL, "1e-20", "added to the selected weights' sum when normalize = yes"},
    {"route_scale", NULL, "1", "constant factor on the routing weights (DeepSeek-V3's routed_scaling_factor)"},
    {"n_group", NULL, "1", "expert groups for group-limited top-k (DeepSeek-V3's noaux_tc): E/n_group consecutive experts each"},
    {"topk_group", NULL, "0", "groups kept per token (by group_score; 0: all n_group); the k experts are chosen among theirs"},
    {"group_score", "auto|top2_sum|max", "auto", "a group's score: the sum of its top-2 score + bias, or its largest (auto: top2_sum "
     "with a selection bias, max without, as DeepSeek-V3's Gate)"},
    {"tie_break", "any|lowest_index", "any", "exactly tied selection keys: any of them may be selected (torch.topk's order is "
     "unspecified), or the lower expert index first"},
    {NULL, NULL, NULL, NULL}};

enum { SC_SOFTMAX, SC_SIGMOID, SC_SQRT_SOFTPLUS };

/* The tensors and settings of a router module. */
typedef struct {
  const qc_tensor *logits, *ids;
  int64_t T, E, k;
  int64_t ng, tg; /* n_group (groups of E/ng experts), topk_group */
  int score, normalize;
  double eps, scale;
  int64_t *id;   /* [T*k], checked in range and distinct per token */
} rt_view;

/* The group limit of v (v->E and v->k read): n_group divides E, 1 <=
 * topk_group <= n_group (topk_group 0: n_group), k fits in topk_group
 * groups. Returns a status. */
static int rt_groups_get(const qc_module *m, rt_view *v) {
  const double ng = qc_contract_num(&m->contract, "n_group", 1), tg0 = qc_contract_num(&m->contract, "topk_group", 0);
  const double tg = tg0 == 0 ? ng : tg0; /* 0: every group */
  if (!(ng >= 1) || ng != floor(ng) || ng > (double)v->E || v->E % (int64_t)ng != 0)
    return qc_err("%s: contract key 'n_group' is %g: expected a whole number >= 1 dividing E = %lld", m->path, ng, (long long)v->E);
  if (!(tg >= 1) || tg != floor(tg) || tg > ng)
    return qc_err("%s: contract key 'topk_group' is %g: expected a whole number in 1..n_group = %g", m->path, tg, ng);
  v->ng = (int64_t)ng;
  v->tg = (int64_t)tg;
  if (v->k > v->tg * (v->E / v->ng))
    return qc_err("%s: 'saved/topk_ids' selects k = %lld experts: topk_group = %lld groups of %lld hold only %lld", m->path,
                  (long long)v->k, (long long)v->tg, (long long)(v->E / v->ng), (long long)(v->tg * (v->E / v->ng)));
  return QC_OK;
}

static int rt_view_get(const qc_module *m, rt_view *v) {
  int rc;
  memset(v, 0, sizeof *v);
  if ((rc = qc_module_need(m, "inputs", "logits", 2, 2, &v->logits))) return rc;
  if ((rc = qc_module_need(m, "saved", "topk_ids", 2, 2, &v->ids))) return rc;
  v->T = v->logits->shape[0];
  v->E = v->logits->shape[1];
  v->k = v->ids->shape[1];
  if (v->ids->shape[0] != v->T || v->k > v->E)
    return qc_err("%s: 'saved/topk_ids' is [%lld, %lld]: expected [%lld, k] with k <= %lld experts", m->path,
                  (long long)v->ids->shape[0], (long long)v->k, (long long)v->T, (long long)v->E);
  const char *sc = qc_contract_str(&m->contract, "score", "softmax");
  v->score = strcmp(sc, "sigmoid") == 0 ? SC_SIGMOID : strcmp(sc, "sqrt_softplus") == 0 ? SC_SQRT_SOFTPLUS : SC_SOFTMAX;
  v->normalize = strcmp(qc_contract_str(&m->contract, "normalize", "no"), "yes") == 0;
  v->eps = qc_contract_num(&m->contract, "norm_eps", 1e-20);
  v->scale = qc_contract_num(&m->contract, "route_scale", 1);
  if ((rc = rt_groups_get(m, v))) return rc;
  if ((rc = qc_mod_ids(m, v->ids, "saved/topk_ids", &v->id))) return rc;
  for (int64_t t = 0; t < v->T; t++)
    for (int64_t j = 0; j < v->k; j++) {
      int64_t e = v->id[t * v->k + j];
      if (e < 0 || e >= v->E) return qc_err("%s: 'saved/topk_ids'[%lld, %lld] is %lld: expected an expert 0..%lld", m->path, (long long)t, (long long)j, (long long)e, (long long)v->E - 1);
      for (int64_t i = 0; i < j; i++)
        if (v->id[t * v->k + i] == e) return qc_err("%s: 'saved/topk_ids' row %lld selects expert %lld twice: expected distinct ids", m->path, (long long)t, (long long)e);
    }
  return QC_OK;
}

/* float32 scores of one token's logits row [E]. */
static void scores_f32(const rt_view *v, const float *x, float *s) {
  float mx = -INFINITY, sum = 0.0f;
  for (int64_t e = 0; e < v->E; e++) {
    if (v->score == SC_SIGMOID) s[e] = 1.0f / (1.0f + expf(-x[e]));
    else if (v->score == SC_SQRT_SOFTPLUS) s[e] = sqrtf(x[e] > 20.0f ? x[e] : log1pf(expf(x[e])));
    else mx = fmaxf(mx, x[e]);
  }
  if (v->score != SC_SOFTMAX) return;
  for (int64_t e = 0; e < v->E; e++) sum += (s[e] = expf(x[e] - mx));
  for (int64_t e = 0; e < v->E; e++) s[e] /= sum;
}

/* Production VJP (see the file comment). */
static int router_vjp(const qc_ctx *ctx, const qc_module *m, const qc_tensor *dy, qc_tset *grads) {
  (void)ctx;
  rt_view v;
  int rc = rt_view_get(m, &v);
  float *x = NULL, *g = NULL, *s = NULL, *ds = NULL, *dl;
  if (rc) goto done;
  if ((rc = qc_module_check_dy(m, dy, v.T * v.k, v.k, "the shape of saved/topk_ids [T, k]"))) goto done;
  rc = QC_ESYS;
  x = qc_mod_f32(v.logits, "router logits");
  g = qc_mod_f32(dy, "router dY");
  s = qc_malloc((size_t)v.E * sizeof *s, "router scores");
  ds = qc_malloc((size_t)v.E * sizeof *ds, "router score grads");
  if (!x || !g || !s || !ds) goto done;
  if ((rc = qc_mod_add(grads, "d_logits", QC_F32, 2, v.logits->shape, (void **)&dl))) goto done;
  const float c = (float)v.scale;
  for (int64_t t = 0; t < v.T; t++) {
    const float *xr = x + t * v.E, *gr = g + t * v.k;
    const int64_t *id = v.id + t * v.k;
    scores_f32(&v, xr, s);
    float D = 1.0f, sdy = 0.0f;
    if (v.normalize) {
      D = (float)v.eps;
      for (int64_t j = 0; j < v.k; j++) {
        D += s[id[j]];
        sdy += gr[j] * s[id[j]];
      }
    }
    memset(ds, 0, (size_t)v.E * sizeof *ds);
    for (int64_t j = 0; j < v.k; j++) ds[id[j]] = v.normalize ? c * (gr[j] / D - sdy / (D * D)) : c * gr[j];
    float *dr = dl + t * v.E, dot = 0.0f;
    for (int64_t e = 0; e < v.E; e++) dot += ds[e] * s[e];
    for (int64_t e = 0; e < v.E; e++) {
      if (v.score == SC_SOFTMAX) dr[e] = s[e] * (ds[e] - dot);
      else if (v.score == SC_SIGMOID) dr[e] = ds[e] * s[e] * (1.0f - s[e]);
      else dr[e] = s[e] > 0.0f ? ds[e] / (1.0f + expf(-xr[e])) / (2.0f * s[e]) : 0.0f; /* sigma/(2 sqrt(sp)) */
    }
  }
  rc = QC_OK;
done:
  free(x); free(g); free(s); free(ds); free(v.id);
  return rc;
}

/* Hypothesis: the backward re-selected the experts (top-k of the logits,
 * without the selection bias) instead of using the forward's saved ids. */
static int router_reselect(const qc_module *m, qc_module *alt, char *detail, size_t n) {
  rt_view v;
  int rc = rt_view_get(m, &v);
  if (rc) { free(v.id); return rc; }
  double *x = qc_mod_f64(v.logits, "router logits");
  int64_t *nid = NULL, differ = 0;
  int64_t shape[2] = {v.T, v.k};
  rc = QC_ESYS;
  if (!x) goto done;
  if ((rc = qc_tset_clone(&alt->saved, &m->saved))) goto done;
  if ((rc = qc_mod_add(&alt->saved, "topk_ids", QC_I64, 2, shape, (void **)&nid))) goto done;
  for (int64_t t = 0; t < v.T; t++) {
    const double *xr = x + t * v.E;
    for (int64_t j = 0; j < v.k; j++) { /* the j-th largest logit, ties to the lower expert id */
      int64_t best = -1;
      for (int64_t e = 0; e < v.E; e++) {
        int used = 0;
        for (int64_t i = 0; i < j; i++) used |= nid[t * v.k + i] == e;
        if (!used && (best < 0 || xr[e] > xr[best])) best = e;
      }
      nid[t * v.k + j] = best;
    }
    for (int64_t j = 0; j < v.k; j++) {
      int found = 0;
      for (int64_t i = 0; i < v.k; i++) found |= nid[t * v.k + j] == v.id[t * v.k + i];
      differ += !found;
    }
  }
  snprintf(detail, n, "%lld of %lld selections differ from saved/topk_ids", (long long)differ, (long long)(v.T * v.k));
  rc = differ ? QC_OK : QC_NA;
done:
  free(x);
  free(v.id);
  return rc;
}

static const qc_hypothesis router_hyps[] = {
    {"reselected_ids", "/d_logits/", "the experts re-selected in the backward (top-k of the logits, without the selection "
     "bias) instead of the forward's saved ids", router_reselect, 0, NULL, 0},
    {NULL, NULL, NULL, NULL, 0, NULL, 0}};

/* float64 scores of one row (for the forward and the generator's selection). */
static void scores_f64(int score, const double *x, int64_t E, double *s) {
  double mx = -INFINITY, sum = 0;
  for (int64_t e = 0; e < E; e++) mx = fmax(mx, x[e]);
  for (int64_t e = 0; e < E; e++) {
    if (score == SC_SIGMOID) s[e] = 1.0 / (1.0 + exp(-x[e]));
    else if (score == SC_SQRT_SOFTPLUS) s[e] = sqrt(x[e] > 30 ? x[e] + log1p(exp(-x[e])) : log1p(exp(x[e])));
    else sum += (s[e] = exp(x[e] - mx));
  }
  for (int64_t e = 0; score == SC_SOFTMAX && e < E; e++) s[e] /= sum;
}

/* The error model: K = E, the row the gradient reaches (the softmax's sum,
 * the normalization's sums), float32 scores with expf/log1pf: lambda 2.
 * The normalization's dy_j/D - <dy, s>/D^2 (and the softmax's ds - <ds,
 * s>, the sigmoid's 1 - s) subtract terms larger than their result when
 * one score dominates its row (top-1 with normalization: exactly, the
 * weight is 1 whatever the logit) or the scores near 1, and each term
 * carries its own rounding: the terms' scale, T_i the magnitudes of the
 * terms element i adds up, from the reference's terms mode (reference/
 * router.c), judged at lambda 2 sqrt(E) (a softmax's sum rounds every score
 * alike), so a cancelling row is judged against what its arithmetic can
 * make, not against its small result. */
static int router_tol_model(const qc_module *m, const qc_tensor *dy, const char *grad, qc_tol_model *tm) {
  rt_view v;
  int rc = rt_view_get(m, &v);
  free(v.id);
  if (rc) return rc;
  if (strcmp(grad, "d_logits") != 0) return qc_err("%s: class router has no gradient '%s'", m->path, grad);
  if (qc_numel(dy) != v.T * v.k)
    return qc_err("%s: dY has %lld elements: expected T x k = %lld", m->path, (long long)qc_numel(dy), (long long)(v.T * v.k));
  qc_mod_tm(tm, v.E, 2, 0, 0, "K = E = %lld experts, the row the gradient reaches; float32 scores and sums with "
            "expf/log1pf: lambda 2; the terms' scale (the normalization's, softmax's and sigmoid's subtracted terms, "
            "from the reference's terms mode) at lambda 2 sqrt(E)", (long long)v.E);
  tm->terms_lambda = 2 * sqrt((double)v.E);
  return QC_OK;
}

/* Float64 forward y [T, k]; the ids (the discrete branch) are the saved ones. */
static int router_forward(const qc_module *m, const qc_module *branch, qc_tensor *y) {
  (void)branch;
  rt_view v;
  int rc = rt_view_get(m, &v);
  double *x = NULL, *s = NULL;
  if (rc) goto done;
  rc = QC_ESYS;
  if (!(x = qc_mod_f64(v.logits, "router logits")) || !(s = qc_malloc((size_t)v.E * sizeof *s, "router scores"))) goto done;
  if ((rc = qc_tensor_alloc(y, "y", QC_F64, 2, v.ids->shape))) goto done;
  for (int64_t t = 0; t < v.T; t++) {
    scores_f64(v.score, x + t * v.E, v.E, s);
    double D = v.normalize ? v.eps : 1.0;
    for (int64_t j = 0; v.normalize && j < v.k; j++) D += s[v.id[t * v.k + j]];
    for (int64_t j = 0; j < v.k; j++) ((double *)y->data)[t * v.k + j] = v.scale * s[v.id[t * v.k + j]] / D;
  }
  rc = QC_OK;
done:
  free(x); free(s); free(v.id);
  return rc;
}

/* Group-limited selection (DeepSeek-V3's noaux_tc) on one token's
 * selection keys key [E] (score + bias, finite): E/ng consecutive experts
 * a group, each group scored by the sum of its top-2 keys (its top one when
 * a group has one expert, or gmax), the top tg groups kept (ties to the
 * lower group), the keys of every other group set to -inf. gsc [ng]:
 * scratch. */
static void group_limit(double *key, int64_t E, int64_t ng, int64_t tg, int gmax, double *gsc) {
  const int64_t gs = E / ng;
  for (int64_t g = 0; g < ng; g++) {
    double a = -INFINITY, b = -INFINITY;
    for (int64_t e = g * gs; e < (g + 1) * gs; e++) {
      if (key[e] > a) { b = a; a = key[e]; }
      else if (key[e] > b) b = key[e];
    }
    gsc[g] = gs > 1 && !gmax ? a + b : a;
  }
  for (int64_t i = 0; i < tg; i++) { /* a kept group's score becomes +inf */
    int64_t best = -1;
    for (int64_t g = 0; g < ng; g++)
      if (gsc[g] != INFINITY && (best < 0 || gsc[g] > gsc[best])) best = g;
    gsc[best] = INFINITY;
  }
  for (int64_t e = 0; e < E; e++)
    if (gsc[e / gs] != INFINITY) key[e] = -INFINITY;
}

/* Generated router: shape [T, E, k]. logits ~ N(0,1) float32; bias [E]
 * float32 from the levels {-0.05, 0, 0.05} (so selection keys tie), with
 * bias[0] = 2 (an expert the bias always selects). Token 0 has all logits
 * equal (every score ties; the bias and then the lower index decide); token
 * 1 has logits[0] = -1e4, so its top-k includes a zero score. topk_ids
 * [T, k] (int64) are the top k of score + bias under m->contract's score
 * (default softmax), ties to the lower index, then frozen; under n_group >
 * 1 only among the experts of the topk_group groups group_limit keeps. values =
 * "special": logits +-80 (saturated sigmoid) and a zero row; "heavy_tail":
 * logits of tokens from 2 on divided by 0.05 + U(0,1). */
static int router_generate(const qc_gen *gp, qc_rng *rng, qc_module *m, int *ondim, int64_t *oshape) {
  if (gp->nshape != 3) return qc_err("router: generate shape needs [T, E, k] (tokens, experts, top-k), got %d entries", gp->nshape);
  const int64_t T = gp->shape[0], E = gp->shape[1], K = gp->shape[2];
  if (T < 1 || E < 2 || K < 1 || K > E) return qc_err("router: generate shape needs T >= 1, E >= 2, 1 <= k <= E");
  int64_t ls[2] = {T, E}, is[2] = {T, K}, *ids;
  float *x, *b;
  double *s = NULL, *key = NULL;
  int rc;
  if ((rc = qc_mod_add(&m->inputs, "logits", QC_F32, 2, ls, (void **)&x))) return rc;
  if ((rc = qc_mod_add(&m->params, "bias", QC_F32, 1, &E, (void **)&b))) return rc;
  if ((rc = qc_mod_add(&m->saved, "topk_ids", QC_I64, 2, is, (void **)&ids))) return rc;
  for (int64_t i = 0; i < T * E; i++) x[i] = (float)qc_rng_normal(rng);
  for (int64_t e = 0; e < E; e++) b[e] = (float)(0.05 * (double)(int)(qc_rng_uniform(rng) * 3.0) - 0.05);
  b[0] = 2.0f;
  for (int64_t e = 0; e < E; e++) x[e] = 0.25f;
  if (T > 1) x[E] = -1e4f;
  if (gp->values && strcmp(gp->values, "heavy_tail") == 0)
    for (int64_t i = 2 * E; i < T * E; i++) x[i] = (float)(x[i] / (0.05 + qc_rng_uniform(rng)));
  if (qc_mod_special(gp)) {
    for (int64_t i = 2 * E + 1; i < T * E; i += 7) x[i] = i % 2 ? 80.0f : -80.0f;
    if (T > 3) memset(x + 3 * E, 0, (size_t)E * sizeof *x);
  }
  int score = SC_SOFTMAX;
  const char *sc = qc_contract_str(&m->contract, "score", "softmax");
  if (strcmp(sc, "sigmoid") == 0) score = SC_SIGMOID;
  if (strcmp(sc, "sqrt_softplus") == 0) score = SC_SQRT_SOFTPLUS;
  rc = QC_ESYS;
  if (!(s = qc_malloc((size_t)E * 2 * sizeof *s, "router scores")) || !(key = qc_malloc((size_t)E * sizeof *key, "router keys")))
    goto done;
  rt_view gv = {.E = E, .k = K};
  if ((rc = rt_groups_get(m, &gv))) goto done;
  rc = QC_ESYS;
  for (int64_t t = 0; t < T; t++) {
    for (int64_t e = 0; e < E; e++) key[e] = x[t * E + e];
    scores_f64(score, key, E, s);
    for (int64_t e = 0; e < E; e++) key[e] = s[e] + b[e];
    if (gv.ng > 1) group_limit(key, E, gv.ng, gv.tg, strcmp(qc_contract_str(&m->contract, "group_score", "auto"), "max") == 0, s + E);
    for (int64_t j = 0; j < K; j++) {
      int64_t best = -1;
      for (int64_t e = 0; e < E; e++)
        if (key[e] != -INFINITY && (best < 0 || key[e] > key[best])) best = e;
      ids[t * K + j] = best;
      key[best] = -INFINITY;
    }
  }
  rc = QC_OK;
  *ondim = 2;
  oshape[0] = T;
  oshape[1] = K;
done:
  free(s); free(key);
  return rc;
}

/* ---- coverage (model/modinfo.h) ---- */

static int router_cmp_desc(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return x < y ? 1 : x > y ? -1 : 0;
}

/* A tie among the k + 1 largest logits of a token. */
static void router_cov_facts(const qc_module *m, const qc_modinfo *mi, uint32_t *cover) {
  (void)mi;
  const qc_tensor *lg = qc_tset_get(&m->inputs, "logits"), *ids = qc_tset_get(&m->saved, "topk_ids");
  int64_t n;
  double *v = lg && lg->ndim == 2 && ids && ids->ndim == 2 ? qc_cov_values(lg, &n) : NULL;
  if (!v) return;
  int64_t T = lg->shape[0], E = lg->shape[1], k = ids->shape[1];
  double *row = malloc((size_t)E * sizeof *row);
  for (int64_t t = 0; row && t < T; t++) {
    memcpy(row, v + t * E, (size_t)E * sizeof *row);
    qsort(row, (size_t)E, sizeof *row, router_cmp_desc);
    for (int64_t j = 0; j < k && j + 1 < E; j++)
      if (row[j] == row[j + 1]) *cover |= 1u << QC_COV_TIES;
  }
  free(row);
  free(v);
}

static const qc_class_cov router_cov[] = {
    {.item = "topk_ties", .how = "equal logits at the selection boundary"},
    {NULL, NULL, NULL},
};

/* The class's reading of m for the engine's validation (qc_module_validate). */
static int router_validate(const qc_module *m, const qc_tensor *dy) {
  rt_view v;
  int rc = rt_view_get(m, &v);
  if (!rc) rc = qc_module_check_dy(m, dy, v.T * v.k, v.k, "the shape of saved/topk_ids [T, k]");
  free(v.id);
  return rc;
}

const qc_class qc_class_router = {
    .name = "router",
    .summary = "routing weights from fixed top-k ids (optionally group-limited): score (softmax|sigmoid|sqrt_softplus), "
               "normalization: d_logits",
    .tensors = "inputs/logits saved/topk_ids params/bias params/e_score_correction_bias outputs/y",
    .grads = "d_logits",
    .shape_help = "[T, E, k]: tokens, experts, top-k",
    .keys = router_keys,
    .generate = router_generate,
    .production = router_vjp,
    .not_checked = "params/bias (or params/e_score_correction_bias): used for the selection only, which is discrete (ids "
                   "fixed; saved/topk_ids judged against the contract's selection); no gradient by design",
    .forward = router_forward,
    .fd_shape = "6,8,3",
    .tol_model = router_tol_model,
    .validate = router_validate,
    .hypotheses = "factor sign rows zero dy_precision nonfinite",
    .hyps = router_hyps,
    .coverage = router_cov,
    .cov_facts = router_cov_facts,
};
