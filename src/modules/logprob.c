/* modules/logprob.c: the production selected-token log-prob VJP, as an RL
 * trainer writes it over a vocab-parallel LM head: float32, per-shard max
 * and sum of exponentials combined across shards (the all-reduce) in
 * float32.
 *
 *   logits [B, S, V] (or [T, V]: one sequence), token_ids [B, S], loss_mask [B, S]
 *   z = logits / temperature, lp[b,s] = z[id] - logsumexp(z)
 *   forward  y[b,s] = w[b,s] lp[b,s],  w = mask * (1 | 1/N | 1/(n_b B'))
 *            for normalization sum | mean_tokens | mean_sequences, where N =
 *            counted tokens in the batch, n_b = counted tokens of sequence b,
 *            B' = sequences with n_b > 0 (w = 0 when the count is 0)
 *   d_logits [b,s,v] = dy[b,s] w[b,s] (onehot(id)_v - softmax(z)_v) / temperature
 * Tokens with mask 0 get zero gradient and their ids are not read (they may
 * be -100 or any padding id). */
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

static const qc_key_spec logprob_keys[] = {
    {"temperature", NULL, "1", "logits are divided by it before the log-softmax"},
    {"normalization", "sum|mean_tokens|mean_sequences", "sum",
     "loss weight per token: 1, 1/(counted tokens), or 1/(tokens of its sequence * non-empty sequences)"},
    {"vocab_shards", NULL, "1", "vocab-parallel shards (must divide V); reductions combine across shards"},
    {NULL, NULL, NULL, NULL}};

/* The tensors and sizes of a logprob module, ids and per-token weights. */
typedef struct {
  const qc_tensor *logits;
  int64_t B, S, V, shards;
  double temp;
  int64_t *ids;   /* [B*S] */
  double *w;      /* [B*S] loss weight (0 for masked tokens) */
} lp_view;

static void lp_view_free(lp_view *v) {
  free(v->ids);
  free(v->w);
}

/* vwhole: the whole vocabulary when m is a slice of it (split across
 * ranks: ids index the whole), else 0 (the logits' last dimension). */
static int lp_view_get_in(const qc_module *m, lp_view *v, int64_t vwhole) {
  const qc_tensor *idt, *mt;
  int rc;
  memset(v, 0, sizeof *v);
  if ((rc = qc_module_need(m, "inputs", "logits", 2, 3, &v->logits))) return rc;
  if ((rc = qc_module_need(m, "saved", "token_ids", 1, 2, &idt))) return rc;
  mt = qc_tset_get(&m->saved, "loss_mask");
  v->V = v->logits->shape[v->logits->ndim - 1];
  v->B = v->logits->ndim == 3 ? v->logits->shape[0] : 1;
  v->S = v->V ? qc_numel(v->logits) / (v->V * v->B) : 0;
  if (vwhole) v->V = vwhole; /* sizes and ids checked against the whole vocabulary */
  const int64_t n = v->B * v->S;
  if (qc_numel(idt) != n) return qc_err("%s: 'saved/token_ids' has %lld entries: expected %lld (one per position of 'inputs/logits')", m->path, (long long)qc_numel(idt), (long long)n);
  if (mt && qc_numel(mt) != n) return qc_err("%s: 'saved/loss_mask' has %lld entries: expected %lld", m->path, (long long)qc_numel(mt), (long long)n);
  v->temp = qc_contract_num(&m->contract, "temperature", 1);
  double sh = qc_contract_num(&m->contract, "vocab_shards", 1);
  if (!(v->temp > 0)) return qc_err("%s: contract key 'temperature' is %g: expected > 0", m->path, v->temp);
  if (sh != floor(sh) || sh < 1 || fmod((double)v->V, sh) != 0)
    return qc_err("%s: contract key 'vocab_shards' is %g: expected a whole number dividing the vocab size %lld", m->path, sh, (long long)v->V);
  v->shards = (int64_t)sh;
  double *mask = mt ? qc_mod_f64(mt, "logprob mask") : NULL;
  v->w = qc_calloc((size_t)n + 1, sizeof *v->w, "logprob weights");
  if (!v->w || (mt && !mask)) { free(mask); return QC_ESYS; }
  if ((rc = qc_mod_ids(m, idt, "saved/token_ids", &v->ids))) { free(mask); return rc; }
  const char *norm = qc_contract_str(&m->contract, "normalization", "sum");
  int64_t total = 0, nonempty = 0;
  for (int64_t b = 0; b < v->B; b++) {
    int64_t cnt = 0;
    for (int64_t s = 0; s < v->S; s++) {
      int64_t i = b * v->S + s;
      if (mask && mask[i] == 0) continue;
      if (v->ids[i] < 0 || v->ids[i] >= v->V) {
        free(mask);
        return qc_err("%s: 'saved/token_ids'[%lld] is %lld at a counted position: expected 0..%lld", m->path, (long long)i, (long long)v->ids[i], (long long)v->V - 1);
      }
      v->w[i] = 1.0;
      cnt++;
    }
    total += cnt;
    nonempty += cnt > 0;
  }
  for (int64_t b = 0; b < v->B; b++) {
    int64_t cnt = 0;
    for (int64_t s = 0; s < v->S; s++) cnt += v->w[b * v->S + s] != 0;
    double scale = strcmp(norm, "mean_tokens") == 0 ? 1.0 / (double)(total ? total : 1)
                   : strcmp(norm, "mean_sequences") == 0 ? 1.0 / ((double)(cnt ? cnt : 1) * (double)(nonempty ? nonempty : 1))
                                                         : 1.0;
    for (int64_t s = 0; s < v->S; s++) v->w[b * v->S + s] *= scale;
  }
  free(mask);
  return QC_OK;
}

