/* reference/ref_quant_ste.c: the VJP of a fake quantizer with a scale
 * contract, and of an activation composed with it, in float64 from the math
 * (docs/classes.md, "fake_quant" and "act_quant").
 *
 * Forward. u = x, or a(x) (act_quant, order act_quant); per tensor or per
 * channel a scale s: params/scale (scale_grad fixed, trainable), or
 * D / Qp with D = max(max |u|, amax_floor) (stop_gradient, flow); v = u / s;
 * q = round(v) on the grid (the integers, or the fp8 values, ties to even);
 * the range [Qn, Qp] (int8 [-128, 127], int4 [-8, 7], e4m3 +-448, e5m2
 * +-57344); v saturates when round(v) leaves it (clip round_first) or v does
 * (clip_first), q then the bound on v's side. y = s q, or a(s q) (order
 * quant_act).
 *
 * Backward (LSQ, Esser et al. 2020, "Learned Step Size Quantization",
 * eq. 3: dy/ds = -v + round(v) inside the range, Qn or Qp outside; the
 * straight-through estimator for round): with G = dY, or dY a'(s q) under
 * quant_act,
 *   d_u = G inside the range; outside 0 (saturation_grad zero) or G (pass)
 *   d_scale = g sum over the scale's elements of G (q - v) inside, G Qn or
 *     G Qp outside; g = grad_factor, times 1/sqrt(N Qp) under grad_scale lsq
 *     (LSQ's gradient scale, N the elements sharing the scale)
 *   flow: s = D / Qp depends on u through the amax: d_u at the elements with
 *     |u| = D (ties share it evenly, as torch.amax's derivative) gains
 *     sign(u) / Qp times the unscaled sum above; nothing when D is the floor
 *   d_x = a'(x) d_u (order act_quant with an activation), else d_u.
 * The branches (which side of a tie, saturated or not) are decided on v
 * as float32 computes it (RN32(u / s), or RN32(RN32(u Qp) / D) for amax
 * scales, u rounded to float32): every producer decides in float32, and
 * the value of each term is the float64 math. Under ctx->terms: the terms'
 * scale, |G| (|q| + |v|) for q - v (v = u / s rounded once carries u |v|),
 * the activations' derivatives as sums of their terms' magnitudes. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "core/qc.h"
#include "model/module.h"
#include "reference/ref_quant_ste.h"
#include "reference/ref_util.h"

enum { R_FIXED, R_STOP, R_FLOW, R_TRAIN };
enum { A_NONE, A_RELU, A_GELU, A_GELU_TANH, A_SILU };

typedef struct rq {
  int fp8, mbits, emin, round_first, sg, pass, act, quant_first, lsq;
  double qn, qp, factor, floor;
  int64_t n, C, inner;
  const qc_tensor *x, *scale;
} rq;

static int word(const qc_module *m, const char *key, const char *dflt, const char *const *w, int *out) {
  const char *v = qc_contract_str(&m->contract, key, dflt);
  for (int i = 0; w[i]; i++)
    if (strcmp(v, w[i]) == 0) return *out = i, QC_OK;
  return qc_err("%s: contract %s = '%s' is not one the reference knows", m->path, key, v);
}

static int rq_read(const qc_module *m, int with_act, rq *p) {
  static const char *const F[] = {"int8", "int4", "e4m3", "e5m2", NULL}, *const CL[] = {"round_first", "clip_first", NULL};
  static const char *const SG[] = {"fixed", "stop_gradient", "flow", "trainable", NULL}, *const SA[] = {"zero", "pass", NULL};
  static const char *const GR[] = {"tensor", "channel", NULL}, *const GS[] = {"none", "lsq", NULL};
  static const char *const AC[] = {"relu", "gelu", "gelu_tanh", "silu", NULL}, *const OR[] = {"act_quant", "quant_act", NULL};
  memset(p, 0, sizeof *p);
  int f = 0, cl = 0, gr = 0, gs = 0, ac = 1, od = 0;
  int rc = qc_module_need(m, "inputs", "x", 1, QC_MAXDIM, &p->x);
  if (!rc) rc = word(m, "format", "int8", F, &f);
  if (!rc) rc = word(m, "clip", "round_first", CL, &cl);
  if (!rc) rc = word(m, "scale_grad", "trainable", SG, &p->sg);
  if (!rc) rc = word(m, "saturation_grad", "zero", SA, &p->pass);
  if (!rc) rc = word(m, "granularity", "tensor", GR, &gr);
  if (!rc) rc = word(m, "grad_scale", "none", GS, &gs);
  if (!rc && with_act) rc = word(m, "act", "gelu", AC, &ac);
  if (!rc && with_act) rc = word(m, "order", "act_quant", OR, &od);
  if (rc) return rc;
  p->fp8 = f >= 2;
  p->mbits = f == 2 ? 3 : 2;
  p->emin = f == 2 ? -6 : -14;
  p->qp = f == 0 ? 127 : f == 1 ? 7 : f == 2 ? 448 : 57344;
  p->qn = f == 0 ? -128 : f == 1 ? -8 : -p->qp;
  p->round_first = cl == 0;
  p->lsq = gs;
  p->act = with_act ? ac + 1 : A_NONE;
  p->quant_first = with_act && od;
  p->factor = qc_contract_num(&m->contract, "grad_factor", 1);
  p->floor = qc_contract_num(&m->contract, "amax_floor", 1e-12);
  if (!(p->factor > 0 && isfinite(p->factor) && p->floor > 0 && isfinite(p->floor)))
    return qc_err("%s: contract grad_factor %g, amax_floor %g: the reference takes finite numbers > 0", m->path, p->factor,
                  p->floor);
  p->n = qc_numel(p->x);
  p->C = 1;
  p->inner = p->n;
  if (gr) {
    const double a = qc_contract_num(&m->contract, "axis", 0);
    if (!(a == floor(a) && a >= -p->x->ndim && a < p->x->ndim))
      return qc_err("%s: contract axis = %g is not a dimension of inputs/x", m->path, a);
    const int ax = a < 0 ? (int)a + p->x->ndim : (int)a;
    p->C = p->x->shape[ax];
    p->inner = 1;
    for (int d = ax + 1; d < p->x->ndim; d++) p->inner *= p->x->shape[d];
  }
  p->scale = qc_tset_get(&m->params, "scale");
  const int want = p->sg == R_FIXED || p->sg == R_TRAIN;
  if (want != (p->scale != NULL))
    return qc_err("%s: scale_grad %s %s params/scale", m->path, SG[p->sg], want ? "needs" : "does not read");
  if (p->scale && qc_numel(p->scale) != p->C)
    return qc_err("%s: params/scale has %lld elements, the reference needs %lld", m->path, (long long)qc_numel(p->scale),
                  (long long)p->C);
  return QC_OK;
}

/* a(x), and a'(x) (terms: the sum of its terms' magnitudes). */
static double act(int a, double x) {
  switch (a) {
  case A_RELU: return x > 0 ? x : 0;
  case A_GELU: return 0.5 * x * erfc(-x / M_SQRT2);
  case A_GELU_TANH: return 0.5 * x * (1 + tanh(sqrt(2 / M_PI) * (x + 0.044715 * x * x * x)));
  case A_SILU: return x / (1 + exp(-x));
  default: return x;
  }
}

