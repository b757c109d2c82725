/* fuzz harness `dump`: the dump loader as `vjp` and `contract` drive it
 * (open, module groups, each module loaded whole, the layer-2 plan's
 * lookups), on any bytes as an HDF5 file (docs/robustness.md, "Fuzzing").
 * libhdf5 runs in the sandbox's child: a crash or hang there is the
 * refusal a user sees, not a finding; a crash here is one. */
// fuzz-seeds: cases/data/linear_small.h5 tests/fuzz/seeds/dump
// fuzz-options: -max_len=131072 -timeout=60
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "core/qc.h"
#include "hdf5_input.h"
#include "io/dump.h"

int LLVMFuzzerInitialize(int *argc, char ***argv);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerInitialize(int *argc, char ***argv) {
  (void)argc;
  (void)argv;
  hdf5_input_init("dump");
  return 0;
}

static void one_module(qc_dump *d, const char *path) {
  qc_module m;
  char contract[4096];
  if (qc_dump_load_module(d, path, 1, &m, contract, sizeof contract) == QC_OK) qc_module_free(&m);
  qc_err_clear();
  char ds[QC_PATHLEN + 32];
  snprintf(ds, sizeof ds, "%s/params/weight", path);
  qc_tensor t;
  qc_dump_loc loc;
  if (qc_dump_exists(d, ds) && qc_dump_info(d, ds, &t) == QC_OK && t.ndim == 3 && qc_dump_locate(d, ds, 0, &loc) == QC_OK &&
      loc.nbytes < (64u << 20)) {
    void *buf = malloc(loc.nbytes + 1);
    if (buf) {
      if (loc.offset >= 0) qc_dump_pread(d, ds, &loc, buf);
      else qc_dump_read_into(d, ds, 0, buf, loc.nbytes);
      free(buf);
    }
  }
  qc_err_clear();
  char (*names)[QC_NAMELEN] = NULL;
  int n = 0;
  snprintf(ds, sizeof ds, "%s/grad_out", path);
  if (qc_dump_list(d, ds, &names, &n) == QC_OK) free(names);
  char v[64];
  snprintf(ds, sizeof ds, "%s/params/weight", path);
  qc_dump_get_attr(d, ds, "frozen", v, sizeof v);
  qc_err_clear();
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  if (!hdf5_input_write(data, size)) return 0;
  qc_dump *d = NULL;
  if (qc_dump_open(g_path, &d) == QC_OK) {
    qc_dump_entry *e = NULL;
    int n = 0;
    if (qc_dump_modules(d, NULL, &e, &n) == QC_OK)
      for (int i = 0; i < n && i < 8; i++) one_module(d, e[i].path);
    free(e);
    e = NULL;
    if (qc_dump_modules(d, "^/model\\.", &e, &n) == QC_OK) free(e);
    e = NULL;
    if (qc_dump_unclassed(d, NULL, &e, &n) == QC_OK) free(e); /* the groups that look like modules without a class */
    qc_dump_close(d);
  }
  qc_err_clear();
  unlink(g_path);
  return 0;
}
