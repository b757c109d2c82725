/* variants.c: see variants.h. */
#include "engine/variants.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/par.h"
#include "core/qc.h"
#include "numerics/decode.h"
#include "numerics/metrics.h"

int qc_quantizes(const qc_module *m) {
  for (const qc_key_spec *k = m->cls->keys; k && k->key; k++) {
    size_t l = strlen(k->key);
    if (l > 7 && strcmp(k->key + l - 7, "_format") == 0 && strcmp(qc_contract_str(&m->contract, k->key, k->dflt), "none") != 0)
      return 1;
  }
  return 0;
}

/* The class's rounding levels for m: its round_ops; levels above 2 (a
 * pure-bf16 model's arithmetic: moe's 3 and 4) only when the contract says
 * compute_dtype bfloat16. */
static int qc_variant_levels(const qc_module *m) {
  const int n = m->cls->round_ops;
  return n > 2 && !qc_contract_bf16_compute(&m->contract) ? 2 : n;
}

/* not_bf16's pieces: moved = 1 once a piece finds a value that moves (the
 * others then stop early; the answer is the same whatever the pieces). */
typedef struct nb_ctx {
  const qc_tensor *t;
  _Atomic int moved;
} nb_ctx;

static void nb_piece(void *ctx, int64_t lo, int64_t hi, int tid) {
  (void)tid;
  nb_ctx *c = ctx;
  const int f32 = c->t->dtype == QC_F32;
  for (int64_t i = lo; i < hi; i++) {
    if ((i & 4095) == 0 && c->moved) return;
    const double v = f32 ? ((const float *)c->t->data)[i] : ((const double *)c->t->data)[i];
    if (isfinite(v) && qc_round_to(v, QC_BF16) != v) {
      c->moved = 1;
      return;
    }
  }
}

/* 1 when some finite value of t is not a bf16 value (rounding it to bf16
 * changes it), on qc_par_for's threads (a tensor that holds only bf16
 * values is read whole: 1 s of the real-size DeepSeek-V3 layer's main
 * thread on one). */
static int not_bf16(const qc_tensor *t) {
  if (t->dtype != QC_F32 && t->dtype != QC_F64) return 0;
  nb_ctx c = {.t = t};
  const int64_t n = qc_numel(t);
  if (n > 0) qc_par_for(n, (int64_t)1 << 16, nb_piece, &c);
  return c.moved;
}

/* 1 when rounding m's differentiated float inputs to bf16 changes one (a
 * buffer the class only reads, rope's inv_freq, is never rounded). */
static int inputs_move(const qc_module *m) {
  for (int j = 0; j < m->inputs.n; j++)
    if (qc_module_input_grad(m, m->inputs.t[j].name) && not_bf16(&m->inputs.t[j])) return 1;
  return 0;
}

/* 1 when rounding m's parameters to bf16 changes one. */
static int params_move(const qc_module *m) {
  for (int j = 0; j < m->params.n; j++)
    if (not_bf16(&m->params.t[j])) return 1;
  return 0;
}

/* 1 when a tensor of s is stored in a 16-bit float type. */
static int any16(const qc_tset *s) {
  for (int j = 0; j < s->n; j++)
    if (s->t[j].dtype == QC_BF16 || s->t[j].dtype == QC_F16) return 1;
  return 0;
}

/* 1 when t is a float tensor every value of which is a bf16 or float16
 * value (its narrowest type, qc_values_dtype): it passed through 16 bits.
 * A tensor that cannot be read counts as one (nothing is ruled out). */
static int values16(const qc_tensor *t) {
  if (!qc_dtype_is_float(t->dtype) || t->dtype == QC_E2M1X2) return 0;
  const int64_t n = qc_numel(t);
  double *v = n ? malloc((size_t)n * sizeof *v) : NULL;
  qc_err_state es; /* evidence that cannot be read rules nothing out, and is no error */
  qc_err_save(&es);
  int narrow = 1;
  if (v && qc_tensor_to_f64(t, v) == QC_OK) {
    const qc_dtype d = qc_values_dtype(v, n, QC_F64);
    narrow = d == QC_BF16 || d == QC_F16;
  }
  qc_err_restore(&es);
  free(v);
  return narrow;
}

unsigned qc_variants_evidence(const qc_module *m, const char *autocast) {
  if (!autocast || strcmp(autocast, "off") != 0 || qc_contract_bf16_compute(&m->contract)) return 0;
  if (any16(&m->inputs) || any16(&m->params) || any16(&m->saved) || any16(&m->outputs) || any16(&m->grad_out)) return 0;
  int wide = 0; /* an output whose values did not all pass through 16 bits */
  for (int j = 0; j < m->outputs.n && !wide; j++) wide = qc_dtype_is_float(m->outputs.t[j].dtype) && !values16(&m->outputs.t[j]);
  return wide ? QC_VAR_BF16_INPUTS | QC_VAR_BF16_PARAMS : 0;
}

