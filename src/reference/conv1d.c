/* reference/conv1d.c: the float64 VJP of the causal depthwise convolution
 * (Mamba-2's conv1d), from the definition, by scattering each output's
 * adjoint onto the inputs it read:
 *
 *   x [B, L, C], weight [C, K] or [C, 1, K], bias [C] (optional), dY [B, L, C]
 *   y[b, t, c] = bias[c] + sum_{k=0}^{K-1} weight[c, k] x[b, t - (K-1) + k, c],
 *   x at negative times is 0 (left zero padding of K-1 steps).
 * For every output (b, t, c) and tap k with s = t - (K-1) + k >= 0:
 *   d_x[b, s, c] += weight[c, k] dy[b, t, c]
 *   d_weight[c, k] += dy[b, t, c] x[b, s, c]
 * and d_bias[c] += dy[b, t, c]. The terms' scale (ctx->terms): the same
 * sums of the products' magnitudes. On the backend's device where it takes
 * them (reference/conv1d_dev.c: the same sums in the same order), else on
 * the host's threads. */
#include <math.h>
#include <stdlib.h>

#include "core/par.h"
#include "core/qc.h"
#include "model/module.h"
#include "reference/ref_classes.h"
#include "reference/ref_dev.h"
#include "reference/ref_util.h"

/* ref_conv1d's arrays, for its channels' pieces. */
typedef struct conv_job {
  const double *X, *W, *G;
  double *dx, *dw, *db;
  int64_t B, L, C, K;
} conv_job;

/* Channels [lo, hi): every sum of a channel is its own (d_x, d_weight and
 * d_bias at that channel), each taken over b, t and k in that order, so
 * any thread count gives the same values. */
static void conv_channels(void *ctx, int64_t lo, int64_t hi, int tid) {
  (void)tid;
  const conv_job *J = ctx;
  const int64_t L = J->L, C = J->C, K = J->K;
  for (int64_t b = 0; b < J->B; b++)
    for (int64_t t = 0; t < L; t++)
      for (int64_t c = lo; c < hi; c++) {
        const double g = J->G[(b * L + t) * C + c];
        if (J->db) J->db[c] += g;
        for (int64_t k = 0; k < K; k++) {
          const int64_t s = t - (K - 1) + k;
          if (s < 0) continue; /* the zero padding: no input, no gradient */
          J->dx[(b * L + s) * C + c] += J->W[c * K + k] * g;
          J->dw[c * K + k] += g * J->X[(b * L + s) * C + c];
        }
      }
}

/* The float64 VJP from the math above (a qc_vjp_fn): every gradient the contract makes
 * differentiable into grads; QC_EINPUT naming what is wrong with bad input. */
static int ref_conv1d(const qc_ctx *ctx, const qc_module *m, const qc_tensor *dy, qc_tset *grads) {
  const int ab = ctx && ctx->terms;
  const qc_tensor *xt, *wt, *bt;
  int rc;
  if ((rc = qc_module_need(m, "inputs", "x", 3, 3, &xt))) return rc;
  if ((rc = qc_module_need(m, "params", "weight", 2, 3, &wt))) return rc;
  const int64_t B = xt->shape[0], L = xt->shape[1], C = xt->shape[2], K = wt->shape[wt->ndim - 1];
  if (wt->shape[0] != C || (wt->ndim == 3 && wt->shape[1] != 1) || K < 1)
    return qc_err("%s: 'params/weight': expected [C, K] or [C, 1, K] with C = %lld, K >= 1 (depthwise)", m->path, (long long)C);
  bt = qc_tset_get(&m->params, "bias");
  if (bt && (bt->ndim != 1 || bt->shape[0] != C))
    return qc_err("%s: 'params/bias': expected [C] = [%lld]", m->path, (long long)C);
  if ((rc = qc_module_check_dy(m, dy, B * L * C, C, "the shape of inputs/x [B, L, C]"))) return rc;
  double *X = NULL, *W = NULL, *G = NULL, *dx, *dw, *db = NULL;
  if ((rc = qc_refu_out(grads, "d_x", 3, xt->shape, &dx))) goto done;
  if ((rc = qc_refu_out(grads, "d_weight", wt->ndim, wt->shape, &dw))) goto done;
  if (bt && (rc = qc_refu_out(grads, "d_bias", 1, bt->shape, &db))) goto done;
  const qc_conv_rows dj = {.ab = ab, .B = B, .L = L, .C = C, .K = K};
  if ((rc = qc_ref_conv_dev(ctx ? ctx->be : NULL, dj, xt, wt, dy, dx, dw, db)) != QC_NA) goto done; /* the device's sums */
  rc = QC_ESYS;
  if (!(X = qc_refu_load(xt, "reference conv1d x")) || !(W = qc_refu_load(wt, "reference conv1d weight")) ||
      !(G = qc_refu_load(dy, "reference conv1d dY")))
    goto done;
  if (ab) /* the terms' scale: every product in magnitude */
    for (int64_t i = 0; i < B * L * C; i++) { X[i] = fabs(X[i]); G[i] = fabs(G[i]); }
  for (int64_t i = 0; ab && i < C * K; i++) W[i] = fabs(W[i]);
  conv_job j = {.X = X, .W = W, .G = G, .dx = dx, .dw = dw, .db = db, .B = B, .L = L, .C = C, .K = K};
  qc_par_for(C, 1 + ((int64_t)1 << 14) / (B * L * K + 1), conv_channels, &j);
  rc = QC_OK;
done:
  free(X); free(W); free(G);
  return rc;
}

/* The class's reference, its one export (src/classes/registry.c pairs it
 * with src/modules/conv1d.c). */
const qc_reference qc_reference_conv1d = {.vjp = ref_conv1d, .terms = 1};
