/* gemm.cu: the two GEMMs of the CUDA backend: cuBLAS DGEMM in plain FP64
 * (the reference's) and cuBLASLt with bf16 operands, fp32 accumulation and
 * fp32 output (the candidate's), on device buffers or staged host data;
 * and the cuBLASLt int8 plan of the fast reference (ozaki.cu, refprobe.cu). */
#include <cublasLt.h>
#include <cublas_v2.h>
#include <cuda_runtime.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend/cuda/cuda_priv.h"

/* ---- GEMMs on device pointers (row-major, computed as the column-major
 * transpose: C^T = op(B)^T op(A)^T) ------------------------------------------ */

/* float64 C[m,n] = op(A) op(B) on device pointers, cuBLAS DGEMM, row-major,
 * through handle h (on its stream). */
int cu_dgemm_dev_h(cu *c, cublasHandle_t h, qc_op ta, qc_op tb, int64_t m, int64_t n, int64_t k, const double *A,
                   int64_t lda, const double *B, int64_t ldb, double *Cm, int64_t ldc) {
  int rc = QC_OK;
  const double one = 1.0, zero = 0.0;
  BK(cublasDgemm_64(h, tb == QC_OP_T ? CUBLAS_OP_T : CUBLAS_OP_N, ta == QC_OP_T ? CUBLAS_OP_T : CUBLAS_OP_N, n, m,
                    k, &one, B, ldb, A, lda, &zero, Cm, ldc),
     "cublasDgemm");
done:
  return rc;
}

/* cu_dgemm_dev_h on the backend's own handle and stream. */
int cu_dgemm_dev(cu *c, qc_op ta, qc_op tb, int64_t m, int64_t n, int64_t k, const double *A, int64_t lda,
                 const double *B, int64_t ldb, double *Cm, int64_t ldc) {
  return cu_dgemm_dev_h(c, c->blas, ta, tb, m, n, k, A, lda, B, ldb, Cm, ldc);
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
  if ((rc = cu_plan_free(c, QC_OK, p))) goto done; /* evict the oldest */
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
  if (pref) rc = blas_keep(c, rc, cublasLtMatmulPreferenceDestroy(pref), "cublasLtMatmulPreferenceDestroy");
  if (rc) rc = cu_plan_free(c, rc, p);
  return rc;
}

/* cuda_priv.h: the fast reference's int8 plan (descriptors, workspace
 * preference, the heuristic's first algorithm) built into p, released on
 * failure. ozaki.cu caches it for the audit, refprobe.cu times it; it lives
 * here because ozaki.cu calls refprobe.cu (cu_ref_auto), so refprobe.cu may
 * not call into ozaki.cu (scripts/check-structure.sh, circle). */
int cu_oz_plan_make(cu *c, int64_t mp, int64_t np, int64_t kc, int64_t kp, struct cu::cu_oz::oz_plan *p) {
  int rc = QC_OK, nres = 0;
  cublasLtMatmulPreference_t pref = NULL;
  cublasLtMatmulHeuristicResult_t h;
  const cublasOperation_t opT = CUBLAS_OP_T, opN = CUBLAS_OP_N;
  const cudaDataType_t st = CUDA_R_32I;
  size_t wsb = WS_BYTES;
  memset(&h, 0, sizeof h);
  BK(cublasLtMatmulDescCreate(&p->op, CUBLAS_COMPUTE_32I, CUDA_R_32I), "cublasLtMatmulDescCreate (int8)");
  BK(cublasLtMatmulDescSetAttribute(p->op, CUBLASLT_MATMUL_DESC_SCALE_TYPE, &st, sizeof st), "cublasLt SCALE_TYPE");
  BK(cublasLtMatmulDescSetAttribute(p->op, CUBLASLT_MATMUL_DESC_TRANSA, &opT, sizeof opT), "cublasLt TRANSA");
  BK(cublasLtMatmulDescSetAttribute(p->op, CUBLASLT_MATMUL_DESC_TRANSB, &opN, sizeof opN), "cublasLt TRANSB");
  BK(cublasLtMatrixLayoutCreate(&p->la, CUDA_R_8I, kc, np, kp), "cublasLt layout (op(B) slices)");
  BK(cublasLtMatrixLayoutCreate(&p->lb, CUDA_R_8I, kc, mp, kp), "cublasLt layout (op(A) slices)");
  BK(cublasLtMatrixLayoutCreate(&p->ld, CUDA_R_32I, np, mp, np), "cublasLt layout (int32 product)");
  BK(cublasLtMatmulPreferenceCreate(&pref), "cublasLtMatmulPreferenceCreate");
  BK(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &wsb, sizeof wsb),
     "cublasLt workspace preference");
  {
    cublasStatus_t s = cublasLtMatmulAlgoGetHeuristic(c->lt, p->op, p->la, p->lb, p->ld, p->ld, pref, 1, &h, &nres);
    if (s != CUBLAS_STATUS_SUCCESS || nres == 0) {
      rc = qc_err("%s: cuBLASLt has no algorithm for an int8 x int8 -> int32 GEMM (m %lld, n %lld, k %lld, TN) on this "
                  "GPU (status %d)",
                  c->name, (long long)mp, (long long)np, (long long)kc, (int)s);
      goto done;
    }
  }
  p->algo = h.algo;
  p->used = 1;
  p->mp = mp; p->np = np; p->kc = kc; p->kp = kp;
