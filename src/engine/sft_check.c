/* sft_check.c: one check of an sft pair (see sft.h): the points both logs
 * hold in the window, the coverage of each log (a missing metric or a gap
 * makes the check inconclusive), and the bounds:
 *   pointwise  |a - b| <= abs + rel |b| at every point;
 *   mean       |cummean(a - b)| <= abs + rel cummean(|b|), judged from the
 *              10th point on;
 *   noise      |a - b| <= k band, band = the spread (sample sd) of b and the
 *              noise logs at the step, root-mean-squared over the 11 points
 *              around it (a single sd can touch zero by chance);
 *   equivalence TOST on the mean difference: its 1 - 2 alpha interval from
 *              a seeded circular moving-block bootstrap inside [-delta,
 *              delta] passes, wholly outside deviates, else inconclusive;
 *              judged at the window's last point.
 * A non-finite value in either arm fails the check at its first point. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/qc.h"
#include "core/rng.h"
#include "engine/sft.h"

#define MEAN_MIN_POINTS 10
#define NOISE_HALF 5

/* k-th smallest of v[n] (v is reordered): Hoare's selection. */
static double select_k(double *v, int64_t n, int64_t k) {
  int64_t lo = 0, hi = n - 1;
  while (lo < hi) {
    double piv = v[lo + (hi - lo) / 2];
    int64_t i = lo, j = hi;
    while (i <= j) {
      while (v[i] < piv) i++;
      while (v[j] > piv) j--;
      if (i <= j) { double t = v[i]; v[i] = v[j]; v[j] = t; i++; j--; }
    }
    if (k <= j) hi = j;
    else if (k >= i) lo = i;
    else return v[k];
  }
  return v[k];
}

/* The usual interval between consecutive x at which a log holds a metric
 * (the median step), 0 when fewer than two points. */
static double qc_sft_interval(const double *x, int64_t n) {
  if (n < 2) return 0;
  double d0 = x[1] - x[0], mn = d0, mx = d0;
  for (int64_t i = 2; i < n; i++) {
    double d = x[i] - x[i - 1];
    if (d < mn) mn = d;
    if (d > mx) mx = d;
  }
  if (mn == mx) return mn; /* a regular log: every interval the same */
  double *d = malloc((size_t)(n - 1) * sizeof *d);
  if (!d) return mx; /* out of memory: the largest interval hides no gap */
  for (int64_t i = 1; i < n; i++) d[i - 1] = x[i] - x[i - 1];
  double m = select_k(d, n - 1, (n - 1) / 2);
  free(d);
  return m;
}

int qc_sft_bootstrap(const double *d, int64_t n, int block, int B, uint64_t seed, double alpha, double *lo, double *hi) {
  if (n < 2 || block < 1 || B < 2) return qc_err("bootstrap: %lld points, block %d, %d resamples: too few", (long long)n, block, B);
  if (block > n) block = (int)n;
  double *P = malloc((size_t)(n + 1) * sizeof *P), *m = malloc((size_t)B * sizeof *m);
  if (!P || !m) { free(P); free(m); return qc_err_sys("out of memory in the bootstrap"); }
  P[0] = 0;
  for (int64_t i = 0; i < n; i++) P[i + 1] = P[i] + d[i];
  qc_rng g;
  qc_rng_seed(&g, seed);
  for (int b = 0; b < B; b++) {
    double s = 0;
    for (int64_t left = n; left > 0;) {
      /* a uniform start in [0, n): the high word of a 64 x 64-bit product (no division) */
      int64_t st = (int64_t)(((unsigned __int128)qc_rng_u64(&g) * (uint64_t)n) >> 64), len = left < block ? left : block;
      s += st + len <= n ? P[st + len] - P[st] : (P[n] - P[st]) + P[st + len - n]; /* circular */
      left -= len;
    }
    m[b] = s / (double)n;
  }
  /* percentiles by linear interpolation between order statistics */
  double ql = alpha * (B - 1), qh = (1 - alpha) * (B - 1);
  int64_t il = (int64_t)floor(ql), ih = (int64_t)floor(qh);
  double vl0 = select_k(m, B, il), vl1 = il + 1 < B ? select_k(m, B, il + 1) : vl0;
  double vh0 = select_k(m, B, ih), vh1 = ih + 1 < B ? select_k(m, B, ih + 1) : vh0;
  *lo = vl0 + (ql - (double)il) * (vl1 - vl0);
  *hi = vh0 + (qh - (double)ih) * (vh1 - vh0);
  free(P);
  free(m);
  return QC_OK;
}

