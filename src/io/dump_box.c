/* dump_box.c: the parent's side of the dump sandbox (see dump_priv.h and
 * docs/robustness.md): forks the child that lets libhdf5 parse the file,
 * receives its map of the file, asks it for the reads pread cannot do, and
 * holds it to a deadline. A child that dies, or makes no progress while it
 * burns the deadline's worth of CPU (QATCHECK_HDF5_DEADLINE seconds;
 * by default 4 s plus 1 s per MiB of file, at most 30) or waits ten times as long, is killed, and the dump is
 * refused with one line naming what libhdf5 was reading. CPU time, not
 * wall time, catches the spin: a child starved on a busy machine is not
 * taken for a hung one. */
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include "core/number.h"
#include "core/qc.h"
#include "core/watchdog.h"
#include "io/dump_priv.h"

#define DEADLINE_FLOOR 4.0   /* seconds of CPU for any file: a healthy header walk takes milliseconds */
#define DEADLINE_PER_MIB 1.0 /* and this per MiB of file (more metadata to walk) */
#define DEADLINE_MAX 30.0    /* no single libhdf5 step on a healthy file comes near it */
#define MAX_STR (1u << 20)
#define MAX_LIST 100000 /* strings in a list attribute */

struct qc_box {
  pid_t pid;
  int sock;
  qc_box_shared *sh;
  char path[1024];
  double deadline;
  int dead;                  /* the child is gone: every call repeats msg */
  char msg[1024], hint[512];
  pthread_mutex_t lock;
  unsigned char rbuf[1 << 16];
  size_t rpos, rlen;
};

/* ---- the map ----------------------------------------------------------------- */

void qc_h5map_free(qc_h5map *m) {
  for (int i = 0; i < m->n; i++) {
    for (int j = 0; j < m->o[i].nattr; j++) {
      free(m->o[i].attr[j].name);
      free(m->o[i].attr[j].str);
      for (int k = 0; k < m->o[i].attr[j].nstr; k++) free(m->o[i].attr[j].strs[k]);
      free(m->o[i].attr[j].strs);
    }
    free(m->o[i].attr);
    free(m->o[i].path);
  }
  free(m->o);
  free(m->sorted);
  memset(m, 0, sizeof *m);
}

static int by_path(const void *a, const void *b, void *map) {
  const qc_h5map *m = map;
  return strcmp(m->o[*(const int *)a].path, m->o[*(const int *)b].path);
}

/* Sort the index; QC_ESYS out of memory. */
static int qc_h5map_index(qc_h5map *m) {
  m->sorted = qc_malloc((size_t)(m->n ? m->n : 1) * sizeof *m->sorted, "dump index");
  if (!m->sorted) return QC_ESYS;
  for (int i = 0; i < m->n; i++) m->sorted[i] = i;
  qsort_r(m->sorted, (size_t)m->n, sizeof *m->sorted, by_path, m);
  return QC_OK;
}

/* First position in the sorted index whose path is >= key (prefix length
 * kl: compares only the first kl bytes of key). */
static int lower_bound(const qc_h5map *m, const char *key, size_t kl) {
  int lo = 0, hi = m->n;
  while (lo < hi) {
    int mid = lo + (hi - lo) / 2;
    const char *p = m->o[m->sorted[mid]].path;
    if (strncmp(p, key, kl) < 0) lo = mid + 1;
    else hi = mid;
  }
  return lo;
}

/* path without a trailing '/' (except "/"), into buf; 0 when too long */
static int norm_path(const char *path, char *buf, size_t n) {
  size_t l = strlen(path);
  while (l > 1 && path[l - 1] == '/') l--;
  if (l + 1 > n || l == 0) return 0;
  memcpy(buf, path, l);
  buf[l] = 0;
  return 1;
}

const qc_h5obj *qc_h5map_find(const qc_h5map *m, const char *path) {
  char key[4096];
  if (!m->sorted || !norm_path(path, key, sizeof key)) return NULL;
  size_t kl = strlen(key);
  int i = lower_bound(m, key, kl + 1); /* including the NUL: an exact match */
  if (i < m->n && strcmp(m->o[m->sorted[i]].path, key) == 0) return &m->o[m->sorted[i]];
  return NULL;
}