done:
  if (pref) rc = blas_keep(c, rc, cublasLtMatmulPreferenceDestroy(pref), "cublasLtMatmulPreferenceDestroy");
  if (rc) rc = cu_plan_free(c, rc, p);
  return rc;
}

/* bf16 x bf16 -> dt (CUDA_R_32F or CUDA_R_16BF), fp32 accumulation, fp32
 * scale, queued on stream st (the workspace is one: never two at once). */
int cu_lt_gemm_on(cu *c, cudaStream_t st, qc_op ta, qc_op tb, int64_t m, int64_t n, int64_t k, const void *A,
                  int64_t lda, const void *B, int64_t ldb, void *D, int64_t ldd, cudaDataType_t dt) {
  int rc;
  struct cu::lt_plan *p = NULL;
  const float one = 1.0f, zero = 0.0f;
  if ((rc = plan_get(c, ta, tb, m, n, k, lda, ldb, ldd, dt, &p))) return rc;
  BK(cublasLtMatmul(c->lt, p->op, &one, B, p->la, A, p->lb, &zero, D, p->ld, D, p->ld, &p->algo, c->ws, WS_BYTES, st),
     "cublasLtMatmul");
done:
  return rc;
}

/* cu_lt_gemm_on the backend's stream. */
int cu_lt_gemm(cu *c, qc_op ta, qc_op tb, int64_t m, int64_t n, int64_t k, const void *A, int64_t lda, const void *B,
               int64_t ldb, void *D, int64_t ldd, cudaDataType_t dt) {
  return cu_lt_gemm_on(c, c->st, ta, tb, m, n, k, A, lda, B, ldb, D, ldd, dt);
}

/* Zero C's rows (k == 0 products). */
static void zero_rows(void *Cm, int64_t m, int64_t n, int64_t ldc, size_t es) {
  for (int64_t i = 0; i < m; i++) memset((char *)Cm + (size_t)(i * ldc) * es, 0, (size_t)n * es);
}

/* 256-byte multiple of n. */
static size_t al256(size_t n) { return (n + 255) & ~(size_t)255; }

/* ---- large host operands through pinned chunks ----------------------------
 * cudaMemcpy from pageable memory runs at 5-6 GB/s: the whole Qwen2-MoE of
 * bench/hf_models.sh staged 70 GB of float64 operands in 12.5 s of its
 * 34 s audit on an H100 (QATCHECK_PROFILE). Above CU_PIN_MIN bytes a copy
 * goes through two pinned chunks instead: the host threads copy chunk i
 * into one while the DMA engine moves chunk i - 1 from the other
 * (cu_upload and cu_download take the same way). QC_CUDA_PAGEABLE=1 (a
 * side-by-side switch, docs/gpu.md) copies straight from pageable memory. */
