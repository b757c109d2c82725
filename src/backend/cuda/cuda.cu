/* cuda.cu: the CUDA backend (backend.h) on one device and one stream.
 *   gemm_f64      cuBLAS DGEMM (the reference's GEMM; FP64 arithmetic only)
 *   gemm_bf16     cuBLASLt, bf16 operands, fp32 accumulation, fp32 output
 *   metrics       the fused deterministic pass (kernels/metrics.cu)
 *   quantize      kernels/quant.cu, profile vllm
 *   audit_linear  the whole in-memory linear audit on device buffers
 * Every CUDA, cuBLAS and cuBLASLt status is checked. No device, an index out
 * of range, too little memory (with the amount needed) or a configuration
 * cuBLASLt cannot run is QC_EINPUT with one line; nothing falls back. */
#include <cublasLt.h>
#include <cublas_v2.h>
#include <cuda_runtime.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

extern "C" {
#include "core/qc.h"
#include "numerics/quant.h"
#include "backend/backend.h"
#include "backend/cuda/cuda.h"
#include "kernels/kernels.h"
}

#define GiB (1024.0 * 1024.0 * 1024.0)
#define WS_BYTES ((size_t)32 << 20)
#define PEND 64

typedef struct cu {
  qc_backend be;
  int dev;
  char name[32];
  cudaStream_t st;
  cublasHandle_t blas;
  cublasLtHandle_t lt;
  void *ws;                 /* cuBLASLt workspace */
  void *arena;              /* the fused audit's scratch, grown on demand */
  size_t arena_bytes;
  void *mscratch;           /* metrics partials */
  qk_msum *mres;            /* [2 + PEND] metrics results: 2 for the fused audit, PEND for metrics_buf */
  qc_metrics *pend[PEND];   /* metrics_buf results waiting for sync: host destinations of mres[2 + i] */
  int npend;
  uint32_t *qscratch;       /* [4] quantizer scratch */
  cudaEvent_t ev[6];
  struct lt_plan {          /* cuBLASLt descriptors and algorithm per GEMM shape */
    int used;
    qc_op ta, tb;
    int64_t m, n, k, lda, ldb, ldd;
    cudaDataType_t dt;
    cublasLtMatmulDesc_t op;
    cublasLtMatrixLayout_t la, lb, ld;
    cublasLtMatmulAlgo_t algo;
  } plans[8];
  int next_plan;
} cu;

/* The CUDA state behind a backend table. */
static cu *C(const qc_backend *be) { return (cu *)be->priv; }

/* Turn a failed CUDA call into the one error line. Allocation failures are
 * input errors (the shape is too big for this device); others are system. */
static int cu_fail(const cu *c, const char *what, cudaError_t e) {
  if (e == cudaErrorMemoryAllocation) return qc_err("%s: %s: out of device memory", c->name, what);
  return qc_err_sys("%s: %s: %s", c->name, what, cudaGetErrorString(e));
}

/* A failed cuBLAS / cuBLASLt call as the one error line (system error). */
static int blas_fail(const cu *c, const char *what, int s) {
  return qc_err_sys("%s: %s: cuBLAS status %d", c->name, what, s);
}

#define CK(call, what)                                   \
  do {                                                   \
    cudaError_t e_ = (call);                             \
    if (e_ != cudaSuccess) { rc = cu_fail(c, what, e_); goto done; } \
  } while (0)
#define BK(call, what)                                   \
  do {                                                   \
    int s_ = (int)(call);                                \
    if (s_ != 0) { rc = blas_fail(c, what, s_); goto done; } \
  } while (0)

/* Device allocation with the amount named when it cannot fit. */
static int dalloc(const cu *c, size_t bytes, const char *what, void **p) {
  size_t fr = 0, tot = 0;
  *p = NULL;
  if (bytes == 0) bytes = 1;
  cudaError_t e = cudaMemGetInfo(&fr, &tot);
  if (e != cudaSuccess) return cu_fail(c, "cudaMemGetInfo", e);
  if (bytes > fr || (e = cudaMalloc(p, bytes)) != cudaSuccess) {
    *p = NULL;
    qc_err("%s: %s needs %.3f GiB of device memory but the device has %.3f GiB free (of %.3f GiB)", c->name, what,
           bytes / GiB, fr / GiB, tot / GiB);
    qc_hint("use a smaller shape, free the device, or use --device cpu");
    return QC_EINPUT;
  }
  return QC_OK;
}

/* Bytes of a row-major operand of `rows` rows, `cols` columns, leading dim ld. */
static size_t span(int64_t rows, int64_t cols, int64_t ld, size_t es) {
  return rows == 0 || cols == 0 ? 0 : ((size_t)(rows - 1) * (size_t)ld + (size_t)cols) * es;
}

/* ---- GEMMs on device pointers (row-major, computed as the column-major
 * transpose: C^T = op(B)^T op(A)^T) ------------------------------------------ */

/* float64 C[m,n] = op(A) op(B) on device pointers, cuBLAS DGEMM, row-major. */
static int dgemm_dev(cu *c, qc_op ta, qc_op tb, int64_t m, int64_t n, int64_t k, const double *A, int64_t lda,
                     const double *B, int64_t ldb, double *Cm, int64_t ldc) {
  int rc = QC_OK;
  const double one = 1.0, zero = 0.0;
  BK(cublasDgemm_64(c->blas, tb == QC_OP_T ? CUBLAS_OP_T : CUBLAS_OP_N, ta == QC_OP_T ? CUBLAS_OP_T : CUBLAS_OP_N, n, m,
                    k, &one, B, ldb, A, lda, &zero, Cm, ldc),
     "cublasDgemm");
done:
  return rc;
}

