/* modules/rmsnorm.c: the production RMSNorm VJP (and the shared norm core
 * that modules/layernorm.c uses), as DS4's closed-form FP32 backward.
 *
 *   forward  y = (x - mu) * rstd * w (+ b)        x [..., D], w [D], b [D]
 *            rmsnorm: mu = 0, rstd = 1/sqrt(mean(x^2) + eps)
 *            layernorm: mu = mean(x), rstd = 1/sqrt(mean((x-mu)^2) + eps)
 *   d_x      rstd * (g - mean(g) - xh * mean(g * xh)),  g = dy * w, xh = (x - mu) * rstd
 *            (rmsnorm drops the mean(g) term)
 *   d_weight sum over tokens of dy * xh
 *   d_bias   sum over tokens of dy                  (layernorm with params/bias)
 *   rmsnorm zero_centered = true (Gemma): the scale is (1 + w), formed in
 *   float32; g = dy * (1 + w), d_weight unchanged (d(1 + w)/dw = 1).
 *
 * Statistics, the per-row sums and the token reductions run in float32
 * (sequential, like a straightforward fused kernel); outputs are float32. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "model/module.h"
#include "numerics/formats.h"
#include "core/par.h"
#include "core/qc.h"
#include "modules/classes.h"
#include "modules/mod_util.h"
#include "modules/norm.h"

/* 1 when m's contract scales by (1 + w) (rmsnorm's zero_centered key). */
static int zero_centered(const qc_module *m) {
  return strcmp(qc_contract_str(&m->contract, "zero_centered", "false"), "true") == 0;
}

/* The tensors of a norm module: x [rows, D], weight [D], optional bias. */
typedef struct {
  const qc_tensor *x, *w, *b;
  int64_t rows, D;
} norm_view;

static int norm_view_get(const qc_module *m, int center, norm_view *v) {
  int rc;
  memset(v, 0, sizeof *v);
  if ((rc = qc_module_need(m, "inputs", "x", 1, QC_MAXDIM, &v->x))) return rc;
  if ((rc = qc_module_need(m, "params", "weight", 1, 1, &v->w))) return rc;
  v->b = center ? qc_tset_get(&m->params, "bias") : NULL;
  v->D = v->x->shape[v->x->ndim - 1];
  v->rows = qc_numel(v->x) / v->D;
  if (v->w->shape[0] != v->D)
    return qc_err("%s: 'params/weight' has %lld elements but 'inputs/x' has %lld features: expected weight [%lld]", m->path,
                  (long long)v->w->shape[0], (long long)v->D, (long long)v->D);
  if (v->b && (v->b->ndim != 1 || v->b->shape[0] != v->D))
    return qc_err("%s: 'params/bias' must be [%lld]", m->path, (long long)v->D);
  double eps = qc_contract_num(&m->contract, "eps", center ? 1e-5 : 1e-6);
  if (!(eps >= 0)) return qc_err("%s: contract key 'eps' is %g: expected >= 0", m->path, eps);
  return QC_OK;
}

/* Production VJP (see the file comment); center = 1 for layernorm. */
int qc_mod_norm_vjp(const qc_ctx *ctx, const qc_module *m, const qc_tensor *dy, qc_tset *grads, int center) {
  (void)ctx;
  norm_view v;
  int rc = norm_view_get(m, center, &v);
  if (rc) return rc;
  if ((rc = qc_module_check_dy(m, dy, qc_numel(v.x), v.x->shape[v.x->ndim - 1], "the shape of inputs/x"))) return rc;
  const int64_t R = v.rows, D = v.D;
  const float eps = (float)qc_contract_num(&m->contract, "eps", center ? 1e-5 : 1e-6);
  float *x = qc_mod_f32(v.x, "norm input"), *w = qc_mod_f32(v.w, "norm weight"), *g = qc_mod_f32(dy, "norm dY");
  float *dx, *dw, *db = NULL;
  rc = QC_ESYS;
  if (!x || !w || !g) goto done;
  if (zero_centered(m))
    for (int64_t i = 0; i < D; i++) w[i] = 1.0f + w[i]; /* Gemma's (1 + w), in float32 */
  if ((rc = qc_mod_add(grads, "d_x", QC_F32, v.x->ndim, v.x->shape, (void **)&dx))) goto done;
  if ((rc = qc_mod_add(grads, "d_weight", QC_F32, 1, &D, (void **)&dw))) goto done;
  if (v.b && (rc = qc_mod_add(grads, "d_bias", QC_F32, 1, &D, (void **)&db))) goto done;
  for (int64_t r = 0; r < R; r++) {
    const float *xr = x + r * D, *gr = g + r * D;
    float mu = 0.0f, var = 0.0f, sg = 0.0f, sgx = 0.0f;
    if (center) {
      for (int64_t i = 0; i < D; i++) mu += xr[i];
      mu /= (float)D;
    }
    for (int64_t i = 0; i < D; i++) var += (xr[i] - mu) * (xr[i] - mu);
    const float rstd = 1.0f / sqrtf(var / (float)D + eps);
    for (int64_t i = 0; i < D; i++) {
      float xh = (xr[i] - mu) * rstd, gw = gr[i] * w[i];
      sg += gw;
      sgx += gw * xh;
      dw[i] += gr[i] * xh;
      if (db) db[i] += gr[i];
    }
    const float msg = center ? sg / (float)D : 0.0f, msgx = sgx / (float)D;
    for (int64_t i = 0; i < D; i++) dx[r * D + i] = rstd * (gr[i] * w[i] - msg - (xr[i] - mu) * rstd * msgx);
  }
  rc = QC_OK;
done:
  free(x); free(w); free(g);
  return rc;
}

