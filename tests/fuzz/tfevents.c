/* fuzz harness `tfevents`: the TensorBoard event-file reader
 * (io/log_tb.c: TFRecord framing, Event and Summary protobufs,
 * simple_value and tensor scalars) on any bytes (docs/robustness.md,
 * "Fuzzing"). Each input is parsed twice: as it is (the CRCs then stop
 * most mutations at the framing), and with every record's two CRCs made
 * right, so that the mutations reach the protobuf decoder. */
// fuzz-seeds: tests/fuzz/seeds/tfevents
// fuzz-options: -max_len=8192 -timeout=10
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "core/crc32c.h"
#include "core/qc.h"
#include "io/l3log.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static void put32(uint8_t *p, uint32_t v) {
  for (int i = 0; i < 4; i++) p[i] = (uint8_t)(v >> (8 * i));
}

/* Rewrite the masked CRC32C of each record's length and data in place, as
 * far as the lengths lead inside the buffer. */
static void fix_crcs(uint8_t *b, size_t n) {
  size_t at = 0;
  while (n - at >= 12) {
    uint64_t len = 0;
    for (int i = 0; i < 8; i++) len |= (uint64_t)b[at + i] << (8 * i);
    put32(b + at + 8, qc_crc32c_mask(qc_crc32c(b + at, 8)));
    at += 12;
    if (len > n - at || n - at - len < 4) return;
    put32(b + at + len, qc_crc32c_mask(qc_crc32c(b + at, (size_t)len)));
    at += (size_t)len + 4;
  }
}

static void parse(const uint8_t *b, size_t n) {
  qc_l3_log l;
  memset(&l, 0, sizeof l);
  if (qc_log_parse_tfevents((const char *)b, n, &l) == QC_OK) qc_l3_log_finish(&l);
  qc_l3_log_free(&l);
  qc_err_clear();
  if (qc_log_parse((const char *)b, n, "fuzz.tfevents", &l) == QC_OK) qc_l3_log_free(&l);
  qc_err_clear();
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  parse(data, size);
  uint8_t *b = malloc(size + 1);
  if (!b) return 0;
  memcpy(b, data, size);
  fix_crcs(b, size);
  parse(b, size);
  free(b);
  return 0;
}
