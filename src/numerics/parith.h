/* parith.h: the float32 operations a producer's execution engine really
 * performs (docs/numerics.md, "Producer arithmetic"), written once for the
 * CPU quantizers and the CUDA kernels (kernels/quant.cu includes this file):
 *
 *   qa_mul, qa_div, qa_rcp   IEEE float32, round to nearest even (device:
 *                            the _rn intrinsics, so nvcc neither contracts
 *                            nor approximates them)
 *   qa_rcpa                  the GPU's approximate reciprocal rcp.approx.f32:
 *                            on the device the instruction itself, on the
 *                            host its measured table (parith.c)
 *   qa_ceil2                 power-of-two ceiling by the exponent bit rule
 *   qa_ceil_log2             ceil(log2(v)) as CUDA's log2f computes it (it
 *                            rounds 2^k + a few ulp down to k on a measured
 *                            set of inputs): device log2f, host table
 *
 * Plain C11 and C++ (nvcc) alike; every function is inline. */
#ifndef QC_PARITH_H
#define QC_PARITH_H

#include <math.h>
#include <stdint.h>
#include <string.h>

#if defined(__CUDACC__)
#define QC_HD static inline __host__ __device__
#else
#define QC_HD static inline
#endif

#ifdef __cplusplus
extern "C" {
#endif
/* Host emulations (parith.c), from the tables measured on an H200
 * (numerics/ptables.h), through qa_rcpa_emul and qa_ceil_log2_emul below. */
float qc_rcpa(float x);
/* ceil(log2(v)) for a finite v >= 0 as the GPU's log2f gives it; v == 0 gives
 * -1000 (log2(0) = -inf). Below 2^-127 only the clamped use is exact (an
 * e8m0 byte of 0; a scale under a floor). */
int qc_ceil_log2_gpu(float v);
/* The decoded tables, for uploading to a device: 2 bits per mantissa
 * (2^21 bytes, see qa_rcpa_emul) and the sorted exception list. */
const uint8_t *qc_rcpa_table2(void);
const uint32_t *qc_ceil2log_list(uint32_t *n);
#ifdef __cplusplus
}
#endif

/* Constants as float32 bits: RN(1/448), RN(1/6), RN(1/2688), RN(1/229376). */
#define QA_R448_BITS 0x3b124925u
#define QA_R6_BITS 0x3e2aaaabu
#define QA_R2688_BITS 0x39c30c31u
#define QA_R229376_BITS 0x36924925u
/* exp2f(-127) as the GPU computes it (CUDA C++ and torch.exp2): one
 * subnormal ulp below 2^-127 (the mx producers divide by it in a block
 * whose e8m0 byte is 0; measured on the H200). */
#define QA_EXP2F_M127_BITS 0x003fffffu

QC_HD uint32_t qa_bits(float x) { uint32_t u; memcpy(&u, &x, 4); return u; }
QC_HD float qa_float(uint32_t u) { float x; memcpy(&x, &u, 4); return x; }

QC_HD float qa_mul(float a, float b) {
#ifdef __CUDA_ARCH__
  return __fmul_rn(a, b);
#else
  return a * b;
#endif
}

QC_HD float qa_div(float a, float b) {
#ifdef __CUDA_ARCH__
  return __fdiv_rn(a, b);
#else
  return a / b;
#endif
}

QC_HD float qa_rcp(float a) {
#ifdef __CUDA_ARCH__
  return __frcp_rn(a);
#else
  return 1.0f / a;
#endif
}

QC_HD float qa_rcpa(float a) {
#ifdef __CUDA_ARCH__
  float r;
  asm("rcp.approx.f32 %0, %1;" : "=f"(r) : "f"(a));
  return r;
#else
  return qc_rcpa(a);
#endif
}

/* rcp.approx.ftz.f32, vLLM's reciprocal_approximate_ftz (csrc/quantization/fp4/
 * nvfp4_utils.cuh @2c9ff65): a subnormal input is flushed to a signed zero
 * (result +-Inf) and a result below the normal range to a signed zero; in
 * between it is rcp.approx.f32 (the hardware's MUFU.RCP, which both
 * variants run for normal operands and results). */
QC_HD float qa_rcpa_ftz(float a) {
#ifdef __CUDA_ARCH__
  float r;
  asm("rcp.approx.ftz.f32 %0, %1;" : "=f"(r) : "f"(a));
  return r;
#else
  uint32_t u = qa_bits(a);
  if ((u & 0x7f800000u) == 0) return qa_float((u & 0x80000000u) | 0x7f800000u);
  float r = qc_rcpa(a);
  uint32_t v = qa_bits(r);
  return (v & 0x7f800000u) == 0 ? qa_float(v & 0x80000000u) : r;
#endif
}

