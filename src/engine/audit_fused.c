/* audit_fused.c: the linear audit through the backend's fused audit_linear
 * op (the CUDA backend: quantize W, candidate bf16 GEMMs, float64 reference
 * GEMMs and the metrics all on the device, one upload of X, W and dY). It
 * applies when the arithmetic it runs is exactly what the contract asks:
 * bf16 tensors, identity STE, round-to-nearest weights, profile vllm, a
 * weight format the backend quantizes, d_weight from the original X, and a
 * builtin or bf16 dump candidate. Anything else takes the general path
 * (audit.c), which runs on the same backend through its GEMM seam. d_bias,
 * when there is a bias, is a column sum of dY and stays on the host. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine/audit.h"
#include "backend/backend.h"
#include "numerics/formats.h"
#include "core/qc.h"

/* 1 when the contract's key has the value v (its default when absent). */
static int is(const qc_module *m, const char *key, const char *dflt, const char *v) {
  return strcmp(qc_contract_str(&m->contract, key, dflt), v) == 0;
}

/* The bf16 tensor `name` of set s with n elements, or NULL. */
static const qc_tensor *bf16_of(const qc_tset *s, const char *name, int ndim, const int64_t *shape) {
  const qc_tensor *t = s ? qc_tset_get(s, name) : NULL;
  if (!t || t->dtype != QC_BF16 || t->ndim != ndim) return NULL;
  for (int i = 0; i < ndim; i++)
    if (t->shape[i] != shape[i]) return NULL; /* a reshaped candidate goes the general path: a shape mismatch */
  return t;
}

/* d_bias: the float64 reference (column sums of dY) and the builtin
 * candidate (float32 sums of the bf16 dY, rounded to bf16), dY [M, N]. */
static int bias_grads(const qc_tensor *dy, int64_t M, int64_t N, qc_tensor *ref, qc_tensor *cand) {
  int64_t s[1] = {N};
  int rc;
  if ((rc = qc_tensor_alloc(ref, "d_bias", QC_F64, 1, s)) || (cand && (rc = qc_tensor_alloc(cand, "d_bias", QC_BF16, 1, s))))
    return rc;
  float *acc = qc_calloc((size_t)N, sizeof *acc, "d_bias accumulator");
  if (!acc) return QC_ESYS;
  const uint16_t *g = dy->data;
  double *r = ref->data;
  for (int64_t i = 0; i < M; i++)
    for (int64_t n = 0; n < N; n++) {
      float v = qc_bf16_to_f32(g[i * N + n]);
      r[n] += v;
      acc[n] += v;
    }
  if (cand)
    for (int64_t n = 0; n < N; n++) ((uint16_t *)cand->data)[n] = qc_f32_to_bf16(acc[n]);
  free(acc);
  return QC_OK;
}

