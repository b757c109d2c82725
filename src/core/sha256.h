/* sha256.h: SHA-256 of a file (for the report's case.sha256). */
#ifndef QC_SHA256_H
#define QC_SHA256_H
#include <stddef.h>
/* Hex digest of buf[0..n) into out (65 bytes). */
void qc_sha256_hex(const void *buf, size_t n, char out[65]);
#endif
