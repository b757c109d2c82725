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
 * The selection bias (params/bias) gets no gradient: it only selects, as
 * does the group limit (n_group groups of E/n_group experts, the ids in at
 * most topk_group of them: DeepSeek-V3's noaux_tc); the weights are the
 * unbiased scores of the selected experts, so the gradient is the same.
 * The terms' scale (ctx->terms): the same chain with every sum and
 * difference taken over its terms' magnitudes: dL/ds from |c dy| / D and
 * |c dy| s / D^2, the softmax's s |dL/ds| + s sum |dL/ds| s, the
 * sigmoid's s (1 + s) (1 - s is a difference), the sqrt-softplus factor
 * as is (one product). */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "model/module.h"
#include "reference/ref_classes.h"
#include "core/qc.h"
#include "reference/ref_util.h"

static double softplus(double x) { return x > 0 ? x + log1p(exp(-x)) : log1p(exp(x)); }
static double sigmoid(double x) { return x >= 0 ? 1 / (1 + exp(-x)) : exp(x) / (1 + exp(x)); }

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
  const char *fn = qc_contract_str(&m->contract, "score", "softmax");
  const int norm = strcmp(qc_contract_str(&m->contract, "normalize", "no"), "yes") == 0;
  const double eps = qc_contract_num(&m->contract, "norm_eps", 1e-20), c = qc_contract_num(&m->contract, "route_scale", 1);
  /* group-limited routing (n_group, topk_group): the selection only; the
   * ids of a token lie in at most topk_group of n_group equal groups */
  const double ngd = qc_contract_num(&m->contract, "n_group", 1), tg0 = qc_contract_num(&m->contract, "topk_group", 0);
  const double tgd = tg0 == 0 ? ngd : tg0; /* 0: every group */
  if (!(ngd >= 1) || ngd != floor(ngd) || ngd > (double)E || E % (int64_t)ngd != 0)
    return qc_err("%s: contract key 'n_group' = %g: expected a whole number dividing E = %lld", m->path, ngd, (long long)E);
  if (!(tgd >= 1) || tgd != floor(tgd) || tgd > ngd)
    return qc_err("%s: contract key 'topk_group' = %g: expected 1..n_group = %g", m->path, tgd, ngd);
  const int64_t gsize = E / (int64_t)ngd;
  if (k > (int64_t)tgd * gsize)
    return qc_err("%s: 'saved/topk_ids': k = %lld experts do not fit in topk_group = %g groups of %lld", m->path, (long long)k, tgd,
                  (long long)gsize);
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
    int64_t ngroups = 0;
    for (int64_t j = 0; j < k; j++) {
      int first = 1;
      for (int64_t i = 0; i < j; i++) first &= sel[i] / gsize != sel[j] / gsize;
      ngroups += first;
    }
    if (ngroups > (int64_t)tgd) {
      rc = qc_err("%s: 'saved/topk_ids' row %lld spans %lld expert groups: expected at most topk_group = %g", m->path, (long long)t,
                  (long long)ngroups, tgd);
      goto done;
    }
    /* scores */
    if (strcmp(fn, "softmax") == 0) {
      double mx = x[0], z = 0;
      for (int64_t e = 1; e < E; e++) mx = x[e] > mx ? x[e] : mx;
      for (int64_t e = 0; e < E; e++) z += exp(x[e] - mx);
      for (int64_t e = 0; e < E; e++) s[e] = exp(x[e] - mx) / z;
    } else {
      for (int64_t e = 0; e < E; e++) s[e] = strcmp(fn, "sigmoid") == 0 ? sigmoid(x[e]) : sqrt(softplus(x[e]));
    }
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

/* The class's reference, its one export (src/classes/registry.c pairs it
 * with src/modules/router.c). */
const qc_reference qc_reference_router = {.vjp = ref_router, .terms = 1};