/* Release a cached cuBLASLt plan. */
static void plan_free(struct cu::lt_plan *p) {
  if (p->ld) cublasLtMatrixLayoutDestroy(p->ld);
  if (p->lb) cublasLtMatrixLayoutDestroy(p->lb);
  if (p->la) cublasLtMatrixLayoutDestroy(p->la);
  if (p->op) cublasLtMatmulDescDestroy(p->op);
  memset(p, 0, sizeof *p);
}

/* The cached plan for this GEMM, or a new one (descriptors + the heuristic's
 * first algorithm; evicting round robin). QC_EINPUT when cuBLASLt has none. */
static int plan_get(cu *c, qc_op ta, qc_op tb, int64_t m, int64_t n, int64_t k, int64_t lda, int64_t ldb, int64_t ldd,
                    cudaDataType_t dt, struct cu::lt_plan **out) {
  int rc = QC_OK, nres = 0;
  struct cu::lt_plan *p;
  cublasLtMatmulPreference_t pref = NULL;
  cublasLtMatmulHeuristicResult_t h;
  cublasOperation_t opa = tb == QC_OP_T ? CUBLAS_OP_T : CUBLAS_OP_N, opb = ta == QC_OP_T ? CUBLAS_OP_T : CUBLAS_OP_N;
  size_t wsb = WS_BYTES;
  for (int i = 0; i < 8; i++) {
    p = &c->plans[i];
    if (p->used && p->ta == ta && p->tb == tb && p->m == m && p->n == n && p->k == k && p->lda == lda && p->ldb == ldb &&
        p->ldd == ldd && p->dt == dt) {
      *out = p;
      return QC_OK;
    }
  }
  p = &c->plans[c->next_plan];
  c->next_plan = (c->next_plan + 1) % 8;
  plan_free(p);
  memset(&h, 0, sizeof h);
  BK(cublasLtMatmulDescCreate(&p->op, CUBLAS_COMPUTE_32F, CUDA_R_32F), "cublasLtMatmulDescCreate");
  BK(cublasLtMatmulDescSetAttribute(p->op, CUBLASLT_MATMUL_DESC_TRANSA, &opa, sizeof opa), "cublasLt TRANSA");
  BK(cublasLtMatmulDescSetAttribute(p->op, CUBLASLT_MATMUL_DESC_TRANSB, &opb, sizeof opb), "cublasLt TRANSB");
  BK(cublasLtMatrixLayoutCreate(&p->la, CUDA_R_16BF, tb == QC_OP_N ? n : k, tb == QC_OP_N ? k : n, ldb), "cublasLt layout B");
  BK(cublasLtMatrixLayoutCreate(&p->lb, CUDA_R_16BF, ta == QC_OP_N ? k : m, ta == QC_OP_N ? m : k, lda), "cublasLt layout A");
  BK(cublasLtMatrixLayoutCreate(&p->ld, dt, n, m, ldd), "cublasLt layout C");
  BK(cublasLtMatmulPreferenceCreate(&pref), "cublasLtMatmulPreferenceCreate");
  BK(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &wsb, sizeof wsb),
     "cublasLt workspace preference");
  {
    cublasStatus_t s = cublasLtMatmulAlgoGetHeuristic(c->lt, p->op, p->la, p->lb, p->ld, p->ld, pref, 1, &h, &nres);
    if (s != CUBLAS_STATUS_SUCCESS || nres == 0) {
      rc = qc_err("%s: cuBLASLt has no algorithm for a bf16 x bf16 -> %s GEMM (m %lld, n %lld, k %lld, fp32 "
                  "accumulation) on this GPU (status %d)",
                  c->name, dt == CUDA_R_32F ? "float32" : "bfloat16", (long long)m, (long long)n, (long long)k, (int)s);
      qc_hint("the candidate's arithmetic cannot be reproduced here; use --device cpu");
      goto done;
    }
  }
  p->algo = h.algo;
  p->used = 1;
  p->ta = ta; p->tb = tb; p->m = m; p->n = n; p->k = k; p->lda = lda; p->ldb = ldb; p->ldd = ldd; p->dt = dt;
  *out = p;
done:
  if (pref) cublasLtMatmulPreferenceDestroy(pref);
  if (rc) plan_free(p);
  return rc;
}

/* bf16 x bf16 -> dt (CUDA_R_32F or CUDA_R_16BF), fp32 accumulation, fp32 scale. */
static int lt_gemm(cu *c, qc_op ta, qc_op tb, int64_t m, int64_t n, int64_t k, const void *A, int64_t lda,
                   const void *B, int64_t ldb, void *D, int64_t ldd, cudaDataType_t dt) {
  int rc;
  struct cu::lt_plan *p = NULL;
  const float one = 1.0f, zero = 0.0f;
  if ((rc = plan_get(c, ta, tb, m, n, k, lda, ldb, ldd, dt, &p))) return rc;
  BK(cublasLtMatmul(c->lt, p->op, &one, B, p->la, A, p->lb, &zero, D, p->ld, D, p->ld, &p->algo, c->ws, WS_BYTES, c->st),
     "cublasLtMatmul");
done:
  return rc;
}

/* ---- host-pointer seam ops ------------------------------------------------ */

