/* modules/conv1d.c: the production VJP of Mamba-2's causal depthwise
 * convolution (mamba_ssm's conv1d over xBC), as a trainer writes it in
 * float32 from bf16 (or any float) inputs.
 *
 *   x [B, L, C] (channels last, as the mixer holds it), weight [C, K] (or
 *   torch's [C, 1, K]), bias [C] (optional); dY = dy [B, L, C].
 *   y[b, t, c] = bias[c] + sum_{k=0}^{K-1} weight[c, k] x[b, t - (K-1) + k, c]
 *   with x[b, s, c] = 0 for s < 0: torch's nn.Conv1d(C, C, K, groups=C,
 *   padding=K-1) on x^T [B, C, L], truncated to its first L outputs (tap
 *   K-1 reads the current step, tap 0 the step K-1 back).
 *   d_x[b, s, c]    = sum_{k: s + K-1-k < L} weight[c, k] dy[b, s + K-1-k, c]
 *   d_weight[c, k]  = sum_{b, t} dy[b, t, c] x[b, t - (K-1) + k, c]
 *   d_bias[c]       = sum_{b, t} dy[b, t, c]
 * float32 products and sequential float32 sums; float32 gradients (d_weight
 * in the weight's shape). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/qc.h"
#include "model/modinfo.h"
#include "model/module.h"
#include "modules/classes.h"
#include "modules/mod_util.h"

typedef struct {
  const qc_tensor *x, *w, *bias; /* bias: NULL when the dump has none */
  int64_t B, L, C, K;
} conv_view;

/* Resolve m's tensors into v: x [B, L, C], weight [C, K] or [C, 1, K],
 * optional bias [C]. QC_EINPUT naming the dataset when a shape disagrees. */
static int conv_view_get(const qc_module *m, conv_view *v) {
  int rc;
  char s1[96];
  memset(v, 0, sizeof *v);
  if ((rc = qc_module_need(m, "inputs", "x", 3, 3, &v->x))) return rc;
  if ((rc = qc_module_need(m, "params", "weight", 2, 3, &v->w))) return rc;
  v->B = v->x->shape[0];
  v->L = v->x->shape[1];
  v->C = v->x->shape[2];
  const qc_tensor *w = v->w;
  if (w->shape[0] != v->C || (w->ndim == 3 && w->shape[1] != 1))
    return qc_err("%s: 'params/weight' is %s: expected [C, K] or [C, 1, K] with C = %lld (x is [B, L, C]; depthwise)", m->path,
                  qc_shape_str(w->ndim, w->shape, s1, sizeof s1), (long long)v->C);
  v->K = w->shape[w->ndim - 1];
  if (v->K < 1) return qc_err("%s: 'params/weight' has kernel width 0: expected K >= 1", m->path);
  v->bias = qc_tset_get(&m->params, "bias");
  if (v->bias && (v->bias->ndim != 1 || v->bias->shape[0] != v->C))
    return qc_err("%s: 'params/bias' is %s: expected [C] = [%lld]", m->path,
                  qc_shape_str(v->bias->ndim, v->bias->shape, s1, sizeof s1), (long long)v->C);
  return QC_OK;
}

/* The class's production VJP of m (x [B, L, C], weight [C, K] or
 * [C, 1, K], bias [C]) for dyt [B, L, C]: d_x [B, L, C], d_weight (the
 * weight's shape), d_bias [C] (when m has a bias), float32, added to
 * grads. Returns a status. */
