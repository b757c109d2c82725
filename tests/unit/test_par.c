/* test_par.c: qc_par_for's pool (core/par.c): every index once, each piece
 * at its own tid whichever thread ran it, from nested calls, from several
 * threads at once (the pool busy: their own threads); workers helping from
 * the call that starts them, in a forked child too (none of the parent's
 * workers), each piece without an earlier piece's error message. */
#include <criterion/criterion.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "core/par.h"
#include "core/qc.h"

typedef struct cover {
  atomic_int hits[4096];
  atomic_int tid_lo[QC_PAR_MAX]; /* lo + 1 of the piece run at tid, 0: none */
  int nested;                    /* each piece runs a qc_par_for of its own */
  atomic_long nested_sum;
} cover;

static void add_one(void *ctx, int64_t lo, int64_t hi, int tid) {
  (void)tid;
  atomic_long *s = ctx;
  for (int64_t i = lo; i < hi; i++) atomic_fetch_add(s, i);
}

static void mark(void *ctx, int64_t lo, int64_t hi, int tid) {
  cover *c = ctx;
  atomic_store(&c->tid_lo[tid], (int)lo + 1);
  for (int64_t i = lo; i < hi; i++) atomic_fetch_add(&c->hits[i], 1);
  if (c->nested) qc_par_for(100, 1, add_one, &c->nested_sum);
}

/* qc_par_for(n, grain) covers [0, n) once, piece tid at n * tid / t. */
static void check_cover(int64_t n, int64_t grain, int nested) {
  cover *c = calloc(1, sizeof *c);
  cr_assert(c);
  c->nested = nested;
  qc_par_for(n, grain, mark, c);
  for (int64_t i = 0; i < n; i++) cr_assert_eq(atomic_load(&c->hits[i]), 1, "n %lld: index %lld", (long long)n, (long long)i);
  int64_t t = qc_par_threads(), g = grain < 1 ? 1 : grain;
  if (t > (n + g - 1) / g) t = (n + g - 1) / g;
  for (int64_t k = 0; k < t; k++) cr_assert_eq(atomic_load(&c->tid_lo[k]), (int)(n * k / t) + 1, "n %lld: piece %lld", (long long)n, (long long)k);
  for (int64_t k = t; k < QC_PAR_MAX; k++) cr_assert_eq(atomic_load(&c->tid_lo[k]), 0);
  if (nested) cr_assert_eq(atomic_load(&c->nested_sum), (long)t * 4950);
  free(c);
}

Test(par, covers_each_index_once) {
  setenv("QATCHECK_THREADS", "8", 1);
  for (int r = 0; r < 50; r++) { /* the pool's workers reused call after call */
    check_cover(4096, 1, 0);
    check_cover(7, 1, 0);
    check_cover(1000, 300, 0);
    check_cover(1, 1, 0);
  }
  setenv("QATCHECK_THREADS", "3", 1); /* fewer pieces than the pool's workers */
  check_cover(4096, 1, 0);
  setenv("QATCHECK_THREADS", "16", 1); /* more: the pool grows */
  check_cover(4096, 1, 0);
  unsetenv("QATCHECK_THREADS");
}

Test(par, nested_calls) {
  setenv("QATCHECK_THREADS", "4", 1);
  check_cover(4096, 1, 1); /* a piece's own call finds the pool busy */
  unsetenv("QATCHECK_THREADS");
}

static void *caller(void *arg) {
  (void)arg;
  for (int r = 0; r < 200; r++) {
    atomic_long s = 0;
    qc_par_for(1000, 1, add_one, &s);
    if (atomic_load(&s) != 499500) return (void *)1;
  }
  return NULL;
}

Test(par, concurrent_callers) {
  setenv("QATCHECK_THREADS", "4", 1);
  pthread_t th[4];
  for (int i = 0; i < 4; i++) cr_assert_eq(pthread_create(&th[i], NULL, caller, NULL), 0);
  for (int i = 0; i < 4; i++) {
    void *rv = NULL;
    pthread_join(th[i], &rv);
    cr_expect_null(rv, "caller %d saw a wrong sum", i);
  }
  unsetenv("QATCHECK_THREADS");
}

/* Pieces that sleep 50 ms and note their thread: a pool whose workers sat
 * a job out runs them all on the caller, one after another. */
typedef struct who {
  pthread_t th[QC_PAR_MAX];
} who;

static void sleepy(void *ctx, int64_t lo, int64_t hi, int tid) {
  (void)lo, (void)hi;
  who *w = ctx;
  w->th[tid] = pthread_self();
  usleep(50000);
}

