/* coverage.c: the method's layer-1 coverage list, and which of its items a
 * module instance's data shows (modinfo.h). Class names appear here, as in
 * the registry: what "a mask" or "an empty expert" is depends on the class. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/qc.h"
#include "model/modinfo.h"
#include "numerics/decode.h"

const qc_cov_item qc_coverage[QC_COV_COUNT] = {
    {"decode", "small M (decode: one token)", NULL, "an instance with one token", 0},
    {"large_m", "large M (training / prefill: 1024 tokens or more)", NULL, "an instance with at least 1024 tokens", 0},
    {"context_lengths", "different context lengths", "|attention|ssd|conv1d|logprob|rope|",
     "instances of the class with at least two sequence lengths", 0},
    {"unaligned", "unaligned tails", NULL,
     "a token count (above 16) or a feature size off a multiple of 16, or of the format's block (32 MX, 128 fp8 block/group)", 0},
    {"mask", "padding / packing / mask", "|attention|logprob|rope|",
     "attention: a causal mask; logprob: a loss mask with masked positions; rope: packed sequences (positions restart)", 0},
    {"dy_random", "random dY", NULL, "a generated random dY, or a dump's dY with mostly non-zero entries", 0},
    {"dy_zero", "zero dY", NULL, "a dY that is zero everywhere", 0},
    {"dy_sparse", "sparse dY (non-zero at selected positions)", NULL, "a dY with under half of its entries non-zero", 0},
    {"dy_real", "dY from real training", NULL, "a dY read from a dump's grad_out/", 0},
    {"extremes", "zeros and extreme values", NULL,
     "generated special values, or inputs holding an all-zero row and values over 20 times their RMS", 0},
    {"scales", "different scales", NULL,
     "generated heavy-tailed values, or inputs whose row RMS spans more than a factor 100", 0},
    {"threshold", "both sides of the quantization threshold", "|linear|swiglu|moe|",
     "values on both sides of the contract's threshold: a clipped STE's T (linear weight), a clamp limit L (swiglu gate, moe)", 0},
    {"saturation", "the saturation region", "|linear|swiglu|moe|",
     "values beyond the clipped STE's T or the clamp limit L", 0},
    {"moe_empty", "empty experts (MoE)", "|moe|", "an expert that no token is routed to", 0},
    {"moe_repeated", "repeated routing (MoE)", "|moe|", "a token routed to one expert in two of its slots", 0},
    {"moe_shared", "shared experts (MoE)", "|moe|",
     "the moe class has no shared expert: audit a shared expert as its own linear / swiglu modules", 0},
    {"topk_ties", "top-k ties", "|moe|router|",
     "moe: equal routing weights within a token; router: equal logits at the selection boundary", 0},
    {"target", "the target dtype / layout (the trainer's own gradients)", NULL,
     "the candidate is the dump (gradients as the trainer produced them), not qatcheck's builtin VJP", 0},
    {"shared_params", "shared parameters: gradient accumulation across use sites", NULL,
     "a dump in mode tied (scripts/qatdump.py) whose accumulated gradient equals the sum of its sites' shares", 0},
    {"recompute", "recompute (activation checkpointing)", NULL,
     "a dump in mode recompute whose recomputed forward equals its first, bit for bit (and the eager step's, with vjp --eager)", 0},
    {"autocast", "autocast", NULL, "a dump in mode autocast whose gradients pass against their own reference", 0},
    {"cuda_graph", "CUDA Graph", NULL, "a dump in mode cuda_graph that equals the eager step's (vjp --eager EAGER.h5)", 0},
    {"grad_accumulation", "gradient accumulation", NULL,
     "a dump in mode grad_accum whose accumulated gradient is the sum of its micro-batches' (and the whole batch's, with vjp --eager)", 0},
    {"parallel_reduction", "the actual parallel reduction", NULL, "not observable in a one-module audit of unsharded tensors", 1},
};

int qc_cov_find(const char *id) {
  for (int c = 0; c < QC_COV_COUNT; c++)
    if (strcmp(qc_coverage[c].id, id) == 0) return c;
  return -1;
}

/* The number after "key": in a contract's JSON text (0 when absent). */
static double cnum(const char *cj, const char *key) {
  char pat[64];
  snprintf(pat, sizeof pat, "\"%s\":", key);
  const char *p = cj ? strstr(cj, pat) : NULL;
  if (!p) return 0;
  p += strlen(pat);
  while (*p == ' ' || *p == '{' || *p == '"' || (*p >= 'a' && *p <= 'z') || *p == ':') p++;
  return strtod(p, NULL);
}

