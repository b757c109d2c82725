/* modules/quant_ste.c: the production of classes fake_quant and act_quant
 * in float32, as a QAT trainer's fake quantizer runs its backward
 * (docs/classes.md, "fake_quant" and "act_quant").
 *
 *   u   the quantizer's input: x, or act(x) (act_quant, order act_quant)
 *   s   per tensor or per channel: params/scale (fixed, trainable), or
 *       D / qmax with D = max(amax |u|, amax_floor) (stop_gradient, flow)
 *   v   u / s (params) or RN(u qmax) / D (amax: exactly +-qmax at the max)
 *   q   round(v) to the grid (integers, or fp8 values, RNE); saturated when
 *       round(v) leaves [qmin, qmax] (clip = round_first, torch) or v does
 *       (clip_first, LSQ), q then the bound
 *   y   s q, or act(s q) (order quant_act)
 * Backward, with G = dY, or dY act'(s q) under quant_act:
 *   d_u   G inside, 0 or G (saturation_grad pass) outside
 *   t     G (q - v) inside, G qmin or G qmax outside (LSQ's dy/ds)
 *   d_scale  g sum over the scale's elements of t (trainable;
 *            g = grad_factor, times 1/sqrt(N qmax) under grad_scale lsq)
 *   flow: d_u of the elements at |u| = D gets sum t / qmax sign(u), split
 *         evenly over ties (torch.amax's rule); none when D is the floor
 *   d_x   act'(x) d_u (order act_quant with an act), else d_u */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/qc.h"
#include "model/module.h"
#include "modules/mod_util.h"
#include "modules/quant_ste.h"
#include "numerics/formats.h"

static int pick(const qc_module *m, const char *key, const char *dflt, const char *const *names, int *out) {
  const char *v = qc_contract_str(&m->contract, key, dflt);
  char all[160] = "";
  for (int i = 0; names[i]; i++) {
    if (strcmp(v, names[i]) == 0) return *out = i, QC_OK;
    snprintf(all + strlen(all), sizeof all - strlen(all), "%s%s", i ? "|" : "", names[i]);
  }
  return qc_err("%s: contract %s = '%s': expected %s", m->path, key, v, all);
}

