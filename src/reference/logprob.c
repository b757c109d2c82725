/* reference/logprob.c: float64 VJP of the selected-token log-prob, from
 * the math.
 *
 * lp = z_id - log sum_v exp(z_v), z = logits / T. d lp / d logits_v =
 * (1[v = id] - softmax(z)_v) / T. The loss weight of a counted token
 * (mask != 0) is 1 (sum), 1/N (mean_tokens, N counted tokens in the batch)
 * or 1/(n_b * B') (mean_sequences: mean over the B' sequences that have any
 * counted token of their per-sequence token mean); uncounted tokens weigh 0.
 * The log-sum-exp is reduced shard by shard (vocab_shards contiguous
 * slices), each shard's (max, sum) combined in float64.
 * The terms' scale (ctx->terms): |dy w| / T (1[v = id] + p_v (1 + |z_v| +
 * |lse|)): the softmax probability's exponent z_v - lse is a difference
 * whose float32 error is u (|z_v| + |lse|) in p_v's relative terms, and
 * 1 - p_id cancels when the token is nearly certain. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "model/module.h"
#include "reference/ref_classes.h"
#include "core/par.h"
#include "core/qc.h"
#include "reference/ref_util.h"

/* Loss weight per position [B*S] from the mask and the normalization. */
static void lp_weights(const double *mask, int64_t B, int64_t S, const char *norm, double *w) {
  double N = 0, nonempty = 0;
  for (int64_t b = 0; b < B; b++) {
    double nb = 0;
    for (int64_t s = 0; s < S; s++) nb += mask[b * S + s] != 0;
    N += nb;
    nonempty += nb > 0;
  }
  for (int64_t b = 0; b < B; b++) {
    double nb = 0;
    for (int64_t s = 0; s < S; s++) nb += mask[b * S + s] != 0;
    for (int64_t s = 0; s < S; s++) {
      double on = mask[b * S + s] != 0;
      if (strcmp(norm, "mean_tokens") == 0) w[b * S + s] = on / N;
      else if (strcmp(norm, "mean_sequences") == 0) w[b * S + s] = on / (nb * nonempty);
      else w[b * S + s] = on;
      if (!on) w[b * S + s] = 0;
    }
  }
}

/* The rows of d_logits on qc_par_for's threads, each row alone (so any
 * thread count gives the same values); a masked-out row stays zero. */
typedef struct lp_rows {
  const double *Z, *G, *w, *mask;
  const int64_t *id;
  double *dl;
  int64_t V, K, P;
  double T;
  int ab;
} lp_rows;

static void lp_row_piece(void *ctx, int64_t lo, int64_t hi, int tid) {
  (void)tid;
  const lp_rows *r = ctx;
  const int64_t V = r->V, P = r->P;
  const double T = r->T;
  for (int64_t i = lo; i < hi; i++) {
    if (r->mask[i] == 0) continue;
    const double *z = r->Z + i * V, gw = r->G[i] * r->w[i];
    double lse = -INFINITY;
    for (int64_t k = 0; k < r->K; k++) {  /* shard k's log-sum-exp, folded in */
      double mk = -INFINITY, sk = 0;
      for (int64_t v = k * P; v < (k + 1) * P; v++) mk = fmax(mk, z[v] / T);
      for (int64_t v = k * P; v < (k + 1) * P; v++) sk += exp(z[v] / T - mk);
      double lk = mk + log(sk), hi2 = fmax(lse, lk);
      lse = hi2 + log(exp(lse - hi2) + exp(lk - hi2));
    }
    double *dl = r->dl + i * V;
    for (int64_t v = 0; v < V; v++)
      dl[v] = r->ab ? fabs(gw) * ((v == r->id[i]) + exp(z[v] / T - lse) * (1 + fabs(z[v] / T) + fabs(lse))) / T
                    : gw * ((v == r->id[i]) - exp(z[v] / T - lse)) / T;
  }
}

/* The float64 VJP from the math above (a qc_vjp_fn), its rows on ctx's
 * device where its backend has them (reference/logprob_dev.c), else on
 * qc_par_for's threads: every gradient the contract makes differentiable
 * into grads; QC_EINPUT naming what is wrong with bad input. */