int qc_cov_applies(int c, const char *cls, const char *cj) {
  const qc_cov_item *it = &qc_coverage[c];
  if (it->classes) {
    char pat[80];
    snprintf(pat, sizeof pat, "|%s|", cls);
    if (!strstr(it->classes, pat)) return 0;
  }
  if (c == QC_COV_THRESHOLD || c == QC_COV_SATURATION) {
    if (strcmp(cls, "linear") == 0) return cj && strstr(cj, "\"clipped\"") != NULL;
    return cnum(cj, "limit") > 0;
  }
  return 1;
}

/* ---- facts from the data ----------------------------------------------------------- */

/* t decoded (float tensors only), malloc'd; NULL when not a plain float. */
static double *decode(const qc_tensor *t, int64_t *n) {
  if (t->dtype != QC_F64 && t->dtype != QC_F32 && t->dtype != QC_F16 && t->dtype != QC_BF16) return NULL;
  *n = qc_numel(t);
  double *v = *n > 0 ? malloc((size_t)*n * sizeof *v) : NULL;
  if (v && qc_tensor_to_f64(t, v) != QC_OK) {
    free(v);
    v = NULL;
  }
  return v;
}

/* Extremes and scales of one float tensor: a zero row and a value over 20
 * RMS; row RMS spanning over 100x. */
static void value_facts(const qc_tensor *t, uint32_t *cover) {
  int64_t n;
  double *v = decode(t, &n);
  if (!v) return;
  int64_t cols = t->ndim ? t->shape[t->ndim - 1] : 1, rows = cols ? n / cols : 0;
  double ss = 0, mx = 0, rlo = INFINITY, rhi = 0;
  int zero_row = 0;
  for (int64_t r = 0; r < rows; r++) {
    double rs = 0;
    for (int64_t c = 0; c < cols; c++) {
      double a = fabs(v[r * cols + c]);
      if (a > mx && isfinite(a)) mx = a;
      rs += a * a;
    }
    ss += rs;
    if (rs == 0) zero_row = 1;
    else if (isfinite(rs)) {
      rs = sqrt(rs / (double)cols);
      if (rs < rlo) rlo = rs;
      if (rs > rhi) rhi = rs;
    }
  }
  double rms = n ? sqrt(ss / (double)n) : 0;
  if (zero_row && rms > 0 && mx > 20 * rms) *cover |= 1u << QC_COV_EXTREMES;
  if (rows > 1 && rhi > 100 * rlo) *cover |= 1u << QC_COV_SCALES;
  free(v);
}

/* Values of t on both sides of limit L (|v| <= L and |v| > L), and beyond it. */
static void limit_facts(const qc_tensor *t, double L, uint32_t *cover) {
  int64_t n;
  double *v = t && L > 0 ? decode(t, &n) : NULL;
  if (!v) return;
  int below = 0, above = 0;
  for (int64_t i = 0; i < n; i++) {
    below |= fabs(v[i]) <= L;
    above |= fabs(v[i]) > L;
  }
  if (above) *cover |= 1u << QC_COV_SATURATION;
  if (above && below) *cover |= 1u << QC_COV_THRESHOLD;
  free(v);
}

/* Integer ids of t as int64 (malloc'd), NULL when not integers. */
static int64_t *ids_of(const qc_tensor *t, int64_t *n) {
  if (!t || (t->dtype != QC_I64 && t->dtype != QC_I32)) return NULL;
  *n = qc_numel(t);
  int64_t *v = *n > 0 ? malloc((size_t)*n * sizeof *v) : NULL;
  for (int64_t i = 0; v && i < *n; i++) v[i] = t->dtype == QC_I64 ? ((const int64_t *)t->data)[i] : ((const int32_t *)t->data)[i];
  return v;
}

