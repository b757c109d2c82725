/* summary.c: rows grouped into class summaries, outliers marked (see
 * sweep.h, qc_contract_summarize, and docs/contract.md for the rule). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/qc.h"
#include "sweep/sweep.h"

static int cmp_d(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return (x > y) - (x < y);
}

/* Median of v[0..n) (sorted in place); NAN when n = 0. */
static double median(double *v, int n) {
  if (n == 0) return NAN;
  qsort(v, (size_t)n, sizeof *v, cmp_d);
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

/* Median absolute deviation of v[0..n) from m (tmp: n doubles). */
static double mad(const double *v, int n, double m, double *tmp) {
  for (int i = 0; i < n; i++) tmp[i] = fabs(v[i] - m);
  return median(tmp, n);
}

static int same_class(const qc_crow *r, const qc_cclass *c) {
  return strcmp(r->cls, c->cls) == 0 && strcmp(r->tensor, c->tensor) == 0 && strcmp(r->wfmt, c->wfmt) == 0 &&
         strcmp(r->afmt, c->afmt) == 0;
}

/* Summarize class c over its rows idx[0..n); mark outliers. */
static void summarize_one(qc_sweep *s, qc_cclass *c, const int *idx, int n, double *a, double *b, double *t) {
  int k = 0;
  /* cosine */
  for (int i = 0; i < n; i++)
    if (!s->rows[idx[i]].m.cosine_null) a[k++] = s->rows[idx[i]].m.cosine;
  c->cos_med = median(a, k);
  c->cos_min = k ? a[0] : NAN;
  c->cos_max = k ? a[k - 1] : NAN;
  /* norm ratio (finite only) */
  int kn = 0;
  for (int i = 0; i < n; i++)
    if (isfinite(s->rows[idx[i]].m.norm_ratio)) b[kn++] = s->rows[idx[i]].m.norm_ratio;
  double nr_med = median(b, kn);
  c->nr_med = nr_med;
  c->nr_min = kn ? b[0] : NAN;
  c->nr_max = kn ? b[kn - 1] : NAN;
  double nr_mad = kn ? mad(b, kn, nr_med, t) : NAN;
  /* rel_l2 on a log scale */
  for (int i = 0; i < n; i++) t[i] = s->rows[idx[i]].m.rel_l2;
  c->rel_med = median(t, n);
  for (int i = 0; i < n; i++) a[i] = log10(fmax(s->rows[idx[i]].m.rel_l2, 1e-12));
  for (int i = 0; i < n; i++) b[i] = a[i];
  double lr_med = median(b, n), lr_mad = mad(a, n, lr_med, t);
  /* distinct layers */
  c->layers = 0;
  for (int i = 0; i < n; i++) {
    int seen = 0;
    for (int j = 0; j < i && !seen; j++) seen = s->rows[idx[j]].layer == s->rows[idx[i]].layer;
    c->layers += !seen;
  }
  c->rows = n;
  for (int i = 0; i < n; i++) c->fails += s->rows[idx[i]].fail;
  if (n < QC_OUTLIER_MIN_ROWS) return;
  double lr_scale = fmax(1.4826 * lr_mad, QC_OUTLIER_LOG_FLOOR);
  double nr_scale = fmax(fmax(1.4826 * nr_mad, 0.1 * c->rel_med), 1e-12);
  for (int i = 0; i < n; i++) {
    qc_crow *r = &s->rows[idx[i]];
    double lr = log10(fmax(r->m.rel_l2, 1e-12));
    double zl = fabs(lr - lr_med) / lr_scale;
    double zn = isfinite(r->m.norm_ratio) ? fabs(r->m.norm_ratio - nr_med) / nr_scale : 0;
    if (zl > QC_OUTLIER_Z)
      snprintf(r->outlier_why, sizeof r->outlier_why, "rel_l2 %.4g vs class median %.4g (%.1f robust sd on a log scale)",
               r->m.rel_l2, c->rel_med, zl);
    else if (zn > QC_OUTLIER_Z)
      snprintf(r->outlier_why, sizeof r->outlier_why, "norm ratio %.6f vs class median %.6f (%.1f robust sd)",
               r->m.norm_ratio, nr_med, zn);
    else
      continue;
    r->outlier = 1;
    c->outliers++;
  }
}

/* Table order: d_x before d_weight, then formats in the order first seen,
 * then classes in the order first seen (checkpoint order). */
static int cmp_class(const void *pa, const void *pb) {
  const qc_cclass *a = pa, *b = pb;
  int ta = strcmp(a->tensor, "d_x") != 0, tb = strcmp(b->tensor, "d_x") != 0;
  if (ta != tb) return ta - tb;
  if (a->combo_first != b->combo_first) return a->combo_first - b->combo_first;
  return a->first - b->first;
}

int qc_contract_summarize(qc_sweep *s) {
  int rc = QC_OK;
  free(s->cls);
  s->cls = NULL;
  s->ncls = 0;
  int *idx = malloc((size_t)(s->n + 1) * sizeof *idx);
  double *a = malloc((size_t)(s->n + 1) * sizeof *a), *b = malloc((size_t)(s->n + 1) * sizeof *b);
  double *t = malloc((size_t)(s->n + 1) * sizeof *t);
  int *done = calloc((size_t)(s->n + 1), sizeof *done);
  s->cls = calloc((size_t)(s->n + 1), sizeof *s->cls);
  if (!idx || !a || !b || !t || !done || !s->cls) { rc = qc_err_sys("out of memory for contract classes"); goto out; }
  for (int i = 0; i < s->n; i++) {
    if (done[i]) continue;
    qc_cclass *c = &s->cls[s->ncls++];
    const qc_crow *r = &s->rows[i];
    snprintf(c->cls, sizeof c->cls, "%s", r->cls);
    c->tensor = r->tensor;
    snprintf(c->wfmt, sizeof c->wfmt, "%s", r->wfmt);
    snprintf(c->afmt, sizeof c->afmt, "%s", r->afmt);
    int n = 0;
    for (int j = i; j < s->n; j++)
      if (!done[j] && same_class(&s->rows[j], c)) { idx[n++] = j; done[j] = 1; }
    for (int j = 0; j < n; j++) { s->rows[idx[j]].outlier = 0; s->rows[idx[j]].outlier_why[0] = 0; }
    c->first = i;
    c->combo_first = i;
    for (int j = 0; j < i; j++)
      if (s->rows[j].tensor == r->tensor && !strcmp(s->rows[j].wfmt, r->wfmt) && !strcmp(s->rows[j].afmt, r->afmt)) {
        c->combo_first = j;
        break;
      }
    summarize_one(s, c, idx, n, a, b, t);
  }
  qsort(s->cls, (size_t)s->ncls, sizeof *s->cls, cmp_class);
out:
  free(idx); free(a); free(b); free(t); free(done);
  return rc;
}
