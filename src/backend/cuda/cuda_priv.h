/* cuda_priv.h: inside the CUDA backend (not its interface, which is
 * backend.h's table and cuda.h): the per-device state, the error and
 * allocation helpers, and the functions its files share. One file per
 * concern:
 *   backend.cu   open / close: the device, stream, handles, the op table
 *   buffers.cu   device and pinned host memory, uploads and downloads
 *   gemm.cu      cuBLAS DGEMM (the reference's), cuBLASLt bf16 (the candidate's), the int8 plan (the fast reference's)
 *   metrics.cu   the fused deterministic metrics pass, queued results, sync
 *   quant.cu     the quantizer kernels, widening, fake-quant to float64
 *   linear.cu    the fused linear audit (the linear class's fast path)
 *   ozaki.cu     the fast reference: the Ozaki scheme on int8 tensor cores
 *   attrows.cu   the attention reference's row passes (softmax rows, their sums)
 *   normrows.cu  the RMSNorm / LayerNorm reference's row and column passes
 *   pointwise.cu the elementwise classes' references (gelu, swiglu)
 *   lprows.cu    the logprob reference's rows (softmax over the vocab)
 *   coll.cu      collectives across processes (NCCL, when built with it)
 *   bench.cu     timing and conformance hooks for bench/ (cuda.h)
 *   stamp.cu     the ABI stamp open.c checks before it calls anything here */
#ifndef QC_CUDA_PRIV_H
#define QC_CUDA_PRIV_H

#include <cublasLt.h>
#include <cublas_v2.h>
#include <cuda_fp8.h> /* before numerics/recipe.h (its device e4m3) */
#include <cuda_runtime.h>
#include <string.h>
#ifdef QC_HAVE_NCCL
#include <nccl.h>
#endif