/* Zero C's rows (k == 0 products). */
static void zero_rows(void *Cm, int64_t m, int64_t n, int64_t ldc, size_t es) {
  for (int64_t i = 0; i < m; i++) memset((char *)Cm + (size_t)(i * ldc) * es, 0, (size_t)n * es);
}

/* Stage op(A), op(B) on the device, run the GEMM, bring C back. */
static int host_gemm(const qc_backend *be, int f64, qc_op ta, qc_op tb, int64_t m, int64_t n, int64_t k, const void *A,
                     int64_t lda, const void *B, int64_t ldb, void *Cm, int64_t ldc) {
  cu *c = C(be);
  int rc = QC_OK;
  void *dA = NULL, *dB = NULL, *dC = NULL;
  size_t es = f64 ? 8 : 2, ces = f64 ? 8 : 4;
  size_t na = span(ta == QC_OP_N ? m : k, ta == QC_OP_N ? k : m, lda, es);
  size_t nb = span(tb == QC_OP_N ? k : n, tb == QC_OP_N ? n : k, ldb, es);
  size_t nc = span(m, n, ldc, ces);
  if (m == 0 || n == 0) return QC_OK;
  if (k == 0) {
    zero_rows(Cm, m, n, ldc, ces);
    return QC_OK;
  }
  if ((rc = dalloc(c, na, "GEMM operand A", &dA)) || (rc = dalloc(c, nb, "GEMM operand B", &dB)) ||
      (rc = dalloc(c, nc, "GEMM result C", &dC)))
    goto done;
  CK(cudaMemcpyAsync(dA, A, na, cudaMemcpyHostToDevice, c->st), "upload GEMM operand A");
  CK(cudaMemcpyAsync(dB, B, nb, cudaMemcpyHostToDevice, c->st), "upload GEMM operand B");
  if (ldc != n) CK(cudaMemcpyAsync(dC, Cm, nc, cudaMemcpyHostToDevice, c->st), "upload GEMM result C");
  if (f64) rc = dgemm_dev(c, ta, tb, m, n, k, (const double *)dA, lda, (const double *)dB, ldb, (double *)dC, ldc);
  else rc = lt_gemm(c, ta, tb, m, n, k, dA, lda, dB, ldb, dC, ldc, CUDA_R_32F);
  if (rc) goto done;
  CK(cudaMemcpyAsync(Cm, dC, nc, cudaMemcpyDeviceToHost, c->st), "download GEMM result");
  CK(cudaStreamSynchronize(c->st), "GEMM");
done:
  cudaFree(dA);
  cudaFree(dB);
  cudaFree(dC);
  return rc;
}

/* backend.h gemm_f64: host operands staged on the device, cuBLAS DGEMM. */
static int cu_gemm_f64(const qc_backend *be, qc_op ta, qc_op tb, int64_t m, int64_t n, int64_t k, const double *A,
                       int64_t lda, const double *B, int64_t ldb, double *Cm, int64_t ldc) {
  return host_gemm(be, 1, ta, tb, m, n, k, A, lda, B, ldb, Cm, ldc);
}

/* backend.h gemm_bf16: host operands staged, cuBLASLt bf16 x bf16 -> fp32. */
static int cu_gemm_bf16(const qc_backend *be, qc_op ta, qc_op tb, int64_t m, int64_t n, int64_t k, const uint16_t *A,
                        int64_t lda, const uint16_t *B, int64_t ldb, float *Cm, int64_t ldc) {
  return host_gemm(be, 0, ta, tb, m, n, k, A, lda, B, ldb, Cm, ldc);
}

/* qc_metrics from the kernel's sums, as qc_metrics_compute fills them. */
static void metrics_fill(const qk_msum *s, qc_metrics *m) {
  memset(m, 0, sizeof *m);
  m->nonfinite = s->bad;
  m->max_abs = s->mx < 0 ? 0 : s->mx;
  m->worst = s->idx;
  m->noise_multiple = NAN;
  qc_metrics_finish(s->sg, s->sr, s->sd, s->dt, m);
  m->noise_floor = sqrt(s->snf) / fmax(m->norm_r, QC_EPS_NORM);
}

/* The metrics pass on device data, result downloaded into *out (syncs). */
static int metrics_dev(cu *c, const void *g, int g_kind, const double *r, int64_t n, int slot, qc_metrics *out) {
  int rc = QC_OK;
  qk_msum s;
  CK((cudaError_t)qk_metrics(g, g_kind, r, n, c->mscratch, c->mres + slot, c->st), "metrics kernel");
  if (out) {
    CK(cudaMemcpyAsync(&s, c->mres + slot, sizeof s, cudaMemcpyDeviceToHost, c->st), "download metrics");
    CK(cudaStreamSynchronize(c->st), "metrics kernel");
    metrics_fill(&s, out);
  }
done:
  return rc;
}

/* backend.h metrics: host g and r (float64) through the fused kernel. */
static int cu_metrics(const qc_backend *be, const double *g, const double *r, int64_t n, qc_metrics *out) {
  cu *c = C(be);
  int rc = QC_OK;
  void *dg = NULL, *dr = NULL;
  if ((rc = dalloc(c, (size_t)n * 8, "metrics candidate", &dg)) || (rc = dalloc(c, (size_t)n * 8, "metrics reference", &dr)))
    goto done;
  CK(cudaMemcpyAsync(dg, g, (size_t)n * 8, cudaMemcpyHostToDevice, c->st), "upload candidate");
  CK(cudaMemcpyAsync(dr, r, (size_t)n * 8, cudaMemcpyHostToDevice, c->st), "upload reference");
  rc = metrics_dev(c, dg, 0, (const double *)dr, n, 0, out);
  out->noise_floor = NAN; /* as qc_metrics_compute: the caller computes it for its dtype */
done:
  cudaFree(dg);
  cudaFree(dr);
  return rc;
}

