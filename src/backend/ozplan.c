/* ozplan.c: the fast reference's pair plan from its sample (ozplan.h). */
#include "backend/ozplan.h"

#include <math.h>
#include <string.h>

#include "numerics/metrics.h"

int qc_ozplan_pairs(int Sa, int Sb, int L) {
  int n = 0;
  for (int t = 1; t <= Sa; t++)
    for (int u = 1; u <= Sb; u++) n += t + u <= L;
  return n;
}

/* Plan (Sa, Sb, L)'s predicted self-check on the sample: *err the max
 * relative error, *sumsq the sum of squared errors. */
static void predict(const double *smp, int ns, int Sa, int Sb, int L, double *err, double *sumsq) {
  double mx = 0, ss = 0;
  for (int s = 0; s < ns; s++) {
    const double *p = smp + (size_t)s * QC_OZPLAN_W, *x = p + QC_OZPLAN_SMAX * QC_OZPLAN_SMAX;
    const double hi = x[0], lo = x[1], sc = x[2], E = x[3];
    double v = 0;
    if (E != QC_OZPLAN_ZERO) {
      /* the pairs in decreasing weight, each exact (an integer times a power of two) */
      for (int lv = 2; lv <= L; lv++)
        for (int t = 1; t <= Sa && t < lv; t++) {
          const int u = lv - t;
          if (u <= Sb) v += ldexp(p[(t - 1) * QC_OZPLAN_SMAX + (u - 1)], (int)E - 7 * lv);
        }
    }
    const double d = fabs((v - hi) - lo);
    const double r = d == 0 ? 0.0 : sc > 0 ? d / sc : INFINITY;
    mx = r == r && mx == mx ? fmax(mx, r) : NAN;
    ss += d * d;
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
  if (S < 1 || S > QC_OZPLAN_SMAX) return;
  /* the full plan first: what the self-check would judge without a plan */
  double e, ss;
  predict(smp, ns, S, S, S + 1, &e, &ss);
  out->Sa = out->Sb = S;
  out->pairs = qc_ozplan_pairs(S, S, S + 1);
  out->err = e;
  out->err_norm = sqrt(ss) / nrm;
  if (!(e <= gate && out->err_norm <= gate)) return; /* L = 0: no plan passes (a NaN neither) */
  out->L = S + 1;
  int found = 0;
  double best = 0; /* the chosen plan's fmax(errors) / gate */
  for (int Sa = S; Sa >= 1; Sa--)
    for (int Sb = S; Sb >= 1; Sb--)
      for (int L = Sa + Sb < S + 1 ? Sa + Sb : S + 1; L >= 2; L--) {
        const int n = qc_ozplan_pairs(Sa, Sb, L);
        if (found && n > out->pairs) continue;
        predict(smp, ns, Sa, Sb, L, &e, &ss);
        const double en = sqrt(ss) / nrm, score = gate > 0 ? fmax(e, en) / gate : 0;
        if (!(e <= QC_OZPLAN_MARGIN * gate && en <= QC_OZPLAN_MARGIN * gate)) continue;
        if (found && n == out->pairs && score >= best) continue;
        found = 1;
        best = score;
        *out = (qc_ozplan){.Sa = Sa, .Sb = Sb, .L = L, .pairs = n, .err = e, .err_norm = en, .gate = gate};
      }
}
