/* coverage.c: the method's layer-1 coverage list, and which of its items a
 * module instance's data shows (modinfo.h). What only some classes can show
 * ("a mask", "an empty expert") is each class's own, in its row
 * (qc_class.coverage, cov_tokens, cov_facts): the model names no class
 * (scripts/check-layers.sh keeps it so). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/par.h"
#include "core/qc.h"
#include "model/modinfo.h"
#include "numerics/decode.h"

const qc_cov_item qc_coverage[QC_COV_COUNT] = {
    {"decode", "small M (decode: one token)", 0, "an instance with one token", 0},
    {"large_m", "large M (training / prefill: 1024 tokens or more)", 0, "an instance with at least 1024 tokens", 0},
    {"context_lengths", "different context lengths", 1, "instances of the class with at least two sequence lengths", 0},
    {"unaligned", "unaligned tails", 0,
     "a token count (above 16) or a feature size off a multiple of 16, or of the format's block (32 MX, 128 fp8 block/group)", 0},
    {"mask", "padding / packing / mask", 1, NULL, 0},
    {"dy_random", "random dY", 0, "a generated random dY, or a dump's dY with mostly non-zero entries", 0},
    {"dy_zero", "zero dY", 0, "a dY that is zero everywhere", 0},
    {"dy_sparse", "sparse dY (non-zero at selected positions)", 0, "a dY with under half of its entries non-zero", 0},
    {"dy_real", "dY from real training", 0, "a dY read from a dump's grad_out/", 0},
    {"extremes", "zeros and extreme values", 0,
     "generated special values, or inputs holding an all-zero row and values over 20 times their RMS", 0},
    {"scales", "different scales", 0,
     "generated heavy-tailed values, or inputs whose row RMS spans more than a factor 100", 0},
    {"threshold", "both sides of the quantization threshold", 1, "values on both sides of the contract's threshold", 0},
    {"saturation", "the saturation region", 1, "values beyond the contract's threshold", 0},
    {"moe_empty", "empty experts (MoE)", 1, "an expert that no token is routed to", 0},
    {"moe_repeated", "repeated routing (MoE)", 1, "a token routed to one expert in two of its slots", 0},
    {"moe_shared", "shared experts (MoE)", 1, "a module with shared experts", 0},
    {"topk_ties", "top-k ties", 1, NULL, 0},
    {"target", "the target dtype / layout (the trainer's own gradients)", 0,
     "the candidate is the dump (gradients as the trainer produced them), not qatcheck's builtin VJP", 0},
    {"shared_params", "shared parameters: gradient accumulation across use sites", 0,
     "a dump in mode tied (scripts/qatdump.py) whose accumulated gradient equals the sum of its sites' shares", 0},
    {"recompute", "recompute (activation checkpointing)", 0,
     "a dump in mode recompute whose recomputed forward equals its first, bit for bit (and the eager step's, with vjp --eager)", 0},
    {"autocast", "autocast", 0, "a dump in mode autocast whose gradients pass against their own reference", 0},
    {"cuda_graph", "CUDA Graph", 0, "a dump in mode cuda_graph that equals the eager step's (vjp --eager EAGER.h5)", 0},
    {"grad_accumulation", "gradient accumulation", 0,
     "a dump in mode grad_accum whose accumulated gradient is the sum of its micro-batches' (and the whole batch's, with vjp --eager)", 0},
    {"parallel_reduction", "the actual parallel reduction", 0, "not observable in a one-module audit of unsharded tensors", 1},
};

int qc_cov_find(const char *id) {
  for (int c = 0; c < QC_COV_COUNT; c++)
    if (strcmp(qc_coverage[c].id, id) == 0) return c;
  return -1;
}

/* The number after "key": in a contract's JSON text (0 when absent). */
double qc_cov_num(const char *cj, const char *key) {
  char pat[64];
  snprintf(pat, sizeof pat, "\"%s\":", key);
  const char *p = cj ? strstr(cj, pat) : NULL;
  if (!p) return 0;
  p += strlen(pat);
  while (*p == ' ' || *p == '{' || *p == '"' || (*p >= 'a' && *p <= 'z') || *p == ':') p++;
  return strtod(p, NULL);
}

const qc_class_cov *qc_cov_class_item(const qc_class *cls, int c) {
  for (const qc_class_cov *k = cls ? cls->coverage : NULL; k && k->item; k++)
    if (strcmp(k->item, qc_coverage[c].id) == 0) return k;
  return NULL;
}

int qc_cov_applies(int c, const char *cls, const char *cj) {
  if (!qc_coverage[c].per_class) return 1;
  const qc_registry_row *row = qc_registry_find(cls);
  const qc_class_cov *k = qc_cov_class_item(row ? row->cls : NULL, c);
  return k && (!k->applies || k->applies(cj));
}

void qc_cov_how(int c, const char *const *cls, int n, char *buf, size_t size) {
  const qc_cov_item *it = &qc_coverage[c];
  int nrow = 0, sep = 0;
  const qc_registry_row *rows = qc_registry_rows(&nrow);
  size_t k = (size_t)snprintf(buf, size, "%s", it->how ? it->how : "");
  if (!it->per_class) return;
  for (int i = 0; i < (cls ? n : nrow) && k < size; i++) {
    const qc_registry_row *r = cls ? qc_registry_find(cls[i]) : &rows[i];
    const qc_class_cov *e = qc_cov_class_item(r ? r->cls : NULL, c);
    if (!e || !e->how) continue;
    k += (size_t)snprintf(buf + k, size - k, "%s%s: %s", sep ? "; " : it->how ? ": " : "", r->cls->name, e->how);
    sep = 1;
  }
}

