/* common.cu: the CUDA backend's error and allocation helpers (cuda_priv.h). */
#include <cublasLt.h>
#include <cublas_v2.h>
#include <cuda_runtime.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend/cuda/cuda_priv.h"

/* Turn a failed CUDA call into the one error line. Allocation failures are
 * input errors (the shape is too big for this device); others are system. */
int cu_fail(const cu *c, const char *what, cudaError_t e) {
  if (e == cudaErrorMemoryAllocation) return qc_err("%s: %s: out of device memory", c->name, what);
  return qc_err_sys("%s: %s: %s", c->name, what, cudaGetErrorString(e));
}

/* A failed cuBLAS / cuBLASLt call as the one error line (system error). */
int blas_fail(const cu *c, const char *what, int s) {
  return qc_err_sys("%s: %s: cuBLAS status %d", c->name, what, s);
}

/* Device allocation with the amount named when it cannot fit. */
int cu_dalloc(const cu *c, size_t bytes, const char *what, void **p) {
  size_t fr = 0, tot = 0;
  *p = NULL;
  if (bytes == 0) bytes = 1;
  cudaError_t e = cudaMemGetInfo(&fr, &tot);
  if (e != cudaSuccess) return cu_fail(c, "cudaMemGetInfo", e);
  if (c->keep_bytes && (bytes > fr || c->keep_gen != qc_memo_gen())) {
    /* gemm_f64_x's kept copies are an economy: they go first, and those of
     * a scope that has ended go at once (another class's module would
     * otherwise hold them) */
    int rc = cu_keep_drop(const_cast<cu *>(c), QC_OK);
    if (rc) return rc;
    if ((e = cudaMemGetInfo(&fr, &tot)) != cudaSuccess) return cu_fail(c, "cudaMemGetInfo", e);
  }
  if (bytes <= fr && (e = cudaMalloc(p, bytes)) == cudaErrorMemoryAllocation && c->keep_bytes) {
    (void)cudaGetLastError(); /* free on paper, not in one piece: the kept copies go, and it is tried again */
    int rc = cu_keep_drop(const_cast<cu *>(c), QC_OK);
    if (rc) return rc;
    if ((e = cudaMemGetInfo(&fr, &tot)) != cudaSuccess) return cu_fail(c, "cudaMemGetInfo", e);
    e = bytes <= fr ? cudaMalloc(p, bytes) : cudaErrorMemoryAllocation;
  }
  if (bytes <= fr && e != cudaSuccess && e != cudaErrorMemoryAllocation) {
    *p = NULL;
    return cu_fail(c, what, e); /* not the memory: a device fault, named as it is */
  }
  if (bytes > fr || e != cudaSuccess) {
    *p = NULL;
    qc_err("%s: %s needs %.3f GiB of device memory but the device has %.3f GiB free (of %.3f GiB)", c->name, what,
           bytes / GiB, fr / GiB, tot / GiB);
    qc_hint("use a smaller shape, free the device, or use --device cpu");
    return QC_EINPUT;
  }
  return QC_OK;
}

/* cuda_priv.h: gemm_f64_x's kept copies freed (gemm.cu keeps them). */
int cu_keep_drop(cu *c, int rc) {
  for (int i = 0; i < CU_KEEP; i++) {
    if (c->keep[i].dev) rc = cu_keep(c, rc, cudaFree(c->keep[i].dev), "cudaFree (a kept GEMM operand)");
    memset(&c->keep[i], 0, sizeof c->keep[i]);
  }
  c->keep_bytes = 0;
  return rc;
}

/* A release step's CUDA status folded into rc (cuda_priv.h). */
int cu_keep(const cu *c, int rc, cudaError_t e, const char *what) {
  if (rc || e == cudaSuccess) return rc;
  return cu_fail(c, what, e);
}

/* A release step's cuBLAS / cuBLASLt status folded into rc (cuda_priv.h). */
int blas_keep(const cu *c, int rc, int s, const char *what) {
  if (rc || s == 0) return rc;
  return blas_fail(c, what, s);
}
