/* minifloat.c: float32 -> E4M3 / E5M2 / E2M1 / E8M0 encoders and the
 * power-of-two ceiling, on the float32 bits (the element encoders live in
 * minifloat.h as inline functions; their one float operation relies on the
 * default round-to-nearest-even mode). */
#include "numerics/formats.h"

#include <string.h>

#include "numerics/minifloat.h"

static uint32_t fbits(float x) { uint32_t u; memcpy(&u, &x, 4); return u; }
static float bitsf(uint32_t u) { float x; memcpy(&x, &u, 4); return x; }

uint8_t qc_f32_to_e4m3(float x) { return qc_enc_e4m3(x); }
uint8_t qc_f32_to_e5m2(float x) { return qc_enc_e5m2(x); }
uint8_t qc_f32_to_e2m1(float x) { return qc_enc_e2m1(x); }

float qc_ceil2(float s) {
  uint32_t u = fbits(s), e = (u >> 23) & 0xffu;
  if (u & 0x7fffffu) e++;
  return bitsf((u & 0x80000000u) | (e << 23));
}

uint8_t qc_ue8m0_of_pow2(float p) { return (uint8_t)((fbits(p) >> 23) & 0xffu); }

uint8_t qc_e8m0_ceil(float s) { return qc_ue8m0_of_pow2(qc_ceil2(s)); }
