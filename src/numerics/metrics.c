/* metrics.c: one float64 pass over (g, r) (see metrics.h). */
#include "numerics/metrics.h"

#include <stdlib.h>
#include <string.h>

#include "core/par.h"

#include <math.h>
#include <stdio.h>
#include <string.h>

void qc_metrics_finish(double ss_g, double ss_r, double ss_d, double dot, qc_metrics *m) {
  m->norm_g = sqrt(ss_g);
  m->norm_r = sqrt(ss_r);
  m->norm_diff = sqrt(ss_d);
  m->rel_l2 = m->norm_diff / fmax(m->norm_r, QC_EPS_NORM);
  m->norm_ratio = m->norm_r > 0 ? m->norm_g / m->norm_r : (m->norm_g > 0 ? INFINITY : NAN);
  if (m->norm_g > 0 && m->norm_r > 0) {
    /* near 1, <g,r>/(|g||r|) loses the digits that matter; from
     * |g-r|^2 = |g|^2 + |r|^2 - 2<g,r>:
     *   1 - cos = (|g-r|^2 - (|g| - |r|)^2) / (2 |g| |r|)
     * where |g-r|^2 was summed from exact differences. */
    double dn = m->norm_g - m->norm_r;
    double one_minus = (ss_d - dn * dn) / (2.0 * m->norm_g * m->norm_r);
    m->cosine = one_minus < 1e-3 ? 1.0 - fmax(one_minus, 0.0) : dot / (m->norm_g * m->norm_r);
    m->cosine_null = 0;
  } else {
    m->cosine = NAN;
    m->cosine_null = 1;
  }
  m->sqnr_db = ss_d > 0 ? 10.0 * log10(ss_r / ss_d) : INFINITY;
}

/* Sums of one contiguous run [i0, i1): four partial sums, combined at the
 * end (fewer rounding steps than one), the largest |g - r| at its lowest
 * index, non-finite counts. */
typedef struct mpart {
  double sg, sr, sd, dt, mx;
  int64_t worst, bad, rbad;
} mpart;

static mpart msum(const double *g, const double *r, int64_t i0, int64_t i1) {
  mpart q = {0, 0, 0, 0, -1, -1, 0, 0};
  for (int64_t i = i0; i < i1; i++) {
    double a = g[i], b = r[i];
    if (!isfinite(b)) { q.rbad++; continue; }
    if (!isfinite(a)) { q.bad++; continue; }
    double d = a - b;
    q.sg += a * a;
    q.sr += b * b;
    q.sd += d * d;
    q.dt += a * b;
    double ad = fabs(d);
    if (ad > q.mx) { q.mx = ad; q.worst = i; }
  }
  return q;
}

/* The metrics from the sums. */
static void mfinish(const mpart *t, qc_metrics *m) {
  memset(m, 0, sizeof *m);
  m->noise_multiple = NAN;
  m->noise_floor = NAN;
  m->nonfinite = t->bad;
  m->ref_nonfinite = t->rbad;
  m->max_abs = t->mx < 0 ? 0 : t->mx;
  m->worst = t->worst;
  qc_metrics_finish(t->sg, t->sr, t->sd, t->dt, m);
}

void qc_metrics_compute(const double *g, const double *r, int64_t n, qc_metrics *m) {
  mpart t = msum(g, r, 0, n);
  mfinish(&t, m);
}

/* ---- the same pass on qc_par_for's threads --------------------------------- */

#define QC_MCHUNK 65536

typedef struct mctx {
  const double *g, *r;
  int64_t n;
  mpart *p;
} mctx;

/* Chunks [lo, hi): each chunk's sums, as qc_metrics_compute forms them. */
static void mchunks(void *pv, int64_t lo, int64_t hi, int tid) {
  (void)tid;
  const mctx *x = pv;
  for (int64_t c = lo; c < hi; c++) {
    int64_t i0 = c * QC_MCHUNK, i1 = i0 + QC_MCHUNK < x->n ? i0 + QC_MCHUNK : x->n;
    x->p[c] = msum(x->g, x->r, i0, i1);
  }
}

void qc_metrics_compute_par(const double *g, const double *r, int64_t n, qc_metrics *m) {
  int64_t nc = (n + QC_MCHUNK - 1) / QC_MCHUNK;
  mpart *p = nc > 1 ? malloc((size_t)nc * sizeof *p) : NULL;
  if (!p) { qc_metrics_compute(g, r, n, m); return; }
  mctx x = {g, r, n, p};
  qc_par_for(nc, 1, mchunks, &x);
  mpart t = {0, 0, 0, 0, -1, -1, 0, 0};
  for (int64_t c = 0; c < nc; c++) { /* chunk order: the lowest index wins a tie */
    t.sg += p[c].sg; t.sr += p[c].sr; t.sd += p[c].sd; t.dt += p[c].dt;
    t.bad += p[c].bad; t.rbad += p[c].rbad;
    if (p[c].mx > t.mx) { t.mx = p[c].mx; t.worst = p[c].worst; }
  }
  free(p);
  mfinish(&t, m);
}