#define CU_OZ_PLANS 16 /* the fast reference's int8 GEMM descriptors cached (cu::cu_oz::plans) */
#define CU_KEEP 1024   /* operands gemm_f64_x keeps on the device at once (cu::keep): a MoE layer's experts, two each
                        * (512 at DeepSeek-V3's 256), and their variants' */
#define CU_KEEP_SPARE ((size_t)2 << 30) /* device bytes a kept copy always leaves free */

extern "C" {
#include "backend/backend.h"
#include "backend/cuda/cuda.h"
#include "backend/ozplan.h"
#include "backend/refcost.h"
#include "core/memo.h"
#include "core/par.h"
#include "core/qc.h"
#include "kernels/kernels.h"
#include "numerics/quant.h"
}

#define GiB (1024.0 * 1024.0 * 1024.0)
#define WS_BYTES ((size_t)32 << 20)
#define PEND 64
#define QC_CU_EVENTS 7

/* The benchmark's side-by-side switches (docs/gpu.md), c->sw[i]: read once
 * when the backend opens, 1 when the environment variable (backend.cu's
 * table) is "1"; qc_cuda_switch (cuda.h) sets one on an open backend.
 *   CU_SW_UNFUSED    QC_CUDA_UNFUSED: no reference d_x inside the block128 quantizer
 *   CU_SW_DW_EARLY   QC_CUDA_DW_EARLY: d_weight's metrics on the second stream after its pair
 *   CU_SW_QK_SCALAR  QC_CUDA_QK_SCALAR: the element-wise block128 quantizer
 *   CU_SW_PAGEABLE   QC_CUDA_PAGEABLE: host copies straight from pageable memory, no pinned chunks
 *   CU_SW_ATT_HOST   QC_CUDA_ATT_HOST: the attention reference's rows on the host, its GEMMs staged (attrows.cu)
 *   CU_SW_NORM_HOST  QC_CUDA_NORM_HOST: the norm reference's passes on the host (normrows.cu)
 *   CU_SW_PW_HOST    QC_CUDA_PW_HOST: the elementwise classes' references on the host (pointwise.cu)
 *   CU_SW_LP_HOST    QC_CUDA_LP_HOST: the logprob reference's rows on the host (lprows.cu)
 *   CU_SW_ROPE_HOST  QC_CUDA_ROPE_HOST: the RoPE reference's rotation on the host (roperows.cu)
 *   CU_SW_CONV_HOST  QC_CUDA_CONV_HOST: the conv1d reference's sums on the host (convrows.cu) */
enum { CU_SW_UNFUSED, CU_SW_DW_EARLY, CU_SW_QK_SCALAR, CU_SW_PAGEABLE, CU_SW_ATT_HOST, CU_SW_NORM_HOST, CU_SW_PW_HOST, CU_SW_LP_HOST,
       CU_SW_ROPE_HOST, CU_SW_CONV_HOST, CU_SWITCHES };

typedef struct cu {
  qc_backend be;
  int dev;
  char name[32];
  cudaStream_t st;
  cudaStream_t st2;         /* the fused audit's second stream (candidate GEMMs, d_x metrics) */
  cublasHandle_t blas;
  cublasHandle_t blas2;     /* a second handle on st2 (a handle's workspace is not for two streams at once) */
  cublasLtHandle_t lt;
  void *ws;                 /* cuBLASLt workspace */
  void *arena;              /* the fused audit's scratch, grown on demand */
  size_t arena_bytes;
  void *gstage;             /* gemm_f64 / gemm_bf16 on host operands: A, B, C staged here, grown on demand */
  size_t gstage_bytes;
  struct cu_keep {          /* gemm_f64_x: device copies of operands the memo holds (qc_memo_holds), as stored */
    const void *host;       /* its host bytes [host, host + bytes) */
    size_t bytes;
    void *dev;
  } keep[CU_KEEP];
  uint64_t keep_gen;        /* qc_memo_gen() when they were made: another one drops them all */
  size_t keep_bytes, keep_budget; /* bytes held; the most held (half the free memory at the first: 256 real-size
                                   * experts' quantized weights are 45 GB, 8 GiB at most held a sixth) */
  void *pin[2];             /* two pinned host chunks of CU_PIN_CHUNK bytes: large host operands pass through them */
  int pin_off;              /* 1: pinned memory was refused; copies go straight from pageable memory */
  cudaEvent_t pev[2];       /* recorded after each chunk's copy on st */
  void *mscratch;           /* metrics partials */
  qk_msum *mres;            /* [2 + PEND] metrics results: 2 for the fused audit, PEND for metrics_buf */
  qc_metrics *pend[PEND];   /* metrics_buf results waiting for sync: host destinations of mres[2 + i] */
  int npend;
  struct cu_fence {         /* backend.h fences */
    cudaEvent_t ev;         /* recorded after the download of hres */
    qk_msum *hres;          /* [PEND] pinned: the metrics sums pending at the fence */
    qc_metrics *dst[PEND];  /* their host destinations */
    int n;
    int armed;              /* set and not yet waited for (nor drained by sync) */
    int recorded;           /* ev was recorded (else wait on the whole stream) */
  } fence[QC_FENCES];
  uint32_t *qscratch;       /* [4] quantizer scratch */
  struct cu_lin_host {      /* pinned: what the fused audit downloads at its one sync */
    qk_msum ms[2];          /* metrics of d_x, d_weight */
    uint32_t qs[4];         /* quantizer status ([1] the non-finite count) */
    double bias[2][QK_BIAS_NSUM]; /* the bias test's combined sums of d_x, d_weight */
  } *lh;
  cudaEvent_t ev[QC_CU_EVENTS]; /* [0..4] stage times (timing), [5..6] the audit's cross-stream order */
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
  struct cu_oz {            /* the fast reference (ozaki.cu); nothing allocated until it is asked for */
    void *buf[2];           /* per slot (d_x, d_weight: they may run on two streams at once): slices,
                             * int32 products, exponents, a cuBLASLt workspace; grown on demand, freed at close */
    size_t bytes[2];
    void *dev;              /* [2][4] self-check results, [2] non-finite flags, [2] the check's scratch,
                             * [2] the plans' evidence (OZ_NS x QK_OZ_PLAN_W doubles each) */
    double *host;           /* pinned: the same results and flags, downloaded at the settle; then
                             * [2] the plans' evidence, downloaded at cu_ref_run */
    cudaEvent_t plan_ev[2]; /* each slot's evidence downloaded */
    struct oz_plan {        /* cuBLASLt int8 x int8 -> int32 descriptors and algorithm per shape and
                             * contraction (a level's GEMM: its pairs x k): CU_OZ_PLANS of them, reused
                             * round robin (an audit at S slices uses up to 2 S) */
      int used;
      int64_t mp, np, kc, kp;
      cublasLtMatmulDesc_t op;
      cublasLtMatrixLayout_t la, lb, ld;
      cublasLtMatmulAlgo_t algo;
    } plans[CU_OZ_PLANS];
    int next_plan;
    struct oz_pend {        /* a reference queued on the fast path, for the settle's DGEMM fallback */
      int used;
      cudaStream_t st;
      cublasHandle_t h;
      qc_op ta, tb;
      int64_t m, n, k, lda, ldb, ldc;
      const double *A, *B;
      double *C;
      int S;                /* the slices it ran with */
      int ran;              /* 0: split, the plan's evidence queued; 1: its products (or DGEMM) queued too */
      qc_ozplan plan;       /* the pairs run (plan.L 0: none: DGEMM from the start) */
      unsigned nonfinite;   /* the split saw a non-finite operand (DGEMM from the start) */
      int8_t *as, *bs;      /* its slices, int32 products, exponents, workspace (in buf[slot]) */
      int32_t *T;
      int *ea, *eb;
      void *ws;
      int64_t mp, np, kp;
    } pend[2];
  } oz;
  struct cu_refauto {       /* --reference auto (refprobe.cu): this device's rates, probed once */
    int probed;             /* the probe ran (or was tried) */
    int ok;                 /* its rates are usable; else auto keeps DGEMM */
    qc_refcost_rates r;
  } ra;
#ifdef QC_HAVE_NCCL
  ncclComm_t comm;          /* the collectives' communicator (coll.cu), NULL until coll_init */
#endif
  int coll_ready;
  int sw[CU_SWITCHES];      /* the side-by-side switches (above) */
  int rel_rc;               /* the first failed release of buf_free / host_free (they return nothing): reported by sync */
} cu;

/* A float dtype as a conversion kernel's kind (kernels.h QK_T_*); -1 for others. */
static inline int cu_tkind(qc_dtype dt) {
  switch (dt) {
    case QC_F64: return QK_T_F64;
    case QC_F32: return QK_T_F32;
    case QC_F16: return QK_T_F16;
    case QC_BF16: return QK_T_BF16;
    default: return -1;
  }
}

/* The CUDA state behind a backend table. */
static inline cu *C(const qc_backend *be) { return (cu *)be->priv; }

/* n bytes from host src to device dst on c->st, queued. A pageable src
 * may be reused when it returns (4 MiB or more pass through two pinned
 * chunks, gemm.cu); a pinned one is copied directly and must stay until the
 * stream has passed the copy, as with cudaMemcpyAsync. QC_OK or a CUDA
 * error's status. */
int cu_stage_up(cu *c, void *dst, const void *src, size_t n, const char *what);
/* n bytes from device src to host dst after the work queued on c->st;
 * returns when they are there (the same chunks the other way). */
int cu_stage_down(cu *c, void *dst, const void *src, size_t n, const char *what);

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

/* Turn a failed CUDA call into the one error line. Allocation failures are
 * input errors (the shape is too big for this device); others are system. */
int cu_fail(const cu *c, const char *what, cudaError_t e);
/* A failed cuBLAS / cuBLASLt call as the one error line (system error). */
int blas_fail(const cu *c, const char *what, int s);
/* Device allocation with the amount named when it cannot fit; gemm_f64_x's
 * kept copies are freed first where they are in the way or their memo
 * scope has ended. */
int cu_dalloc(const cu *c, size_t bytes, const char *what, void **p);
/* A release step (a free, a destroy, a sync in a cleanup label) whose
 * status is e (CUDA) or s (cuBLAS, cuBLASLt): rc when rc already failed (the
 * first failure is the cause), else QC_OK or the step's failure as the one
 * error line. rc = cu_keep(c, rc, cudaFree(p), "cudaFree"). */
int cu_keep(const cu *c, int rc, cudaError_t e, const char *what);
int blas_keep(const cu *c, int rc, int s, const char *what);

/* Release a cuBLASLt plan (cu::lt_plan or cu::cu_oz::oz_plan, the auto probe's too: the
 * descriptors op, la, lb, ld; NULL ones skipped) and zero it; rc as
 * cu_keep. The one teardown of every plan. */
template <typename P> static inline int cu_plan_free(const cu *c, int rc, P *p) {
  if (p->ld) rc = blas_keep(c, rc, cublasLtMatrixLayoutDestroy(p->ld), "cublasLtMatrixLayoutDestroy");
  if (p->lb) rc = blas_keep(c, rc, cublasLtMatrixLayoutDestroy(p->lb), "cublasLtMatrixLayoutDestroy");
  if (p->la) rc = blas_keep(c, rc, cublasLtMatrixLayoutDestroy(p->la), "cublasLtMatrixLayoutDestroy");
  if (p->op) rc = blas_keep(c, rc, cublasLtMatmulDescDestroy(p->op), "cublasLtMatmulDescDestroy");
  memset(p, 0, sizeof *p);
  return rc;
}

/* Bytes of a row-major operand of `rows` rows, `cols` columns, leading dim ld. */
static inline size_t cu_span(int64_t rows, int64_t cols, int64_t ld, size_t es) {
  return rows == 0 || cols == 0 ? 0 : ((size_t)(rows - 1) * (size_t)ld + (size_t)cols) * es;
}

/* The fused audit's buffers in the arena (the same layout for the audit and
 * for the benchmark that times its parts). */
typedef struct lin_bufs {
  double *wq64, *x64, *dy64, *rx, *rw; /* W_ref, X, dY, references d_x, d_weight: float64 */
  double *bias, *bias2;                /* the bias test's row and column sums of d_x, of d_weight */
  double *bias_out;                    /* [2][QK_BIAS_NSUM] their combined sums (qk_bias_final) */
  uint16_t *wq16, *cx, *cw;           /* W_ref, builtin candidates d_x, d_weight: bf16 */
} lin_bufs;

/* The thread block's sum (op 0) or max (op 1) of v over its N threads,
 * the same tree every run: the row passes' sums (attrows.cu, normrows.cu,
 * lprows.cu), deterministic and within a few float64 ulps of a sequential
 * sum. sh: N doubles of shared memory; every thread of the block calls it. */
template <int N> __device__ static inline double cu_block_reduce(double v, int op, double *sh) {
  sh[threadIdx.x] = v;
  __syncthreads();
  for (int s = N / 2; s > 0; s >>= 1) {
    if ((int)threadIdx.x < s) sh[threadIdx.x] = op ? fmax(sh[threadIdx.x], sh[threadIdx.x + s]) : sh[threadIdx.x] + sh[threadIdx.x + s];
    __syncthreads();
  }
  const double r = sh[0];
  __syncthreads();
  return r;
}

/* ---- the seam's operations, each in the file of its concern ---- */
int cu_allreduce(const qc_backend *be, void *buf, int64_t n, qc_dtype dt, qc_redop op);
int cu_coll_id(const qc_backend *be, void *id, size_t n);
int cu_coll_init(const qc_backend *be, const void *id, int nranks, int rank);
int cu_coll_ready(const qc_backend *be);
int cu_mem_free(const qc_backend *be, size_t *bytes);
int cu_att_rows(const qc_backend *be, const qc_att_rows *j);
int cu_norm_rows(const qc_backend *be, const qc_norm_rows *j);
int cu_pointwise(const qc_backend *be, const qc_pw *j);
int cu_lp_rows(const qc_backend *be, const qc_lp_rows *j);
int cu_rope_rows(const qc_backend *be, const qc_rope_rows *j);
int cu_conv_rows(const qc_backend *be, const qc_conv_rows *j);
int cu_audit_linear(const qc_backend *be, const qc_linear_audit *a, qc_linear_audit_out *o);
int cu_buf_alloc(const qc_backend *be, size_t bytes, const char *what, void **p);
void cu_buf_free(const qc_backend *be, void *p);
int cu_download(const qc_backend *be, void *dst, const void *src, size_t bytes);
int cu_fence(const qc_backend *be, int k);
int cu_fake_quant_f64(const qc_backend *be, const char *fmt, const char *profile, int64_t rows, int64_t cols, qc_dtype dt, const void *src, float *scratch, double *dst, const char *what);
int cu_gemm_bf16(const qc_backend *be, qc_op ta, qc_op tb, int64_t m, int64_t n, int64_t k, const uint16_t *A, int64_t lda, const uint16_t *B, int64_t ldb, float *Cm, int64_t ldc);
int cu_gemm_f64(const qc_backend *be, qc_op ta, qc_op tb, int64_t m, int64_t n, int64_t k, const double *A, int64_t lda, const double *B, int64_t ldb, double *Cm, int64_t ldc);
int cu_gemm_f64_x(const qc_backend *be, qc_op ta, qc_op tb, int64_t m, int64_t n, int64_t k, const qc_gemm_x *A, const qc_gemm_x *B, double *Cm, int64_t ldc);
/* Free gemm_f64_x's kept copies (rc as cu_keep): when the memo's scope changed, and at close. */
int cu_keep_drop(cu *c, int rc);
int cu_gemm_f64_buf(const qc_backend *be, qc_op ta, qc_op tb, int64_t m, int64_t n, int64_t k, const double *A, int64_t lda, const double *B, int64_t ldb, double *Cm, int64_t ldc);
int cu_host_alloc(const qc_backend *be, size_t bytes, const char *what, void **p);
void cu_host_free(const qc_backend *be, void *p);
int cu_metrics(const qc_backend *be, const double *g, const double *r, int64_t n, qc_metrics *out);
int cu_metrics_buf(const qc_backend *be, const double *g, const double *r, int64_t n, qc_metrics *out);
int cu_quantize(const qc_backend *be, const char *fmt, const char *profile, int64_t rows, int64_t cols, const float *in, qc_qout *q);
int cu_sync(const qc_backend *be);
int cu_to_f64(const qc_backend *be, qc_dtype dt, const void *src, int64_t n, double *dst);
int cu_wait_fence(const qc_backend *be, int k);
int cu_upload(const qc_backend *be, void *dst, const void *src, size_t bytes);

/* ---- shared between the files ---- */
int cu_dgemm_dev_h(cu *c, cublasHandle_t h, qc_op ta, qc_op tb, int64_t m, int64_t n, int64_t k, const double *A, int64_t lda, const double *B, int64_t ldb, double *Cm, int64_t ldc);
int cu_dgemm_dev(cu *c, qc_op ta, qc_op tb, int64_t m, int64_t n, int64_t k, const double *A, int64_t lda, const double *B, int64_t ldb, double *Cm, int64_t ldc);
/* *ms = the time from event a to event b (both done), or the failure. */
int cu_ev_ms(const cu *c, cudaEvent_t a, cudaEvent_t b, double *ms);
void cu_lin_layout(const cu *c, int64_t M, int64_t K, int64_t N, lin_bufs *b);
int cu_lt_gemm_on(cu *c, cudaStream_t st, qc_op ta, qc_op tb, int64_t m, int64_t n, int64_t k, const void *A, int64_t lda, const void *B, int64_t ldb, void *D, int64_t ldd, cudaDataType_t dt);
int cu_lt_gemm(cu *c, qc_op ta, qc_op tb, int64_t m, int64_t n, int64_t k, const void *A, int64_t lda, const void *B, int64_t ldb, void *D, int64_t ldd, cudaDataType_t dt);
int cu_metrics_dev(cu *c, const void *g, int g_kind, const double *r, int64_t n, int slot, qc_metrics *out);
void cu_metrics_fill(const qk_msum *s, qc_metrics *m);
/* Free the communicator at close (rc as cu_keep). */
int cu_coll_free(cu *c, int rc);
int cu_qfmt(const cu *c, const char *fmt, const char *profile, qk_qargs *a);
/* ozaki.cu: the reference GEMMs of the fused audit. cu_ref_gemm queues
 * C = op(A) op(B) (cu_dgemm_dev's convention) on stream st (h: the cuBLAS
 * handle bound to it) in float64 (slices 0: cuBLAS DGEMM) or by the Ozaki
 * scheme with `slices` int8 slices and its self-check; slot 0 (d_x) or 1
 * (d_weight) owns its buffers, so the two may run on two streams at once;
 * slot 1 is queued first in an audit (it forgets what an audit that failed
 * left queued). cu_ref_settle, called once an audit's references are
 * queued: nothing when none took the fast path; else waits for both
 * streams, keeps each fast result whose measured error is below 1e-3 of
 * the sample's noise floor, recomputes the others with DGEMM on their
 * stream (and waits for them), and reports into o (NULL: not reported). */
int cu_ref_gemm(cu *c, int slices, int slot, cudaStream_t st, cublasHandle_t h, qc_op ta, qc_op tb, int64_t m, int64_t n,
                int64_t k, const double *A, int64_t lda, const double *B, int64_t ldb, double *Cm, int64_t ldc);
int cu_ref_settle(cu *c, qc_linear_audit_out *o);
/* Release the fast reference's plans and buffers at close (rc as cu_keep). */
int cu_oz_free(cu *c, int rc);
/* The fast reference's parts the hooks of bench.cu use: the small buffers
 * allocated (once), slot's self-check results (4 device doubles), its
 * non-finite flag, its check scratch; and the Ozaki GEMM with every pair of
 * its `slices` slices, queued on st (res: its self-check into 4 device
 * doubles, or NULL; flag: a device word set on a non-finite operand, or
 * NULL: the slot's). */
#define CU_OZ_NS 2048 /* elements in the self-check's sample */
int cu_oz_small(cu *c);
double *cu_oz_res(cu *c, int slot);
unsigned *cu_oz_flag(cu *c, int slot);
double *cu_oz_scratch(cu *c, int slot);
int cu_ozaki_gemm(cu *c, int slot, cudaStream_t st, qc_op ta, qc_op tb, int64_t m, int64_t n, int64_t k, const double *A,
                  int64_t lda, const double *B, int64_t ldb, double *Cm, int64_t ldc, int slices, double *res, unsigned *flag);
/* gemm.cu: the cuBLASLt plan of one int8 x int8 -> int32 GEMM of the fast
 * reference (the audit's levels, cached by ozaki.cu, and the auto probe's
 * timed GEMM), built into *p, which must be zeroed or released
 * (cu_plan_free): column-major "TN" (TRANSA T, TRANSB N), D = la^T lb, i.e.
 * the row-major C[mp, np] = As Bs^T (As: op(A)'s digits, Bs: op(B)'s, each
 * row contiguous) with exact int32 sums, alpha and beta int32;
 * descriptors op, la, lb, ld, the WS_BYTES workspace preference, and the
 * heuristic's first algorithm; p's key (used, mp, np, kc, kp) set. QC_OK;
 * else p released and QC_EINPUT where cuBLASLt has no such algorithm, or
 * the failed call's error.
 *   c   the backend (its cuBLASLt handle c->lt)
 *   mp  rows of C, a multiple of 16: columns of lb (op(A)'s slices) and of D
 *   np  columns of C, a multiple of 16: columns of la (op(B)'s slices), rows
 *       and leading dimension of D (int32, np x mp)
 *   kc  the contraction, in int8 digits: rows of la and lb
 *   kp  the leading dimension of la and lb (bytes from one column, a row of
 *       C's operand, to the next), >= kc, a multiple of 16
 *   p   the plan filled */
int cu_oz_plan_make(cu *c, int64_t mp, int64_t np, int64_t kc, int64_t kp, struct cu::cu_oz::oz_plan *p);
/* refprobe.cu: --reference auto. cu_ref_probe measures, once per backend,
 * the rates of backend/refcost.h (DGEMM, an int8 cuBLASLt GEMM, the split,
 * the combine and the self-check on probe shapes; a few ms, device-wide
 * synchronous: call it between audits); a probe that cannot run (no memory,
 * no int8 algorithm) leaves auto on DGEMM, said under --verbose. cu_ref_auto:
 * the slices the reference GEMM C[m, n] (contraction k) of slot 0 (d_x) or
 * 1 (d_weight) takes under auto: QC_REF_FAST_SLICES or 0 (DGEMM). */
int cu_ref_probe(cu *c);
int cu_ref_auto(cu *c, int slot, int64_t m, int64_t n, int64_t k);

#endif
