/* ozplan.c: the fast reference's pair plan from its sample (ozplan.h). */
#include "backend/ozplan.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "numerics/metrics.h"

int qc_ozplan_pairs(int Sa, int Sb, int L) {
  int n = 0;
  for (int t = 1; t <= Sa; t++)
    for (int u = 1; u <= Sb; u++) n += t + u <= L;
  return n;
}

/* The sample's pairs as values: v[s * SMAX^2 + (t - 1) SMAX + u - 1] = P_tu
 * 2^(E - 7 (t + u)) (exact: an integer times a power of two; 0 for a zero
 * row or column), computed once, so that each plan is only additions. */
static void pair_values(const double *smp, int ns, int S, double *v) {
  for (int s = 0; s < ns; s++) {
    const double *p = smp + (size_t)s * QC_OZPLAN_W, E = p[QC_OZPLAN_SMAX * QC_OZPLAN_SMAX + 3];
    double *o = v + (size_t)s * QC_OZPLAN_SMAX * QC_OZPLAN_SMAX;
    for (int t = 1; t <= S; t++)
      for (int u = 1; u <= S; u++) {
        const int q = (t - 1) * QC_OZPLAN_SMAX + (u - 1);
        o[q] = E == QC_OZPLAN_ZERO ? 0.0 : ldexp(p[q], (int)E - 7 * (t + u));
      }
  }
}

/* Plan (Sa, Sb, L)'s predicted self-check on the sample (v: pair_values):
 * *err the max relative error, *sumsq the sum of squared errors; cut short
 * (*err infinite) once either is past lim (the relative one) or lim_ss. */
static void predict(const double *smp, const double *v, int ns, int Sa, int Sb, int L, double lim, double lim_ss, double *err,
                    double *sumsq) {
  double mx = 0, ss = 0;
  for (int s = 0; s < ns; s++) {
    const double *x = smp + (size_t)s * QC_OZPLAN_W + QC_OZPLAN_SMAX * QC_OZPLAN_SMAX;
    const double *o = v + (size_t)s * QC_OZPLAN_SMAX * QC_OZPLAN_SMAX;
    const double hi = x[0], lo = x[1], sc = x[2];
    double a = 0;
    for (int lv = 2; lv <= L; lv++) /* the pairs in decreasing weight */
      for (int t = lv - Sb > 1 ? lv - Sb : 1; t <= Sa && t < lv; t++) a += o[(t - 1) * QC_OZPLAN_SMAX + (lv - t - 1)];
    const double d = fabs((a - hi) - lo);
    const double r = d == 0 ? 0.0 : sc > 0 ? d / sc : INFINITY;
    mx = r == r && mx == mx ? fmax(mx, r) : NAN;
    ss += d * d;
    if (mx > lim || ss > lim_ss) {
      *err = INFINITY;
      *sumsq = ss;
      return;
    }
  }
  *err = mx;
  *sumsq = ss;
}

void qc_ozplan_choose(const double *smp, int ns, int S, qc_ozplan *out) {
  double ex2 = 0, rb2 = 0;
  for (int s = 0; s < ns; s++) {
    const double *x = smp + (size_t)s * QC_OZPLAN_W + QC_OZPLAN_SMAX * QC_OZPLAN_SMAX;
    const double e = x[0] + x[1];
    ex2 += e * e;
    rb2 += x[4];
  }
  const double nrm = fmax(sqrt(ex2), QC_EPS_NORM), gate = QC_OZPLAN_GATE * (sqrt(rb2) / nrm);
  memset(out, 0, sizeof *out);
  out->gate = gate;
  double *v = S >= 1 && S <= QC_OZPLAN_SMAX && ns > 0 ? malloc((size_t)ns * QC_OZPLAN_SMAX * QC_OZPLAN_SMAX * sizeof *v) : NULL;
  if (!v) { /* L = 0: DGEMM (out of memory, or no sample) */
    out->Sa = out->Sb = S;
    out->err = out->err_norm = NAN;
    return;
  }
  pair_values(smp, ns, S, v);
  /* the full plan first: what the self-check would judge without a plan */
  double e, ss;
  predict(smp, v, ns, S, S, S + 1, INFINITY, INFINITY, &e, &ss);
  out->Sa = out->Sb = S;
  out->pairs = qc_ozplan_pairs(S, S, S + 1);
  out->err = e;
  out->err_norm = sqrt(ss) / nrm;
  if (!(e <= gate && out->err_norm <= gate)) { /* L = 0: no plan passes (a NaN neither) */
    free(v);
    return;
  }
  out->L = S + 1;
  int found = 0;
  double best = 0; /* the chosen plan's fmax(errors) / gate */
  for (int Sa = S; Sa >= 1; Sa--)
    for (int Sb = S; Sb >= 1; Sb--)
      for (int L = Sa + Sb < S + 1 ? Sa + Sb : S + 1; L >= 2; L--) {
        const int n = qc_ozplan_pairs(Sa, Sb, L);
        if (found && n > out->pairs) continue;
        const double lim = QC_OZPLAN_MARGIN * gate, lim_n = lim * nrm;
        predict(smp, v, ns, Sa, Sb, L, lim, lim_n * lim_n, &e, &ss);
        const double en = sqrt(ss) / nrm, score = gate > 0 ? fmax(e, en) / gate : 0;
        if (!(e <= QC_OZPLAN_MARGIN * gate && en <= QC_OZPLAN_MARGIN * gate)) continue;
        if (found && n == out->pairs && score >= best) continue;
        found = 1;
        best = score;
        *out = (qc_ozplan){.Sa = Sa, .Sb = Sb, .L = L, .pairs = n, .err = e, .err_norm = en, .gate = gate};
      }
  /* the digits a level <= L can use: the plan's pairs are the same, its name says what runs */
  if (out->Sa > out->L - 1) out->Sa = out->L - 1;
  if (out->Sb > out->L - 1) out->Sb = out->L - 1;
  free(v);
}