#define CU_PIN_CHUNK ((size_t)64 << 20)
#define CU_PIN_MIN ((size_t)4 << 20)

typedef struct pcopy {
  char *dst;
  const char *src;
  size_t n;
} pcopy;

static void pcopy_piece(void *p, int64_t lo, int64_t hi, int tid) {
  (void)tid;
  const pcopy *x = (const pcopy *)p;
  const size_t a = (size_t)lo * (x->n / 16 + 1), b = (size_t)hi * (x->n / 16 + 1);
  if (a < x->n) memcpy(x->dst + a, x->src + a, (b < x->n ? b : x->n) - a);
}

/* memcpy on qc_par_for's threads (16 pieces, 4 MiB or more each). */
static void par_memcpy(void *dst, const void *src, size_t n) {
  pcopy x = {(char *)dst, (const char *)src, n};
  qc_par_for(16, n >= ((size_t)64 << 20) ? 1 : 4, pcopy_piece, &x);
}

/* 1 when host pointer p is pinned (cudaHostAlloc'd or registered): copied
 * directly. */
static int cu_pinned(const void *p) {
  cudaPointerAttributes a;
  if (cudaPointerGetAttributes(&a, p) != cudaSuccess) {
    (void)cudaGetLastError(); /* pageable memory on old drivers: not an error to keep */
    return 0;
  }
  return a.type == cudaMemoryTypeHost;
}

/* The two pinned chunks and their events, made on first use: 1 when they
 * are there. Pinned memory may be refused (a memlock limit) where pageable
 * copies still work: then 0 for the rest of the run, no error, and the
 * copies go straight from pageable memory as before the chunks. */
static int pin_ready(cu *c) {
  int rc = QC_OK;
  qc_err_state es;
  if (c->pin_off) return 0;
  qc_err_save(&es);
  for (int i = 0; i < 2; i++) {
    if (!c->pin[i]) CK(cudaHostAlloc(&c->pin[i], CU_PIN_CHUNK, cudaHostAllocDefault), "cudaHostAlloc (a staging chunk)");
    if (!c->pev[i]) CK(cudaEventCreateWithFlags(&c->pev[i], cudaEventDisableTiming), "cudaEventCreate (a staging chunk)");
  }
done:
  if (rc) {
    if (qc_verbose) fprintf(stderr, "qatcheck: %s: no pinned staging chunks (%s): host copies from pageable memory\n", c->name, qc_err_msg());
    (void)cudaGetLastError();
    c->pin_off = 1;
  }
  qc_err_restore(&es);
  return !rc;
}

int cu_stage_up(cu *c, void *dst, const void *src, size_t n, const char *what) {
  int rc = QC_OK;
  if (n < CU_PIN_MIN || c->sw[CU_SW_PAGEABLE] || cu_pinned(src) || !pin_ready(c)) {
    CK(cudaMemcpyAsync(dst, src, n, cudaMemcpyHostToDevice, c->st), what);
    return QC_OK;
  }
  for (size_t off = 0, i = 0; off < n; off += CU_PIN_CHUNK, i ^= 1) {
    const size_t len = n - off < CU_PIN_CHUNK ? n - off : CU_PIN_CHUNK;
    CK(cudaEventSynchronize(c->pev[i]), what); /* the chunk's last DMA is done */
    par_memcpy(c->pin[i], (const char *)src + off, len);
    CK(cudaMemcpyAsync((char *)dst + off, c->pin[i], len, cudaMemcpyHostToDevice, c->st), what);
    CK(cudaEventRecord(c->pev[i], c->st), what);
  }
done:
  return rc;
}

