/* shard_diag.c: what a failed per-rank check of a sharded dump looks like
 * (engine/shard_priv.h): the reductions across ranks a trainer can get
 * wrong, each a prediction the candidate is measured against. */
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "core/qc.h"
#include "engine/shard_priv.h"

/* Piece [off, off + len) of float64 tensor t along dimension d, as out. */
int qc_shard_slice(const qc_tensor *t, int d, int64_t off, int64_t len, qc_tensor *out) {
  int64_t shape[QC_MAXDIM];
  memcpy(shape, t->shape, sizeof shape);
  shape[d] = len;
  int rc = qc_tensor_alloc(out, t->name, QC_F64, t->ndim, shape);
  if (rc) return rc;
  int64_t outer = qc_shape_numel(d, t->shape), inner = qc_shape_numel(t->ndim - d - 1, t->shape + d + 1);
  const double *src = t->data;
  double *dst = out->data;
  for (int64_t o = 0; o < outer; o++)
    memcpy(dst + o * len * inner, src + (o * t->shape[d] + off) * inner, (size_t)(len * inner) * sizeof(double));
  return QC_OK;
}

/* One hypothesis about a failed per-rank check, recorded on it: its name,
 * what it would mean, the candidate's rel-L2 to its prediction (NAN: a
 * multiple, judged by the cosine), consistent or not. */
static void hyp(qc_check *k, const char *name, const char *says, double rl, int consistent) {
  if (k->nhyp >= (int)(sizeof k->hyp / sizeof k->hyp[0])) return;
  struct qc_hyp_result *h = &k->hyp[k->nhyp++];
  snprintf(h->name, sizeof h->name, "%s", name);
  snprintf(h->says, sizeof h->says, "%s", says);
  h->rel_l2 = rl;
  h->level = 0;
  h->consistent = consistent;
}

/* The diagnosis takes the same field and form as engine/diagnose.c's. */
void qc_shard_diagnose(qc_check *k, const double *g, const qc_tensor *ref, int d, const int64_t *off, const int64_t *len,
                       int r, int W, int mean, const qc_tensor *partial, const double *sum, const qc_shard_own *own,
                       int nown) {
  char says[256];
  int64_t n;
  double ab = 0, bb = 0, exp_rel, gg = 0;
  qc_tensor mine;
  const double *want = ref->data;
  memset(&mine, 0, sizeof mine);
  if (d >= 0) { /* no slice (out of memory): no diagnosis, no error */
    qc_err_state es;
    qc_err_save(&es);
    const int bad = qc_shard_slice(ref, d, off[r], len[r], &mine) != QC_OK;
    qc_err_restore(&es);
    if (bad) return;
  }
  if (d >= 0) want = mine.data;
  n = d >= 0 ? qc_numel(&mine) : qc_numel(ref);
  exp_rel = qc_rel_l2(g, want, n);
  const double close = 0.25 * exp_rel; /* nearer a prediction than a quarter of the miss */
  for (int64_t i = 0; i < n; i++) {
    ab += g[i] * want[i];
    bb += want[i] * want[i];
    gg += g[i] * g[i];
  }
  double c = bb > 0 ? ab / bb : NAN, cosine = bb > 0 && gg > 0 ? ab / sqrt(bb * gg) : 0;
  k->nhyp = 0;
  if (d < 0 && partial && qc_numel(partial) == n) {
    double rl = qc_rel_l2(g, partial->data, n);
    snprintf(says, sizeof says, "rank %d's own partial gradient: the all-reduce over the %d ranks is missing", r, W);
    hyp(k, "reduction_partial", says, rl, rl < close);
  }
  for (int i = 0; i < nown; i++) {
    if (!own[i].pred) continue;
    double rl = qc_rel_l2(g, own[i].pred, n);
    hyp(k, "reduction_partial", own[i].says, rl, rl < close);
  }
  for (int s = 0; d >= 0 && s < W; s++) {
    qc_tensor other;
    if (s == r || len[s] != len[r] || qc_shard_slice(ref, d, off[s], len[s], &other)) continue;
    double rl = qc_rel_l2(g, other.data, n);
    snprintf(says, sizeof says, "the reference's piece of rank %d: the shards are in the wrong order", s);
    hyp(k, "shard_order", says, rl, rl < close);
    qc_tensor_free(&other);
  }
  if (cosine > 0.999 && isfinite(c) && fabs(c - 1) > 0.01) {
    if (fabs(c - 2) < 0.02) snprintf(says, sizeof says, "twice the reference: reduced twice");
    else if (W > 2 && fabs(c - W) < 0.01 * W && mean)
      snprintf(says, sizeof says, "%d times the reference (the world size): summed over the ranks where grad_reduce declares a mean", W);
    else if (W > 2 && fabs(c - W) < 0.01 * W)
      snprintf(says, sizeof says, "%d times the reference (the world size): all-reduced twice, a sum where one rank's share was "
               "expected, or scaled by the world size", W);
    else if (fabs(c * W - 1) < 0.01)
      snprintf(says, sizeof says, "1/%d of the reference: averaged over the ranks where a sum was expected, or scaled by 1/%d "
               "(a data- or expert-parallel ratio applied to the gradient itself)", W, W);
    else snprintf(says, sizeof says, "%.4g times the reference: mis-scaled", c);
    hyp(k, "reduction_scale", says, NAN, 1);
  } else {
    hyp(k, "reduction_scale", "a multiple of the reference: a reduction mis-scaled", NAN, 0);
  }
  /* ranks holding different partials (no common multiple of the reference) that add up to it */
  if (d < 0 && sum) {
    double rl = qc_rel_l2(sum, want, n);
    snprintf(says, sizeof says, "a partial sum: the %d ranks' gradients add up to the reference: the all-reduce is missing", W);
    hyp(k, "reduction_sum", says, rl, rl < close && !(cosine > 0.999 && fabs(c - 1) > 0.01));
  }
  qc_tensor_free(&mine);
  size_t o = 0;
  int nc = 0;
  for (int i = 0; i < k->nhyp && o < sizeof k->diagnosis; i++) {
    if (!k->hyp[i].consistent) continue;
    o += (size_t)snprintf(k->diagnosis + o, sizeof k->diagnosis - o, "%s%s", nc++ ? "; also: " : "consistent with: ", k->hyp[i].says);
  }
  if (!nc) {
    o = (size_t)snprintf(k->diagnosis, sizeof k->diagnosis, "no known signature (tested:");
    for (int i = 0; i < k->nhyp && o < sizeof k->diagnosis; i++)
      if (i == 0 || strcmp(k->hyp[i].name, k->hyp[i - 1].name) != 0)
        o += (size_t)snprintf(k->diagnosis + o, sizeof k->diagnosis - o, " %s", k->hyp[i].name);
    if (o < sizeof k->diagnosis) snprintf(k->diagnosis + o, sizeof k->diagnosis - o, ")");
  }
}

