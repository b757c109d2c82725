/* modules/linear.c: the production linear VJP as a BF16 trainer runs it.
 *
 *   forward  Y[M,N] = X[M,K] W[N,K]^T + b[N]      (X may be [..., K])
 *   d_x      [M,K]  = dY[M,N] W_ref[N,K]           bf16 operands, fp32 acc, bf16 out
 *   d_weight [N,K]  = dY^T[N,M] X_ref[M,K]         bf16 operands, fp32 acc, bf16 out
 *   d_bias   [N]    = sum_m dY[m,:]                fp32 sum, bf16 out
 *
 * W_ref is the weight the contract names (dx_weight: dequant(quant(W)) with
 * the contract's rounding, or the master W), X_ref the input it names
 * (dw_input: X, or dequant(quant(X)) under activation_format). Clipped STE
 * {"clipped": T} zeroes d_weight where |W| > T (weight quantized) and d_x
 * where |X| > T (activation quantized); |v| == T passes (derivative 1). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend/backend.h"
#include "model/module.h"
#include "numerics/formats.h"
#include "core/qc.h"
#include "core/rng.h"
#include "numerics/quant.h"
#include "numerics/sr.h"
#include "numerics/decode.h"

static const qc_key_spec linear_keys[] = {
    {"weight_format", QC_WEIGHT_FORMATS, "none", "how the forward quantized the weight"},
    {"activation_format", QC_ACT_FORMATS, "none", "how the forward quantized the input X"},
    {"dx_weight", "dequant|master", "dequant", "weight used for d_x: dequant(quant(W)) or the master W"},
    {"dw_input", "original|quantized", "original", "input used for d_weight: X or dequant(quant(X))"},
    {"ste", "identity|{clipped}", "identity", "surrogate derivative of the rounding"},
    {"rounding", "rn|{sr}", "rn", "weight rounding: nearest-even, or stochastic with a seed"},
    {"profile", QC_PROFILE_CHOICES, "vllm", "quantizer profile: the producer path (auto: identified from the deployed bytes)"},
    {NULL, NULL, NULL, NULL}};

/* The tensors of a linear module and its sizes. */
typedef struct {
  const qc_tensor *x, *w, *bias, *dy;
  int64_t M, K, N;
} lin_view;

static int lin_view_get(const qc_module *m, const qc_tensor *dy, lin_view *v) {
  int rc;
  memset(v, 0, sizeof *v);
  if ((rc = qc_module_need(m, "inputs", "x", 1, QC_MAXDIM, &v->x))) return rc;
  if ((rc = qc_module_need(m, "params", "weight", 2, 2, &v->w))) return rc;
  v->bias = qc_tset_get(&m->params, "bias");
  v->dy = dy;
  v->K = v->x->shape[v->x->ndim - 1];
  v->M = qc_numel(v->x) / (v->K ? v->K : 1);
  v->N = v->w->shape[0];
  if (v->w->shape[1] != v->K)
    return qc_err("%s: params/weight is [%lld, %lld] but inputs/x has %lld features: expected weight [N, %lld]", m->path,
                  (long long)v->w->shape[0], (long long)v->w->shape[1], (long long)v->K, (long long)v->K);
  if (v->bias && (v->bias->ndim != 1 || v->bias->shape[0] != v->N))
    return qc_err("%s: params/bias must be [%lld]", m->path, (long long)v->N);
  if (dy->shape[dy->ndim - 1] != v->N || qc_numel(dy) != v->M * v->N)
    return qc_err("%s: dY '%s' must hold [%lld, %lld] (tokens x out_features)", m->path, dy->name, (long long)v->M, (long long)v->N);
  return QC_OK;
}

/* The contract as the production VJP reads it. */
typedef struct {
  const char *wfmt, *afmt, *profile;
  int dx_master, dw_quantized, clipped;
  float T;      /* clipped STE threshold */
  qc_sr sr;     /* weight rounding */
} lin_contract;