static int lp_view_get(const qc_module *m, lp_view *v) { return lp_view_get_in(m, v, 0); }

static int logprob_vjp_group(const qc_group *gr, const qc_module *m, const qc_tensor *dy, qc_tset *grads);

/* A world of one: every reduction is already whole. */
static int one_rank(const qc_group *g, void *buf, int64_t n, qc_dtype dt, qc_redop op) {
  (void)g; (void)buf; (void)n; (void)dt; (void)op;
  return QC_OK;
}

/* Production VJP (see the file comment): the vocab-parallel arithmetic
 * below, over the ranks of ctx->group, or in one process holding every
 * shard (its all-reduces then have nothing to add). */
static int logprob_vjp(const qc_ctx *ctx, const qc_module *m, const qc_tensor *dy, qc_tset *grads) {
  if (ctx->group) return logprob_vjp_group(ctx->group, m, dy, grads);
  const qc_tensor *l = qc_tset_get(&m->inputs, "logits");
  const int64_t V = l && l->ndim ? l->shape[l->ndim - 1] : 0;
  const qc_group one = {.rank = 0, .size = 1, .lo = 0, .hi = V, .len = 0, .allreduce = one_rank};
  return logprob_vjp_group(&one, m, dy, grads);
}

/* The error model: each probability p_v = exp(z_v - lse) inherits the
 * absolute error of the float32 log-sum-exp over the V logits (shards
 * combined in float32) as a relative error: K = V, lambda 2 for the max and
 * sum passes; rows with large logits make that error ~u max|z/T| instead,
 * so lambda grows to max|z/T| / sqrt(V) when that is larger. */
static int logprob_tol_model(const qc_module *m, const qc_tensor *dy, const char *grad, qc_tol_model *tm) {
  (void)dy;
  lp_view v;
  int rc = lp_view_get(m, &v);
  lp_view_free(&v);
  if (rc) return rc;
  if (strcmp(grad, "d_logits") != 0) return qc_err("%s: class logprob has no gradient '%s'", m->path, grad);
  double zmax = qc_mod_maxabs(v.logits) / v.temp, lambda = fmax(2.0, zmax / sqrt((double)v.V));
  qc_mod_tm(tm, v.V, lambda, 0, 0, "each softmax probability inherits the float32 log-sum-exp's absolute error over V = %lld "
            "logits as a relative error; max|z/T| = %.3g: lambda %.3g", (long long)v.V, zmax, lambda);
  return QC_OK;
}