int qc_sft_onset(const double *x, const double *d, int64_t m, int64_t *k, char kind[8]) {
  *k = m > 0 ? m - 1 : 0;
  snprintf(kind, 8, "none");
  if (m < 4) return QC_OK;
  /* suffix sums on a centred, scaled x (tokens reach 1e12: no
   * cancellation in the squares) and a centred d */
  double *sx = malloc((size_t)(m + 1) * 4 * sizeof *sx);
  if (!sx) return qc_err_sys("out of memory estimating an onset");
  double *sxx = sx + (m + 1), *sxd = sxx + (m + 1), *sd = sxd + (m + 1);
  double x0 = x[0], xs = x[m - 1] - x[0] > 0 ? x[m - 1] - x[0] : 1, dm = 0, sdd = 0;
  for (int64_t i = 0; i < m; i++) dm += d[i];
  dm /= (double)m;
  sx[m] = sxx[m] = sxd[m] = sd[m] = 0;
  for (int64_t i = m - 1; i >= 0; i--) {
    double u = (x[i] - x0) / xs, e = d[i] - dm;
    sx[i] = sx[i + 1] + u;
    sxx[i] = sxx[i + 1] + u * u;
    sxd[i] = sxd[i + 1] + u * e;
    sd[i] = sd[i + 1] + e;
    sdd += e * e;
  }
  double sse0 = sdd, best = sse0, n = (double)m;
  int64_t bk = -1;
  int drift = 0;
  for (int64_t j = 0; j + 2 < m; j++) { /* drift: flat to x[j], a ramp after (at least 2 points on it) */
    double t = (x[j] - x0) / xs, c = (double)(m - 1 - j);
    double S1 = sx[j + 1] - c * t, S2 = sxx[j + 1] - 2 * t * sx[j + 1] + c * t * t, Shd = sxd[j + 1] - t * sd[j + 1];
    double vh = S2 - S1 * S1 / n, cov = Shd; /* sum of e is 0: the centred covariance is Shd */
    if (!(vh > 0)) continue;
    double sse = sdd - cov * cov / vh;
    if (sse < best) { best = sse; bk = j; drift = 1; }
  }
  for (int64_t j = 1; j < m; j++) { /* shift: a level before x[j], another from it */
    double a = (double)j, b = (double)(m - j), s2 = sd[j]; /* sum after; before is -s2 */
    double sse = sdd - s2 * s2 / a - s2 * s2 / b;
    if (sse < best) { best = sse; bk = j; drift = 0; }
  }
  free(sx);
  if (bk < 0) return QC_OK;
  int keep = best <= 0 ? sse0 > 0 : n * log(sse0 / best) > 3 * log(n);
  if (!keep) return QC_OK;
  *k = bk;
  snprintf(kind, 8, "%s", drift ? "drift" : "shift");
  return QC_OK;
}

/* The x of row i of a log: its step, or its tokens (NAN when absent). */
static double row_x(const qc_l3_log *l, int xc, int64_t i) {
  if (xc < 0) return (double)l->step[i];
  return l->col[xc].has[i] ? l->col[xc].v[i] : NAN;
}

/* The longest stretch without a point that log points x[n] (ascending)
 * may have over [w0, w1] before it is a gap, and the rule in words (rule,
 * for messages): the case's max_gap when declared; for a regular log (one
 * interval, the median, at least half of all) twice that interval; for an
 * irregular one (logged at 18, 47, 62, 63, ...) the larger of twice its
 * mean interval and a tenth of the window, so a log at scattered steps is
 * a gap only where the window really lacks data. 0 when n < 2. */
static double gap_limit(const qc_sft_case *cs, const double *x, int64_t n, double w0, double w1, char *rule, size_t rn) {
  if (cs->has_max_gap) {
    snprintf(rule, rn, "the case's max_gap %g", cs->max_gap);
    return cs->max_gap;
  }
  double I = qc_sft_interval(x, n);
  if (I <= 0) return 0;
  int64_t same = 0;
  for (int64_t i = 1; i < n; i++) same += x[i] - x[i - 1] == I;
  if (2 * same >= n - 1) {
    snprintf(rule, rn, "usual interval %g", I);
    return 2 * I;
  }
  double mean = (x[n - 1] - x[0]) / (double)(n - 1), lim = fmax(2 * mean, (w1 - w0) / 10);
  snprintf(rule, rn, "an irregular log: limit %g, the larger of twice its mean interval %.4g and a tenth of the window", lim, mean);
  return lim;
}

