/* sr.c: Philox4x32-10 and the stochastic-rounding draw (see sr.h). */
#include "numerics/sr.h"

#include <string.h>

void qc_philox4x32_10(const uint32_t ctr[4], const uint32_t key[2], uint32_t out[4]) {
  uint32_t c0 = ctr[0], c1 = ctr[1], c2 = ctr[2], c3 = ctr[3], k0 = key[0], k1 = key[1];
  for (int r = 0; r < 10; r++) {
    uint64_t p0 = (uint64_t)0xD2511F53u * c0, p1 = (uint64_t)0xCD9E8D57u * c2;
    uint32_t hi0 = (uint32_t)(p0 >> 32), lo0 = (uint32_t)p0, hi1 = (uint32_t)(p1 >> 32), lo1 = (uint32_t)p1;
    c0 = hi1 ^ c1 ^ k0;
    c1 = lo1;
    c2 = hi0 ^ c3 ^ k1;
    c3 = lo0;
    k0 += 0x9E3779B9u;
    k1 += 0xBB67AE85u;
  }
  out[0] = c0; out[1] = c1; out[2] = c2; out[3] = c3;
}

uint32_t qc_sr_bits(const qc_sr *sr, uint64_t index) {
  uint32_t ctr[4] = {(uint32_t)index, (uint32_t)(index >> 32), sr->salt, sr->step};
  uint32_t key[2] = {(uint32_t)sr->seed, (uint32_t)(sr->seed >> 32)};
  uint32_t out[4];
  qc_philox4x32_10(ctr, key, out);
  return out[0] >> 8;
}

uint32_t qc_sr_salt_id(const char *identity) {
  uint32_t h = 2166136261u;
  for (const char *p = identity; *p; p++) h = (h ^ (uint8_t)*p) * 16777619u;
  return h;
}

uint32_t qc_sr_salt_path(const char *module_path, const char *param) {
  uint32_t h = 2166136261u;
  const char *p = module_path;
  if (*p == '/') p++;
  for (; *p; p++) h = (h ^ (uint8_t)(*p == '/' ? '.' : *p)) * 16777619u;
  if (param && *param) {
    h = (h ^ (uint8_t)'.') * 16777619u;
    for (p = param; *p; p++) h = (h ^ (uint8_t)*p) * 16777619u;
  }
  return h;
}
