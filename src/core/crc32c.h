/* crc32c.h: CRC-32C (Castagnoli, reflected polynomial 0x82F63B78), as the
 * TFRecord framing of TensorBoard event files uses it, and its "masked"
 * form. The SSE4.2 instruction is used where the processor has it; the
 * table (slicing by 8) elsewhere: the same value either way. */
#ifndef QC_CRC32C_H
#define QC_CRC32C_H

#include <stddef.h>
#include <stdint.h>

/* CRC-32C of n bytes (initial value 0, as crc32c("123456789") = 0xE3069283). */
uint32_t qc_crc32c(const void *data, size_t n);
/* The table path alone (for tests on machines with the instruction). */
uint32_t qc_crc32c_sw(const void *data, size_t n);
/* TFRecord's mask: ((crc >> 15) | (crc << 17)) + 0xa282ead8. */
uint32_t qc_crc32c_mask(uint32_t crc);

#endif
