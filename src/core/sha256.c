/* sha256.c: FIPS 180-4 SHA-256, written from the standard. */
#include "core/sha256.h"

#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

static const uint32_t K[64] = {
    0x428a2f98, 0x71374491, 0xb5c0fbcf, 0xe9b5dba5, 0x3956c25b, 0x59f111f1, 0x923f82a4, 0xab1c5ed5, 0xd807aa98,
    0x12835b01, 0x243185be, 0x550c7dc3, 0x72be5d74, 0x80deb1fe, 0x9bdc06a7, 0xc19bf174, 0xe49b69c1, 0xefbe4786,
    0x0fc19dc6, 0x240ca1cc, 0x2de92c6f, 0x4a7484aa, 0x5cb0a9dc, 0x76f988da, 0x983e5152, 0xa831c66d, 0xb00327c8,
    0xbf597fc7, 0xc6e00bf3, 0xd5a79147, 0x06ca6351, 0x14292967, 0x27b70a85, 0x2e1b2138, 0x4d2c6dfc, 0x53380d13,
    0x650a7354, 0x766a0abb, 0x81c2c92e, 0x92722c85, 0xa2bfe8a1, 0xa81a664b, 0xc24b8b70, 0xc76c51a3, 0xd192e819,
    0xd6990624, 0xf40e3585, 0x106aa070, 0x19a4c116, 0x1e376c08, 0x2748774c, 0x34b0bcb5, 0x391c0cb3, 0x4ed8aa4a,
    0x5b9cca4f, 0x682e6ff3, 0x748f82ee, 0x78a5636f, 0x84c87814, 0x8cc70208, 0x90befffa, 0xa4506ceb, 0xbef9a3f7,
    0xc67178f2};

#define ROR(x, n) (((x) >> (n)) | ((x) << (32 - (n))))

static void block(uint32_t h[8], const uint8_t *p) {
  uint32_t w[64];
  for (int i = 0; i < 16; i++) w[i] = (uint32_t)p[4 * i] << 24 | (uint32_t)p[4 * i + 1] << 16 | (uint32_t)p[4 * i + 2] << 8 | p[4 * i + 3];
  for (int i = 16; i < 64; i++) {
    uint32_t s0 = ROR(w[i - 15], 7) ^ ROR(w[i - 15], 18) ^ (w[i - 15] >> 3);
    uint32_t s1 = ROR(w[i - 2], 17) ^ ROR(w[i - 2], 19) ^ (w[i - 2] >> 10);
    w[i] = w[i - 16] + s0 + w[i - 7] + s1;
  }
  uint32_t a = h[0], b = h[1], c = h[2], d = h[3], e = h[4], f = h[5], g = h[6], k = h[7];
  for (int i = 0; i < 64; i++) {
    uint32_t t1 = k + (ROR(e, 6) ^ ROR(e, 11) ^ ROR(e, 25)) + ((e & f) ^ (~e & g)) + K[i] + w[i];
    uint32_t t2 = (ROR(a, 2) ^ ROR(a, 13) ^ ROR(a, 22)) + ((a & b) ^ (a & c) ^ (b & c));
    k = g; g = f; f = e; e = d + t1; d = c; c = b; b = a; a = t1 + t2;
  }
  h[0] += a; h[1] += b; h[2] += c; h[3] += d; h[4] += e; h[5] += f; h[6] += g; h[7] += k;
}

/* The x86 SHA extensions (SHA-NI: two rounds an instruction, with the
 * message schedule in hardware), about 4x the portable block() on one
 * core: a report hashes its input files, whole dumps of many GB, beside
 * the audit. The state is kept as the instructions want it: s0 = (A, B,
 * E, F) and s1 = (C, D, G, H), the first word in the highest lane. */