/* Does log l hold metric column c over [w0, w1]: present, and without a
 * stretch longer than gap_limit allows? 0 yes; 1 no, why set. */
static int coverage(const qc_sft_case *cs, const qc_l3_log *l, int c, int xc, double w0, double w1, const char *metric,
                    const char *xname, char *why, size_t wn) {
  int64_t n = 0, in0 = -1, in1 = -1;
  double *x = malloc((size_t)(l->n ? l->n : 1) * sizeof *x);
  if (!x) { snprintf(why, wn, "out of memory"); return 1; }
  for (int64_t i = 0; i < l->n; i++) {
    double xi = row_x(l, xc, i);
    if (!l->col[c].has[i] || isnan(xi)) continue;
    if (xi >= w0 && xi <= w1) { if (in0 < 0) in0 = n; in1 = n; }
    x[n++] = xi;
  }
  int bad = 0;
  if (in0 < 0) {
    snprintf(why, wn, "log '%s' has no '%s' in the window [%g, %g]", l->path, metric, w0, w1);
    bad = 1;
  } else {
    char I[200];
    double lim = gap_limit(cs, x, n, w0, w1, I, sizeof I);
    if (lim <= 0 && w1 > w0) {
      snprintf(why, wn, "log '%s' holds '%s' at a single %s: no usual interval to judge the window's coverage", l->path, metric, xname);
      bad = 1;
    } else if (x[in0] - w0 > lim) {
      snprintf(why, wn, "log '%s' has a gap in '%s': none from %s %.15g (the window's start) to %.15g (%s)", l->path, metric,
               xname, w0, x[in0], I);
      bad = 1;
    } else if (w1 - x[in1] > lim) {
      snprintf(why, wn, "log '%s' has a gap in '%s': none from %s %.15g to %.15g (the window's end; %s)", l->path, metric,
               xname, x[in1], w1, I);
      bad = 1;
    } else {
      for (int64_t i = in0 + 1; i <= in1 && !bad; i++)
        if (x[i] - x[i - 1] > lim) {
          snprintf(why, wn, "log '%s' has a gap in '%s': none from %s %.15g to %.15g (%s)", l->path, metric, xname,
                   x[i - 1], x[i], I);
          bad = 1;
        }
    }
  }
  free(x);
  return bad;
}

/* Where a point lies, for messages: "step 490", or "tokens 1003520 (step
 * 490)" on a tokens axis (exact digits, never 1.00352e+06). Returns buf. */
static const char *at_x(const qc_sft_case *cs, double x, int64_t step, char *buf, size_t n) {
  if (cs->x_tokens) snprintf(buf, n, "tokens %.15g (step %lld)", x, (long long)step);
  else snprintf(buf, n, "step %lld", (long long)step);
  return buf;
}

/* Append "; text" (or text) to why, unless why holds it already (two arms
 * reading the same file have the same gap: said once). */
static void add_why(char *why, size_t n, const char *text) {
  if (strstr(why, text)) return;
  size_t k = strlen(why);
  int w = snprintf(why + k, n - k, "%s%s", k ? "; " : "", text);
  if (w >= 0 && (size_t)w >= n - k) qc_sft_clip_words(why, n);
}

void qc_sft_clip_words(char *s, size_t n) {
  size_t len = strlen(s);
  if (n < 16 || len + 1 < n) return;
  size_t cut = n - 5; /* room for " ..." */
  while (cut > n / 2 && s[cut] != ' ') cut--;
  if (cut <= n / 2) cut = n - 5;
  while (cut > 0 && (s[cut - 1] == ' ' || s[cut - 1] == ';' || s[cut - 1] == ',')) cut--;
  snprintf(s + cut, n - cut, " ...");
}

typedef struct {
  int64_t i;          /* point index of the first failure (-1: none) */
  const char *bound;
  char why[256];
} fail_at;

static void note_fail(fail_at *f, int64_t i, const char *bound, const char *why) {
  if (f->i >= 0 && f->i <= i) return; /* an earlier (or equally early, earlier-listed) bound failed first */
  f->i = i;
  f->bound = bound;
  snprintf(f->why, sizeof f->why, "%s", why);
}