/* Append variant (parts, level) to L unless a part of it is not allowed. */
static void add(qc_variants *L, unsigned parts, int level, unsigned allowed) {
  if ((parts & ~allowed) || L->n >= QC_VARIANTS_MAX) return;
  L->v[L->n].parts = parts;
  L->v[L->n].level = level;
  L->n++;
}

void qc_variants_of(const qc_module *m, const qc_tensor *dy, qc_variants_kind kind, unsigned off, const char *autocast,
                    qc_variants *out) {
  memset(out, 0, sizeof *out);
  out->levels = qc_variant_levels(m);
  out->ruled_out = qc_variants_evidence(m, autocast);
  unsigned allowed = QC_VAR_ALL & ~off & ~out->ruled_out;
  if (!out->levels) allowed &= ~QC_VAR_ROUND_OPS;
  unsigned have = out->levels ? QC_VAR_ROUND_OPS : 0; /* the parts that change something of m */
  if (kind == QC_VARIANTS_GRADS) {
    if (dy && not_bf16(dy)) have |= QC_VAR_BF16_DY;
    if (inputs_move(m)) have |= QC_VAR_BF16_INPUTS;
    allowed &= have & ~QC_VAR_BF16_PARAMS;
    for (int lv = 0; lv <= out->levels; lv++)
      for (unsigned sub = 0; sub <= (QC_VAR_BF16_DY | QC_VAR_BF16_INPUTS); sub++)
        if ((sub & have) == sub && (lv || sub)) add(out, sub | (lv ? QC_VAR_ROUND_OPS : 0), lv, allowed);
  } else {
    const int q = qc_quantizes(m), in = inputs_move(m);
    if (!q && in) add(out, QC_VAR_BF16_INPUTS, 0, allowed);
    if (!q && (in || params_move(m))) add(out, QC_VAR_BF16_INPUTS | QC_VAR_BF16_PARAMS, 0, allowed);
    for (int lv = 1; lv <= out->levels; lv++) add(out, QC_VAR_ROUND_OPS, lv, allowed);
  }
}

/* The row of grad_reads that holds for gradient `grad` of m, or NULL. */
static const qc_grad_reads *reads_row(const qc_module *m, const char *grad) {
  const qc_grad_reads *r = m->cls->grad_reads;
  for (; r && r->grad; r++)
    if (strcmp(r->grad, grad) == 0 && (!r->applies || r->applies(&m->contract))) return r;
  return NULL;
}

/* The part named by the n bytes at p (QC_VAR_*), 0 for none. */
static unsigned part_word(const char *p, size_t n) {
  static const struct { const char *word; unsigned part; } w[] = {
      {"dy", QC_VAR_BF16_DY}, {"inputs", QC_VAR_BF16_INPUTS}, {"params", QC_VAR_BF16_PARAMS}, {"ops", QC_VAR_ROUND_OPS}};
  for (size_t j = 0; j < sizeof w / sizeof w[0]; j++)
    if (strlen(w[j].word) == n && strncmp(p, w[j].word, n) == 0) return w[j].part;
  return 0;
}

/* The parts read by row r's words ("dy inputs=ops"), and into *same the
 * parts of its one '='-joined word (0: none). QC_VAR_ALL where a word is
 * not known, or a second '=' word is there. */
static unsigned parse_reads(const char *s, unsigned *same) {
  unsigned reads = 0;
  *same = 0;
  for (const char *p = s + strspn(s, " "); *p; p += strspn(p, " ")) {
    const size_t n = strcspn(p, " ");
    unsigned group = 0;
    int words = 0;
    for (const char *q = p; q < p + n; q++) { /* a word, or words joined by '=' */
      const size_t l = strcspn(q, "= ");
      const unsigned part = part_word(q, l);
      if (!part) return *same = 0, QC_VAR_ALL; /* a word it does not know: it reads everything */
      group |= part, words++;
      q += l;
    }
    if (words > 1) {
      if (*same) return *same = 0, QC_VAR_ALL; /* one group only */
      *same = group;
    }
    reads |= group;
    p += n;
  }
  return reads;
}

unsigned qc_grad_reads_of(const qc_module *m, const char *grad) {
  const qc_grad_reads *r = reads_row(m, grad);
  unsigned same;
  return r && r->reads ? parse_reads(r->reads, &same) : QC_VAR_ALL;
}

