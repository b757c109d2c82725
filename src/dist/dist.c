/* dist.c: the job (MPI), the assignment, the agreement, gathers and host
 * reductions (see dist.h). Built without MPI (QC_HAVE_MPI unset) every
 * function is the one-process case. */
#include "dist/dist.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <math.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "core/number.h"
#include "core/qc.h"
#include "core/watchdog.h"
#include "numerics/formats.h"

#ifdef QC_HAVE_MPI
#include <mpi.h>
#endif

static struct {
  int active, rank, size, local_rank, local_size, ended;
  int failed;              /* an agreement found an error: the job is over, no more collectives */
  int failed_rc;
  int broken;              /* MPI itself failed: no collective can be trusted to return */
  char msg[1024], hint[512];
} D = {.size = 1, .local_size = 1};

int qc_dist_active(void) { return D.active; }
int qc_dist_rank(void) { return D.rank; }
int qc_dist_size(void) { return D.size; }
int qc_dist_local_rank(void) { return D.local_rank; }

/* OpenBLAS's thread count, when the BLAS linked in is OpenBLAS. */
void openblas_set_num_threads(int n) __attribute__((weak));

/* Was this process started by a process manager? */
static int launched(void) {
  const char *f = getenv("QATCHECK_MPI");
  if (f && f[0]) return strcmp(f, "0") != 0;
  static const char *const vars[] = {"OMPI_COMM_WORLD_SIZE", "PMIX_RANK", "PMI_RANK", "PMI_SIZE", NULL};
  for (const char *const *v = vars; *v; v++)
    if (getenv(*v)) return 1;
  return 0;
}

int qc_dist_launched(void) { return launched(); }

/* Environment variable name as a whole number from 0 to INT_MAX into *v: 1,
 * else 0 (unset, empty or anything else). */
static int env_int(const char *name, int *v) {
  const char *e = getenv(name);
  if (!e || !e[0]) return 0;
  char *end;
  errno = 0;
  long long x = strtoll(e, &end, 10);
  if (errno || *end || x < 0 || x > INT_MAX) return 0;
  *v = (int)x;
  return 1;
}

int qc_dist_env_rank(void) {
  static const char *const vars[] = {"OMPI_COMM_WORLD_RANK", "PMIX_RANK", "PMI_RANK", "SLURM_PROCID", NULL};
  int r = 0;
  if (!launched()) return 0;
  for (const char *const *v = vars; *v; v++)
    if (env_int(*v, &r)) return r;
  return 0;
}

#ifdef QC_HAVE_MPI
/* An MPI failure as the one error line (system error). */
static int mpi_fail(const char *what, int e) {
  char s[MPI_MAX_ERROR_STRING];
  int n = 0;
  if (MPI_Error_string(e, s, &n) != MPI_SUCCESS) snprintf(s, sizeof s, "MPI error %d", e);
  return qc_err_sys("rank %d: %s failed: %s", D.rank, what, s);
}
#define MK(call, what)                          \
  do {                                          \
    int e_ = (call);                            \
    if (e_ != MPI_SUCCESS) return mpi_fail(what, e_); \
  } while (0)
#endif


/* ---- the stall check (docs/distributed.md, "A stopped rank") -------------------------
 * The ranks of a node share one segment: a header and one slot per local
 * rank. Each rank's beat thread stamps its slot with CLOCK_MONOTONIC (one
 * clock for the whole node) every period and reads the others' stamps; it
 * calls no MPI, so MPI_THREAD_FUNNELED holds. A slot left unstamped for the
 * rank timeout is a rank that is not running (stopped, frozen): the lowest
 * running rank of the node claims the header, ends its run (its error
 * reports: rank 0's are the job's) and prints the line; the other running
 * ranks exit 2 quietly once it has printed.
 *
 * The segment is a file, mapped and stamped before MPI_Init, when the
 * process manager's environment gives this rank's place (Open MPI:
 * OMPI_COMM_WORLD_RANK, _LOCAL_RANK, _LOCAL_SIZE) and the job's folder on
 * this node (PMIx: PMIX_SERVER_TMPDIR, which the node's PMIx server makes
 * for the job and removes at its end, and PMIX_NAMESPACE): a rank stopped
 * inside MPI startup is seen too. Its name is removed once every rank of
 * the node has started MPI. Otherwise the segment is an MPI shared-memory
 * window over the node's communicator, allocated after MPI_Init. */

enum { BEAT_NONE = 0, BEAT_RUN, BEAT_DONE };

