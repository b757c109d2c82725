/* modules/swiglu.c: the production SwiGLU VJP with the optional clamp, as
 * DS4's dynamic_clamped_swiglu_vjp: closed form, float32.
 *
 *   gate, up [T, F];  L = limit (0: no clamp)
 *   g' = min(gate, L), u' = clamp(up, -L, L)           (the GPT-OSS/DS4 clamp)
 *   forward  y = silu(g') * u',  silu(z) = z sigmoid(z)
 *   d_gate   dy * u' * silu'(g') * [gate passes],  silu'(z) = s (1 + z (1 - s))
 *   d_up     dy * silu(g') * [up passes]
 * The clamp's derivative: 1 strictly inside the limit, 0 strictly beyond it,
 * and at exactly +-L: 1 with at_limit = pass (torch.clamp's choice), 0 with
 * at_limit = block. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "model/modinfo.h"
#include "model/module.h"
#include "modules/classes.h"
#include "numerics/formats.h"
#include "core/qc.h"
#include "modules/mod_util.h"

static const qc_key_spec swiglu_keys[] = {
    {"limit", NULL, "0", "clamp limit L: gate <= L, -L <= up <= L (0: no clamp)"},
    {"at_limit", "pass|block", "pass", "clamp derivative at exactly +-L: 1 (pass, torch.clamp) or 0 (block)"},
    {NULL, NULL, NULL, NULL}};

/* gate, up and the clamp settings of a swiglu module. */
typedef struct {
  const qc_tensor *gate, *up;
  double L;
  int block;
} swiglu_view;

static int swiglu_view_get(const qc_module *m, swiglu_view *v) {
  int rc;
  char s1[64], s2[64];
  if ((rc = qc_module_need(m, "inputs", "gate", 1, QC_MAXDIM, &v->gate))) return rc;
  if ((rc = qc_module_need(m, "inputs", "up", 1, QC_MAXDIM, &v->up))) return rc;
  if (!qc_shape_eq(v->gate, v->up))
    return qc_err("%s: 'inputs/gate' %s and 'inputs/up' %s: expected the same shape", m->path,
                  qc_shape_str(v->gate->ndim, v->gate->shape, s1, sizeof s1), qc_shape_str(v->up->ndim, v->up->shape, s2, sizeof s2));
  v->L = qc_contract_num(&m->contract, "limit", 0);
  v->block = strcmp(qc_contract_str(&m->contract, "at_limit", "pass"), "block") == 0;
  if (!(v->L >= 0)) return qc_err("%s: contract key 'limit' is %g: expected >= 0 (0: no clamp)", m->path, v->L);
  return QC_OK;
}

/* 1 when value z lies where the clamp to [lo, hi] passes the gradient. */
static int clamp_passes(double z, double lo, double hi, int block) {
  return block ? (z > lo && z < hi) : (z >= lo && z <= hi);
}

/* Production VJP (see the file comment). */
static int swiglu_vjp(const qc_ctx *ctx, const qc_module *m, const qc_tensor *dy, qc_tset *grads) {
  (void)ctx;
  swiglu_view v;
  int rc = swiglu_view_get(m, &v);
  if (rc) return rc;
  if ((rc = qc_module_check_dy(m, dy, qc_numel(v.gate), v.gate->shape[v.gate->ndim - 1], "the shape of inputs/gate"))) return rc;
  const int64_t n = qc_numel(v.gate);
  const float L = (float)v.L;
  float *g = qc_mod_f32(v.gate, "swiglu gate"), *u = qc_mod_f32(v.up, "swiglu up"), *d = qc_mod_f32(dy, "swiglu dY");
  float *dg, *du;
  rc = QC_ESYS;
  if (!g || !u || !d) goto done;
  if ((rc = qc_mod_add(grads, "d_gate", QC_F32, v.gate->ndim, v.gate->shape, (void **)&dg))) goto done;
  if ((rc = qc_mod_add(grads, "d_up", QC_F32, v.up->ndim, v.up->shape, (void **)&du))) goto done;
  for (int64_t i = 0; i < n; i++) {
    float gc = g[i], uc = u[i];
    int gp = 1, up = 1;
    if (L > 0) {
      gp = clamp_passes(g[i], -INFINITY, L, v.block);
      up = clamp_passes(u[i], -L, L, v.block);
      gc = fminf(g[i], L);
      uc = fminf(fmaxf(u[i], -L), L);
    }
    float s = 1.0f / (1.0f + expf(-gc));
    dg[i] = gp ? d[i] * uc * (s * (1.0f + gc * (1.0f - s))) : 0.0f;
    du[i] = up ? d[i] * (gc * s) : 0.0f;
  }
  rc = QC_OK;
done:
  free(g); free(u); free(d);
  return rc;
}

