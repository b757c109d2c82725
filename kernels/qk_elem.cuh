/* qk_elem.cuh: element encodings of docs/numerics.md for device code. */
#ifndef QC_QK_ELEM_CUH
#define QC_QK_ELEM_CUH

#include <cuda_fp16.h>
#include <cuda_fp8.h>
#include <stdint.h>

/* E4M3 as the spec defines it: CUDA's saturating conversion. */
__device__ __forceinline__ uint8_t qk_f32_to_e4m3(float x) {
  return (uint8_t)__nv_cvt_float_to_fp8(x, __NV_SATFINITE, __NV_E4M3);
}

/* Exact decode (0x7F/0xFF decode to NaN). */
__device__ __forceinline__ float qk_e4m3_to_f32(uint8_t b) {
  return __half2float(__half(__nv_cvt_fp8_to_halfraw((__nv_fp8_storage_t)b, __NV_E4M3)));
}

/* E2M1: RNE with ties to the even code, saturating at 6, sign kept. */
__device__ __forceinline__ uint8_t qk_f32_to_e2m1(float x) {
  float a = fabsf(x);
  uint8_t c = a <= 0.25f ? 0 : a < 0.75f ? 1 : a <= 1.25f ? 2 : a < 1.75f ? 3
            : a <= 2.5f ? 4 : a < 3.5f ? 5 : a <= 5.f ? 6 : 7;
  return (uint8_t)(c | (signbit(x) ? 8 : 0));
}

/* Exact decode by selects (no table in local memory). */
__device__ __forceinline__ float qk_e2m1_to_f32(uint8_t c) {
  int m = c & 7;
  float v = m < 4 ? 0.5f * (float)m : m == 4 ? 2.f : m == 5 ? 3.f : m == 6 ? 4.f : 6.f;
  return (c & 8) ? -v : v;
}

/* Power-of-two ceiling by the exponent bit rule (DeepGEMM ceil_to_ue8m0). */
__device__ __forceinline__ float qk_ceil2(float s) {
  uint32_t u = __float_as_uint(s);
  if (u & 0x7fffffu) u = (u & 0xff800000u) + 0x800000u;
  return __uint_as_float(u);
}

/* E8M0 byte of a power of two (its exponent field). */
__device__ __forceinline__ uint8_t qk_e8m0_byte(float s) { return (uint8_t)((__float_as_uint(s) >> 23) & 0xffu); }

/* 2^(b - 127) (b = 0 is the subnormal 2^-127; 0xFF is NaN). */
__device__ __forceinline__ float qk_e8m0_to_f32(uint8_t b) {
  if (b == 0xff) return __uint_as_float(0x7fc00000u);
  return b == 0 ? __uint_as_float(0x00400000u) : __uint_as_float((uint32_t)b << 23);
}

#endif