static int conv1d_vjp(const qc_ctx *ctx, const qc_module *m, const qc_tensor *dyt, qc_tset *grads) {
  (void)ctx;
  conv_view v;
  int rc = conv_view_get(m, &v);
  if (rc) return rc;
  if ((rc = qc_module_check_dy(m, dyt, qc_numel(v.x), v.C, "the shape of inputs/x [B, L, C]"))) return rc;
  const int64_t B = v.B, L = v.L, C = v.C, K = v.K;
  float *x = qc_mod_f32(v.x, "conv1d x"), *w = qc_mod_f32(v.w, "conv1d weight"), *dy = qc_mod_f32(dyt, "conv1d dY");
  float *gx, *gw, *gb = NULL;
  rc = QC_ESYS;
  if (!x || !w || !dy) goto done;
  if ((rc = qc_mod_add(grads, "d_x", QC_F32, 3, v.x->shape, (void **)&gx))) goto done;
  if ((rc = qc_mod_add(grads, "d_weight", QC_F32, v.w->ndim, v.w->shape, (void **)&gw))) goto done;
  if (v.bias && (rc = qc_mod_add(grads, "d_bias", QC_F32, 1, v.bias->shape, (void **)&gb))) goto done;
#define IX(b, t, c) ((((b) * L) + (t)) * C + (c))
  /* d_x: the transposed (anti-causal) correlation, over the K taps */
  for (int64_t b = 0; b < B; b++)
    for (int64_t s = 0; s < L; s++)
      for (int64_t c = 0; c < C; c++) {
        float acc = 0.0f;
        for (int64_t k = 0; k < K; k++) {
          const int64_t t = s + (K - 1) - k;
          if (t >= L) continue;
          acc += w[c * K + k] * dy[IX(b, t, c)];
        }
        gx[IX(b, s, c)] = acc;
      }
  /* d_weight[c, k]: over the B x L outputs (sequential float32 sum) */
  for (int64_t c = 0; c < C; c++)
    for (int64_t k = 0; k < K; k++) {
      float acc = 0.0f;
      for (int64_t b = 0; b < B; b++)
        for (int64_t t = 0; t < L; t++) {
          const int64_t s = t - (K - 1) + k;
          if (s >= 0 && s < L) acc += dy[IX(b, t, c)] * x[IX(b, s, c)];
        }
      gw[c * K + k] = acc;
    }
  if (gb)
    for (int64_t c = 0; c < C; c++) {
      float acc = 0.0f;
      for (int64_t b = 0; b < B; b++)
        for (int64_t t = 0; t < L; t++)
          acc += dy[IX(b, t, c)];
      gb[c] = acc;
    }
#undef IX
  rc = QC_OK;
done:
  free(x); free(w); free(dy);
  return rc;
}

/* Float64 forward y [B, L, C] of m (x [B, L, C], weight [C, K], bias [C])
 * by the definition, for `fd`; no discrete branch. Returns a status. */
static int conv1d_forward(const qc_module *m, const qc_module *branch, qc_tensor *y) {
  (void)branch;
  conv_view v;
  int rc = conv_view_get(m, &v);
  if (rc) return rc;
  const int64_t B = v.B, L = v.L, C = v.C, K = v.K;
  double *x = qc_mod_f64(v.x, "conv1d x"), *w = qc_mod_f64(v.w, "conv1d weight");
  double *bias = v.bias ? qc_mod_f64(v.bias, "conv1d bias") : NULL;
  rc = QC_ESYS;
  if (!x || !w || (v.bias && !bias)) goto done;
  if ((rc = qc_tensor_alloc(y, "y", QC_F64, 3, v.x->shape))) goto done;
  double *Y = y->data;
  for (int64_t b = 0; b < B; b++)
    for (int64_t t = 0; t < L; t++)
      for (int64_t c = 0; c < C; c++) {
        double acc = bias ? bias[c] : 0.0;
        for (int64_t k = 0; k < K; k++) {
          const int64_t s = t - (K - 1) + k;
          if (s >= 0) acc += w[c * K + k] * x[(b * L + s) * C + c];
        }
        Y[(b * L + t) * C + c] = acc;
      }
  rc = QC_OK;
done:
  free(x); free(w); free(bias);
  return rc;
}

/* The error model of gradient `grad` of m (x [B, L, C], weight [C, K]) into
 * tm: d_x sums K taps; d_weight and d_bias sum over the B x L outputs
 * (sequential float32 sums, lambda 1). QC_EINPUT for another name. */
static int conv1d_tol_model(const qc_module *m, const qc_tensor *dy, const char *grad, qc_tol_model *tm) {
  (void)dy;
  conv_view v;
  int rc = conv_view_get(m, &v);
  if (rc) return rc;
  const int64_t BL = v.B * v.L;
  if (strcmp(grad, "d_x") == 0)
    qc_mod_tm(tm, v.K, 1, 0, 0, "d_x sums weight dy over the K = %lld taps", (long long)v.K);
  else if (strcmp(grad, "d_weight") == 0)
    qc_mod_tm(tm, BL, 1, 0, 0, "d_weight[c, k] sums dy x over the B x L = %lld outputs", (long long)BL);
  else if (strcmp(grad, "d_bias") == 0)
    qc_mod_tm(tm, BL, 1, 0, 0, "d_bias[c] sums dy over the B x L = %lld outputs", (long long)BL);
  else
    return qc_err("%s: class conv1d has no gradient '%s'", m->path, grad);
  return QC_OK;
}