static void lin_contract_get(const qc_ctx *ctx, const qc_module *m, lin_contract *c) {
  const qc_contract *k = &m->contract;
  memset(c, 0, sizeof *c);
  c->wfmt = qc_contract_str(k, "weight_format", "none");
  c->afmt = qc_contract_str(k, "activation_format", "none");
  c->profile = qc_contract_str(k, "profile", "vllm"); /* --profile is merged into the contract */
  (void)ctx;
  c->dx_master = strcmp(qc_contract_str(k, "dx_weight", "dequant"), "master") == 0;
  c->dw_quantized = strcmp(qc_contract_str(k, "dw_input", "original"), "quantized") == 0;
  const qc_kv *ste = qc_contract_get(k, "ste");
  c->clipped = ste && strcmp(ste->str, "clipped") == 0;
  c->T = c->clipped ? (float)ste->num : 0.0f;
  qc_sr_from_contract(k, m->path, &c->sr);
}

/* A tensor as float32 (the quantizers' input), n elements. */
static int to_f32(const qc_tensor *t, float *out, int64_t n) {
  double *d = qc_malloc((size_t)n * sizeof *d + 8, "linear decode");
  if (!d) return QC_ESYS;
  int rc = qc_tensor_to_f64(t, d);
  for (int64_t i = 0; i < n && !rc; i++) out[i] = (float)d[i];
  free(d);
  return rc;
}

/* Operand `t` [rows, cols] as bf16: decoded, then dequant(quant(.)) under fmt
 * when `quantize` is set (sr for the payload rounding, NULL: nearest). */
static int lin_operand(const lin_contract *c, const qc_tensor *t, int64_t rows, int64_t cols, const char *fmt,
                       int quantize, const qc_sr *sr, const char *what, uint16_t *out) {
  int64_t n = rows * cols;
  if (t->dtype == QC_BF16 && !(quantize && strcmp(fmt, "none") != 0)) { /* already what the trainer holds */
    memcpy(out, t->data, (size_t)n * sizeof *out);
    return QC_OK;
  }
  float *f = qc_malloc((size_t)n * sizeof *f + 4, what);
  if (!f) return QC_ESYS;
  int rc = to_f32(t, f, n);
  if (!rc && quantize && strcmp(fmt, "none") != 0) rc = qc_fake_quant_sr(fmt, c->profile, rows, cols, f, f, sr, what);
  for (int64_t i = 0; i < n && !rc; i++) out[i] = qc_f32_to_bf16(f[i]);
  free(f);
  return rc;
}

/* Clipped STE: zero acc[i] where the quantizer input |v[i]| exceeds T. */
static int ste_mask(const qc_tensor *v, float T, float *acc, int64_t n, float *tmp) {
  int rc = to_f32(v, tmp, n);
  for (int64_t i = 0; i < n && !rc; i++)
    if (fabsf(tmp[i]) > T) acc[i] = 0.0f;
  return rc;
}