/* ---- buffers ---------------------------------------------------------------- */

static int cu_buf_alloc(const qc_backend *be, size_t bytes, const char *what, void **p) { return dalloc(C(be), bytes, what, p); }
static void cu_buf_free(const qc_backend *be, void *p) { (void)be; cudaFree(p); }

/* Host to device on the backend's stream (asynchronous for pinned memory). */
static int cu_upload(const qc_backend *be, void *dst, const void *src, size_t bytes) {
  cu *c = C(be);
  int rc = QC_OK;
  CK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyHostToDevice, c->st), "upload");
done:
  return rc;
}

/* Device to host; waits for the stream. */
static int cu_download(const qc_backend *be, void *dst, const void *src, size_t bytes) {
  cu *c = C(be);
  int rc = QC_OK;
  CK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToHost, c->st), "download");
  CK(cudaStreamSynchronize(c->st), "download");
done:
  return rc;
}

/* Pinned host memory (cudaMallocHost). */
static int cu_host_alloc(const qc_backend *be, size_t bytes, const char *what, void **p) {
  cudaError_t e = cudaMallocHost(p, bytes ? bytes : 1);
  if (e != cudaSuccess) {
    *p = NULL;
    return qc_err_sys("%s: pinned host buffer for %s (%.3f GiB): %s", C(be)->name, what, bytes / GiB, cudaGetErrorString(e));
  }
  return QC_OK;
}
static void cu_host_free(const qc_backend *be, void *p) { (void)be; cudaFreeHost(p); }

/* ---- quantizers --------------------------------------------------------------- */

/* Format name -> kernel format; QC_EINPUT for names or profiles not on the GPU. */
static int qfmt(const cu *c, const char *fmt, const char *profile, qk_fmt *out) {
  static const struct { const char *n; qk_fmt f; } t[] = {
      {"none", QK_NONE}, {"fp8_tensor", QK_FP8_TENSOR}, {"fp8_token", QK_FP8_ROW}, {"fp8_channel", QK_FP8_ROW},
      {"fp8_group128", QK_FP8_GROUP128}, {"fp8_group128_ue8m0", QK_FP8_GROUP128_UE8M0},
      {"fp8_block128", QK_FP8_BLOCK128}, {"fp8_block128_ue8m0", QK_FP8_BLOCK128_UE8M0}, {"nvfp4", QK_NVFP4},
      {"mxfp8", QK_MXFP8}, {"mxfp4", QK_MXFP4}};
  if (profile && strcmp(profile, "vllm") != 0) {
    qc_err("%s: quantizer profile '%s' is not implemented on the cuda backend (only vllm)", c->name, profile);
    qc_hint("use --device cpu for other profiles");
    return QC_EINPUT;
  }
  for (size_t i = 0; i < sizeof t / sizeof t[0]; i++)
    if (strcmp(fmt, t[i].n) == 0) { *out = t[i].f; return QC_OK; }
  return qc_err("%s: quantizer format '%s' is not known", c->name, fmt);
}

/* After a quantizer ran: refuse non-finite input (the kernel counted it). */
static int check_finite(cu *c, const char *what) {
  int rc = QC_OK;
  uint32_t s[4];
  CK(cudaMemcpyAsync(s, c->qscratch, sizeof s, cudaMemcpyDeviceToHost, c->st), "download quantizer status");
  CK(cudaStreamSynchronize(c->st), "quantizer");
  if (s[1]) rc = qc_err("%s: %u non-finite value(s): a quantizer never maps NaN or Inf silently", what, s[1]);
done:
  return rc;
}

/* backend.h quantize: a host float32 matrix through kernels/quant.cu; every
 * non-NULL output of q filled; non-finite input refused. */
