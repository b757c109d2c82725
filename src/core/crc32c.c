/* crc32c.c: CRC-32C, hardware or table (see crc32c.h). */
#include "core/crc32c.h"

#include <string.h>

static uint32_t g_tab[8][256];
static int g_init, g_hw;

static void init(void) {
  for (uint32_t i = 0; i < 256; i++) {
    uint32_t c = i;
    for (int k = 0; k < 8; k++) c = (c >> 1) ^ (0x82F63B78u & (0u - (c & 1u)));
    g_tab[0][i] = c;
  }
  for (uint32_t i = 0; i < 256; i++)
    for (int t = 1; t < 8; t++) g_tab[t][i] = (g_tab[t - 1][i] >> 8) ^ g_tab[0][g_tab[t - 1][i] & 0xff];
#if defined(__x86_64__) && defined(__GNUC__)
  __builtin_cpu_init();
  g_hw = __builtin_cpu_supports("sse4.2");
#endif
  g_init = 1;
}

/* Slicing by 8: eight table lookups per 8 bytes (little-endian loads). */
static uint32_t crc_table(uint32_t c, const unsigned char *p, size_t n) {
  while (n >= 8) {
    uint64_t w;
    memcpy(&w, p, 8);
    w ^= c;
    c = g_tab[7][w & 0xff] ^ g_tab[6][(w >> 8) & 0xff] ^ g_tab[5][(w >> 16) & 0xff] ^ g_tab[4][(w >> 24) & 0xff] ^
        g_tab[3][(w >> 32) & 0xff] ^ g_tab[2][(w >> 40) & 0xff] ^ g_tab[1][(w >> 48) & 0xff] ^ g_tab[0][w >> 56];
    p += 8;
    n -= 8;
  }
  while (n--) c = (c >> 8) ^ g_tab[0][(c ^ *p++) & 0xff];
  return c;
}

#if defined(__x86_64__) && defined(__GNUC__)
__attribute__((target("sse4.2"))) static uint32_t crc_hw(uint32_t c, const unsigned char *p, size_t n) {
  uint64_t c64 = c;
  while (n >= 8) {
    uint64_t w;
    memcpy(&w, p, 8);
    c64 = __builtin_ia32_crc32di(c64, w);
    p += 8;
    n -= 8;
  }
  c = (uint32_t)c64;
  while (n--) c = __builtin_ia32_crc32qi(c, *p++);
  return c;
}
#endif

uint32_t qc_crc32c(const void *data, size_t n) {
  if (!g_init) init();
  uint32_t c = 0xFFFFFFFFu;
#if defined(__x86_64__) && defined(__GNUC__)
  if (g_hw) return crc_hw(c, data, n) ^ 0xFFFFFFFFu;
#endif
  return crc_table(c, data, n) ^ 0xFFFFFFFFu;
}

uint32_t qc_crc32c_mask(uint32_t crc) { return ((crc >> 15) | (crc << 17)) + 0xa282ead8u; }

uint32_t qc_crc32c_sw(const void *data, size_t n) {
  if (!g_init) init();
  return crc_table(0xFFFFFFFFu, data, n) ^ 0xFFFFFFFFu;
}