/* The header of a node's segment. */
typedef struct beat_head {
  _Atomic int claim; /* 0, or 1 + the world rank that ends the job */
  _Atomic int said;  /* 1 once that rank has printed its line */
} beat_head;

/* One rank's slot. */
typedef struct beat_slot {
  _Atomic long long ns; /* its last stamp (CLOCK_MONOTONIC, ns) */
  _Atomic int state;    /* BEAT_* */
  _Atomic int rank;     /* its world rank */
  _Atomic int pid;
} beat_slot;

static struct {
  beat_head *head;
  beat_slot *slot; /* lsize slots */
  _Atomic long long timeout_ns; /* 0: off */
  int given;                    /* set by qc_dist_rank_timeout: QATCHECK_RANK_TIMEOUT does not replace it */
  int rank, lrank, lsize;       /* this rank's place, as the beat thread reads it */
  int file;                     /* the segment is the mapped file path (else MPI's window) */
  size_t bytes;                 /* the file's size */
  char path[PATH_MAX];          /* the file, until its name is removed ("") */
  pthread_t th;
  int started;
  pthread_mutex_t mu;
  pthread_cond_t cv;
  int stop;
#ifdef QC_HAVE_MPI
  MPI_Comm node;
  MPI_Win win;
#endif
} B = {.mu = PTHREAD_MUTEX_INITIALIZER, .timeout_ns = (long long)(QC_RANK_TIMEOUT_DEFAULT * 1e9)};

#ifdef QC_HAVE_MPI
/* Now on the node's monotonic clock, in nanoseconds. */
static long long mono_ns(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return (long long)t.tv_sec * 1000000000LL + t.tv_nsec;
}

/* After the claimant's line: the node's other ranks may exit. */
static void said(void) { atomic_store(&B.head->said, 1); }

/* The beat thread: stamps this rank's slot, and ends the run when another
 * rank of the node has not stamped its own for the timeout. Returns when
 * told to stop (beat_stop). */
static void *beat_main(void *arg) {
  (void)arg;
  beat_slot *me = &B.slot[B.lrank];
  pthread_mutex_lock(&B.mu);
  while (!B.stop) {
    long long now = mono_ns(), to = atomic_load(&B.timeout_ns);
    atomic_store(&me->ns, now);
    if (to > 0) {
      int stalled = -1, lowest = -1, spid = 0;
      for (int i = 0; i < B.lsize; i++) {
        beat_slot *s = &B.slot[i];
        if (atomic_load(&s->state) != BEAT_RUN) continue;
        int r = atomic_load(&s->rank);
        if (i != B.lrank && now - atomic_load(&s->ns) > to) {
          if (stalled < 0 || r < stalled) stalled = r, spid = atomic_load(&s->pid);
        } else if (lowest < 0 || r < lowest) lowest = r;
      }
      int claim = atomic_load(&B.head->claim);
      if (stalled >= 0 || claim) {
        char msg[300], hint[300];
        snprintf(msg, sizeof msg, "rank %d (pid %d) made no progress for --rank-timeout %g s (stopped or frozen): the job was ended, nothing judged",
                 stalled, spid, (double)to / 1e9);
        snprintf(hint, sizeof hint, "a rank that does not run (SIGSTOP, a debugger, a frozen node) holds the others in their next collective; "
                 "--rank-timeout SECONDS sets how long one may (0: never ends the job)");
        int expect = 0;
        if (!claim && stalled >= 0 && lowest == B.rank && atomic_compare_exchange_strong(&B.head->claim, &expect, B.rank + 1)) {
          pthread_mutex_unlock(&B.mu);
          atomic_store(&me->state, BEAT_DONE); /* the others do not take this rank for stopped */
          /* the line is printed before the hook's reports are final, the
           * flag after: the others exit (and mpirun ends the job) only then */
          qc_watchdog_end(msg, hint, 1, said);
        }
        if (claim && atomic_load(&B.head->said)) {
          pthread_mutex_unlock(&B.mu);
          qc_watchdog_end(msg, hint, 0, NULL); /* its line is printed: exit 2 with it */
        }
      }
    }
    long long period = to > 0 && to / 10 < 1000000000LL ? to / 10 : 1000000000LL;
    if (period < 20000000LL) period = 20000000LL;
    struct timespec dl;
    clock_gettime(CLOCK_MONOTONIC, &dl);
    dl.tv_sec += (time_t)(period / 1000000000LL);
    dl.tv_nsec += (long)(period % 1000000000LL);
    if (dl.tv_nsec >= 1000000000L) dl.tv_sec++, dl.tv_nsec -= 1000000000L;
    int r;
    do r = pthread_cond_timedwait(&B.cv, &B.mu, &dl);
    while (r == EINTR);
  }
  pthread_mutex_unlock(&B.mu);
  return NULL;
}

