/* err.c: the single error channel (see qc.h). */
#include "core/qc.h"

#include <errno.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <malloc.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

int qc_quiet = 0;
int qc_verbose = 0;

/* per thread: a reader thread's error never garbles the main thread's */
static _Thread_local char g_msg[1024];
static _Thread_local char g_hint[512];

static void vset(char *buf, size_t n, const char *fmt, va_list ap) {
  if (buf[0]) return; /* first error wins */
  vsnprintf(buf, n, fmt, ap);
}

int qc_err(const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  vset(g_msg, sizeof g_msg, fmt, ap);
  va_end(ap);
  return QC_EINPUT;
}

int qc_err_sys(const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  vset(g_msg, sizeof g_msg, fmt, ap);
  va_end(ap);
  return QC_ESYS;
}

void qc_hint(const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  vset(g_hint, sizeof g_hint, fmt, ap);
  va_end(ap);
}

const char *qc_err_msg(void) { return g_msg; }
const char *qc_err_hint(void) { return g_hint; }
void qc_err_clear(void) { g_msg[0] = 0; g_hint[0] = 0; }

_Static_assert(sizeof(((qc_err_state *)0)->msg) == sizeof g_msg && sizeof(((qc_err_state *)0)->hint) == sizeof g_hint,
               "qc_err_state holds the whole channel");

void qc_err_save(qc_err_state *s) {
  memcpy(s->msg, g_msg, sizeof g_msg);
  memcpy(s->hint, g_hint, sizeof g_hint);
  qc_err_clear();
}

void qc_err_restore(const qc_err_state *s) {
  memcpy(g_msg, s->msg, sizeof g_msg);
  memcpy(g_hint, s->hint, sizeof g_hint);
}

void qc_err_keep(const qc_err_state *s) {
  if (s->msg[0]) qc_err_restore(s); /* the earlier error stays first, with its own hint */
}

/* Print s with control characters escaped, so a message stays one line
 * whatever names (files, groups, datasets) it quotes, in one write(2):
 * a signal's exit between two pieces cannot cut the line. */
static void put_line(const char *prefix, const char *s) {
  char buf[32 + 4 * sizeof g_msg]; /* the prefix, then each byte as at most "\xHH" */
  size_t n = (size_t)snprintf(buf, 32, "%s", prefix);
  for (const unsigned char *p = (const unsigned char *)s; *p && n + 6 < sizeof buf; p++) {
    if (*p == '\n') n += (size_t)snprintf(buf + n, 3, "\\n");
    else if (*p < 0x20 || *p == 0x7f) n += (size_t)snprintf(buf + n, 5, "\\x%02x", *p);
    else buf[n++] = (char)*p;
  }
  buf[n++] = '\n';
  fflush(stderr);
  for (size_t off = 0; off < n;) {
    ssize_t w = write(STDERR_FILENO, buf + off, n - off);
    if (w <= 0) break;
    off += (size_t)w;
  }
}

void qc_err_print(void) {
  put_line("qatcheck: error: ", g_msg[0] ? g_msg : "unknown error");
  if (g_hint[0]) put_line("hint: ", g_hint);
}

void *qc_mem_huge(void *p, size_t n) {
  const uintptr_t hp = (uintptr_t)2 << 20;
  if (p && n >= ((size_t)32 << 20)) {
    const uintptr_t a = ((uintptr_t)p + hp - 1) & ~(hp - 1), e = ((uintptr_t)p + n) & ~(hp - 1);
    const int saved = errno; /* advice: EINVAL without THP is fine, and no later message may read it */
    if (e > a) (void)madvise((void *)a, (size_t)(e - a), MADV_HUGEPAGE);
    errno = saved;
  }
  return p;
}

void *qc_malloc(size_t n, const char *what) {
  void *p = malloc(n ? n : 1);
  if (!p) qc_err_sys("out of memory: %zu bytes for %s", n, what);
  return qc_mem_huge(p, n);
}

void *qc_calloc(size_t n, size_t size, const char *what) {
  void *p = calloc(n ? n : 1, size ? size : 1);
  if (!p) qc_err_sys("out of memory: %zu x %zu bytes for %s", n, size, what);
  return qc_mem_huge(p, n * size);
}

void qc_mem_tune(void) {
  mallopt(M_MMAP_MAX, 0);               /* large buffers from the heap ... */
  mallopt(M_TRIM_THRESHOLD, -1);         /* ... and kept there when freed (-1: never trimmed) */
  mallopt(M_ARENA_MAX, 1);               /* every thread's too: another arena maps a block over 64 MB afresh */
}

double qc_now_s(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}