/* The distinct threads that ran qc_par_for(t, 1, sleepy) with t threads. */
static int threads_used(int t) {
  char v[8];
  snprintf(v, sizeof v, "%d", t);
  setenv("QATCHECK_THREADS", v, 1);
  who w;
  memset(&w, 0, sizeof w);
  qc_par_for(t, 1, sleepy, &w);
  int n = 0;
  for (int i = 0; i < t; i++) {
    int seen = 0;
    for (int j = 0; j < i; j++) seen |= pthread_equal(w.th[i], w.th[j]);
    n += !seen;
  }
  unsetenv("QATCHECK_THREADS");
  return n;
}

/* Workers help from the job that starts them (the first call of a process,
 * the call that grows the pool), not from the next one on. */
Test(par, workers_join_the_job_that_starts_them) {
  int n = threads_used(4);
  cr_expect_geq(n, 2, "the first call ran its 4 sleeping pieces on %d thread(s)", n);
  n = threads_used(8);
  cr_expect_geq(n, 5, "the call that grew the pool to 8 ran on %d thread(s)", n);
}

/* A forked child has none of its parent's workers: it starts its own, and
 * its pieces still run on several threads. */
Test(par, forked_child) {
  cr_assert_geq(threads_used(4), 2); /* the parent's workers exist */
  pid_t pid = fork();
  cr_assert(pid >= 0);
  if (pid == 0) {
    alarm(20);
    atomic_long c = 0;
    setenv("QATCHECK_THREADS", "4", 1);
    qc_par_for(1000, 1, add_one, &c);
    _exit(atomic_load(&c) != 499500 ? 1 : threads_used(4) >= 2 ? 0 : 3);
  }
  int st = 0;
  cr_assert_eq(waitpid(pid, &st, 0), pid);
  cr_expect(WIFEXITED(st) && WEXITSTATUS(st) == 0, "the child's qc_par_for: status %d (3: its pieces ran on one thread)", st);
}

/* A worker starts each piece with no error message of an earlier piece's
 * (core/err.c keeps one a thread; first message wins). */
static void fail_piece(void *ctx, int64_t lo, int64_t hi, int tid) {
  (void)ctx, (void)lo, (void)hi;
  qc_err("piece %d failed", tid);
  usleep(20000); /* the workers take pieces too */
}

static void msg_piece(void *ctx, int64_t lo, int64_t hi, int tid) {
  (void)lo, (void)hi;
  char (*m)[64] = ctx;
  snprintf(m[tid], sizeof m[tid], "%s", qc_err_msg());
  usleep(20000);
}

Test(par, workers_start_without_an_old_error) {
  setenv("QATCHECK_THREADS", "4", 1);
  qc_par_for(4, 1, fail_piece, NULL);
  qc_err_clear(); /* the caller's own */
  char m[4][64];
  memset(m, 0, sizeof m);
  qc_par_for(4, 1, msg_piece, m);
  for (int i = 0; i < 4; i++) cr_expect_str_empty(m[i], "piece %d saw '%s'", i, m[i]);
  unsetenv("QATCHECK_THREADS");
}

/* The host memory a process assumes: QATCHECK_HOST_MEMORY when set, else
 * the machine's (or its container's) shared among the host's ranks as the
 * MPI launcher says. */
Test(par, host_memory_from_env_and_local_ranks) {
  static const char *vars[] = {"QATCHECK_HOST_MEMORY", "OMPI_COMM_WORLD_LOCAL_SIZE", "MPI_LOCALNRANKS", "SLURM_NTASKS_PER_NODE"};
  for (size_t i = 0; i < sizeof vars / sizeof vars[0]; i++) unsetenv(vars[i]);
  const int64_t all = qc_host_memory();
  cr_expect_gt(all, (int64_t)1 << 20, "some memory: %lld", (long long)all);
  setenv("OMPI_COMM_WORLD_LOCAL_SIZE", "4", 1);
  const int64_t quarter = qc_host_memory();
  cr_expect(quarter >= all / 4 - 1 && quarter <= all / 4 + 1, "4 local ranks: %lld of %lld", (long long)quarter, (long long)all);
  setenv("QATCHECK_HOST_MEMORY", "12345", 1);
  cr_expect_eq(qc_host_memory(), 12345, "the environment's value stands");
  for (size_t i = 0; i < sizeof vars / sizeof vars[0]; i++) unsetenv(vars[i]);
}
