/* kernels.h: the CUDA kernels' host launchers (the .cu files in kernels/), called by the
 * CUDA backend (src/backend/cuda/) and nothing else. Pointers are device
 * pointers; every launcher enqueues on `stream` (a cudaStream_t) and returns
 * a cudaError_t as int (0 = success), from the launch itself. */
#ifndef QC_KERNELS_H
#define QC_KERNELS_H

#include <stddef.h>
#include <stdint.h>

#ifdef __CUDACC__
#include <cuda_fp8.h> /* before numerics/recipe.h: its device e4m3 */
#endif
#include "numerics/recipe.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Quantizer formats of docs/numerics.md (the geometry: which elements share
 * a scale); the arithmetic is the recipe of the producer path. */
typedef enum {
  QK_NONE = 0,
  QK_FP8_TENSOR,
  QK_FP8_ROW,            /* fp8_token / fp8_channel: one scale per row */
  QK_FP8_GROUP128,
  QK_FP8_GROUP128_UE8M0,
  QK_FP8_BLOCK128,
  QK_FP8_BLOCK128_UE8M0,
  QK_NVFP4,
  QK_MXFP8,
  QK_MXFP4
} qk_fmt;

/* One quantization: in [rows, cols] (float32, or bf16 when in_bf16) to any
 * of the outputs that are non-NULL (layouts as qc_qout in backend.h), by
 * the producer path's recipes (numerics/recipe.h: rc, and rc2 for the
 * second stage of fp8_block128_ue8m0 when two_stage). */
typedef struct qk_qargs {
  qk_fmt fmt;
  qc_recipe rc, rc2;
  int two_stage;
  int64_t rows, cols;
  int in_bf16;
  const void *in;
  float *deq;            /* [rows, cols] dequantized, float32 */
  uint16_t *deq_bf16;    /* [rows, cols] dequantized, rounded to bf16 */
  double *deq_f64;       /* [rows, cols] dequantized, widened to float64 (exact) */
  uint8_t *q;            /* payload bytes */
  float *scale;          /* [srows, scols] dequant multiplier */
  uint8_t *scale_b;      /* [srows, scols] scale bytes */
  /* scratch, 4 words, zeroed by the launcher: [0] amax bits, [1] non-finite
   * count, [2] global scale g (nvfp4) bits */
  uint32_t *scratch;
  /* fp8_block128 only (0 elsewhere): with fuse_m in 1..QK_FUSE_M, the
   * tiles' shares of d_x = dY W_ref (dY: bf16 [fuse_m, rows]) into
   * fuse_part ([tile rows][fuse_m][cols] float64; qk_fuse_dx_final) */
  int fuse_m;
  const uint16_t *fuse_dy;
  double *fuse_part;
  /* fp8_block128: 1 takes the element-wise kernel even where the vectorized
   * one applies (QC_CUDA_QK_SCALAR, the benchmark's side by side) */
  int scalar;
} qk_qargs;

#define QK_FUSE_M 16 /* the most rows of dY the block128 quantizer sums d_x for */
int qk_quantize(const qk_qargs *a, void *stream);
/* dx [mrows, cols] = the sum over `tiles` tile rows, in order, of the fused
 * quantizer's partials part[tile][mrows][cols]. */
int qk_fuse_dx_final(const double *part, int tiles, int mrows, int64_t cols, double *dx, void *stream);

/* Element conversions, n elements. */
int qk_bf16_to_f64(const uint16_t *in, double *out, int64_t n, void *stream);
int qk_bf16_to_f32(const uint16_t *in, float *out, int64_t n, void *stream);
int qk_f32_to_bf16(const float *in, uint16_t *out, int64_t n, void *stream);
int qk_f64_to_bf16(const double *in, uint16_t *out, int64_t n, void *stream);
/* Any float element type to float64 (exact) or float32 (RNE from float64;
 * kind QK_T_F32 is not accepted by qk_to_f32: use the input as it is). */
