/* prof.c: a profile of the backend seam. With QATCHECK_PROFILE set (read
 * once, when the backend is opened), qc_backend_open hands out a copy of the
 * backend's table whose operations count their calls, their wall time and
 * the bytes they were given, then call the backend's own; closing it prints
 * one line per operation used on stderr ("qatcheck: profile: ..."), with the
 * process's wall time since the open and the part spent outside the seam
 * (the host's own work). It tells where an audit's time goes on a machine
 * without a profiler (docs/gpu.md, "Where the time goes"). Times are the
 * host's: an operation queued on a device stream counts until it returns,
 * and what it left running is counted by the sync or download that waits. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/qc.h"
#include "backend/backend.h"
#include "backend/prof.h"

enum { P_GEMM_F64, P_GEMM_BF16, P_METRICS, P_BUF_ALLOC, P_UPLOAD, P_DOWNLOAD, P_HOST_ALLOC, P_QUANTIZE, P_AUDIT_LINEAR,
       P_TO_F64, P_FAKE_QUANT, P_GEMM_F64_BUF, P_METRICS_BUF, P_SYNC, P_WAIT_FENCE, P_ALLREDUCE, P_GEMM_F64_X, P_N };
static const char *const op_name[P_N] = {"gemm_f64",  "gemm_bf16", "metrics",      "buf_alloc",   "upload",
                                         "download",  "host_alloc", "quantize",    "audit_linear", "to_f64",
                                         "fake_quant_f64", "gemm_f64_buf", "metrics_buf", "sync", "wait_fence",
                                         "allreduce", "gemm_f64_x"};

/* The wrapper: `outer` first, so an operation's `be` is the wrapper itself. */
typedef struct {
  qc_backend outer;
  const qc_backend *inner;
  double t_open;
  long long calls[P_N];
  double secs[P_N];
  double bytes[P_N]; /* operand bytes handed over (GEMMs: A, B and C; others: their buffer) */
} prof;

static const qc_backend *IN(const qc_backend *be) { return ((const prof *)be)->inner; }

/* Charge one call of op that started at t0 and handed over `bytes`. */
static void charge(const qc_backend *be, int op, double t0, double bytes) {
  prof *p = (prof *)be; /* the wrapper is the caller's own, allocated writable here */
  p->calls[op]++;
  p->secs[op] += qc_now_s() - t0;
  p->bytes[op] += bytes;
}

static int p_gemm_f64(const qc_backend *be, qc_op ta, qc_op tb, int64_t m, int64_t n, int64_t k, const double *A,
                      int64_t lda, const double *B, int64_t ldb, double *C, int64_t ldc) {
  double t0 = qc_now_s();
  int rc = IN(be)->gemm_f64(IN(be), ta, tb, m, n, k, A, lda, B, ldb, C, ldc);
  charge(be, P_GEMM_F64, t0, 8.0 * ((double)m * k + (double)k * n + (double)m * n));
  return rc;
}

static int p_gemm_f64_x(const qc_backend *be, qc_op ta, qc_op tb, int64_t m, int64_t n, int64_t k, const qc_gemm_x *A,
                        const qc_gemm_x *B, double *C, int64_t ldc) {
  double t0 = qc_now_s();
  int rc = IN(be)->gemm_f64_x(IN(be), ta, tb, m, n, k, A, B, C, ldc);
  charge(be, P_GEMM_F64_X, t0, (double)m * k * qc_dtype_size(A->dt) + (double)k * n * qc_dtype_size(B->dt) + 8.0 * m * n);
  return rc;
}

static int p_gemm_bf16(const qc_backend *be, qc_op ta, qc_op tb, int64_t m, int64_t n, int64_t k, const uint16_t *A,
                       int64_t lda, const uint16_t *B, int64_t ldb, float *C, int64_t ldc) {
  double t0 = qc_now_s();
  int rc = IN(be)->gemm_bf16(IN(be), ta, tb, m, n, k, A, lda, B, ldb, C, ldc);
  charge(be, P_GEMM_BF16, t0, 2.0 * ((double)m * k + (double)k * n) + 4.0 * m * n);
  return rc;
}

