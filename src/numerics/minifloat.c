/* minifloat.c: float32 -> E4M3 / E5M2 / E2M1 / E8M0 encoders and the
 * power-of-two ceiling, by integer arithmetic on the float32 bits (no FPU
 * rounding mode is involved, so results are the same on every host). */
#include "formats.h"

#include <string.h>

static uint32_t fbits(float x) { uint32_t u; memcpy(&u, &x, 4); return u; }
static float bitsf(uint32_t u) { float x; memcpy(&x, &u, 4); return x; }

/* Magnitude code (sign excluded) of |x| (bits a, finite, below the format's
 * saturation point) for a minifloat with `mb` mantissa bits and exponent
 * bias `bias`: round to nearest, ties to the even code. */
static inline uint32_t mag_rne(uint32_t a, int mb, int bias) {
  uint32_t minnorm = (uint32_t)(128 - bias) << 23; /* 2^(1-bias) as float32 bits */
  if (a >= minnorm) {
    int drop = 23 - mb;
    uint32_t r = a - ((uint32_t)(127 - bias) << 23); /* rebias the exponent */
    r += ((1u << (drop - 1)) - 1u) + ((r >> drop) & 1u);
    return r >> drop;
  }
  /* subnormal target: units of 2^(1-bias-mb) */
  uint32_t e = a >> 23, mant = a & 0x7fffffu;
  if (e == 0) e = 1; else mant |= 0x800000u;
  uint32_t shift = (uint32_t)(151 - bias - mb) - e;
  if (shift >= 26) return 0; /* below a quarter of the smallest step: 0 */
  uint32_t q = mant >> shift, rem = mant & ((1u << shift) - 1u), half = 1u << (shift - 1);
  if (rem > half || (rem == half && (q & 1u))) q++;
  return q;
}

uint8_t qc_f32_to_e4m3(float x) {
  uint32_t u = fbits(x), a = u & 0x7fffffffu;
  uint8_t sign = (uint8_t)((u >> 24) & 0x80u);
  if (a > 0x7f800000u) return 0x7f;               /* NaN */
  if (a >= 0x43e00000u) return sign | 0x7e;       /* >= 448 (and Inf): saturate */
  return (uint8_t)(sign | mag_rne(a, 3, 7));
}

uint8_t qc_f32_to_e5m2(float x) {
  uint32_t u = fbits(x), a = u & 0x7fffffffu;
  uint8_t sign = (uint8_t)((u >> 24) & 0x80u);
  if (a > 0x7f800000u) return 0x7f;               /* NaN */
  if (a >= 0x47600000u) return sign | 0x7b;       /* >= 57344 (and Inf): saturate */
  return (uint8_t)(sign | mag_rne(a, 2, 15));
}

uint8_t qc_f32_to_e2m1(float x) {
  uint32_t u = fbits(x), a = u & 0x7fffffffu;
  uint8_t sign = (uint8_t)((u >> 28) & 0x8u);
  if (a > 0x7f800000u) return 0x7;                /* NaN: no code; never reached from a quantizer */
  if (a >= 0x40c00000u) return sign | 0x7;        /* >= 6: saturate */
  return (uint8_t)(sign | mag_rne(a, 1, 1));
}

float qc_ceil2(float s) {
  uint32_t u = fbits(s), e = (u >> 23) & 0xffu;
  if (u & 0x7fffffu) e++;
  return bitsf((u & 0x80000000u) | (e << 23));
}

uint8_t qc_ue8m0_of_pow2(float p) { return (uint8_t)((fbits(p) >> 23) & 0xffu); }

uint8_t qc_e8m0_ceil(float s) { return qc_ue8m0_of_pow2(qc_ceil2(s)); }