/* This rank's slot stamped and marked running, then the beat thread
 * started. QC_OK or QC_ESYS. */
static int beat_start(void) {
  beat_slot *me = &B.slot[B.lrank];
  atomic_store(&me->ns, mono_ns());
  atomic_store(&me->rank, B.rank);
  atomic_store(&me->pid, (int)getpid());
  atomic_store(&me->state, BEAT_RUN);
  pthread_condattr_t ca;
  if (pthread_condattr_init(&ca) != 0 || pthread_condattr_setclock(&ca, CLOCK_MONOTONIC) != 0 || pthread_cond_init(&B.cv, &ca) != 0)
    return qc_err_sys("rank %d: cannot set up the ranks' heartbeat", B.rank);
  pthread_condattr_destroy(&ca);
  pthread_attr_t at;
  int rc = pthread_attr_init(&at);
  if (!rc) rc = pthread_attr_setstacksize(&at, 256 << 10);
  if (!rc) rc = pthread_create(&B.th, &at, beat_main, NULL);
  pthread_attr_destroy(&at);
  if (rc) return qc_err_sys("rank %d: cannot start the ranks' heartbeat thread: %s", B.rank, strerror(rc));
  pthread_setname_np(B.th, "qc-heartbeat");
  B.started = 1;
  return QC_OK;
}

/* This rank leaves the watch: its slot done, its beat thread joined. */
static void beat_stop(void) {
  if (!B.started) return;
  atomic_store(&B.slot[B.lrank].state, BEAT_DONE);
  pthread_mutex_lock(&B.mu);
  B.stop = 1;
  pthread_cond_signal(&B.cv);
  pthread_mutex_unlock(&B.mu);
  pthread_join(B.th, NULL);
  pthread_cond_destroy(&B.cv);
  B.started = 0;
  B.stop = 0;
}

/* The file segment let go (the watch stopped first): unmapped; its name
 * is left to the PMIx server's cleanup. */
static void beat_file_drop(void) {
  beat_stop();
  if (B.file) munmap(B.head, B.bytes);
  B.head = NULL;
  B.slot = NULL;
  B.file = 0;
  B.path[0] = 0;
}

/* Before MPI_Init: the node's segment file mapped and the watch started,
 * when the environment gives this rank's place and the job's folder
 * (above); otherwise, or when the file cannot be used, nothing (the MPI
 * window takes over after MPI_Init). Never an error. */
static void beat_file_begin(void) {
  const char *dir = getenv("PMIX_SERVER_TMPDIR"), *ns = getenv("PMIX_NAMESPACE");
  int r, lr, ls;
  if (!dir || !dir[0] || !ns || !ns[0] || strlen(ns) > 128 || !env_int("OMPI_COMM_WORLD_RANK", &r) ||
      !env_int("OMPI_COMM_WORLD_LOCAL_RANK", &lr) || !env_int("OMPI_COMM_WORLD_LOCAL_SIZE", &ls) || ls < 1 || ls > 65536 || lr >= ls)
    return;
  char tag[129];
  size_t k = 0;
  for (const char *c = ns; *c; c++) /* the namespace as a file name: letters, digits, '.', '-', else '_' */
    tag[k++] = (*c >= 'a' && *c <= 'z') || (*c >= 'A' && *c <= 'Z') || (*c >= '0' && *c <= '9') || *c == '.' || *c == '-' ? *c : '_';
  tag[k] = 0;
  int n = snprintf(B.path, sizeof B.path, "%s/qatcheck-beat-%s", dir, tag);
  size_t bytes = sizeof(beat_head) + (size_t)ls * sizeof(beat_slot);
  int fd = n > 0 && (size_t)n < sizeof B.path ? open(B.path, O_RDWR | O_CREAT | O_NOFOLLOW | O_CLOEXEC, 0600) : -1;
  struct stat st;
  /* every rank of the node sizes it alike: the one size, or still empty (zeros: no claim, no slot running) */
  int ok = fd >= 0 && fstat(fd, &st) == 0 && S_ISREG(st.st_mode) && st.st_uid == geteuid() &&
           (st.st_size == 0 || st.st_size == (off_t)bytes);
  if (ok && st.st_size == 0) ok = ftruncate(fd, (off_t)bytes) == 0;
  void *p = ok ? mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0) : MAP_FAILED;
  if (fd >= 0) close(fd);
  if (p == MAP_FAILED) {
    B.path[0] = 0;
    return;
  }
  B.head = p;
  B.slot = (beat_slot *)((char *)p + sizeof(beat_head));
  B.bytes = bytes;
  B.file = 1;
  B.rank = r;
  B.lrank = lr;
  B.lsize = ls;
  if (beat_start() != QC_OK) {
    qc_err_clear(); /* the window after MPI_Init tries again, and says why when it fails */
    beat_file_drop();
  }
}