static double dact(int a, double x, int terms) {
  switch (a) {
  case A_RELU: return x > 0 ? 1 : 0;
  case A_GELU: {
    const double e = erf(x / M_SQRT2), ph = exp(-0.5 * x * x) / sqrt(2 * M_PI);
    return terms ? 0.5 * (1 + fabs(e)) + fabs(x) * ph : 0.5 * (1 + e) + x * ph;
  }
  case A_GELU_TANH: {
    const double r = sqrt(2 / M_PI), uu = r * (x + 0.044715 * x * x * x), ch = cosh(uu), t = tanh(uu);
    const double s2 = isfinite(ch) ? 1 / (ch * ch) : 0, d = 0.5 * x * s2 * r * (1 + 0.134145 * x * x);
    return terms ? 0.5 * (1 + fabs(t)) + fabs(d) : 0.5 * (1 + t) + d;
  }
  case A_SILU: {
    const double sg = 1 / (1 + exp(-x));
    return terms ? sg + fabs(x) * sg * (1 - sg) : sg * (1 + x * (1 - sg));
  }
  default: return 1;
  }
}

/* The nearest grid value to v (fp8: ties to even, subnormals, no upper
 * bound), the integer otherwise. */
static double grid(const rq *p, double v) {
  if (!p->fp8) return nearbyint(v);
  if (v == 0) return v;
  int e;
  frexp(fabs(v), &e);
  const double quantum = ldexp(1.0, (e - 1 < p->emin ? p->emin : e - 1) - p->mbits);
  return copysign(nearbyint(fabs(v) / quantum) * quantum, v);
}

