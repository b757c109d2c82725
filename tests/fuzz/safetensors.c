/* fuzz harness `safetensors`: the safetensors reader (io/safetensors.c) on
 * any bytes as a file image: the header's validation, then every tensor
 * read back whole, as one expert slice, and loaded as a qatcheck tensor
 * (docs/robustness.md, "Fuzzing"). */
// fuzz-seeds: tests/fuzz/seeds/safetensors
// fuzz-options: -max_len=8192 -timeout=10 -dict=tests/fuzz/safetensors.dict
#include <stdint.h>
#include <stdlib.h>

#include "core/qc.h"
#include "io/safetensors.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  qc_st *st = NULL;
  if (qc_st_parse(data, size, "fuzz.safetensors", &st) == QC_OK) {
    int n = qc_st_count(st);
    for (int i = 0; i < n && i < 64; i++) {
      const qc_st_tensor *t = qc_st_at(st, i);
      if (qc_st_find(st, t->name) != t) abort(); /* the sorted index must find each tensor */
      if (t->nbytes > (1u << 20)) continue;
      void *buf = malloc(t->nbytes + 1);
      if (buf) {
        qc_st_read(st, t, -1, buf, (size_t)t->nbytes);
        if (t->ndim > 0 && t->shape[0] > 0) qc_st_read(st, t, t->shape[0] - 1, buf, (size_t)(t->nbytes / (uint64_t)t->shape[0]));
        free(buf);
      }
      qc_err_clear();
      qc_tensor x;
      if (qc_st_load(st, t->name, NULL, &x) == QC_OK) qc_tensor_free(&x);
      qc_err_clear();
    }
    qc_st_close(st);
  }
  qc_err_clear();
  return 0;
}
