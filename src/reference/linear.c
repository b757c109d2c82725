/* reference/linear.c: the float64 linear VJP, from the math.
 *
 *   d_x      [M,K] = dY[M,N] W_ref[N,K]      W_ref = W, or dequant(quant(W)) (contract)
 *   d_weight [N,K] = dY[M,N]^T X_ref[M,K]    X_ref = X, or dequant(quant(X)) (dw_input)
 *   d_bias   [N]   = sum_m dY[m,:]           when params/bias exists
 *
 * Identity STE: the rounding's surrogate derivative is 1, so W_ref is used
 * as a constant in d_x and d_weight returns to the master unchanged. Clipped
 * STE {"clipped": T}: the surrogate derivative of a quantizer is 1 where its
 * input satisfies |v| <= T (so 1 at |v| == T) and 0 where |v| > T; it
 * multiplies d_weight elementwise by [|W| <= T] when the weight is quantized
 * and d_x by [|X| <= T] when the activation is quantized. Rounding
 * {"sr": {"seed": S}}: W_ref's payload rounds stochastically with key S,
 * salt = FNV-1a of "<module path>.weight", step 0 (docs/numerics.md).
 * Variant ctx->round_ops: X_ref and W_ref rounded to bf16 before their
 * GEMMs, the operands an implementation may legally cast (engine/audit.c).
 * Variant ctx->wscale > 0 (a diagnosis): W_ref of an fp8_tensor weight
 * quantized with that multiple of its scale amax / 448 (QC_NA otherwise).
 * Everything in float64; GEMMs through the backend's float64 GEMM only
 * (gemm_f64_x: dY, X_ref and W_ref as stored, widened by the backend). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend/backend.h"
#include "model/module.h"
#include "reference/ref_classes.h"
#include "reference/ref_util.h"
#include "numerics/quant.h"
#include "numerics/sr.h"
#include "core/qc.h"
#include "numerics/decode.h"
#include "numerics/formats.h"
#include "core/memo.h"
#include "core/par.h"
#include "numerics/metrics.h"

/* t [.., cols] as gemm_f64_x reads it: its own storage where the op takes
 * its dtype, else widened into *owned (the caller frees it). */
static int raw_op(const qc_tensor *t, int64_t cols, qc_gemm_x *op, void **owned) {
  *owned = NULL;
  if (qc_gemm_x_dtype(t->dtype)) {
    *op = (qc_gemm_x){t->data, t->dtype, cols, 0};
    return QC_OK;
  }
  double *a = qc_malloc((size_t)qc_numel(t) * sizeof *a + 8, "reference operand (float64)");
  if (!a) return QC_ESYS;
  *owned = a;
  *op = (qc_gemm_x){a, QC_F64, cols, 0};
  return qc_tensor_to_f64(t, a);
}

/* The [rows, cols] operand dequant(quant(src)) under fmt (sr: stochastic
 * payload rounding, NULL: nearest), float32 as the quantizer leaves it; src
 * itself (raw_op) for "none". Nearest rounding of src is kept in the audit's
 * memo (core/memo.h) for the module's other references, its forward check
 * and every variant: one fake quantization, and on a device one upload, a
 * module. What is not kept is the caller's to free (*owned). */
static int ref_wq_op(const char *profile, const char *fmt, int64_t rows, int64_t cols, const qc_sr *sr, const char *what,
                     const qc_tensor *src, qc_gemm_x *op, void **owned) {
  const int64_t n = rows * cols;
  *owned = NULL;
  if (strcmp(fmt, "none") == 0) return raw_op(src, cols, op, owned);
  char tag[96];
  snprintf(tag, sizeof tag, "linear fake_quant %s %s", fmt, profile ? profile : "");
  const float *kept = !sr ? qc_memo_get(src, tag, n) : NULL;
  if (kept) {
    *op = (qc_gemm_x){kept, QC_F32, cols, 0};
    return QC_OK;
  }
  float *f = qc_malloc((size_t)n * sizeof *f + 4, what);
  if (!f) return QC_ESYS;
  int rc = QC_OK;
  if (src->dtype == QC_F32) {
    memcpy(f, src->data, (size_t)n * sizeof *f);
  } else { /* the quantizer's float32 input: src's values rounded to float32 */
    double *a = qc_malloc((size_t)n * sizeof *a + 8, what);
    if (!a) rc = QC_ESYS;
    if (!rc && !(rc = qc_tensor_to_f64(src, a))) qc_f64_to_f32s(a, n, f);
    free(a);
  }
  if (!rc) rc = qc_fake_quant_sr(fmt, profile, rows, cols, f, f, sr, what);
  if (rc || sr || !qc_memo_take(src, tag, f, n)) *owned = f;
  *op = (qc_gemm_x){f, QC_F32, cols, 0};
  return rc;
}