/* After MPI_Init (collective over the node): keep the file segment when
 * every rank of the node mapped it and MPI agrees with the environment on
 * their places; its name removed once all have it. Otherwise the node's
 * window (MPI_Win_allocate_shared), this rank's slot stamped and the beat
 * thread started once every rank of the node has its slot. QC_OK or
 * QC_ESYS. */
static int beat_begin(void) {
  int mine = B.file && B.rank == D.rank && B.lrank == D.local_rank && B.lsize == D.local_size, all = 0;
  MK(MPI_Allreduce(&mine, &all, 1, MPI_INT, MPI_MIN, B.node), "MPI_Allreduce (the ranks' heartbeat)");
  if (all) {
    MK(MPI_Barrier(B.node), "MPI_Barrier (the ranks' heartbeat)"); /* every rank of the node has mapped it */
    if (D.local_rank == 0) unlink(B.path);
    B.path[0] = 0;
    return QC_OK;
  }
  if (B.file) beat_file_drop();
  B.rank = D.rank;
  B.lrank = D.local_rank;
  B.lsize = D.local_size;
  size_t bytes = D.local_rank == 0 ? sizeof(beat_head) + (size_t)D.local_size * sizeof(beat_slot) : 0;
  void *base = NULL, *p0 = NULL;
  MPI_Aint sz = 0;
  int du = 0;
  MK(MPI_Win_allocate_shared((MPI_Aint)bytes, 1, MPI_INFO_NULL, B.node, &base, &B.win), "MPI_Win_allocate_shared (the ranks' heartbeat)");
  MK(MPI_Win_shared_query(B.win, 0, &sz, &du, &p0), "MPI_Win_shared_query (the ranks' heartbeat)");
  B.head = p0;
  B.slot = (beat_slot *)((char *)p0 + sizeof(beat_head));
  if (D.local_rank == 0) {
    atomic_store(&B.head->claim, 0);
    atomic_store(&B.head->said, 0);
  }
  beat_slot *me = &B.slot[D.local_rank];
  atomic_store(&me->ns, mono_ns());
  atomic_store(&me->rank, D.rank);
  atomic_store(&me->pid, (int)getpid());
  atomic_store(&me->state, BEAT_RUN);
  MK(MPI_Barrier(B.node), "MPI_Barrier (the ranks' heartbeat)");
  return beat_start();
}

/* This rank leaves the watch (its slot done), its beat thread joined, the
 * node's segment freed (the window: collective over the node, unless MPI
 * failed). */
static void beat_end(void) {
  int file = B.file;
  if (file) beat_file_drop();
  else beat_stop();
  if (D.broken) return;
  if (B.head && !file) MPI_Win_free(&B.win);
  B.head = NULL;
  MPI_Comm_free(&B.node);
}
#endif

/* A rank timeout given as `subject` ("option '--rank-timeout' is
 * '0.01'"): QC_OK when it is 0 (off) or from QC_RANK_TIMEOUT_MIN to 1e9
 * seconds, else QC_EINPUT with the one line naming the range. */
static int timeout_ok(double seconds, const char *subject) {
  if (!isfinite(seconds) || seconds < 0 || seconds > 1e9)
    return qc_err("%s: expected a number of seconds from 0 (off) to 1e9", subject);
  if (seconds > 0 && seconds < QC_RANK_TIMEOUT_MIN)
    return qc_err("%s: below the minimum of %g s: expected 0 (off) or %g to 1e9 seconds (a rank's heartbeat is stamped "
                  "every tenth of the timeout: a shorter one takes a busy rank for a stopped one)",
                  subject, QC_RANK_TIMEOUT_MIN, QC_RANK_TIMEOUT_MIN);
  return QC_OK;
}

