/* log_num.c: decimal numbers of text logs to double, correctly rounded and
 * fast (see log_priv.h). A log of 100,000 steps x 10 metrics is a million
 * numbers; glibc's strtod spends ~100 ns on each 17-digit one, the whole
 * budget of reading the file. Up to 19 significant digits w and a decimal
 * exponent q:
 *  - w <= 2^53 and |q| <= 22: w and 10^|q| are exact doubles, and one
 *    multiplication or division rounds correctly (Clinger's fast path);
 *  - else, where long double has a 64-bit significand (x87), |q| <= 27: w
 *    and 10^|q| are exact there, the product has one rounding, and rounding
 *    it to double gives strtod's answer unless the 64-bit result lies
 *    within one unit of a midpoint between two doubles (its low 11 bits
 *    0x3ff..0x401): those few go to strtod, as does everything else
 *    (more digits, larger exponents). */
#include <float.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "io/log_priv.h"

static const double g_p10[23] = {1e0,  1e1,  1e2,  1e3,  1e4,  1e5,  1e6,  1e7,  1e8,  1e9,  1e10, 1e11,
                                 1e12, 1e13, 1e14, 1e15, 1e16, 1e17, 1e18, 1e19, 1e20, 1e21, 1e22};

#if defined(__x86_64__) && LDBL_MANT_DIG == 64
#define QC_HAVE_X87 1
/* 10^k, exact in a 64-bit significand for k <= 27 (5^27 < 2^64) */
static long double p10l(int k) {
  static long double t[28];
  static int init;
  if (!init) {
    long double v = 1;
    for (int i = 0; i < 28; i++, v *= 10) t[i] = v;
    init = 1;
  }
  return t[k];
}
#endif

static const char *slow(const char *s, const char *p, double *out) {
  char buf[512];
  size_t n = (size_t)(p - s);
  if (n >= sizeof buf) return NULL; /* no real log writes a 500-digit number */
  memcpy(buf, s, n);
  buf[n] = 0;
  *out = strtod(buf, NULL);
  return p;
}

/* 1 when the 8 bytes at p are all ASCII digits. */
static inline int eight_digits(const char *p, uint64_t *v) {
  memcpy(v, p, 8);
  return ((*v & 0xF0F0F0F0F0F0F0F0ull) | (((*v + 0x0606060606060606ull) & 0xF0F0F0F0F0F0F0F0ull) >> 4)) == 0x3333333333333333ull;
}

/* The value of 8 ASCII digits (little-endian load), by pairs, quads, octet. */
static inline uint64_t eight_value(uint64_t v) {
  v -= 0x3030303030303030ull;
  v = (v * 10) + (v >> 8);
  return (((v & 0x000000FF000000FFull) * (100 + (1000000ull << 32))) + (((v >> 16) & 0x000000FF000000FFull) * (1 + (10000ull << 32)))) >> 32;
}

/* Digits at *pp into w: up to 19 significant ones (nd counts them; leading
 * zeros are not significant), the rest only noted (*trunc when non-zero);
 * *q moves by -1 per significant fraction digit (frac) or +1 per dropped
 * integer digit. Eight digits at a time where they fit. Returns the count. */
static inline int digits(const char **pp, const char *e, uint64_t *w, int *nd, int *q, int *trunc, int frac) {
  const char *p = *pp, *s = p;
  if (*w == 0) /* leading zeros: only move the exponent of a fraction */
    for (; p < e && *p == '0'; p++) *q -= frac;
  uint64_t v;
  while (*nd <= 11 && e - p >= 8 && eight_digits(p, &v)) {
    *w = *w * 100000000ull + eight_value(v);
    *nd += 8;
    *q -= 8 * frac;
    p += 8;
  }
  for (; p < e && (unsigned)(*p - '0') < 10; p++) {
    if (*nd < 19) { *w = *w * 10 + (uint64_t)(*p - '0'); *nd += 1; *q -= frac; }
    else { *q += !frac; *trunc |= *p != '0'; }
  }
  *pp = p;
  return (int)(p - s);
}

const char *qc_num_parse(const char *p, const char *e, double *out) {
  const char *s = p;
  int neg = 0;
  if (p < e && *p == '-') { neg = 1; p++; }
  uint64_t w = 0;
  int nd = 0, q = 0, trunc = 0;
  int any = digits(&p, e, &w, &nd, &q, &trunc, 0) > 0;
  if (p < e && *p == '.') {
    p++;
    if (digits(&p, e, &w, &nd, &q, &trunc, 1) == 0) return NULL; /* "1." */
    any = 1;
  }
  if (!any) return NULL;
  if (p < e && (*p == 'e' || *p == 'E')) {
    const char *x = p + 1;
    int eneg = 0, ev = 0;
    if (x < e && (*x == '+' || *x == '-')) eneg = *x++ == '-';
    const char *x0 = x;
    for (; x < e && (unsigned)(*x - '0') < 10; x++)
      if (ev < 100000) ev = ev * 10 + (*x - '0');
    if (x == x0) return NULL; /* "1e" */
    q += eneg ? -ev : ev;
    p = x;
  }
  if (w == 0) { *out = neg ? -0.0 : 0.0; return p; }
  if (trunc) return slow(s, p, out);
  if (w <= (1ull << 53) && q >= -22 && q <= 22) {
    double d = (double)w;
    d = q >= 0 ? d * g_p10[q] : d / g_p10[-q];
    *out = neg ? -d : d;
    return p;
  }
#ifdef QC_HAVE_X87
  if (q >= -27 && q <= 27) {
    long double v = (long double)w;
    v = q >= 0 ? v * p10l(q) : v / p10l(-q);
    uint64_t mant;
    memcpy(&mant, &v, sizeof mant); /* the explicit 64-bit significand */
    unsigned low = (unsigned)(mant & 0x7ff);
    if (low < 0x3ff || low > 0x401) {
      double d = (double)v;
      *out = neg ? -d : d;
      return p;
    }
  }
#endif
  return slow(s, p, out);
}

/* Case-sensitive match of word at p. */
static const char *word(const char *p, const char *e, const char *w) {
  size_t n = strlen(w);
  return (size_t)(e - p) >= n && memcmp(p, w, n) == 0 ? p + n : NULL;
}

const char *qc_num_special(const char *p, const char *e, double *out) {
  const char *r;
  if ((r = word(p, e, "NaN")) || (r = word(p, e, "nan"))) { *out = NAN; return r; }
  if ((r = word(p, e, "Infinity")) || (r = word(p, e, "inf"))) { *out = INFINITY; return r; }
  if ((r = word(p, e, "-Infinity")) || (r = word(p, e, "-inf"))) { *out = -INFINITY; return r; }
  return NULL;
}