/* ---- facts from the data ----------------------------------------------------------- */

double *qc_cov_values(const qc_tensor *t, int64_t *n) {
  if (t->dtype != QC_F64 && t->dtype != QC_F32 && t->dtype != QC_F16 && t->dtype != QC_BF16) return NULL;
  *n = qc_numel(t);
  double *v = *n > 0 ? malloc((size_t)*n * sizeof *v) : NULL;
  if (v && qc_tensor_to_f64(t, v) != QC_OK) {
    free(v);
    v = NULL;
  }
  return v;
}

/* value_facts' pieces of QC_VF_ROWS rows each (fixed by the shape, so the
 * sums are the same on any number of threads): each piece's sum of
 * squares, largest finite |value|, a zero row, and its rows' RMS range. */
#define QC_VF_ROWS 64
typedef struct vf_piece {
  double ss, mx, rlo, rhi;
  int zero_row;
} vf_piece;

typedef struct vf_ctx {
  const double *v;
  int64_t rows, cols;
  vf_piece *p;
} vf_ctx;

static void vf_pieces(void *ctx, int64_t lo, int64_t hi, int tid) {
  (void)tid;
  const vf_ctx *c = ctx;
  for (int64_t k = lo; k < hi; k++) {
    vf_piece *q = &c->p[k];
    *q = (vf_piece){0, 0, INFINITY, 0, 0};
    const int64_t r1 = (k + 1) * QC_VF_ROWS < c->rows ? (k + 1) * QC_VF_ROWS : c->rows;
    for (int64_t r = k * QC_VF_ROWS; r < r1; r++) {
      double rs = 0;
      for (int64_t j = 0; j < c->cols; j++) {
        const double a = fabs(c->v[r * c->cols + j]);
        if (a > q->mx && isfinite(a)) q->mx = a;
        rs += a * a;
      }
      q->ss += rs;
      if (rs == 0) q->zero_row = 1;
      else if (isfinite(rs)) {
        rs = sqrt(rs / (double)c->cols);
        if (rs < q->rlo) q->rlo = rs;
        if (rs > q->rhi) q->rhi = rs;
      }
    }
  }
}

/* Extremes and scales of one float tensor: a zero row and a value over 20
 * RMS; row RMS spanning over 100x. The rows in pieces on qc_par_for's
 * threads (the inputs of a real-size layer were a second of the audit's
 * main thread). */
static void value_facts(const qc_tensor *t, uint32_t *cover) {
  int64_t n;
  double *v = qc_cov_values(t, &n);
  if (!v) return;
  const int64_t cols = t->ndim ? t->shape[t->ndim - 1] : 1, rows = cols ? n / cols : 0;
  const int64_t np = (rows + QC_VF_ROWS - 1) / QC_VF_ROWS;
  vf_ctx c = {v, rows, cols, np ? malloc((size_t)np * sizeof *c.p) : NULL};
  if (np && !c.p) {
    free(v);
    return; /* no memory: no facts, as for a tensor that cannot be read */
  }
  if (np) qc_par_for(np, 1, vf_pieces, &c);
  double ss = 0, mx = 0, rlo = INFINITY, rhi = 0;
  int zero_row = 0;
  for (int64_t k = 0; k < np; k++) { /* in piece order */
    ss += c.p[k].ss;
    mx = fmax(mx, c.p[k].mx);
    rlo = fmin(rlo, c.p[k].rlo);
    rhi = fmax(rhi, c.p[k].rhi);
    zero_row |= c.p[k].zero_row;
  }
  double rms = n ? sqrt(ss / (double)n) : 0;
  if (zero_row && rms > 0 && mx > 20 * rms) *cover |= 1u << QC_COV_EXTREMES;
  if (rows > 1 && rhi > 100 * rlo) *cover |= 1u << QC_COV_SCALES;
  free(c.p);
  free(v);
}

void qc_cov_limit(const qc_tensor *t, double L, uint32_t *cover) {
  int64_t n;
  double *v = t && L > 0 ? qc_cov_values(t, &n) : NULL;
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

int64_t *qc_cov_ids(const qc_tensor *t, int64_t *n) {
  if (!t || (t->dtype != QC_I64 && t->dtype != QC_I32)) return NULL;
  *n = qc_numel(t);
  int64_t *v = *n > 0 ? malloc((size_t)*n * sizeof *v) : NULL;
  for (int64_t i = 0; v && i < *n; i++) v[i] = t->dtype == QC_I64 ? ((const int64_t *)t->data)[i] : ((const int32_t *)t->data)[i];
  return v;
}

/* Token rows and sequence length of m, as its class lays them out. */
void qc_cov_tokens(const qc_module *m, int64_t *tokens, int64_t *seqlen) {
  const qc_tensor *t;
  *tokens = *seqlen = 0;
  if (m->cls->cov_tokens && m->cls->cov_tokens(m, tokens, seqlen)) return;
  if (m->inputs.n > 0) {
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
  const char *cj = mi->contract;
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
  if (m->cls->cov_facts) m->cls->cov_facts(m, mi, cover);
  if (strcmp(mi->candidate, "dump") == 0) *cover |= 1u << QC_COV_TARGET;
}
