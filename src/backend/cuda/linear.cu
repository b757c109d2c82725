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
  size_t bx = qc_bias_dev_doubles(M, K), bw = qc_bias_dev_doubles(N, K);
  b->bias = (double *)carve(&p, bx * 8);
  b->bias2 = (double *)carve(&p, bw * 8);
  b->bias_out = (double *)carve(&p, 2 * QK_BIAS_NSUM * 8);
}

int cu_ev_ms(const cu *c, cudaEvent_t a, cudaEvent_t b, double *ms) {
  float f = 0;
  cudaError_t e = cudaEventElapsedTime(&f, a, b);
  *ms = f;
  return e == cudaSuccess ? QC_OK : cu_fail(c, "event timing", e);
}

static_assert(QK_SUM_THREADS == QC_DEV_SUM_THREADS && QK_SUM_COLS == QC_DEV_SUM_COLS && QK_SUM_ROWS == QC_DEV_SUM_ROWS &&
                  QK_SUM_FB == QC_DEV_SUM_FB,
              "the fused pass's blocks and the arena's estimate (numerics/metrics.h) must agree");

/* Queue the fused metrics and bias pass of bf16 candidate g against r
 * ([rows, cols] device buffers): the metrics into c->mres[slot], the bias
 * test's combined sums into out[QK_BIAS_NSUM]. No allocation, no sync: the
 * audit downloads both at its one sync. */
static int cu_sums_queue(cu *c, cudaStream_t st, const uint16_t *g, const double *r, int64_t rows, int64_t cols, int slot,
                         double *scratch, double *out) {
  int rc = QC_OK;
  if (qk_audit_sums_doubles(rows, cols) > qc_bias_dev_doubles(rows, cols))
    return qc_err_sys("%s: the fused audit pass needs more scratch than the arena holds", c->name);
  CK((cudaError_t)qk_audit_sums(g, r, rows, cols, qc_bias_use_cols(rows, cols), scratch, c->mres + slot, out, st),
     "metrics and bias sums");
done:
  return rc;
}

