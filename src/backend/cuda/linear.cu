/* linear.cu: the fused linear audit on device buffers: quantize W,
 * candidate bf16 GEMMs, float64 reference GEMMs and the metrics on the
 * device, one upload of X, W and dY (the linear class's fast path). */
#include <cublasLt.h>
#include <cublas_v2.h>
#include <cuda_runtime.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend/cuda/cuda_priv.h"

/* Carve the next `bytes` (256-aligned) out of the arena. */
static void *carve(char **p, size_t bytes) {
  void *r = *p;
  *p += (bytes + 255) & ~(size_t)255;
  return r;
}



void cu_lin_layout(const cu *c, int64_t M, int64_t K, int64_t N, lin_bufs *b) {
  const size_t mk = (size_t)(M * K), nk = (size_t)(N * K), mn = (size_t)(M * N);
  char *p = (char *)c->arena;
  b->wq64 = (double *)carve(&p, nk * 8);
  b->x64 = (double *)carve(&p, mk * 8);
  b->dy64 = (double *)carve(&p, mn * 8);
  b->rx = (double *)carve(&p, mk * 8);
  b->rw = (double *)carve(&p, nk * 8);
  b->wq16 = (uint16_t *)carve(&p, nk * 2);
  b->cx = (uint16_t *)carve(&p, mk * 2);
  b->cw = (uint16_t *)carve(&p, nk * 2);
}

float cu_ev_ms(cudaEvent_t a, cudaEvent_t b) {
  float ms = 0;
  cudaEventElapsedTime(&ms, a, b);
  return ms;
}

/* The bias test of bf16 candidate g against r ([rows, cols] device
 * buffers) into m (its other metrics filled): the row and column sums on
 * the device, combined on the host in a fixed order (qc_bias_sums). */
static int cu_bias(cu *c, const uint16_t *g, const double *r, int64_t rows, int64_t cols, qc_metrics *m) {
  int rc = QC_OK, usec = qc_bias_use_cols(rows, cols);
  int chunks = usec ? (int)(rows < 64 ? rows : 64) : 0;
  while (chunks > 1 && (int64_t)chunks * cols > ((int64_t)1 << 23)) chunks /= 2;
  size_t nr = (size_t)rows * 7, np = (size_t)chunks * (size_t)cols * 2;
  double *d = NULL, *h = (double *)malloc((nr + np + 1) * sizeof *h);
  qc_bias_sums s;
  memset(&s, 0, sizeof s);
  s.rows = rows;
  s.cols = cols;
  if (!h) return qc_err_sys("out of memory for the bias test's sums");
  if ((rc = cu_dalloc(c, (nr + np + 1) * sizeof *d, "bias sums", (void **)&d))) goto done;
  CK((cudaError_t)qk_bias_rows(g, r, rows, cols, d, c->st), "bias row sums");
  if (chunks) CK((cudaError_t)qk_bias_cols(g, r, rows, cols, chunks, d + nr, c->st), "bias column sums");
  CK(cudaMemcpyAsync(h, d, (nr + np) * sizeof *h, cudaMemcpyDeviceToHost, c->st), "download bias sums");
  CK(cudaStreamSynchronize(c->st), "bias sums");
  qc_bias_sums_from_parts(&s, h, chunks ? h + nr : NULL, chunks);
  qc_bias_finish(&s, m);
done:
  cudaFree(d);
  free(h);
  return rc;
}

/* backend.h audit_linear: the whole in-memory linear audit on device
 * buffers, one stream, one sync at the end (stage times from events). */
