/* blas_floor.c: the bare BLAS calls a linear audit needs, timed: two
 * float64 GEMMs (the reference's d_x and d_weight) and two float32 GEMMs
 * (the candidate's, on bf16-valued operands). The floor bench/cpu_linear.sh
 * compares `qatcheck vjp` against.
 *   usage: blas_floor M K N REPEATS   -> prints the best seconds */
#include <cblas.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

static double now(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

int main(int argc, char **argv) {
  if (argc != 5) { fprintf(stderr, "usage: blas_floor M K N REPEATS\n"); return 2; }
  long M = atol(argv[1]), K = atol(argv[2]), N = atol(argv[3]), R = atol(argv[4]);
  double *x = malloc(sizeof(double) * M * K), *w = malloc(sizeof(double) * N * K), *g = malloc(sizeof(double) * M * N);
  double *dx = malloc(sizeof(double) * M * K), *dw = malloc(sizeof(double) * N * K);
  float *xf = malloc(sizeof(float) * M * K), *wf = malloc(sizeof(float) * N * K), *gf = malloc(sizeof(float) * M * N);
  float *dxf = malloc(sizeof(float) * M * K), *dwf = malloc(sizeof(float) * N * K);
  if (!x || !w || !g || !dx || !dw || !xf || !wf || !gf || !dxf || !dwf) { fprintf(stderr, "out of memory\n"); return 2; }
  for (long i = 0; i < M * K; i++) xf[i] = (float)(x[i] = (double)(i % 17) - 8);
  for (long i = 0; i < N * K; i++) wf[i] = (float)(w[i] = (double)(i % 13) - 6);
  for (long i = 0; i < M * N; i++) gf[i] = (float)(g[i] = (double)(i % 11) - 5);
  double best = 1e30;
  for (long r = 0; r < R; r++) {
    double t0 = now();
    cblas_dgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, M, K, N, 1, g, N, w, K, 0, dx, K);
    cblas_dgemm(CblasRowMajor, CblasTrans, CblasNoTrans, N, K, M, 1, g, N, x, K, 0, dw, K);
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, M, K, N, 1, gf, N, wf, K, 0, dxf, K);
    cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, N, K, M, 1, gf, N, xf, K, 0, dwf, K);
    double t = now() - t0;
    if (t < best) best = t;
  }
  printf("%.6f\n", best);
  return 0;
}