const qc_h5attr *qc_h5obj_attr(const qc_h5obj *o, const char *name) {
  for (int i = 0; o && i < o->nattr; i++)
    if (strcmp(o->attr[i].name, name) == 0) return &o->attr[i];
  return NULL;
}

int qc_h5map_children(const qc_h5map *m, const char *path, int (*fn)(void *ctx, const qc_h5obj *o), void *ctx) {
  char pre[4096];
  if (!m->sorted || !norm_path(path, pre, sizeof pre - 1)) return 0;
  size_t pl = strlen(pre);
  if (strcmp(pre, "/") != 0) pre[pl++] = '/', pre[pl] = 0;
  for (int i = lower_bound(m, pre, pl); i < m->n; i++) {
    const qc_h5obj *o = &m->o[m->sorted[i]];
    if (strncmp(o->path, pre, pl) != 0) break;
    if (!o->path[pl] || strchr(o->path + pl, '/')) continue; /* the group itself, or deeper */
    int r = fn(ctx, o);
    if (r) return r;
  }
  return 0;
}

/* ---- the child's end of things ------------------------------------------------ */

/* The child's deadline for a file of `size` bytes: seconds of CPU without
 * progress (QATCHECK_HDF5_DEADLINE when set, else a floor plus a share per
 * MiB, capped), so a hung reader of a 7 KB file is stopped in seconds. */
static double deadline_s(int64_t size) {
  double v = qc_env_value("QATCHECK_HDF5_DEADLINE", 0); /* above 0, at most 86400 (core/number.c) */
  if (v > 0) return v;
  double d = floor(DEADLINE_FLOOR + DEADLINE_PER_MIB * (double)(size > 0 ? size : 0) / 1048576.0 + 0.5);
  return d < DEADLINE_MAX ? d : DEADLINE_MAX;
}

/* The sanitizers' death callback (set by a fuzzer): the child must not
 * run it (it would report the parent's input as a crash). */
extern void __sanitizer_set_death_callback(void (*)(void)) __attribute__((weak));

/* In the child, before libhdf5 runs: die with the parent, die by the
 * default action of a crash signal (no handler of the parent's, no core
 * file), print nothing. An interrupting signal (SIGINT, SIGTERM, SIGHUP)
 * the parent ignores (nohup, a shell's background job) is ignored here
 * too: the child never dies of a signal its parent would not. */
static void child_setup(pid_t parent) {
  prctl(PR_SET_PDEATHSIG, SIGKILL);
  if (getppid() != parent) _exit(0);
  static const int sigs[] = {SIGSEGV, SIGBUS, SIGILL, SIGFPE, SIGABRT, SIGSYS, SIGTRAP, SIGALRM, SIGTERM, SIGINT, SIGHUP};
  struct sigaction sa;
  memset(&sa, 0, sizeof sa);
  sa.sa_handler = SIG_DFL;
  for (size_t i = 0; i < sizeof sigs / sizeof sigs[0]; i++) {
    struct sigaction old;
    int interrupt = sigs[i] == SIGINT || sigs[i] == SIGTERM || sigs[i] == SIGHUP;
    if (interrupt && sigaction(sigs[i], NULL, &old) == 0 && old.sa_handler == SIG_IGN) continue;
    sigaction(sigs[i], &sa, NULL);
  }
  sa.sa_handler = SIG_IGN;
  sigaction(SIGPIPE, &sa, NULL);
  sigset_t none;
  sigemptyset(&none);
  sigprocmask(SIG_SETMASK, &none, NULL);
  struct rlimit nocore = {0, 0};
  setrlimit(RLIMIT_CORE, &nocore);
  if (__sanitizer_set_death_callback) __sanitizer_set_death_callback(NULL);
  int dn = open("/dev/null", O_RDWR);
  if (dn >= 0) {
    dup2(dn, 1);
    dup2(dn, 2);
    if (dn > 2) close(dn);
  }
}

static const char *signame(int s) {
  switch (s) {
    case SIGSEGV: return "SIGSEGV";
    case SIGBUS: return "SIGBUS";
    case SIGABRT: return "SIGABRT";
    case SIGFPE: return "SIGFPE";
    case SIGILL: return "SIGILL";
    case SIGKILL: return "SIGKILL";
    default: return "a signal";
  }
}