/* Constant factors the class can name for d_logits: the normalization's
 * count taken over every position, or missing; the temperature's 1/T
 * missing or applied twice. */
static int logprob_ratios(const qc_module *m, const char *grad, double *k, char (*says)[160], int max) {
  lp_view v;
  int n = 0;
  if (strcmp(grad, "d_logits") != 0) return 0;
  qc_err_state es; /* a diagnosis: no view, no ratio named, no error */
  qc_err_save(&es);
  const int bad = lp_view_get(m, &v) != QC_OK;
  qc_err_restore(&es);
  if (bad) return 0;
  int64_t counted = 0, all = v.B * v.S;
  for (int64_t i = 0; i < all; i++) counted += v.w[i] != 0;
  const char *norm = qc_contract_str(&m->contract, "normalization", "sum");
  if (strcmp(norm, "mean_tokens") == 0 && counted && counted != all && n < max) {
    k[n] = (double)counted / (double)all;
    snprintf(says[n++], 160, "the mean taken over every position (%lld) instead of the %lld counted tokens", (long long)all,
             (long long)counted);
  }
  if (strcmp(norm, "mean_tokens") == 0 && counted > 1 && n < max) {
    k[n] = (double)counted;
    snprintf(says[n++], 160, "the normalization 1/%lld (counted tokens) missing: a sum where the contract says a mean",
             (long long)counted);
  }
  if (v.temp != 1 && n + 1 < max) {
    k[n] = v.temp;
    snprintf(says[n++], 160, "the temperature's 1/T (T = %g) missing from the gradient", v.temp);
    k[n] = 1.0 / v.temp;
    snprintf(says[n++], 160, "the temperature's 1/T (T = %g) applied twice", v.temp);
  }
  lp_view_free(&v);
  return n;
}

/* Float64 forward y [B, S] (no discrete branch: ids and mask are fixed). */
static int logprob_forward(const qc_module *m, const qc_module *branch, qc_tensor *y) {
  (void)branch;
  lp_view v;
  int rc = lp_view_get(m, &v);
  double *z = NULL;
  if (rc) goto done;
  rc = QC_ESYS;
  if (!(z = qc_mod_f64(v.logits, "logprob logits"))) goto done;
  int64_t ys[2] = {v.B, v.S};
  if ((rc = qc_tensor_alloc(y, "y", QC_F64, 2, ys))) goto done;
  for (int64_t i = 0; i < v.B * v.S; i++) {
    if (v.w[i] == 0) continue;
    const double *zr = z + i * v.V;
    double mx = -INFINITY, se = 0;
    for (int64_t j = 0; j < v.V; j++) mx = fmax(mx, zr[j] / v.temp);
    for (int64_t j = 0; j < v.V; j++) se += exp(zr[j] / v.temp - mx);
    ((double *)y->data)[i] = v.w[i] * (zr[v.ids[i]] / v.temp - mx - log(se));
  }
  rc = QC_OK;
done:
  free(z);
  lp_view_free(&v);
  return rc;
}

/* Generated logprob: shape [B, S, V]. logits ~ 2 N(0,1) bf16, token ids
 * uniform in [0, V) (int64), loss_mask (uint8): the first min(2, S-1)
 * positions of each sequence are prompt (0), sequence b has a padded tail of
 * b * S / (2B) positions (0, id -100), and with B >= 3 the last sequence is
 * fully masked. values = "special": a spiked row (+60 at the target), a zero
 * row, and entries +-1e4, 1e-30. */