int cu_stage_down(cu *c, void *dst, const void *src, size_t n, const char *what) {
  int rc = QC_OK;
  if (n < CU_PIN_MIN || c->sw[CU_SW_PAGEABLE] || cu_pinned(dst) || !pin_ready(c)) {
    CK(cudaMemcpyAsync(dst, src, n, cudaMemcpyDeviceToHost, c->st), what);
    CK(cudaStreamSynchronize(c->st), what);
    return QC_OK;
  }
  for (size_t i = 0, nch = (n + CU_PIN_CHUNK - 1) / CU_PIN_CHUNK; i <= nch; i++) {
    if (i < nch) { /* chunk i into pin[i % 2]: its chunk i - 2 was copied out in the last round */
      const size_t off = i * CU_PIN_CHUNK, len = n - off < CU_PIN_CHUNK ? n - off : CU_PIN_CHUNK;
      CK(cudaMemcpyAsync(c->pin[i & 1], (const char *)src + off, len, cudaMemcpyDeviceToHost, c->st), what);
      CK(cudaEventRecord(c->pev[i & 1], c->st), what);
    }
    if (i >= 1) { /* chunk i - 1 out while chunk i moves */
      const size_t j = i - 1, off = j * CU_PIN_CHUNK, len = n - off < CU_PIN_CHUNK ? n - off : CU_PIN_CHUNK;
      CK(cudaEventSynchronize(c->pev[j & 1]), what);
      par_memcpy((char *)dst + off, c->pin[j & 1], len);
    }
  }
done:
  return rc;
}

/* The GEMMs' staging buffer at least `need` bytes (it only grows: a
 * cudaMalloc and a cudaFree per call cost more than a small GEMM, and
 * cudaFree waits for the whole device). */
static int gstage_grow(cu *c, size_t need) {
  if (c->gstage_bytes >= need) return QC_OK;
  cudaError_t e = cudaFree(c->gstage);
  c->gstage = NULL;
  c->gstage_bytes = 0;
  if (e != cudaSuccess) return cu_fail(c, "cudaFree (the GEMMs' smaller staging)", e);
  int rc = cu_dalloc(c, need, "GEMM operands", &c->gstage);
  if (!rc) c->gstage_bytes = need;
  return rc;
}

/* Stage op(A), op(B) on the device, run the GEMM, bring C back. The three
 * operands share one staging buffer that only grows (a cudaMalloc and a
 * cudaFree per call cost more than a small GEMM, and cudaFree waits for the
 * whole device). */
static int host_gemm(const qc_backend *be, int f64, qc_op ta, qc_op tb, int64_t m, int64_t n, int64_t k, const void *A,
                     int64_t lda, const void *B, int64_t ldb, void *Cm, int64_t ldc) {
  cu *c = C(be);
  int rc = QC_OK;
  size_t es = f64 ? 8 : 2, ces = f64 ? 8 : 4;
  size_t na = cu_span(ta == QC_OP_N ? m : k, ta == QC_OP_N ? k : m, lda, es);
  size_t nb = cu_span(tb == QC_OP_N ? k : n, tb == QC_OP_N ? n : k, ldb, es);
  size_t nc = cu_span(m, n, ldc, ces);
  if (m == 0 || n == 0) return QC_OK;
  if (k == 0) {
    zero_rows(Cm, m, n, ldc, ces);
    return QC_OK;
  }
  if ((rc = gstage_grow(c, al256(na) + al256(nb) + al256(nc)))) return rc;
  {
    char *dA = (char *)c->gstage, *dB = dA + al256(na), *dC = dB + al256(nb);
    if ((rc = cu_stage_up(c, dA, A, na, "upload GEMM operand A")) || (rc = cu_stage_up(c, dB, B, nb, "upload GEMM operand B")) ||
        (ldc != n && (rc = cu_stage_up(c, dC, Cm, nc, "upload GEMM result C"))))
      goto done;
    if (f64) rc = cu_dgemm_dev(c, ta, tb, m, n, k, (const double *)dA, lda, (const double *)dB, ldb, (double *)dC, ldc);
    else rc = cu_lt_gemm(c, ta, tb, m, n, k, dA, lda, dB, ldb, dC, ldc, CUDA_R_32F);
    if (rc) goto done;
    rc = cu_stage_down(c, Cm, dC, nc, "download GEMM result");
  }
done:
  return rc;
}

