/* metrics.c: one float64 pass over (g, r) and the verdict (see metrics.h). */
#include "model/metrics.h"

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

int qc_judge(const qc_metrics *m, const qc_tol *t, char *why, int whylen) {
  why[0] = 0;
  if (m->ref_nonfinite > 0) {
    snprintf(why, (size_t)whylen, "%lld non-finite value(s) in the reference", (long long)m->ref_nonfinite);
    return QC_V_FAIL;
  }
  if (m->nonfinite > 0) {
    snprintf(why, (size_t)whylen, "%lld non-finite value(s) in the candidate", (long long)m->nonfinite);
    return QC_V_FAIL;
  }
  /* a NaN metric never satisfies a bound: every test below is written so
   * that NaN falls on the failing side */
  if (t->has_rel_l2 && !(m->rel_l2 <= t->rel_l2)) {
    snprintf(why, (size_t)whylen, "rel_l2 %.3g > %.3g", m->rel_l2, t->rel_l2);
    return QC_V_FAIL;
  }
  if (t->has_max_abs && !(m->max_abs <= t->max_abs)) {
    snprintf(why, (size_t)whylen, "max_abs %.3g > %.3g", m->max_abs, t->max_abs);
    return QC_V_FAIL;
  }
  /* cosine is undefined when a norm is zero: then max_abs decides (spec);
   * with no max_abs declared, a zero against a non-zero fails */
  int one_zero = m->cosine_null && (m->norm_g > 0 || m->norm_r > 0);
  if (t->has_cosine_min && (one_zero ? !t->has_max_abs : (!m->cosine_null && !(m->cosine >= t->cosine_min)))) {
    if (one_zero)
      snprintf(why, (size_t)whylen, "cosine undefined (%s is zero, %s is not) and no max_abs declared",
               m->norm_g > 0 ? "reference" : "candidate", m->norm_g > 0 ? "candidate" : "reference");
    else
      snprintf(why, (size_t)whylen, "cosine %.9g < %.9g", m->cosine, t->cosine_min);
    return QC_V_FAIL;
  }
  /* the norm ratio of two zero tensors is 1; over a zero reference it is
   * undefined, and max_abs decides as for the cosine */
  int ratio_undef = m->norm_r == 0 && m->norm_g > 0;
  if (t->has_norm_ratio && !(m->norm_r == 0 && m->norm_g == 0) &&
      (ratio_undef ? !t->has_max_abs : !(m->norm_ratio >= t->norm_lo && m->norm_ratio <= t->norm_hi))) {
    snprintf(why, (size_t)whylen, "norm_ratio %.9g outside [%.9g, %.9g]", m->norm_ratio, t->norm_lo, t->norm_hi);
    return QC_V_FAIL;
  }
  if (t->has_noise_multiple && !(m->noise_multiple <= t->noise_multiple)) {
    snprintf(why, (size_t)whylen, "noise_multiple %.3g > %.3g", m->noise_multiple, t->noise_multiple);
    return QC_V_FAIL;
  }
  /* With a zero reference, only exact agreement (or a declared max_abs) passes:
   * cosine and norm ratio are undefined there and rel_l2 degenerates. */
  if (m->norm_r == 0 && !t->has_max_abs && m->max_abs != 0) {
    snprintf(why, (size_t)whylen, "reference is zero but candidate is not (max_abs %.3g) and no max_abs declared", m->max_abs);
    return QC_V_FAIL;
  }
  return QC_V_PASS;
}