static int logprob_generate(const qc_gen *gp, qc_rng *rng, qc_module *m, int *ondim, int64_t *oshape) {
  if (gp->nshape != 3) return qc_err("logprob: generate shape needs [B, S, V] (sequences, positions, vocab), got %d entries", gp->nshape);
  const int64_t B = gp->shape[0], S = gp->shape[1], V = gp->shape[2];
  if (B < 1 || S < 1 || V < 2) return qc_err("logprob: generate shape needs B >= 1, S >= 1, V >= 2");
  int64_t bs[2] = {B, S}, *ids;
  uint16_t *z;
  uint8_t *mask;
  int rc;
  if ((rc = qc_mod_gen_bf16(&m->inputs, "logits", 3, gp->shape, rng, 2.0, &z))) return rc;
  if ((rc = qc_mod_add(&m->saved, "token_ids", QC_I64, 2, bs, (void **)&ids))) return rc;
  if ((rc = qc_mod_add(&m->saved, "loss_mask", QC_U8, 2, bs, (void **)&mask))) return rc;
  for (int64_t b = 0; b < B; b++)
    for (int64_t s = 0; s < S; s++) {
      int64_t i = b * S + s;
      int pad = s >= S - b * S / (2 * B) || (B >= 3 && b == B - 1);
      mask[i] = !pad && (s >= (S > 2 ? 2 : S - 1));
      ids[i] = pad ? -100 : (int64_t)(qc_rng_uniform(rng) * (double)V);
    }
  static const float ext[] = {1e4f, -1e4f, 1e-30f};
  qc_mod_values(gp, rng, z, B * S, V, ext, 3);
  if (qc_mod_special(gp)) {
    int64_t i = B * S - 1 - (B >= 3 ? S : 0);  /* a counted row when there is one */
    for (int64_t s = 0; s < B * S && (mask[i] == 0 || i == (B * S) / 2); s++) i = (i + 1) % (B * S);
    if (mask[i]) z[i * V + ids[i]] = qc_f32_to_bf16(60.0f);
  }
  *ondim = 2;
  oshape[0] = B;
  oshape[1] = S;
  return QC_OK;
}

/* ---- vocab-parallel across ranks (qc_split; engine/split.c) -----------------
 * The production VJP. Rank r of group gr (a world of one: the whole
 * vocabulary, every contract shard) holds the logits' vocabulary columns
 * [lo, hi) (and every position's
 * id, mask and dY); its VJP is that of a vocab-parallel trainer: its
 * shard's row max and sum of exponentials in float32, combined over the
 * ranks by two all-reduces through ctx->group (the maximum, then the sum of
 * each shard's sum rescaled to it: NCCL on a device), then its own columns
 * of d_logits. The selected token's logit is not needed for d_logits (only
 * for the forward's log-prob), so it is not reduced. */
