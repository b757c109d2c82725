/* test_ozplan.c: the fast reference's pair plan (backend/ozplan.h) from
 * evidence made here as the device makes it (kernels/ozaki.cu: each row
 * scaled by its power of two, cut into int8 digits to nearest; every
 * pair's integer product; the exact value): an operand whose values fit in
 * one digit takes fewer pairs, a full-precision one keeps enough to stay
 * under a quarter of the gate, two slices of float64 data meet no plan, a
 * NaN refuses every plan, a zero row costs nothing. */
#include <criterion/criterion.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "backend/ozplan.h"
#include "core/rng.h"

/* The digits of row v [k] as qk_oz_split cuts them (to nearest, the scale
 * twice the power of two above the row's maximum): d[t * k + l], t < S; *e
 * the row's exponent. */
static void split(const double *v, int64_t k, int S, int *d, int *e) {
  int ex = INT32_MIN, x;
  for (int64_t l = 0; l < k; l++)
    if (v[l] != 0) {
      frexp(v[l], &x);
      if (x > ex) ex = x;
    }
  if (ex != INT32_MIN) ex++;
  *e = ex;
  for (int64_t l = 0; l < k; l++) {
    double y = ex == INT32_MIN ? 0.0 : scalbn(v[l], 7 - ex);
    for (int t = 0; t < S; t++) {
      double q = rint(y);
      d[t * k + l] = (int)q;
      y = (y - q) * 128.0;
    }
  }
}

/* v rounded to bf16 (nearest even). */
static double bf16(double v) {
  float f = (float)v, r;
  uint32_t u;
  memcpy(&u, &f, sizeof u);
  u = (u + 0x7fffu + ((u >> 16) & 1u)) & 0xffff0000u;
  memcpy(&r, &u, sizeof r);
  return r;
}

/* One sampled element's evidence for rows a, b [k] with S slices (ozplan.h's layout). */
static void evidence(const double *a, const double *b, int64_t k, int S, double *w) {
  int *da = malloc((size_t)(S * k) * sizeof *da), *db = malloc((size_t)(S * k) * sizeof *db), ea, eb;
  cr_assert(da && db);
  split(a, k, S, da, &ea);
  split(b, k, S, db, &eb);
  for (int i = 0; i < QC_OZPLAN_W; i++) w[i] = 0;
  for (int t = 0; t < S; t++)
    for (int u = 0; u < S; u++) {
      long long p = 0;
      for (int64_t l = 0; l < k; l++) p += (long long)da[t * k + l] * db[u * k + l];
      w[t * QC_OZPLAN_SMAX + u] = (double)p;
    }
  long double ex = 0;
  double sc = 0;
  for (int64_t l = 0; l < k; l++) {
    ex += (long double)a[l] * (long double)b[l]; /* 64-bit mantissa: exact enough for the test's gate */
    sc += fabs(a[l] * b[l]);
  }
  double *x = w + QC_OZPLAN_SMAX * QC_OZPLAN_SMAX;
  x[0] = (double)ex;
  x[1] = (double)(ex - (long double)x[0]);
  x[2] = sc;
  x[3] = ea == INT32_MIN || eb == INT32_MIN ? QC_OZPLAN_ZERO : (double)(ea + eb);
  const double rb = bf16(x[0] + x[1]) - (x[0] + x[1]);
  x[4] = rb * rb;
  free(da);
  free(db);
}

/* ns samples of rows of length k: a from fa, b from fb (kind 0: float64
 * normal, 1: bf16 normal, 2: integers in [-100, 100] times 2^-3). */
static double *samples(int ns, int64_t k, int S, int ka, int kb, uint64_t seed) {
  double *w = malloc((size_t)ns * QC_OZPLAN_W * sizeof *w), *a = malloc((size_t)k * sizeof *a), *b = malloc((size_t)k * sizeof *b);
  cr_assert(w && a && b);
  qc_rng r;
  qc_rng_seed(&r, seed);
  for (int s = 0; s < ns; s++) {
    for (int pass = 0; pass < 2; pass++) {
      double *v = pass ? b : a;
      const int kind = pass ? kb : ka;
      for (int64_t l = 0; l < k; l++) {
        double g = qc_rng_normal(&r);
        if (kind == 1) g = bf16(g);
        if (kind == 2) g = ldexp(round(fmax(-100, fmin(100, 30 * g))), -3);
        v[l] = g;
      }
    }
    evidence(a, b, k, S, w + (size_t)s * QC_OZPLAN_W);
  }
  free(a);
  free(b);
  return w;
}