/* Generated conv1d into m, dY's shape [B, L, C] into ondim, oshape: shape
 * [B, L, C, K] or [B, L, C, K, 0] (no bias). Returns a status.
 * x ~ N(0,1), weight ~ N(0,1)/sqrt(K), bias ~ 0.1 N(0,1), bf16 (weight
 * [C, K]). values = "special": a zero x row, +-3e4 and 1e-30 in x;
 * "heavy_tail": x divided by 0.05 + U(0,1). */
static int conv1d_generate(const qc_gen *gp, qc_rng *rng, qc_module *m, int *ondim, int64_t *oshape) {
  if (gp->nshape != 4 && gp->nshape != 5)
    return qc_err("conv1d: generate shape needs [B, L, C, K] (batch, sequence, channels, kernel width), or [B, L, C, K, 0] "
                  "without a bias, got %d entries", gp->nshape);
  const int64_t B = gp->shape[0], L = gp->shape[1], C = gp->shape[2], K = gp->shape[3];
  if (B < 1 || L < 1 || C < 1 || K < 1) return qc_err("conv1d: generate shape needs B, L, C, K >= 1");
  const int bias = gp->nshape == 4 || gp->shape[4] != 0;
  const int64_t xs[3] = {B, L, C}, ws[2] = {C, K}, bs[1] = {C};
  uint16_t *x, *w, *b;
  int rc;
  if ((rc = qc_mod_gen_bf16(&m->inputs, "x", 3, xs, rng, 1.0, &x))) return rc;
  if ((rc = qc_mod_gen_bf16(&m->params, "weight", 2, ws, rng, 1.0 / sqrt((double)K), &w))) return rc;
  if (bias && (rc = qc_mod_gen_bf16(&m->params, "bias", 1, bs, rng, 0.1, &b))) return rc;
  static const float ext[] = {3e4f, -3e4f, 1e-30f};
  qc_mod_values(gp, rng, x, B * L, C, ext, 3);
  *ondim = 3;
  memcpy(oshape, xs, sizeof xs);
  return QC_OK;
}

static const qc_key_spec conv1d_keys[] = {{NULL, NULL, NULL, NULL}};

/* ---- coverage (model/modinfo.h) ---- */

/* Tokens B L and sequence length L of x [B, L, C]. */
static int conv1d_cov_tokens(const qc_module *m, int64_t *tokens, int64_t *seqlen) {
  const qc_tensor *t = qc_tset_get(&m->inputs, "x");
  if (!t || t->ndim != 3) return 0;
  *tokens = t->shape[0] * t->shape[1];
  *seqlen = t->shape[1];
  return 1;
}

static const qc_class_cov conv1d_cov[] = {
    {.item = "context_lengths"},
    {NULL, NULL, NULL},
};

/* The class's reading of m for the engine's validation (qc_module_validate). */
static int conv1d_validate(const qc_module *m, const qc_tensor *dy) {
  conv_view v;
  int rc = conv_view_get(m, &v);
  return rc ? rc : qc_module_check_dy(m, dy, qc_numel(v.x), v.C, "the shape of inputs/x [B, L, C]");
}

const qc_class qc_class_conv1d = {
    .name = "conv1d",
    .summary = "Mamba-2 causal depthwise conv1d, y[t] = b + sum_k w[k] x[t-(K-1)+k]: d_x, d_weight, d_bias",
    .tensors = "inputs/x params/weight params/bias outputs/y",
    .grads = "d_x d_weight d_bias",
    .shape_help = "[B, L, C, K] or [B, L, C, K, 0] (no bias): batch, sequence, channels, kernel width",
    .keys = conv1d_keys,
    .generate = conv1d_generate,
    .production = conv1d_vjp,
    .not_checked = "",
    .forward = conv1d_forward,
    .fd_shape = "2,9,5,4",
    .tol_model = conv1d_tol_model,
    .validate = conv1d_validate,
    .hypotheses = "factor sign rows zero dy_precision nonfinite",
    .coverage = conv1d_cov,
    .cov_tokens = conv1d_cov_tokens,
};