static int ref_logprob(const qc_ctx *ctx, const qc_module *m, const qc_tensor *dy, qc_tset *grads) {
  const int ab = ctx && ctx->terms;
  const qc_tensor *lt, *it, *mt;
  int rc;
  if ((rc = qc_module_need(m, "inputs", "logits", 2, 3, &lt))) return rc;
  if ((rc = qc_module_need(m, "saved", "token_ids", 1, 2, &it))) return rc;
  mt = qc_tset_get(&m->saved, "loss_mask");
  const int64_t V = lt->shape[lt->ndim - 1], B = lt->ndim == 3 ? lt->shape[0] : 1, S = qc_numel(lt) / V / B;
  const double T = qc_contract_num(&m->contract, "temperature", 1), ns = qc_contract_num(&m->contract, "vocab_shards", 1);
  if (qc_numel(it) != B * S) return qc_err("%s: 'saved/token_ids': expected %lld entries (positions of 'inputs/logits')", m->path, (long long)(B * S));
  if (mt && qc_numel(mt) != B * S) return qc_err("%s: 'saved/loss_mask': expected %lld entries", m->path, (long long)(B * S));
  if (!(T > 0)) return qc_err("%s: contract key 'temperature' = %g: expected > 0", m->path, T);
  if (!(ns >= 1) || ns != floor(ns) || V % (int64_t)ns) return qc_err("%s: contract key 'vocab_shards' = %g: expected a divisor of V = %lld", m->path, ns, (long long)V);
  if ((rc = qc_module_check_dy(m, dy, B * S, S, "one value per position of inputs/logits"))) return rc;
  const int64_t K = (int64_t)ns, P = V / K;
  int64_t *id = NULL;
  double *Z = NULL, *G = NULL, *mask = NULL, *w = NULL, *dl;
  if ((rc = qc_refu_ids(m, it, "saved/token_ids", &id))) return rc;
  rc = QC_ESYS;
  if (!(G = qc_refu_load(dy, "reference logprob dY"))) goto done;
  if (!(w = qc_malloc((size_t)(B * S) * sizeof *w, "reference weights"))) goto done;
  if (!(mask = mt ? qc_refu_load(mt, "reference mask") : qc_malloc((size_t)(B * S) * sizeof *mask, "reference mask"))) goto done;
  if (!mt)
    for (int64_t i = 0; i < B * S; i++) mask[i] = 1;
  lp_weights(mask, B, S, qc_contract_str(&m->contract, "normalization", "sum"), w);
  if ((rc = qc_refu_out(grads, "d_logits", lt->ndim, lt->shape, &dl))) goto done;
  for (int64_t i = 0; i < B * S; i++)
    if (mask[i] != 0 && (id[i] < 0 || id[i] >= V)) {
      rc = qc_err("%s: 'saved/token_ids'[%lld] = %lld is outside the vocab 0..%lld at a counted position", m->path, (long long)i, (long long)id[i], (long long)(V - 1));
      goto done;
    }
  for (int64_t i = 0; i < B * S; i++) { /* the device's rows: dY times the weight, and -1 for a row not counted */
    w[i] *= G[i];
    if (mask[i] == 0) id[i] = -1;
  }
  if ((rc = qc_ref_lp_dev(ctx ? ctx->be : NULL, lt, w, id, K, T, ab, dl)) != QC_NA) goto done;
  rc = QC_ESYS;
  if (!(Z = qc_refu_load(lt, "reference logits"))) goto done;
  for (int64_t i = 0; i < B * S; i++) G[i] = 1; /* w holds dY times the weight now */
  lp_rows r = {.Z = Z, .G = G, .w = w, .mask = mask, .id = id, .dl = dl, .V = V, .K = K, .P = P, .T = T, .ab = ab};
  qc_par_for(B * S, 1, lp_row_piece, &r);
  rc = QC_OK;
done:
  free(id); free(Z); free(G); free(mask); free(w);
  return rc;
}

/* The class's reference, its one export (src/classes/registry.c pairs it
 * with src/modules/logprob.c). */
const qc_reference qc_reference_logprob = {.vjp = ref_logprob, .terms = 1};