/* A norm's float64 passes on qc_par_for's threads: rows alone (the
 * forward, the terms' row statistics and d_x sums), or features alone over
 * the rows in order (the terms of d_weight and d_bias), so any thread
 * count gives the same values. */
typedef struct norm_pass {
  const double *x, *w, *b, *g; /* [R, D], [D], [D] or NULL, [R, D] */
  double *y;                   /* the forward's [R, D] */
  int64_t D, R;
  int center, which;           /* which: the terms of d_x 0, d_weight 1, d_bias 2 */
  double eps;
  double *mu, *rstd, *rss;     /* [R]: each row's mean, 1/std, and its d_x terms' sum of squares */
  double *col;                 /* [D]: the terms of d_weight or d_bias */
} norm_pass;

/* A row's float64 mean (0 unless center) and mean square about it, each
 * term divided by D as it is added. */
static void row_stats(const double *xr, int64_t D, int center, double *mu, double *ms) {
  double m = 0, v = 0;
  for (int64_t i = 0; center && i < D; i++) m += xr[i] / (double)D;
  for (int64_t i = 0; i < D; i++) v += (xr[i] - m) * (xr[i] - m) / (double)D;
  *mu = m;
  *ms = v;
}

static void fwd_rows(void *ctx, int64_t lo, int64_t hi, int tid) {
  (void)tid;
  const norm_pass *p = ctx;
  const int64_t D = p->D;
  for (int64_t r = lo; r < hi; r++) {
    const double *xr = p->x + r * D;
    double mu, ms;
    row_stats(xr, D, p->center, &mu, &ms);
    for (int64_t i = 0; i < D; i++) p->y[r * D + i] = (xr[i] - mu) / sqrt(ms + p->eps) * p->w[i] + (p->b ? p->b[i] : 0.0);
  }
}

/* The terms' row statistics of rows [lo, hi), and under which 0 each row's
 * sum of d_x's squared terms (see qc_mod_norm_tol_model). */
static void terms_rows(void *ctx, int64_t lo, int64_t hi, int tid) {
  (void)tid;
  const norm_pass *p = ctx;
  const int64_t D = p->D;
  const double *w = p->w;
  for (int64_t r = lo; r < hi; r++) {
    const double *xr = p->x + r * D, *gr = p->g + r * D;
    double mu, var, sa = 0, sax = 0, sac = 0, ss = 0;
    row_stats(xr, D, p->center, &mu, &var);
    const double rstd = 1.0 / sqrt(var + p->eps);
    p->mu[r] = mu;
    p->rstd[r] = rstd;
    p->rss[r] = 0;
    if (p->which) continue;
    for (int64_t i = 0; i < D; i++) {
      double c = (fabs(xr[i]) + fabs(mu)) * rstd, a = fabs(gr[i] * w[i]);
      sa += a;
      sax += a * fabs(xr[i] - mu) * rstd;
      sac += a * c;
    }
    for (int64_t i = 0; i < D; i++) {
      double c = (fabs(xr[i]) + fabs(mu)) * rstd;
      /* d_x = rstd (g - mean g - xh mean(g xh)), xh off by up to u c */
      double t = rstd * (fabs(gr[i] * w[i]) + sa / (double)D + c * sax / (double)D + fabs(xr[i] - mu) * rstd * sac / (double)D);
      if (isfinite(t)) ss += t * t;
    }
    p->rss[r] = ss;
  }
}

