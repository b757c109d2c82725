/* fuzz harness `log`: layer 3's text log readers (io/log_json.c JSONL,
 * Megatron golden values and trainer_state.json; io/log_csv.c CSV;
 * io/log_num.c their numbers) on any bytes (docs/robustness.md,
 * "Fuzzing"). The first byte selects the reader: 0 the format told by
 * content (io/log.c, as `sft` reads a file), 1 JSONL, 2 CSV, 3 Megatron,
 * 4 trainer_state.json, others by content too. */
// fuzz-seeds: tests/fuzz/seeds/log
// fuzz-options: -max_len=16384 -timeout=10 -dict=tests/fuzz/log.dict
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include "core/qc.h"
#include "io/l3log.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  if (size < 1) return 0;
  const char *b = (const char *)data + 1;
  size_t n = size - 1;
  qc_l3_log l;
  memset(&l, 0, sizeof l);
  snprintf(l.path, sizeof l.path, "fuzz.log");
  int rc;
  switch (data[0]) {
    case 1: rc = qc_log_parse_jsonl(b, n, &l); break;
    case 2: rc = qc_log_parse_csv(b, n, &l); break;
    case 3: rc = qc_log_parse_megatron(b, n, &l); break;
    case 4: rc = qc_log_parse_hf(b, n, &l); break;
    default:
      if (qc_log_parse(b, n, "fuzz.log", &l) == QC_OK) qc_l3_log_free(&l);
      qc_err_clear();
      return 0;
  }
  if (rc == QC_OK && qc_l3_log_finish(&l) == QC_OK) {
    int found;
    qc_l3_log_col(&l, "loss");
    qc_l3_log_rename(&l, "lm loss", "loss", &found);
  }
  qc_l3_log_free(&l);
  qc_err_clear();
  return 0;
}
