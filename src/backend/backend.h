/* backend.h: the one seam between the audit and the hardware. A table of
 * operations with a CPU implementation (cpu.c, what CI runs) and a CUDA one
 * (cuda.cu, behind --device cuda[:N]). Pointers are host pointers; a device
 * backend stages data itself. Matrices are row-major; op(A) is A or A^T. */
#ifndef QC_BACKEND_H
#define QC_BACKEND_H

#include <stdint.h>

#include "../metrics.h"

typedef enum { QC_OP_N = 0, QC_OP_T = 1 } qc_op;

typedef struct qc_backend {
  const char *name;        /* "cpu", "cuda:0" */
  /* The reference's GEMM: C[m,n] = op(A)[m,k] op(B)[k,n] in float64.
   * Independent of the candidate's path (CBLAS dgemm / cuBLAS DGEMM). */
  int (*gemm_f64)(const struct qc_backend *be, qc_op ta, qc_op tb, int64_t m, int64_t n, int64_t k,
                  const double *A, int64_t lda, const double *B, int64_t ldb, double *C, int64_t ldc);
  /* The candidate's GEMM as a BF16 trainer runs it: bfloat16 operands,
   * float32 accumulation, float32 result C (the caller rounds to its output
   * dtype). */
  int (*gemm_bf16)(const struct qc_backend *be, qc_op ta, qc_op tb, int64_t m, int64_t n, int64_t k,
                   const uint16_t *A, int64_t lda, const uint16_t *B, int64_t ldb, float *C, int64_t ldc);
  /* Metrics of g against r, n elements, float64 accumulation. */
  int (*metrics)(const struct qc_backend *be, const double *g, const double *r, int64_t n, qc_metrics *out);
  void *priv;
} qc_backend;

/* The CPU backend (always there). */
const qc_backend *qc_backend_cpu(void);
/* Open a backend from "--device" ("cpu", "cuda", "cuda:N"). QC_EINPUT with a
 * message when the device is absent or out of range; never falls back. */
int qc_backend_open(const char *device, const qc_backend **out);
void qc_backend_close(const qc_backend *be);

#endif