/* The terms of d_weight (|dY| c) or d_bias (|dY|) for features [lo, hi). */
static void terms_cols(void *ctx, int64_t lo, int64_t hi, int tid) {
  (void)tid;
  const norm_pass *p = ctx;
  const int64_t D = p->D;
  for (int64_t r = 0; r < p->R; r++) {
    const double *xr = p->x + r * D, *gr = p->g + r * D, mu = p->mu[r], rstd = p->rstd[r];
    for (int64_t i = lo; i < hi; i++)
      p->col[i] += p->which == 1 ? fabs(gr[i]) * ((fabs(xr[i]) + fabs(mu)) * rstd) : fabs(gr[i]);
  }
}

/* The error model of each gradient (see qc_tol_model): d_x reads row
 * statistics that are float32 sums over the D features (lambda 2 for the
 * several sums), d_weight sums over the tokens of xh, which carries rstd's
 * length-D error (K = T + D), d_bias sums dY over the tokens. */
int qc_mod_norm_validate(const qc_module *m, const qc_tensor *dy, int center) {
  norm_view v;
  int rc = norm_view_get(m, center, &v);
  return rc ? rc : qc_module_check_dy(m, dy, qc_numel(v.x), v.D, "the shape of inputs/x");
}

int qc_mod_norm_tol_model(const qc_module *m, const qc_tensor *dy, const char *grad, qc_tol_model *tm, int center) {
  norm_view v;
  int rc = norm_view_get(m, center, &v);
  if (rc) return rc;
  if (strcmp(grad, "d_x") == 0)
    qc_mod_tm(tm, v.D, 2, 0, 0, "d_x reads the row statistics, float32 sums over the D = %lld features (%s); lambda 2 "
              "for those several sums", (long long)v.D, center ? "mean, variance, <g>, <g, xh>" : "mean square, <g, xh>");
  else if (strcmp(grad, "d_weight") == 0)
    qc_mod_tm(tm, v.rows + v.D, 1, 0, 0, "d_weight sums dY xh over the T = %lld tokens, xh carrying rstd's length-D "
              "error: K = T + D = %lld", (long long)v.rows, (long long)(v.rows + v.D));
  else if (strcmp(grad, "d_bias") == 0 && v.b)
    qc_mod_tm(tm, v.rows, 1, 0, 0, "d_bias sums dY over the T = %lld tokens", (long long)v.rows);
  else
    return qc_err("%s: class %s has no gradient '%s'", m->path, center ? "layernorm" : "rmsnorm", grad);
  /* the terms' scale, each xh weighted by its conditioning c = (|x| + |mu|)
   * rstd: a row constant to an ulp has x - mu of an ulp, and float32's mean
   * (error u |mu|) makes xh's error u c, not u |xh| */
  if ((rc = qc_module_check_dy(m, dy, qc_numel(v.x), v.D, "the shape of inputs/x"))) return rc;
  const int64_t R = v.rows, D = v.D;
  const double eps = qc_contract_num(&m->contract, "eps", center ? 1e-5 : 1e-6);
  double *x = qc_mod_f64(v.x, "norm input"), *w = qc_mod_f64(v.w, "norm weight"), *g = qc_mod_f64(dy, "norm dY");
  double *col = calloc((size_t)D, sizeof *col), *st = qc_malloc((size_t)(3 * R + 1) * sizeof *st, "norm rows");
  double ss = 0;
  rc = QC_ESYS;
  if (!x || !w || !g || !col || !st) goto done;
  norm_pass p = {.x = x, .w = w, .g = g, .D = D, .center = center, .eps = eps, .mu = st, .rstd = st + R, .rss = st + 2 * R};
  p.which = strcmp(grad, "d_x") == 0 ? 0 : strcmp(grad, "d_weight") == 0 ? 1 : 2;
  qc_par_for(R, 16, terms_rows, &p);
  for (int64_t r = 0; p.which == 0 && r < R; r++) ss += p.rss[r]; /* row by row, in order: any thread count, the same sum */
  if (p.which) {
    p.col = col;
    p.R = R;
    qc_par_for(D, 64, terms_cols, &p);
  }
  for (int64_t i = 0; p.which && i < D; i++)
    if (isfinite(col[i])) ss += col[i] * col[i];
  tm->terms = sqrt(ss);
  rc = QC_OK;
done:
  free(x); free(w); free(g); free(col); free(st);
  return rc;
}

