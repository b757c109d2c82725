/* backend.h: the one seam between the audit and the hardware. A table of
 * operations with a CPU implementation (cpu.c, what CI runs) and a CUDA one
 * (backend/cuda/, its table in backend.cu, behind --device cuda[:N]; a
 * shared object open.c loads on demand). Pointers are host pointers; a device
 * backend stages data itself. Matrices are row-major; op(A) is A or A^T. */
#ifndef QC_BACKEND_H
#define QC_BACKEND_H

#include <stddef.h>
#include <stdint.h>

#include "numerics/metrics.h"
#include "core/tensor.h"
#include "numerics/qlayout.h"

typedef enum { QC_OP_N = 0, QC_OP_T = 1 } qc_op;

struct qc_linear_audit;
struct qc_linear_audit_out;
struct qc_att_rows;
struct qc_norm_rows;
struct qc_pw;
struct qc_lp_rows;
struct qc_rope_rows;
struct qc_conv_rows;

/* One operand of gemm_f64_x: a row-major host matrix at p of dt (float64,
 * float32, float16 or bfloat16), leading dimension ld, read as its exact
 * float64 values, each rounded to bf16 where QC_GX_BF16 (qc_round_all's
 * rounding: to float32, then bf16 RNE), then made |v| where QC_GX_ABS. */
