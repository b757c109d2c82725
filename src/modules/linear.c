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
#include "model/modinfo.h"
#include "model/module.h"
#include "modules/classes.h"
#include "numerics/formats.h"
#include "core/qc.h"
#include "modules/mod_util.h"
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
    QC_SR_KEYS,
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
    return qc_err("%s: params/weight is [%lld, %lld]: it does not match inputs/x of %lld features: expected weight [N, %lld]", m->path,
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

static int lin_contract_get(const qc_ctx *ctx, const qc_module *m, lin_contract *c) {
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
  return qc_sr_from_contract(k, m->path, &c->sr);
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
  if (!rc) qc_mod_to_bf16(f, n, out);
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
  if (rc || (rc = lin_contract_get(ctx, m, &c))) return rc;
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
    if ((rc = qc_tensor_alloc_out(&dx, "d_x", QC_BF16, v.x->ndim, v.x->shape))) goto done;
    if ((rc = ctx->be->gemm_bf16(ctx->be, QC_OP_N, QC_OP_N, M, K, N, gb, N, wb, K, acc, K))) goto done;
    /* split along N (ctx->group): each rank's product is a partial sum over its output features, completed
     * by the all-reduce in float32 before the one rounding to bf16, as a tensor-parallel backward does */
    if (ctx->group && (rc = ctx->group->allreduce(ctx->group, acc, M * K, QC_F32, QC_RED_SUM))) goto done;
    if (c.clipped && strcmp(c.afmt, "none") != 0 && (rc = ste_mask(v.x, c.T, acc, M * K, tmp))) goto done;
    qc_mod_to_bf16(acc, M * K, dx.data);
    if ((rc = qc_tset_add(grads, &dx))) goto done;
  }
  if (want_dw) {
    /* d_weight = dY^T X_ref: X_ref = dequant(quant(X)) (nearest) or X */
    snprintf(what, sizeof what, "%s: inputs/x", m->path);
    if ((rc = lin_operand(&c, v.x, M, K, c.afmt, c.dw_quantized, NULL, what, xb))) goto done;
    if ((rc = qc_tensor_alloc_out(&dw, "d_weight", QC_BF16, 2, wshape))) goto done;
    if ((rc = ctx->be->gemm_bf16(ctx->be, QC_OP_T, QC_OP_N, N, K, M, gb, N, xb, K, acc, K))) goto done;
    if (c.clipped && strcmp(c.wfmt, "none") != 0 && (rc = ste_mask(v.w, c.T, acc, N * K, tmp))) goto done;
    qc_mod_to_bf16(acc, N * K, dw.data);
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

/* The error model of each gradient (qc_tol_model_fn): the production's
 * bf16 GEMMs with float32 accumulation; an operand it rounds to bf16 that
 * the reference keeps exact when the dequantized weight (d_x) or input
 * (d_weight) is not a bf16 value. */
static int linear_tol_model(const qc_module *m, const qc_tensor *dy, const char *grad, qc_tol_model *tm) {
  lin_view v;
  int rc = lin_view_get(m, dy, &v);
  if (rc) return rc;
  double mdy = qc_mod_maxabs(dy);
  const int64_t M = v.M, N = v.N, K = v.K;
  if (strcmp(grad, "d_x") == 0) {
    qc_mod_tm(tm, N, 1, 0, 0, "d_x = dY W_ref sums over the N = %lld output features (terms |dY| |W|)", (long long)N);
    tm->scale = (double)N * mdy * qc_mod_maxabs(v.w);
    tm->terms = qc_mod_terms_tensor(dy, N, 1, v.w, K, 1, M, K, N);
  } else if (strcmp(grad, "d_weight") == 0) {
    qc_mod_tm(tm, M, 1, 0, 0, "d_weight = dY^T X sums over the M = %lld tokens (terms |dY|^T |X|)", (long long)M);
    tm->scale = (double)M * mdy * qc_mod_maxabs(v.x);
    tm->terms = qc_mod_terms_tensor(dy, 1, N, v.x, K, 1, N, K, M);
  } else if (strcmp(grad, "d_bias") == 0) {
    qc_mod_tm(tm, M, 1, 0, 0, "d_bias = sum of dY over the M = %lld tokens (terms sum |dY|)", (long long)M);
    tm->scale = (double)M * mdy;
    double *G = qc_mod_f64(dy, "linear dY (terms)"), ss = 0;
    if (!G) return QC_ESYS;
    for (int64_t n = 0; n < N; n++) {
      double t = 0;
      for (int64_t i = 0; i < M; i++) t += isfinite(G[i * N + n]) ? fabs(G[i * N + n]) : 0.0;
      ss += t * t;
    }
    tm->terms = sqrt(ss);
    free(G);
  } else {
    return qc_err("%s: class linear has no gradient '%s'", m->path, grad);
  }
  return QC_OK;
}

/* Hypothesis: d_x from the other weight than the contract names (master
 * where it says dequantized, or the reverse). */
static int alter_dx_weight(const qc_module *m, qc_module *alt, char *detail, size_t n) {
  if (strcmp(qc_contract_str(&m->contract, "weight_format", "none"), "none") == 0) return QC_NA; /* the same weight */
  int master = strcmp(qc_contract_str(&m->contract, "dx_weight", "dequant"), "master") == 0;
  snprintf(detail, n, "the contract says dx_weight = %s", master ? "master" : "dequant");
  return qc_contract_set(&alt->contract, "dx_weight", master ? "dequant" : "master", 0, 0);
}

/* Hypothesis: d_x = dY W^T instead of dY W (a square weight keeps the shape). */
static int alter_weight_t(const qc_module *m, qc_module *alt, char *detail, size_t n) {
  const qc_tensor *w = qc_tset_get(&m->params, "weight");
  if (!w || w->ndim != 2 || w->shape[0] != w->shape[1]) return QC_NA;
  int rc = qc_tset_clone(&alt->params, &m->params);
  if (rc) return rc;
  qc_tensor *wt = qc_tset_get_mut(&alt->params, "weight");
  size_t es = qc_dtype_size(wt->dtype);
  int64_t N = w->shape[0];
  const unsigned char *src = w->data;
  unsigned char *dst = wt->data;
  for (int64_t i = 0; i < N; i++)
    for (int64_t j = 0; j < N; j++) memcpy(dst + (size_t)(j * N + i) * es, src + (size_t)(i * N + j) * es, es);
  snprintf(detail, n, "params/weight is square (%lld x %lld)", (long long)N, (long long)N);
  return QC_OK;
}

/* Solve A X = B in place for X (A [n, n] symmetric positive definite, B
 * [n, k]) by Cholesky; QC_NA when A is not positive definite. */
static int chol_solve(double *A, double *B, int64_t n, int64_t k) {
  for (int64_t j = 0; j < n; j++) {
    double d = A[j * n + j];
    for (int64_t p = 0; p < j; p++) d -= A[j * n + p] * A[j * n + p];
    if (!(d > 0)) return QC_NA;
    A[j * n + j] = sqrt(d);
    for (int64_t i = j + 1; i < n; i++) {
      double s = A[i * n + j];
      for (int64_t p = 0; p < j; p++) s -= A[i * n + p] * A[j * n + p];
      A[i * n + j] = s / A[j * n + j];
    }
  }
  for (int64_t c = 0; c < k; c++) { /* L y = b, then L^T x = y, column c of B */
    for (int64_t i = 0; i < n; i++) {
      double s = B[i * k + c];
      for (int64_t p = 0; p < i; p++) s -= A[i * n + p] * B[p * k + c];
      B[i * k + c] = s / A[i * n + i];
    }
    for (int64_t i = n - 1; i >= 0; i--) {
      double s = B[i * k + c];
      for (int64_t p = i + 1; p < n; p++) s -= A[p * n + i] * B[p * k + c];
      B[i * k + c] = s / A[i * n + i];
    }
  }
  return QC_OK;
}

/* Hypothesis (fitted): d_x = dY W' for some weight W' other than the
 * contract's (a stale copy, another dequantization): W' by least squares,
 * (dY^T dY) W' = dY^T g, and the prediction dY W'. It says something only
 * when M >= N + 16 (with fewer tokens every d_x is such a product); N <=
 * 1024 bounds the N x N solve. */
static int linear_other_weight(const qc_ctx *ctx, const qc_module *m, const qc_tensor *dy, const char *grad,
                               const qc_tensor *cand, qc_tensor *pred, char *detail, size_t n) {
  lin_view v;
  int rc = lin_view_get(m, dy, &v);
  if (rc) return rc;
  const int64_t M = v.M, K = v.K, N = v.N;
  if (!cand || M < N + 16 || N > 1024 || qc_numel(cand) != M * K) return QC_NA;
  double *y = qc_mod_f64(dy, "dY"), *g = qc_mod_f64(cand, "candidate"), *w = qc_mod_f64(v.w, "weight");
  double *A = qc_malloc((size_t)(N * N) * sizeof *A, "normal equations"), *B = qc_malloc((size_t)(N * K) * sizeof *B, "normal equations");
  rc = QC_ESYS;
  if (!y || !g || !w || !A || !B) goto done;
  /* the rows and columns of dY that carry anything: the fit has (M' - N') K
   * degrees of freedom left to test it */
  int64_t mr = 0, nc = 0;
  for (int64_t i = 0; i < M; i++) {
    int nz = 0;
    for (int64_t j = 0; j < N && !nz; j++) nz = y[i * N + j] != 0;
    mr += nz;
  }
  for (int64_t j = 0; j < N; j++) {
    int nz = 0;
    for (int64_t i = 0; i < M && !nz; i++) nz = y[i * N + j] != 0;
    nc += nz;
  }
  if (mr < nc + 16) {
    rc = QC_NA;
    goto done;
  }
  if ((rc = ctx->be->gemm_f64(ctx->be, QC_OP_T, QC_OP_N, N, N, M, y, N, y, N, A, N)) ||
      (rc = ctx->be->gemm_f64(ctx->be, QC_OP_T, QC_OP_N, N, K, M, y, N, g, K, B, K)))
    goto done;
  double mx = 0;
  for (int64_t i = 0; i < N; i++) mx = fmax(mx, A[i * N + i]);
  for (int64_t i = 0; i < N; i++) A[i * N + i] += 1e-12 * mx + 1e-300; /* dY columns that are all zero leave W' rows free */
  if ((rc = chol_solve(A, B, N, K))) goto done;
  if ((rc = qc_tensor_alloc(pred, grad, QC_F64, v.x->ndim, v.x->shape))) goto done;
  if ((rc = ctx->be->gemm_f64(ctx->be, QC_OP_N, QC_OP_N, M, K, N, y, N, B, K, pred->data, K))) goto done;
  snprintf(detail, n, "the weight that explains it differs from params/weight (the master) by rel_l2 %.2g", qc_rel_l2(B, w, N * K));
  rc = QC_OK;
done:
  free(y); free(g); free(w); free(A); free(B);
  return rc;
}

static const qc_hypothesis linear_hyps[] = {
    {"dx_convention", "/d_x/", "d_x from the other weight than the contract's dx_weight (master vs dequantized)",
     alter_dx_weight, 0, NULL, 0},
    {"weight_transposed", "/d_x/", "d_x = dY W^T: the weight operand transposed in the product", alter_weight_t, 0, NULL, 0},
    {"other_weight", "/d_x/", "d_x = dY W' for another weight W' than the contract's (a stale copy, another dequantization)",
     NULL, 0, linear_other_weight, 1},
    {NULL, NULL, NULL, NULL, 0, NULL, 0}};

/* ---- coverage (model/modinfo.h) ---- */

/* The threshold applies under a clipped STE. */
static int linear_clipped(const char *cj) { return cj && strstr(cj, "\"clipped\"") != NULL; }

/* The weight on both sides of a clipped STE's T, and beyond it. */
static void linear_cov_facts(const qc_module *m, const qc_modinfo *mi, uint32_t *cover) {
  if (linear_clipped(mi->contract)) qc_cov_limit(qc_tset_get(&m->params, "weight"), qc_cov_num(mi->contract, "ste"), cover);
}

static const qc_class_cov linear_cov[] = {
    {.item = "threshold", .how = "a clipped STE's T (the weight)", .applies = linear_clipped},
    {.item = "saturation", .how = "the clipped STE's T (the weight)", .applies = linear_clipped},
    {NULL, NULL, NULL},
};

/* The class's reading of m for the engine's validation (qc_module_validate). */
static int linear_validate(const qc_module *m, const qc_tensor *dy) {
  lin_view v;
  qc_sr sr;
  int rc = lin_view_get(m, dy, &v);
  return rc ? rc : qc_sr_from_contract(&m->contract, m->path, &sr);
}

/* A clipped STE (src/reference/linear.c): its mask [|X| <= T] on d_x
 * where the activation is quantized, [|W| <= T] on d_weight where the
 * weight is. */
static int linear_ste_mask(const qc_contract *c, const char *fmt_key) {
  const qc_kv *ste = qc_contract_get(c, "ste");
  return ste && strcmp(ste->str, "clipped") == 0 && strcmp(qc_contract_str(c, fmt_key, "none"), "none") != 0;
}
static int linear_dx_mask(const qc_contract *c) { return linear_ste_mask(c, "activation_format"); }
static int linear_dw_mask(const qc_contract *c) { return linear_ste_mask(c, "weight_format"); }

/* d_weight's X_ref is x itself (dw_input original): rounding x to bf16
 * (bf16_inputs) and rounding X_ref to bf16 (round_ops, the one level) are
 * one rounding. With dw_input quantized, X_ref = dequant(quant(x)): the two
 * round before and after the quantizer. */
static int linear_dw_x(const qc_contract *c) { return strcmp(qc_contract_str(c, "dw_input", "original"), "original") == 0; }
static int linear_dw_mask_x(const qc_contract *c) { return linear_dw_mask(c) && linear_dw_x(c); }

/* What each gradient's reference reads (qc_grad_reads): d_x = dY W_ref
 * (round_ops rounds W_ref) reads x only for a clipped STE's mask;
 * d_weight = dY^T X_ref (round_ops rounds X_ref) reads W only for its
 * mask; d_bias = the column sums of dY, which no rounding level touches.
 * So the bf16_inputs variants of d_x repeat others' references, and
 * d_weight's bf16_inputs and round_ops are one rounding of x where X_ref
 * is x (3 of its 7 variant references, not 7). */
static const qc_grad_reads linear_reads[] = {
    {"d_x", "dy params inputs ops", linear_dx_mask},
    {"d_x", "dy params ops", NULL},
    {"d_weight", "dy inputs=ops params", linear_dw_mask_x},
    {"d_weight", "dy inputs params ops", linear_dw_mask},
    {"d_weight", "dy inputs=ops", linear_dw_x},
    {"d_weight", "dy inputs ops", NULL},
    {"d_bias", "dy", NULL},
    {NULL, NULL, NULL},
};

const qc_class qc_class_linear = {
    .name = "linear",
    .summary = "Y = X W^T + b: d_x, d_weight, d_bias under a weight/activation quantization contract",
    .bf16_gemm = 1,
    .tensors = "inputs/x params/weight params/bias saved/weight_q saved/weight_scale saved/weight_scale_inv saved/weight_scale_2 saved/weight_global_scale outputs/y",
    .grads = "d_x d_weight d_bias",
    .grad_reads = linear_reads,
    .shape_help = "[M, K, N] or [M, K, N, 0] (no bias): tokens, in_features, out_features",
    .keys = linear_keys,
    .generate = linear_generate,
    .production = linear_vjp,
    .round_ops = 1,
    .formats_are_arithmetic = 1,
    .not_checked = "",
    .tol_model = linear_tol_model,
    .validate = linear_validate,
    .hypotheses = "factor sign transpose rows zero dy_precision nonfinite",
    .hyps = linear_hyps,
    .split = &qc_linear_split,
    .coverage = linear_cov,
    .cov_facts = linear_cov_facts,
    .fast = qc_fast_linear,
};