static int qc_qste_read(const qc_module *m, int with_act, qste *p) {
  static const char *const fmts[] = {"int8", "int4", "e4m3", "e5m2", NULL};
  static const char *const clips[] = {"round_first", "clip_first", NULL};
  static const char *const sgs[] = {"fixed", "stop_gradient", "flow", "trainable", NULL};
  static const char *const sats[] = {"zero", "pass", NULL};
  static const char *const grans[] = {"tensor", "channel", NULL};
  static const char *const gss[] = {"none", "lsq", NULL};
  static const char *const acts[] = {"relu", "gelu", "gelu_tanh", "silu", NULL};
  static const char *const orders[] = {"act_quant", "quant_act", NULL};
  memset(p, 0, sizeof *p);
  int rc = qc_module_need(m, "inputs", "x", 1, QC_MAXDIM, &p->x);
  int f = 0, clip = 0, gran = 0, gs = 0, act = 1, order = 0;
  if (!rc) rc = pick(m, "format", "int8", fmts, &f);
  if (!rc) rc = pick(m, "clip", "round_first", clips, &clip);
  if (!rc) rc = pick(m, "scale_grad", "trainable", sgs, &p->sg);
  if (!rc) rc = pick(m, "saturation_grad", "zero", sats, &p->sat_pass);
  if (!rc) rc = pick(m, "granularity", "tensor", grans, &gran);
  if (!rc) rc = pick(m, "grad_scale", "none", gss, &gs);
  if (!rc && with_act) rc = pick(m, "act", "gelu", acts, &act);
  if (!rc && with_act) rc = pick(m, "order", "act_quant", orders, &order);
  if (rc) return rc;
  static const double qmins[] = {-128, -8, -448, -57344}, qmaxs[] = {127, 7, 448, 57344};
  p->qmin = qmins[f];
  p->qmax = qmaxs[f];
  p->fp8 = f >= 2;
  p->mbits = f == 2 ? 3 : 2;
  p->emin = f == 2 ? -6 : -14;
  p->round_first = clip == 0;
  p->lsq = gs == 1;
  p->act = with_act ? act + 1 : QS_NONE;
  p->quant_first = with_act && order == 1;
  p->factor = qc_contract_num(&m->contract, "grad_factor", 1);
  p->floor = qc_contract_num(&m->contract, "amax_floor", 1e-12);
  if (!(p->factor > 0) || !isfinite(p->factor))
    return qc_err("%s: contract grad_factor = %g: expected a finite number > 0", m->path, p->factor);
  if (!(p->floor > 0) || !isfinite(p->floor))
    return qc_err("%s: contract amax_floor = %g: expected a finite number > 0 (an all-zero tensor's scale)", m->path, p->floor);
  const qc_tensor *x = p->x;
  p->n = qc_numel(x);
  p->C = 1;
  p->inner = p->n;
  if (gran == 1) {
    double a = qc_contract_num(&m->contract, "axis", 0);
    if (a != floor(a) || a < -x->ndim || a >= x->ndim)
      return qc_err("%s: contract axis = %g: expected a whole number in %d..%d (a dimension of inputs/x)", m->path, a,
                    -x->ndim, x->ndim - 1);
    int ax = a < 0 ? (int)a + x->ndim : (int)a;
    p->C = x->shape[ax];
    p->inner = 1;
    for (int d = ax + 1; d < x->ndim; d++) p->inner *= x->shape[d];
  }
  p->scale = qc_tset_get(&m->params, "scale");
  const int has = p->sg == QS_FIXED || p->sg == QS_TRAIN;
  if (has && !p->scale)
    return qc_err("%s: contract scale_grad = %s takes the scale from params/scale, which the module lacks", m->path,
                  sgs[p->sg]);
  if (!has && p->scale)
    return qc_err("%s: contract scale_grad = %s computes the scale from the amax: params/scale is not read (set "
                  "scale_grad fixed or trainable, or leave it out)", m->path, sgs[p->sg]);
  if (p->scale && qc_numel(p->scale) != p->C)
    return qc_err("%s: params/scale has %lld elements: expected %lld (granularity %s%s)", m->path,
                  (long long)qc_numel(p->scale), (long long)p->C, grans[gran], gran ? ": inputs/x's channel axis" : "");
  return QC_OK;
}

int qc_qste_validate(const qc_module *m, const qc_tensor *dy, int with_act) {
  qste p;
  int rc = qc_qste_read(m, with_act, &p);
  if (!rc && p.scale) {
    float *s = qc_mod_f32(p.scale, "params/scale");
    if (!s) return QC_ESYS;
    for (int64_t c = 0; !rc && c < p.C; c++)
      if (!(s[c] > 0) || !isfinite(s[c]))
        rc = qc_err("%s: params/scale[%lld] = %g: expected a finite scale > 0", m->path, (long long)c, s[c]);
    free(s);
  }
  return rc ? rc : qc_module_check_dy(m, dy, p.n, p.x->shape[p.x->ndim - 1], "the shape of inputs/x");
}

static float act_f(int a, float x) {
  switch (a) {
  case QS_RELU: return x > 0 ? x : 0.0f;
  case QS_GELU: return 0.5f * x * erfcf(-x * 0.70710678118654752f);
  case QS_GELU_TANH: return 0.5f * x * (1.0f + tanhf(0.7978845608028654f * (x + 0.044715f * x * x * x)));
  case QS_SILU: return x / (1.0f + expf(-x));
  default: return x;
  }
}

