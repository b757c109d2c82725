/* fuzz harness `config`: the per-arm config reader (io/config.c: JSON, or
 * YAML through libyaml, into canonical JSON text per key) on any bytes
 * (docs/robustness.md, "Fuzzing"). */
// fuzz-seeds: tests/fuzz/seeds/config
// fuzz-options: -max_len=8192 -timeout=10 -dict=tests/fuzz/config.dict
#include <stdint.h>
#include <string.h>

#include "core/qc.h"
#include "io/l3log.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  static const qc_l3_keypath keys[] = {
      {"lr", "optimizer.lr"}, {"seed", "run.seed"}, {"schedule", "schedule"}, {"betas", "optimizer.betas"},
      {"a.b", "a.b"}, {"precision", "precision"}, {"list", "list"}, {"optimizer", "optimizer"},
  };
  qc_l3_config c;
  memset(&c, 0, sizeof c);
  if (qc_config_parse((const char *)data, size, "fuzz.yaml", keys, (int)(sizeof keys / sizeof keys[0]), &c) == QC_OK)
    qc_l3_config_free(&c);
  qc_err_clear();
  return 0;
}
