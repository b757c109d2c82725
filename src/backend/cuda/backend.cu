/* backend.cu: the CUDA backend (backend.h) on one device and one stream.
 *   gemm_f64      cuBLAS DGEMM (the reference's GEMM; FP64 arithmetic only)
 *   gemm_bf16     cuBLASLt, bf16 operands, fp32 accumulation, fp32 output
 *   metrics       the fused deterministic pass (kernels/metrics.cu)
 *   quantize      kernels/quant.cu, every profile
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

#include "backend/cuda/cuda_priv.h"

/* The operation table, as cpu.c's: every op of backend.h (C++20 designated
 * initializers, in declaration order); name and priv are set per device. */
static const qc_backend g_cuda_ops = {
    .name = NULL,
    .gemm_f64 = cu_gemm_f64,
    .gemm_bf16 = cu_gemm_bf16,
    .metrics = cu_metrics,
    .priv = NULL,
    .buf_alloc = cu_buf_alloc,
    .buf_free = cu_buf_free,
    .upload = cu_upload,
    .download = cu_download,
    .host_alloc = cu_host_alloc,
    .host_free = cu_host_free,
    .quantize = cu_quantize,
    .audit_linear = cu_audit_linear,
    .host_memory = 0,
    .to_f64 = cu_to_f64,
    .fake_quant_f64 = cu_fake_quant_f64,
    .gemm_f64_buf = cu_gemm_f64_buf,
    .metrics_buf = cu_metrics_buf,
    .sync = cu_sync,
    .fence = cu_fence,
    .wait_fence = cu_wait_fence,
#ifdef QC_HAVE_NCCL
    .coll_id = cu_coll_id,
    .coll_init = cu_coll_init,
#else
    .coll_id = NULL, /* no device collectives: src/dist/ reduces through the host */
    .coll_init = NULL,
#endif
    .coll_ready = cu_coll_ready,
    .allreduce = cu_allreduce,
    .mem_free = cu_mem_free,
    .att_rows = cu_att_rows,
    .norm_rows = cu_norm_rows,
    .pointwise = cu_pointwise,
    .lp_rows = cu_lp_rows,
    .rope_rows = cu_rope_rows,
    .conv_rows = cu_conv_rows,
    .gemm_f64_x = cu_gemm_f64_x,
};

/* The side-by-side switches' environment variables (cuda_priv.h CU_SW_*). */
static const char *const g_switch_env[CU_SWITCHES] = {"QC_CUDA_UNFUSED", "QC_CUDA_DW_EARLY", "QC_CUDA_QK_SCALAR",
                                                               "QC_CUDA_PAGEABLE", "QC_CUDA_ATT_HOST", "QC_CUDA_NORM_HOST",
                                                               "QC_CUDA_PW_HOST", "QC_CUDA_LP_HOST", "QC_CUDA_ROPE_HOST",
                                                               "QC_CUDA_CONV_HOST"};

/* cuda.h: one switch of an open backend set by its variable's name. */
extern "C" int qc_cuda_switch(const qc_backend *be, const char *name, int on) {
  cu *c = C(be);
  for (int i = 0; i < CU_SWITCHES; i++)
    if (strcmp(name, g_switch_env[i]) == 0) {
      c->sw[i] = on != 0;
      return QC_OK;
    }
  return qc_err("%s: no side-by-side switch '%s'", c->name, name);
}

/* Release everything the backend holds. Every step's status is checked:
 * when an error is already set (the run failed, or open did) that error is
 * the cause and stays the one line; after a clean run the first failure
 * here is printed as one warning (the results are out already). */