static float act_d(int a, float x) {
  switch (a) {
  case QS_RELU: return x > 0 ? 1.0f : 0.0f;
  case QS_GELU: return 0.5f * erfcf(-x * 0.70710678118654752f) + x * 0.3989422804014327f * expf(-0.5f * x * x);
  case QS_GELU_TANH: {
    const float k = 0.7978845608028654f, c = 0.044715f, t = tanhf(k * (x + c * x * x * x));
    return 0.5f * (1.0f + t) + 0.5f * x * (1.0f - t * t) * k * (1.0f + 3.0f * c * x * x);
  }
  case QS_SILU: {
    const float sg = 1.0f / (1.0f + expf(-x));
    return sg * (1.0f + x * (1.0f - sg));
  }
  default: return 1.0f;
  }
}

/* v to the fp8 grid (RNE, subnormals), unbounded above. */
static double fp8_grid(const qste *p, double v) {
  if (v == 0) return v;
  int e;
  frexp(fabs(v), &e);
  const double qn = ldexp(1.0, (e - 1 < p->emin ? p->emin : e - 1) - p->mbits);
  return copysign(nearbyint(fabs(v) / qn) * qn, v);
}

/* q of v, *sat and *bound (the bound on v's side). */
static float qs_round(const qste *p, float v, int *sat, float *bound) {
  *bound = (float)(v < 0 ? p->qmin : p->qmax);
  if (p->round_first) {
    double q = p->fp8 ? fp8_grid(p, v) : nearbyint(v);
    *sat = q < p->qmin || q > p->qmax;
    return *sat ? *bound : (float)q;
  }
  *sat = v < p->qmin || v > p->qmax;
  float c = *sat ? *bound : v;
  return p->fp8 ? (float)fp8_grid(p, c) : nearbyintf(c);
}

/* How far v is from a decision (a rounding tie, the clip boundary), in
 * quanta (the generator keeps its elements off them). */
static double qs_tie_dist(const qste *p, double v) {
  double qn = 1;
  if (p->fp8 && v != 0) {
    int e;
    frexp(fabs(v), &e);
    qn = ldexp(1.0, (e - 1 < p->emin ? p->emin : e - 1) - p->mbits);
  }
  double f = fabs(v) / qn, d = fabs(f - floor(f) - 0.5);
  if (!p->round_first) d = fmin(d, fmin(fabs(v - p->qmax), fabs(v - p->qmin)) / qn);
  return d;
}

/* The forward's per-element quantities: u, and per channel the scale s[c]
 * and D[c] (amax scales; 0 for params). */
static int64_t chan(const qste *p, int64_t i) { return (i / p->inner) % p->C; }

static int qs_scales(const qste *p, const float *x, float *u, float *s, float *D) {
  for (int64_t i = 0; i < p->n; i++) u[i] = p->act && !p->quant_first ? act_f(p->act, x[i]) : x[i];
  if (p->scale) {
    float *ps = qc_mod_f32(p->scale, "params/scale");
    if (!ps) return QC_ESYS;
    memcpy(s, ps, (size_t)p->C * sizeof *s);
    free(ps);
    memset(D, 0, (size_t)p->C * sizeof *D);
    return QC_OK;
  }
  memset(D, 0, (size_t)p->C * sizeof *D);
  for (int64_t i = 0; i < p->n; i++) D[chan(p, i)] = fmaxf(D[chan(p, i)], fabsf(u[i]));
  for (int64_t c = 0; c < p->C; c++) {
    D[c] = fmaxf(D[c], (float)p->floor);
    s[c] = D[c] / (float)p->qmax;
  }
  return QC_OK;
}

static float qs_v(const qste *p, float u, float s, float D) { return p->scale ? u / s : (u * (float)p->qmax) / D; }