/* The error model (see qc_tol_model): elementwise float32 (K = 1), a few
 * roundings and expf's ulps per element: lambda 4 for d_gate (silu' and
 * the product, ~8 roundings), 3 for d_up (silu, 3-4 roundings). */
static int swiglu_tol_model(const qc_module *m, const qc_tensor *dy, const char *grad, qc_tol_model *tm) {
  (void)dy;
  if (strcmp(grad, "d_gate") == 0)
    qc_mod_tm(tm, 1, 4, 0, 0, "elementwise (K = 1): clamped silu'(gate) up dY in float32, ~8 roundings plus expf; lambda 4");
  else if (strcmp(grad, "d_up") == 0)
    qc_mod_tm(tm, 1, 3, 0, 0, "elementwise (K = 1): silu(gate) dY in float32, 3-4 roundings plus expf; lambda 3");
  else
    return qc_err("%s: class swiglu has no gradient '%s'", m->path, grad);
  return QC_OK;
}

/* Hypothesis: the clamp's derivative ignored (gradient passed where the
 * contract clamps), in float64. */
static int swiglu_no_clamp(const qc_ctx *ctx, const qc_module *m, const qc_tensor *dy, const char *grad, const qc_tensor *cand, qc_tensor *pred,
                           char *detail, size_t n) {
  (void)ctx;
  (void)cand;
  swiglu_view v;
  int rc = swiglu_view_get(m, &v);
  if (rc) return rc;
  if (!(v.L > 0)) return QC_NA;
  const int64_t N = qc_numel(v.gate);
  double *g = qc_mod_f64(v.gate, "swiglu gate"), *u = qc_mod_f64(v.up, "swiglu up"), *d = qc_mod_f64(dy, "swiglu dY");
  int64_t clamped = 0;
  rc = QC_ESYS;
  if (!g || !u || !d || qc_numel(dy) != N) goto done;
  if ((rc = qc_tensor_alloc(pred, grad, QC_F64, v.gate->ndim, v.gate->shape))) goto done;
  double *o = pred->data;
  int dgate = strcmp(grad, "d_gate") == 0;
  for (int64_t i = 0; i < N; i++) {
    double gc = fmin(g[i], v.L), uc = fmin(fmax(u[i], -v.L), v.L), s = 1.0 / (1.0 + exp(-gc));
    clamped += dgate ? !clamp_passes(g[i], -INFINITY, v.L, v.block) : !clamp_passes(u[i], -v.L, v.L, v.block);
    o[i] = dgate ? d[i] * uc * s * (1.0 + gc * (1.0 - s)) : d[i] * gc * s;
  }
  snprintf(detail, n, "%lld element(s) of inputs/%s lie outside the clamp (limit %g)", (long long)clamped,
           dgate ? "gate" : "up", v.L);
  rc = clamped ? QC_OK : QC_NA;
done:
  free(g); free(u); free(d);
  return rc;
}

static const qc_hypothesis swiglu_hyps[] = {
    {"clamp_ignored", "/d_gate/d_up/", "the clamp's derivative ignored: gradient passed where the input is clamped", NULL,
     0, swiglu_no_clamp, 0},
    {NULL, NULL, NULL, NULL, 0, NULL, 0}};

/* Float64 forward; which side of the limit each value is on is taken from
 * branch (a value held at the limit stays there under perturbation). */
static int swiglu_forward(const qc_module *m, const qc_module *branch, qc_tensor *y) {
  swiglu_view v, bv;
  int rc;
  if ((rc = swiglu_view_get(m, &v)) || (rc = swiglu_view_get(branch, &bv))) return rc;
  const int64_t n = qc_numel(v.gate);
  double *g = qc_mod_f64(v.gate, "swiglu gate"), *u = qc_mod_f64(v.up, "swiglu up");
  double *bg = qc_mod_f64(bv.gate, "swiglu gate"), *bu = qc_mod_f64(bv.up, "swiglu up");
  rc = QC_ESYS;
  if (!g || !u || !bg || !bu) goto done;
  if ((rc = qc_tensor_alloc(y, "y", QC_F64, v.gate->ndim, v.gate->shape))) goto done;
  for (int64_t i = 0; i < n; i++) {
    double gc = g[i], uc = u[i];
    if (v.L > 0) {
      if (!clamp_passes(bg[i], -INFINITY, v.L, v.block)) gc = v.L;
      if (!clamp_passes(bu[i], -v.L, v.L, v.block)) uc = bu[i] > 0 ? v.L : -v.L;
    }
    ((double *)y->data)[i] = gc / (1.0 + exp(-gc)) * uc;
  }
  rc = QC_OK;
done:
  free(g); free(u); free(bg); free(bu);
  return rc;
}

