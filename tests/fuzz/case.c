/* fuzz harness `case`: the case-file parser, its lint and the contract
 * attribute parser, on any bytes (docs/robustness.md, "Fuzzing"). */
// fuzz-seeds: cases/*.json tests/fuzz/seeds/case
// fuzz-options: -max_len=16384 -timeout=10 -dict=tests/fuzz/case.dict
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "core/qc.h"
#include "model/case.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  static qc_case c;
  char *text = malloc(size + 1);
  if (!text) return 0;
  memcpy(text, data, size);
  text[size] = 0;
  if (qc_case_parse(text, "fuzz.json", "/nonexistent", &c) == QC_OK) qc_case_weak(&c, 0);
  qc_err_clear();
  qc_contract c2;
  qc_contract_parse(text, "fuzz", &c2);
  qc_err_clear();
  free(text);
  return 0;
}