static int logprob_vjp_group(const qc_group *gr, const qc_module *m, const qc_tensor *dy, qc_tset *grads) {
  lp_view v;
  int rc = lp_view_get_in(m, &v, gr->len);
  float *z = NULL, *g = NULL, *dl, *smax = NULL, *ssum = NULL;
  if (rc) goto done;
  if ((rc = qc_module_check_dy(m, dy, v.B * v.S, v.S, "one value per position of inputs/logits"))) goto done;
  const int64_t n = v.B * v.S, P = gr->hi - gr->lo, lo = gr->lo;
  rc = QC_ESYS;
  z = qc_mod_f32(v.logits, "logprob logits (shard)");
  g = qc_mod_f32(dy, "logprob dY");
  smax = qc_malloc((size_t)(n + 1) * sizeof *smax, "logprob row max");
  ssum = qc_malloc((size_t)(n + 1) * sizeof *ssum, "logprob row sum");
  if (!z || !g || !smax || !ssum) goto done;
  if ((rc = qc_mod_add(grads, "d_logits", QC_F32, v.logits->ndim, v.logits->shape, (void **)&dl))) goto done;
  /* the contract's shards this rank holds (its slice is whole shards), else its slice as one shard */
  const int64_t Pw = v.V / v.shards, L = P % Pw == 0 && lo % Pw == 0 ? P / Pw : 1, Q = P / L;
  float *kmax = qc_malloc((size_t)(n * L + 1) * sizeof *kmax, "logprob shard max");
  float *ksum = qc_malloc((size_t)(n * L + 1) * sizeof *ksum, "logprob shard sum");
  if (!kmax || !ksum) { free(kmax); free(ksum); rc = QC_ESYS; goto done; }
  for (int64_t i = 0; i < n; i++) { /* each shard's max and sum of exponentials at it */
    float *zr = z + i * P;
    smax[i] = -INFINITY;
    if (v.w[i] == 0) continue;
    for (int64_t j = 0; j < P; j++) zr[j] = zr[j] / (float)v.temp;
    for (int64_t k = 0; k < L; k++) {
      float mk = -INFINITY, sk = 0.0f;
      for (int64_t j = k * Q; j < (k + 1) * Q; j++) mk = fmaxf(mk, zr[j]);
      for (int64_t j = k * Q; j < (k + 1) * Q; j++) sk += expf(zr[j] - mk);
      kmax[i * L + k] = mk;
      ksum[i * L + k] = sk;
      smax[i] = fmaxf(smax[i], mk);
    }
  }
  rc = gr->allreduce(gr, smax, n, QC_F32, QC_RED_MAX); /* the all-reduces: the max, then the rescaled sums */
  for (int64_t i = 0; !rc && i < n; i++) {
    ssum[i] = 0.0f;
    for (int64_t k = 0; v.w[i] != 0 && k < L; k++) ssum[i] += ksum[i * L + k] * expf(kmax[i * L + k] - smax[i]);
  }
  free(kmax);
  free(ksum);
  if (!rc) rc = gr->allreduce(gr, ssum, n, QC_F32, QC_RED_SUM);
  const float *gmax = smax;
  const float invt = 1.0f / (float)v.temp;
  for (int64_t i = 0; !rc && i < n; i++) {
    if (v.w[i] == 0) continue;
    const float lse = gmax[i] + logf(ssum[i]), c = g[i] * (float)v.w[i] * invt;
    const float *zr = z + i * P;
    float *dr = dl + i * P;
    for (int64_t j = 0; j < P; j++) dr[j] = -c * expf(zr[j] - lse);
    if (v.ids[i] >= lo && v.ids[i] < lo + P) dr[v.ids[i] - lo] += c; /* the selected token, on the rank that holds it */
  }
done:
  free(z); free(g); free(smax); free(ssum);
  lp_view_free(&v);
  return rc;
}

/* The vocabulary's length; slices of whole contract shards when the
 * contract's vocab_shards is a multiple of the ranks (each rank then runs
 * its vocab_shards / ranks shards as one process runs them), else any. */
static int logprob_split_size(const qc_module *m, int ranks, int64_t *len, int64_t *align) {
  const qc_tensor *l = qc_tset_get(&m->inputs, "logits");
  if (!l || l->ndim < 2) return qc_err("%s: inputs/logits must be [B, S, V] or [T, V] to split along V", m->path);
  const double sh = qc_contract_num(&m->contract, "vocab_shards", 1);
  *len = l->shape[l->ndim - 1];
  *align = 1;
  if (sh >= 1 && sh == floor(sh) && fmod((double)*len, sh) == 0 && fmod(sh, (double)ranks) == 0) *align = *len / (int64_t)sh;
  return QC_OK;
}

/* The module's slice [lo, hi) of the vocabulary: logits' and candidate
 * d_logits' columns; ids, mask and dY whole. */
static int logprob_split_slice(const qc_module *m, int64_t lo, int64_t hi, qc_module *part) {
  const qc_tensor *l = qc_tset_get(&m->inputs, "logits");
  const int64_t V = l->shape[l->ndim - 1];
  int rc = qc_mod_part_init(m, part);
  for (int j = 0; !rc && j < m->inputs.n; j++)
    rc = qc_mod_add_cut(&part->inputs, &m->inputs.t[j], -1, strcmp(m->inputs.t[j].name, "logits") == 0 ? V : -1, lo, hi);
  for (int j = 0; !rc && j < m->saved.n; j++) rc = qc_mod_add_cut(&part->saved, &m->saved.t[j], 0, -1, 0, 0);
  for (int j = 0; !rc && j < m->params.n; j++) rc = qc_mod_add_cut(&part->params, &m->params.t[j], 0, -1, 0, 0);
  for (int i = 0; !rc && i < m->grad_out.n; i++) {
    rc = qc_mod_add_cut(&part->grad_out, &m->grad_out.t[i], 0, -1, 0, 0);
    for (int j = 0; !rc && m->cand && j < m->cand[i].n; j++)
      rc = qc_mod_add_cut(&part->cand[i], &m->cand[i].t[j], -1, strcmp(m->cand[i].t[j].name, "d_logits") == 0 ? V : -1, lo, hi);
  }
  if (rc) qc_module_free(part);
  return rc;
}