int qc_audit_linear_fused(qc_audit *a, const qc_module *m, int i, int *done) {
  const qc_backend *be = a->ctx->be;
  *done = 0;
  if (!be->audit_linear || strcmp(m->cls->name, "linear") != 0 || a->cs->cand == QC_CAND_PLUGIN) return QC_OK;
  if (!is(m, "ste", "identity", "identity") || !is(m, "rounding", "rn", "rn") || !is(m, "profile", "vllm", "vllm") ||
      !is(m, "dw_input", "original", "original"))
    return QC_OK;
  const qc_tensor *x = qc_tset_get(&m->inputs, "x"), *w = qc_tset_get(&m->params, "weight");
  const qc_tensor *b = qc_tset_get(&m->params, "bias"), *dy = &m->grad_out.t[i];
  if (!x || !w || w->ndim != 2 || x->ndim < 1 || x->dtype != QC_BF16 || w->dtype != QC_BF16 || dy->dtype != QC_BF16) return QC_OK;
  const int64_t K = x->shape[x->ndim - 1], N = w->shape[0], M = K ? qc_numel(x) / K : 0;
  if (M < 1 || K < 1 || w->shape[1] != K || qc_numel(dy) != M * N || dy->shape[dy->ndim - 1] != N) return QC_OK;
  if (b && (b->ndim != 1 || b->shape[0] != N || b->dtype != QC_BF16)) return QC_OK;
  const char *fmt = is(m, "dx_weight", "dequant", "master") ? "none" : qc_contract_str(&m->contract, "weight_format", "none");
  const qc_tensor *cx = NULL, *cw = NULL, *cb = NULL;
  if (a->cs->cand == QC_CAND_DUMP) {
    const qc_tset *cs = m->cand ? &m->cand[i] : NULL;
    cx = bf16_of(cs, "d_x", x->ndim, x->shape);
    cw = bf16_of(cs, "d_weight", 2, w->shape);
    cb = b ? bf16_of(cs, "d_bias", 1, b->shape) : NULL;
    if (!cx || !cw || (b && !cb)) return QC_OK; /* missing or odd candidates: the general path reports them */
  }
  const qc_tol *tx = qc_audit_tol(a, m, "d_x"), *tw = tx ? qc_audit_tol(a, m, "d_weight") : NULL;
  const qc_tol *tb = b && tw ? qc_audit_tol(a, m, "d_bias") : NULL;
  if (!tx || !tw || (b && !tb)) return QC_EINPUT;

  int rc;
  void *dx_ = NULL, *dw_ = NULL, *ddy = NULL, *dcx = NULL, *dcw = NULL;
  qc_tensor bref = {0}, bcand = {0};
  qc_linear_audit_out o;
  memset(&o, 0, sizeof o);
  if ((rc = be->buf_alloc(be, x->nbytes, "inputs/x", &dx_)) || (rc = be->buf_alloc(be, w->nbytes, "params/weight", &dw_)) ||
      (rc = be->buf_alloc(be, dy->nbytes, "dY", &ddy)) || (rc = be->upload(be, dx_, x->data, x->nbytes)) ||
      (rc = be->upload(be, dw_, w->data, w->nbytes)) || (rc = be->upload(be, ddy, dy->data, dy->nbytes)))
    goto done;
  if (cx && ((rc = be->buf_alloc(be, cx->nbytes, "candidate d_x", &dcx)) || (rc = be->upload(be, dcx, cx->data, cx->nbytes)) ||
             (rc = be->buf_alloc(be, cw->nbytes, "candidate d_weight", &dcw)) || (rc = be->upload(be, dcw, cw->data, cw->nbytes))))
    goto done;
  qc_linear_audit la = {.M = M, .K = K, .N = N, .x = dx_, .w = dw_, .dy = ddy, .dx_cand = dcx, .dw_cand = dcw,
                        .weight_format = fmt, .profile = "vllm"};
  if ((rc = be->audit_linear(be, &la, &o))) goto done;
  int64_t wshape[2] = {N, K};
  qc_check k;
  qc_check_init(&k, m, dy->name, "d_x", x->ndim, x->shape, tx);
  snprintf(k.cand_dtype, sizeof k.cand_dtype, "bfloat16");
  k.m = o.dx;
  qc_audit_verdict(&k, QC_BF16, tx);
  if ((rc = qc_results_add(a->res, &k))) goto done;
  qc_check_init(&k, m, dy->name, "d_weight", 2, wshape, tw);
  snprintf(k.cand_dtype, sizeof k.cand_dtype, "bfloat16");
  k.m = o.dw;
  qc_audit_verdict(&k, QC_BF16, tw);
  if ((rc = qc_results_add(a->res, &k))) goto done;
  if (b) {
    if ((rc = bias_grads(dy, M, N, &bref, cb ? NULL : &bcand))) goto done;
    qc_check_init(&k, m, dy->name, "d_bias", 1, bref.shape, tb);
    snprintf(k.cand_dtype, sizeof k.cand_dtype, "bfloat16");
    if ((rc = qc_audit_compare(a->ctx, cb ? cb : &bcand, &bref, tb, &k)) || (rc = qc_results_add(a->res, &k))) goto done;
  }
  if (qc_verbose)
    fprintf(stderr, "qatcheck: %s: fused linear audit on %s: quantize %.3f ms, candidate %.3f ms, reference %.3f ms, "
                    "metrics %.3f ms, %.3f GiB of device memory\n",
            m->path, be->name, o.ms_quant, o.ms_cand, o.ms_ref, o.ms_metrics, o.device_bytes / 1073741824.0);
  *done = 1;
done:
  be->buf_free(be, dx_);
  be->buf_free(be, dw_);
  be->buf_free(be, ddy);
  be->buf_free(be, dcx);
  be->buf_free(be, dcw);
  qc_tensor_free(&bref);
  qc_tensor_free(&bcand);
  return rc;
}
