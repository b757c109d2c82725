/* par.c: qc_par_for (see par.h). */
#include "core/par.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

#include "core/number.h"
#include "core/qc.h"

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

/* The first whole number in file `path` (a cgroup's memory limit), or -1
 * ("max", absent or unreadable). */
static double file_number(const char *path) {
  FILE *f = fopen(path, "r");
  double v = -1;
  if (f) {
    char buf[64] = "";
    if (fgets(buf, sizeof buf, f)) {
      char *end;
      const double x = strtod(buf, &end);
      if (end != buf && x > 0) v = x;
    }
    fclose(f);
  }
  return v;
}

int64_t qc_host_memory(void) {
  const double env = qc_env_value("QATCHECK_HOST_MEMORY", -1);
  if (env >= 1) return (int64_t)env;
  double m = (double)sysconf(_SC_PHYS_PAGES) * (double)sysconf(_SC_PAGESIZE);
  static const char *limits[] = {"/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory/memory.limit_in_bytes"};
  for (size_t i = 0; i < sizeof limits / sizeof limits[0]; i++) {
    const double l = file_number(limits[i]);
    if (l > 0 && (!(m > 0) || l < m)) m = l; /* a container's limit (cgroup v2, v1: "unlimited" is huge) */
  }
  static const char *local[] = {"OMPI_COMM_WORLD_LOCAL_SIZE", "MPI_LOCALNRANKS", "SLURM_NTASKS_PER_NODE"};
  for (size_t i = 0; i < sizeof local / sizeof local[0]; i++) {
    const char *e = getenv(local[i]);
    const long r = e ? strtol(e, NULL, 10) : 0;
    if (r > 1) {
      m /= (double)r; /* the processes of this host share it */
      break;
    }
  }
  return m >= 1 ? (int64_t)m : (int64_t)1 << 30;
}

/* ---- the pool ---------------------------------------------------------------
 * A whole-model audit calls qc_par_for thousands of times (66,050 threads
 * started in one Qwen2-MoE audit on 16 threads), each start and join on the
 * caller's critical path. Workers started once wait for a job instead. One
 * job at a time: a call that finds the pool busy (another thread's job, or
 * a call from inside a piece) starts its own threads as before. Pieces are
 * cut from n and t alone, and a piece's tid is its index whichever thread
 * runs it, so results do not depend on which path ran them. */
static struct {
  pthread_mutex_t busy;        /* held by the caller whose job the pool runs */
  pthread_mutex_t mu;          /* guards the fields below */
  pthread_cond_t go, done;
  int workers;                 /* started (they never stop) */
  unsigned long gen;           /* bumped per job: workers wake on a change */
  piece pc[QC_PAR_MAX];
  int npieces, next, left;     /* the job's pieces, the next to take, those not finished */
} P = {.busy = PTHREAD_MUTEX_INITIALIZER, .mu = PTHREAD_MUTEX_INITIALIZER, .go = PTHREAD_COND_INITIALIZER,
       .done = PTHREAD_COND_INITIALIZER};

/* Take and run the job's pieces until none is left to take (P.mu held on
 * entry and on return). A worker starts each piece with no error message
 * (core/err.c keeps one a thread), as a thread started for it would. */
static void drain(int worker) {
  while (P.next < P.npieces) {
    piece *q = &P.pc[P.next++];
    pthread_mutex_unlock(&P.mu);
    if (worker) qc_err_clear();
    run_piece(q);
    pthread_mutex_lock(&P.mu);
    if (--P.left == 0) pthread_cond_signal(&P.done);
  }
}

static void *worker(void *arg) {
  (void)arg;
  pthread_mutex_lock(&P.mu);
  unsigned long seen = P.gen;
  drain(1); /* the job it was started for, already under way */
  for (;;) {
    while (P.gen == seen) pthread_cond_wait(&P.go, &P.mu);
    seen = P.gen;
    drain(1);
  }
  return NULL;
}

/* fork() copies P as it is; the child has none of the parent's workers, so
 * it starts its own. P.mu is taken across the fork (it is only ever held
 * for moments). P.busy stays as it was: held when a job was under way
 * (the forking thread's or another's), and then the child's calls start
 * threads of their own, as on a busy pool. */
static void before_fork(void) { pthread_mutex_lock(&P.mu); }
static void after_fork_parent(void) { pthread_mutex_unlock(&P.mu); }
static void after_fork_child(void) {
  pthread_cond_init(&P.go, NULL); /* their waiters were the parent's workers */
  pthread_cond_init(&P.done, NULL);
  P.workers = 0;
  P.npieces = P.next = P.left = 0;
  pthread_mutex_unlock(&P.mu);
}

static pthread_once_t atfork_once = PTHREAD_ONCE_INIT;
static void atfork_register(void) { pthread_atfork(before_fork, after_fork_parent, after_fork_child); }

/* 1 when the pool ran fn's t pieces; 0 when it could not (busy, or no
 * worker could start): the caller runs them itself. */
static int pool_run(const piece *pc, int t) {
  if (pthread_mutex_trylock(&P.busy) != 0) return 0;
  pthread_once(&atfork_once, atfork_register);
  pthread_mutex_lock(&P.mu);
  while (P.workers < t - 1) { /* the caller is the t-th */
    pthread_t th;
    pthread_attr_t at;
    int ok = pthread_attr_init(&at) == 0;
    if (ok) {
      (void)pthread_attr_setdetachstate(&at, PTHREAD_CREATE_DETACHED);
      ok = pthread_create(&th, &at, worker, NULL) == 0;
      pthread_attr_destroy(&at);
    }
    if (!ok) break;
    P.workers++;
  }
  if (P.workers == 0) {
    pthread_mutex_unlock(&P.mu);
    pthread_mutex_unlock(&P.busy);
    return 0;
  }
  for (int i = 0; i < t; i++) P.pc[i] = pc[i];
  P.npieces = P.left = t;
  P.next = 0;
  P.gen++;
  if (t - 1 >= P.workers) pthread_cond_broadcast(&P.go);
  else
    for (int i = 0; i < t - 1; i++) pthread_cond_signal(&P.go); /* a worker not woken takes the next job it sees */
  drain(0); /* the caller takes pieces too: fewer workers than pieces still finish */
  while (P.left > 0) pthread_cond_wait(&P.done, &P.mu);
  P.npieces = 0;
  pthread_mutex_unlock(&P.mu);
  pthread_mutex_unlock(&P.busy);
  return 1;
}

void qc_par_for(int64_t n, int64_t grain, void (*fn)(void *ctx, int64_t lo, int64_t hi, int tid), void *ctx) {
  if (n <= 0) return;
  if (grain < 1) grain = 1;
  int64_t t = qc_par_threads();
  if (t > (n + grain - 1) / grain) t = (n + grain - 1) / grain;
  if (t <= 1) { fn(ctx, 0, n, 0); return; }
  piece pc[QC_PAR_MAX];
  for (int64_t i = 0; i < t; i++) pc[i] = (piece){fn, ctx, n * i / t, n * (i + 1) / t, (int)i};
  if (pool_run(pc, (int)t)) return;
  pthread_t th[QC_PAR_MAX];
  int started[QC_PAR_MAX] = {0};
  for (int64_t i = 1; i < t; i++) started[i] = pthread_create(&th[i], NULL, run_piece, &pc[i]) == 0;
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
