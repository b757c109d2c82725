/* fuzz harness `stepdump`: the one-step update dump reader
 * (io/stepdump.c: the root attribute, each arm's attributes, `frozen`,
 * before/ grad/ state/ after/ datasets) on any bytes as an HDF5 file
 * (docs/robustness.md, "Fuzzing"). libhdf5 runs in the dump sandbox's
 * child: a crash or hang there is the refusal a user sees, not a finding;
 * a crash here is one. */
// fuzz-seeds: tests/fuzz/seeds/stepdump
// fuzz-options: -max_len=65536 -timeout=60
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

#include "core/qc.h"
#include "hdf5_input.h"
#include "io/stepdump.h"

int LLVMFuzzerInitialize(int *argc, char ***argv);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerInitialize(int *argc, char ***argv) {
  (void)argc;
  (void)argv;
  hdf5_input_init("step");
  return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  if (!hdf5_input_write(data, size)) return 0;
  qc_step_arm *arms = NULL;
  int n = 0;
  qc_step_dump_read(g_path, NULL, 0, &arms, &n);
  for (int i = 0; i < n; i++) qc_step_arm_free(&arms[i]);
  free(arms);
  qc_err_clear();
  unlink(g_path);
  return 0;
}
