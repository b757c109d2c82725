/* minifloat.h: the element encoders of formats.h as static inline
 * functions, for the bulk loops of quant.c (same code, no call per element).
 * Integer arithmetic on the float32 bits only. */
#ifndef QC_MINIFLOAT_H
#define QC_MINIFLOAT_H

#include <stdint.h>
#include <string.h>

static inline uint32_t mf_bits(float x) { uint32_t u; memcpy(&u, &x, 4); return u; }

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

/* E4M3, SATFINITE, RNE. Branch free (selects by masks), so that bulk loops
 * vectorize. Normal results: rebias and round the float32 bits (integer
 * RNE on the 20 dropped bits). Subnormal results (|x| < 2^-6): |x| * 2^9 is
 * exact; adding 1.5 * 2^23 rounds it to an integer by the float unit's
 * round-to-nearest-even (the default mode, never changed by qatcheck). */
static inline uint8_t qc_enc_e4m3(float x) {
  int32_t u = (int32_t)mf_bits(x), a = u & 0x7fffffff, sign = (u >> 24) & 0x80;
  int32_t r = a - (120 << 23);
  r = (r + 0x7ffff + ((r >> 20) & 1)) >> 20;
  float t;
  uint32_t ua = (uint32_t)a;
  memcpy(&t, &ua, 4);
  int32_t s = (int32_t)mf_bits(t * 512.0f + 12582912.0f) - 0x4b400000;
  int32_t mnorm = -(a >= 0x3c800000), msat = -(a >= 0x43e00000), mnan = -(a > 0x7f800000);
  int32_t c = (r & mnorm) | (s & ~mnorm);
  c = (0x7e & msat) | (c & ~msat);
  c |= sign;
  c = (0x7f & mnan) | (c & ~mnan);
  return (uint8_t)c;
}

static inline uint8_t qc_enc_e5m2(float x) {
  uint32_t u = mf_bits(x), a = u & 0x7fffffffu;
  uint8_t sign = (uint8_t)((u >> 24) & 0x80u);
  if (a > 0x7f800000u) return 0x7f;               /* NaN */
  if (a >= 0x47600000u) return sign | 0x7b;       /* >= 57344 (and Inf): saturate */
  return (uint8_t)(sign | mag_rne(a, 2, 15));
}

/* E2M1 (low nibble), saturating at 6, RNE, sign kept; NaN gives 0x7 (no
 * NaN code: the quantizers refuse NaN first). Branch free as qc_enc_e4m3:
 * normal results (|x| >= 1) by integer RNE on the 22 dropped bits,
 * subnormal ones (0, 0.5) by rounding |x| * 2 to an integer. */
static inline uint8_t qc_enc_e2m1(float x) {
  int32_t u = (int32_t)mf_bits(x), a = u & 0x7fffffff, sign = (int32_t)(((uint32_t)u >> 28) & 0x8u);
  int32_t r = a - (126 << 23);
  r = (r + 0x1fffff + ((r >> 22) & 1)) >> 22;
  float t;
  uint32_t ua = (uint32_t)a;
  memcpy(&t, &ua, 4);
  int32_t s = (int32_t)mf_bits(t * 2.0f + 12582912.0f) - 0x4b400000;
  int32_t mnorm = -(a >= 0x3f800000), msat = -(a >= 0x40c00000), mnan = -(a > 0x7f800000);
  int32_t c = (r & mnorm) | (s & ~mnorm);
  c = (0x7 & msat) | (c & ~msat);
  c |= sign;
  c = (0x7 & mnan) | (c & ~mnan);
  return (uint8_t)c;
}

#endif