/* d_logits: the slice's columns of the whole. */
static int logprob_split_place(const qc_module *m, const char *grad, int64_t lo, int64_t hi, qc_split_block *b, int *partial) {
  const qc_tensor *l = qc_tset_get(&m->inputs, "logits");
  *partial = 0;
  if (strcmp(grad, "d_logits") != 0 || !l) return qc_err("%s: class logprob has no gradient '%s' to split", m->path, grad);
  qc_mod_block_whole(l->ndim, l->shape, b);
  b->c0 = lo, b->c1 = hi;
  return QC_OK;
}

static const qc_split logprob_split = {
    .dim = "V (vocabulary)",
    .size = logprob_split_size,
    .slice = logprob_split_slice,
    .place = logprob_split_place,
    .whole_reference = 1,
};

/* ---- coverage (model/modinfo.h) ---- */

/* Token rows and sequence length of logits [B, S, V] or [S, V]. */
static int logprob_cov_tokens(const qc_module *m, int64_t *tokens, int64_t *seqlen) {
  const qc_tensor *t = qc_tset_get(&m->inputs, "logits");
  if (!t || t->ndim < 2) return 0;
  *tokens = qc_numel(t) / t->shape[t->ndim - 1];
  *seqlen = t->ndim == 3 ? t->shape[1] : t->shape[0];
  return 1;
}

/* A loss mask with masked (zero) positions. */
static void logprob_cov_facts(const qc_module *m, const qc_modinfo *mi, uint32_t *cover) {
  (void)mi;
  const qc_tensor *mt = qc_tset_get(&m->saved, "loss_mask");
  int64_t n;
  double *v = mt ? qc_cov_values(mt, &n) : NULL;
  int64_t *iv = mt && !v ? qc_cov_ids(mt, &n) : NULL;
  for (int64_t i = 0; (v || iv) && i < n; i++)
    if ((v && v[i] == 0) || (iv && iv[i] == 0)) *cover |= 1u << QC_COV_MASK;
  if (mt && mt->dtype == QC_U8)
    for (int64_t i = 0; i < qc_numel(mt); i++)
      if (((const uint8_t *)mt->data)[i] == 0) *cover |= 1u << QC_COV_MASK;
  free(v);
  free(iv);
}

static const qc_class_cov logprob_cov[] = {
    {.item = "context_lengths"},
    {.item = "mask", .how = "a loss mask with masked positions"},
    {NULL, NULL, NULL},
};

/* The class's reading of m for the engine's validation (qc_module_validate). */
static int logprob_validate(const qc_module *m, const qc_tensor *dy) {
  lp_view v;
  int rc = lp_view_get(m, &v);
  if (!rc) rc = qc_module_check_dy(m, dy, v.B * v.S, v.S, "one value per position of inputs/logits");
  lp_view_free(&v);
  return rc;
}

const qc_class qc_class_logprob = {
    .name = "logprob",
    .summary = "selected-token log-softmax with temperature, loss mask, normalization, vocab shards: d_logits",
    .tensors = "inputs/logits saved/token_ids saved/loss_mask outputs/y",
    .grads = "d_logits",
    .shape_help = "[B, S, V]: sequences, positions, vocab",
    .keys = logprob_keys,
    .generate = logprob_generate,
    .production = logprob_vjp,
    .not_checked = "",
    .forward = logprob_forward,
    .fd_shape = "3,6,40",
    .tol_model = logprob_tol_model,
    .validate = logprob_validate,
    .hypotheses = "factor sign rows zero dy_precision nonfinite",
    .ratios = logprob_ratios,
    .split = &logprob_split,
    .coverage = logprob_cov,
    .cov_tokens = logprob_cov_tokens,
    .cov_facts = logprob_cov_facts,
};
