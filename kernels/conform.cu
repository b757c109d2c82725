/* conform.cu: CUDA's saturating FP8 conversions against the rule of
 * docs/numerics.md written in plain integer arithmetic (kernels.h,
 * qk_fp8_conform), and the GPU's approximate arithmetic (rcp.approx.f32,
 * exp2f(ceilf(log2f(v)))) against the host's table-driven emulation
 * (qk_parith_conform), over any range of the 2^32 float32 bit patterns. */
#include <cuda_runtime.h>
#include <math.h>

#include "kernels.h"
#include "numerics/parith.h"
#include "qk_elem.cuh"

/* The spec's rule: RNE, |x| at or above the largest finite value (or Inf)
 * saturates to it, NaN -> 0x7F, zeros and underflows keep their sign.
 * E4M3: 3 mantissa bits, bias 7, max 448 (0x7E), subnormal step 2^-9.
 * E5M2: 2 mantissa bits, bias 15, max 57344 (0x7B), subnormal step 2^-16. */
__device__ uint8_t rule_fp8(uint32_t u, int kind) {
  const int mb = kind ? 2 : 3, bias = kind ? 15 : 7;
  const uint32_t maxbits = kind ? 0x47600000u : 0x43E00000u; /* 57344, 448 */
  const uint8_t maxcode = kind ? 0x7B : 0x7E;
  const uint8_t sign = (uint8_t)((u >> 24) & 0x80u);
  const uint32_t a = u & 0x7fffffffu;
  if (a > 0x7f800000u) return 0x7F;
  if (a >= maxbits) return sign | maxcode;
  const int e = (int)(a >> 23) - 127;
  if (e < 1 - bias) {
    /* subnormal target: count of steps 2^(1-bias-mb), rounded half to even */
    float steps = __uint_as_float(a) * __uint_as_float((uint32_t)(127 + bias - 1 + mb) << 23);
    return sign | (uint8_t)rintf(steps);
  }
  const int sh = 23 - mb;
  uint32_t r = a + ((1u << (sh - 1)) - 1u) + ((a >> sh) & 1u);
  uint32_t code = ((((r >> 23) - 127u + (uint32_t)bias)) << mb) | ((r >> sh) & ((1u << mb) - 1u));
  if (code > maxcode) code = maxcode;
  return sign | (uint8_t)code;
}

#define CF_THREADS 256 /* threads a block of both sweeps (their launches and bounds) */
#define CF_BLOCKS (132 * 16)

__global__ void __launch_bounds__(CF_THREADS) k_conform(uint64_t start, uint64_t count, int kind, uint8_t *out, unsigned long long *mism) {
  unsigned long long bad = 0;
  for (uint64_t i = blockIdx.x * (uint64_t)blockDim.x + threadIdx.x; i < count; i += (uint64_t)gridDim.x * blockDim.x) {
    uint32_t u = (uint32_t)(start + i);
    float x = __uint_as_float(u);
    uint8_t c = (uint8_t)__nv_cvt_float_to_fp8(x, __NV_SATFINITE, kind ? __NV_E5M2 : __NV_E4M3);
    if (out) out[i] = c;
    if (c != rule_fp8(u, kind)) bad++;
  }
  for (int o = 16; o; o >>= 1) bad += __shfl_xor_sync(0xffffffffu, bad, o);
  if ((threadIdx.x & 31) == 0 && bad) atomicAdd(mism, bad);
}

extern "C" int qk_fp8_conform(uint64_t start, uint64_t count, int kind, uint8_t *out, unsigned long long *mism, void *stream) {
  k_conform<<<CF_BLOCKS, CF_THREADS, 0, (cudaStream_t)stream>>>(start, count, kind, out, mism);
  return (int)cudaGetLastError();
}

__global__ void __launch_bounds__(CF_THREADS) k_parith(uint64_t start, uint64_t count, const uint8_t *tab2, const uint32_t *exc, uint32_t nexc,
                         unsigned long long *mism, unsigned *first) {
  unsigned long long b0 = 0, b1 = 0;
  for (uint64_t i = blockIdx.x * (uint64_t)blockDim.x + threadIdx.x; i < count; i += (uint64_t)gridDim.x * blockDim.x) {
    uint32_t u = (uint32_t)(start + i);
    float x = __uint_as_float(u);
    uint32_t hw = __float_as_uint(qa_rcpa(x)), em = __float_as_uint(qa_rcpa_emul(tab2, x));
    bool nan = (hw & 0x7fffffffu) > 0x7f800000u && (em & 0x7fffffffu) > 0x7f800000u;
    if (hw != em && !nan) {
      b0++;
      atomicMin(&first[0], u);
    }
    if (u >= 0x00800000u && u < 0x7f800000u) { /* positive normal: the scales' domain */
      float g = exp2f(ceilf(log2f(x)));
      if (__float_as_uint(g) != __float_as_uint(qa_exp2i(qa_ceil_log2_emul(exc, nexc, x)))) {
        b1++;
        atomicMin(&first[1], u);
      }
    }
  }
  for (int o = 16; o; o >>= 1) {
    b0 += __shfl_xor_sync(0xffffffffu, b0, o);
    b1 += __shfl_xor_sync(0xffffffffu, b1, o);
  }
  if ((threadIdx.x & 31) == 0) {
    if (b0) atomicAdd(&mism[0], b0);
    if (b1) atomicAdd(&mism[1], b1);
  }
}

extern "C" int qk_parith_conform(uint64_t start, uint64_t count, const uint8_t *tab2, const uint32_t *exc, uint32_t nexc,
                                 unsigned long long *mism, unsigned *first, void *stream) {
  k_parith<<<CF_BLOCKS, CF_THREADS, 0, (cudaStream_t)stream>>>(start, count, tab2, exc, nexc, mism, first);
  return (int)cudaGetLastError();
}
