/* hdf5_input.h: for the harnesses that give libhdf5 their input as a file
 * (it resolves a file's real path, which a memfd has not): one file per
 * process, in /dev/shm where it exists (memory), else /tmp. */
#ifndef QC_FUZZ_HDF5_INPUT_H
#define QC_FUZZ_HDF5_INPUT_H
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

static char g_path[96];

/* The file's name for this process (tag: the harness), and the sandbox's
 * deadline lowered so that a hang in libhdf5 costs 2 s, not 30. */
static void hdf5_input_init(const char *tag) {
  setenv("QATCHECK_HDF5_DEADLINE", "2", 0);
  snprintf(g_path, sizeof g_path, "%s/qc_fuzz_%s_%d.h5", access("/dev/shm", W_OK) == 0 ? "/dev/shm" : "/tmp", tag,
           (int)getpid());
}

/* data[size] written whole to g_path; 0 when it could not be. */
static int hdf5_input_write(const uint8_t *data, size_t size) {
  FILE *f = fopen(g_path, "wb");
  if (!f) return 0;
  size_t w = fwrite(data, 1, size, f);
  return fclose(f) == 0 && w == size;
}
#endif
