/* cuda.h: what the CUDA backend offers beyond the seam, for the benchmark
 * and conformance drivers (bench/). Only in builds with CUDA. */
#ifndef QC_BACKEND_CUDA_H
#define QC_BACKEND_CUDA_H

#include <stddef.h>
#include <stdint.h>

#include "backend/backend.h"

/* The build's stamp (backend.h), read by open.c before anything else. */
extern const qc_backend_stamp qc_backend_cuda_stamp;
int qc_backend_cuda_open(int device, const qc_backend **out);
void qc_backend_cuda_close(const qc_backend *be);

/* The parts of one linear audit timed alone (medians of reps, device events). */
typedef struct qc_cuda_bench {
  double ms_dgemm2;     /* the two float64 reference GEMMs */
  double ms_bf16x2;     /* the two bf16 candidate GEMMs */
  double ms_metrics;    /* one metrics pass over the larger gradient (bf16 g, float64 r) */
  double dgemm_tflops, bf16_tflops;
  double copy_gbs;      /* device-to-device copy of 1 GiB, bytes read + written per second / 1e9 */
  double metrics_gbs;   /* metrics pass, bytes read per second / 1e9 */
} qc_cuda_bench;

/* Time the parts of the audit `a` (device buffers) after one audit_linear of
 * the same shape has run on be. */
int qc_cuda_bench_parts(const qc_backend *be, const qc_linear_audit *a, int reps, qc_cuda_bench *r);

/* The fast reference (--reference fast, ozaki.cu) against DGEMM on the
 * audit `a` (device buffers), after one audit_linear of the same shape ran
 * on be with the float64 reference: [0] d_x, [1] d_weight. */
typedef struct qc_cuda_ref_bench {
  double ms_dgemm2;         /* the two DGEMM references (median of reps) */
  double ms_fast2;          /* the two fast references: split, int8 GEMMs, combine (no self-check) */
  double ms_check2;         /* their two self-checks */
  double fast_tops;         /* 2 x 2MNK / ms_fast2: the DGEMM-equivalent rate, TFLOP/s */
  double max_abs[2];        /* max |fast - DGEMM| */
  double rel_l2[2];         /* ||fast - DGEMM|| / ||DGEMM|| */
  double norm_ref[2];       /* ||DGEMM|| */
  double check_err[2];      /* the self-check: max |fast - exact| / sum |a||b| on the sample */
  double check_err_norm[2]; /* ... and normwise on the sample */
  double check_noise_floor[2]; /* the sample's noise floor (the gate is 1e-3 of it) */
  unsigned nonfinite[2];    /* a non-finite operand was seen */
} qc_cuda_ref_bench;
int qc_cuda_bench_ref(const qc_backend *be, const qc_linear_audit *a, int slices, int reps, qc_cuda_ref_bench *r);
/* C[m, n] = op(A) op(B) on device buffers (gemm_f64_buf's convention) by the
 * fast reference with `slices` slices (0: DGEMM), waited for; check: its
 * self-check (max error of sum |a||b|, sum err^2, sum exact^2, sum of the
 * exact values' bf16 rounding errors squared, on the sample), nonfinite:
 * non-zero when an operand was not finite. For the GPU tests. */
int qc_cuda_ref_gemm(const qc_backend *be, int slices, qc_op ta, qc_op tb, int64_t m, int64_t n, int64_t k,
                     const double *A, int64_t lda, const double *B, int64_t ldb, double *C, int64_t ldc, double check[4],
                     unsigned *nonfinite);

/* count float32 bit patterns from start through CUDA's saturating FP8
 * conversion (kind 0 E4M3, 1 E5M2): mismatches against the spec's rule in a
 * kernel; the bytes into host_chunk when not NULL. */
int qc_cuda_fp8_conformance(const qc_backend *be, int kind, uint8_t *host_chunk, uint64_t start, uint64_t count,
                            unsigned long long *mismatches);

/* The GPU's approximate arithmetic re-measured against the host's emulation
 * (numerics/parith.h) over every float32 input: rcp.approx.f32 (mism[0],
 * first mismatching input first[0]) and exp2f(ceilf(log2f(v))) for every
 * positive normal v (mism[1], first[1]); first is 0xffffffff when none. */
int qc_cuda_parith_conformance(const qc_backend *be, unsigned long long mism[2], unsigned first[2]);

/* Set a benchmark side-by-side switch of an open backend (docs/gpu.md),
 * named as the environment variable read when it opened
 * (QC_CUDA_UNFUSED, QC_CUDA_DW_EARLY, QC_CUDA_QK_SCALAR): for bench/ and
 * tests/gpu, which compare both settings on one backend. QC_EINPUT for
 * another name. */
int qc_cuda_switch(const qc_backend *be, const char *name, int on);

/* "NVIDIA H200 (sm_90, 132 SMs, 139.8 GiB)". */
const char *qc_cuda_device_name(const qc_backend *be, char *buf, size_t n);

#endif
