/* blas_rate.c: the measured float64 GEMM rate of this machine's CBLAS, at the
 * shape the contract sweep multiplies: C[M, K] = A[M, N] B[N, K].
 * usage: blas_rate M N K REPS   prints "gflops <rate> seconds_per_gemm <t>" */
#include <cblas.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

int main(int argc, char **argv) {
  if (argc != 5) { fprintf(stderr, "usage: blas_rate M N K REPS\n"); return 2; }
  long m = atol(argv[1]), n = atol(argv[2]), k = atol(argv[3]), reps = atol(argv[4]);
  double *a = malloc(sizeof(double) * (size_t)(m * n)), *b = malloc(sizeof(double) * (size_t)(n * k));
  double *c = malloc(sizeof(double) * (size_t)(m * k));
  if (!a || !b || !c || reps < 1) return 2;
  for (long i = 0; i < m * n; i++) a[i] = (double)(i % 7) - 3;
  for (long i = 0; i < n * k; i++) b[i] = (double)(i % 5) - 2;
  /* one untimed call: thread start-up and page faults */
  cblas_dgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, (int)m, (int)k, (int)n, 1.0, a, (int)n, b, (int)k, 0.0, c, (int)k);
  double t0 = now_s();
  for (long r = 0; r < reps; r++)
    cblas_dgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, (int)m, (int)k, (int)n, 1.0, a, (int)n, b, (int)k, 0.0, c, (int)k);
  double t = (now_s() - t0) / (double)reps;
  printf("gflops %.3f seconds_per_gemm %.4f checksum %.1f\n", 2.0 * (double)m * (double)n * (double)k / t * 1e-9, t, c[0] + c[m * k - 1]);
  free(a); free(b); free(c);
  return 0;
}
