/* modules/rope.c: the production rotary-embedding VJP as a trainer writes
 * it: inv_freq, angles, cos and sin computed in float32 (torch style), then
 * the transposed rotation applied to dY.
 *
 *   x [T, H, D] or [T, D], positions [T] (integers), p = position + offset
 *   pair j (j < R/2, R = rotary_dim): half layout (a, b) = (j, j + R/2),
 *   interleaved (a, b) = (2j, 2j + 1); angle = s * p * inv_freq_j,
 *   inv_freq_j = theta^(-2j/R), or inputs/inv_freq [R/2] when the dump has it
 *   (the table a scaled RoPE made: llama3, YaRN, linear, dynamic NTK),
 *   s = -1 when inverse = yes (the inverse rotation), else +1;
 *   cos and sin times the contract's scale k (YaRN's attention scaling, 1)
 *   forward  y_a = x_a cos - x_b sin,  y_b = x_a sin + x_b cos;  y_i = x_i for i >= R
 *   d_x      d_a = dy_a cos + dy_b sin,  d_b = -dy_a sin + dy_b cos;  d_i = dy_i for i >= R */
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
#include "numerics/decode.h"

static const qc_key_spec rope_keys[] = {
    {"theta", NULL, "10000", "frequency base: pair j turns at theta^(-2j/rotary_dim) per position"},
    {"rotary_dim", NULL, "0", "leading features rotated (even, <= head_dim); 0 means all of head_dim"},
    {"layout", "half|interleaved", "half", "pairs (j, j + R/2) (GPT-NeoX/Llama) or (2j, 2j + 1) (GPT-J)"},
    {"position_offset", NULL, "0", "added to every position before the angle"},
    {"inverse", "no|yes", "no", "yes: the forward rotates by -angle (inverse RoPE)"},
    {"scale", NULL, "1", "cos and sin multiplied by this (YaRN's attention scaling, transformers' attention_scaling; "
     "DeepSeek's mscale)"},
    {NULL, NULL, NULL, NULL}};

/* The tensors and sizes of a rope module. */
typedef struct {
  const qc_tensor *x, *pos;
  const qc_tensor *inv; /* inputs/inv_freq [R/2], or NULL: theta^(-2j/R) */
  int64_t T, H, D, R;
  int interleaved;
  double sign, offset, theta, scale;
} rope_view;

static int rope_view_get(const qc_module *m, rope_view *v) {
  int rc;
  memset(v, 0, sizeof *v);
  if ((rc = qc_module_need(m, "inputs", "x", 2, 3, &v->x))) return rc;
  if ((rc = qc_module_need(m, "inputs", "positions", 1, 1, &v->pos))) return rc;
  v->T = v->x->shape[0];
  v->H = v->x->ndim == 3 ? v->x->shape[1] : 1;
  v->D = v->x->shape[v->x->ndim - 1];
  double rd = qc_contract_num(&m->contract, "rotary_dim", 0);
  v->R = rd == 0 ? v->D : (int64_t)rd;
  if (v->pos->shape[0] != v->T)
    return qc_err("%s: 'inputs/positions' has %lld entries: expected %lld (one per token of 'inputs/x')", m->path,
                  (long long)v->pos->shape[0], (long long)v->T);
  if (rd != floor(rd) || v->R < 2 || v->R > v->D || v->R % 2)
    return qc_err("%s: contract key 'rotary_dim' is %g: expected an even number from 2 to head_dim %lld (0 for all)",
                  m->path, rd, (long long)v->D);
  v->interleaved = strcmp(qc_contract_str(&m->contract, "layout", "half"), "interleaved") == 0;
  v->sign = strcmp(qc_contract_str(&m->contract, "inverse", "no"), "yes") == 0 ? -1.0 : 1.0;
  v->offset = qc_contract_num(&m->contract, "position_offset", 0);
  v->theta = qc_contract_num(&m->contract, "theta", 10000);
  if (!(v->theta > 1)) return qc_err("%s: contract key 'theta' is %g: expected a number > 1", m->path, v->theta);
  v->scale = qc_contract_num(&m->contract, "scale", 1);
  if (!(v->scale > 0) || !isfinite(v->scale))
    return qc_err("%s: contract key 'scale' is %g: expected a number > 0 (cos and sin are multiplied by it)", m->path, v->scale);
  if ((v->inv = qc_tset_get(&m->inputs, "inv_freq"))) {
    if (v->inv->ndim != 1 || v->inv->shape[0] != v->R / 2 || !qc_dtype_is_float(v->inv->dtype) ||
        v->inv->dtype == QC_E2M1X2)
      return qc_err("%s: 'inputs/inv_freq' has %lld values: expected a float vector [R/2] = [%lld], one frequency per "
                    "rotary pair", m->path, (long long)qc_numel(v->inv), (long long)(v->R / 2));
    double *f = qc_mod_f64(v->inv, "rope inv_freq");
    if (!f) return QC_ESYS;
    int64_t bad = -1;
    for (int64_t j = 0; j < v->R / 2 && bad < 0; j++)
      if (!(f[j] >= 0) || !isfinite(f[j])) bad = j;
    const double fb = bad >= 0 ? f[bad] : 0;
    free(f);
    if (bad >= 0)
      return qc_err("%s: 'inputs/inv_freq'[%lld] = %g: expected a finite frequency >= 0", m->path, (long long)bad, fb);
  }
  return QC_OK;
}