/* Production VJP (see the file comment). */
static int linear_vjp(const qc_ctx *ctx, const qc_module *m, const qc_tensor *dy, qc_tset *grads) {
  lin_view v;
  lin_contract c;
  int rc = lin_view_get(m, dy, &v);
  if (rc) return rc;
  lin_contract_get(ctx, m, &c);
  const int64_t M = v.M, K = v.K, N = v.N;
  uint16_t *wb = NULL, *xb = NULL, *gb = NULL;
  float *acc = NULL, *tmp = NULL;
  qc_tensor dx = {0}, dw = {0}, db = {0};
  /* d_x and d_weight may be skipped: a fast path judged them (ctx->skip) */
  const int want_dx = qc_ctx_wants(ctx, "d_x"), want_dw = qc_ctx_wants(ctx, "d_weight");
  int64_t big = N;
  if (want_dx && M * K > big) big = M * K;
  if (want_dw && N * K > big) big = N * K;
  big += 1;
  rc = QC_ESYS;
  if (want_dx && !(wb = qc_malloc((size_t)(N * K) * sizeof *wb, "linear weight bf16"))) goto done;
  if (want_dw && !(xb = qc_malloc((size_t)(M * K) * sizeof *xb, "linear input bf16"))) goto done;
  gb = qc_malloc((size_t)(M * N) * sizeof *gb, "linear dY bf16");
  acc = qc_malloc((size_t)big * sizeof *acc, "linear accumulator");
  if (c.clipped) tmp = qc_malloc((size_t)big * sizeof *tmp, "linear mask scratch"); /* only the STE mask needs it */
  if (!gb || !acc || (c.clipped && !tmp)) goto done;

  char what[QC_PATHLEN + 32];
  int64_t wshape[2] = {N, K}, bshape[1] = {N};
  if ((rc = lin_operand(&c, v.dy, M, N, "none", 0, NULL, "dY", gb))) goto done;
  if (want_dx) {
    /* d_x = dY W_ref: W_ref = dequant(quant(W)) (with the contract's rounding) or W */
    snprintf(what, sizeof what, "%s: params/weight", m->path);
    if ((rc = lin_operand(&c, v.w, N, K, c.wfmt, !c.dx_master, c.sr.on ? &c.sr : NULL, what, wb))) goto done;
    if ((rc = qc_tensor_alloc(&dx, "d_x", QC_BF16, v.x->ndim, v.x->shape))) goto done;
    if ((rc = ctx->be->gemm_bf16(ctx->be, QC_OP_N, QC_OP_N, M, K, N, gb, N, wb, K, acc, K))) goto done;
    if (c.clipped && strcmp(c.afmt, "none") != 0 && (rc = ste_mask(v.x, c.T, acc, M * K, tmp))) goto done;
    for (int64_t i = 0; i < M * K; i++) ((uint16_t *)dx.data)[i] = qc_f32_to_bf16(acc[i]);
    if ((rc = qc_tset_add(grads, &dx))) goto done;
  }
  if (want_dw) {
    /* d_weight = dY^T X_ref: X_ref = dequant(quant(X)) (nearest) or X */
    snprintf(what, sizeof what, "%s: inputs/x", m->path);
    if ((rc = lin_operand(&c, v.x, M, K, c.afmt, c.dw_quantized, NULL, what, xb))) goto done;
    if ((rc = qc_tensor_alloc(&dw, "d_weight", QC_BF16, 2, wshape))) goto done;
    if ((rc = ctx->be->gemm_bf16(ctx->be, QC_OP_T, QC_OP_N, N, K, M, gb, N, xb, K, acc, K))) goto done;
    if (c.clipped && strcmp(c.wfmt, "none") != 0 && (rc = ste_mask(v.w, c.T, acc, N * K, tmp))) goto done;
    for (int64_t i = 0; i < N * K; i++) ((uint16_t *)dw.data)[i] = qc_f32_to_bf16(acc[i]);
    if ((rc = qc_tset_add(grads, &dw))) goto done;
  }
  if (v.bias) {
    if ((rc = qc_tensor_alloc(&db, "d_bias", QC_BF16, 1, bshape))) goto done;
    for (int64_t n = 0; n < N; n++) acc[n] = 0.0f;
    for (int64_t i = 0; i < M; i++)
      for (int64_t n = 0; n < N; n++) acc[n] += qc_bf16_to_f32(gb[i * N + n]);
    for (int64_t n = 0; n < N; n++) ((uint16_t *)db.data)[n] = qc_f32_to_bf16(acc[n]);
    if ((rc = qc_tset_add(grads, &db))) goto done;
  }
  rc = QC_OK;
done:
  qc_tensor_free(&dx);
  qc_tensor_free(&dw);
  qc_tensor_free(&db);
  free(wb); free(xb); free(gb); free(acc); free(tmp);
  return rc;
}

/* Generated linear: shape row [M, K, N] (tokens, in_features, out_features),
 * optional 4th entry 0 to drop the bias. X ~ N(0,1), W ~ N(0,1)/sqrt(K),
 * b ~ 0.1 N(0,1), all held as bf16 like a BF16 trainer's tensors. values =
 * "special" plants zero rows, a zero weight row, and entries at and beyond
 * +-448 * (row amax / 448) so quantized formats saturate and hit floors. */
