/* formats.h: element encodings of docs/numerics.md, scalar. All conversions
 * from float32 round to nearest, ties to even, unless a name says otherwise.
 * Decoders are exact. */
#ifndef QC_FORMATS_H
#define QC_FORMATS_H

#include <stdint.h>
#include <string.h>

/* bfloat16: RNE from float32; NaN stays NaN (quiet), Inf stays Inf.
 * Inline: they sit in every conversion loop. */
static inline uint16_t qc_f32_to_bf16(float x) {
  uint32_t u;
  memcpy(&u, &x, 4);
  if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16) | 0x0040u); /* quiet NaN */
  u += 0x7fffu + ((u >> 16) & 1u); /* RNE; overflow carries into Inf correctly */
  return (uint16_t)(u >> 16);
}
static inline float qc_bf16_to_f32(uint16_t h) {
  uint32_t u = (uint32_t)h << 16;
  float x;
  memcpy(&x, &u, 4);
  return x;
}
/* Round a float32 to the nearest bfloat16 value, returned as float32. */
static inline float qc_round_bf16(float x) { return qc_bf16_to_f32(qc_f32_to_bf16(x)); }

/* IEEE binary16: RNE from float32, overflow to Inf, subnormals kept. */
uint16_t qc_f32_to_f16(float x);
float qc_f16_to_f32(uint16_t h);

/* float8_e4m3fn: decode a byte (0x7F/0xFF are NaN). */
float qc_e4m3_to_f32(uint8_t b);
/* Encode as CUDA's __nv_cvt_float_to_fp8(x, __NV_SATFINITE, __NV_E4M3):
 * RNE, |x| > 448 saturates to +-448, NaN -> 0x7F, sign of zero kept. */
uint8_t qc_f32_to_e4m3(float x);

/* float8_e5m2: decode; encode with SATFINITE (saturate to +-57344, NaN -> 0x7F). */
float qc_e5m2_to_f32(uint8_t b);
uint8_t qc_f32_to_e5m2(float x);

/* e2m1 nibble (low 4 bits): decode; encode RNE, saturating at 6, sign kept. */
float qc_e2m1_to_f32(uint8_t nib);
uint8_t qc_f32_to_e2m1(float x);

/* E8M0: 2^(b-127); 0xFF is NaN. */
float qc_e8m0_to_f32(uint8_t b);

/* Power-of-two ceiling by the exponent bit rule (DeepGEMM ceil_to_ue8m0):
 * exponent field + 1 when the mantissa is non-zero, mantissa cleared.
 * ceil2(0) = 0; a subnormal s gives 2^-126. */
float qc_ceil2(float s);
/* The E8M0 byte of a power of two p (its float32 exponent field; 0 -> 0). */
uint8_t qc_ue8m0_of_pow2(float p);
/* qc_ue8m0_of_pow2(qc_ceil2(s)). */
uint8_t qc_e8m0_ceil(float s);

#endif