/* Plan (Sa, Sb, L)'s self-check on the evidence, written out here: the
 * approximation sum over the plan's pairs of P_tu 2^(E - 7 (t + u)) in long
 * double against the exact value. */
static void predicted(const double *w, int ns, int Sa, int Sb, int L, double *err, double *err_norm) {
  double mx = 0, ss = 0, ex2 = 0;
  for (int s = 0; s < ns; s++) {
    const double *p = w + (size_t)s * QC_OZPLAN_W, *x = p + QC_OZPLAN_SMAX * QC_OZPLAN_SMAX;
    long double v = 0;
    for (int t = 1; t <= Sa; t++)
      for (int u = 1; u <= Sb; u++)
        if (t + u <= L && x[3] != QC_OZPLAN_ZERO) v += ldexpl((long double)p[(t - 1) * QC_OZPLAN_SMAX + u - 1], (int)x[3] - 7 * (t + u));
    const double d = (double)fabsl(v - ((long double)x[0] + (long double)x[1]));
    mx = fmax(mx, d == 0 ? 0 : d / x[2]);
    ss += d * d;
    ex2 += (x[0] + x[1]) * (x[0] + x[1]);
  }
  *err = mx;
  *err_norm = sqrt(ss) / sqrt(ex2);
}

/* The fraction of samples whose plan (Sa, Sb, L) value lies towards zero
 * from the exact one (a shrink), of those with an error. */
static double shrink_fraction(const double *w, int ns, int Sa, int Sb, int L) {
  int n = 0, in = 0;
  for (int s = 0; s < ns; s++) {
    const double *p = w + (size_t)s * QC_OZPLAN_W, *x = p + QC_OZPLAN_SMAX * QC_OZPLAN_SMAX;
    long double v = 0, ex = (long double)x[0] + (long double)x[1];
    for (int t = 1; t <= Sa; t++)
      for (int u = 1; u <= Sb; u++)
        if (t + u <= L) v += ldexpl((long double)p[(t - 1) * QC_OZPLAN_SMAX + u - 1], (int)x[3] - 7 * (t + u));
    if (v == ex) continue;
    n++;
    in += fabsl(v) < fabsl(ex) && (v >= 0) == (ex >= 0);
  }
  return n ? (double)in / n : 0.5;
}

Test(ozplan, pairs_counted) {
  cr_expect_eq(qc_ozplan_pairs(4, 4, 5), 10);
  cr_expect_eq(qc_ozplan_pairs(3, 3, 4), 6);
  cr_expect_eq(qc_ozplan_pairs(4, 2, 5), 7);
  cr_expect_eq(qc_ozplan_pairs(1, 4, 5), 4);
}

Test(ozplan, one_digit_operand_takes_fewer_pairs) {
  const int ns = 64, S = 4;
  double *w = samples(ns, 512, S, 0, 2, 7); /* b: integers times 2^-3, exact in one or two digits */
  qc_ozplan p;
  qc_ozplan_choose(w, ns, S, &p);
  cr_expect(p.L > 0, "a plan");
  cr_expect(p.Sb <= 2, "op(B)'s digits beyond the second are zero: Sb %d", p.Sb);
  cr_expect(p.pairs < 10, "fewer than the full scheme's 10 pairs: %d (%d x %d, L %d)", p.pairs, p.Sa, p.Sb, p.L);
  cr_expect(p.err <= QC_OZPLAN_MARGIN * p.gate && p.err_norm <= QC_OZPLAN_MARGIN * p.gate, "%.3g %.3g against %.3g", p.err,
            p.err_norm, p.gate);
  free(w);
}