/* The child is gone or stuck: reap it (killing it first when hung) and
 * set the message every later call repeats. A run being interrupted is
 * not a damaged file: when this process has caught (or has pending) a
 * SIGINT, SIGTERM or SIGHUP, or the child died of one (a Ctrl-C reaches
 * the whole process group; a signal sent to the child alone), the run
 * ends as interrupted (core/watchdog.h), blaming no file. */
static int box_dead(qc_box *b, int hung) {
  if (!b->dead) {
    int st = 0, sig = qc_watchdog_signalled();
    if (sig) qc_watchdog_interrupted(sig);
    if (hung) kill(b->pid, SIGKILL);
    while (waitpid(b->pid, &st, 0) < 0 && errno == EINTR) {}
    if (!hung && WIFSIGNALED(st) && (WTERMSIG(st) == SIGINT || WTERMSIG(st) == SIGTERM || WTERMSIG(st) == SIGHUP))
      qc_watchdog_interrupted(WTERMSIG(st));
    char where[QC_BOX_WHERE];
    memcpy(where, b->sh->where, sizeof where);
    where[sizeof where - 1] = 0;
    if (!where[0]) snprintf(where, sizeof where, "starting");
    if (hung) {
      snprintf(b->msg, sizeof b->msg, "dump '%s': corrupt or unreadable HDF5 (libhdf5 hung for %g s %s)", b->path,
               b->deadline, where);
      snprintf(b->hint, sizeof b->hint,
               "qatcheck's sandboxed reader made no progress in %g s of CPU (or %g s of waiting) and was stopped; a slow "
               "file system may need QATCHECK_HDF5_DEADLINE=SECONDS",
               b->deadline, 10 * b->deadline);
    } else {
      snprintf(b->msg, sizeof b->msg, "dump '%s': corrupt or unreadable HDF5 (libhdf5 crashed %s)", b->path, where);
      if (WIFSIGNALED(st))
        snprintf(b->hint, sizeof b->hint,
                 "libhdf5 died of %s (signal %d) in qatcheck's sandboxed reader: the file is damaged (flipped or "
                 "missing bytes); write or copy it again",
                 signame(WTERMSIG(st)), WTERMSIG(st));
      else
        snprintf(b->hint, sizeof b->hint,
                 "qatcheck's sandboxed reader stopped (status %d): the file is damaged (flipped or missing bytes); "
                 "write or copy it again",
                 WIFEXITED(st) ? WEXITSTATUS(st) : -1);
    }
    b->dead = 1;
  }
  qc_err("%s", b->msg);
  qc_hint("%s", b->hint);
  return QC_EINPUT;
}

/* The child's CPU time in seconds (user + system), or -1 without /proc. */
static double child_cpu_s(pid_t pid) {
  char path[64], buf[1024];
  snprintf(path, sizeof path, "/proc/%d/stat", (int)pid);
  int fd = open(path, O_RDONLY | O_CLOEXEC);
  if (fd < 0) return -1;
  ssize_t n = read(fd, buf, sizeof buf - 1);
  close(fd);
  if (n <= 0) return -1;
  buf[n] = 0;
  const char *p = strrchr(buf, ')'); /* after the command name: state, then fields 4 .. */
  unsigned long long ut = 0, st = 0;
  if (!p || sscanf(p + 1, " %*c %*d %*d %*d %*d %*d %*u %*u %*u %*u %*u %llu %llu", &ut, &st) != 2) return -1;
  long hz = sysconf(_SC_CLK_TCK);
  return (double)(ut + st) / (double)(hz > 0 ? hz : 100);
}

/* Wait until the socket has data, or the child is gone or hung: no
 * progress while it burned `deadline` seconds of CPU (a spin), or for ten
 * times that of wall time (blocked; also the rule without /proc). */