static int cu_quantize(const qc_backend *be, const char *fmt, const char *profile, int64_t rows, int64_t cols,
                       const float *in, qc_qout *q) {
  cu *c = C(be);
  int rc, packed = 0;
  int64_t gr, gc, sr, sc;
  qk_qargs a;
  void *din = NULL, *ddeq = NULL, *dq = NULL, *ds = NULL, *dsb = NULL;
  size_t n = (size_t)(rows * cols), nq = 0, ns = 0;
  uint32_t s[4];
  memset(&a, 0, sizeof a);
  if ((rc = qfmt(c, fmt, profile, &a.fmt))) return rc;
  if (a.fmt == QK_NONE) return qc_err("%s: quantize needs a format, not 'none'", c->name);
  if ((rc = qc_qlayout(fmt, rows, cols, &gr, &gc, &sr, &sc, &packed))) return rc;
  nq = packed ? (size_t)(rows * ((cols + 1) / 2)) : n;
  ns = (size_t)(sr * sc);
  if ((rc = dalloc(c, n * 4, "quantizer input", &din)) || (q->deq && (rc = dalloc(c, n * 4, "dequantized", &ddeq))) ||
      (q->q && (rc = dalloc(c, nq, "payload", &dq))) || (q->scale && (rc = dalloc(c, ns * 4, "scales", &ds))) ||
      (q->scale_b && (rc = dalloc(c, ns, "scale bytes", &dsb))))
    goto done;
  CK(cudaMemcpyAsync(din, in, n * 4, cudaMemcpyHostToDevice, c->st), "upload quantizer input");
  a.rows = rows;
  a.cols = cols;
  a.in = din;
  a.deq = (float *)ddeq;
  a.q = (uint8_t *)dq;
  a.scale = (float *)ds;
  a.scale_b = (uint8_t *)dsb;
  a.scratch = c->qscratch;
  CK((cudaError_t)qk_quantize(&a, c->st), "quantizer kernel");
  if ((rc = check_finite(c, "quantizer input"))) goto done;
  if (q->deq) CK(cudaMemcpyAsync(q->deq, ddeq, n * 4, cudaMemcpyDeviceToHost, c->st), "download dequantized");
  if (q->q) CK(cudaMemcpyAsync(q->q, dq, nq, cudaMemcpyDeviceToHost, c->st), "download payload");
  if (q->scale) CK(cudaMemcpyAsync(q->scale, ds, ns * 4, cudaMemcpyDeviceToHost, c->st), "download scales");
  if (q->scale_b) CK(cudaMemcpyAsync(q->scale_b, dsb, ns, cudaMemcpyDeviceToHost, c->st), "download scale bytes");
  CK(cudaMemcpyAsync(s, c->qscratch, sizeof s, cudaMemcpyDeviceToHost, c->st), "download global scale");
  CK(cudaStreamSynchronize(c->st), "quantizer");
  {
    float g;
    memcpy(&g, &s[2], 4);
    q->gscale = a.fmt == QK_NVFP4 ? g : 0.0f;
  }
done:
  cudaFree(din);
  cudaFree(ddeq);
  cudaFree(dq);
  cudaFree(ds);
  cudaFree(dsb);
  return rc;
}


/* ---- building blocks on device buffers (backend.h) ---------------------------- */

/* A float dtype as a conversion kernel's kind; -1 for others. */
static int tkind(qc_dtype dt) {
  switch (dt) {
    case QC_F64: return QK_T_F64;
    case QC_F32: return QK_T_F32;
    case QC_F16: return QK_T_F16;
    case QC_BF16: return QK_T_BF16;
    default: return -1;
  }
}

static int cu_to_f64(const qc_backend *be, qc_dtype dt, const void *src, int64_t n, double *dst) {
  cu *c = C(be);
  int rc = QC_OK, k = tkind(dt);
  if (k < 0) return qc_err("%s: cannot convert element type %s to a float", c->name, qc_dtype_name(dt));
  CK((cudaError_t)qk_to_f64(k, src, dst, n, c->st), "convert to float64");
done:
  return rc;
}

/* Profiles without kernels: the host quantizer on a downloaded copy. */
static int fake_quant_host(cu *c, const char *fmt, const char *profile, int64_t rows, int64_t cols, qc_dtype dt,
                           const void *src, double *dst, const char *what) {
  int rc = QC_OK;
  size_t n = (size_t)(rows * cols), es = qc_dtype_size(dt);
  void *raw = malloc(n * es);
  double *o = (double *)malloc(n * sizeof(double));
  if (!raw || !o) { rc = qc_err_sys("%s: out of host memory for a host quantizer", c->name); goto done; }
  CK(cudaMemcpyAsync(raw, src, n * es, cudaMemcpyDeviceToHost, c->st), "download quantizer input");
  CK(cudaStreamSynchronize(c->st), "download quantizer input");
  if ((rc = qc_fake_quant_f64_dt(fmt, profile, rows, cols, dt, raw, o, cols, what))) goto done;
  CK(cudaMemcpyAsync(dst, o, n * sizeof(double), cudaMemcpyHostToDevice, c->st), "upload dequantized");
  CK(cudaStreamSynchronize(c->st), "upload dequantized");
done:
  free(raw);
  free(o);
  return rc;
}

static int cu_fake_quant_f64(const qc_backend *be, const char *fmt, const char *profile, int64_t rows, int64_t cols,
                             qc_dtype dt, const void *src, float *scratch, double *dst, const char *what) {
  cu *c = C(be);
  int rc = QC_OK, k = tkind(dt);
  qk_qargs q;
  memset(&q, 0, sizeof q);
  if (k < 0) return qc_err("%s: cannot quantize element type %s", c->name, qc_dtype_name(dt));
  if (profile && strcmp(profile, "vllm") != 0) return fake_quant_host(c, fmt, profile, rows, cols, dt, src, dst, what);
  if ((rc = qfmt(c, fmt, profile, &q.fmt))) return rc;
  if (q.fmt == QK_NONE) return qc_err("%s: fake_quant_f64 needs a format, not 'none'", c->name);
  q.rows = rows;
  q.cols = cols;
  q.in = src;
  q.in_bf16 = dt == QC_BF16;
  if (dt == QC_F64 || dt == QC_F16) {
    CK((cudaError_t)qk_to_f32(k, src, scratch, rows * cols, c->st), "convert to float32");
    q.in = scratch;
  }
  q.deq_f64 = dst;
  q.scratch = c->qscratch;
  CK((cudaError_t)qk_quantize(&q, c->st), "quantizer kernel");
done:
  return rc;
}

