/* modinfo.c: a module instance described for the reports (modinfo.h). */
#include "model/modinfo.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/par.h"
#include "core/qc.h"

static void add_tensors(qc_modinfo *mi, const qc_tset *s, const char *role) {
  for (int i = 0; i < s->n && mi->nt < QC_MI_TENSORS; i++) {
    qc_mi_tensor *t = &mi->t[mi->nt++];
    snprintf(t->role, sizeof t->role, "%s", role);
    snprintf(t->name, sizeof t->name, "%s", s->t[i].name);
    snprintf(t->dtype, sizeof t->dtype, "%s", qc_dtype_name(s->t[i].dtype));
    t->ndim = s->t[i].ndim;
    memcpy(t->shape, s->t[i].shape, sizeof t->shape);
  }
}

/* Non-zero elements of [lo, hi) counted into nz[tid] (nonzero's pieces). */
typedef struct nz_ctx {
  const unsigned char *p;
  size_t es;
  int64_t nz[QC_PAR_MAX];
} nz_ctx;

static void nz_piece(void *ctx, int64_t lo, int64_t hi, int tid) {
  nz_ctx *c = ctx;
  int64_t nz = 0;
  /* each element's bits but the sign (its last byte's top bit: little-endian), read at its own width (a
   * memcpy of a variable size, a call an element, was 4.7 s of the real-size DeepSeek-V3 layer's main thread) */
  uint16_t h;
  uint32_t w;
  uint64_t d;
  switch (c->es) { /* a memcpy of a constant size: one load, and no aliasing of the float data */
    case 2: for (int64_t i = lo; i < hi; i++) memcpy(&h, c->p + 2 * i, 2), nz += (h & 0x7fffu) != 0; break;
    case 4: for (int64_t i = lo; i < hi; i++) memcpy(&w, c->p + 4 * i, 4), nz += (w & 0x7fffffffu) != 0; break;
    case 8: for (int64_t i = lo; i < hi; i++) memcpy(&d, c->p + 8 * i, 8), nz += (d & 0x7fffffffffffffffu) != 0; break;
    default:
      for (int64_t i = lo; i < hi; i++) {
        int any = 0;
        for (size_t b = 0; b < c->es; b++) any |= c->p[i * (int64_t)c->es + (int64_t)b] & (b + 1 == c->es ? 0x7f : 0xff);
        nz += any != 0;
      }
  }
  c->nz[tid] += nz;
}

/* Fraction of non-zero elements of a stored tensor (bit patterns: -0 is
 * zero), counted on qc_par_for's threads (a count: the same whatever the
 * pieces). */
static double nonzero(const qc_tensor *t) {
  const int64_t n = qc_numel(t);
  nz_ctx c = {.p = t->data, .es = qc_dtype_size(t->dtype)};
  if (n <= 0 || !c.es) return 0;
  qc_par_for(n, (int64_t)1 << 18, nz_piece, &c);
  int64_t nz = 0;
  for (int i = 0; i < QC_PAR_MAX; i++) nz += c.nz[i];
  return (double)nz / (double)n;
}

int qc_modinfo_fill(qc_modinfo *mi, const qc_module *m, const char *source, const char *candidate, const char *values) {
  memset(mi, 0, sizeof *mi);
  snprintf(mi->module, sizeof mi->module, "%s", m->path);
  snprintf(mi->cls, sizeof mi->cls, "%s", m->cls->name);
  snprintf(mi->source, sizeof mi->source, "%s", source);
  snprintf(mi->candidate, sizeof mi->candidate, "%s", candidate);
  snprintf(mi->values, sizeof mi->values, "%s", values ? values : "");
  qc_contract_json(&m->contract, mi->contract, sizeof mi->contract);
  add_tensors(mi, &m->inputs, "inputs");
  add_tensors(mi, &m->params, "params");
  add_tensors(mi, &m->saved, "saved");
  int generated = strcmp(source, "generated") == 0;
  for (int i = 0; i < m->grad_out.n && mi->ndy < QC_MI_DY; i++) {
    const qc_tensor *d = &m->grad_out.t[i];
    qc_mi_dy *y = &mi->dy[mi->ndy++];
    snprintf(y->name, sizeof y->name, "%s", d->name);
    snprintf(y->kind, sizeof y->kind, "%s", generated ? d->name : "dump");
    y->nonzero = qc_dtype_size(d->dtype) ? nonzero(d) : 1;
    if (!generated) mi->cover |= 1u << QC_COV_DY_REAL;
    if (y->nonzero == 0) mi->cover |= 1u << QC_COV_DY_ZERO;
    else if (y->nonzero < 0.5) mi->cover |= 1u << QC_COV_DY_SPARSE;
    else if (!generated || strcmp(d->name, "random") == 0) mi->cover |= 1u << QC_COV_DY_RANDOM;
  }
  qc_cov_tokens(m, &mi->tokens, &mi->seqlen);
  qc_cov_facts(m, mi, &mi->cover);
  return QC_OK;
}

int qc_modinfos_add(qc_modinfos *l, const qc_modinfo *mi) {
  if (l->n == l->cap) {
    int cap = l->cap ? 2 * l->cap : 16;
    qc_modinfo *nv = realloc(l->v, (size_t)cap * sizeof *nv);
    if (!nv) return qc_err_sys("out of memory recording module facts");
    l->v = nv;
    l->cap = cap;
  }
  l->v[l->n++] = *mi;
  return QC_OK;
}

void qc_modinfos_free(qc_modinfos *l) {
  free(l->v);
  memset(l, 0, sizeof *l);
}