int qc_qste_vjp(const qc_module *m, const qc_tensor *dy, qc_tset *grads, int with_act) {
  qste p;
  int rc = qc_qste_validate(m, dy, with_act);
  if (!rc) rc = qc_qste_read(m, with_act, &p);
  if (rc) return rc;
  float *x = qc_mod_f32(p.x, "inputs/x"), *g = qc_mod_f32(dy, "dY"), *dx = NULL, *ds = NULL;
  float *u = malloc((size_t)p.n * sizeof *u), *du = malloc((size_t)p.n * sizeof *du);
  float *s = malloc((size_t)p.C * sizeof *s), *D = malloc((size_t)p.C * sizeof *D), *ts = calloc((size_t)p.C, sizeof *ts);
  int64_t *nt = calloc((size_t)p.C, sizeof *nt);
  rc = QC_ESYS;
  if (!x || !g || !u || !du || !s || !D || !ts || !nt) goto done;
  if ((rc = qs_scales(&p, x, u, s, D))) goto done;
  for (int64_t i = 0; i < p.n; i++) {
    const int64_t c = chan(&p, i);
    int sat;
    float bound, v = qs_v(&p, u[i], s[c], D[c]), q = qs_round(&p, v, &sat, &bound);
    float G = p.quant_first ? g[i] * act_d(p.act, s[c] * q) : g[i];
    ts[c] += sat ? G * bound : G * (q - v);
    du[i] = sat && !p.sat_pass ? 0.0f : G;
    if (!p.scale && D[c] > (float)p.floor && fabsf(u[i]) == D[c]) nt[c]++;
  }
  if (p.sg == QS_FLOW)
    for (int64_t i = 0; i < p.n; i++) {
      const int64_t c = chan(&p, i);
      if (nt[c] && fabsf(u[i]) == D[c]) du[i] += ts[c] / (float)p.qmax * (u[i] < 0 ? -1.0f : 1.0f) / (float)nt[c];
    }
  if ((rc = qc_mod_add(grads, "d_x", QC_F32, p.x->ndim, p.x->shape, (void **)&dx))) goto done;
  for (int64_t i = 0; i < p.n; i++) dx[i] = p.act && !p.quant_first ? act_d(p.act, x[i]) * du[i] : du[i];
  if (p.sg == QS_TRAIN) {
    if ((rc = qc_mod_add(grads, "d_scale", QC_F32, p.scale->ndim, p.scale->shape, (void **)&ds))) goto done;
    float gf = (float)p.factor * (p.lsq ? 1.0f / sqrtf((float)(p.n / p.C) * (float)p.qmax) : 1.0f);
    for (int64_t c = 0; c < p.C; c++) ds[c] = gf * ts[c];
  }
  rc = QC_OK;
done:
  free(x); free(g); free(u); free(du); free(s); free(D); free(ts); free(nt);
  return rc;
}