static int box_wait(qc_box *b) {
  uint64_t seen = b->sh->ticks;
  double since = qc_now_s(), cpu0 = child_cpu_s(b->pid);
  for (;;) {
    struct pollfd p = {.fd = b->sock, .events = POLLIN};
    int r = poll(&p, 1, 50);
    if (r > 0) return QC_OK;
    if (r < 0 && errno != EINTR) return qc_err_sys("dump '%s': waiting for the reader: %s", b->path, strerror(errno));
    uint64_t t = b->sh->ticks;
    double now = qc_now_s(), cpu = child_cpu_s(b->pid);
    if (t != seen) {
      seen = t;
      since = now;
      cpu0 = cpu;
    } else if ((cpu0 >= 0 && cpu >= 0 ? cpu - cpu0 >= b->deadline : now - since >= b->deadline) ||
               now - since >= 10 * b->deadline) {
      return box_dead(b, 1);
    }
  }
}

static int box_get(qc_box *b, void *p, size_t n) {
  unsigned char *c = p;
  if (b->dead) return box_dead(b, 0);
  while (n) {
    if (b->rpos == b->rlen) {
      int rc = box_wait(b);
      if (rc) return rc;
      ssize_t r = recv(b->sock, b->rbuf, sizeof b->rbuf, 0);
      if (r < 0 && errno == EINTR) continue;
      if (r <= 0) return box_dead(b, 0);
      b->rpos = 0;
      b->rlen = (size_t)r;
    }
    size_t k = b->rlen - b->rpos < n ? b->rlen - b->rpos : n;
    memcpy(c, b->rbuf + b->rpos, k);
    b->rpos += k;
    c += k;
    n -= k;
  }
  return QC_OK;
}

static int get_u8(qc_box *b, unsigned *v) {
  unsigned char c;
  int rc = box_get(b, &c, 1);
  *v = c;
  return rc;
}

static int get_u64(qc_box *b, uint64_t *v) {
  unsigned char c[8];
  int rc = box_get(b, c, 8);
  *v = 0;
  for (int i = 7; i >= 0; i--) *v = (*v << 8) | c[i];
  return rc;
}

/* A string of at most MAX_STR bytes, malloc'd and NUL-terminated. */
static int get_str(qc_box *b, char **s) {
  unsigned char c[4];
  *s = NULL;
  int rc = box_get(b, c, 4);
  if (rc) return rc;
  uint32_t n = (uint32_t)c[0] | (uint32_t)c[1] << 8 | (uint32_t)c[2] << 16 | (uint32_t)c[3] << 24;
  if (n > MAX_STR) return qc_err("dump '%s': the reader sent a string of %u bytes", b->path, n);
  char *p = qc_malloc(n + 1, "dump map");
  if (!p) return QC_ESYS;
  if ((rc = box_get(b, p, n))) { free(p); return rc; }
  p[n] = 0;
  *s = p;
  return QC_OK;
}

/* A FAIL record: libhdf5 refused without crashing. */
static int box_fail(qc_box *b) {
  unsigned code;
  char *m = NULL;
  int rc = get_u8(b, &code);
  if (!rc) rc = get_str(b, &m);
  if (rc) return rc;
  qc_err("dump '%s': %s", b->path, m);
  if (code == QC_BOX_NOT_HDF5) qc_hint("a dump is written by scripts/qatdump.py or h5py with the schema of docs/interfaces.md section 2");
  free(m);
  return QC_EINPUT;
}

static int read_dataset_rec(qc_box *b, qc_h5dset *h) {
  unsigned u = 0;
  uint64_t v = 0;
  int rc = 0;
#define U8(dst) do { if (!rc) rc = get_u8(b, &u); (dst) = (int)u; } while (0)
#define U64(dst) do { if (!rc) rc = get_u64(b, &v); (dst) = v; } while (0)
  U8(h->tclass);
  U64(h->tsize);
  U8(h->tsigned);
  U8(h->tle);
  U64(h->f_spos); U64(h->f_epos); U64(h->f_esize); U64(h->f_mpos); U64(h->f_msize); U64(h->f_ebias);
  U8(h->native);
  U64(v); h->ndim = (int)(int64_t)v;
  if (rc) return rc;
  if (h->ndim < -1 || h->ndim > 64) return qc_err("dump '%s': the reader sent rank %d", b->path, h->ndim);
  for (int i = 0; i < h->ndim && i < QC_MAXDIM; i++) U64(h->dims[i]);
  U8(h->layout);
  U8(h->nfilters);
  for (int i = 0; i < h->nfilters && i < QC_H5_MAXFILTER; i++) { U64(v); h->filter[i] = (int)(int64_t)v; }
  U8(h->filters_avail);
  U8(h->external);
  U64(v); h->addr = (int64_t)v;
  U64(h->storage);
  U8(h->chunks);
#undef U8
#undef U64
  return rc;
}

