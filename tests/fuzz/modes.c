/* fuzz harness `modes`: the execution-mode comparison (engine/modes.c) as
 * `vjp` drives it after the audit, on any bytes (docs/robustness.md,
 * "Fuzzing"). The input is a dump written in a mode (HDF5 bytes), then
 * optionally the separator "\nQC-EAGER\n" and the eager dump of the same
 * step: qc_modes_audit judges the first from its /qatcheck_mode evidence
 * and, given the second, against it, with the seeds' module paths in the
 * coverage list. A refusal is an answer; a crash, leak, hang or
 * sanitizer report, or a check whose strings are not terminated, is a
 * finding. libhdf5 runs in the sandbox's child, as for `dump`. */
// fuzz-seeds: tests/fuzz/seeds/modes
// fuzz-options: -max_len=262144 -timeout=60 -dict=tests/fuzz/modes.dict
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "core/qc.h"
#include "engine/modes.h"
#include "hdf5_input.h"

int LLVMFuzzerInitialize(int *argc, char ***argv);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

#define SEP "\nQC-EAGER\n"

static char g_eager[128];

int LLVMFuzzerInitialize(int *argc, char ***argv) {
  (void)argc;
  (void)argv;
  hdf5_input_init("modes");
  snprintf(g_eager, sizeof g_eager, "%s/qc_fuzz_modes_eager_%d.h5", access("/dev/shm", W_OK) == 0 ? "/dev/shm" : "/tmp",
           (int)getpid());
  return 0;
}

/* data[size] written whole to path; 0 when it could not be. */
static int put(const char *path, const uint8_t *data, size_t size) {
  FILE *f = fopen(path, "wb");
  if (!f) return 0;
  size_t w = size ? fwrite(data, 1, size, f) : 0;
  return fclose(f) == 0 && w == size;
}

/* The coverage list vjp would hand over, for the module paths the seeds
 * use (opening the dump once more to list them would halve the speed). */
static void modinfos_of(qc_modinfos *mods) {
  static const char *const paths[] = {"/fc1", "/fc2", "/microbatch0/fc1", "/microbatch1/fc1", "/enc", "/dec"};
  qc_modinfo *mi = calloc(1, sizeof *mi);
  for (size_t i = 0; mi && i < sizeof paths / sizeof *paths; i++) {
    memset(mi, 0, sizeof *mi);
    snprintf(mi->module, sizeof mi->module, "%s", paths[i]);
    snprintf(mi->cls, sizeof mi->cls, "linear");
    if (qc_modinfos_add(mods, mi) != QC_OK) break;
  }
  free(mi);
  qc_err_clear();
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  const uint8_t *sep = memmem(data, size, SEP, sizeof SEP - 1);
  size_t n1 = sep ? (size_t)(sep - data) : size;
  if (!hdf5_input_write(data, n1)) return 0;
  int eager = sep && put(g_eager, sep + sizeof SEP - 1, size - n1 - (sizeof SEP - 1));
  qc_results res = {0};
  qc_modinfos mods = {0};
  modinfos_of(&mods);
  if (qc_modes_audit(g_path, "", eager ? g_eager : NULL, &res, &mods) == QC_OK) {
    size_t len = 0; /* read every check as a report would: terminated strings */
    for (int i = 0; i < res.n; i++)
      len += strlen(res.v[i].module) + strlen(res.v[i].dy) + strlen(res.v[i].tensor) + strlen(res.v[i].why) +
             strlen(res.v[i].diagnosis) + strlen(res.v[i].tol.reasoning);
    if (len == (size_t)-1) abort();
  }
  qc_err_clear();
  qc_results_free(&res);
  qc_modinfos_free(&mods);
  unlink(g_path);
  if (eager) unlink(g_eager);
  return 0;
}