static int cu_gemm_f64_buf(const qc_backend *be, qc_op ta, qc_op tb, int64_t m, int64_t n, int64_t k, const double *A,
                           int64_t lda, const double *B, int64_t ldb, double *Cm, int64_t ldc) {
  cu *c = C(be);
  int rc = QC_OK;
  if (m == 0 || n == 0) return QC_OK;
  if (k == 0) {
    for (int64_t i = 0; i < m; i++) CK(cudaMemsetAsync(Cm + i * ldc, 0, (size_t)n * 8, c->st), "zero GEMM output");
    return QC_OK;
  }
  rc = dgemm_dev(c, ta, tb, m, n, k, A, lda, B, ldb, Cm, ldc);
done:
  return rc;
}

static int cu_sync(const qc_backend *be) {
  cu *c = C(be);
  int rc = QC_OK;
  qk_msum s[PEND];
  if (c->npend) CK(cudaMemcpyAsync(s, c->mres + 2, (size_t)c->npend * sizeof *s, cudaMemcpyDeviceToHost, c->st), "download metrics");
  CK(cudaStreamSynchronize(c->st), "queued device work");
  for (int i = 0; i < c->npend; i++) {
    metrics_fill(&s[i], c->pend[i]);
    c->pend[i]->noise_floor = NAN; /* as qc_metrics_compute: the caller computes it for its dtype */
  }
done:
  c->npend = 0;
  return rc;
}

static int cu_metrics_buf(const qc_backend *be, const double *g, const double *r, int64_t n, qc_metrics *out) {
  cu *c = C(be);
  int rc = QC_OK;
  if (c->npend == PEND && (rc = cu_sync(be))) return rc;
  CK((cudaError_t)qk_metrics(g, 0, r, n, c->mscratch, c->mres + 2 + c->npend, c->st), "metrics kernel");
  c->pend[c->npend++] = out;
done:
  return rc;
}

/* ---- the fused linear audit ------------------------------------------------- */

/* Carve the next `bytes` (256-aligned) out of the arena. */
static void *carve(char **p, size_t bytes) {
  void *r = *p;
  *p += (bytes + 255) & ~(size_t)255;
  return r;
}

/* The fused audit's buffers in the arena (the same layout for the audit and
 * for the benchmark that times its parts). */
typedef struct lin_bufs {
  double *wq64, *x64, *dy64, *rx, *rw; /* W_ref, X, dY, references d_x, d_weight: float64 */
  uint16_t *wq16, *cx, *cw;           /* W_ref, builtin candidates d_x, d_weight: bf16 */
} lin_bufs;

static void lin_layout(const cu *c, int64_t M, int64_t K, int64_t N, lin_bufs *b) {
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

static float ev_ms(cudaEvent_t a, cudaEvent_t b) {
  float ms = 0;
  cudaEventElapsedTime(&ms, a, b);
  return ms;
}

/* backend.h audit_linear: the whole in-memory linear audit on device
 * buffers, one stream, one sync at the end (stage times from events). */
static int cu_audit_linear(const qc_backend *be, const qc_linear_audit *a, qc_linear_audit_out *o) {
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
  if ((rc = qfmt(c, fmt, a->profile, &q.fmt))) return rc;
  if (c->arena_bytes < need) {
    cudaFree(c->arena);
    c->arena = NULL;
    c->arena_bytes = 0;
    char what[160];
    snprintf(what, sizeof what, "the linear audit of [M %lld, K %lld, N %lld]", (long long)M, (long long)K, (long long)N);
    if ((rc = dalloc(c, need, what, &c->arena))) return rc;
    c->arena_bytes = need;
  }
  if (qc_verbose)
    fprintf(stderr, "qatcheck: %s: linear audit [M %lld, K %lld, N %lld] holds %.3f GiB of device memory\n", c->name,
            (long long)M, (long long)K, (long long)N, need / GiB);
  lin_layout(c, M, K, N, &bu);
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
  if (!a->dx_cand && (rc = lt_gemm(c, QC_OP_N, QC_OP_N, M, K, N, a->dy, N, wref, K, cx, K, CUDA_R_16BF))) goto done;
  if (!a->dw_cand && (rc = lt_gemm(c, QC_OP_T, QC_OP_N, N, K, M, a->dy, N, a->x, K, cw, K, CUDA_R_16BF))) goto done;
  CK(cudaEventRecord(c->ev[2], c->st), "event");
  /* reference: the same products in float64 */
  if ((rc = dgemm_dev(c, QC_OP_N, QC_OP_N, M, K, N, dy64, N, wq64, K, rx, K))) goto done;
  if ((rc = dgemm_dev(c, QC_OP_T, QC_OP_N, N, K, M, dy64, N, x64, K, rw, K))) goto done;
  CK(cudaEventRecord(c->ev[3], c->st), "event");
  if ((rc = metrics_dev(c, gx, 1, rx, (int64_t)mk, 0, NULL)) || (rc = metrics_dev(c, gw, 1, rw, (int64_t)nk, 1, NULL)))
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
    metrics_fill(&s[0], &o->dx);
    metrics_fill(&s[1], &o->dw);
  }
  o->ms_quant = ev_ms(c->ev[0], c->ev[1]);
  o->ms_cand = ev_ms(c->ev[1], c->ev[2]);
  o->ms_ref = ev_ms(c->ev[2], c->ev[3]);
  o->ms_metrics = ev_ms(c->ev[3], c->ev[4]);
  o->device_bytes = need;
done:
  return rc;
}

/* ---- benchmark hooks (cuda.h) ------------------------------------------------ */