/* moe: empty experts, repeated routing, tied weights. */
static void moe_facts(const qc_module *m, uint32_t *cover) {
  const qc_tensor *ids = qc_tset_get(&m->saved, "topk_ids"), *w1 = qc_tset_get(&m->params, "w1");
  const qc_tensor *wt = qc_tset_get(&m->inputs, "topk_weights");
  if (!wt) wt = qc_tset_get(&m->saved, "topk_weights");
  int64_t n, nw;
  int64_t *id = ids_of(ids, &n);
  if (id && ids->ndim == 2 && w1 && w1->ndim == 3) {
    int64_t E = w1->shape[0], k = ids->shape[1], T = ids->shape[0];
    char *used = calloc((size_t)E + 1, 1);
    for (int64_t i = 0; used && i < n; i++)
      if (id[i] >= 0 && id[i] < E) used[id[i]] = 1;
    for (int64_t e = 0; used && e < E; e++)
      if (!used[e]) *cover |= 1u << QC_COV_MOE_EMPTY;
    free(used);
    for (int64_t t = 0; t < T; t++)
      for (int64_t a = 0; a < k; a++)
        for (int64_t b = a + 1; b < k; b++)
          if (id[t * k + a] == id[t * k + b]) *cover |= 1u << QC_COV_MOE_REPEAT;
  }
  free(id);
  double *w = wt ? decode(wt, &nw) : NULL;
  int64_t k = wt && wt->ndim >= 2 ? wt->shape[wt->ndim - 1] : 0;
  for (int64_t t = 0; w && k > 1 && t < nw / k; t++)
    for (int64_t a = 0; a < k; a++)
      for (int64_t b = a + 1; b < k; b++)
        if (w[t * k + a] == w[t * k + b]) *cover |= 1u << QC_COV_TIES;
  free(w);
}

static int cmp_desc(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return x < y ? 1 : x > y ? -1 : 0;
}

/* router: a tie among the k + 1 largest logits of a token. */
static void router_facts(const qc_module *m, uint32_t *cover) {
  const qc_tensor *lg = qc_tset_get(&m->inputs, "logits"), *ids = qc_tset_get(&m->saved, "topk_ids");
  int64_t n;
  double *v = lg && lg->ndim == 2 && ids && ids->ndim == 2 ? decode(lg, &n) : NULL;
  if (!v) return;
  int64_t T = lg->shape[0], E = lg->shape[1], k = ids->shape[1];
  double *row = malloc((size_t)E * sizeof *row);
  for (int64_t t = 0; row && t < T; t++) {
    memcpy(row, v + t * E, (size_t)E * sizeof *row);
    qsort(row, (size_t)E, sizeof *row, cmp_desc);
    for (int64_t j = 0; j < k && j + 1 < E; j++)
      if (row[j] == row[j + 1]) *cover |= 1u << QC_COV_TIES;
  }
  free(row);
  free(v);
}

/* The class's masks: causal attention, a logprob loss mask with zeros, rope
 * positions that restart (packed sequences). */
static void mask_facts(const qc_module *m, const char *cj, uint32_t *cover) {
  const char *cls = m->cls->name;
  if (strcmp(cls, "attention") == 0 && cj && !strstr(cj, "\"causal\":\"false\"") && !strstr(cj, "\"causal\": \"false\""))
    *cover |= 1u << QC_COV_MASK;
  int64_t n;
  if (strcmp(cls, "logprob") == 0) {
    const qc_tensor *mt = qc_tset_get(&m->saved, "loss_mask");
    double *v = mt ? decode(mt, &n) : NULL;
    int64_t *iv = mt && !v ? ids_of(mt, &n) : NULL;
    for (int64_t i = 0; (v || iv) && i < n; i++)
      if ((v && v[i] == 0) || (iv && iv[i] == 0)) *cover |= 1u << QC_COV_MASK;
    if (mt && mt->dtype == QC_U8)
      for (int64_t i = 0; i < qc_numel(mt); i++)
        if (((const uint8_t *)mt->data)[i] == 0) *cover |= 1u << QC_COV_MASK;
    free(v);
    free(iv);
  }
  if (strcmp(cls, "rope") == 0) {
    int64_t *p = ids_of(qc_tset_get(&m->inputs, "positions"), &n);
    for (int64_t i = 1; p && i < n; i++)
      if (p[i] != p[i - 1] + 1) *cover |= 1u << QC_COV_MASK;
    free(p);
  }
}