enum { QK_T_F64 = 0, QK_T_F32 = 1, QK_T_F16 = 2, QK_T_BF16 = 3 };
int qk_to_f64(int kind, const void *in, double *out, int64_t n, void *stream);
int qk_to_f32(int kind, const void *in, float *out, int64_t n, void *stream);
/* qk_to_f64, then each value rounded to bf16 where flags has QK_X_BF16 (to
 * float32 RN, then bf16 RNE: numerics/formats.h's qc_round_bf16 of
 * (float)v, bit for bit for every non-NaN; a NaN stays a NaN, its sign and
 * payload as the device's conversion leaves them), then |v| where
 * QK_X_ABS; in and out may be the same float64 buffer. */
enum { QK_X_BF16 = 1, QK_X_ABS = 2 };
int qk_to_f64_x(int kind, const void *in, double *out, int64_t n, unsigned flags, void *stream);

/* The fused metrics pass: float64 sums of g^2, r^2, (g-r)^2, g r and
 * (bf16(r) - r)^2 over finite g, max |g - r| with its lowest index, count
 * of non-finite g. Deterministic: a fixed grid from n alone, a fixed tree
 * in each block and a fixed tree over the blocks, so two runs are
 * bit-identical. g is float64 (g_kind 0), bf16 (1) or float32 (2). */
typedef struct qk_msum {
  double sg, sr, sd, dt, snf, mx;
  int64_t idx, bad;
} qk_msum;
/* Device scratch the metrics pass needs (partials + the result). */
size_t qk_metrics_scratch_bytes(void);
/* Writes the result to res (device) after `scratch`. */
int qk_metrics(const void *g, int g_kind, const double *r, int64_t n, void *scratch, qk_msum *res, void *stream);

/* The fused audit pass of a bf16 candidate g against r ([rows, cols] device
 * buffers): one read of both for the metrics (into res, as qk_metrics) and
 * the bias test's combined sums (into bias_out[QK_BIAS_NSUM]: 0 sum x r,
 * 1 sum r^2, 2 sum x^2, 3 sum x^2 r^2, 4 sum x r^3, 5 sum r^4, 6 sum
 * (bf16(r) - r)^2, over finite pairs, x = g - bf16(r); 7..9 the sums over
 * the rows of t^2, t c, c^2 with (t, c) a row's (sum x r, sum r^2); 10..12
 * the same over the columns, zero unless use_cols). Blocks of one strip of
 * 32 x QK_SUM_COLS columns by QK_SUM_ROWS rows, QK_SUM_THREADS threads; every
 * partial in its own slot of scratch (qk_audit_sums_doubles(rows, cols)
 * doubles), then fixed-order reductions (QK_SUM_FB blocks, then one): the
 * grid is the shape's alone, so the sums are deterministic. The fused linear
 * audit's metrics stage. */
#define QK_BIAS_NSUM 13
#define QK_SUM_THREADS 256
#define QK_SUM_COLS 8
#define QK_SUM_ROWS 64
#define QK_SUM_FB 64
size_t qk_audit_sums_doubles(int64_t rows, int64_t cols);
int qk_audit_sums(const void *g, const double *r, int64_t rows, int64_t cols, int use_cols, double *scratch,
                  qk_msum *res, double *bias_out, void *stream);

/* The Ozaki-scheme reference GEMM (kernels/ozaki.cu; the GEMMs themselves
 * are cuBLASLt's int8 ones, src/backend/cuda/ozaki.cu). A panel is an
 * operand seen along its contraction: R rows of k elements, element (r, l)
 * at base[r * sr + l * sl], sr or sl equal to 1.
 * qk_oz_split: exps[r] (Rp ints) = 1 + the smallest e with max_l |P(r, l)|
 * < 2^e (QK_OZ_EZERO for a row of zeros); out = S int8 slices of Rp x kp,
 * slice s (0-based; S - 1 - s when rev) at out + s sstride, row r's k digits
 * contiguous at r * rstride (rstride >= kp), zeros in the padding
 * (rows R..Rp-1, digits k..kp-1): the digits d_s = the residual times 2^(7 s) rounded to
 * nearest, in [-64, 64]; flag[0] |= 1 when an element is not finite.
 * qk_oz_combine: C [m, n] (ldc) = (acc: C +) 2^(ea_i + eb_j - 7 (S + 1))
 * sum_{L=2}^{S+1} T_L 2^(7 (S + 1 - L)), T_L the int32 [m, np] product of
 * level L at T + (L - 2) tstride, combined exactly in int64.
 * qk_oz_check: the self-check on ns sampled elements of C = op(A) op(B)
 * (op(A)[i, l] = A[i sar + l sal], op(B)[l, j] = B[l sbl + j sbc]; every
 * element when m n <= ns, else a fixed pseudo-random set): res[0] = max
 * |C - exact| / sum_l |a| |b|, res[1] = sum (C - exact)^2, res[2] = sum
 * exact^2, res[3] = sum (bf16(exact) - exact)^2, exact a compensated
 * float64 dot product; scratch: 4 ns doubles. Deterministic. */