static int p_metrics(const qc_backend *be, const double *g, const double *r, int64_t n, qc_metrics *out) {
  double t0 = qc_now_s();
  int rc = IN(be)->metrics(IN(be), g, r, n, out);
  charge(be, P_METRICS, t0, 16.0 * n);
  return rc;
}

static int p_buf_alloc(const qc_backend *be, size_t bytes, const char *what, void **d) {
  double t0 = qc_now_s();
  int rc = IN(be)->buf_alloc(IN(be), bytes, what, d);
  charge(be, P_BUF_ALLOC, t0, (double)bytes);
  return rc;
}

static int p_upload(const qc_backend *be, void *dst, const void *src, size_t bytes) {
  double t0 = qc_now_s();
  int rc = IN(be)->upload(IN(be), dst, src, bytes);
  charge(be, P_UPLOAD, t0, (double)bytes);
  return rc;
}

static int p_download(const qc_backend *be, void *dst, const void *src, size_t bytes) {
  double t0 = qc_now_s();
  int rc = IN(be)->download(IN(be), dst, src, bytes);
  charge(be, P_DOWNLOAD, t0, (double)bytes);
  return rc;
}

static int p_host_alloc(const qc_backend *be, size_t bytes, const char *what, void **h) {
  double t0 = qc_now_s();
  int rc = IN(be)->host_alloc(IN(be), bytes, what, h);
  charge(be, P_HOST_ALLOC, t0, (double)bytes);
  return rc;
}

static int p_quantize(const qc_backend *be, const char *fmt, const char *profile, int64_t rows, int64_t cols,
                      const float *in, struct qc_qout *q) {
  double t0 = qc_now_s();
  int rc = IN(be)->quantize(IN(be), fmt, profile, rows, cols, in, q);
  charge(be, P_QUANTIZE, t0, 4.0 * rows * cols);
  return rc;
}

static int p_audit_linear(const qc_backend *be, const qc_linear_audit *a, qc_linear_audit_out *o) {
  double t0 = qc_now_s();
  int rc = IN(be)->audit_linear(IN(be), a, o);
  charge(be, P_AUDIT_LINEAR, t0, 2.0 * ((double)a->M * a->K + (double)a->N * a->K + (double)a->M * a->N));
  return rc;
}

static int p_to_f64(const qc_backend *be, qc_dtype dt, const void *src, int64_t n, double *dst) {
  double t0 = qc_now_s();
  int rc = IN(be)->to_f64(IN(be), dt, src, n, dst);
  charge(be, P_TO_F64, t0, 8.0 * n);
  return rc;
}

static int p_fake_quant(const qc_backend *be, const char *fmt, const char *profile, int64_t rows, int64_t cols,
                        qc_dtype dt, const void *src, float *scratch, double *dst, const char *what) {
  double t0 = qc_now_s();
  int rc = IN(be)->fake_quant_f64(IN(be), fmt, profile, rows, cols, dt, src, scratch, dst, what);
  charge(be, P_FAKE_QUANT, t0, 8.0 * rows * cols);
  return rc;
}

static int p_gemm_f64_buf(const qc_backend *be, qc_op ta, qc_op tb, int64_t m, int64_t n, int64_t k, const double *A,
                          int64_t lda, const double *B, int64_t ldb, double *C, int64_t ldc) {
  double t0 = qc_now_s();
  int rc = IN(be)->gemm_f64_buf(IN(be), ta, tb, m, n, k, A, lda, B, ldb, C, ldc);
  charge(be, P_GEMM_F64_BUF, t0, 8.0 * ((double)m * k + (double)k * n + (double)m * n));
  return rc;
}

static int p_metrics_buf(const qc_backend *be, const double *g, const double *r, int64_t n, qc_metrics *out) {
  double t0 = qc_now_s();
  int rc = IN(be)->metrics_buf(IN(be), g, r, n, out);
  charge(be, P_METRICS_BUF, t0, 16.0 * n);
  return rc;
}

static int p_sync(const qc_backend *be) {
  double t0 = qc_now_s();
  int rc = IN(be)->sync(IN(be));
  charge(be, P_SYNC, t0, 0);
  return rc;
}

