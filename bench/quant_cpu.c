/* quant_cpu.c: each bulk quantizer (qc_quantize, profile vllm, round to
 * nearest) against a memcpy of the same input bytes, side by side in one
 * run: best of R repetitions each, ratio = quantize time / memcpy time.
 * Built and run by bench/quant_cpu.sh. Arguments: [ROWS COLS REPS [FORMAT]]. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "numerics/quant.h"
#include "core/qc.h"

static double now(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

int main(int argc, char **argv) {
  int64_t rows = argc > 1 ? atoll(argv[1]) : 4096, cols = argc > 2 ? atoll(argv[2]) : 8192;
  int reps = argc > 3 ? atoi(argv[3]) : 5;
  size_t n = (size_t)(rows * cols);
  float *x = malloc(n * 4), *y = malloc(n * 4);
  if (!x || !y) return 2;
  uint64_t s = 88172645463325252ull;
  for (size_t i = 0; i < n; i++) { /* xorshift normals-ish: sum of uniforms */
    double u = 0;
    for (int k = 0; k < 4; k++) { s ^= s << 13; s ^= s >> 7; s ^= s << 17; u += (double)(s >> 11) * 0x1p-53; }
    x[i] = (float)((u - 2.0) * 0.05);
  }
  memcpy(y, x, n * 4); /* touch y */
  /* interleaved: each repetition times memcpy and then every format, so a
   * busy machine slows both sides of each ratio alike; best of reps each */
  double tm = 1e30, tq[QC_QF_COUNT];
  for (int f = 0; f < QC_QF_COUNT; f++) tq[f] = 1e30;
  for (int r = 0; r < reps; r++) {
    double t0 = now();
    memcpy(y, x, n * 4);
    double t = now() - t0;
    if (t < tm) tm = t;
    for (int f = 1; f < QC_QF_COUNT; f++) {
      if (argc > 4 && strcmp(argv[4], qc_qfmt_name((qc_qfmt)f)) != 0) continue;
      qc_quantized z;
      t0 = now();
      if (qc_quantize((qc_qfmt)f, QC_QP_VLLM, rows, cols, x, NULL, &z, "bench")) { qc_err_print(); return 2; }
      t = now() - t0;
      qc_quantized_free(&z);
      if (t < tq[f]) tq[f] = t;
    }
  }
  printf("matrix [%lld, %lld] float32 (%.0f MiB), best of %d; memcpy %.2f ms (%.1f GB/s)\n", (long long)rows,
         (long long)cols, (double)n * 4 / 1048576.0, reps, tm * 1e3, (double)n * 4 / tm * 1e-9);
  printf("%-20s %10s %12s %8s\n", "format", "ms", "Melem/s", "x memcpy");
  for (int f = 1; f < QC_QF_COUNT; f++)
    if (tq[f] < 1e30)
      printf("%-20s %10.2f %12.1f %8.2f\n", qc_qfmt_name((qc_qfmt)f), tq[f] * 1e3, (double)n / tq[f] * 1e-6, tq[f] / tm);
  free(x); free(y);
  return 0;
}