/* f [R/2]: the frequencies, inputs/inv_freq as stored, else theta^(-2j/R)
 * (f32 1: 1 / theta^(2j/R) rounded to float32 as torch computes it).
 * Returns a status. */
static int rope_freqs(const rope_view *v, int f32, double *f) {
  if (v->inv) return qc_tensor_to_f64(v->inv, f);
  for (int64_t j = 0; j < v->R / 2; j++)
    f[j] = f32 ? 1.0f / powf((float)v->theta, (float)(2 * j) / (float)v->R) : pow(v->theta, -2.0 * (double)j / (double)v->R);
  return QC_OK;
}

/* Feature indices of pair j. */
static void rope_pair(const rope_view *v, int64_t j, int64_t *a, int64_t *b) {
  *a = v->interleaved ? 2 * j : j;
  *b = v->interleaved ? 2 * j + 1 : j + v->R / 2;
}

/* Production VJP (see the file comment): float32 throughout. */
static int rope_vjp(const qc_ctx *ctx, const qc_module *m, const qc_tensor *dy, qc_tset *grads) {
  (void)ctx;
  rope_view v;
  int64_t *pos = NULL;
  int rc = rope_view_get(m, &v);
  if (rc) return rc;
  if ((rc = qc_module_check_dy(m, dy, qc_numel(v.x), v.x->shape[v.x->ndim - 1], "the shape of inputs/x"))) return rc;
  if ((rc = qc_mod_ids(m, v.pos, "inputs/positions", &pos))) return rc;
  float *g = qc_mod_f32(dy, "rope dY"), *dx;
  double *inv = qc_malloc((size_t)v.R * sizeof *inv, "rope inv_freq");
  rc = QC_ESYS;
  if (!g || !inv) goto done;
  if ((rc = rope_freqs(&v, 1, inv))) goto done;
  if ((rc = qc_mod_add(grads, "d_x", QC_F32, v.x->ndim, v.x->shape, (void **)&dx))) goto done;
  memcpy(dx, g, (size_t)qc_numel(v.x) * sizeof *dx);
  const float k = (float)v.scale;
  for (int64_t t = 0; t < v.T; t++) {
    float p = (float)((double)pos[t] + v.offset);
    for (int64_t j = 0; j < v.R / 2; j++) {
      float ang = (float)v.sign * (p * (float)inv[j]), c = cosf(ang) * k, s = sinf(ang) * k;
      int64_t a, b;
      rope_pair(&v, j, &a, &b);
      for (int64_t h = 0; h < v.H; h++) {
        int64_t o = (t * v.H + h) * v.D;
        dx[o + a] = g[o + a] * c + g[o + b] * s;
        dx[o + b] = g[o + b] * c - g[o + a] * s;
      }
    }
  }
  rc = QC_OK;
done:
  free(g); free(inv); free(pos);
  return rc;
}

/* The error model: each pair's rotation is exact but for the float32 angle
 * p inv_freq_j, whose rounding (and powf's) is an absolute error ~u p
 * inv_freq_j, a relative error of the pair; its rms over the pairs is
 * ~0.7 u pmax rms(inv_freq) (measured 0.4), written as lambda sqrt(K) u with
 * K the R/2 pairs (at least 4 for sin/cos's own ulps). */