enum { QC_GX_BF16 = 1, QC_GX_ABS = 2 };
typedef struct qc_gemm_x {
  const void *p;
  qc_dtype dt;
  int64_t ld;
  unsigned flags; /* QC_GX_* */
} qc_gemm_x;

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

  /* ---- additive, device-resident ops (NULL where a backend lacks them) ----
   * Device buffers: memory on the backend's device, filled with upload and
   * read with download (both on the backend's one stream; download waits).
   * host_alloc gives pinned host memory, so uploads run at full link speed. */
  int (*buf_alloc)(const struct qc_backend *be, size_t bytes, const char *what, void **dptr);
  void (*buf_free)(const struct qc_backend *be, void *dptr);
  int (*upload)(const struct qc_backend *be, void *dst, const void *src, size_t bytes);
  int (*download)(const struct qc_backend *be, void *dst, const void *src, size_t bytes);
  int (*host_alloc)(const struct qc_backend *be, size_t bytes, const char *what, void **hptr);
  void (*host_free)(const struct qc_backend *be, void *hptr);
  /* Quantize a host float32 [rows, cols] matrix under fmt/profile; fills
   * every non-NULL field of *q (host memory sized per qc_qlayout). */
  int (*quantize)(const struct qc_backend *be, const char *fmt, const char *profile, int64_t rows, int64_t cols,
                  const float *in, struct qc_qout *q);
  /* The fused linear audit on device buffers (see qc_linear_audit). */
  int (*audit_linear)(const struct qc_backend *be, const struct qc_linear_audit *a, struct qc_linear_audit_out *o);

  /* ---- building blocks on buffers (the contract sweep) ----------------------
   * Pointers are buf_alloc'd buffers (host memory when host_memory is 1, so
   * host data may be passed without an upload). Ops are queued in order on
   * the backend's stream and may still run when they return; results are
   * final after sync. Inputs are finite (the caller checked them). */
  int host_memory;
  /* dst[i] = (double)src[i], n elements of dt (float64, float32, float16, bfloat16). */
  int (*to_f64)(const struct qc_backend *be, qc_dtype dt, const void *src, int64_t n, double *dst);
  /* dst [rows, cols] = dequant(quant(src)) widened to float64 (qc_fake_quant_f64's
   * values) under fmt/profile; src of dt as above; scratch: rows*cols floats
   * (the float32 copy of a float64 / float16 src). */
  int (*fake_quant_f64)(const struct qc_backend *be, const char *fmt, const char *profile, int64_t rows, int64_t cols,
                        qc_dtype dt, const void *src, float *scratch, double *dst, const char *what);
  /* gemm_f64 on buffers. */
  int (*gemm_f64_buf)(const struct qc_backend *be, qc_op ta, qc_op tb, int64_t m, int64_t n, int64_t k,
                      const double *A, int64_t lda, const double *B, int64_t ldb, double *C, int64_t ldc);
  /* metrics of g against r (buffers, float64); *out is filled by sync. */
  int (*metrics_buf)(const struct qc_backend *be, const double *g, const double *r, int64_t n, qc_metrics *out);
  /* Wait for every queued op; fill the pending metrics (fenced ones too). */
  int (*sync)(const struct qc_backend *be);
  /* Fences, k in [0, QC_FENCES): fence marks the end of the ops queued so
   * far and takes over the metrics pending until then; wait_fence(k) waits
   * for those ops only and fills those metrics (nothing to do when a sync
   * came between). Ops queued after a fence may run while the host waits
   * on it, so a caller can queue unit u+1 before it reads unit u's results;
   * the metrics' destinations must stay where they are until then. A fence
   * is waited for before it is set again. Synchronous backends: no-ops. */
  int (*fence)(const struct qc_backend *be, int k);
  int (*wait_fence)(const struct qc_backend *be, int k);

  /* ---- collectives across processes (NULL where a backend has none: the
   * CPU's reductions are the host's, through src/dist/) ------------------------
   * A device backend built with NCCL: rank 0 makes a communicator id
   * (ncclGetUniqueId, QC_COLL_ID_BYTES bytes), src/dist/ broadcasts it over
   * MPI, every rank joins with coll_init (ncclCommInitRank); allreduce then
   * reduces a device buffer over the ranks (op: QC_RED_SUM or QC_RED_MAX),
   * in place, queued on the backend's stream. The communicator is freed when the backend is closed. */
  int (*coll_id)(const struct qc_backend *be, void *id, size_t n);
  int (*coll_init)(const struct qc_backend *be, const void *id, int nranks, int rank);
  int (*coll_ready)(const struct qc_backend *be);   /* 1 once coll_init succeeded */
  int (*allreduce)(const struct qc_backend *be, void *buf, int64_t n, qc_dtype dt, qc_redop op); /* float64, float32, bfloat16 */
  /* Free device memory now (bytes), for deciding whether a unit fits; NULL: unknown. */
  int (*mem_free)(const struct qc_backend *be, size_t *bytes);
  /* The attention reference's row passes on buffers (qc_att_rows below),
   * queued on the stream; NULL, or not QC_OK for op QC_ATT_PROBE (switched
   * off; no error set), where the reference runs them on the host. */
  int (*att_rows)(const struct qc_backend *be, const struct qc_att_rows *j);
  /* The RMSNorm / LayerNorm reference's two passes on buffers (qc_norm_rows
   * below), queued on the stream; NULL, or not QC_OK for op QC_NORM_PROBE
   * (switched off; no error set), where the reference runs them on the host. */
  int (*norm_rows)(const struct qc_backend *be, const struct qc_norm_rows *j);
  /* The elementwise classes' references on buffers (qc_pw below), queued
   * on the stream; NULL, or not QC_OK for op QC_PW_PROBE, as norm_rows. */
  int (*pointwise)(const struct qc_backend *be, const struct qc_pw *j);
  /* The logprob reference's rows on buffers (qc_lp_rows below), queued on
   * the stream; NULL, or not QC_OK for op QC_LP_PROBE, as norm_rows. */
  int (*lp_rows)(const struct qc_backend *be, const struct qc_lp_rows *j);
  /* The RoPE reference's rotation on buffers (qc_rope_rows below), queued
   * on the stream; NULL, or not QC_OK for op QC_ROPE_PROBE, as norm_rows. */
  int (*rope_rows)(const struct qc_backend *be, const struct qc_rope_rows *j);
  /* The conv1d reference's sums on buffers (qc_conv_rows below), queued on
   * the stream; NULL, or not QC_OK for op QC_CONV_PROBE, as norm_rows. */
  int (*conv_rows)(const struct qc_backend *be, const struct qc_conv_rows *j);
  /* gemm_f64 on operands as they are stored (qc_gemm_x): C[m,n] = op(A')
   * op(B') in float64, A' and B' the operands' values read as above; every
   * backend has it. A device backend uploads an operand in its own dtype
   * (half the bytes of float64 or less), widens it there, and keeps its copy
   * of one the audit's memo holds (qc_memo_holds, core/memo.h) until the
   * memo's scope changes: a module's weight goes up once for its forward
   * check, its reference and every variant. */
  int (*gemm_f64_x)(const struct qc_backend *be, qc_op ta, qc_op tb, int64_t m, int64_t n, int64_t k, const qc_gemm_x *A,
                    const qc_gemm_x *B, double *C, int64_t ldc);
} qc_backend;

/* Operand o's [rows, cols] values as gemm_f64_x reads them, on the host:
 * *vals points at them (leading dimension o->ld; o->p itself for float64
 * without flags), *owned at what the caller frees (NULL: nothing). QC_OK,
 * QC_ESYS, or QC_EINPUT for a dtype gemm_f64_x does not take. */
