/* test_par.c: qc_par_for's pool (core/par.c): every index once, each piece
 * at its own tid whichever thread ran it, from nested calls, from several
 * threads at once (the pool busy: their own threads), and in a forked
 * child (none of the parent's workers). */
#include <criterion/criterion.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <unistd.h>

#include "core/par.h"

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

Test(par, forked_child) {
  setenv("QATCHECK_THREADS", "4", 1);
  atomic_long s = 0;
  qc_par_for(1000, 1, add_one, &s); /* the parent's workers exist */
  pid_t pid = fork();
  cr_assert(pid >= 0);
  if (pid == 0) {
    atomic_long c = 0;
    alarm(20); /* a child waiting on workers it does not have would hang */
    qc_par_for(1000, 1, add_one, &c);
    _exit(atomic_load(&c) == 499500 ? 0 : 1);
  }
  int st = 0;
  cr_assert_eq(waitpid(pid, &st, 0), pid);
  cr_expect(WIFEXITED(st) && WEXITSTATUS(st) == 0, "the child's qc_par_for: status %d", st);
  unsetenv("QATCHECK_THREADS");
}