/* The timeout in force, for the beat thread (its period follows it). */
static void set_timeout(double seconds) {
  atomic_store(&B.timeout_ns, (long long)(seconds * 1e9));
  if (B.started) {
    pthread_mutex_lock(&B.mu);
    pthread_cond_signal(&B.cv);
    pthread_mutex_unlock(&B.mu);
  }
}

int qc_dist_rank_timeout(double seconds) {
  char subject[64];
  snprintf(subject, sizeof subject, "option '--rank-timeout' is '%g'", seconds);
  int rc = timeout_ok(seconds, subject);
  if (rc) return rc;
  set_timeout(seconds);
  B.given = 1;
  return QC_OK;
}

int qc_dist_begin(void) {
  if (D.active || D.ended || !launched()) return QC_OK;
#ifdef QC_HAVE_MPI
  /* the environment's timeout (core/number.c: a number from 0 to 1e9),
   * unless --rank-timeout came first (qc_cli_job reads it before MPI
   * starts); a value refused is reported once the job has started, so that
   * its ranks agree on one line */
  const char *env = getenv("QATCHECK_RANK_TIMEOUT");
  char subject[160];
  snprintf(subject, sizeof subject, "environment variable QATCHECK_RANK_TIMEOUT is '%.100s'", env ? env : "");
  double v = -1; /* -1: unset */
  int env_bad = !B.given && (qc_env_num("QATCHECK_RANK_TIMEOUT", -1, &v) != QC_OK || (v >= 0 && timeout_ok(v, subject) != QC_OK));
  if (!env_bad && !B.given && v >= 0) set_timeout(v);
  char env_msg[1024] = "";
  if (env_bad) snprintf(env_msg, sizeof env_msg, "%s", qc_err_msg());
  qc_err_clear();
  beat_file_begin(); /* the watch runs through MPI startup when the environment allows it */
  int provided = 0, e;
  if ((e = MPI_Init_thread(NULL, NULL, MPI_THREAD_FUNNELED, &provided)) != MPI_SUCCESS)
    return qc_err_sys("MPI_Init failed (error %d): started by a process manager, qatcheck could not join its job", e);
  /* errors come back as statuses, never as an abort from inside MPI */
  MK(MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN), "MPI_Comm_set_errhandler");
  MK(MPI_Comm_rank(MPI_COMM_WORLD, &D.rank), "MPI_Comm_rank");
  MK(MPI_Comm_size(MPI_COMM_WORLD, &D.size), "MPI_Comm_size");
  MK(MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, D.rank, MPI_INFO_NULL, &B.node), "MPI_Comm_split_type");
  MK(MPI_Comm_rank(B.node, &D.local_rank), "MPI_Comm_rank (node)");
  MK(MPI_Comm_size(B.node, &D.local_size), "MPI_Comm_size (node)");
  D.active = 1;
  if (D.rank > 0) qc_watchdog_quiet(1); /* a --timeout or a signal on every rank: rank 0's line only */
  if (env_bad) return qc_err("%s", env_msg);
  if ((e = beat_begin())) return e;
  /* the node's cores shared among its ranks, unless told otherwise */
  long ncpu = sysconf(_SC_NPROCESSORS_ONLN);
  int per = ncpu > 0 ? (int)(ncpu / D.local_size) : 1;
  if (per < 1) per = 1;
  if (!getenv("QATCHECK_THREADS")) {
    char v[16];
    snprintf(v, sizeof v, "%d", per);
    setenv("QATCHECK_THREADS", v, 1);
  }
  if (!getenv("OPENBLAS_NUM_THREADS") && !getenv("OMP_NUM_THREADS") && openblas_set_num_threads)
    openblas_set_num_threads(per);
  return QC_OK;
#else
  qc_err("started by a process manager (mpirun), but this qatcheck was built without MPI");
  qc_hint("install Open MPI (libopenmpi-dev) and rebuild (the Makefile prints 'MPI found'), or run qatcheck as one process");
  return QC_EINPUT;
#endif
}

void qc_dist_end(void) {
  if (!D.active || D.ended) return;
  D.ended = 1;
#ifdef QC_HAVE_MPI
  /* no rank leaves before rank 0 has printed and written its reports: a
   * rank's non-zero exit makes mpirun end the job (unless MPI itself failed) */
  if (!D.broken) MPI_Barrier(MPI_COMM_WORLD);
  beat_end();
  MPI_Finalize();
#endif
}

int qc_dist_assign(const double *cost, int n, int *owner) { return qc_dist_assign_n(cost, n, D.size, owner); }