/* W [N, K] quantized per tensor to float8_e4m3fn with scale f amax / 448
 * (f != 1: a scale from another weight, e.g. an earlier step's amax), then
 * dequantized, in place. */
static void stale_fp8_tensor(double *W, int64_t n, double f) {
  double amax = 0;
  for (int64_t i = 0; i < n; i++) amax = fmax(amax, fabs(W[i]));
  float s = (float)(amax * f / 448.0);
  if (!(s > 0)) return;
  for (int64_t i = 0; i < n; i++) W[i] = (double)qc_e4m3_to_f32(qc_f32_to_e4m3((float)(W[i] / s))) * s;
}

/* Host passes over a [rows, cols] float64 matrix on qc_par_for's threads,
 * each element (or column, or row) alone, so the results do not depend on
 * the thread count: column sums (d_bias, each column summed over the rows
 * in order), a row vector added to every row (the bias). */
typedef struct mat_job {
  double *a;
  const double *v;
  int64_t rows, cols;
  double *out;
} mat_job;

static void colsum_piece(void *ctx, int64_t lo, int64_t hi, int tid) {
  (void)tid;
  const mat_job *j = ctx;
  for (int64_t i = 0; i < j->rows; i++)
    for (int64_t c = lo; c < hi; c++) j->out[c] += j->v[i * j->cols + c];
}

static void addrow_piece(void *ctx, int64_t lo, int64_t hi, int tid) {
  (void)tid;
  const mat_job *j = ctx;
  for (int64_t i = lo; i < hi; i++)
    for (int64_t c = 0; c < j->cols; c++) j->a[i * j->cols + c] += j->v[c];
}

/* The forward's terms T [rows, cols] (+ |b|, b of cols): row i's sum of
 * squares into out[2 i], its largest into out[2 i + 1]. */
static void terms_piece(void *ctx, int64_t lo, int64_t hi, int tid) {
  (void)tid;
  const mat_job *j = ctx;
  for (int64_t i = lo; i < hi; i++) {
    double ss = 0, mx = 0;
    for (int64_t c = 0; c < j->cols; c++) {
      const double t = j->a[i * j->cols + c] + fabs(j->v[c]);
      ss += t * t;
      mx = fmax(mx, t);
    }
    j->out[2 * i] = ss, j->out[2 * i + 1] = mx;
  }
}

/* The float64 VJP from the math above (a qc_vjp_fn): every gradient the contract makes
 * differentiable into grads; QC_EINPUT naming what is wrong with bad input. */