static int p_wait_fence(const qc_backend *be, int k) {
  double t0 = qc_now_s();
  int rc = IN(be)->wait_fence(IN(be), k);
  charge(be, P_WAIT_FENCE, t0, 0);
  return rc;
}

static int p_allreduce(const qc_backend *be, void *buf, int64_t n, qc_dtype dt, qc_redop op) {
  double t0 = qc_now_s();
  int rc = IN(be)->allreduce(IN(be), buf, n, dt, op);
  charge(be, P_ALLREDUCE, t0, (double)n * qc_dtype_size(dt));
  return rc;
}

/* The remaining operations take the backend's own `be` (they keep no state
 * the wrapper could miss). */
static void p_buf_free(const qc_backend *be, void *d) { IN(be)->buf_free(IN(be), d); }
static void p_host_free(const qc_backend *be, void *h) { IN(be)->host_free(IN(be), h); }
static int p_fence(const qc_backend *be, int k) { return IN(be)->fence(IN(be), k); }
static int p_coll_id(const qc_backend *be, void *id, size_t n) { return IN(be)->coll_id(IN(be), id, n); }
static int p_coll_init(const qc_backend *be, const void *id, int nranks, int rank) {
  return IN(be)->coll_init(IN(be), id, nranks, rank);
}
static int p_coll_ready(const qc_backend *be) { return IN(be)->coll_ready(IN(be)); }
static int p_mem_free(const qc_backend *be, size_t *bytes) { return IN(be)->mem_free(IN(be), bytes); }

int qc_backend_profile_wrap(const qc_backend *inner, const qc_backend **out) {
  prof *p = qc_calloc(1, sizeof *p, "the backend's profile");
  if (!p) return QC_ESYS;
  p->inner = inner;
  p->t_open = qc_now_s();
  qc_backend *o = &p->outer;
  *o = *inner; /* name, priv, host_memory; every NULL operation stays NULL */
#define W(f, w) o->f = inner->f ? w : NULL
  W(gemm_f64, p_gemm_f64);
  W(gemm_bf16, p_gemm_bf16);
  W(metrics, p_metrics);
  W(buf_alloc, p_buf_alloc);
  W(buf_free, p_buf_free);
  W(upload, p_upload);
  W(download, p_download);
  W(host_alloc, p_host_alloc);
  W(host_free, p_host_free);
  W(quantize, p_quantize);
  W(audit_linear, p_audit_linear);
  W(to_f64, p_to_f64);
  W(fake_quant_f64, p_fake_quant);
  W(gemm_f64_buf, p_gemm_f64_buf);
  W(metrics_buf, p_metrics_buf);
  W(sync, p_sync);
  W(fence, p_fence);
  W(wait_fence, p_wait_fence);
  W(coll_id, p_coll_id);
  W(coll_init, p_coll_init);
  W(coll_ready, p_coll_ready);
  W(allreduce, p_allreduce);
  W(mem_free, p_mem_free);
  W(gemm_f64_x, p_gemm_f64_x);
#undef W
  *out = o;
  return QC_OK;
}

int qc_backend_is_profile(const qc_backend *be) { return be && be->gemm_f64 == p_gemm_f64; }

const qc_backend *qc_backend_profile_end(const qc_backend *be) {
  const prof *p = (const prof *)be;
  const qc_backend *inner = p->inner;
  double wall = qc_now_s() - p->t_open, in_seam = 0;
  for (int i = 0; i < P_N; i++) in_seam += p->secs[i];
  fprintf(stderr, "qatcheck: profile: %s: %.3f s since open, %.3f s in the backend, %.3f s outside it\n", inner->name,
          wall, in_seam, wall - in_seam);
  for (int i = 0; i < P_N; i++)
    if (p->calls[i])
      fprintf(stderr, "qatcheck: profile: %-14s %8lld calls %10.3f s %10.3f GB\n", op_name[i], p->calls[i], p->secs[i],
              p->bytes[i] / 1e9);
  free((void *)p);
  return inner;
}