unsigned qc_grad_same_of(const qc_module *m, const char *grad) {
  const qc_grad_reads *r = reads_row(m, grad);
  unsigned same = 0;
  if (r && r->reads) (void)parse_reads(r->reads, &same);
  return same;
}

/* Variant v as a gradient that reads the parts `reads` sees it: its parts
 * among them, the parts of `same` (one rounding, however many of them are
 * applied; round_ops in it at the class's first level only) as the group's
 * lowest, and its level where round_ops is one of the parts left (else 0). */
static qc_variant effective(const qc_variant *v, unsigned reads, unsigned same) {
  qc_variant e = {.parts = v->parts & reads, .level = 0};
  const int deeper = (e.parts & QC_VAR_ROUND_OPS) && v->level > 1; /* a group holds ops at its first level only */
  if ((e.parts & same) && !deeper) e.parts = (e.parts & ~same) | (same & -same); /* the group as its lowest part */
  if (e.parts & QC_VAR_ROUND_OPS) e.level = v->level;
  return e;
}

int qc_variant_repeats(const qc_variants *L, int i, unsigned reads, unsigned same) {
  const qc_variant e = effective(&L->v[i], reads, same);
  if (!e.parts) return -1;
  for (int j = 0; j < i; j++) {
    const qc_variant f = effective(&L->v[j], reads, same);
    if (f.parts == e.parts && f.level == e.level) return j;
  }
  return i;
}

/* Round the float values of t to bf16 in place (float32 and float64 storage; others unchanged). */
static void round_bf16(qc_tensor *t) { qc_round_all(t->data, t->dtype, qc_numel(t), QC_BF16); }

int qc_variant_apply(const qc_variant *v, const qc_ctx *ctx, const qc_module *m, const qc_tensor *dy, qc_ctx *c, qc_module *alt,
                     qc_tensor *dv) {
  int rc;
  *c = *ctx;
  *alt = *m;
  c->round_ops = v->parts & QC_VAR_ROUND_OPS ? v->level : 0;
  if (dy) *dv = *dy;
  if (dy && (v->parts & QC_VAR_BF16_DY)) memset(dv, 0, sizeof *dv); /* owned from here: released whatever fails below */
  if (v->parts & QC_VAR_BF16_INPUTS) {
    memset(&alt->inputs, 0, sizeof alt->inputs);
    if ((rc = qc_tset_clone(&alt->inputs, &m->inputs))) return rc;
    for (int j = 0; j < alt->inputs.n; j++)
      if (qc_module_input_grad(m, alt->inputs.t[j].name)) round_bf16(&alt->inputs.t[j]);
  }
  const qc_registry_row *row = m->cls ? qc_registry_find(m->cls->name) : NULL;
  if ((v->parts & QC_VAR_BF16_PARAMS) && row && row->bf16_params && !dy) {
    c->bf16_params = 1; /* the forward rounds them as it reads them */
  } else if (v->parts & QC_VAR_BF16_PARAMS) {
    memset(&alt->params, 0, sizeof alt->params);
    if ((rc = qc_tset_clone(&alt->params, &m->params))) return rc;
    for (int j = 0; j < alt->params.n; j++) round_bf16(&alt->params.t[j]);
  }
  if (dy && (v->parts & QC_VAR_BF16_DY)) {
    if ((rc = qc_tensor_alloc(dv, dy->name, dy->dtype, dy->ndim, dy->shape))) return rc;
    memcpy(dv->data, dy->data, (size_t)qc_numel(dy) * qc_dtype_size(dy->dtype));
    round_bf16(dv);
  }
  return QC_OK;
}

void qc_variant_release(const qc_variant *v, const qc_module *m, qc_module *alt, qc_tensor *dv) {
  if (dv && (v->parts & QC_VAR_BF16_DY)) qc_tensor_free(dv);
  qc_module_variant_free(alt, m);
}

void qc_variant_id(const qc_variant *v, char *buf, size_t n) {
  size_t l = 0;
  buf[0] = 0;
  for (unsigned b = 1; b <= QC_VAR_ROUND_OPS; b <<= 1)
    if (v->parts & b) l += (size_t)snprintf(buf + l, l < n ? n - l : 0, "%s%s", l ? "+" : "", qc_variant_part_name(b));
  if (!v->parts) snprintf(buf, n, "none");
}

/* It in words, for the report ("bf16-rounded dY and operands and ops (the
 * class's rounding variant 1 of 2, docs/classes.md)"); levels: the
 * class's. */