static int ref_linear(const qc_ctx *ctx, const qc_module *m, const qc_tensor *dy, qc_tset *grads) {
  const qc_tensor *x, *w, *b;
  int rc;
  if ((rc = qc_module_need(m, "inputs", "x", 1, QC_MAXDIM, &x))) return rc;
  if ((rc = qc_module_need(m, "params", "weight", 2, 2, &w))) return rc;
  b = qc_tset_get(&m->params, "bias");
  const int64_t K = x->shape[x->ndim - 1], M = qc_numel(x) / K, N = w->shape[0];
  char s1[64], s2[64];
  if (w->shape[1] != K)
    return qc_err("%s: params/weight %s does not match inputs/x %s: expected weight [N, %lld]", m->path,
                  qc_shape_str(2, w->shape, s1, sizeof s1), qc_shape_str(x->ndim, x->shape, s2, sizeof s2), (long long)K);
  if (b && (b->ndim != 1 || b->shape[0] != N))
    return qc_err("%s: params/bias %s: expected [%lld]", m->path, qc_shape_str(b->ndim, b->shape, s1, sizeof s1), (long long)N);
  if (dy->ndim < 1 || dy->shape[dy->ndim - 1] != N || qc_numel(dy) != M * N)
    return qc_err("%s: dY '%s' %s: expected [%lld, %lld] (tokens, out_features)", m->path, dy->name,
                  qc_shape_str(dy->ndim, dy->shape, s1, sizeof s1), (long long)M, (long long)N);

  double *W = NULL, *X = NULL, *G = NULL;
  void *og = NULL, *ox = NULL, *ow = NULL; /* operands' storage the reference made (raw_op, ref_wq_op) */
  qc_tensor dx = {0}, dw = {0}, db = {0};
  int64_t ws[2] = {N, K}, bs[1] = {N};
  /* d_x and d_weight may be skipped: a fast path judged them (ctx->skip) */
  const int want_dx = qc_ctx_wants(ctx, "d_x"), want_dw = qc_ctx_wants(ctx, "d_weight");
  const qc_contract *c = &m->contract;
  const char *wf = qc_contract_str(c, "weight_format", "none");
  const char *af = qc_contract_str(c, "activation_format", "none");
  const char *prof = qc_contract_str(c, "profile", "vllm"); /* --profile is merged into the contract */
  const qc_kv *ste = qc_contract_get(c, "ste");
  int clipped = ste && strcmp(ste->str, "clipped") == 0;
  double T = clipped ? (double)(float)ste->num : 0;
  const unsigned rnd = ctx->round_ops ? QC_GX_BF16 : 0; /* variant: the GEMMs' operands rounded to bf16 */
  /* the GEMMs read dY, X_ref and W_ref as gemm_f64_x operands (a device
   * keeps the module's own and the memo's); float64 copies only where a
   * host pass reads them: W for d_weight's mask under a clipped STE on a
   * quantized weight (and a diagnosis's stale scale), X for d_x's mask
   * under a clipped STE on a quantized activation, dY for d_bias */
  const int master_w = want_dw && clipped && strcmp(wf, "none") != 0;
  const int need_x = want_dx && clipped && strcmp(af, "none") != 0;
  qc_gemm_x gop;
  if (ctx->be->host_memory) { /* dY widened once: the host's GEMMs (and d_bias) read it twice */
    rc = QC_ESYS;
    if (!(G = qc_malloc((size_t)(M * N) * 8 + 8, "reference dY")) || (rc = qc_tensor_to_f64(dy, G))) goto done;
    gop = (qc_gemm_x){G, QC_F64, N, 0};
  } else if ((rc = raw_op(dy, N, &gop, &og))) {
    goto done;
  }
  rc = QC_ESYS;
  if ((master_w || (want_dx && ctx->wscale > 0)) &&
      (!(W = qc_malloc((size_t)(N * K) * 8, "reference weight")) || (rc = qc_tensor_to_f64(w, W))))
    goto done;
  if (need_x && (!(X = qc_malloc((size_t)(M * K) * 8, "reference input")) || (rc = qc_tensor_to_f64(x, X)))) goto done;
  qc_sr sr;
  if ((rc = qc_sr_from_contract(c, m->path, &sr))) goto done;

  char wx[QC_PATHLEN + 32], ww[QC_PATHLEN + 32];
  snprintf(wx, sizeof wx, "%s: inputs/x", m->path);
  snprintf(ww, sizeof ww, "%s: params/weight", m->path);
  /* d_weight = dY^T X_ref, then the weight quantizer's STE mask (from the
   * master W) */
  if (want_dw) {
    qc_gemm_x xop;
    const int xq = strcmp(qc_contract_str(c, "dw_input", "original"), "quantized") == 0;
    if ((rc = ref_wq_op(prof, xq ? af : "none", M, K, NULL, wx, x, &xop, &ox))) goto done;
    xop.flags |= rnd;
    if ((rc = qc_tensor_alloc_out(&dw, "d_weight", QC_F64, 2, ws))) goto done;
    if ((rc = ctx->be->gemm_f64_x(ctx->be, QC_OP_T, QC_OP_N, N, K, M, &gop, &xop, (double *)dw.data, K))) goto done;
    if (master_w)
      for (int64_t i = 0; i < N * K; i++)
        if (fabs(W[i]) > T) ((double *)dw.data)[i] = 0.0;
  }

  /* d_x = dY W_ref, then the activation quantizer's STE mask (from X) */
  if (want_dx) {
    int deq = strcmp(qc_contract_str(c, "dx_weight", "dequant"), "dequant") == 0;
    qc_gemm_x wop;
    if (ctx->wscale > 0) { /* variant: a stale per-tensor scale (diagnosis) */
      if (!deq || strcmp(wf, "fp8_tensor") != 0) { rc = QC_NA; goto done; }
      stale_fp8_tensor(W, N * K, ctx->wscale);
      wop = (qc_gemm_x){W, QC_F64, K, 0};
    } else if ((rc = ref_wq_op(prof, deq ? wf : "none", N, K, sr.on ? &sr : NULL, ww, w, &wop, &ow))) {
      goto done;
    }
    wop.flags |= rnd; /* variant: the dequantized weight rounded to bf16 */
    if ((rc = qc_tensor_alloc_out(&dx, "d_x", QC_F64, x->ndim, x->shape))) goto done;
    if ((rc = ctx->be->gemm_f64_x(ctx->be, QC_OP_N, QC_OP_N, M, K, N, &gop, &wop, (double *)dx.data, K))) goto done;
    if (need_x)
      for (int64_t i = 0; i < M * K; i++)
        if (fabs(X[i]) > T) ((double *)dx.data)[i] = 0.0;
    if ((rc = qc_tset_add(grads, &dx))) goto done;
  }
  if (want_dw && (rc = qc_tset_add(grads, &dw))) goto done;
  if (b) {
    rc = QC_ESYS;
    if (!G && (!(G = qc_malloc((size_t)(M * N) * 8 + 8, "reference dY")) || (rc = qc_tensor_to_f64(dy, G)))) goto done;
    if ((rc = qc_tensor_alloc(&db, "d_bias", QC_F64, 1, bs))) goto done;
    mat_job j = {.v = G, .rows = M, .cols = N, .out = db.data}; /* the zeroed d_bias += each row of dY, in order */
    qc_par_for(N, 256, colsum_piece, &j);
    if ((rc = qc_tset_add(grads, &db))) goto done;
  }
  rc = QC_OK;
done:
  free(W); free(X); free(G);
  free(og); free(ox); free(ow);
  qc_tensor_free(&db); /* no-ops on a tensor handed to grads */
  qc_tensor_free(&dw);
  qc_tensor_free(&dx);
  return rc;
}