static int linear_generate(const qc_gen *gp, qc_rng *rng, qc_module *m, int *ondim, int64_t *oshape) {
  if (gp->nshape < 3 || gp->nshape > 4)
    return qc_err("linear: generate shape needs [M, K, N] (optionally a 4th entry 0 for no bias), got %d entries", gp->nshape);
  int64_t M = gp->shape[0], K = gp->shape[1], N = gp->shape[2];
  int bias = gp->nshape == 4 ? gp->shape[3] != 0 : 1;
  if (M < 1 || K < 1 || N < 1) return qc_err("linear: generate shape entries must be >= 1");
  int special = gp->values && strcmp(gp->values, "special") == 0;
  int heavy = gp->values && strcmp(gp->values, "heavy_tail") == 0;
  qc_tensor x = {0}, w = {0}, b = {0};
  int64_t xs[2] = {M, K}, ws[2] = {N, K}, bs[1] = {N};
  int rc;
  if ((rc = qc_tensor_alloc(&x, "x", QC_BF16, 2, xs)) || (rc = qc_tensor_alloc(&w, "weight", QC_BF16, 2, ws))) goto fail;
  uint16_t *xp = x.data, *wp = w.data;
  double ws_ = 1.0 / sqrt((double)K);
  for (int64_t i = 0; i < M * K; i++) {
    double val = qc_rng_normal(rng);
    if (heavy) val = val / (0.05 + qc_rng_uniform(rng));
    xp[i] = qc_f32_to_bf16((float)val);
  }
  for (int64_t i = 0; i < N * K; i++) {
    double val = qc_rng_normal(rng) * ws_;
    if (heavy && qc_rng_uniform(rng) < 0.001) val *= 50.0;
    wp[i] = qc_f32_to_bf16((float)val);
  }
  if (special) {
    if (M > 1) memset(xp + (M / 2) * K, 0, (size_t)K * 2);            /* a zero token */
    if (N > 1) memset(wp + (N - 1) * K, 0, (size_t)K * 2);            /* a zero output row */
    for (int64_t i = 0; i < M * K; i += 97) xp[i] = qc_f32_to_bf16(i % 2 ? 448.0f : -1e4f); /* saturation */
    for (int64_t i = 0; i < N * K; i += 89) wp[i] = qc_f32_to_bf16(i % 3 ? 1e-8f : -3.0f); /* tiny and large */
  }
  if ((rc = qc_tset_add(&m->inputs, &x)) || (rc = qc_tset_add(&m->params, &w))) goto fail;
  if (bias) {
    if ((rc = qc_tensor_alloc(&b, "bias", QC_BF16, 1, bs))) goto fail;
    for (int64_t i = 0; i < N; i++) ((uint16_t *)b.data)[i] = qc_f32_to_bf16((float)(0.1 * qc_rng_normal(rng)));
    if ((rc = qc_tset_add(&m->params, &b))) goto fail;
  }
  *ondim = 2;
  oshape[0] = M;
  oshape[1] = N;
  return QC_OK;
fail:
  qc_tensor_free(&x);
  qc_tensor_free(&w);
  qc_tensor_free(&b);
  return rc;
}

/* Are all values of dtype a exactly values of dtype b? */
static int lin_fits(qc_dtype a, qc_dtype b) {
  return a == b || (b == QC_F64 && (a == QC_F32 || a == QC_F16 || a == QC_BF16)) || (b == QC_F32 && (a == QC_F16 || a == QC_BF16));
}

/* Formats whose dequantized values are payload x 2^k: exact in bfloat16
 * and wider, so a candidate casting them to bf16 rounds nothing. */
static int lin_pow2_format(const char *f) {
  return !strcmp(f, "none") || !strcmp(f, "mxfp8") || !strcmp(f, "mxfp4") || !strcmp(f, "fp8_block128_ue8m0") ||
         !strcmp(f, "fp8_group128_ue8m0");
}

/* The candidate's dtype of gradient g (grads/ of the first dY), else `dflt`. */
static qc_dtype lin_out_dtype(const qc_module *m, const char *g, qc_dtype dflt) {
  const qc_tensor *t = m->cand && m->grad_out.n ? qc_tset_get(&m->cand[0], g) : NULL;
  return t ? t->dtype : dflt;
}

/* The next ask of out: gradient g, output in the candidate's dtype (else
 * dflt), operands in op, K = k. */
