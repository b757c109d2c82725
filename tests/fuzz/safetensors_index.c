/* fuzz harness `safetensors_index`: the checkpoint index reader
 * (io/safetensors_files.c: model.safetensors.index.json's weight_map, the
 * shards it names beside it, every mapped tensor found in its shard) on
 * any bytes (docs/robustness.md, "Fuzzing"). The input is the index's
 * text, then optionally a NUL byte and the bytes of a second shard,
 * s1.safetensors; a fixed shard s0.safetensors (tensors "a": F32 [2] and
 * "b": BF16 [2]) always lies beside it. The index is opened by its path
 * and through its folder, and every tensor of a checkpoint that opens is
 * loaded. */
// fuzz-seeds: tests/fuzz/seeds/safetensors_index
// fuzz-options: -max_len=4096 -timeout=10 -dict=tests/fuzz/safetensors_index.dict
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "core/qc.h"
#include "io/safetensors.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static char g_dir[96], g_index[160], g_s1[160];

/* data[size] written whole to path; 0 when it could not be. */
static int put(const char *path, const void *data, size_t size) {
  FILE *f = fopen(path, "wb");
  if (!f) return 0;
  size_t w = fwrite(data, 1, size, f);
  return fclose(f) == 0 && w == size;
}

/* The folder of this process, with the fixed shard s0.safetensors in it. */
static int init(void) {
  snprintf(g_dir, sizeof g_dir, "%s/qc_fuzz_stidx_%d", access("/dev/shm", W_OK) == 0 ? "/dev/shm" : "/tmp", (int)getpid());
  if (mkdir(g_dir, 0700) != 0) return 0;
  snprintf(g_index, sizeof g_index, "%s/model.safetensors.index.json", g_dir);
  snprintf(g_s1, sizeof g_s1, "%s/s1.safetensors", g_dir);
  static const char hdr[] = "{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]},"
                            "\"b\":{\"dtype\":\"BF16\",\"shape\":[2],\"data_offsets\":[8,12]}}";
  unsigned char img[8 + sizeof hdr + 12];
  uint64_t n = sizeof hdr - 1;
  for (int i = 0; i < 8; i++) img[i] = (unsigned char)(n >> (8 * i));
  memcpy(img + 8, hdr, n);
  memset(img + 8 + n, 0x3f, 12);
  char s0[160];
  snprintf(s0, sizeof s0, "%s/s0.safetensors", g_dir);
  return put(s0, img, 8 + n + 12);
}

/* Every tensor of an open checkpoint loaded (a few at most), then closed. */
static void load_all(qc_st *st) {
  int n = qc_st_count(st);
  for (int i = 0; i < n && i < 16; i++) {
    const qc_st_tensor *t = qc_st_at(st, i);
    if (qc_st_find(st, t->name) != t) abort(); /* the sorted index must find each tensor */
    qc_tensor x;
    if (t->nbytes <= (1u << 20) && qc_st_load(st, t->name, NULL, &x) == QC_OK) qc_tensor_free(&x);
    qc_err_clear();
  }
  qc_st_close(st);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  static int inited;
  if (!inited) {
    if (!init()) abort();
    inited = 1;
  }
  const uint8_t *nul = memchr(data, 0, size);
  size_t ni = nul ? (size_t)(nul - data) : size;
  if (!put(g_index, data, ni)) return 0;
  if (nul) {
    if (!put(g_s1, nul + 1, size - ni - 1)) return 0;
  } else unlink(g_s1);
  qc_st *st = NULL;
  if (qc_st_open(g_index, &st) == QC_OK) load_all(st);
  qc_err_clear();
  st = NULL;
  if (qc_st_open(g_dir, &st) == QC_OK) load_all(st);
  qc_err_clear();
  return 0;
}