/* The forward y = dequant(quant(X)) dequant(quant(W))^T + b in float64
 * (qc_fwd_ref_fn): X's rows quantized under activation_format, W under
 * weight_format with the contract's rounding, both under its profile; the
 * terms |X_q| |W_q|^T + |b| give the error model. Its operands are the
 * memo's, as the VJP's (ref_wq_op). */
static int ref_linear_forward(const qc_ctx *ctx, const qc_module *m, qc_tensor *y, qc_tol_model *tm) {
  const qc_tensor *x, *w, *b;
  int rc;
  if ((rc = qc_module_need(m, "inputs", "x", 1, QC_MAXDIM, &x))) return rc;
  if ((rc = qc_module_need(m, "params", "weight", 2, 2, &w))) return rc;
  b = qc_tset_get(&m->params, "bias");
  const int64_t K = x->shape[x->ndim - 1], M = K ? qc_numel(x) / K : 0, N = w->shape[0];
  if (w->shape[1] != K || (b && (b->ndim != 1 || b->shape[0] != N)))
    return qc_err("%s: params/weight or params/bias do not match inputs/x: expected weight [N, %lld], bias [N]", m->path,
                  (long long)K);
  const qc_contract *c = &m->contract;
  const char *wf = qc_contract_str(c, "weight_format", "none"), *af = qc_contract_str(c, "activation_format", "none");
  const char *prof = qc_contract_str(c, "profile", "vllm");
  if (ctx->wscale > 0 && strcmp(wf, "fp8_tensor") != 0) return QC_NA; /* a stale scale of a per-tensor weight only */
  /* variant bf16_params (qc_ctx.bf16_params): the weight and bias rounded
   * to bf16 as they are read, where they are float32 or float64 (16-bit
   * ones are kept, as the engine's rounded copies keep them); a variant
   * asked only of a contract that quantizes nothing (engine/variants.c) */
  if (ctx->bf16_params && strcmp(wf, "none") != 0) return QC_NA;
  const int round_w = ctx->bf16_params && (w->dtype == QC_F32 || w->dtype == QC_F64);
  const int round_b = ctx->bf16_params && b && (b->dtype == QC_F32 || b->dtype == QC_F64);
  double *W = NULL, *Xs = NULL, *B = NULL, *T = NULL;
  void *ox = NULL, *ow = NULL;
  qc_tensor out = {0};
  int64_t ys[QC_MAXDIM];
  memcpy(ys, x->shape, sizeof ys);
  ys[x->ndim - 1] = N;
  qc_sr sr;
  if ((rc = qc_sr_from_contract(c, m->path, &sr))) return rc;
  char wx[QC_PATHLEN + 32], ww[QC_PATHLEN + 32];
  snprintf(wx, sizeof wx, "%s: inputs/x", m->path);
  snprintf(ww, sizeof ww, "%s: params/weight", m->path);
  const int64_t ms = M < 256 ? M : 256;
  rc = QC_ESYS;
  if (!(Xs = qc_malloc((size_t)(ms * K + 1) * 8, "reference input (the terms' rows)")) ||
      !(B = qc_calloc((size_t)N + 1, 8, "reference bias")) || !(T = qc_malloc((size_t)(ms * N + 1) * 8, "forward terms")))
    goto done;
  qc_gemm_x xop, wop;
  if ((b && (rc = qc_tensor_to_f64(b, B))) || (rc = ref_wq_op(prof, af, M, K, NULL, wx, x, &xop, &ox))) goto done;
  if (round_b) qc_round_all(B, QC_F64, N, QC_BF16);
  if (ctx->wscale > 0) {
    rc = QC_ESYS;
    if (!(W = qc_malloc((size_t)(N * K + 1) * 8, "reference weight")) || (rc = qc_tensor_to_f64(w, W))) goto done;
    stale_fp8_tensor(W, N * K, ctx->wscale);
    wop = (qc_gemm_x){W, QC_F64, K, 0};
  } else if ((rc = ref_wq_op(prof, wf, N, K, sr.on ? &sr : NULL, ww, w, &wop, &ow))) {
    goto done;
  }
  if (round_w) wop.flags |= QC_GX_BF16;
  if (ctx->round_ops) { /* variant: the quantized operands rounded to bf16 before the GEMM */
    xop.flags |= QC_GX_BF16;
    wop.flags |= QC_GX_BF16;
  }
  if (ctx->be->host_memory && !W) { /* W_q widened once: the host reads it twice (y, then |W_q| for the terms) */
    rc = QC_ESYS;
    if (!(W = qc_malloc((size_t)(N * K + 1) * 8, "reference weight")) || (rc = qc_refu_hold(ctx->be, &wop, N, K, W))) goto done;
  }
  if ((rc = qc_tensor_alloc(&out, "y", QC_F64, x->ndim, ys))) goto done;
  double *Y = out.data;
  if ((rc = ctx->be->gemm_f64_x(ctx->be, QC_OP_N, QC_OP_T, M, N, K, &xop, &wop, Y, N))) goto done;
  mat_job yb = {.a = Y, .v = B, .rows = M, .cols = N};
  qc_par_for(M, qc_refu_row_grain(N), addrow_piece, &yb);
  /* the terms |X_q| |W_q|^T + |b|, over at most 256 evenly spaced rows
   * (||T|| scaled up from them; the per-element bound only from all rows) */
  for (int64_t j = 0; j < ms; j++) {
    qc_gemm_x row = xop;
    row.p = (const char *)xop.p + (size_t)((j * M / ms) * K) * qc_dtype_size(xop.dt);
    row.flags |= QC_GX_ABS;
    const double *v;
    double *own;
    if ((rc = qc_gemm_x_widen(&row, 1, K, &v, &own))) goto done;
    memcpy(Xs + j * K, v, (size_t)K * sizeof *v);
    free(own);
  }
  qc_gemm_x xs = {Xs, QC_F64, K, 0}, wa = {wop.p, wop.dt, K, wop.flags | QC_GX_ABS};
  if (wop.p == W) { /* the host's own float64 W_q: |.| in place, as the GEMM reads it */
    qc_abs_all(W, N * K);
    wa.flags = 0;
  }
  if ((rc = ctx->be->gemm_f64_x(ctx->be, QC_OP_N, QC_OP_T, ms, N, K, &xs, &wa, T, N))) goto done;
  double ss = 0, smax = 0;
  { /* per row, then the rows in order */
    double part[2 * 256];
    mat_job tj = {.a = T, .v = B, .rows = ms, .cols = N, .out = part};
    qc_par_for(ms, qc_refu_row_grain(N), terms_piece, &tj);
    for (int64_t i = 0; i < ms; i++) ss += part[2 * i], smax = fmax(smax, part[2 * i + 1]);
  }
  memset(tm, 0, sizeof *tm);
  tm->k = K > 0 ? K : 1;
  tm->lambda = 1;
  tm->scale = ms == M ? smax : 0;
  tm->terms = sqrt(ss * ((double)M / (double)(ms ? ms : 1)));
  snprintf(tm->why, sizeof tm->why, "y = X_q W_q^T + b sums over the K = %lld input features (terms |X_q| |W_q|)", (long long)K);
  *y = out;
  memset(&out, 0, sizeof out);
  rc = QC_OK;
done:
  qc_tensor_free(&out);
  free(W); free(Xs); free(B); free(T);
  free(ox); free(ow);
  return rc;
}

/* The class's reference, its one export (src/classes/registry.c pairs it
 * with src/modules/linear.c). */
const qc_reference qc_reference_linear = {.vjp = ref_linear, .forward = ref_linear_forward, .bf16_params = 1};