int qc_dist_assign_n(const double *cost, int n, int size, int *owner) {
  if (size <= 1) {
    for (int i = 0; i < n; i++) owner[i] = 0;
    return QC_OK;
  }
  int *ord = malloc((size_t)(n > 0 ? n : 1) * sizeof *ord);
  double *load = calloc((size_t)size, sizeof *load);
  if (!ord || !load) { /* no fallback: every rank must compute the same assignment */
    free(ord);
    free(load);
    return qc_err_sys("rank %d: out of memory assigning %d units to %d ranks", D.rank, n, size);
  }
  for (int i = 0; i < n; i++) ord[i] = i;
  /* decreasing cost, ties by index: an insertion sort keeps it stable and
   * needs no comparison callback state (n is the number of modules) */
  for (int i = 1; i < n; i++) {
    int v = ord[i], j = i - 1;
    while (j >= 0 && cost[ord[j]] < cost[v]) {
      ord[j + 1] = ord[j];
      j--;
    }
    ord[j + 1] = v;
  }
  for (int k = 0; k < n; k++) {
    int best = 0;
    for (int r = 1; r < size; r++)
      if (load[r] < load[best]) best = r;
    owner[ord[k]] = best;
    load[best] += cost[ord[k]] > 0 ? cost[ord[k]] : 1e-300;
  }
  free(ord);
  free(load);
  return QC_OK;
}

/* What each rank tells the others in the agreement. */
typedef struct vote {
  int rc;
  long long at;
  char msg[1536];
  char hint[512];
} vote;

/* Every rank's vote (collective); *pick the rank whose error wins (-1:
 * none), *rc0 rank 0's status. After an agreement that failed no rank
 * calls this again (D.failed): the others have stopped talking. */
static int vote_all(int rc, long long at, int *pick, int *rc0) {
  *pick = -1;
  *rc0 = rc;
#ifdef QC_HAVE_MPI
  int err = rc >= QC_EINPUT;
  vote mine, *all = malloc((size_t)D.size * sizeof *all);
  if (!all) return qc_err_sys("rank %d: out of memory for the agreement", D.rank);
  memset(&mine, 0, sizeof mine);
  mine.rc = rc;
  mine.at = at;
  if (err) {
    snprintf(mine.msg, sizeof mine.msg, "%s", qc_err_msg()[0] ? qc_err_msg() : "the run could not be judged");
    snprintf(mine.hint, sizeof mine.hint, "%s", qc_err_hint());
  }
  int e = MPI_Allgather(&mine, (int)sizeof mine, MPI_BYTE, all, (int)sizeof mine, MPI_BYTE, MPI_COMM_WORLD);
  if (e != MPI_SUCCESS) {
    free(all);
    return mpi_fail("the agreement (MPI_Allgather)", e);
  }
  for (int r = 0; r < D.size; r++)
    if (all[r].rc >= QC_EINPUT && (*pick < 0 || all[r].at < all[*pick].at)) *pick = r;
  *rc0 = all[0].rc;
  if (*pick >= 0) {
    const vote *v = &all[*pick];
    D.failed = 1;
    D.failed_rc = v->rc;
    if (D.size > 1) snprintf(D.msg, sizeof D.msg, "rank %d: %s", *pick, v->msg);
    else snprintf(D.msg, sizeof D.msg, "%s", v->msg);
    snprintf(D.hint, sizeof D.hint, "%s", v->hint);
  }
  free(all);
  return QC_OK;
#else
  (void)at;
  return QC_OK;
#endif
}

/* The agreed error as this rank's one error line; its status. */
static int agreed_error(void) {
  qc_err_clear(); /* replaced: the agreed message is every rank's */
  qc_err("%s", D.msg);
  if (D.hint[0]) qc_hint("%s", D.hint);
  return D.failed_rc;
}

int qc_dist_agree(int rc, long long at) {
  int err = rc >= QC_EINPUT;
  if (!D.active) return err ? rc : QC_OK;
  if (D.failed) return agreed_error();
  int pick, rc0, e = vote_all(err ? rc : QC_OK, at, &pick, &rc0);
  if (e) {
    D.failed = D.broken = 1; /* MPI itself failed: nothing more can be agreed */
    D.failed_rc = e;
    snprintf(D.msg, sizeof D.msg, "%s", qc_err_msg());
    D.hint[0] = 0;
    return e;
  }
  return pick >= 0 ? agreed_error() : QC_OK;
}