extern "C" int qc_cuda_bench_parts(const qc_backend *be, const qc_linear_audit *a, int reps, qc_cuda_bench *r) {
  cu *c = C(be);
  int rc = QC_OK;
  const int64_t M = a->M, K = a->K, N = a->N;
  const size_t mk = (size_t)(M * K), nk = (size_t)(N * K), mn = (size_t)(M * N);
  void *dst = NULL;
  lin_bufs bu;
  double *wq64, *x64, *dy64, *rx, *rw;
  uint16_t *cx, *cw;
  float *t = NULL;
  if (!c->arena || c->arena_bytes < qc_linear_audit_bytes(M, K, N)) return qc_err("bench: run the audit first");
  lin_layout(c, M, K, N, &bu);
  wq64 = bu.wq64; x64 = bu.x64; dy64 = bu.dy64; rx = bu.rx; rw = bu.rw;
  cx = bu.cx; cw = bu.cw;
  if (!(t = (float *)calloc((size_t)reps * 4, sizeof *t))) return qc_err_sys("bench: out of memory");
  /* copy bandwidth on 1 GiB (several times the L2 at any shape); the
   * metrics pass on the larger of the two gradients */
  if ((rc = dalloc(c, (size_t)2 << 30, "copy-bandwidth buffers", &dst))) goto done;
  for (int i = 0; i < reps; i++) {
    CK(cudaEventRecord(c->ev[0], c->st), "event");
    if ((rc = dgemm_dev(c, QC_OP_N, QC_OP_N, M, K, N, dy64, N, wq64, K, rx, K)) ||
        (rc = dgemm_dev(c, QC_OP_T, QC_OP_N, N, K, M, dy64, N, x64, K, rw, K)))
      goto done;
    CK(cudaEventRecord(c->ev[1], c->st), "event");
    if ((rc = lt_gemm(c, QC_OP_N, QC_OP_N, M, K, N, a->dy, N, a->w, K, cx, K, CUDA_R_16BF)) ||
        (rc = lt_gemm(c, QC_OP_T, QC_OP_N, N, K, M, a->dy, N, a->x, K, cw, K, CUDA_R_16BF)))
      goto done;
    CK(cudaEventRecord(c->ev[2], c->st), "event");
    CK(cudaMemcpyAsync((char *)dst + ((size_t)1 << 30), dst, (size_t)1 << 30, cudaMemcpyDeviceToDevice, c->st), "device copy");
    CK(cudaEventRecord(c->ev[3], c->st), "event");
    if ((rc = mk >= nk ? metrics_dev(c, cx, 1, rx, (int64_t)mk, 0, NULL) : metrics_dev(c, cw, 1, rw, (int64_t)nk, 0, NULL)))
      goto done;
    CK(cudaEventRecord(c->ev[4], c->st), "event");
    CK(cudaEventSynchronize(c->ev[4]), "bench");
    t[4 * i + 0] = ev_ms(c->ev[0], c->ev[1]);
    t[4 * i + 1] = ev_ms(c->ev[1], c->ev[2]);
    t[4 * i + 2] = ev_ms(c->ev[2], c->ev[3]);
    t[4 * i + 3] = ev_ms(c->ev[3], c->ev[4]);
  }
  /* medians */
  for (int f = 0; f < 4; f++) {
    float v[64] = {0};
    int n = reps < 64 ? reps : 64;
    for (int i = 0; i < n; i++) v[i] = t[4 * i + f];
    for (int i = 1; i < n; i++)
      for (int j = i; j > 0 && v[j] < v[j - 1]; j--) { float x = v[j]; v[j] = v[j - 1]; v[j - 1] = x; }
    double med = n ? v[n / 2] : 0;
    if (f == 0) r->ms_dgemm2 = med;
    if (f == 1) r->ms_bf16x2 = med;
    if (f == 2) r->copy_gbs = 2.0 * (double)((size_t)1 << 30) / (med * 1e6);
    if (f == 3) { r->ms_metrics = med; r->metrics_gbs = (double)(mk >= nk ? mk : nk) * 10 / (med * 1e6); }
  }
  r->dgemm_tflops = 2.0 * 2.0 * (double)M * (double)N * (double)K / (r->ms_dgemm2 * 1e9);
  r->bf16_tflops = 2.0 * 2.0 * (double)M * (double)N * (double)K / (r->ms_bf16x2 * 1e9);
done:
  cudaFree(dst);
  free(t);
  return rc;
}

extern "C" int qc_cuda_fp8_conformance(const qc_backend *be, int kind, uint8_t *host_chunk, uint64_t start,
                                       uint64_t count, unsigned long long *mismatches) {
  cu *c = C(be);
  int rc = QC_OK;
  void *d = NULL;
  unsigned long long *dm = NULL;
  if (host_chunk && (rc = dalloc(c, count, "conformance bytes", &d))) goto done;
  if ((rc = dalloc(c, sizeof *dm, "conformance counter", (void **)&dm))) goto done;
  CK(cudaMemsetAsync(dm, 0, sizeof *dm, c->st), "memset");
  CK((cudaError_t)qk_fp8_conform(start, count, kind, (uint8_t *)d, dm, c->st), "conformance kernel");
  CK(cudaMemcpyAsync(mismatches, dm, sizeof *dm, cudaMemcpyDeviceToHost, c->st), "download");
  if (host_chunk) CK(cudaMemcpyAsync(host_chunk, d, count, cudaMemcpyDeviceToHost, c->st), "download bytes");
  CK(cudaStreamSynchronize(c->st), "conformance");
done:
  cudaFree(d);
  cudaFree(dm);
  return rc;
}

