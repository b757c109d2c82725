/* par.c: qc_par_for (see par.h). */
#include "core/par.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

#include "core/number.h"

typedef struct piece {
  void (*fn)(void *, int64_t, int64_t, int);
  void *ctx;
  int64_t lo, hi;
  int tid;
} piece;

static void *run_piece(void *p) {
  piece *q = p;
  q->fn(q->ctx, q->lo, q->hi, q->tid);
  return NULL;
}

/* Threads qc_par_for uses: QATCHECK_THREADS when set (a whole number of at
 * least 1, core/number.c), else the online processors (at most QC_PAR_MAX). */
int qc_par_threads(void) {
  double v = qc_env_value("QATCHECK_THREADS", 0);
  long n = v >= 1 ? (long)v : sysconf(_SC_NPROCESSORS_ONLN);
  if (n < 1) n = 1;
  return n > QC_PAR_MAX ? QC_PAR_MAX : (int)n;
}

void qc_par_for(int64_t n, int64_t grain, void (*fn)(void *ctx, int64_t lo, int64_t hi, int tid), void *ctx) {
  if (n <= 0) return;
  if (grain < 1) grain = 1;
  int64_t t = qc_par_threads();
  if (t > (n + grain - 1) / grain) t = (n + grain - 1) / grain;
  if (t <= 1) { fn(ctx, 0, n, 0); return; }
  piece pc[QC_PAR_MAX];
  pthread_t th[QC_PAR_MAX];
  int started[QC_PAR_MAX] = {0};
  for (int64_t i = 0; i < t; i++) {
    pc[i] = (piece){fn, ctx, n * i / t, n * (i + 1) / t, (int)i};
    if (i > 0) started[i] = pthread_create(&th[i], NULL, run_piece, &pc[i]) == 0;
  }
  run_piece(&pc[0]);
  for (int64_t i = 1; i < t; i++) {
    if (started[i]) pthread_join(th[i], NULL);
    else run_piece(&pc[i]);
  }
}

/* OpenBLAS's thread pool, weak: NULL under another BLAS, and then nothing
 * is changed (OpenBLAS's OpenMP build has them too; restarting its pool
 * does no harm). The variable set stays in the environment of any child. */
void openblas_read_env(void) __attribute__((weak));
int blas_thread_shutdown_(void) __attribute__((weak));
int blas_thread_init(void) __attribute__((weak));

void qc_blas_tune(void) {
  if (getenv("OPENBLAS_THREAD_TIMEOUT") || !openblas_read_env || !blas_thread_shutdown_ || !blas_thread_init) return;
  char v[8];
  snprintf(v, sizeof v, "%d", QC_BLAS_SPIN_LOG2);
  if (setenv("OPENBLAS_THREAD_TIMEOUT", v, 1) != 0) return;
  openblas_read_env();     /* the pool reads the timeout when it starts ... */
  blas_thread_shutdown_(); /* ... so it is stopped and started again */
  blas_thread_init();
}