int qc_dist_finish(int rc) {
  if (!D.active) return rc;
  if (D.failed) return agreed_error();
  int pick, rc0, e = vote_all(rc, -1, &pick, &rc0);
  if (e) {
    D.failed = D.broken = 1;
    D.failed_rc = e;
    return e;
  }
  if (pick >= 0) return agreed_error();
  return rc0 >= QC_EINPUT ? QC_OK : rc0; /* rank 0's verdict (errors were picked above) */
}

int qc_dist_failed(void) { return D.failed; }

int qc_dist_gather(const void *buf, size_t n, void **all, size_t *lens) {
  *all = NULL;
  if (!D.active || D.size == 1) {
    lens[0] = n;
    if (!(*all = malloc(n ? n : 1))) return qc_err_sys("out of memory gathering results");
    if (n) memcpy(*all, buf, n);
    return QC_OK;
  }
#ifdef QC_HAVE_MPI
  if (n > (size_t)0x7fffffff) return qc_err_sys("rank %d: %zu bytes of results to gather: more than MPI's 2 GiB per rank", D.rank, n);
  int mine = (int)n, *cnt = NULL, *disp = NULL, rc = QC_OK;
  if (D.rank == 0 && (!(cnt = calloc((size_t)D.size, sizeof *cnt)) || !(disp = calloc((size_t)D.size, sizeof *disp)))) {
    free(cnt);
    return qc_err_sys("out of memory gathering results");
  }
  int e = MPI_Gather(&mine, 1, MPI_INT, cnt, 1, MPI_INT, 0, MPI_COMM_WORLD);
  if (e != MPI_SUCCESS) { rc = mpi_fail("gathering result sizes (MPI_Gather)", e); goto done; }
  size_t total = 0;
  if (D.rank == 0) {
    for (int r = 0; r < D.size; r++) {
      if (total + (size_t)cnt[r] > (size_t)0x7fffffff) { rc = qc_err_sys("results over 2 GiB to gather on rank 0"); break; }
      disp[r] = (int)total;
      lens[r] = (size_t)cnt[r];
      total += (size_t)cnt[r];
    }
    if (!rc && !(*all = malloc(total ? total : 1))) rc = qc_err_sys("out of memory gathering results (%zu bytes)", total);
  }
  /* every rank takes part, whatever rank 0 found (it cannot stop the others now) */
  e = MPI_Gatherv(buf, mine, MPI_BYTE, rc ? NULL : *all, cnt, disp, MPI_BYTE, 0, MPI_COMM_WORLD);
  if (!rc && e != MPI_SUCCESS) rc = mpi_fail("gathering results (MPI_Gatherv)", e);
done:
  if (rc) {
    free(*all);
    *all = NULL;
  }
  free(cnt);
  free(disp);
  return rc;
#else
  return qc_err_sys("gather without MPI");
#endif
}

/* Rank 0's n bytes at buf to every rank (collective). */
static int qc_dist_bcast(void *buf, size_t n) {
  if (!D.active || D.size == 1) return QC_OK;
#ifdef QC_HAVE_MPI
  if (n > (size_t)0x7fffffff) return qc_err_sys("broadcast of %zu bytes: more than MPI's 2 GiB", n);
  MK(MPI_Bcast(buf, (int)n, MPI_BYTE, 0, MPI_COMM_WORLD), "MPI_Bcast");
  return QC_OK;
#else
  (void)buf;
  return qc_err_sys("broadcast of %zu bytes without MPI", n);
#endif
}

int qc_dist_device_begin(const qc_backend *be) {
  if (be->host_memory || !be->coll_init || !be->coll_id) return QC_OK;
  unsigned char id[QC_COLL_ID_BYTES];
  if (!D.active) { /* one process: a communicator of one when asked (QATCHECK_NCCL=1) */
    const char *f = getenv("QATCHECK_NCCL");
    if (!f || strcmp(f, "1") != 0) return QC_OK;
    int rc = be->coll_id(be, id, sizeof id);
    return rc ? rc : be->coll_init(be, id, 1, 0);
  }
  int rc = qc_dist_agree(QC_OK, -1); /* every rank is here before the broadcast */
  if (rc) return rc;
  struct {
    int rc;
    char msg[512];
    unsigned char id[QC_COLL_ID_BYTES];
  } b;
  memset(&b, 0, sizeof b);
  if (D.rank == 0 && (b.rc = be->coll_id(be, b.id, sizeof b.id)))
    snprintf(b.msg, sizeof b.msg, "%s", qc_err_msg());
  if ((rc = qc_dist_bcast(&b, sizeof b))) return rc;
  if (b.rc) { /* every rank has the same message: no agreement needed */
    qc_err_clear(); /* replaced: rank 0's message */
    return qc_err_sys("rank 0: %s", b.msg);
  }
  memcpy(id, b.id, sizeof id);
  rc = be->coll_init(be, id, D.size, D.rank);
  return qc_dist_agree(rc, -1);
}