extern "C" void qc_backend_cuda_close(const qc_backend *be) {
  if (!be) return;
  cu *c = C(be);
  const int cause = qc_err_msg()[0] != 0;
  int rc = c->rel_rc;
  rc = cu_keep(c, rc, cudaSetDevice(c->dev), "cudaSetDevice");
  rc = cu_coll_free(c, rc);
  for (int i = 0; i < QC_CU_EVENTS; i++)
    if (c->ev[i]) rc = cu_keep(c, rc, cudaEventDestroy(c->ev[i]), "cudaEventDestroy");
  for (int i = 0; i < QC_FENCES; i++) {
    if (c->fence[i].ev) rc = cu_keep(c, rc, cudaEventDestroy(c->fence[i].ev), "cudaEventDestroy (fence)");
    if (c->fence[i].hres) rc = cu_keep(c, rc, cudaFreeHost(c->fence[i].hres), "cudaFreeHost (fence)");
  }
  for (int i = 0; i < 8; i++) rc = cu_plan_free(c, rc, &c->plans[i]);
  rc = cu_oz_free(c, rc);
  if (c->lt) rc = blas_keep(c, rc, cublasLtDestroy(c->lt), "cublasLtDestroy");
  if (c->blas2) rc = blas_keep(c, rc, cublasDestroy(c->blas2), "cublasDestroy (second)");
  if (c->blas) rc = blas_keep(c, rc, cublasDestroy(c->blas), "cublasDestroy");
  if (c->lh) rc = cu_keep(c, rc, cudaFreeHost(c->lh), "cudaFreeHost");
  rc = cu_keep(c, rc, cudaFree(c->ws), "cudaFree (cuBLASLt workspace)");
  rc = cu_keep(c, rc, cudaFree(c->arena), "cudaFree (the audit's arena)");
  rc = cu_keep(c, rc, cudaFree(c->gstage), "cudaFree (the GEMMs' staging)");
  rc = cu_keep_drop(c, rc);
  for (int i = 0; i < 2; i++) {
    if (c->pin[i]) rc = cu_keep(c, rc, cudaFreeHost(c->pin[i]), "cudaFreeHost (a staging chunk)");
    if (c->pev[i]) rc = cu_keep(c, rc, cudaEventDestroy(c->pev[i]), "cudaEventDestroy (a staging chunk)");
  }
  rc = cu_keep(c, rc, cudaFree(c->mscratch), "cudaFree (metrics scratch)");
  rc = cu_keep(c, rc, cudaFree(c->mres), "cudaFree (metrics results)");
  rc = cu_keep(c, rc, cudaFree(c->qscratch), "cudaFree (quantizer scratch)");
  if (c->st2) rc = cu_keep(c, rc, cudaStreamDestroy(c->st2), "cudaStreamDestroy (second)");
  if (c->st) rc = cu_keep(c, rc, cudaStreamDestroy(c->st), "cudaStreamDestroy");
  if (rc && !cause && qc_err_msg()[0]) {
    fprintf(stderr, "qatcheck: warning: %s (releasing the device)\n", qc_err_msg());
    qc_err_clear();
  }
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
  for (int i = 0; i < CU_SWITCHES; i++) { /* once here, not on every call */
    const char *v = getenv(g_switch_env[i]);
    c->sw[i] = v && strcmp(v, "1") == 0;
  }
  CK(cudaSetDevice(device), "cudaSetDevice");
  CK(cudaStreamCreateWithFlags(&c->st, cudaStreamNonBlocking), "cudaStreamCreate");
  CK(cudaStreamCreateWithFlags(&c->st2, cudaStreamNonBlocking), "cudaStreamCreate (second)");
  BK(cublasCreate(&c->blas), "cublasCreate");
  BK(cublasSetStream(c->blas, c->st), "cublasSetStream");
  /* DGEMM in plain FP64: no emulation, no reduced precision */
  BK(cublasSetMathMode(c->blas, CUBLAS_DEFAULT_MATH), "cublasSetMathMode");
  BK(cublasCreate(&c->blas2), "cublasCreate (second)");
  BK(cublasSetStream(c->blas2, c->st2), "cublasSetStream (second)");
  BK(cublasSetMathMode(c->blas2, CUBLAS_DEFAULT_MATH), "cublasSetMathMode (second)");
  BK(cublasLtCreate(&c->lt), "cublasLtCreate");
  if ((rc = cu_dalloc(c, WS_BYTES, "cuBLASLt workspace", &c->ws)) ||
      (rc = cu_dalloc(c, qk_metrics_scratch_bytes(), "metrics scratch", &c->mscratch)) ||
      (rc = cu_dalloc(c, (2 + PEND) * sizeof(qk_msum), "metrics result", (void **)&c->mres)) ||
      (rc = cu_dalloc(c, 4 * sizeof(uint32_t), "quantizer scratch", (void **)&c->qscratch)))
    goto done;
  for (int i = 0; i < QC_CU_EVENTS; i++) CK(cudaEventCreate(&c->ev[i]), "cudaEventCreate");
  for (int i = 0; i < QC_FENCES; i++) {
    CK(cudaEventCreateWithFlags(&c->fence[i].ev, cudaEventDisableTiming), "cudaEventCreate (fence)");
    CK(cudaMallocHost((void **)&c->fence[i].hres, PEND * sizeof(qk_msum)), "pinned metrics results");
  }
  CK(cudaMallocHost((void **)&c->lh, sizeof *c->lh), "pinned audit results");
  c->be = g_cuda_ops;
  c->be.name = c->name;
  c->be.priv = c;
  *out = &c->be;
  if (qc_verbose) fprintf(stderr, "qatcheck: %s: %s, %.1f GiB\n", c->name, pr.name, pr.totalGlobalMem / GiB);
  return QC_OK;
done:
  c->be.priv = c;
  qc_backend_cuda_close(&c->be);
  return rc;
}
