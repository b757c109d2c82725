/* parith.c: the host emulation of the GPU's approximate arithmetic
 * (parith.h) from the tables measured on an H200 (ptables.h): rcp.approx.f32
 * and ceil(log2f(v)). */
#include "numerics/parith.h"

#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "numerics/ptables.h"

/* 2 bits per mantissa: bit 0 differs from RN, bit 1 the larger magnitude. */
static uint8_t g_rcpa2[1u << 21];
static int g_ok;
static pthread_once_t g_once = PTHREAD_ONCE_INIT;

static int b64(int c) {
  if (c >= 'A' && c <= 'Z') return c - 'A';
  if (c >= 'a' && c <= 'z') return c - 'a' + 26;
  if (c >= '0' && c <= '9') return c - '0' + 52;
  return c == '+' ? 62 : c == '/' ? 63 : -1;
}

/* Decode base64 text into bytes (malloc'd, *n set); NULL on failure. */
static uint8_t *unb64(const char *s, size_t *n) {
  size_t len = 0;
  for (const char *p = s; *p; p++) len += b64((unsigned char)*p) >= 0;
  uint8_t *out = malloc(len * 3 / 4 + 3);
  if (!out) return NULL;
  uint32_t acc = 0;
  int bits = 0;
  size_t k = 0;
  for (const char *p = s; *p; p++) {
    int v = b64((unsigned char)*p);
    if (v < 0) continue;
    acc = (acc << 6) | (uint32_t)v;
    bits += 6;
    if (bits >= 8) {
      bits -= 8;
      out[k++] = (uint8_t)(acc >> bits);
      acc &= (1u << bits) - 1u;
    }
  }
  *n = k;
  return out;
}

/* Bit pos of buf (least significant bit of each byte first); past the end
 * clears *ok. */
static uint32_t next_bit(const uint8_t *buf, uint64_t nbits, uint64_t *pos, int *ok) {
  uint64_t p = (*pos)++;
  if (p >= nbits) { *ok = 0; return 0; }
  return (buf[p >> 3] >> (p & 7)) & 1u;
}

static void tables_init(void) {
  size_t nb = 0;
  uint8_t *buf = unb64(qc_rcpa_rice_b64, &nb);
  int ok = buf != NULL;
  uint64_t pos = 0, nbits = (uint64_t)nb * 8;
  uint32_t *where = ok && qc_rcpa_ndiff ? malloc(qc_rcpa_ndiff * sizeof *where) : NULL;
  if (qc_rcpa_ndiff && !where) ok = 0;
  int64_t m = -1;
  for (uint32_t i = 0; ok && i < qc_rcpa_ndiff; i++) {
    uint32_t q = 0, rem = 0, b;
    for (;;) {
      b = next_bit(buf, nbits, &pos, &ok);
      if (!b || !ok || q > (1u << 23)) break;
      q++;
    }
    for (uint32_t j = 0; j < qc_rcpa_rice_k; j++) {
      b = next_bit(buf, nbits, &pos, &ok);
      rem |= b << j;
    }
    m += (int64_t)(((uint64_t)q << qc_rcpa_rice_k) | rem) + 1;
    if (m >= (1 << 23)) ok = 0;
    else where[i] = (uint32_t)m;
  }
  uint32_t up = 0;
  for (uint32_t i = 0; ok && i < qc_rcpa_ndiff; i++) {
    uint32_t b = next_bit(buf, nbits, &pos, &ok);
    up += b;
    g_rcpa2[where[i] >> 2] |= (uint8_t)((1u | (b << 1)) << ((where[i] & 3u) * 2));
  }
  ok = ok && up == qc_rcpa_nup;
  for (uint32_t i = 1; ok && i < qc_ceil2log_nexc; i++) ok = qc_ceil2log_exc[i - 1] < qc_ceil2log_exc[i];
  if (!ok) memset(g_rcpa2, 0, sizeof g_rcpa2);
  g_ok = ok;
  free(where);
  free(buf);
}

/* Decode the tables (thread safe, once). */
static void qc_ptables_init(void) { pthread_once(&g_once, tables_init); }

int qc_ptables_ok(void) {
  qc_ptables_init();
  return g_ok;
}

int qc_rcpa_delta(uint32_t m) {
  qc_ptables_init();
  uint32_t v = (g_rcpa2[(m & 0x7fffffu) >> 2] >> ((m & 3u) * 2)) & 3u;
  return !(v & 1u) ? 0 : (v & 2u) ? 1 : -1;
}

const uint8_t *qc_rcpa_table2(void) {
  qc_ptables_init();
  return g_rcpa2;
}

const uint32_t *qc_ceil2log_list(uint32_t *n) {
  *n = qc_ceil2log_nexc;
  return qc_ceil2log_exc;
}

float qc_rcpa(float x) {
  qc_ptables_init();
  return qa_rcpa_emul(g_rcpa2, x);
}

int qc_ceil_log2_gpu(float v) { return qa_ceil_log2_emul(qc_ceil2log_exc, qc_ceil2log_nexc, v); }