Test(ozplan, full_precision_stays_under_the_margin) {
  const int ns = 64, S = 4;
  double *w = samples(ns, 1024, S, 0, 0, 11);
  qc_ozplan p, p2;
  qc_ozplan_choose(w, ns, S, &p);
  qc_ozplan_choose(w, ns, S, &p2);
  cr_expect(p.L > 0 && p.pairs <= 10, "a plan of at most 10 pairs: %d", p.pairs);
  cr_expect(p.err <= QC_OZPLAN_MARGIN * p.gate && p.err_norm <= QC_OZPLAN_MARGIN * p.gate, "%.3g %.3g against %.3g", p.err,
            p.err_norm, p.gate);
  cr_expect(p.Sa == p2.Sa && p.Sb == p2.Sb && p.L == p2.L, "the same plan twice");
  /* digits to nearest: a short plan's error has either sign (truncated digits shrink nearly every element) */
  const double f = shrink_fraction(w, ns, 3, 3, 4);
  cr_expect(f > 0.2 && f < 0.8, "3 slices shrink %.0f%% of the sampled elements towards zero", 100 * f);
  double e, en;
  predicted(w, ns, p.Sa, p.Sb, p.L, &e, &en);
  cr_expect(fabs(e - p.err) <= 1e-6 * p.err + 1e-300 && fabs(en - p.err_norm) <= 1e-6 * p.err_norm + 1e-300,
            "the module's prediction %.6g %.6g, the test's %.6g %.6g", p.err, p.err_norm, e, en);
  /* every plan of fewer pairs misses the margin (the test's own prediction): the chosen one is the fewest */
  for (int Sa = 1; Sa <= S; Sa++)
    for (int Sb = 1; Sb <= S; Sb++)
      for (int L = 2; L <= S + 1 && L <= Sa + Sb; L++) {
        if (qc_ozplan_pairs(Sa, Sb, L) >= p.pairs) continue;
        double e, en;
        predicted(w, ns, Sa, Sb, L, &e, &en);
        cr_expect(e > QC_OZPLAN_MARGIN * p.gate || en > QC_OZPLAN_MARGIN * p.gate,
                  "plan %d x %d L %d has fewer pairs and errors %.3g %.3g within the margin of %.3g", Sa, Sb, L, e, en, p.gate);
      }
  free(w);
}

Test(ozplan, two_slices_of_float64_meet_no_plan) {
  const int ns = 64;
  double *w = samples(ns, 1024, 2, 0, 0, 13);
  qc_ozplan p;
  qc_ozplan_choose(w, ns, 2, &p);
  cr_expect_eq(p.L, 0, "no plan of 2 slices meets the gate: plan %d x %d L %d, error %.3g gate %.3g", p.Sa, p.Sb, p.L, p.err, p.gate);
  cr_expect(p.err > p.gate || p.err_norm > p.gate, "the full plan's error %.3g / %.3g is above the gate %.3g", p.err, p.err_norm, p.gate);
  cr_expect_eq(p.pairs, 3);
  free(w);
}

Test(ozplan, nan_refuses_every_plan) {
  const int ns = 8, S = 4;
  double *w = samples(ns, 64, S, 0, 0, 17);
  w[3 * QC_OZPLAN_W + QC_OZPLAN_SMAX * QC_OZPLAN_SMAX] = NAN; /* a sample's exact value */
  qc_ozplan p;
  qc_ozplan_choose(w, ns, S, &p);
  cr_expect_eq(p.L, 0);
  free(w);
}

Test(ozplan, zero_rows_cost_nothing) {
  const int ns = 4, S = 4;
  double *w = calloc((size_t)ns * QC_OZPLAN_W, sizeof *w);
  cr_assert(w);
  for (int s = 0; s < ns; s++) w[s * QC_OZPLAN_W + QC_OZPLAN_SMAX * QC_OZPLAN_SMAX + 3] = QC_OZPLAN_ZERO;
  qc_ozplan p;
  qc_ozplan_choose(w, ns, S, &p);
  cr_expect(p.L > 0 && p.pairs == 1, "one pair for an all-zero sample: %d", p.pairs);
  cr_expect_eq(p.err, 0.0);
  free(w);
}
