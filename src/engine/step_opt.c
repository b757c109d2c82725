/* step_opt.c: the float64 recomputation of one optimizer step, as
 * torch.optim.AdamW and torch.optim.SGD compute it (see step.h), and the
 * fit of the coefficient a trainer's update implies.
 *
 * AdamW (t = step + 1, g = grad / grad_scale * coef):
 *   m' = b1 m + (1 - b1) g;  v' = b2 v + (1 - b2) g^2
 *   p' = p (1 - lr wd) - lr / (1 - b1^t) * m' / (sqrt(v') / sqrt(1 - b2^t) + eps)
 * SGD (weight decay added to the gradient, as torch does):
 *   d = g + wd p;  buf' = momentum buf + d (buf' = d on the first step);  p' = p - lr buf' */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "core/qc.h"
#include "engine/step.h"

const char *qc_step_variant_text(qc_step_variant v) {
  switch (v) {
    case QC_STEP_L2: return "Adam with L2 weight decay added to the gradient (coupled), where AdamW's decoupled decay is declared";
    case QC_STEP_NO_WD: return "no weight decay applied";
    case QC_STEP_NO_BIASCORR: return "the moments without bias correction";
    default: return "the declared optimizer";
  }
}

void qc_step_update(const qc_step_arm *a, const qc_step_param *p, double coef, qc_step_variant v, double *out) {
  const double s = coef / a->grad_scale, wd = v == QC_STEP_NO_WD ? 0 : a->weight_decay;
  if (a->opt == QC_OPT_SGD) {
    for (int64_t i = 0; i < p->n; i++) {
      double d = p->grad[i] * s + wd * p->before[i];
      if (a->momentum > 0 && a->step > 0 && p->momentum) d = a->momentum * p->momentum[i] + d;
      out[i] = -a->lr * d;
    }
    return;
  }
  const double t = (double)(a->step + 1), b1 = a->beta1, b2 = a->beta2;
  const double bc1 = v == QC_STEP_NO_BIASCORR ? 1 : 1 - pow(b1, t), bc2 = v == QC_STEP_NO_BIASCORR ? 1 : 1 - pow(b2, t);
  const double step_size = a->lr / bc1, bc2s = sqrt(bc2);
  const int l2 = v == QC_STEP_L2;
  for (int64_t i = 0; i < p->n; i++) {
    double g = p->grad[i] * s, x = p->before[i];
    if (l2) g += wd * x;
    double m = b1 * (p->exp_avg ? p->exp_avg[i] : 0) + (1 - b1) * g;
    double q = b2 * (p->exp_avg_sq ? p->exp_avg_sq[i] : 0) + (1 - b2) * g * g;
    double decayed = l2 ? x : x * (1 - a->lr * wd);
    out[i] = decayed - step_size * m / (sqrt(q) / bc2s + a->eps) - x;
  }
}

void qc_step_update_err(const qc_step_arm *a, const qc_step_param *p, double coef, double u, double ua, double *err) {
  const double s = coef / a->grad_scale, wd = a->weight_decay;
  for (int64_t i = 0; i < p->n; i++) {
    double g = fabs(p->grad[i] * s), x = fabs(p->before[i]), dg = 2 * u * g; /* the unscaling and the clip: 2 roundings */
    double step, dstep;
    if (a->opt == QC_OPT_SGD) {
      double d = g + wd * x, dd = dg + u * (wd * x + d); /* wd p, then the sum */
      if (a->momentum > 0 && a->step > 0 && p->momentum) {
        double b = fabs(a->momentum * p->momentum[i]);
        dd += u * (b + b + d); /* momentum buf, then the sum */
        d += b;
      }
      step = a->lr * d;
      dstep = a->lr * dd + u * step;
    } else {
      const double t = (double)(a->step + 1), b1 = a->beta1, b2 = a->beta2;
      const double bc1 = 1 - pow(b1, t), bc2s = sqrt(1 - pow(b2, t)), ss = a->lr / bc1;
      double m0 = p->exp_avg ? fabs(p->exp_avg[i]) : 0, v0 = p->exp_avg_sq ? p->exp_avg_sq[i] : 0;
      double mterms = b1 * m0 + (1 - b1) * g;                 /* |b1 m| + |(1 - b1) g|: the moment's terms */
      double m = fabs(b1 * (p->exp_avg ? p->exp_avg[i] : 0) + (1 - b1) * (p->grad[i] * s));
      double dm = 3 * u * mterms + (1 - b1) * dg;             /* two products and a sum (or a lerp) */
      double v = b2 * v0 + (1 - b2) * g * g;                  /* no cancellation: every term >= 0 */
      double dv = 4 * u * v + 2 * (1 - b2) * g * dg;
      double r = sqrt(v) / bc2s, den = r + a->eps;
      double dden = (v > 0 ? r * 0.5 * dv / v : 0) + 3 * u * den; /* sqrt, the division, the + eps */
      step = ss * m / den;
      dstep = ss * (dm / den + m * dden / (den * den)) + 3 * u * step; /* the step size, the division, the product */
    }
    double decayed = a->opt == QC_OPT_SGD ? x : x * (1 - a->lr * wd), after = fabs(p->after[i]);
    /* the decay's product, the final sum; then `after` stored in its own type */
    err[i] = dstep + u * (a->opt == QC_OPT_SGD ? 0 : 2 * decayed) + u * (decayed + step) + ua * after;
  }
}