/* backend.h gemm_f64: host operands staged on the device, cuBLAS DGEMM. */
int cu_gemm_f64(const qc_backend *be, qc_op ta, qc_op tb, int64_t m, int64_t n, int64_t k, const double *A,
                       int64_t lda, const double *B, int64_t ldb, double *Cm, int64_t ldc) {
  return host_gemm(be, 1, ta, tb, m, n, k, A, lda, B, ldb, Cm, ldc);
}

/* backend.h gemm_bf16: host operands staged, cuBLASLt bf16 x bf16 -> fp32. */
int cu_gemm_bf16(const qc_backend *be, qc_op ta, qc_op tb, int64_t m, int64_t n, int64_t k, const uint16_t *A,
                        int64_t lda, const uint16_t *B, int64_t ldb, float *Cm, int64_t ldc) {
  return host_gemm(be, 0, ta, tb, m, n, k, A, lda, B, ldb, Cm, ldc);
}

/* ---- gemm_f64_x: operands as they are stored, the memo's kept ---------- */

/* The kept copies of a memo scope that has ended freed, at the start of a
 * call: its addresses name other values now. */
static int keep_sync(cu *c) {
  const uint64_t g = qc_memo_gen();
  if (c->keep_gen == g) return QC_OK;
  int rc = cu_keep_drop(c, QC_OK);
  if (!rc) c->keep_gen = g;
  return rc;
}

/* The device copy of the `bytes` host bytes at p, which the memo holds:
 * the one kept, else uploaded into a new one while the budget allows
 * (*dev NULL where it does not: the caller stages it). */
static int keep_get(cu *c, const void *p, size_t bytes, const void **dev) {
  int rc = QC_OK, fresh = -1;
  *dev = NULL;
  if (c->keep_gen != qc_memo_gen()) return QC_OK; /* a scope changed within this call: staged (keep_sync drops at the next) */
  for (int i = 0; i < CU_KEEP; i++) {
    if (c->keep[i].host == p && c->keep[i].bytes == bytes) {
      *dev = c->keep[i].dev;
      return QC_OK;
    }
    if (!c->keep[i].dev && fresh < 0) fresh = i;
  }
  size_t fr = 0, tot = 0;
  CK(cudaMemGetInfo(&fr, &tot), "cudaMemGetInfo");
  if (!c->keep_budget) c->keep_budget = fr / 2;
  /* not kept, staged as the others: over the budget, or a copy that would leave less than CU_KEEP_SPARE free
   * for what allocates outside cu_dalloc (cuBLAS, NCCL, a kernel's first load) */
  if (fresh < 0 || c->keep_bytes + bytes > c->keep_budget || bytes + CU_KEEP_SPARE > fr) return QC_OK;
  {
    void *d = NULL;
    if (cudaMalloc(&d, bytes) != cudaSuccess) { /* a copy is an economy, not a need: without one it is staged */
      (void)cudaGetLastError();
      return QC_OK;
    }
    if ((rc = cu_stage_up(c, d, p, bytes, "upload a kept GEMM operand"))) {
      rc = cu_keep(c, rc, cudaFree(d), "cudaFree (a kept GEMM operand)");
      return rc;
    }
    c->keep[fresh] = (struct cu::cu_keep){p, bytes, d}; /* registered once its bytes are on their way */
    c->keep_bytes += bytes;
    *dev = d;
  }
done:
  return rc;
}

/* Operand o of [rows, cols] as float64 on the device at *out: the kept copy
 * or the staged bytes (into raw, al256(bytes) long, unless float64, which
 * stages into f64 itself) widened into f64 with o's flags; a float64
 * operand without flags is used where it lies. */
static int x_operand(cu *c, const qc_gemm_x *o, int64_t rows, int64_t cols, void *raw, double *f64, const double **out) {
  int rc = QC_OK;
  const size_t bytes = cu_span(rows, cols, o->ld, qc_dtype_size(o->dt));
  const int64_t n = (int64_t)(bytes / qc_dtype_size(o->dt));
  const void *src = NULL;
  if (qc_memo_holds(o->p, bytes) && (rc = keep_get(c, o->p, bytes, &src))) return rc;
  if (!src) {
    void *to = o->dt == QC_F64 ? (void *)f64 : raw;
    if ((rc = cu_stage_up(c, to, o->p, bytes, "upload a GEMM operand"))) return rc;
    src = to;
  }
  if (o->dt == QC_F64 && !o->flags) {
    *out = (const double *)src;
    return QC_OK;
  }
  CK((cudaError_t)qk_to_f64_x(cu_tkind(o->dt), src, f64, n, (o->flags & QC_GX_BF16 ? QK_X_BF16 : 0) | (o->flags & QC_GX_ABS ? QK_X_ABS : 0),
                              c->st),
     "widen a GEMM operand");
  *out = f64;
done:
  return rc;
}

