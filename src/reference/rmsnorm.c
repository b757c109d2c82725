/* reference/rmsnorm.c: float64 RMSNorm and LayerNorm VJPs, from the math.
 *
 * With n = D features, c = x - mu (mu = 0 for RMSNorm, mean(x) for
 * LayerNorm), s = sqrt(sum(c^2)/n + eps), y = c/s * w + b:
 *   dy/dx through c/s:  d_x = (1/s) (P(g) - c * <g, c> / (n s^2)),  g = dy * w
 *   where P(g) = g - mean(g) for LayerNorm (the centering's Jacobian) and g
 *   for RMSNorm. d_weight = sum_t dy * c/s, d_bias = sum_t dy.
 * RMSNorm with contract zero_centered = true (Gemma) scales by (1 + w): the
 * same formulas with w replaced by 1 + w; d_weight is unchanged, since
 * d(1 + w)/dw = 1.
 * Everything in float64; reductions are plain sums over <= 2^20 terms. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "model/module.h"
#include "core/par.h"
#include "core/qc.h"
#include "reference/ref_classes.h"
#include "reference/ref_util.h"

/* One norm's arrays for its row and column passes: X, G [rows, n], W [n];
 * per row its mean mu and s = sqrt(mean c^2 + eps); the outputs. */
typedef struct norm_job {
  const double *X, *G, *W;
  int64_t n;
  int centered;
  double eps;
  double *mu, *s;         /* [rows] */
  double *dx, *dw, *db;   /* [rows, n], [n], [n] or NULL */
} norm_job;

/* Rows [lo, hi): each row's statistics and d_x (rows alone: any thread
 * count gives the same values). */
static void norm_rows(void *ctx, int64_t lo, int64_t hi, int tid) {
  (void)tid;
  const norm_job *j = ctx;
  const int64_t n = j->n;
  const double *W = j->W;
  for (int64_t r = lo; r < hi; r++) {
    const double *xr = j->X + r * n, *gr = j->G + r * n;
    double mu = 0, ss = 0, gc = 0, gsum = 0;
    if (j->centered) {
      for (int64_t i = 0; i < n; i++) mu += xr[i];
      mu /= (double)n;
    }
    for (int64_t i = 0; i < n; i++) ss += (xr[i] - mu) * (xr[i] - mu);
    const double s2 = ss / (double)n + j->eps, s = sqrt(s2);
    for (int64_t i = 0; i < n; i++) {
      double g = gr[i] * W[i];
      gc += g * (xr[i] - mu);
      gsum += g;
    }
    const double pm = j->centered ? gsum / (double)n : 0.0;
    for (int64_t i = 0; i < n; i++) j->dx[r * n + i] = (gr[i] * W[i] - pm - (xr[i] - mu) * gc / ((double)n * s2)) / s;
    j->mu[r] = mu;
    j->s[r] = s;
  }
}

typedef struct norm_cols {
  const norm_job *j;
  int64_t rows;
} norm_cols;

/* Features [lo, hi): d_weight and d_bias, each a sum over the rows in row
 * order (columns alone: any thread count gives the same values). */
static void norm_cols_piece(void *ctx, int64_t lo, int64_t hi, int tid) {
  (void)tid;
  const norm_cols *c = ctx;
  const norm_job *j = c->j;
  const int64_t n = j->n;
  for (int64_t r = 0; r < c->rows; r++) {
    const double *xr = j->X + r * n, *gr = j->G + r * n, mu = j->mu[r], s = j->s[r];
    for (int64_t i = lo; i < hi; i++) {
      j->dw[i] += gr[i] * (xr[i] - mu) / s;
      if (j->db) j->db[i] += gr[i];
    }
  }
}

/* The shared reference (centered = 1: LayerNorm): the rows' d_x, then the
 * features' sums over the rows, each pass on ctx's device where its backend
 * has them (reference/norm_dev.c), else on qc_par_for's threads. */
int qc_ref_norm(const qc_ctx *ctx, const qc_module *m, const qc_tensor *dy, qc_tset *grads, int centered) {
  const qc_tensor *xt, *wt, *bt = NULL;
  int rc;
  if ((rc = qc_module_need(m, "inputs", "x", 1, QC_MAXDIM, &xt))) return rc;
  if ((rc = qc_module_need(m, "params", "weight", 1, 1, &wt))) return rc;
  if (centered) bt = qc_tset_get(&m->params, "bias");
  const int64_t n = xt->shape[xt->ndim - 1], rows = qc_numel(xt) / n;
  if (wt->shape[0] != n) return qc_err("%s: 'params/weight' is [%lld]: expected [%lld] (features of 'inputs/x')", m->path, (long long)wt->shape[0], (long long)n);
  if (bt && (bt->ndim != 1 || bt->shape[0] != n)) return qc_err("%s: 'params/bias': expected [%lld]", m->path, (long long)n);
  if ((rc = qc_module_check_dy(m, dy, qc_numel(xt), xt->shape[xt->ndim - 1], "the shape of inputs/x"))) return rc;
  const double eps = qc_contract_num(&m->contract, "eps", centered ? 1e-5 : 1e-6);
  if (!(eps >= 0)) return qc_err("%s: contract key 'eps' = %g: expected >= 0", m->path, eps);
  double *X = NULL, *G = NULL, *st = NULL, *W = qc_refu_load(wt, "reference norm weight");
  norm_job j = {.n = n, .centered = centered, .eps = eps};
  rc = QC_ESYS;
  if (!W) goto done;
  if (!centered && strcmp(qc_contract_str(&m->contract, "zero_centered", "false"), "true") == 0)
    for (int64_t i = 0; i < n; i++) W[i] = 1.0 + W[i]; /* the scale the forward applies */
  if ((rc = qc_refu_out_z(grads, "d_x", xt->ndim, xt->shape, 0, &j.dx))) goto done;
  if ((rc = qc_refu_out(grads, "d_weight", 1, &n, &j.dw))) goto done;
  if (bt && (rc = qc_refu_out(grads, "d_bias", 1, &n, &j.db))) goto done;
  if ((rc = qc_ref_norm_dev(ctx ? ctx->be : NULL, xt, dy, W, centered, eps, j.dx, j.dw, j.db)) != QC_NA) goto done;
  X = qc_refu_load(xt, "reference norm x");
  G = qc_refu_load(dy, "reference norm dY");
  st = qc_malloc((size_t)(2 * rows + 1) * sizeof *st, "reference norm rows");
  rc = QC_ESYS;
  if (!X || !G || !st) goto done;
  j.X = X;
  j.G = G;
  j.W = W;
  j.mu = st;
  j.s = st + rows;
  qc_par_for(rows, qc_refu_row_grain(n), norm_rows, &j);
  norm_cols c = {&j, rows};
  qc_par_for(n, 64, norm_cols_piece, &c);
  rc = QC_OK;
done:
  free(X); free(W); free(G); free(st);
  return rc;
}

/* The float64 VJP from the math above (a qc_vjp_fn): every gradient the contract makes
 * differentiable into grads; QC_EINPUT naming what is wrong with bad input. */
static int ref_rmsnorm(const qc_ctx *ctx, const qc_module *m, const qc_tensor *dy, qc_tset *grads) {
  return qc_ref_norm(ctx, m, dy, grads, 0);
}

/* The class's reference, its one export (src/classes/registry.c pairs it
 * with src/modules/rmsnorm.c). */
const qc_reference qc_reference_rmsnorm = {.vjp = ref_rmsnorm};
