/* modinfo.c: a module instance described for the reports (modinfo.h). */
#include "model/modinfo.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

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

/* Fraction of non-zero elements of a stored tensor (bit patterns: -0 is zero). */
static double nonzero(const qc_tensor *t) {
  int64_t n = qc_numel(t), nz = 0;
  size_t es = qc_dtype_size(t->dtype);
  const unsigned char *p = t->data;
  /* each element's bits but the sign (its last byte's top bit: little-endian), a word at a time where the
   * element is one (a whole model's dYs byte by byte were 0.12 s of an audit's main thread) */
  if (es == 2 || es == 4 || es == 8) {
    const uint64_t mask = es == 8 ? 0x7fffffffffffffffu : es == 4 ? 0x7fffffffu : 0x7fffu;
    for (int64_t i = 0; i < n; i++) {
      uint64_t w = 0;
      memcpy(&w, p + i * es, es);
      nz += (w & mask) != 0;
    }
    return n ? (double)nz / (double)n : 0;
  }
  for (int64_t i = 0; i < n; i++) {
    int any = 0;
    for (size_t b = 0; b < es; b++) any |= p[i * es + b] & (b + 1 == es ? 0x7f : 0xff);
    nz += any != 0;
  }
  return n ? (double)nz / (double)n : 0;
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