/* ---- host reductions ---------------------------------------------------------------- */

#ifdef QC_HAVE_MPI
/* Element i of buf (dt) as a double, and back. */
static double get(const void *buf, qc_dtype dt, int64_t i) {
  return dt == QC_F64 ? ((const double *)buf)[i] : dt == QC_F32 ? ((const float *)buf)[i] : qc_bf16_to_f32(((const uint16_t *)buf)[i]);
}
static void put(void *buf, qc_dtype dt, int64_t i, double v) {
  if (dt == QC_F64) ((double *)buf)[i] = v;
  else if (dt == QC_F32) ((float *)buf)[i] = (float)v;
  else ((uint16_t *)buf)[i] = qc_f32_to_bf16((float)v);
}
#endif

/* Host reduction over the ranks in rank order, a chunk at a time: each
 * chunk of every rank gathered everywhere, summed in float64 from rank 0 up
 * (or its maximum taken), so every rank gets the same bits whatever MPI's
 * algorithms. */
static int host_allreduce(void *buf, int64_t n, qc_dtype dt, qc_redop op) {
#ifdef QC_HAVE_MPI
  const size_t es = qc_dtype_size(dt);
  const int64_t chunk = ((int64_t)8 << 20) / (int64_t)es;
  char *all = malloc((size_t)D.size * (size_t)chunk * es);
  if (!all) return qc_err_sys("rank %d: out of memory for a host all-reduce", D.rank);
  int rc = QC_OK;
  for (int64_t c0 = 0; c0 < n && !rc; c0 += chunk) {
    int64_t m = n - c0 < chunk ? n - c0 : chunk;
    char *mine = (char *)buf + (size_t)c0 * es;
    int e = MPI_Allgather(mine, (int)((size_t)m * es), MPI_BYTE, all, (int)((size_t)m * es), MPI_BYTE, MPI_COMM_WORLD);
    if (e != MPI_SUCCESS) { rc = mpi_fail("a host all-reduce (MPI_Allgather)", e); break; }
    for (int64_t i = 0; i < m; i++) {
      double s = op == QC_RED_MAX ? -INFINITY : 0;
      for (int r = 0; r < D.size; r++) {
        double v = get(all + (size_t)r * (size_t)m * es, dt, i);
        s = op != QC_RED_MAX ? s + v : v > s || isnan(v) ? v : s;
      }
      put(mine, dt, i, s);
    }
  }
  free(all);
  return rc;
#else
  (void)buf; (void)n; (void)dt; (void)op;
  return qc_err_sys("host all-reduce without MPI");
#endif
}

int qc_dist_allreduce(const qc_backend *be, void *buf, int64_t n, qc_dtype dt) {
  return qc_dist_allreduce_op(be, buf, n, dt, QC_RED_SUM);
}

int qc_dist_allreduce_op(const qc_backend *be, void *buf, int64_t n, qc_dtype dt, qc_redop op) {
  if (dt != QC_F64 && dt != QC_F32 && dt != QC_BF16)
    return qc_err("all-reduce of element type %s: expected float64, float32 or bfloat16", qc_dtype_name(dt));
  if (op != QC_RED_SUM && op != QC_RED_MAX) return qc_err_sys("all-reduce with an unknown operation %d", (int)op);
  if (!be->host_memory && be->allreduce && be->coll_ready && be->coll_ready(be)) return be->allreduce(be, buf, n, dt, op);
  if (!D.active || D.size == 1 || n == 0) return QC_OK;
  if (be->host_memory) return host_allreduce(buf, n, dt, op);
  /* a device without collectives: through the host */
  size_t bytes = (size_t)n * qc_dtype_size(dt);
  void *h = malloc(bytes);
  if (!h) return qc_err_sys("rank %d: out of memory staging an all-reduce (%zu bytes)", D.rank, bytes);
  int rc = be->download(be, h, buf, bytes);
  if (!rc) rc = host_allreduce(h, n, dt, op);
  if (!rc) rc = be->upload(be, buf, h, bytes);
  if (!rc) rc = be->sync(be);
  free(h);
  return rc;
}