int qc_gemm_x_widen(const qc_gemm_x *o, int64_t rows, int64_t cols, const double **vals, double **owned);
/* The first n elements from o->p as gemm_f64_x reads them, into out[n]
 * (the caller's; out may be o->p itself for float64, rounded in place):
 * QC_OK, or QC_EINPUT for a dtype it does not take. */
int qc_gemm_x_widen_into(const qc_gemm_x *o, int64_t n, double *out);
/* 1 when gemm_f64_x takes operands of dt. */
int qc_gemm_x_dtype(qc_dtype dt);

/* One row pass of the attention reference (reference/attention_gemm.c, whose
 * host loops are the definition) over a block of `rows` query rows [i0, i0 +
 * rows) of one head and its keys [jlo, jlo + nk): the matrices M1 .. M5 are
 * [rows, nk] buffers, pd, pda, z [rows]. Query i sees the keys j < S with
 * j <= i + off when causal and i - j < W when W > 0.
 *   QC_ATT_VJP1      the softmax: M1 R -> ds/dr, M3 P, pd = sum P dP (M2 dP);
 *                    ab: M4 |Q||K|^T -> w, pda = sum P M5
 *   QC_ATT_VJP2      M1 = c dL/dr (ab: c T(dL/ds), M4 = P w) from pd
 *   QC_ATT_FWD       M1 R -> exp(s - max), z; lse: out[i0 + r] = the LSE,
 *                    t[i0 + r] its terms from M2 |Q||K|^T
 *   QC_ATT_FWD_NORM  out [rows, Dv] (the block's O rows) /= z
 *   QC_ATT_ADD       dst[0, n) += src[0, n) */
enum { QC_ATT_PROBE, QC_ATT_VJP1, QC_ATT_VJP2, QC_ATT_FWD, QC_ATT_FWD_NORM, QC_ATT_ADD };
typedef struct qc_att_rows {
  int op;
  int64_t rows, i0, jlo, nk, S, W, off, Dv;
  int causal, ab, lse;
  double sc, cap;
  double *M1, *M2, *M3, *M4, *M5, *pd, *pda, *z;
  double *out, *t;
  double *dst;
  const double *src;
  int64_t n;
} qc_att_rows;

/* One pass of the norm reference (reference/rmsnorm.c, whose host loops are
 * the definition) over X, G [rows, n] and W [n] (the scale the forward
 * applies), float64 buffers; c = x - mu (mu the row's mean when centered,
 * else 0), s = sqrt(mean c^2 + eps):
 *   QC_NORM_ROWS  each row's mu[r], s[r] and its d_x row into dx [rows, n]
 *   QC_NORM_COLS  dw[i] = sum_r G c / s and, when db is not NULL, db[i] =
 *                 sum_r G, each summed over the rows in row order */
enum { QC_NORM_PROBE, QC_NORM_ROWS, QC_NORM_COLS };
typedef struct qc_norm_rows {
  int op;
  int64_t rows, n;
  int centered;
  double eps;
  const double *X, *G, *W;
  double *mu, *s, *dx, *dw, *db;
} qc_norm_rows;

/* One elementwise reference over n elements of float64 buffers (the host
 * functions of reference/gelu.c and swiglu.c are the definition);
 * mode 0: the float64 VJP, 1: the terms' scale, 2 and 3: the class's bf16
 * rounding variants:
 *   QC_PW_GELU    dx = dy gelu'(x), form 1 tanh, 0 erf; mode 2 the derivative
 *                 in bf16 arithmetic (gelu_tanh_bf16 / gelu_erf_bf16), dx =
 *                 b(dy d)
 *   QC_PW_SWIGLU  dx (d_gate), du (d_up) from x (gate), u (up), dy; the
 *                 clamp at limit (0: none; pass: at_limit pass); modes 2
 *                 and 3 round_ops 1 and 2 */
enum { QC_PW_PROBE, QC_PW_GELU, QC_PW_SWIGLU };
typedef struct qc_pw {
  int op, mode, form, pass;
  int64_t n;
  double limit;
  const double *x, *u, *dy;
  double *dx, *du;
} qc_pw;

/* The logprob reference's rows (reference/logprob.c's lp_row_piece is the
 * definition) over Z [rows, V] float64 logits, gw [rows] each row's loss
 * weight times dY: a row with id[r] < 0 (not counted) stays 0; else its
 * log-sum-exp of Z / T folded over K equal vocab shards, each shard's
 * (max, sum) first, and dl[r, v] = gw (1[v = id] - exp(z_v / T - lse)) /
 * T, or with ab the terms' scale |gw| (1[v = id] + p_v (1 + |z_v / T| +
 * |lse|)) / T. */