/* max for non-NaN operands (amax and scales are never NaN here). */
QC_HD float qa_max(float a, float b) { return a > b ? a : b; }
QC_HD float qa_min(float a, float b) { return a < b ? a : b; }

/* rcp.approx.f32 emulated from the 2-bit table tab2 (bit 0 of entry m: the
 * mantissa's approximate reciprocal differs from RN(1/1.m); bit 1: it is one
 * ulp larger, else smaller): RN(1/1.m) adjusted, then the exponent exactly;
 * a subnormal input is normalized first and a result below the normal range
 * rounds to nearest (both measured over all 2^32 inputs on the H200). */
QC_HD float qa_rcpa_emul(const uint8_t *tab2, float x) {
  uint32_t u = qa_bits(x), sign = u & 0x80000000u, a = u & 0x7fffffffu;
  if (a > 0x7f800000u) return qa_float(0x7fffffffu);
  if (a == 0x7f800000u) return qa_float(sign);
  if (a == 0) return qa_float(sign | 0x7f800000u);
  int e = (int)(a >> 23) - 127; /* x = 1.m * 2^e */
  uint32_t m = a & 0x7fffffu;
  if (!(a >> 23)) { /* subnormal: normalize */
    e = -126;
    while (!(m & 0x800000u)) { m <<= 1; e--; }
    m &= 0x7fffffu;
  }
  float r = qa_rcp(qa_float(0x3f800000u | m)); /* RN(1/1.m), in (0.5, 1] */
  uint32_t t = (tab2[m >> 2] >> ((m & 3u) * 2)) & 3u;
  if (t & 1u) r = qa_float(qa_bits(r) + ((t & 2u) ? 1u : 0xffffffffu));
  int k = -e; /* the result is r 2^k */
  if (k > 128) return qa_float(sign | 0x7f800000u);
  float out;
  if (k == 128) out = qa_mul(qa_mul(r, 2.0f), qa_float(0x7f000000u)); /* (2r) 2^127: Inf only for r = 1 */
  else if (k >= -126) out = qa_mul(r, qa_float((uint32_t)(k + 127) << 23));
  else out = qa_mul(qa_mul(r, qa_float((uint32_t)(k + 126 + 127) << 23)), qa_float(1u << 23)); /* then 2^-126: one rounding */
  return qa_float(qa_bits(out) | sign);
}

/* ceil(log2(v)) of a finite v >= 0 as the GPU computes it: the exact
 * ceiling, one less where v is in the sorted list exc[0..n) (v = 2^k(1 + a
 * few ulp), whose log2 rounds to k); -1000 for v == 0. */
QC_HD int qa_ceil_log2_emul(const uint32_t *exc, uint32_t n, float v) {
  uint32_t u = qa_bits(v) & 0x7fffffffu;
  if (u == 0) return -1000;
  int c;
  if (u >> 23) c = (int)(u >> 23) - 127 + ((u & 0x7fffffu) != 0);
  else { /* subnormal: v = u 2^-149 */
    int p = 0;
    while ((1u << p) < u) p++;
    c = p - 149;
  }
  uint32_t lo = 0, hi = n;
  while (lo < hi) {
    uint32_t mid = (lo + hi) / 2;
    if (exc[mid] < u) lo = mid + 1;
    else hi = mid;
  }
  return lo < n && exc[lo] == u ? c - 1 : c;
}

/* Exponent bit rule: exponent field + 1 when the mantissa is non-zero,
 * mantissa cleared; 0 -> 0, a subnormal -> 2^-126. */
QC_HD float qa_ceil2(float s) {
  uint32_t u = qa_bits(s), e = (u >> 23) & 0xffu;
  if (u & 0x7fffffu) e++;
  return qa_float((u & 0x80000000u) | (e << 23));
}

/* ceil(log2(v)) as the GPU computes it; -1000 for v == 0. */
QC_HD int qa_ceil_log2(float v) {
#ifdef __CUDA_ARCH__
  if (v == 0.0f) return -1000;
  return (int)ceilf(log2f(v));
#else
  return qc_ceil_log2_gpu(v);
#endif
}

/* 2^k as float32 (k >= 128: +Inf; k < -149: 0). */
QC_HD float qa_exp2i(int k) {
  if (k >= 128) return qa_float(0x7f800000u);
  if (k >= -126) return qa_float((uint32_t)(k + 127) << 23);
  if (k >= -149) return qa_float(1u << (k + 149));
  return 0.0f;
}

/* exp2(ceil(log2(v))) as torch, Inductor, Triton and CUDA C++ compute it. */
QC_HD float qa_ceil2_log(float v) { return qa_exp2i(qa_ceil_log2(v)); }

#endif