extern "C" const char *qc_cuda_device_name(const qc_backend *be, char *buf, size_t n) {
  cudaDeviceProp pr;
  if (cudaGetDeviceProperties(&pr, C(be)->dev) != cudaSuccess) snprintf(buf, n, "?");
  else snprintf(buf, n, "%s (sm_%d%d, %d SMs, %.1f GiB)", pr.name, pr.major, pr.minor, pr.multiProcessorCount, pr.totalGlobalMem / GiB);
  return buf;
}

/* ---- open / close -------------------------------------------------------------- */

extern "C" void qc_backend_cuda_close(const qc_backend *be) {
  if (!be) return;
  cu *c = C(be);
  cudaSetDevice(c->dev);
  for (int i = 0; i < 6; i++)
    if (c->ev[i]) cudaEventDestroy(c->ev[i]);
  for (int i = 0; i < 8; i++) plan_free(&c->plans[i]);
  if (c->lt) cublasLtDestroy(c->lt);
  if (c->blas) cublasDestroy(c->blas);
  cudaFree(c->ws);
  cudaFree(c->arena);
  cudaFree(c->mscratch);
  cudaFree(c->mres);
  cudaFree(c->qscratch);
  if (c->st) cudaStreamDestroy(c->st);
  free(c);
}

extern "C" int qc_backend_cuda_open(int device, const qc_backend **out) {
  int n = 0, rc = QC_OK;
  cudaDeviceProp pr;
  cu *c = NULL;
  cudaError_t e = cudaGetDeviceCount(&n);
  *out = NULL;
  if (e != cudaSuccess || n == 0) {
    qc_err("--device 'cuda:%d': no CUDA device found (%s)", device, e != cudaSuccess ? cudaGetErrorString(e) : "0 devices");
    qc_hint("check nvidia-smi, or use --device cpu");
    return QC_EINPUT;
  }
  if (device < 0 || device >= n)
    return qc_err("--device 'cuda:%d': device index out of range: this machine has %d CUDA device(s), 0 to %d", device, n, n - 1);
  if ((e = cudaGetDeviceProperties(&pr, device)) != cudaSuccess)
    return qc_err("--device 'cuda:%d': cannot read the device's properties (%s)", device, cudaGetErrorString(e));
  if (pr.major < 9) {
    qc_err("--device 'cuda:%d': %s is compute capability %d.%d; this qatcheck's kernels are built for sm_90 (Hopper) and later",
           device, pr.name, pr.major, pr.minor);
    qc_hint("rebuild with NVCCFLAGS for your GPU's architecture, or use --device cpu");
    return QC_EINPUT;
  }
  if (!(c = (cu *)calloc(1, sizeof *c))) return qc_err_sys("cuda backend: out of memory");
  c->dev = device;
  snprintf(c->name, sizeof c->name, "cuda:%d", device);
  CK(cudaSetDevice(device), "cudaSetDevice");
  CK(cudaStreamCreateWithFlags(&c->st, cudaStreamNonBlocking), "cudaStreamCreate");
  BK(cublasCreate(&c->blas), "cublasCreate");
  BK(cublasSetStream(c->blas, c->st), "cublasSetStream");
  /* DGEMM in plain FP64: no emulation, no reduced precision */
  BK(cublasSetMathMode(c->blas, CUBLAS_DEFAULT_MATH), "cublasSetMathMode");
  BK(cublasLtCreate(&c->lt), "cublasLtCreate");
  if ((rc = dalloc(c, WS_BYTES, "cuBLASLt workspace", &c->ws)) ||
      (rc = dalloc(c, qk_metrics_scratch_bytes(), "metrics scratch", &c->mscratch)) ||
      (rc = dalloc(c, (2 + PEND) * sizeof(qk_msum), "metrics result", (void **)&c->mres)) ||
      (rc = dalloc(c, 4 * sizeof(uint32_t), "quantizer scratch", (void **)&c->qscratch)))
    goto done;
  for (int i = 0; i < 6; i++) CK(cudaEventCreate(&c->ev[i]), "cudaEventCreate");
  c->be.name = c->name;
  c->be.gemm_f64 = cu_gemm_f64;
  c->be.gemm_bf16 = cu_gemm_bf16;
  c->be.metrics = cu_metrics;
  c->be.priv = c;
  c->be.buf_alloc = cu_buf_alloc;
  c->be.buf_free = cu_buf_free;
  c->be.upload = cu_upload;
  c->be.download = cu_download;
  c->be.host_alloc = cu_host_alloc;
  c->be.host_free = cu_host_free;
  c->be.quantize = cu_quantize;
  c->be.audit_linear = cu_audit_linear;
  c->be.host_memory = 0;
  c->be.to_f64 = cu_to_f64;
  c->be.fake_quant_f64 = cu_fake_quant_f64;
  c->be.gemm_f64_buf = cu_gemm_f64_buf;
  c->be.metrics_buf = cu_metrics_buf;
  c->be.sync = cu_sync;
  *out = &c->be;
  if (qc_verbose) fprintf(stderr, "qatcheck: %s: %s, %.1f GiB\n", c->name, pr.name, pr.totalGlobalMem / GiB);
  return QC_OK;
done:
  c->be.priv = c;
  qc_backend_cuda_close(&c->be);
  return rc;
}
