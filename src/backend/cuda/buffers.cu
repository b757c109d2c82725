/* buffers.cu: device and pinned host memory, uploads and downloads on the
 * backend's one stream. */
#include <cublasLt.h>
#include <cublas_v2.h>
#include <cuda_runtime.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend/cuda/cuda_priv.h"

int cu_buf_alloc(const qc_backend *be, size_t bytes, const char *what, void **p) { return cu_dalloc(C(be), bytes, what, p); }
/* backend.h buf_free (no status to return: a failure waits in rel_rc for the next sync). */
void cu_buf_free(const qc_backend *be, void *p) {
  cu *c = C(be);
  c->rel_rc = cu_keep(c, c->rel_rc, cudaFree(p), "cudaFree");
}

/* Host to device on the backend's stream (asynchronous for pinned memory). */
int cu_upload(const qc_backend *be, void *dst, const void *src, size_t bytes) {
  return cu_stage_up(C(be), dst, src, bytes, "upload");
}

/* Device to host; waits for the stream. */
int cu_download(const qc_backend *be, void *dst, const void *src, size_t bytes) {
  return cu_stage_down(C(be), dst, src, bytes, "download");
}

/* Pinned host memory (cudaMallocHost). */
int cu_host_alloc(const qc_backend *be, size_t bytes, const char *what, void **p) {
  cudaError_t e = cudaMallocHost(p, bytes ? bytes : 1);
  if (e != cudaSuccess) {
    *p = NULL;
    return qc_err_sys("%s: pinned host buffer for %s (%.3f GiB): %s", C(be)->name, what, bytes / GiB, cudaGetErrorString(e));
  }
  return QC_OK;
}
/* backend.h host_free (as buf_free). */
void cu_host_free(const qc_backend *be, void *p) {
  cu *c = C(be);
  if (p) c->rel_rc = cu_keep(c, c->rel_rc, cudaFreeHost(p), "cudaFreeHost");
}
