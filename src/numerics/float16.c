/* float16.c: bfloat16 and IEEE binary16 conversions (RNE). */
#include "numerics/formats.h"

#include <math.h>
#include <string.h>

static uint32_t fbits(float x) { uint32_t u; memcpy(&u, &x, 4); return u; }
static float bitsf(uint32_t u) { float x; memcpy(&x, &u, 4); return x; }

uint16_t qc_f32_to_f16(float x) {
  uint32_t u = fbits(x);
  uint16_t sign = (uint16_t)((u >> 16) & 0x8000u);
  uint32_t a = u & 0x7fffffffu;
  if (a > 0x7f800000u) return sign | 0x7e00u;          /* NaN */
  if (a >= 0x477ff000u) return sign | 0x7c00u;         /* >= 65520 rounds to Inf */
  if (a < 0x38800000u) {                               /* below 2^-14: subnormal */
    if (a < 0x33000000u) return sign;                  /* < 2^-25: rounds to 0 */
    uint32_t e = a >> 23;                              /* biased f32 exponent */
    uint32_t m = (a & 0x7fffffu) | 0x800000u;
    /* value = m * 2^(e-150); in units of 2^-24 that is m >> (126 - e) */
    uint32_t shift = 126u - e;
    uint32_t q = m >> shift;
    uint32_t rem = m & ((1u << shift) - 1u);
    uint32_t half = 1u << (shift - 1);
    if (rem > half || (rem == half && (q & 1u))) q++;
    return (uint16_t)(sign | q);
  }
  /* normal: rebias 127 -> 15, RNE on the 13 dropped bits */
  uint32_t r = a - 0x38000000u;                        /* subtract (112 << 23) */
  uint32_t lsb = (r >> 13) & 1u;
  r += 0xfffu + lsb;
  return (uint16_t)(sign | (r >> 13));
}

float qc_f16_to_f32(uint16_t h) {
  uint32_t sign = ((uint32_t)h & 0x8000u) << 16;
  uint32_t e = (h >> 10) & 0x1fu, m = h & 0x3ffu;
  if (e == 0) {
    float v = ldexpf((float)m, -24);
    return sign ? -v : v;
  }
  if (e == 31) return bitsf(sign | 0x7f800000u | (m << 13));
  return bitsf(sign | ((e + 112u) << 23) | (m << 13));
}

float qc_e4m3_to_f32(uint8_t b) {
  int s = b >> 7, e = (b >> 3) & 0xf, m = b & 7;
  float v;
  if (e == 15 && m == 7) return NAN;
  if (e == 0) v = ldexpf((float)m, -9);
  else v = ldexpf((float)(8 + m), e - 10);
  return s ? -v : v;
}

float qc_e5m2_to_f32(uint8_t b) {
  int s = b >> 7, e = (b >> 2) & 0x1f, m = b & 3;
  float v;
  if (e == 31) v = m ? NAN : INFINITY;
  else if (e == 0) v = ldexpf((float)m, -16);
  else v = ldexpf((float)(4 + m), e - 17);
  return s ? -v : v;
}

float qc_e2m1_to_f32(uint8_t nib) {
  static const float mag[8] = {0.0f, 0.5f, 1.0f, 1.5f, 2.0f, 3.0f, 4.0f, 6.0f};
  float v = mag[nib & 7];
  return (nib & 8) ? -v : v;
}

float qc_e8m0_to_f32(uint8_t b) {
  if (b == 0xff) return NAN;
  return ldexpf(1.0f, (int)b - 127);
}