#if defined(__x86_64__) && defined(__GNUC__)
#include <cpuid.h>
#include <immintrin.h>
#define QC_SHA_NI 1
__attribute__((target("sha,sse4.1,ssse3"))) static void blocks_ni(uint32_t h[8], const uint8_t *p, size_t nb) {
  const __m128i bswap = _mm_set_epi64x(0x0c0d0e0f08090a0bLL, 0x0405060700010203LL); /* big-endian words */
  __m128i abcd = _mm_shuffle_epi32(_mm_loadu_si128((const __m128i *)h), 0xB1);  /* B A D C */
  __m128i efgh = _mm_shuffle_epi32(_mm_loadu_si128((const __m128i *)(h + 4)), 0x1B); /* H G F E */
  __m128i s0 = _mm_alignr_epi8(abcd, efgh, 8);                                   /* F E B A: (A, B, E, F) */
  __m128i s1 = _mm_blend_epi16(efgh, abcd, 0xF0);                                /* H G D C: (C, D, G, H) */
  for (; nb > 0; nb--, p += 64) {
    const __m128i save0 = s0, save1 = s1;
    __m128i m[4];
    for (int i = 0; i < 4; i++) m[i] = _mm_shuffle_epi8(_mm_loadu_si128((const __m128i *)(p + 16 * i)), bswap);
    for (int g = 0; g < 16; g++) { /* rounds 4g .. 4g + 3 */
      __m128i w = m[g & 3];
      if (g >= 4) { /* W[t..t+3] from W[t-16..t-1]: m[g&3] holds t-16.., then t-12, t-8, t-4 */
        w = _mm_sha256msg1_epu32(m[g & 3], m[(g + 1) & 3]);
        w = _mm_add_epi32(w, _mm_alignr_epi8(m[(g + 3) & 3], m[(g + 2) & 3], 4));
        w = _mm_sha256msg2_epu32(w, m[(g + 3) & 3]);
        m[g & 3] = w;
      }
      __m128i wk = _mm_add_epi32(w, _mm_loadu_si128((const __m128i *)(K + 4 * g)));
      s1 = _mm_sha256rnds2_epu32(s1, s0, wk); /* two rounds: s1 becomes (A, B, E, F), s0 the old one (C, D, G, H) */
      s0 = _mm_sha256rnds2_epu32(s0, s1, _mm_shuffle_epi32(wk, 0x0E)); /* the next two: back in place */
    }
    s0 = _mm_add_epi32(s0, save0);
    s1 = _mm_add_epi32(s1, save1);
  }
  abcd = _mm_shuffle_epi32(s0, 0x1B); /* A B E F */
  efgh = _mm_shuffle_epi32(s1, 0xB1); /* G H C D */
  _mm_storeu_si128((__m128i *)h, _mm_blend_epi16(abcd, efgh, 0xF0));      /* A B C D */
  _mm_storeu_si128((__m128i *)(h + 4), _mm_alignr_epi8(efgh, abcd, 8)); /* E F G H */
}

/* 1 when this CPU has the SHA extensions (CPUID leaf 7, EBX bit 29) and
 * SSE4.1 and SSSE3 (leaf 1, ECX bits 19 and 9). */
static int have_sha_ni(void) {
  unsigned a, b, c, d;
  if (!__get_cpuid(1, &a, &b, &c, &d) || !(c & (1u << 19)) || !(c & (1u << 9))) return 0;
  return __get_cpuid_count(7, 0, &a, &b, &c, &d) && (b & (1u << 29));
}
#endif

/* -1: not yet asked; 0: block() only; 1: blocks_ni() (the report's hash
 * threads read it at once: atomic) */
static atomic_int g_accel = -1;

int qc_sha256_accel(int on) {
#ifdef QC_SHA_NI
  if (on >= 0) atomic_store(&g_accel, on && have_sha_ni());
  else if (atomic_load(&g_accel) < 0) atomic_store(&g_accel, have_sha_ni());
#else
  (void)on;
  atomic_store(&g_accel, 0);
#endif
  return atomic_load(&g_accel);
}

/* nb whole blocks at p into h, on the SHA extensions where the CPU has them. */
static void blocks(uint32_t h[8], const uint8_t *p, size_t nb) {
#ifdef QC_SHA_NI
  if (qc_sha256_accel(-1)) {
    blocks_ni(h, p, nb);
    return;
  }
#endif
  for (; nb > 0; nb--, p += 64) block(h, p);
}

void qc_sha256_init(qc_sha256 *c) {
  static const uint32_t h0[8] = {0x6a09e667, 0xbb67ae85, 0x3c6ef372, 0xa54ff53a,
                                 0x510e527f, 0x9b05688c, 0x1f83d9ab, 0x5be0cd19};
  memcpy(c->h, h0, sizeof h0);
  c->n = 0;
  c->fill = 0;
}

void qc_sha256_update(qc_sha256 *c, const void *buf, size_t n) {
  const uint8_t *p = buf;
  c->n += n;
  if (c->fill) {
    size_t k = 64 - c->fill < n ? 64 - c->fill : n;
    memcpy(c->buf + c->fill, p, k);
    c->fill += k;
    p += k;
    n -= k;
    if (c->fill < 64) return;
    blocks(c->h, c->buf, 1);
    c->fill = 0;
  }
  blocks(c->h, p, n / 64);
  p += n / 64 * 64;
  n %= 64;
  memcpy(c->buf, p, n);
  c->fill = n;
}

void qc_sha256_final(qc_sha256 *c, uint8_t out[32]) {
  uint8_t tail[128] = {0};
  size_t r = c->fill;
  memcpy(tail, c->buf, r);
  tail[r] = 0x80;
  size_t tl = r + 9 <= 64 ? 64 : 128;
  uint64_t bits = c->n * 8;
  for (int j = 0; j < 8; j++) tail[tl - 1 - j] = (uint8_t)(bits >> (8 * j));
  blocks(c->h, tail, tl / 64);
  for (int j = 0; j < 32; j++) out[j] = (uint8_t)(c->h[j / 4] >> (24 - 8 * (j % 4)));
}

void qc_sha256_final_hex(qc_sha256 *c, char out[65]) {
  uint8_t d[32];
  qc_sha256_final(c, d);
  for (int j = 0; j < 32; j++) snprintf(out + 2 * j, 3, "%02x", d[j]);
}

void qc_sha256_hex(const void *buf, size_t n, char out[65]) {
  qc_sha256 c;
  qc_sha256_init(&c);
  qc_sha256_update(&c, buf, n);
  qc_sha256_final_hex(&c, out);
}
