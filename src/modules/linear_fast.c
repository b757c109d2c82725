/* modules/linear_fast.c: the linear class's fast path (its registry row's
 * `fast`): d_x and d_weight through the backend's fused audit_linear op
 * (the CUDA backend: quantize W, candidate bf16 GEMMs, float64 reference
 * GEMMs and the metrics all on the device, one upload of X, W and dY).
 *
 * It applies when the arithmetic the op runs is exactly what the contract
 * asks: bf16 tensors, identity STE, round-to-nearest weights, profile vllm,
 * a weight format the backend quantizes, d_weight from the original X, and
 * a builtin or bf16 dump candidate. Anything else takes the general path,
 * which runs on the same backend through its GEMM seam. d_bias is not
 * covered: the engine takes it from the class's two VJPs (production and
 * reference), told to skip what this path judged. */
#include <stdio.h>
#include <string.h>

#include "backend/backend.h"
#include "core/qc.h"
#include "model/module.h"
#include "modules/classes.h"

/* 1 when the contract's key has the value v (its default when absent). */
static int is(const qc_module *m, const char *key, const char *dflt, const char *v) {
  return strcmp(qc_contract_str(&m->contract, key, dflt), v) == 0;
}

/* The bf16 tensor `name` of set s with the given shape, or NULL. */
static const qc_tensor *bf16_of(const qc_tset *s, const char *name, int ndim, const int64_t *shape) {
  const qc_tensor *t = s ? qc_tset_get(s, name) : NULL;
  if (!t || t->dtype != QC_BF16 || t->ndim != ndim) return NULL;
  for (int i = 0; i < ndim; i++)
    if (t->shape[i] != shape[i]) return NULL; /* a reshaped candidate goes the general path: a shape mismatch */
  return t;
}

/* Gradient `name` (i: 0 d_x, 1 d_weight of the audit's output o) into out. */
static void put(qc_fast_out *out, const char *name, int ndim, const int64_t *shape, const qc_linear_audit_out *o, int i) {
  const qc_metrics *m = i ? &o->dw : &o->dx;
  qc_fast_grad *g = &out->g[out->n++];
  snprintf(g->name, sizeof g->name, "%s", name);
  g->ndim = ndim;
  memcpy(g->shape, shape, (size_t)ndim * sizeof *shape);
  g->cand_dtype = QC_BF16;
  g->m = *m;
  g->ref = (qc_refgemm){.slices = o->ref_ran[i], .kept = o->ref_ran[i] && o->ref_fast[i], .err = o->ref_err[i],
                         .err_norm = o->ref_err_norm[i], .gate = o->ref_gate[i],
                         .pairs = o->ref_pairs[i]};
}

/* The fast path (see the file comment and qc_fast_fn). */
int qc_fast_linear(const qc_ctx *ctx, const qc_module *m, const qc_tensor *dy, const qc_tset *cand, qc_fast_out *out) {
  const qc_backend *be = ctx->be;
  out->n = 0;
  if (!be->audit_linear) return QC_OK;
  if (!is(m, "ste", "identity", "identity") || !is(m, "rounding", "rn", "rn") || !is(m, "profile", "vllm", "vllm") ||
      !is(m, "dw_input", "original", "original"))
    return QC_OK;
  const qc_tensor *x = qc_tset_get(&m->inputs, "x"), *w = qc_tset_get(&m->params, "weight");
  const qc_tensor *b = qc_tset_get(&m->params, "bias");
  if (!x || !w || w->ndim != 2 || x->ndim < 1 || x->dtype != QC_BF16 || w->dtype != QC_BF16 || dy->dtype != QC_BF16) return QC_OK;
  const int64_t K = x->shape[x->ndim - 1], N = w->shape[0], M = K ? qc_numel(x) / K : 0;
  if (M < 1 || K < 1 || w->shape[1] != K || qc_numel(dy) != M * N || dy->shape[dy->ndim - 1] != N) return QC_OK;
  if (b && (b->ndim != 1 || b->shape[0] != N || b->dtype != QC_BF16)) return QC_OK;
  const char *fmt = is(m, "dx_weight", "dequant", "master") ? "none" : qc_contract_str(&m->contract, "weight_format", "none");
  const qc_tensor *cx = NULL, *cw = NULL;
  if (cand) {
    cx = bf16_of(cand, "d_x", x->ndim, x->shape);
    cw = bf16_of(cand, "d_weight", 2, w->shape);
    if (!cx || !cw || (b && !bf16_of(cand, "d_bias", 1, b->shape))) return QC_OK; /* missing or odd candidates: the general path reports them */
  }

  int rc;
  void *dx_ = NULL, *dw_ = NULL, *ddy = NULL, *dcx = NULL, *dcw = NULL;
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
                        .weight_format = fmt, .profile = "vllm", .ref_slices = ctx->ref_slices};
  if ((rc = be->audit_linear(be, &la, &o))) goto done;
  int64_t wshape[2] = {N, K};
  put(out, "d_x", x->ndim, x->shape, &o, 0);
  put(out, "d_weight", 2, wshape, &o, 1);
  if (qc_verbose)
    fprintf(stderr, "qatcheck: %s: fused linear audit on %s: quantize %.3f ms, candidate %.3f ms, reference %.3f ms, "
                    "metrics %.3f ms, %.3f GiB of device memory\n",
            m->path, be->name, o.ms_quant, o.ms_cand, o.ms_ref, o.ms_metrics, o.device_bytes / 1073741824.0);
done:
  be->buf_free(be, dx_);
  be->buf_free(be, dw_);
  be->buf_free(be, ddy);
  be->buf_free(be, dcx);
  be->buf_free(be, dcw);
  return rc;
}
