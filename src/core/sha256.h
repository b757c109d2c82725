/* sha256.h: SHA-256 (FIPS 180-4), in one call or streamed (a report's
 * input files are hashed as they are read, whatever their size). */
#ifndef QC_SHA256_H
#define QC_SHA256_H
#include <stddef.h>
#include <stdint.h>

typedef struct qc_sha256 {
  uint32_t h[8];
  uint64_t n;        /* bytes hashed */
  uint8_t buf[64];   /* a partial block */
  size_t fill;
} qc_sha256;

void qc_sha256_init(qc_sha256 *c);
void qc_sha256_update(qc_sha256 *c, const void *buf, size_t n);
/* The digest, 32 bytes. */
void qc_sha256_final(qc_sha256 *c, uint8_t out[32]);
/* The hex digest (65 bytes with the NUL). */
void qc_sha256_final_hex(qc_sha256 *c, char out[65]);
/* Whether the x86 SHA extensions are used (1) or the portable code (0).
 * on: -1 asks; 0 turns them off; 1 turns them on where the CPU has them
 * (the tests compare the two). Process-wide: set it before hashing. */
int qc_sha256_accel(int on);
/* Hex digest of buf[0..n) into out (65 bytes). */
void qc_sha256_hex(const void *buf, size_t n, char out[65]);
#endif