enum { QC_LP_PROBE, QC_LP_ROWS };
typedef struct qc_lp_rows {
  int op, ab;
  int64_t rows, V, K;
  double T;
  const double *Z, *gw;
  const int64_t *id;
  double *dl;
} qc_lp_rows;

/* The RoPE reference's rotation (reference/rope.c's rope_rows is the
 * definition) of v [T, H, D] float64 into out [T, H, D]: per token t and
 * pair j < R/2 (half layout (j, j + R/2), interleaved (2j, 2j+1)) the
 * angle phi = s (p[t] + off) f_j, f_j = f[j] or theta^(-2j/R) when f is
 * NULL (the device's exp and log: pass the host's table for its angles); co = k cos(phi), si = k sin(phi), each rounded to bf16 when rnd;
 * fwd: Q(phi) [a, b], else Q(-phi) [a, b] (the VJP); rnd 2 rounds each
 * product and the pair's sum to bf16; ab: the terms' scale instead;
 * features from R on pass through (|v| under ab). */
enum { QC_ROPE_PROBE, QC_ROPE_ROWS };
typedef struct qc_rope_rows {
  int op, inter, fwd, ab, rnd;
  int64_t T, H, D, R;
  double s, off, k, theta;
  const double *v, *f;
  const int64_t *p;
  double *out;
} qc_rope_rows;

/* The conv1d reference's sums (reference/conv1d.c's conv_channels is the
 * definition) over X, G [B, L, C] and W [C, K] float64 buffers, the causal
 * depthwise convolution's VJP: dx [B, L, C], dw [C, K] and, when db is not
 * NULL, db [C], each sum over b, t (and k) in the host loop's order, so the
 * values are the host's to the bit; ab: every operand in magnitude (the
 * terms' scale). */
enum { QC_CONV_PROBE, QC_CONV_VJP };
typedef struct qc_conv_rows {
  int op, ab;
  int64_t B, L, C, K;
  const double *X, *W, *G;
  double *dx, *dw, *db;
} qc_conv_rows;

/* Bytes of a collectives id (NCCL_UNIQUE_ID_BYTES). */
#define QC_COLL_ID_BYTES 128

#define QC_FENCES 2

/* The in-memory audit of a linear layer's d_x and d_weight on one backend:
 *   W_ref = dequant(quant(W)) under weight_format (W itself for "none")
 *   reference  d_x = dY W_ref, d_weight = dY^T X           float64 GEMMs
 *   candidate  the same products with bf16 operands, fp32 accumulation and
 *              bf16 output (builtin), or the given candidate tensors
 *   metrics    one fused pass per gradient (qc_metrics, noise floor too)
 * Pointers are the backend's buffers (buf_alloc; host memory on the CPU). */
typedef struct qc_linear_audit {
  int64_t M, K, N;
  const uint16_t *x;        /* [M, K] bf16 */
  const uint16_t *w;        /* [N, K] bf16, the master weight */
  const uint16_t *dy;       /* [M, N] bf16 */
  const uint16_t *dx_cand;  /* [M, K] bf16 candidate d_x, or NULL: builtin candidate */
  const uint16_t *dw_cand;  /* [N, K] bf16 candidate d_weight, or NULL: builtin candidate */
  const char *weight_format; /* "none", "fp8_block128", ... */
  const char *profile;      /* NULL = "vllm" */
  /* The reference's GEMMs: 0 = float64 (cuBLAS DGEMM); 2 .. QC_REF_SLICES_MAX = the
   * fast reference, the Ozaki scheme with that many int8 slices on tensor
   * cores, kept for a gradient only when its self-check's measured error is
   * below 1e-3 of the noise floor, else recomputed in float64 (docs/gpu.md);
   * QC_REF_AUTO = per GEMM, the fast reference with QC_REF_FAST_SLICES
   * where the cost model (backend/refcost.h) on this device's measured
   * rates predicts it at least 10% faster than DGEMM, else DGEMM. */
  int ref_slices;
} qc_linear_audit;

