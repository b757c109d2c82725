/* refcost.h: the cost model of --reference auto (docs/gpu.md, "The fast
 * reference"): the predicted time of one reference GEMM C[m, n] = op(A)
 * op(B) (contraction k) by float64 DGEMM and by the Ozaki scheme with S
 * int8 slices, from rates measured on the device (the CUDA backend's probe,
 * src/backend/cuda/refprobe.cu), and the choice between them. Pure C: the
 * unit tests check its decisions on the CPU. */
#ifndef QC_BACKEND_REFCOST_H
#define QC_BACKEND_REFCOST_H

#include <stdint.h>

/* The rates the model predicts from (all > 0 for a usable set). */
typedef struct qc_refcost_rates {
  double dgemm_flops; /* float64 GEMM, compute-bound: flop/s */
  double i8_ops;      /* int8 x int8 -> int32 GEMM (cuBLASLt), compute-bound: op/s */
  double split_bw;    /* the split of a float64 operand into int8 slices: bytes/s (8 read + S written per element) */
  double bw;          /* memory-bound passes (the combine, a thin GEMM's output): bytes/s */
  double call_s;      /* the fixed cost of one GEMM or kernel call: s */
  double check_s;     /* the self-check's exact values: s per sampled element per unit of k (on the fast path the
                         plan's evidence kernel computes them, with every slice pair's product, before the GEMMs) */
} qc_refcost_rates;

/* The fast reference is taken only when predicted at most this fraction of DGEMM's time. */
#define QC_REFCOST_MARGIN 0.9
/* Elements the self-check samples (at most; m n when fewer). */
#define QC_REFCOST_CHECK_NS 2048

/* The largest contraction chunk (a multiple of 16) of the Ozaki scheme whose
 * int32 sums cannot overflow: at most S pairs per level, each |d d'| <= 127^2. */
static inline int64_t qc_refcost_chunk(int S) { return ((int64_t)2147483647 / ((int64_t)S * 127 * 127)) & ~(int64_t)15; }

/* 1 when the int8 GEMM of a level of `most` slice pairs over the padded
 * contraction kp can be one call, its int32 sums unable to overflow (digits
 * at most 64: most kp 64^2 < 2^31); else the Ozaki scheme runs one GEMM a
 * pair and contraction chunk (qc_refcost_chunk), summed into the level with
 * beta 1. The condition of src/backend/cuda/ozaki.cu's oz_products (`whole`). */
static inline int qc_refcost_whole(int most, int64_t kp) { return (int64_t)most * kp * 4096 < ((int64_t)1 << 31); }

/* 1 when every rate of r is positive and finite (the fixed costs >= 0). */
int qc_refcost_ok(const qc_refcost_rates *r);
/* Predicted seconds of DGEMM for C[m, n], contraction k. */
double qc_refcost_dgemm_s(const qc_refcost_rates *r, int64_t m, int64_t n, int64_t k);
/* Predicted seconds of the Ozaki scheme with S slices for the same product,
 * as src/backend/cuda/ozaki.cu's cu_ref_gemm runs it: the two splits, the
 * plan's evidence on the self-check's sample (with the exact values the
 * self-check reuses), the int8 GEMMs of every slice pair t + u <= S + 1
 * (one GEMM a level where qc_refcost_whole(S, k padded), else one a pair
 * and contraction chunk), the combine and the self-check. Every pair is
 * priced: the plan that drops some is chosen from the data, after the
 * pick, and only runs fewer or the same GEMMs, so this is an upper bound. */
double qc_refcost_fast_s(const qc_refcost_rates *r, int64_t m, int64_t n, int64_t k, int S);
/* S when the fast reference is predicted at most QC_REFCOST_MARGIN of
 * DGEMM's time, else 0 (DGEMM); 0 too when a rate is not positive and
 * finite. Both predictions into *t_dgemm, *t_fast (seconds) when not NULL. */
int qc_refcost_pick(const qc_refcost_rates *r, int64_t m, int64_t n, int64_t k, int S, double *t_dgemm, double *t_fast);

#endif