int cu_audit_linear(const qc_backend *be, const qc_linear_audit *a, qc_linear_audit_out *o) {
  cu *c = C(be);
  int rc = QC_OK;
  const int64_t M = a->M, K = a->K, N = a->N;
  const size_t mk = (size_t)(M * K), nk = (size_t)(N * K), mn = (size_t)(M * N);
  const char *fmt = a->weight_format ? a->weight_format : "none";
  size_t need = qc_linear_audit_bytes(M, K, N);
  qk_qargs q;
  lin_bufs bu;
  uint16_t *wq16, *cx, *cw;
  double *wq64, *x64, *dy64, *rx, *rw;
  const uint16_t *wref, *gx, *gw;
  memset(&q, 0, sizeof q);
  if (M < 1 || K < 1 || N < 1) return qc_err("%s: linear audit: M, K, N must be >= 1", c->name);
  if ((rc = cu_qfmt(c, fmt, a->profile, &q))) return rc;
  if (c->arena_bytes < need) {
    cudaFree(c->arena);
    c->arena = NULL;
    c->arena_bytes = 0;
    char what[160];
    snprintf(what, sizeof what, "the linear audit of [M %lld, K %lld, N %lld]", (long long)M, (long long)K, (long long)N);
    if ((rc = cu_dalloc(c, need, what, &c->arena))) return rc;
    c->arena_bytes = need;
  }
  if (qc_verbose)
    fprintf(stderr, "qatcheck: %s: linear audit [M %lld, K %lld, N %lld] holds %.3f GiB of device memory\n", c->name,
            (long long)M, (long long)K, (long long)N, need / GiB);
  cu_lin_layout(c, M, K, N, &bu);
  wq64 = bu.wq64; x64 = bu.x64; dy64 = bu.dy64; rx = bu.rx; rw = bu.rw;
  wq16 = bu.wq16; cx = bu.cx; cw = bu.cw;

  CK(cudaEventRecord(c->ev[0], c->st), "event");
  /* W_ref (bf16 for the candidate, float64 for the reference), X and dY in float64 */
  if (q.fmt == QK_NONE) {
    wref = a->w;
    CK((cudaError_t)qk_bf16_to_f64(a->w, wq64, (int64_t)nk, c->st), "convert W");
  } else {
    q.rows = N;
    q.cols = K;
    q.in_bf16 = 1;
    q.in = a->w;
    q.deq_bf16 = wq16;
    q.deq_f64 = wq64;
    q.scratch = c->qscratch;
    CK((cudaError_t)qk_quantize(&q, c->st), "quantize W");
    wref = wq16;
  }
  CK((cudaError_t)qk_bf16_to_f64(a->x, x64, (int64_t)mk, c->st), "convert X");
  CK((cudaError_t)qk_bf16_to_f64(a->dy, dy64, (int64_t)mn, c->st), "convert dY");
  CK(cudaEventRecord(c->ev[1], c->st), "event");
  /* candidate: d_x = dY W_ref, d_weight = dY^T X; bf16 operands, fp32 accumulation, bf16 out */
  gx = a->dx_cand ? a->dx_cand : cx;
  gw = a->dw_cand ? a->dw_cand : cw;
  if (!a->dx_cand && (rc = cu_lt_gemm(c, QC_OP_N, QC_OP_N, M, K, N, a->dy, N, wref, K, cx, K, CUDA_R_16BF))) goto done;
  if (!a->dw_cand && (rc = cu_lt_gemm(c, QC_OP_T, QC_OP_N, N, K, M, a->dy, N, a->x, K, cw, K, CUDA_R_16BF))) goto done;
  CK(cudaEventRecord(c->ev[2], c->st), "event");
  /* reference: the same products in float64 */
  if ((rc = cu_dgemm_dev(c, QC_OP_N, QC_OP_N, M, K, N, dy64, N, wq64, K, rx, K))) goto done;
  if ((rc = cu_dgemm_dev(c, QC_OP_T, QC_OP_N, N, K, M, dy64, N, x64, K, rw, K))) goto done;
  CK(cudaEventRecord(c->ev[3], c->st), "event");
  if ((rc = cu_metrics_dev(c, gx, 1, rx, (int64_t)mk, 0, NULL)) || (rc = cu_metrics_dev(c, gw, 1, rw, (int64_t)nk, 1, NULL)))
    goto done;
  CK(cudaEventRecord(c->ev[4], c->st), "event");
  {
    qk_msum s[2];
    uint32_t qs[4] = {0, 0, 0, 0};
    CK(cudaMemcpyAsync(s, c->mres, sizeof s, cudaMemcpyDeviceToHost, c->st), "download metrics");
    if (q.fmt != QK_NONE) CK(cudaMemcpyAsync(qs, c->qscratch, sizeof qs, cudaMemcpyDeviceToHost, c->st), "download quantizer status");
    if (o->dx_ref) CK(cudaMemcpyAsync(o->dx_ref, rx, mk * 8, cudaMemcpyDeviceToHost, c->st), "download d_x reference");
    if (o->dw_ref) CK(cudaMemcpyAsync(o->dw_ref, rw, nk * 8, cudaMemcpyDeviceToHost, c->st), "download d_weight reference");
    if (o->dx_out) CK(cudaMemcpyAsync(o->dx_out, gx, mk * 2, cudaMemcpyDeviceToHost, c->st), "download d_x candidate");
    if (o->dw_out) CK(cudaMemcpyAsync(o->dw_out, gw, nk * 2, cudaMemcpyDeviceToHost, c->st), "download d_weight candidate");
    CK(cudaStreamSynchronize(c->st), "linear audit");
    if (qs[1]) {
      rc = qc_err("params/weight: %u non-finite value(s): a quantizer never maps NaN or Inf silently", qs[1]);
      goto done;
    }
    cu_metrics_fill(&s[0], &o->dx);
    cu_metrics_fill(&s[1], &o->dw);
  }
  if ((rc = cu_bias(c, gx, rx, M, K, &o->dx)) || (rc = cu_bias(c, gw, rw, N, K, &o->dw))) goto done;
  o->ms_quant = cu_ev_ms(c->ev[0], c->ev[1]);
  o->ms_cand = cu_ev_ms(c->ev[1], c->ev[2]);
  o->ms_ref = cu_ev_ms(c->ev[2], c->ev[3]);
  o->ms_metrics = cu_ev_ms(c->ev[3], c->ev[4]);
  o->device_bytes = need;
done:
  return rc;
}
