/* minifloat.h: the element encoders of formats.h as static inline
 * functions, for the bulk loops of quant.c (same code, no call per element):
 * one branch-free routine, qc_enc_mini, with each format's constants. */
#ifndef QC_MINIFLOAT_H
#define QC_MINIFLOAT_H

#include <stdint.h>
#include <string.h>

static inline uint32_t mf_bits(float x) { uint32_t u; memcpy(&u, &x, 4); return u; }

/* A float32 to a minifloat code with `mb` mantissa bits and exponent bias
 * `bias`: RNE, |x| >= the largest finite value (float32 bits satbits) and
 * +-Inf give satcode, NaN gives nancode, the sign (bit `signbit`, taken
 * from float32 bit 31 by a right shift of signshift) is kept, also on zero.
 * Branch free (selects by masks), so that bulk loops vectorize. Normal
 * results: rebias the float32 bits and round the dropped mantissa bits as
 * an integer (RNE). Subnormal results: |x| * 2^(bias + mb - 1) is exact and
 * below 2^mb; adding 1.5 * 2^23 rounds it to an integer by the float unit's
 * round-to-nearest-even (the default mode, never changed by qatcheck). */
static inline uint8_t qc_enc_mini(float x, int mb, int bias, int32_t satbits, int32_t satcode, int32_t nancode,
                                  int signshift, int32_t signbit) {
  int32_t u = (int32_t)mf_bits(x), a = u & 0x7fffffff;
  int32_t sign = (int32_t)((uint32_t)u >> signshift) & signbit;
  int drop = 23 - mb;
  int32_t r = a - ((127 - bias) << 23);
  r = (r + ((1 << (drop - 1)) - 1) + ((r >> drop) & 1)) >> drop;
  float t, scale;
  uint32_t ua = (uint32_t)a, sb = (uint32_t)(127 + bias + mb - 1) << 23;
  memcpy(&t, &ua, 4);
  memcpy(&scale, &sb, 4);
  int32_t s = (int32_t)mf_bits(t * scale + 12582912.0f) - 0x4b400000;
  int32_t mnorm = -(a >= ((128 - bias) << 23)), msat = -(a >= satbits), mnan = -(a > 0x7f800000);
  int32_t c = (r & mnorm) | (s & ~mnorm);
  c = (satcode & msat) | (c & ~msat);
  c |= sign;
  c = (nancode & mnan) | (c & ~mnan);
  return (uint8_t)c;
}

/* E4M3 (float8_e4m3fn), SATFINITE: max 448 (0x7E), NaN 0x7F. */
static inline uint8_t qc_enc_e4m3(float x) { return qc_enc_mini(x, 3, 7, 0x43e00000, 0x7e, 0x7f, 24, 0x80); }
/* E5M2, SATFINITE: max 57344 (0x7B), NaN 0x7F. */
static inline uint8_t qc_enc_e5m2(float x) { return qc_enc_mini(x, 2, 15, 0x47600000, 0x7b, 0x7f, 24, 0x80); }
/* E2M1 (low nibble): max 6 (0x7); no NaN code (the quantizers refuse NaN
 * first), NaN gives 0x7. */
static inline uint8_t qc_enc_e2m1(float x) { return qc_enc_mini(x, 1, 1, 0x40c00000, 0x7, 0x7, 28, 0x8); }

#endif