void qc_step_norm(const qc_step_arm *a, const uint8_t *trained, double *norm, double *coef) {
  double ss = 0;
  for (int k = 0; k < a->nparam; k++) {
    const qc_step_param *p = &a->params[k];
    if (!trained[k]) continue;
    for (int64_t i = 0; i < p->n; i++) {
      double g = p->grad[i] / a->grad_scale;
      ss += g * g;
    }
  }
  *norm = sqrt(ss);
  *coef = 1;
  if (a->max_grad_norm > 0) {
    double c = a->max_grad_norm / (*norm + 1e-6);
    if (c < 1) *coef = c;
  }
}

/* Sum over trained parameters of (trainer's update - recomputed)^2. */
static double sse(const qc_step_arm *a, const uint8_t *trained, qc_step_variant v, double c, double *tmp) {
  double e = 0;
  for (int k = 0; k < a->nparam; k++) {
    const qc_step_param *p = &a->params[k];
    if (!trained[k]) continue;
    qc_step_update(a, p, c, v, tmp);
    for (int64_t i = 0; i < p->n; i++) {
      double d = (p->after[i] - p->before[i]) - tmp[i];
      e += d * d;
    }
  }
  return e;
}

int qc_step_fit(const qc_step_arm *a, const uint8_t *trained, qc_step_variant v, double *c, double *rel, int *ident) {
  int64_t mx = 1;
  double uu = 0;
  for (int k = 0; k < a->nparam; k++) {
    if (!trained[k]) continue;
    const qc_step_param *p = &a->params[k];
    if (p->n > mx) mx = p->n;
    for (int64_t i = 0; i < p->n; i++) uu += (p->after[i] - p->before[i]) * (p->after[i] - p->before[i]);
  }
  double *tmp = malloc((size_t)mx * sizeof *tmp);
  if (!tmp) return qc_err_sys("out of memory fitting the step");
  /* a coarse grid over log c, then golden sections around the best */
  const int G = 49;
  double lo = log(1e-4), hi = log(1e4), best = 0, bestE = INFINITY;
  for (int g = 0; g < G; g++) {
    double t = lo + (hi - lo) * g / (G - 1), E = sse(a, trained, v, exp(t), tmp);
    if (E < bestE) { bestE = E; best = t; }
  }
  double h = (hi - lo) / (G - 1), x0 = best - h, x1 = best + h;
  const double r = 0.6180339887498949;
  double u = x1 - r * (x1 - x0), w = x0 + r * (x1 - x0);
  double Eu = sse(a, trained, v, exp(u), tmp), Ew = sse(a, trained, v, exp(w), tmp);
  for (int it = 0; it < 60; it++) {
    if (Eu < Ew) { x1 = w; w = u; Ew = Eu; u = x1 - r * (x1 - x0); Eu = sse(a, trained, v, exp(u), tmp); }
    else { x0 = u; u = w; Eu = Ew; w = x0 + r * (x1 - x0); Ew = sse(a, trained, v, exp(w), tmp); }
  }
  double t = Eu < Ew ? u : w, E = fmin(Eu, Ew);
  if (bestE < E) { t = best; E = bestE; }
  *c = exp(t);
  *rel = uu > 0 ? sqrt(E / uu) : NAN;
  /* identifiable when moving c by 25% changes the fit visibly */
  double Ep = sse(a, trained, v, exp(t) * 1.25, tmp), Em = sse(a, trained, v, exp(t) / 1.25, tmp);
  *ident = uu > 0 && (fmin(Ep, Em) - E) > 1e-8 * uu;
  free(tmp);
  return QC_OK;
}