static int rope_tol_model(const qc_module *m, const qc_tensor *dy, const char *grad, qc_tol_model *tm) {
  (void)dy;
  rope_view v;
  int64_t *pos = NULL;
  int rc = rope_view_get(m, &v);
  if (rc) return rc;
  if (strcmp(grad, "d_x") != 0) return qc_err("%s: class rope has no gradient '%s'", m->path, grad);
  if ((rc = qc_mod_ids(m, v.pos, "inputs/positions", &pos))) return rc;
  double pmax = 0, s2 = 0, *f = qc_malloc((size_t)v.R * sizeof *f, "rope inv_freq");
  if (!f || (rc = rope_freqs(&v, 0, f))) {
    free(pos); free(f);
    return f ? rc : QC_ESYS;
  }
  for (int64_t t = 0; t < v.T; t++) pmax = fmax(pmax, fabs((double)pos[t] + v.offset));
  for (int64_t j = 0; j < v.R / 2; j++) s2 += f[j] * f[j] / (double)(v.R / 2);
  free(pos); free(f);
  const int64_t K = v.R / 2;
  double lambda = fmax(4.0, 0.7 * pmax * sqrt(s2) / sqrt((double)K));
  qc_mod_tm(tm, K, lambda, 0, 0, "K = %lld rotary pairs; the float32 angle p inv_freq rounds to an absolute error ~u p "
            "inv_freq, rms over the pairs ~0.7 u pmax rms(inv_freq) with pmax = %.0f: lambda %.3g", (long long)K, pmax, lambda);
  return QC_OK;
}

/* Hypotheses: the rotation's direction or the pair layout other than the contract's. */
static int rope_flip_inverse(const qc_module *m, qc_module *alt, char *detail, size_t n) {
  const char *inv = qc_contract_str(&m->contract, "inverse", "no");
  snprintf(detail, n, "the contract says inverse = %s", inv);
  return qc_contract_set(&alt->contract, "inverse", strcmp(inv, "yes") == 0 ? "no" : "yes", 0, 0);
}
static int rope_flip_layout(const qc_module *m, qc_module *alt, char *detail, size_t n) {
  const char *l = qc_contract_str(&m->contract, "layout", "half");
  snprintf(detail, n, "the contract says layout = %s", l);
  return qc_contract_set(&alt->contract, "layout", strcmp(l, "half") == 0 ? "interleaved" : "half", 0, 0);
}

static const qc_hypothesis rope_hyps[] = {
    {"rotation_direction", "/d_x/", "the rotation's direction reversed (the forward's rotation, not its transpose, applied to dY)",
     rope_flip_inverse, 0, NULL, 0},
    {"pair_layout", "/d_x/", "the other pair layout (half-split vs interleaved)", rope_flip_layout, 0, NULL, 0},
    {NULL, NULL, NULL, NULL, 0, NULL, 0}};

/* Float64 forward y (shape of x); rope has no discrete branch. */
static int rope_forward(const qc_module *m, const qc_module *branch, qc_tensor *y) {
  (void)branch;
  rope_view v;
  int64_t *pos = NULL;
  int rc = rope_view_get(m, &v);
  if (rc) return rc;
  if ((rc = qc_mod_ids(m, v.pos, "inputs/positions", &pos))) return rc;
  double *x = qc_mod_f64(v.x, "rope x"), *f = qc_malloc((size_t)v.R * sizeof *f, "rope inv_freq");
  rc = QC_ESYS;
  if (!x || !f) goto done;
  if ((rc = rope_freqs(&v, 0, f))) goto done;
  if ((rc = qc_tensor_alloc(y, "y", QC_F64, v.x->ndim, v.x->shape))) goto done;
  double *yd = y->data;
  memcpy(yd, x, (size_t)qc_numel(v.x) * sizeof *yd);
  for (int64_t t = 0; t < v.T; t++)
    for (int64_t j = 0; j < v.R / 2; j++) {
      const double ang = v.sign * ((double)pos[t] + v.offset) * f[j], c = v.scale * cos(ang), s = v.scale * sin(ang);
      int64_t a, b;
      rope_pair(&v, j, &a, &b);
      for (int64_t h = 0; h < v.H; h++) {
        int64_t o = (t * v.H + h) * v.D;
        yd[o + a] = x[o + a] * c - x[o + b] * s;
        yd[o + b] = x[o + a] * s + x[o + b] * c;
      }
    }
  rc = QC_OK;
done:
  free(x); free(f); free(pos);
  return rc;
}