/* Receive the map: records until END (or FAIL, or the child's death). */
static int read_map(qc_box *b, qc_h5map *m) {
  for (;;) {
    unsigned tag;
    int rc = get_u8(b, &tag);
    if (rc) return rc;
    if (tag == QC_REC_END) return qc_h5map_index(m);
    if (tag == QC_REC_FAIL) return box_fail(b);
    if (tag == QC_REC_USERBLOCK) {
      if ((rc = get_u64(b, &m->userblock))) return rc;
    } else if (tag == QC_REC_OBJ) {
      if (m->n == m->cap) {
        int cap = m->cap ? 2 * m->cap : 64;
        qc_h5obj *no = realloc(m->o, (size_t)cap * sizeof *no);
        if (!no) return qc_err_sys("out of memory reading the map of dump '%s'", b->path);
        m->o = no;
        m->cap = cap;
      }
      qc_h5obj *o = &m->o[m->n];
      memset(o, 0, sizeof *o);
      unsigned t;
      if ((rc = get_str(b, &o->path))) return rc;
      m->n++;
      if ((rc = get_u8(b, &t))) return rc;
      o->type = (int)t;
      if (o->type == QC_H5O_DATASET && (rc = read_dataset_rec(b, &o->ds))) return rc;
    } else if (tag == QC_REC_ATTR) {
      if (m->n == 0) return qc_err("dump '%s': the reader sent an attribute before any object", b->path);
      qc_h5obj *o = &m->o[m->n - 1];
      qc_h5attr *na = realloc(o->attr, (size_t)(o->nattr + 1) * sizeof *na);
      if (!na) return qc_err_sys("out of memory reading the map of dump '%s'", b->path);
      o->attr = na;
      qc_h5attr *a = &o->attr[o->nattr];
      memset(a, 0, sizeof *a);
      unsigned k;
      uint64_t iv;
      if ((rc = get_str(b, &a->name))) return rc;
      o->nattr++;
      if ((rc = get_u8(b, &k))) return rc;
      a->kind = (int)k;
      if (a->kind == QC_H5A_STR && (rc = get_str(b, &a->str))) return rc;
      if (a->kind == QC_H5A_INT || a->kind == QC_H5A_FLOAT) {
        if ((rc = get_u64(b, &iv))) return rc;
        a->ival = (long long)iv;
        memcpy(&a->dval, &iv, sizeof a->dval);
      }
      if (a->kind == QC_H5A_STRS) {
        if ((rc = get_u64(b, &iv))) return rc;
        if (iv > MAX_LIST) return qc_err("dump '%s': the reader sent a list of %llu strings", b->path, (unsigned long long)iv);
        if (iv && !(a->strs = qc_calloc((size_t)iv, sizeof *a->strs, "dump map"))) return QC_ESYS;
        for (uint64_t j = 0; j < iv; j++) {
          if ((rc = get_str(b, &a->strs[j]))) return rc;
          a->nstr++;
        }
      }
    } else {
      return qc_err("dump '%s': the reader sent an unknown record %u", b->path, tag);
    }
  }
}

/* ---- starting the child --------------------------------------------------------
 * fork() in a process with threads (the watchdog, the readers, MPI's progress
 * threads) copies locks other threads held at that instant: an allocator
 * that does not reset them at fork (the sanitizers' does not) leaves the
 * child waiting forever. So qatcheck's own binary (qc_dump_sandbox_exec)
 * starts the child as a fresh process: the forked copy only clears
 * close-on-exec on the three descriptors it hands over and execs
 * /proc/self/exe with QC_DUMP_SANDBOX_ARG, whose main() calls
 * qc_dump_sandbox_main. Other programs (tests, fuzzers) fork alone. */

static int g_exec_self;

void qc_dump_sandbox_exec(void) { g_exec_self = access("/proc/self/exe", X_OK) == 0; }