/* Token rows and sequence length of m, as its class lays them out. */
void qc_cov_tokens(const qc_module *m, int64_t *tokens, int64_t *seqlen) {
  const char *cls = m->cls->name;
  const qc_tensor *t;
  *tokens = *seqlen = 0;
  if (strcmp(cls, "attention") == 0 && (t = qc_tset_get(&m->inputs, "q")) && t->ndim == 4) {
    *tokens = t->shape[0] * t->shape[2];
    *seqlen = t->shape[2];
  } else if ((strcmp(cls, "ssd") == 0 && (t = qc_tset_get(&m->inputs, "x")) && t->ndim == 4) ||
             (strcmp(cls, "conv1d") == 0 && (t = qc_tset_get(&m->inputs, "x")) && t->ndim == 3)) { /* [B, L, ...] */
    *tokens = t->shape[0] * t->shape[1];
    *seqlen = t->shape[1];
  } else if (strcmp(cls, "logprob") == 0 && (t = qc_tset_get(&m->inputs, "logits")) && t->ndim >= 2) {
    *tokens = qc_numel(t) / t->shape[t->ndim - 1];
    *seqlen = t->ndim == 3 ? t->shape[1] : t->shape[0];
  } else if (strcmp(cls, "rope") == 0 && (t = qc_tset_get(&m->inputs, "x")) && t->ndim >= 2) {
    *tokens = *seqlen = t->shape[0];
  } else if (m->inputs.n > 0) {
    t = &m->inputs.t[0];
    for (int i = 0; i < m->inputs.n; i++)
      if (qc_dtype_is_float(m->inputs.t[i].dtype)) { t = &m->inputs.t[i]; break; }
    *tokens = t->ndim >= 2 ? qc_numel(t) / t->shape[t->ndim - 1] : t->ndim == 1 ? t->shape[0] : 1;
  }
}

/* The alignment a size must keep: 16, or the block of the contract's formats. */
static int64_t alignment(const char *cj) {
  if (!cj) return 16;
  if (strstr(cj, "block128") || strstr(cj, "group128")) return 128;
  if (strstr(cj, "\"mxfp")) return 32;
  return 16;
}

void qc_cov_facts(const qc_module *m, const qc_modinfo *mi, uint32_t *cover) {
  const char *cls = m->cls->name, *cj = mi->contract;
  int64_t al = alignment(cj);
  if (mi->tokens == 1) *cover |= 1u << QC_COV_DECODE;
  if (mi->tokens >= QC_COV_LARGE) *cover |= 1u << QC_COV_LARGE_M;
  if (mi->tokens > 16 && mi->tokens % 16) *cover |= 1u << QC_COV_UNALIGNED;
  for (int i = 0; i < mi->nt; i++) {
    const qc_mi_tensor *t = &mi->t[i];
    qc_dtype dt;
    if (strcmp(t->role, "saved") == 0 || t->ndim == 0 || qc_dtype_from_name(t->dtype, &dt) || !qc_dtype_is_float(dt)) continue;
    if (t->shape[t->ndim - 1] > 1 && t->shape[t->ndim - 1] % al) *cover |= 1u << QC_COV_UNALIGNED;
  }
  if (strcmp(mi->values, "special") == 0) *cover |= 1u << QC_COV_EXTREMES;
  if (strcmp(mi->values, "heavy_tail") == 0) *cover |= 1u << QC_COV_SCALES;
  for (int i = 0; i < m->inputs.n; i++) value_facts(&m->inputs.t[i], cover);
  if (strcmp(cls, "linear") == 0 && strstr(cj, "\"clipped\""))
    limit_facts(qc_tset_get(&m->params, "weight"), cnum(cj, "ste"), cover);
  if (strcmp(cls, "swiglu") == 0) {
    limit_facts(qc_tset_get(&m->inputs, "gate"), cnum(cj, "limit"), cover);
    limit_facts(qc_tset_get(&m->inputs, "up"), cnum(cj, "limit"), cover);
  }
  if (strcmp(cls, "moe") == 0) {
    moe_facts(m, cover);
    if (cnum(cj, "limit") > 0 && strcmp(mi->values, "special") == 0)
      *cover |= 1u << QC_COV_THRESHOLD | 1u << QC_COV_SATURATION;
  }
  if (strcmp(cls, "router") == 0) router_facts(m, cover);
  mask_facts(m, cj, cover);
  if (strcmp(mi->candidate, "dump") == 0) *cover |= 1u << QC_COV_TARGET;
}
