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

/* "NVIDIA H200 (sm_90, 132 SMs, 139.8 GiB)". */
const char *qc_cuda_device_name(const qc_backend *be, char *buf, size_t n);

#endif