int qc_dump_sandbox_main(int argc, char **argv) {
  /* argv: QC_DUMP_SANDBOX_ARG sock fd shared-fd size parent-pid path */
  pid_t parent = argc == 7 ? (pid_t)atoll(argv[5]) : 0;
  qc_box_shared *sh = MAP_FAILED;
  if (argc == 7 && parent == getppid()) sh = mmap(NULL, sizeof *sh, PROT_READ | PROT_WRITE, MAP_SHARED, atoi(argv[3]), 0);
  if (sh == MAP_FAILED) { /* run by hand, not by the dump reader */
    fprintf(stderr, "qatcheck: error: '%s' is qatcheck's own dump reader, started by qatcheck itself: not a verb\n"
                    "hint: run 'qatcheck --help' for the list of verbs\n", QC_DUMP_SANDBOX_ARG);
    _exit(2);
  }
  int sock = atoi(argv[1]), fd = atoi(argv[2]), shfd = atoi(argv[3]);
  long long size = atoll(argv[4]);
  close(shfd);
  child_setup(parent);
  qc_box_child(sock, argv[6], fd, (int64_t)size, sh);
}

/* The shared page: anonymous for a forked child, a memfd (*shfd) for an
 * exec'd one. NULL on failure (errno set). */
static qc_box_shared *shared_page(int *shfd) {
  *shfd = -1;
  if (!g_exec_self) {
    void *p = mmap(NULL, sizeof(qc_box_shared), PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    return p == MAP_FAILED ? NULL : p;
  }
  int f = memfd_create("qatcheck-dump-sandbox", MFD_CLOEXEC);
  if (f < 0) return NULL;
  void *p = MAP_FAILED;
  if (ftruncate(f, sizeof(qc_box_shared)) == 0)
    p = mmap(NULL, sizeof(qc_box_shared), PROT_READ | PROT_WRITE, MAP_SHARED, f, 0);
  if (p == MAP_FAILED) {
    int e = errno;
    close(f);
    errno = e;
    return NULL;
  }
  *shfd = f;
  return p;
}

/* In the forked copy: hand the descriptors over and exec the child (only
 * async-signal-safe calls between fork and exec). Never returns. */
static void exec_child(char *const argv[], const int *keep, int nkeep) {
  for (int i = 0; i < nkeep; i++) {
    int fl = fcntl(keep[i], F_GETFD);
    if (fl < 0 || fcntl(keep[i], F_SETFD, fl & ~FD_CLOEXEC) < 0) _exit(QC_BOX_OPEN);
  }
  execv("/proc/self/exe", argv);
  _exit(QC_BOX_OPEN);
}

int qc_box_start(const char *path, int fd, int64_t size, qc_box **out, qc_h5map *map) {
  *out = NULL;
  memset(map, 0, sizeof *map);
  qc_box *b = qc_calloc(1, sizeof *b, "dump reader");
  if (!b) return QC_ESYS;
  snprintf(b->path, sizeof b->path, "%s", path);
  b->deadline = deadline_s(size);
  b->sock = -1;
  b->pid = -1;
  pthread_mutex_init(&b->lock, NULL);
  int rc, sv[2] = {-1, -1}, shfd = -1;
  if (!(b->sh = shared_page(&shfd))) {
    rc = qc_err_sys("dump '%s': cannot map the reader's page: %s", path, strerror(errno));
    goto fail;
  }
  if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv) != 0) {
    rc = qc_err_sys("dump '%s': cannot make the reader's socket: %s", path, strerror(errno));
    if (shfd >= 0) close(shfd);
    goto fail;
  }
  pid_t parent = getpid();
  /* the exec'd child's arguments, made before the fork */
  char a_sock[16], a_fd[16], a_sh[16], a_size[24], a_parent[24];
  snprintf(a_sock, sizeof a_sock, "%d", sv[1]);
  snprintf(a_fd, sizeof a_fd, "%d", fd);
  snprintf(a_sh, sizeof a_sh, "%d", shfd);
  snprintf(a_size, sizeof a_size, "%lld", (long long)size);
  snprintf(a_parent, sizeof a_parent, "%lld", (long long)parent);
  char *argv[] = {"qatcheck", QC_DUMP_SANDBOX_ARG, a_sock, a_fd, a_sh, a_size, a_parent, (char *)path, NULL};
  const int keep[3] = {sv[1], fd, shfd};
  pid_t pid = fork();
  if (pid == 0) {
    close(sv[0]);
    if (shfd >= 0) exec_child(argv, keep, 3);
    child_setup(parent);
    qc_box_child(sv[1], path, fd, size, b->sh);
  }
  if (shfd >= 0) close(shfd);
  close(sv[1]);
  b->sock = sv[0];
  if (pid < 0) {
    rc = qc_err_sys("dump '%s': cannot start the reader: %s", path, strerror(errno));
    goto fail;
  }
  b->pid = pid;
  if ((rc = read_map(b, map))) goto fail;
  *out = b;
  return QC_OK;