/* backend.h gemm_f64_x: each operand uploaded as stored (or found kept),
 * widened on the device, cuBLAS DGEMM, C brought back. */
int cu_gemm_f64_x(const qc_backend *be, qc_op ta, qc_op tb, int64_t m, int64_t n, int64_t k, const qc_gemm_x *A,
                  const qc_gemm_x *B, double *Cm, int64_t ldc) {
  cu *c = C(be);
  int rc = QC_OK;
  if (!qc_gemm_x_dtype(A->dt) || !qc_gemm_x_dtype(B->dt))
    return qc_err("%s: gemm_f64_x: an operand of %s: expected float64, float32, float16 or bfloat16", c->name,
                  qc_dtype_name(qc_gemm_x_dtype(A->dt) ? B->dt : A->dt));
  if (m == 0 || n == 0) return QC_OK;
  if (k == 0) {
    zero_rows(Cm, m, n, ldc, 8);
    return QC_OK;
  }
  if ((rc = keep_sync(c))) return rc; /* once, here: a copy found for A is not freed while B is looked up */
  const int64_t ar = ta == QC_OP_N ? m : k, ac = ta == QC_OP_N ? k : m, br = tb == QC_OP_N ? k : n, bc = tb == QC_OP_N ? n : k;
  const size_t fa = cu_span(ar, ac, A->ld, 8), fb = cu_span(br, bc, B->ld, 8), nc = cu_span(m, n, ldc, 8);
  const size_t ra = A->dt == QC_F64 ? 0 : cu_span(ar, ac, A->ld, qc_dtype_size(A->dt));
  const size_t rb = B->dt == QC_F64 ? 0 : cu_span(br, bc, B->ld, qc_dtype_size(B->dt));
  if ((rc = gstage_grow(c, al256(fa) + al256(fb) + al256(nc) + al256(ra) + al256(rb)))) return rc;
  {
    char *dA = (char *)c->gstage, *dB = dA + al256(fa), *dC = dB + al256(fb), *rA = dC + al256(nc), *rB = rA + al256(ra);
    const double *a = NULL, *b = NULL;
    if ((rc = x_operand(c, A, ar, ac, rA, (double *)dA, &a)) || (rc = x_operand(c, B, br, bc, rB, (double *)dB, &b)) ||
        (ldc != n && (rc = cu_stage_up(c, dC, Cm, nc, "upload GEMM result C"))))
      return rc;
    if ((rc = cu_dgemm_dev(c, ta, tb, m, n, k, a, A->ld, b, B->ld, (double *)dC, ldc))) return rc;
    rc = cu_stage_down(c, Cm, dC, nc, "download GEMM result");
  }
  return rc;
}

/* qc_metrics from the kernel's sums, as qc_metrics_compute fills them. */

int cu_gemm_f64_buf(const qc_backend *be, qc_op ta, qc_op tb, int64_t m, int64_t n, int64_t k, const double *A,
                           int64_t lda, const double *B, int64_t ldb, double *Cm, int64_t ldc) {
  cu *c = C(be);
  int rc = QC_OK;
  if (m == 0 || n == 0) return QC_OK;
  if (k == 0) {
    for (int64_t i = 0; i < m; i++) CK(cudaMemsetAsync(Cm + i * ldc, 0, (size_t)n * 8, c->st), "zero GEMM output");
    return QC_OK;
  }
  rc = cu_dgemm_dev(c, ta, tb, m, n, k, A, lda, B, ldb, Cm, ldc);
done:
  return rc;
}