/* Generated rope: shape [T, H, D]. x ~ N(0,1) bf16; positions int64 as two
 * packed sequences: the first starts at a random position below 4096, the
 * second (from token T/2) restarts at 0. values = "special": a zero token
 * and entries +-3e4, 1e-30. */
static int rope_generate(const qc_gen *gp, qc_rng *rng, qc_module *m, int *ondim, int64_t *oshape) {
  if (gp->nshape != 3) return qc_err("rope: generate shape needs [T, H, D] (tokens, heads, head_dim), got %d entries", gp->nshape);
  int64_t T = gp->shape[0], H = gp->shape[1], D = gp->shape[2];
  if (T < 1 || H < 1 || D < 2) return qc_err("rope: generate shape needs T >= 1, H >= 1, D >= 2");
  uint16_t *x;
  int64_t *pos;
  int rc;
  if ((rc = qc_mod_gen_bf16(&m->inputs, "x", 3, gp->shape, rng, 1.0, &x))) return rc;
  if ((rc = qc_mod_add(&m->inputs, "positions", QC_I64, 1, &T, (void **)&pos))) return rc;
  int64_t start = (int64_t)(qc_rng_uniform(rng) * 4096);
  for (int64_t t = 0; t < T; t++) pos[t] = t < (T + 1) / 2 ? start + t : t - (T + 1) / 2;
  static const float ext[] = {3e4f, -3e4f, 1e-30f};
  qc_mod_values(gp, rng, x, T, H * D, ext, 3);
  *ondim = 3;
  memcpy(oshape, gp->shape, 3 * sizeof *oshape);
  return QC_OK;
}

/* ---- coverage (model/modinfo.h) ---- */

/* Tokens T, and T as the sequence length, of x [T, H, D]. */
static int rope_cov_tokens(const qc_module *m, int64_t *tokens, int64_t *seqlen) {
  const qc_tensor *t = qc_tset_get(&m->inputs, "x");
  if (!t || t->ndim < 2) return 0;
  *tokens = *seqlen = t->shape[0];
  return 1;
}

/* Packed sequences: positions that restart. */
static void rope_cov_facts(const qc_module *m, const qc_modinfo *mi, uint32_t *cover) {
  (void)mi;
  int64_t n;
  int64_t *p = qc_cov_ids(qc_tset_get(&m->inputs, "positions"), &n);
  for (int64_t i = 1; p && i < n; i++)
    if (p[i] != p[i - 1] + 1) *cover |= 1u << QC_COV_MASK;
  free(p);
}

static const qc_class_cov rope_cov[] = {
    {.item = "context_lengths"},
    {.item = "mask", .how = "packed sequences (positions restart)"},
    {NULL, NULL, NULL},
};

/* The class's reading of m for the engine's validation (qc_module_validate):
 * the view, dY and the positions, as rope_vjp refuses them. */
static int rope_validate(const qc_module *m, const qc_tensor *dy) {
  rope_view v;
  int64_t *pos = NULL;
  int rc = rope_view_get(m, &v);
  if (!rc) rc = qc_module_check_dy(m, dy, qc_numel(v.x), v.x->shape[v.x->ndim - 1], "the shape of inputs/x");
  if (!rc) rc = qc_mod_ids(m, v.pos, "inputs/positions", &pos);
  free(pos);
  return rc;
}

const qc_class qc_class_rope = {
    .name = "rope",
    .summary = "rotary position embedding (half or interleaved, partial rotary_dim, offset, inverse, scaled tables): d_x",
    .tensors = "inputs/x inputs/positions inputs/inv_freq outputs/y",
    .grads = "d_x",
    .shape_help = "[T, H, D]: tokens, heads, head_dim",
    .keys = rope_keys,
    .generate = rope_generate,
    .production = rope_vjp,
    .not_checked = "inputs/positions: integer positions, not differentiable; inputs/inv_freq: the frequency table, a buffer",
    .forward = rope_forward,
    .fd_shape = "5,2,12",
    .tol_model = rope_tol_model,
    .validate = rope_validate,
    .round_ops = 2, /* reference variants: cos and sin in bf16; also each product and sum (a bf16 model) */
    .hypotheses = "factor sign rows zero dy_precision nonfinite",
    .hyps = rope_hyps,
    .coverage = rope_cov,
    .cov_tokens = rope_cov_tokens,
    .cov_facts = rope_cov_facts,
};
