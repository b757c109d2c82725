/* cpu.c: the CPU backend: CBLAS (OpenBLAS) for both GEMMs, C for the rest. */
#include <cblas.h>
#include <stdlib.h>
#include <string.h>

#include "core/qc.h"
#include "numerics/decode.h"
#include "numerics/formats.h"
#include "numerics/metrics.h"
#include "numerics/quant.h"
#include "core/par.h"
#include "backend/backend.h"

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

int qc_gemm_x_dtype(qc_dtype dt) { return dt == QC_F64 || dt == QC_F32 || dt == QC_F16 || dt == QC_BF16; }

int qc_gemm_x_widen_into(const qc_gemm_x *o, int64_t n, double *out) {
  if (!qc_gemm_x_dtype(o->dt)) return qc_err("gemm_f64_x: an operand of %s: expected float64, float32, float16 or bfloat16",
                                             qc_dtype_name(o->dt));
  int rc = o->dt == QC_F64 && o->p == out ? QC_OK : qc_float_to_f64(o->dt, o->p, n, out); /* in place: no self-copy */
  if (rc) return rc;
  if (o->flags & QC_GX_BF16) qc_round_all(out, QC_F64, n, QC_BF16);
  if (o->flags & QC_GX_ABS) qc_abs_all(out, n);
  return QC_OK;
}

int qc_gemm_x_widen(const qc_gemm_x *o, int64_t rows, int64_t cols, const double **vals, double **owned) {
  *vals = NULL;
  *owned = NULL;
  if (!qc_gemm_x_dtype(o->dt)) return qc_err("gemm_f64_x: an operand of %s: expected float64, float32, float16 or bfloat16",
                                             qc_dtype_name(o->dt));
  const int64_t span = rows > 0 && cols > 0 ? (rows - 1) * o->ld + cols : 0; /* elements from the first to the last */
  if (o->dt == QC_F64 && !o->flags) {
    *vals = o->p;
    return QC_OK;
  }
  double *v = qc_malloc((size_t)(span ? span : 1) * sizeof *v, "gemm_f64_x operand (float64)");
  if (!v) return QC_ESYS;
  int rc = qc_gemm_x_widen_into(o, span, v);
  if (rc) {
    free(v);
    return rc;
  }
  *vals = *owned = v;
  return QC_OK;
}

/* gemm_f64_x on the host: each operand widened (and rounded, and made
 * |v|) where it is not float64 as it is, then dgemm. */
static int cpu_gemm_f64_x(const qc_backend *be, qc_op ta, qc_op tb, int64_t m, int64_t n, int64_t k, const qc_gemm_x *A,
                          const qc_gemm_x *B, double *C, int64_t ldc) {
  const double *a = NULL, *b = NULL;
  double *oa = NULL, *ob = NULL;
  int rc = qc_gemm_x_widen(A, ta == QC_OP_N ? m : k, ta == QC_OP_N ? k : m, &a, &oa);
  if (!rc) rc = qc_gemm_x_widen(B, tb == QC_OP_N ? k : n, tb == QC_OP_N ? n : k, &b, &ob);
  if (!rc) rc = cpu_gemm_f64(be, ta, tb, m, n, k, a, A->ld, b, B->ld, C, ldc);
  free(oa);
  free(ob);
  return rc;
}

/* src[0, n) widened exactly to float32 on qc_par_for's threads. */
typedef struct widen_ctx {
  const uint16_t *src;
  float *dst;
} widen_ctx;

static void widen_piece(void *p, int64_t lo, int64_t hi, int tid) {
  (void)tid;
  const widen_ctx *x = p;
  for (int64_t i = lo; i < hi; i++) x->dst[i] = qc_bf16_to_f32(x->src[i]);
}

static void widen_bf16(const uint16_t *src, int64_t n, float *dst) {
  widen_ctx x = {src, dst};
  qc_par_for(n, (int64_t)1 << 16, widen_piece, &x);
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
  widen_bf16(A, (int64_t)na, a);
  widen_bf16(B, (int64_t)nb, b);
  cblas_sgemm(CblasRowMajor, tr(ta), tr(tb), (int)m, (int)n, (int)k, 1.0f, a, (int)lda, b, (int)ldb, 0.0f, C, (int)ldc);
  free(a);
  free(b);
  return QC_OK;
}

static int cpu_metrics(const qc_backend *be, const double *g, const double *r, int64_t n, qc_metrics *out) {
  (void)be;
  qc_metrics_compute_par(g, r, n, out); /* fixed chunks: the same sums on any number of threads */
  return QC_OK;
}

/* ---- building blocks on host memory (backend.h) ---- */

static int cpu_alloc(const qc_backend *be, size_t bytes, const char *what, void **p) {
  (void)be;
  *p = qc_malloc(bytes ? bytes : 1, what);
  return *p ? QC_OK : QC_ESYS;
}
static void cpu_free(const qc_backend *be, void *p) { (void)be; free(p); }
static int cpu_copy(const qc_backend *be, void *dst, const void *src, size_t bytes) {
  (void)be;
  if (bytes) memcpy(dst, src, bytes);
  return QC_OK;
}

static int cpu_to_f64(const qc_backend *be, qc_dtype dt, const void *src, int64_t n, double *dst) {
  (void)be;
  return qc_float_to_f64(dt, src, n, dst);
}

static int cpu_fake_quant_f64(const qc_backend *be, const char *fmt, const char *profile, int64_t rows, int64_t cols,
                              qc_dtype dt, const void *src, float *scratch, double *dst, const char *what) {
  (void)be;
  (void)scratch; /* converted a block row at a time instead */
  return qc_fake_quant_f64_dt(fmt, profile, rows, cols, dt, src, dst, cols, what);
}

static int cpu_metrics_buf(const qc_backend *be, const double *g, const double *r, int64_t n, qc_metrics *out) {
  (void)be;
  qc_metrics_compute_par(g, r, n, out);
  return QC_OK;
}

static int cpu_sync(const qc_backend *be) { (void)be; return QC_OK; }

/* Every op is done when it returns: a fence has nothing to wait for. */
static int cpu_fence(const qc_backend *be, int k) {
  (void)be;
  return k < 0 || k >= QC_FENCES ? qc_err_sys("cpu: fence %d out of range 0 to %d", k, QC_FENCES - 1) : QC_OK;
}

static const qc_backend g_cpu = {
    .name = "cpu", .gemm_f64 = cpu_gemm_f64, .gemm_bf16 = cpu_gemm_bf16, .metrics = cpu_metrics, .priv = NULL,
    .buf_alloc = cpu_alloc, .buf_free = cpu_free, .upload = cpu_copy, .download = cpu_copy,
    .host_alloc = cpu_alloc, .host_free = cpu_free,
    .host_memory = 1, .to_f64 = cpu_to_f64, .fake_quant_f64 = cpu_fake_quant_f64, .gemm_f64_buf = cpu_gemm_f64,
    .metrics_buf = cpu_metrics_buf, .sync = cpu_sync, .fence = cpu_fence, .wait_fence = cpu_fence,
    .gemm_f64_x = cpu_gemm_f64_x};

const qc_backend *qc_backend_cpu(void) { return &g_cpu; }