/* Fill m's bias fields (its other metrics filled) from the combined sums. */
static void cu_bias_fill(const double *v, int64_t rows, int64_t cols, qc_metrics *m) {
  qc_bias_sums s;
  memset(&s, 0, sizeof s);
  s.rows = rows;
  s.cols = qc_bias_use_cols(rows, cols) ? cols : 0;
  s.sxr = v[0]; s.srr = v[1]; s.sxx = v[2]; s.sx2r2 = v[3]; s.sxr3 = v[4]; s.sr4 = v[5]; s.snf = v[6];
  s.row_tt = v[7]; s.row_tc = v[8]; s.row_cc = v[9];
  s.col_tt = v[10]; s.col_tc = v[11]; s.col_cc = v[12];
  qc_bias_finish(&s, m);
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
  if (a->ref_slices == QC_REF_AUTO && (rc = cu_ref_probe(c))) return rc; /* once per backend, before the arena grows */
  if (c->arena_bytes < need) {
    cudaError_t e = cudaFree(c->arena);
    c->arena = NULL;
    c->arena_bytes = 0;
    if (e != cudaSuccess) return cu_fail(c, "cudaFree (the audit's smaller arena)", e);
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

  /* Decode shapes (M <= QK_FUSE_M tokens, the reference not asked for):
   * the reference d_x is summed inside the block128 quantizer from W_ref
   * as it is made, so W_ref is never written in float64 (the largest array
   * of the audit, otherwise written once and read once by the d_x DGEMM).
   * QC_CUDA_UNFUSED=1 turns it off (the benchmark's side-by-side). */
  const int unfused = c->sw[CU_SW_UNFUSED];
  const int64_t tiles = (N + 127) / 128;
  const int fuse_dx = !unfused && M <= QK_FUSE_M && !o->dx_ref && tiles * M <= N &&
                      (q.fmt == QK_FP8_BLOCK128 || q.fmt == QK_FP8_BLOCK128_UE8M0);
  /* Two streams, so that memory-bound passes run in the shadow of others:
   *   st:  widen dY | quantize W (W_ref) | d_x DGEMM | d_weight metrics
   *   st2: widen X, candidate d_weight, d_weight DGEMM (these need no W) |
   *        candidate d_x, d_x metrics (once W_ref and the reference d_x are)
   * Events: ev[1] dY widened; ev[3] W_ref made; ev[5] the reference d_x
   * ready; ev[6] the d_weight pair ready; ev[2] d_x's sums done. Every
   * cuBLASLt call is on st2 (one workspace); each stream has its cuBLAS
   * handle. */
  /* QC_CUDA_DW_EARLY=1: d_weight's metrics on the second stream right
   * after its pair, beside the quantizer (measured side by side) */
  const int dw_early = c->sw[CU_SW_DW_EARLY];
  int dw_now = 0; /* d_weight's metrics queued early: dw_early, on a DGEMM reference */
  gx = a->dx_cand ? a->dx_cand : cx;
  gw = a->dw_cand ? a->dw_cand : cw;
  CK(cudaEventRecord(c->ev[0], c->st), "event");
  CK((cudaError_t)qk_bf16_to_f64(a->dy, dy64, (int64_t)mn, c->st), "convert dY");
  CK(cudaEventRecord(c->ev[1], c->st), "event");
  /* the second stream: d_weight's pair, candidate (bf16 operands, fp32
   * accumulation, bf16 out) and reference (float64) */
  CK(cudaStreamWaitEvent(c->st2, c->ev[1], 0), "stream order");
  CK((cudaError_t)qk_bf16_to_f64(a->x, x64, (int64_t)mk, c->st2), "convert X");
  if (!a->dw_cand && (rc = cu_lt_gemm_on(c, c->st2, QC_OP_T, QC_OP_N, N, K, M, a->dy, N, a->x, K, cw, K, CUDA_R_16BF)))
    goto done;
  if ((rc = cu_ref_gemm(c, a->ref_slices, 1, c->st2, c->blas2, QC_OP_T, QC_OP_N, N, K, M, dy64, N, x64, K, rw, K))) goto done;
  /* early only on DGEMM: a fast d_weight reference is final once cu_ref_settle has judged it (below) */
  dw_now = dw_early && !c->oz.pend[1].used;
  if (dw_now && (rc = cu_sums_queue(c, c->st2, gw, rw, N, K, 1, bu.bias2, bu.bias_out + QK_BIAS_NSUM))) goto done;
  CK(cudaEventRecord(c->ev[6], c->st2), "event");
  /* W_ref: bf16 for the candidate, float64 for the reference */
  if (q.fmt == QK_NONE) {
    wref = a->w;
    CK((cudaError_t)qk_bf16_to_f64(a->w, wq64, (int64_t)nk, c->st), "convert W");
  } else {
    q.rows = N;
    q.cols = K;
    q.in_bf16 = 1;
    q.in = a->w;
    q.deq_bf16 = wq16;
    q.deq_f64 = fuse_dx ? NULL : wq64;
    q.scratch = c->qscratch;
    if (fuse_dx) { /* the tiles' partials of d_x in W_ref's float64 buffer (tiles * M <= N rows of it) */
      q.fuse_m = (int)M;
      q.fuse_dy = a->dy;
      q.fuse_part = wq64;
    }
    CK((cudaError_t)qk_quantize(&q, c->st), "quantize W");
    wref = wq16;
  }
  CK(cudaEventRecord(c->ev[3], c->st), "event");
  /* the reference d_x = dY W_ref in float64 */
  if (fuse_dx) CK((cudaError_t)qk_fuse_dx_final(wq64, (int)tiles, (int)M, K, rx, c->st), "reference d_x");
  else if ((rc = cu_ref_gemm(c, a->ref_slices, 0, c->st, c->blas, QC_OP_N, QC_OP_N, M, K, N, dy64, N, wq64, K, rx, K))) goto done;
  if ((rc = cu_ref_settle(c, o))) goto done; /* the fast reference's check (ozaki.cu); nothing without one */
  /* a fast d_weight reference's products (and any fallback) were queued on st2 after ev[6]: mark its end again,
   * so that what waits for it does not rest on the settle's host sync */
  if (o->ref_ran[1]) CK(cudaEventRecord(c->ev[6], c->st2), "event");
  CK(cudaEventRecord(c->ev[5], c->st), "event");
  /* d_x's candidate and metrics on the second stream, d_weight's metrics here */
  CK(cudaStreamWaitEvent(c->st2, c->ev[5], 0), "stream order");
  if (!a->dx_cand && (rc = cu_lt_gemm_on(c, c->st2, QC_OP_N, QC_OP_N, M, K, N, a->dy, N, wref, K, cx, K, CUDA_R_16BF)))
    goto done;
  if ((rc = cu_sums_queue(c, c->st2, gx, rx, M, K, 0, bu.bias, bu.bias_out))) goto done;
  CK(cudaEventRecord(c->ev[2], c->st2), "event");
  CK(cudaStreamWaitEvent(c->st, c->ev[6], 0), "stream order");
  if (!dw_now && (rc = cu_sums_queue(c, c->st, gw, rw, N, K, 1, bu.bias2, bu.bias_out + QK_BIAS_NSUM))) goto done;
  CK(cudaStreamWaitEvent(c->st, c->ev[2], 0), "stream order");
  CK(cudaEventRecord(c->ev[4], c->st), "event");
  {
    /* the audit's one sync: metrics, bias sums and the quantizer status in one pinned block */
    struct cu::cu_lin_host *h = c->lh;
    CK(cudaMemcpyAsync(h->ms, c->mres, sizeof h->ms, cudaMemcpyDeviceToHost, c->st), "download metrics");
    CK(cudaMemcpyAsync(h->bias, bu.bias_out, sizeof h->bias, cudaMemcpyDeviceToHost, c->st), "download bias sums");
    if (q.fmt != QK_NONE) CK(cudaMemcpyAsync(h->qs, c->qscratch, sizeof h->qs, cudaMemcpyDeviceToHost, c->st), "download quantizer status");
    else memset(h->qs, 0, sizeof h->qs);
    if (o->dx_ref) CK(cudaMemcpyAsync(o->dx_ref, rx, mk * 8, cudaMemcpyDeviceToHost, c->st), "download d_x reference");
    if (o->dw_ref) CK(cudaMemcpyAsync(o->dw_ref, rw, nk * 8, cudaMemcpyDeviceToHost, c->st), "download d_weight reference");
    if (o->dx_out) CK(cudaMemcpyAsync(o->dx_out, gx, mk * 2, cudaMemcpyDeviceToHost, c->st), "download d_x candidate");
    if (o->dw_out) CK(cudaMemcpyAsync(o->dw_out, gw, nk * 2, cudaMemcpyDeviceToHost, c->st), "download d_weight candidate");
    CK(cudaStreamSynchronize(c->st), "linear audit");
    if (h->qs[1]) {
      rc = qc_err("params/weight: %u non-finite value(s): a quantizer never maps NaN or Inf silently", h->qs[1]);
      goto done;
    }
    cu_metrics_fill(&h->ms[0], &o->dx);
    cu_metrics_fill(&h->ms[1], &o->dw);
    cu_bias_fill(h->bias[0], M, K, &o->dx);
    cu_bias_fill(h->bias[1], N, K, &o->dw);
  }
  if ((rc = cu_ev_ms(c, c->ev[0], c->ev[3], &o->ms_quant)) ||  /* widen dY, make W_ref */
      (rc = cu_ev_ms(c, c->ev[3], c->ev[5], &o->ms_ref)) ||     /* the reference d_x */
      (rc = cu_ev_ms(c, c->ev[1], c->ev[6], &o->ms_cand)) ||    /* the second stream's d_weight pair, beside the two above */
      (rc = cu_ev_ms(c, c->ev[5], c->ev[4], &o->ms_metrics)))   /* candidate d_x and both metrics passes */
    goto done;
  o->device_bytes = need;
done:
  if (rc) rc = cu_keep(c, rc, cudaStreamSynchronize(c->st2), "the second stream"); /* nothing of this audit left running there */
  return rc;
}