/* A norm's d_x in float64 with a term dropped (the hypotheses below):
 * drop_proj leaves out xh mean(g xh), drop_mean leaves out mean(g). */
int qc_mod_norm_dx_without(const qc_module *m, const qc_tensor *dy, int center, int drop_proj, int drop_mean,
                           qc_tensor *pred) {
  norm_view v;
  int rc = norm_view_get(m, center, &v);
  if (rc) return rc;
  if ((rc = qc_module_check_dy(m, dy, qc_numel(v.x), v.D, "the shape of inputs/x"))) return rc;
  const int64_t R = v.rows, D = v.D;
  const double eps = qc_contract_num(&m->contract, "eps", center ? 1e-5 : 1e-6);
  double *x = qc_mod_f64(v.x, "norm input"), *w = qc_mod_f64(v.w, "norm weight"), *g = qc_mod_f64(dy, "norm dY");
  rc = QC_ESYS;
  if (!x || !w || !g) goto done;
  if (zero_centered(m))
    for (int64_t i = 0; i < D; i++) w[i] += 1.0;
  if ((rc = qc_tensor_alloc(pred, "d_x", QC_F64, v.x->ndim, v.x->shape))) goto done;
  double *o = pred->data;
  for (int64_t r = 0; r < R; r++) {
    const double *xr = x + r * D, *gr = g + r * D;
    double mu, var, sg = 0, sgx = 0;
    row_stats(xr, D, center, &mu, &var);
    const double rstd = 1.0 / sqrt(var + eps);
    for (int64_t i = 0; i < D; i++) {
      sg += gr[i] * w[i];
      sgx += gr[i] * w[i] * (xr[i] - mu) * rstd;
    }
    const double msg = center && !drop_mean ? sg / (double)D : 0.0, msgx = drop_proj ? 0.0 : sgx / (double)D;
    for (int64_t i = 0; i < D; i++) o[r * D + i] = rstd * (gr[i] * w[i] - msg - (xr[i] - mu) * rstd * msgx);
  }
  rc = QC_OK;
done:
  free(x); free(w); free(g);
  return rc;
}

static int rmsnorm_tol_model(const qc_module *m, const qc_tensor *dy, const char *grad, qc_tol_model *tm) {
  return qc_mod_norm_tol_model(m, dy, grad, tm, 0);
}

/* Hypothesis: d_x without the projection term xh mean(g xh). */
static int rmsnorm_no_proj(const qc_ctx *ctx, const qc_module *m, const qc_tensor *dy, const char *grad, const qc_tensor *cand, qc_tensor *pred,
                           char *detail, size_t n) {
  (void)ctx; (void)grad; (void)cand; (void)detail; (void)n;
  return qc_mod_norm_dx_without(m, dy, 0, 1, 0, pred);
}

static const qc_hypothesis rmsnorm_hyps[] = {
    {"no_projection_term", "/d_x/", "d_x without the term -xh mean(g xh) (the gradient through rstd dropped)", NULL, 0,
     rmsnorm_no_proj, 0},
    {NULL, NULL, NULL, NULL, 0, NULL, 0}};

static int rmsnorm_vjp(const qc_ctx *ctx, const qc_module *m, const qc_tensor *dy, qc_tset *grads) {
  return qc_mod_norm_vjp(ctx, m, dy, grads, 0);
}

/* Float64 forward y [rows, D]; a norm has no discrete branch. Rows on
 * qc_par_for's threads, each alone. */
int qc_mod_norm_forward(const qc_module *m, const qc_module *branch, qc_tensor *y, int center) {
  (void)branch;
  norm_view v;
  int rc = norm_view_get(m, center, &v);
  if (rc) return rc;
  const int64_t R = v.rows, D = v.D;
  const double eps = qc_contract_num(&m->contract, "eps", center ? 1e-5 : 1e-6);
  double *x = qc_mod_f64(v.x, "norm input"), *w = qc_mod_f64(v.w, "norm weight");
  double *b = v.b ? qc_mod_f64(v.b, "norm bias") : NULL;
  rc = QC_ESYS;
  if (!x || !w || (v.b && !b)) goto done;
  if (zero_centered(m))
    for (int64_t i = 0; i < D; i++) w[i] += 1.0;
  if ((rc = qc_tensor_alloc(y, "y", QC_F64, v.x->ndim, v.x->shape))) goto done;
  norm_pass p = {.x = x, .w = w, .b = b, .y = y->data, .D = D, .center = center, .eps = eps};
  qc_par_for(R, 16, fwd_rows, &p);
  rc = QC_OK;
done:
  free(x); free(w); free(b);
  return rc;
}