typedef struct qc_linear_audit_out {
  qc_metrics dx, dw;        /* metrics of the candidate against the reference */
  double *dx_ref, *dw_ref;  /* optional host [M, K] / [N, K]: the float64 references are copied here */
  uint16_t *dx_out, *dw_out; /* optional host bf16: the builtin candidate's gradients */
  /* device time of each stage (0 on the CPU; the CUDA audit runs two
   * streams, so they overlap): quant = widen dY and make W_ref; ref = the
   * reference d_x; cand = the d_weight pair (X widened, candidate and
   * reference) beside those two; metrics = from the reference d_x to the
   * end (candidate d_x, both metrics passes) */
  double ms_quant, ms_cand, ms_ref, ms_metrics;
  size_t device_bytes;      /* device memory the audit held at its peak */
  /* the fast reference's self-check, [0] d_x, [1] d_weight (zeros where DGEMM ran from the start) */
  int ref_ran[2];           /* the slices the fast reference ran with (0: it did not run: DGEMM, or
                               float64 summed inside the quantizer at decode shapes) */
  int ref_fast[2];          /* 1: the fast reference was kept; 0: float64 (asked for, or the fallback) */
  double ref_err[2];        /* its sample's max |fast - exact| / sum |a||b| */
  double ref_err_norm[2];   /* its sample's ||fast - exact|| / ||exact|| */
  double ref_gate[2];       /* the bound both had to stay below: 1e-3 x the sample's noise floor */
  int ref_pairs[2];         /* the int8 slice products the plan ran (backend/ozplan.h); 0: none ran */
} qc_linear_audit_out;

/* --reference fast: the Ozaki reference's default number of slices, and the range taken;
 * --reference auto (the default of vjp): QC_REF_AUTO in ref_slices. */
#define QC_REF_AUTO (-1)
#define QC_REF_FAST_SLICES 4
#define QC_REF_SLICES_MIN 2
#define QC_REF_SLICES_MAX 5

/* Device memory the fused linear audit needs for M, K, N (bytes). */
size_t qc_linear_audit_bytes(int64_t M, int64_t K, int64_t N);

/* The CUDA backend is a shared object (libqatcheck_cuda.so) that open.c
 * loads with dlopen; it and qatcheck each compile in the headers they share
 * (this one, the numerics and core headers it and the .so include, cuda.h),
 * so a .so from another build could load and then read or write the wrong
 * fields or call a function of another meaning. It therefore exports
 * qc_backend_cuda_stamp (QC_BACKEND_STAMP_SYM), which open.c reads before it
 * calls anything in the .so, and refuses the .so (exit 2, one line naming
 * both stamps) unless its hash and size equal qatcheck's own.
 * The hash: QC_ABI_HASH, the sha256 (16 hex digits) of every header that
 * crosses the boundary, the set found from the .so's includes by
 * scripts/abi-headers.sh; the Makefile computes it at build time and passes
 * it to the two objects that stamp it (open.c, cuda/stamp.cu). Nothing is
 * bumped by hand: any change to one of those headers changes the stamp. */
#define QC_BACKEND_STAMP_SYM "qc_backend_cuda_stamp"
/* The stamp's format: 3, the hash follows the build; 1 and 2 were ABI
 * numbers bumped by hand, in stamps that end after build. */
#define QC_BACKEND_STAMP_FORMAT 3

/* The stamp itself. Fields are only appended, after a new format number: it
 * is how a mismatch is seen. */
typedef struct qc_backend_stamp {
  uint32_t format;  /* QC_BACKEND_STAMP_FORMAT (the ABI number in formats 1 and 2) */
  uint32_t size;    /* sizeof(qc_backend) in the build */
  char build[56];   /* "<version>-<commit>" of the build (QC_BUILD_ID), NUL-terminated */
  char hash[32];    /* QC_ABI_HASH of the build, NUL-terminated (format 3 on) */
} qc_backend_stamp;

/* The build's commit (git describe --always --dirty), passed by the
 * Makefile to the objects that stamp it (open.c, cuda/stamp.cu). */
#ifndef QC_BUILD_COMMIT
#define QC_BUILD_COMMIT "unknown"
#endif
#define QC_BUILD_ID QC_VERSION "-" QC_BUILD_COMMIT /* QC_VERSION: core/qc.h */
/* This build's stamp, for the objects that define it; QC_ABI_HASH has no
 * default, so an object built without the Makefile's hash does not compile. */
#define QC_BACKEND_STAMP_INIT {QC_BACKEND_STAMP_FORMAT, (uint32_t)sizeof(qc_backend), QC_BUILD_ID, QC_ABI_HASH}

/* The CPU backend (always there). */
const qc_backend *qc_backend_cpu(void);
/* Open a backend from "--device" ("cpu", "cuda", "cuda:N"). QC_EINPUT with a
 * message when the device is absent or out of range; never falls back. */
int qc_backend_open(const char *device, const qc_backend **out);
/* A symbol of the loaded CUDA backend (its hooks in backend/cuda/cuda.h, for
 * the GPU tests), or NULL when none is loaded. */
void *qc_backend_cuda_sym(const char *name);
void qc_backend_close(const qc_backend *be);

#endif