fail:
  qc_h5map_free(map);
  qc_box_stop(b);
  return rc;
}

static int send_all(qc_box *b, const void *p, size_t n) {
  const char *c = p;
  while (n) {
    ssize_t r = send(b->sock, c, n, MSG_NOSIGNAL);
    if (r < 0 && errno == EINTR) continue;
    if (r < 0) return box_dead(b, 0);
    c += r;
    n -= (size_t)r;
  }
  return QC_OK;
}

int qc_box_read(qc_box *b, const char *dset, long long index, int mt, void *buf, size_t nbytes) {
  size_t pl = strlen(dset);
  unsigned char *req = qc_malloc(pl + 22, "read request");
  if (!req) return QC_ESYS;
  req[0] = 'R';
  for (int i = 0; i < 4; i++) req[1 + i] = (unsigned char)((uint64_t)pl >> (8 * i));
  memcpy(req + 5, dset, pl);
  for (int i = 0; i < 8; i++) req[5 + pl + i] = (unsigned char)((uint64_t)index >> (8 * i));
  req[13 + pl] = (unsigned char)mt;
  for (int i = 0; i < 8; i++) req[14 + pl + i] = (unsigned char)((uint64_t)nbytes >> (8 * i));
  pthread_mutex_lock(&b->lock);
  int rc = b->dead ? box_dead(b, 0) : send_all(b, req, pl + 22);
  size_t got = 0;
  int protocol_ok = 0; /* a FAIL record leaves the child ready for the next request */
  while (!rc) {
    unsigned tag;
    uint64_t n;
    if ((rc = get_u8(b, &tag))) break;
    if (tag == QC_REC_DONE) {
      if (got != nbytes) rc = qc_err("dump '%s': dataset '%s': the reader sent %zu of %zu bytes", b->path, dset, got, nbytes);
      break;
    }
    if (tag == QC_REC_FAIL) { rc = box_fail(b); protocol_ok = !b->dead; break; }
    if (tag != QC_REC_PIECE || (rc = get_u64(b, &n))) {
      if (!rc) rc = qc_err("dump '%s': dataset '%s': the reader sent an unknown record", b->path, dset);
      break;
    }
    if (n > nbytes - got) { rc = qc_err("dump '%s': dataset '%s': the reader sent more than %zu bytes", b->path, dset, nbytes); break; }
    rc = box_get(b, (char *)buf + got, (size_t)n);
    got += (size_t)n;
  }
  if (rc && !b->dead && !protocol_ok) { /* out of step with the child: stop it, keep this message */
    kill(b->pid, SIGKILL);
    while (waitpid(b->pid, NULL, 0) < 0 && errno == EINTR) {}
    snprintf(b->msg, sizeof b->msg, "%s", qc_err_msg());
    snprintf(b->hint, sizeof b->hint, "%s", qc_err_hint());
    b->dead = 1;
  }
  pthread_mutex_unlock(&b->lock);
  free(req);
  return rc;
}

void qc_box_stop(qc_box *b) {
  if (!b) return;
  if (b->sock >= 0) close(b->sock);
  if (b->pid > 0 && !b->dead) {
    kill(b->pid, SIGKILL);
    while (waitpid(b->pid, NULL, 0) < 0 && errno == EINTR) {}
  }
  if (b->sh) munmap(b->sh, sizeof *b->sh);
  pthread_mutex_destroy(&b->lock);
  free(b);
}