static qc_tol_ask *lin_ask(qc_tol_ask *out, int *n, const qc_module *m, const char *g, qc_dtype dflt, qc_dtype op, int64_t k,
                           int rounded) {
  qc_tol_ask *a = &out[(*n)++];
  memset(a, 0, sizeof *a);
  snprintf(a->tensor, sizeof a->tensor, "%s", g);
  a->out_dtype = qc_dtype_name(lin_out_dtype(m, g, dflt));
  a->operand_dtype = qc_dtype_name(op);
  a->k = k;
  a->rounded_operands = rounded;
  return a;
}

/* `tol --dump`: d_x reduces over N (out_features), d_weight and d_bias over
 * the M tokens (leading dimensions of dY); the operands enter in dY's
 * dtype; the weight (master, or dequantized under dx_weight = dequant) and
 * X (or its dequantization under dw_input = quantized) count as rounded
 * operands when their values are not exact in that dtype. */
static int linear_tol_rules(const qc_module *m, qc_tol_ask *out, int max, int *n) {
  const qc_tensor *w, *x;
  int rc;
  *n = 0;
  if ((rc = qc_module_need(m, "params", "weight", 2, 2, &w)) || (rc = qc_module_need(m, "inputs", "x", 1, QC_MAXDIM, &x))) return rc;
  if (m->grad_out.n == 0) return qc_err("%s: no dataset under grad_out/: the tokens M come from dY", m->path);
  const qc_tensor *dy = &m->grad_out.t[0], *b = qc_tset_get(&m->params, "bias");
  const int64_t N = w->shape[0], M = qc_numel(dy) / (N ? N : 1);
  const qc_dtype op = dy->dtype;
  const char *wf = qc_contract_str(&m->contract, "weight_format", "none"), *af = qc_contract_str(&m->contract, "activation_format", "none");
  int dx_master = !strcmp(qc_contract_str(&m->contract, "dx_weight", "dequant"), "master");
  int dw_q = !strcmp(qc_contract_str(&m->contract, "dw_input", "original"), "quantized");
  int w_round = (dx_master || !strcmp(wf, "none")) ? !lin_fits(w->dtype, op) : !(lin_pow2_format(wf) && op != QC_F16);
  int x_round = (!dw_q || !strcmp(af, "none")) ? !lin_fits(x->dtype, op) : !(lin_pow2_format(af) && op != QC_F16);
  if (max < 3) return qc_err("%s: room for 3 tolerances needed", m->path);
  qc_tol_ask *a = lin_ask(out, n, m, "d_x", x->dtype, op, N, w_round);
  snprintf(a->why, sizeof a->why, "K = N = %lld (params/weight [%lld, %lld]); operands in dY's %s; %s weight%s", (long long)N,
           (long long)N, (long long)w->shape[1], qc_dtype_name(op), dx_master || !strcmp(wf, "none") ? "master" : wf,
           w_round ? " rounded to it" : " exact in it");
  a = lin_ask(out, n, m, "d_weight", w->dtype, op, M, x_round);
  snprintf(a->why, sizeof a->why, "K = M = %lld tokens (grad_out/%s: leading dimensions of %lld x %lld); X %s%s", (long long)M,
           dy->name, (long long)M, (long long)N, dw_q && strcmp(af, "none") ? af : "as stored", x_round ? " rounded to dY's dtype" : "");
  if (!b) return QC_OK;
  a = lin_ask(out, n, m, "d_bias", b->dtype, op, M, 0);
  snprintf(a->why, sizeof a->why, "K = M = %lld tokens (a sum of dY over tokens)", (long long)M);
  return QC_OK;
}

const qc_class qc_class_linear = {
    .name = "linear",
    .summary = "Y = X W^T + b: d_x, d_weight, d_bias under a weight/activation quantization contract",
    .grads = "d_x d_weight d_bias",
    .shape_help = "[M, K, N] or [M, K, N, 0] (no bias): tokens, in_features, out_features",
    .keys = linear_keys,
    .generate = linear_generate,
    .production = linear_vjp,
    .not_checked = "",
    .tol_rules = linear_tol_rules,
};