/* Generated swiglu: shape [T, F]. gate, up ~ 3 N(0,1) bf16, so a few
 * percent fall beyond a limit of 7. values = "special": zero rows and
 * entries exactly at +-7 and beyond (+-10), +-3e4, 1e-30. */
static int swiglu_generate(const qc_gen *gp, qc_rng *rng, qc_module *m, int *ondim, int64_t *oshape) {
  if (gp->nshape != 2) return qc_err("swiglu: generate shape needs [T, F] (tokens, intermediate size), got %d entries", gp->nshape);
  if (gp->shape[0] < 1 || gp->shape[1] < 1) return qc_err("swiglu: generate shape entries must be >= 1");
  uint16_t *g, *u;
  int rc;
  if ((rc = qc_mod_gen_bf16(&m->inputs, "gate", 2, gp->shape, rng, 3.0, &g))) return rc;
  if ((rc = qc_mod_gen_bf16(&m->inputs, "up", 2, gp->shape, rng, 3.0, &u))) return rc;
  static const float eg[] = {7.0f, 10.0f, -7.0f, 3e4f, -3e4f, 1e-30f};
  static const float eu[] = {-7.0f, 7.0f, -10.0f, 10.0f, 3e4f, 1e-30f};
  qc_mod_values(gp, rng, g, gp->shape[0], gp->shape[1], eg, 6);
  qc_mod_values(gp, rng, u, gp->shape[0], gp->shape[1], eu, 6);
  *ondim = 2;
  memcpy(oshape, gp->shape, 2 * sizeof *oshape);
  return QC_OK;
}

/* ---- coverage (model/modinfo.h) ---- */

/* The threshold applies under a clamp limit. */
static int swiglu_limited(const char *cj) { return qc_cov_num(cj, "limit") > 0; }

/* The gate and up on both sides of the clamp limit L, and beyond it. */
static void swiglu_cov_facts(const qc_module *m, const qc_modinfo *mi, uint32_t *cover) {
  qc_cov_limit(qc_tset_get(&m->inputs, "gate"), qc_cov_num(mi->contract, "limit"), cover);
  qc_cov_limit(qc_tset_get(&m->inputs, "up"), qc_cov_num(mi->contract, "limit"), cover);
}

static const qc_class_cov swiglu_cov[] = {
    {.item = "threshold", .how = "a clamp limit L (gate, up)", .applies = swiglu_limited},
    {.item = "saturation", .how = "the clamp limit L (gate, up)", .applies = swiglu_limited},
    {NULL, NULL, NULL},
};

/* The class's reading of m for the engine's validation (qc_module_validate). */
static int swiglu_validate(const qc_module *m, const qc_tensor *dy) {
  swiglu_view v;
  int rc = swiglu_view_get(m, &v);
  return rc ? rc : qc_module_check_dy(m, dy, qc_numel(v.gate), v.gate->shape[v.gate->ndim - 1], "the shape of inputs/gate");
}

const qc_class qc_class_swiglu = {
    .name = "swiglu",
    .summary = "y = silu(min(gate, L)) * clamp(up, -L, L): d_gate, d_up, clamp derivative per at_limit",
    .tensors = "inputs/gate inputs/up outputs/y",
    .grads = "d_gate d_up",
    .shape_help = "[T, F]: tokens, intermediate size (gate and up each [T, F])",
    .keys = swiglu_keys,
    .generate = swiglu_generate,
    .production = swiglu_vjp,
    .not_checked = "",
    .forward = swiglu_forward,
    .fd_shape = "9,21",
    .tol_model = swiglu_tol_model,
    .validate = swiglu_validate,
    .round_ops = 2, /* reference variants: a bf16 model's ops rounded once each (torch 2), or every step (torch 1.13's CPU) */
    .hypotheses = "factor sign rows zero dy_precision nonfinite",
    .hyps = swiglu_hyps,
    .coverage = swiglu_cov,
    .cov_facts = swiglu_cov_facts,
};