int qc_ref_quant_ste(const qc_ctx *ctx, const qc_module *m, const qc_tensor *dy, qc_tset *grads, int with_act) {
  rq p;
  int rc = rq_read(m, with_act, &p);
  if (rc) return rc;
  if (qc_numel(dy) != p.n)
    return qc_err("%s: dY '%s' has %lld elements, inputs/x %lld", m->path, dy->name, (long long)qc_numel(dy), (long long)p.n);
  const int ab = ctx && ctx->terms, af = p.act && !p.quant_first;
  double *x = qc_refu_load(p.x, "reference x"), *g = qc_refu_load(dy, "reference dY"), *sc = NULL, *dx, *ds;
  double *u = malloc((size_t)p.n * sizeof *u), *du = malloc((size_t)p.n * sizeof *du);
  double *s = calloc((size_t)p.C, sizeof *s), *D = calloc((size_t)p.C, sizeof *D), *t = calloc((size_t)p.C, sizeof *t);
  float *D32 = calloc((size_t)p.C, sizeof *D32);
  int64_t *nt = calloc((size_t)p.C, sizeof *nt);
  rc = QC_ESYS;
  if (!x || !g || !u || !du || !s || !D || !t || !D32 || !nt) goto done;
  if (p.scale && !(sc = qc_refu_load(p.scale, "reference scale"))) goto done;
  for (int64_t i = 0; i < p.n; i++) u[i] = af ? act(p.act, x[i]) : x[i];
  for (int64_t i = 0; i < p.n; i++) {
    const int64_t c = (i / p.inner) % p.C;
    D[c] = fmax(D[c], fabs(u[i]));
    D32[c] = fmaxf(D32[c], fabsf((float)u[i]));
  }
  for (int64_t c = 0; c < p.C; c++) {
    if (sc) {
      s[c] = sc[c];
      if (!(s[c] > 0 && isfinite(s[c]))) {
        rc = qc_err("%s: params/scale[%lld] = %g: the reference needs a finite scale > 0", m->path, (long long)c, s[c]);
        goto done;
      }
    } else {
      D[c] = fmax(D[c], p.floor);
      D32[c] = fmaxf(D32[c], (float)p.floor);
      s[c] = D[c] / p.qp;
    }
  }
  for (int64_t i = 0; i < p.n; i++) {
    const int64_t c = (i / p.inner) % p.C;
    const float u32 = (float)u[i];
    /* the branch: v as float32 computes it; the terms: v itself */
    const double vd = sc ? (float)(u32 / s[c]) : (float)((float)(u32 * (float)p.qp) / D32[c]);
    const double v = sc ? u[i] / s[c] : u[i] * p.qp / D[c];
    const double bound = vd < 0 ? p.qn : p.qp;
    double q;
    int sat;
    if (p.round_first) {
      q = grid(&p, vd);
      sat = q < p.qn || q > p.qp;
    } else {
      sat = vd < p.qn || vd > p.qp;
      q = grid(&p, sat ? bound : vd);
    }
    if (sat) q = bound;
    const double G = p.quant_first ? g[i] * dact(p.act, s[c] * q, 0) : g[i];
    const double Ga = p.quant_first ? fabs(g[i]) * dact(p.act, s[c] * q, 1) : fabs(g[i]);
    if (ab) {
      t[c] += sat ? Ga * fabs(bound) : Ga * (fabs(q) + fabs(v));
      du[i] = sat && !p.pass ? 0 : Ga;
    } else {
      t[c] += sat ? G * bound : G * (q - v);
      du[i] = sat && !p.pass ? 0 : G;
    }
    if (!sc && D[c] > p.floor && fabsf(u32) == D32[c]) nt[c]++;
  }
  if (p.sg == R_FLOW)
    for (int64_t i = 0; i < p.n; i++) {
      const int64_t c = (i / p.inner) % p.C;
      if (nt[c] && fabsf((float)u[i]) == D32[c]) du[i] += t[c] / p.qp * (ab ? 1 : u[i] < 0 ? -1 : 1) / (double)nt[c];
    }
  if ((rc = qc_refu_out(grads, "d_x", p.x->ndim, p.x->shape, &dx))) goto done;
  for (int64_t i = 0; i < p.n; i++) dx[i] = af ? dact(p.act, x[i], ab) * du[i] : du[i];
  if (p.sg == R_TRAIN) {
    if ((rc = qc_refu_out(grads, "d_scale", p.scale->ndim, p.scale->shape, &ds))) goto done;
    const double gf = p.factor * (p.lsq ? 1 / sqrt((double)(p.n / p.C) * p.qp) : 1);
    for (int64_t c = 0; c < p.C; c++) ds[c] = gf * t[c];
  }
  rc = QC_OK;
done:
  free(x); free(g); free(sc); free(u); free(du); free(s); free(D); free(t); free(D32); free(nt);
  return rc;
}