#define QK_OZ_EZERO ((int)0x80808080) /* the exponent of a row of zeros (a memset of 0x80 bytes) */
#define QK_OZ_SMAX 5
int qk_oz_split(const double *base, int64_t R, int64_t k, int64_t sr, int64_t sl, int S, int *exps, unsigned *flag,
                int8_t *out, int64_t Rp, int64_t kp, int64_t rstride, int64_t sstride, int rev, void *stream);
int qk_oz_combine(const int32_t *T, int64_t tstride, int S, int64_t m, int64_t n, int64_t np, const int *ea,
                  const int *eb, double *C, int64_t ldc, int acc, void *stream);
int qk_oz_check(const double *A, int64_t sar, int64_t sal, const double *B, int64_t sbl, int64_t sbc, const double *C,
                int64_t ldc, int64_t m, int64_t n, int64_t k, int ns, double *scratch, double *res, void *stream);
/* qk_oz_plan: the evidence of the fast reference's pair plan
 * (src/backend/ozplan.h) on the self-check's sample: per sampled element,
 * QK_OZ_PLAN_W doubles into out (every pair's exact int8 slice product
 * from as / bs, slices of op(A) and op(B) as qk_oz_split wrote them: row
 * i's slice t (0-based) at as + i arow + t astride, column j's slice u at bs
 * + j brow + u bstride (a stride may be negative), the exact value from A / B as qk_oz_check
 * takes it, sum |a||b|, e_i + f_j, bf16's rounding error squared). */
#define QK_OZ_PLAN_W (QK_OZ_SMAX * QK_OZ_SMAX + 5)
/* qk_oz_check_ev: qk_oz_check's res for C from qk_oz_plan's evidence ev of
 * the same product (the same sample; its exact values reused, not
 * recomputed). */
int qk_oz_check_ev(const double *ev, const double *C, int64_t ldc, int64_t m, int64_t n, int ns, double *scratch, double *res,
                   void *stream);
int qk_oz_plan(const int8_t *as, int64_t arow, int64_t astride, const int8_t *bs, int64_t brow, int64_t bstride, int S, const int *ea,
               const int *eb, const double *A, int64_t sar, int64_t sal, const double *B, int64_t sbl, int64_t sbc, int64_t m,
               int64_t n, int64_t k, int ns, double *out, void *stream);

/* Conformance: for 2^32 float32 bit patterns from `start` (count of them),
 * out[i] = __nv_cvt_float_to_fp8(bits(start + i), __NV_SATFINITE, kind)
 * (kind 0 = E4M3, 1 = E5M2), and mism[0] += how many differ from the same
 * rule written in plain integer arithmetic from docs/numerics.md. out may
 * be NULL. */
int qk_fp8_conform(uint64_t start, uint64_t count, int kind, uint8_t *out, unsigned long long *mism, void *stream);

/* Conformance of the GPU's approximate arithmetic against the host
 * emulation (numerics/parith.h) over float32 bit patterns [start, start +
 * count): mism[0] += inputs where rcp.approx.f32 differs from qa_rcpa_emul
 * with the 2-bit table tab2 (device copy); mism[1] += positive finite
 * inputs of at least 2^-126 where exp2f(ceilf(log2f(v))) differs from
 * 2^qa_ceil_log2_emul(exc, n, v) (exc: device copy of the sorted list);
 * first[0..1]: the smallest mismatching input of each (0xffffffff: none;
 * initialize them). */
int qk_parith_conform(uint64_t start, uint64_t count, const uint8_t *tab2, const uint32_t *exc, uint32_t nexc,
                      unsigned long long *mism, unsigned *first, void *stream);

#ifdef __cplusplus
}
#endif
#endif