int qc_qste_generate(const char *cls, const qc_gen *gp, qc_rng *rng, qc_module *m, int *ondim, int64_t *oshape, double xs,
                     int with_act) {
  if (gp->nshape < 1) return qc_err("%s: generate shape needs at least one entry ([T, C])", cls);
  for (int d = 0; d < gp->nshape; d++)
    if (gp->shape[d] < 1) return qc_err("%s: generate shape entries must be >= 1", cls);
  uint16_t *xb;
  int rc = qc_mod_gen_bf16(&m->inputs, "x", gp->nshape, gp->shape, rng, xs, &xb);
  if (rc) return rc;
  const int64_t cols = gp->shape[gp->nshape - 1], n = qc_shape_numel(gp->nshape, gp->shape);
  static const float ext[] = {30.0f, -30.0f, -0.0f};
  qc_mod_values(gp, rng, xb, n / cols, cols, ext, 3);
  /* params/scale where the contract takes one: per channel varying, about
   * (2 + 0.5 (c mod 4)) xs / qmax (a few elements saturate) */
  qste p;
  const char *sg = qc_contract_str(&m->contract, "scale_grad", "trainable");
  if (strcmp(sg, "fixed") == 0 || strcmp(sg, "trainable") == 0) {
    const char *gran = qc_contract_str(&m->contract, "granularity", "tensor");
    int64_t C = 1;
    if (strcmp(gran, "channel") == 0) {
      double a = qc_contract_num(&m->contract, "axis", 0);
      if (a != floor(a) || a < -gp->nshape || a >= gp->nshape) return qc_err("%s: contract axis = %g: not a dimension", cls, a);
      C = gp->shape[a < 0 ? (int)a + gp->nshape : (int)a];
    }
    const char *f = qc_contract_str(&m->contract, "format", "int8");
    const double qmax = strcmp(f, "int4") == 0 ? 7 : strcmp(f, "e4m3") == 0 ? 448 : strcmp(f, "e5m2") == 0 ? 57344 : 127;
    float *sc;
    int64_t one = C;
    if ((rc = qc_mod_add(&m->params, "scale", QC_F32, 1, &one, (void **)&sc))) return rc;
    for (int64_t c = 0; c < C; c++) sc[c] = (float)((2.0 + 0.5 * (double)(c % 4)) * xs / qmax);
  }
  if ((rc = qc_qste_read(m, with_act, &p))) return rc;
  /* keep every element off the decisions: one bf16 step toward zero */
  float *x = calloc((size_t)n, sizeof *x), *u = calloc((size_t)n, sizeof *u);
  float *s = malloc((size_t)p.C * sizeof *s), *D = malloc((size_t)p.C * sizeof *D);
  rc = QC_ESYS;
  if (!x || !u || !s || !D) goto done;
  for (int pass = 0; pass < 16; pass++) {
    int moved = 0;
    for (int64_t i = 0; i < n; i++) x[i] = qc_bf16_to_f32(xb[i]);
    if ((rc = qs_scales(&p, x, u, s, D))) goto done;
    for (int64_t i = 0; i < n; i++) {
      const int64_t c = chan(&p, i);
      if (!p.scale && fabsf(u[i]) == D[c]) continue; /* exactly +-qmax */
      if (x[i] != 0 && qs_tie_dist(&p, qs_v(&p, u[i], s[c], D[c])) < 1e-3) xb[i]--, moved = 1;
    }
    if (!moved) break;
  }
  /* outputs/y by the forward, in float32 */
  float *y;
  if ((rc = qc_mod_add(&m->outputs, "y", QC_F32, gp->nshape, gp->shape, (void **)&y))) goto done;
  for (int64_t i = 0; i < n; i++) {
    const int64_t c = chan(&p, i);
    int sat;
    float bound, q = qs_round(&p, qs_v(&p, u[i], s[c], D[c]), &sat, &bound);
    y[i] = p.quant_first ? act_f(p.act, s[c] * q) : s[c] * q;
  }
  *ondim = gp->nshape;
  memcpy(oshape, gp->shape, (size_t)gp->nshape * sizeof *oshape);
  rc = QC_OK;
done:
  free(x); free(u); free(s); free(D);
  return rc;
}

int qc_qste_tol_model(const qc_module *m, const qc_tensor *dy, const char *grad, qc_tol_model *tm, int with_act) {
  (void)dy;
  qste p;
  int rc = qc_qste_read(m, with_act, &p);
  if (rc) return rc;
  const int64_t K = p.n / p.C;
  const double lam = p.act == QS_GELU || p.act == QS_GELU_TANH || p.act == QS_SILU ? 4 : 1;
  if (strcmp(grad, "d_x") == 0) {
    if (p.sg == QS_FLOW)
      qc_mod_tm(tm, K, lam + 1, 0, 0, "d_x: the STE's copy of dY%s, and at the amax the float32 sum of LSQ's terms over "
                "the scale's N = %lld elements: K = N", p.act ? " times act'" : "", (long long)K);
    else
      qc_mod_tm(tm, 1, lam, 0, 0, "d_x: elementwise (K = 1), the STE's copy of dY%s", p.act ? " times act' in float32" : "");
    return QC_OK;
  }
  if (strcmp(grad, "d_scale") == 0 && p.sg == QS_TRAIN) {
    qc_mod_tm(tm, K, lam + 1, 0, 0, "d_scale: LSQ's terms dY (round(v) - v) or dY qmin|qmax summed in float32 over "
              "the scale's N = %lld elements (v = u / s rounded once)", (long long)K);
    return QC_OK;
  }
  return qc_err("%s: class %s has no gradient '%s'%s", m->path, m->cls ? m->cls->name : "?", grad,
                strcmp(grad, "d_scale") == 0 ? " under this contract (d_scale: scale_grad trainable only)" : "");
}