static void qc_variant_name(const qc_variant *v, int levels, char *buf, size_t n) {
  const char *part[4];
  char ops[96];
  int np = 0;
  if (v->parts & QC_VAR_BF16_DY) part[np++] = "dY";
  if (v->parts & QC_VAR_BF16_INPUTS) part[np++] = "inputs";
  if (v->parts & QC_VAR_BF16_PARAMS) part[np++] = "parameters";
  if (v->parts & QC_VAR_ROUND_OPS) {
    snprintf(ops, sizeof ops, "operands and ops (the class's rounding variant %d of %d, docs/classes.md)", v->level, levels);
    part[np++] = ops;
  }
  size_t l = (size_t)snprintf(buf, n, "bf16-rounded");
  for (int i = 0; i < np; i++)
    l += (size_t)snprintf(buf + (l < n ? l : n), l < n ? n - l : 0, "%s%s", i == 0 ? " " : i == np - 1 ? " and " : ", ", part[i]);
  if (v->parts == (QC_VAR_BF16_INPUTS | QC_VAR_BF16_PARAMS)) snprintf(buf + (l < n ? l : n), l < n ? n - l : 0, " (autocast)");
}

/* The sine between candidate and reference of check k (1 when undefined). */
static double sine(const qc_check *k) {
  const double c = k->m.cosine;
  return k->m.cosine_null || !isfinite(c) ? 1.0 : sqrt(fmax(0.0, 1.0 - c * c));
}

/* Variant i of L judged into kv, speculatively: its error state restored
 * (a variant that cannot be judged leaves no error), except out of memory,
 * which is the run's (QC_ESYS, its message kept). */
static int judge_one(const qc_variants *L, qc_variant_judge_fn judge, void *arg, int i, qc_check *kv) {
  qc_err_state es;
  qc_err_save(&es);
  int rc = judge(arg, i, &L->v[i], kv);
  if (rc == QC_ESYS) qc_err_keep(&es);
  else qc_err_restore(&es);
  return rc;
}

int qc_variants_closest(const qc_variants *L, qc_variant_judge_fn judge, void *arg, qc_check *k, int *chosen) {
  *chosen = -1;
  if (k->verdict == QC_V_PASS || k->variant_id[0]) return QC_OK;
  qc_check best, kv;
  for (int i = 0; i < L->n; i++) {
    int rc = judge_one(L, judge, arg, i, &kv); /* a variant that cannot be judged is no candidate */
    if (rc == QC_ESYS) return rc;
    if (rc || kv.verdict == QC_V_PASS || !(sine(&kv) < 0.5 * sine(k)) || (*chosen >= 0 && !(sine(&kv) < sine(&best)))) continue;
    qc_variant_name(&L->v[i], L->levels, kv.variant, sizeof kv.variant);
    qc_variant_id(&L->v[i], kv.variant_id, sizeof kv.variant_id);
    best = kv;
    *chosen = i;
  }
  if (*chosen >= 0) *k = best;
  return QC_OK;
}

/* |bias_z| of a check, 0 where the test was not made. */
static double zabs(const qc_check *k) { return isfinite(k->m.bias_z) ? fabs(k->m.bias_z) : 0.0; }

int qc_variants_wanted(const qc_check *k) {
  if (k->verdict != QC_V_PASS) return 1;
  const double zb = k->tol.has_bias_z ? k->tol.bias_z : QC_BIAS_Z_DEFAULT;
  return zb > 0 && zabs(k) > 0.5 * zb;
}

int qc_variant_better(const qc_check *k, const qc_check *best, const qc_check *kv) {
  if (kv->verdict != QC_V_PASS) return 0;
  if (!(kv->m.rel_l2 < k->m.rel_l2 || kv->m.noise_multiple < k->m.noise_multiple)) return 0; /* fits no better */
  if (k->verdict == QC_V_PASS) return zabs(kv) < zabs(best ? best : k);
  return !best || kv->m.rel_l2 < best->m.rel_l2;
}

int qc_variants_judge(const qc_variants *L, qc_variant_judge_fn judge, void *arg, qc_check *k) {
  if (!qc_variants_wanted(k)) return QC_OK;
  qc_check best, kv;
  int have = 0;
  for (int i = 0; i < L->n; i++) {
    int rc = judge_one(L, judge, arg, i, &kv); /* a variant that cannot be judged explains nothing */
    if (rc == QC_ESYS) return rc;
    if (rc || !qc_variant_better(k, have ? &best : NULL, &kv)) continue;
    qc_variant_name(&L->v[i], L->levels, kv.variant, sizeof kv.variant);
    qc_variant_id(&L->v[i], kv.variant_id, sizeof kv.variant_id);
    best = kv;
    have = 1;
  }
  if (have) *k = best;
  return QC_OK;
}
