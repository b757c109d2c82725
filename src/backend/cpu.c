/* cpu.c: the CPU backend: CBLAS (OpenBLAS) for both GEMMs, C for the rest. */
#include <cblas.h>
#include <stdlib.h>
#include <string.h>

#include "../qc.h"
#include "../numerics/formats.h"
#include "backend.h"

static CBLAS_TRANSPOSE tr(qc_op o) { return o == QC_OP_T ? CblasTrans : CblasNoTrans; }

/* float64 reference GEMM: dgemm, nothing else. */
static int cpu_gemm_f64(const qc_backend *be, qc_op ta, qc_op tb, int64_t m, int64_t n, int64_t k,
                        const double *A, int64_t lda, const double *B, int64_t ldb, double *C, int64_t ldc) {
  (void)be;
  if (m == 0 || n == 0) return QC_OK;
  if (k == 0) {
    for (int64_t i = 0; i < m; i++) memset(C + i * ldc, 0, (size_t)n * sizeof *C);
    return QC_OK;
  }
  cblas_dgemm(CblasRowMajor, tr(ta), tr(tb), (int)m, (int)n, (int)k, 1.0, A, (int)lda, B, (int)ldb, 0.0, C, (int)ldc);
  return QC_OK;
}

/* Candidate GEMM: bf16 operands widened exactly to float32, sgemm (float32
 * accumulation), float32 result. */
static int cpu_gemm_bf16(const qc_backend *be, qc_op ta, qc_op tb, int64_t m, int64_t n, int64_t k,
                         const uint16_t *A, int64_t lda, const uint16_t *B, int64_t ldb, float *C, int64_t ldc) {
  (void)be;
  if (m == 0 || n == 0) return QC_OK;
  if (k == 0) {
    for (int64_t i = 0; i < m; i++) memset(C + i * ldc, 0, (size_t)n * sizeof *C);
    return QC_OK;
  }
  int64_t arows = ta == QC_OP_N ? m : k, brows = tb == QC_OP_N ? k : n;
  size_t na = (size_t)(arows * lda), nb = (size_t)(brows * ldb);
  float *a = qc_malloc(na * sizeof *a, "bf16 GEMM operand A");
  float *b = a ? qc_malloc(nb * sizeof *b, "bf16 GEMM operand B") : NULL;
  if (!a || !b) { free(a); return QC_ESYS; }
  for (size_t i = 0; i < na; i++) a[i] = qc_bf16_to_f32(A[i]);
  for (size_t i = 0; i < nb; i++) b[i] = qc_bf16_to_f32(B[i]);
  cblas_sgemm(CblasRowMajor, tr(ta), tr(tb), (int)m, (int)n, (int)k, 1.0f, a, (int)lda, b, (int)ldb, 0.0f, C, (int)ldc);
  free(a);
  free(b);
  return QC_OK;
}

static int cpu_metrics(const qc_backend *be, const double *g, const double *r, int64_t n, qc_metrics *out) {
  (void)be;
  qc_metrics_compute(g, r, n, out);
  return QC_OK;
}

static const qc_backend g_cpu = {
    .name = "cpu", .gemm_f64 = cpu_gemm_f64, .gemm_bf16 = cpu_gemm_bf16, .metrics = cpu_metrics, .priv = NULL};

const qc_backend *qc_backend_cpu(void) { return &g_cpu; }