int qc_sft_judge_check(const qc_sft_case *cs, const qc_sft_check *k, const qc_l3_log *la, const qc_l3_log *lb, const qc_l3_log *noise,
                 int keep_series, qc_sft_check_res *r) {
  const qc_sft_bounds *b = &k->b;
  double w0 = k->has_window ? k->w0 : cs->w0, w1 = k->has_window ? k->w1 : cs->w1;
  const char *xname = cs->x_tokens ? "tokens" : "step";
  int ca = qc_l3_log_col(la, k->metric), cb = qc_l3_log_col(lb, k->metric), rc = QC_OK;
  int xa = cs->x_tokens ? qc_l3_log_col(la, "tokens") : -1, xb = cs->x_tokens ? qc_l3_log_col(lb, "tokens") : -1;
  char why[600];
  memset(r, 0, sizeof *r);
  r->verdict = QC_L3_PASS;
  r->mean_diff = r->max_abs = r->max_rel = r->cum_mean_end = NAN;
  if (ca < 0 || cb < 0) {
    snprintf(r->why, sizeof r->why, "log '%s' has no metric '%s'", (ca < 0 ? la : lb)->path, k->metric);
    r->verdict = QC_L3_INCONCLUSIVE;
    return QC_OK;
  }
  if (cs->x_tokens && (xa < 0 || xb < 0)) {
    snprintf(r->why, sizeof r->why, "log '%s' has no 'tokens': the x axis of this case", (xa < 0 ? la : lb)->path);
    r->verdict = QC_L3_INCONCLUSIVE;
    return QC_OK;
  }
  int incon = 0;
  if (coverage(cs, la, ca, xa, w0, w1, k->metric, xname, why, sizeof why)) { add_why(r->why, sizeof r->why, why); incon = 1; }
  if (coverage(cs, lb, cb, xb, w0, w1, k->metric, xname, why, sizeof why)) { add_why(r->why, sizeof r->why, why); incon = 1; }
  /* the aligned points: steps both logs hold the metric at, inside the window */
  int64_t cap = la->n < lb->n ? la->n : lb->n, n = 0;
  double *X = malloc((size_t)(cap ? cap : 1) * sizeof *X), *A = malloc((size_t)(cap ? cap : 1) * sizeof *A);
  double *Bv = malloc((size_t)(cap ? cap : 1) * sizeof *Bv), *D = NULL, *band = NULL;
  int64_t *S = malloc((size_t)(cap ? cap : 1) * sizeof *S);
  if (!X || !A || !Bv || !S) { rc = qc_err_sys("out of memory judging '%s'", k->metric); goto done; }
  for (int64_t i = 0, j = 0; i < la->n && j < lb->n;) {
    if (la->step[i] < lb->step[j]) { i++; continue; }
    if (la->step[i] > lb->step[j]) { j++; continue; }
    double x = row_x(lb, xb, j);
    if (la->col[ca].has[i] && lb->col[cb].has[j] && !isnan(row_x(la, xa, i)) && !isnan(x) && x >= w0 && x <= w1) {
      X[n] = x;
      S[n] = la->step[i];
      A[n] = la->col[ca].v[i];
      Bv[n] = lb->col[cb].v[j];
      n++;
    }
    i++;
    j++;
  }
  r->npoints = n;
  if (n == 0) {
    if (!r->why[0]) snprintf(r->why, sizeof r->why, "no %s in [%g, %g] holds '%s' in both logs", xname, w0, w1, k->metric);
    r->verdict = QC_L3_INCONCLUSIVE;
    goto done;
  }
  /* the noise band at each point */
  if (b->has_noise) {
    double *s = malloc((size_t)n * sizeof *s);
    band = malloc((size_t)n * sizeof *band);
    if (!s || !band) { free(s); rc = qc_err_sys("out of memory judging '%s'", k->metric); goto done; }
    int missing = 0;
    for (int q = 0; q < b->nnoise && !missing; q++) {
      int cn = qc_l3_log_col(&noise[q], k->metric);
      for (int64_t i = 0, j = 0; i < n && !missing; i++) {
        while (j < noise[q].n && noise[q].step[j] < S[i]) j++;
        if (cn < 0 || j >= noise[q].n || noise[q].step[j] != S[i] || !noise[q].col[cn].has[j]) {
          snprintf(why, sizeof why, "noise log '%s' has no '%s' at step %lld", noise[q].path, k->metric, (long long)S[i]);
          add_why(r->why, sizeof r->why, why);
          missing = 1;
        }
      }
    }
    if (missing) incon = 1;
    for (int64_t i = 0; i < n; i++) {
      /* sample sd of b and the noise logs at this step */
      double sum = Bv[i], sq = 0, v[65];
      int m = 1;
      v[0] = Bv[i];
      for (int q = 0; q < b->nnoise && !missing; q++) {
        int cn = qc_l3_log_col(&noise[q], k->metric);
        int64_t lo = 0, hi = noise[q].n - 1;
        while (lo < hi) { int64_t mid = (lo + hi) / 2; if (noise[q].step[mid] < S[i]) lo = mid + 1; else hi = mid; }
        v[m] = noise[q].col[cn].v[lo];
        sum += v[m++];
      }
      double mean = sum / m;
      for (int q = 0; q < m; q++) sq += (v[q] - mean) * (v[q] - mean);
      s[i] = m > 1 ? sq / (m - 1) : NAN; /* a variance, smoothed below */
    }
    for (int64_t i = 0; i < n; i++) {
      int64_t a0 = i >= NOISE_HALF ? i - NOISE_HALF : 0, a1 = i + NOISE_HALF < n ? i + NOISE_HALF : n - 1;
      double acc = 0;
      for (int64_t q = a0; q <= a1; q++) acc += s[q];
      band[i] = sqrt(acc / (double)(a1 - a0 + 1));
    }
    free(s);
  }
  /* the bounds, point by point */
  fail_at f = {.i = -1};
  char xs[96];
  double sd = 0, sb = 0, mx = 0, mr = 0;
  for (int64_t i = 0; i < n; i++) {
    double a = A[i], bb = Bv[i], d = a - bb, ad = fabs(d);
    if (!isfinite(a) || !isfinite(bb)) {
      r->nonfinite++;
      snprintf(why, sizeof why, "a non-finite value at %s (%s %g, %s %g)", at_x(cs, X[i], S[i], xs, sizeof xs), "a", a, "b", bb);
      note_fail(&f, i, "nonfinite", why);
      continue;
    }
    if (ad > mx) mx = ad;
    if (bb != 0 && ad / fabs(bb) > mr) mr = ad / fabs(bb);
    if ((b->has_pw_abs || b->has_pw_rel) && f.i < 0) {
      double lim = (b->has_pw_abs ? b->pw_abs : 0) + (b->has_pw_rel ? b->pw_rel : 0) * fabs(bb);
      if (!(ad <= lim)) {
        snprintf(why, sizeof why, "|a - b| = %.4g > %.4g at %s", ad, lim, at_x(cs, X[i], S[i], xs, sizeof xs));
        note_fail(&f, i, b->has_pw_rel ? "pointwise_rel" : "pointwise_abs", why);
      }
    }
    sd += d;
    sb += fabs(bb);
    if ((b->has_mean_abs || b->has_mean_rel) && i + 1 >= MEAN_MIN_POINTS && f.i < 0) {
      double m = sd / (double)(i + 1), lim = (b->has_mean_abs ? b->mean_abs : 0) + (b->has_mean_rel ? b->mean_rel : 0) * sb / (double)(i + 1);
      if (!(fabs(m) <= lim)) {
        snprintf(why, sizeof why, "cumulative mean of a - b = %.4g, beyond %.4g at %s", m, lim, at_x(cs, X[i], S[i], xs, sizeof xs));
        note_fail(&f, i, b->has_mean_rel ? "mean_rel" : "mean_abs", why);
      }
    }
    if (b->has_noise && band && f.i < 0 && isfinite(band[i]) && !(ad <= b->noise_multiple * band[i])) {
      snprintf(why, sizeof why, "|a - b| = %.4g > %g x noise band %.4g at %s", ad, b->noise_multiple, band[i], at_x(cs, X[i], S[i], xs, sizeof xs));
      note_fail(&f, i, "noise_multiple", why);
    }
  }
  r->mean_diff = sd / (double)n;
  r->cum_mean_end = r->mean_diff;
  r->max_abs = mx;
  r->max_rel = mr;
  if ((b->has_mean_abs || b->has_mean_rel) && n < MEAN_MIN_POINTS && f.i < 0) {
    snprintf(why, sizeof why, "%lld point(s): the cumulative mean is judged from %d on", (long long)n, MEAN_MIN_POINTS);
    add_why(r->why, sizeof r->why, why);
    incon = 1;
  }
  if (b->has_equiv && r->nonfinite == 0) {
    if (n < 2) {
      add_why(r->why, sizeof r->why, "equivalence needs at least 2 points");
      incon = 1;
    } else {
      if (!(D = malloc((size_t)n * sizeof *D))) { rc = qc_err_sys("out of memory judging '%s'", k->metric); goto done; }
      for (int64_t i = 0; i < n; i++) D[i] = A[i] - Bv[i];
      int blk = b->eq_block ? b->eq_block : (int)fmax(1, round(cbrt((double)n)));
      if ((rc = qc_sft_bootstrap(D, n, blk, b->eq_resamples, b->eq_seed, b->eq_alpha, &r->eq_lo, &r->eq_hi))) goto done;
      r->has_equiv = 1;
      r->eq_mean = r->mean_diff;
      r->eq_block = blk;
      if (r->eq_lo > b->eq_delta || r->eq_hi < -b->eq_delta) {
        snprintf(why, sizeof why, "the %.0f%% interval of the mean difference [%.4g, %.4g] lies outside [-%g, %g]",
                 100 * (1 - 2 * b->eq_alpha), r->eq_lo, r->eq_hi, b->eq_delta, b->eq_delta);
        note_fail(&f, n - 1, "equivalence", why);
      } else if (!(r->eq_lo >= -b->eq_delta && r->eq_hi <= b->eq_delta)) {
        snprintf(why, sizeof why, "equivalence not shown: the %.0f%% interval [%.4g, %.4g] crosses +-%g",
                 100 * (1 - 2 * b->eq_alpha), r->eq_lo, r->eq_hi, b->eq_delta);
        add_why(r->why, sizeof r->why, why);
        incon = 1;
      }
    }
  }
  if (f.i >= 0) {
    r->verdict = QC_L3_FAIL;
    r->has_fail = 1;
    r->fail_x = X[f.i];
    r->fail_step = S[f.i];
    /* the onset: a change point of a - b up to the failure (finite points
     * only), relative to |b| when the failed bound is relative */
    int64_t ok = 0, on = f.i;
    int rel = strstr(f.bound, "_rel") != NULL;
    snprintf(r->onset_kind, sizeof r->onset_kind, "none");
    while (ok <= f.i && isfinite(A[ok]) && isfinite(Bv[ok]) && (!rel || Bv[ok] != 0)) ok++;
    if (ok > f.i) {
      if (!D && !(D = malloc((size_t)n * sizeof *D))) { rc = qc_err_sys("out of memory judging '%s'", k->metric); goto done; }
      for (int64_t i = 0; i <= f.i; i++) D[i] = rel ? (A[i] - Bv[i]) / fabs(Bv[i]) : A[i] - Bv[i];
      if ((rc = qc_sft_onset(X, D, f.i + 1, &on, r->onset_kind))) goto done;
    }
    r->has_onset = 1;
    r->onset_x = X[on];
    r->onset_step = S[on];
    snprintf(r->bound, sizeof r->bound, "%s", f.bound);
    char rest[512];
    snprintf(rest, sizeof rest, "%s", r->why);
    int w = snprintf(r->why, sizeof r->why, "%s%s%s", f.why, rest[0] ? "; also: " : "", rest);
    if (w >= (int)sizeof r->why) qc_sft_clip_words(r->why, sizeof r->why);
  } else if (incon) r->verdict = QC_L3_INCONCLUSIVE;
  if (keep_series) {
    r->lo = malloc((size_t)n * sizeof *r->lo);
    r->hi = malloc((size_t)n * sizeof *r->hi);
    r->cum = malloc((size_t)n * sizeof *r->cum);
    if (!r->lo || !r->hi || !r->cum) { rc = qc_err_sys("out of memory keeping the series of '%s'", k->metric); goto done; }
    double acc = 0;
    for (int64_t i = 0; i < n; i++) {
      double lim = NAN;
      if (b->has_pw_abs || b->has_pw_rel) lim = (b->has_pw_abs ? b->pw_abs : 0) + (b->has_pw_rel ? b->pw_rel : 0) * fabs(Bv[i]);
      else if (b->has_noise && band) lim = b->noise_multiple * band[i];
      r->lo[i] = Bv[i] - lim;
      r->hi[i] = Bv[i] + lim;
      acc += A[i] - Bv[i];
      r->cum[i] = acc / (double)(i + 1);
    }
    r->x = X; r->a = A; r->b = Bv; r->st = S;
    X = A = Bv = NULL;
    S = NULL;
  }
done:
  free(X); free(A); free(Bv); free(S); free(D); free(band);
  return rc;
}