static int rmsnorm_forward(const qc_module *m, const qc_module *branch, qc_tensor *y) {
  return qc_mod_norm_forward(m, branch, y, 0);
}

/* Generated norm: shape [T, D] (optionally a 3rd entry 0: layernorm without
 * bias). x ~ N(0,1) (+ a per-row offset for layernorm, so centering
 * matters), weight ~ 1 + 0.1 N(0,1), bias ~ 0.1 N(0,1), all bf16. values =
 * "special": a zero row (rstd = 1/sqrt(eps)) and entries +-3e4, 1e-30, 0. */
int qc_mod_norm_generate(const qc_gen *gp, qc_rng *rng, qc_module *m, int *ondim, int64_t *oshape, int center) {
  if (gp->nshape < 2 || gp->nshape > (center ? 3 : 2))
    return qc_err("%s: generate shape needs [T, D]%s, got %d entries", center ? "layernorm" : "rmsnorm",
                  center ? " (optionally a 3rd entry 0 for no bias)" : "", gp->nshape);
  int64_t T = gp->shape[0], D = gp->shape[1];
  if (T < 1 || D < 1) return qc_err("%s: generate shape entries must be >= 1", center ? "layernorm" : "rmsnorm");
  int64_t xs[2] = {T, D};
  uint16_t *x, *w, *b;
  int rc;
  if ((rc = qc_mod_gen_bf16(&m->inputs, "x", 2, xs, rng, 1.0, &x))) return rc;
  if ((rc = qc_mod_gen_bf16(&m->params, "weight", 1, &D, rng, 0.1, &w))) return rc;
  if (!zero_centered(m)) /* zero_centered: w ~ 0.1 N(0,1), the scale 1 + w */
    for (int64_t i = 0; i < D; i++) w[i] = qc_f32_to_bf16(1.0f + qc_bf16_to_f32(w[i]));
  if (center) {
    for (int64_t t = 0; t < T; t++) {
      float off = (float)(2.0 * qc_rng_normal(rng));
      for (int64_t i = 0; i < D; i++) x[t * D + i] = qc_f32_to_bf16(qc_bf16_to_f32(x[t * D + i]) + off);
    }
    if ((gp->nshape < 3 || gp->shape[2] != 0) && (rc = qc_mod_gen_bf16(&m->params, "bias", 1, &D, rng, 0.1, &b)))
      return rc;
  }
  static const float ext[] = {3e4f, -3e4f, 1e-30f, 0.0f};
  qc_mod_values(gp, rng, x, T, D, ext, 4);
  *ondim = 2;
  oshape[0] = T;
  oshape[1] = D;
  return QC_OK;
}

static int rmsnorm_generate(const qc_gen *gp, qc_rng *rng, qc_module *m, int *ondim, int64_t *oshape) {
  return qc_mod_norm_generate(gp, rng, m, ondim, oshape, 0);
}

static const qc_key_spec rmsnorm_keys[] = {
    {"eps", NULL, "1e-6", "added to mean(x^2) inside the square root"},
    {"zero_centered", "true|false", "false", "true: y = x rstd (1 + w), Gemma's zero-centred weight; false: x rstd w"},
    {NULL, NULL, NULL, NULL}};

static int rmsnorm_validate(const qc_module *m, const qc_tensor *dy) { return qc_mod_norm_validate(m, dy, 0); }

const qc_class qc_class_rmsnorm = {
    .name = "rmsnorm",
    .summary = "y = x / sqrt(mean(x^2) + eps) * w: d_x, d_weight with float32 statistics",
    .tensors = "inputs/x params/weight outputs/y",
    .grads = "d_x d_weight",
    .shape_help = "[T, D]: tokens, hidden size",
    .keys = rmsnorm_keys,
    .generate = rmsnorm_generate,
    .production = rmsnorm_vjp,
    .not_checked = "",
    .forward = rmsnorm_forward,
    .fd_shape = "7,33",
    .tol_model = rmsnorm_tol_model,
    .validate = rmsnorm_validate,
    .hypotheses = "factor sign rows zero dy_precision nonfinite",
    .hyps = rmsnorm_hyps,
};
