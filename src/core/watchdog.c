/* watchdog.c: see watchdog.h. A thread waits on a condition variable until
 * the deadline (CLOCK_MONOTONIC); it is started by the first arm. On
 * expiry it holds the watchdog's mutex, so it never runs while a report
 * writer holds it (qc_watchdog_hold), calls the expiry hook (the run's
 * error reports), prints the error line and ends the process with exit 2.
 * Threads are not inherited across fork, so the dump sandbox's child
 * (io/dump_box.c) is never cut by it: its parent enforces its deadline. */
#include "core/watchdog.h"

#include <errno.h>
#include <math.h>
#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "core/qc.h"

/* How much later a quiet process's limit expires (qc_watchdog_quiet): the
 * ranks of a job arm --timeout at about the same time, and the first to
 * exit makes mpirun end the others with SIGTERM; rank 0's expiry, its line
 * and its report, must come first. */
#define QUIET_GRACE_S 5.0

static pthread_mutex_t g_mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t g_cv;
static int g_started, g_armed;
static struct timespec g_deadline;
static char g_msg[256], g_hint[200];
static qc_watchdog_fn g_hook;
static void *g_hook_ctx;             /* the hook's context (the run): set and unset with g_hook */
static int g_quiet;                  /* qc_watchdog_quiet: the lines not printed */
static int g_sigpipe[2] = {-1, -1};  /* the signal handler's byte goes in [1], the signal thread reads [0] */
static volatile sig_atomic_t g_caught; /* the first signal the handler caught (0: none yet) */
static int g_catching[NSIG];         /* 1: this signal's handler is on_signal */

/* The error line and hint on stderr (one write), unless quiet. */
static void say(const char *msg, const char *hint) {
  if (g_quiet) return;
  char line[640];
  int n = snprintf(line, sizeof line, "qatcheck: error: %s\nhint: %s\n", msg, hint);
  ssize_t w = write(2, line, n > 0 && (size_t)n < sizeof line ? (size_t)n : strlen(line));
  (void)w;
}

/* The watchdog thread: sleeps until the deadline, re-reading it whenever
 * it is re-armed; never returns once it expires. */
static void *watch(void *arg) {
  (void)arg;
  pthread_mutex_lock(&g_mu);
  for (;;) {
    if (!g_armed) {
      pthread_cond_wait(&g_cv, &g_mu);
      continue;
    }
    int r = pthread_cond_timedwait(&g_cv, &g_mu, &g_deadline);
    struct timespec now;
    clock_gettime(CLOCK_MONOTONIC, &now);
    if (r == ETIMEDOUT && g_armed &&
        (now.tv_sec > g_deadline.tv_sec || (now.tv_sec == g_deadline.tv_sec && now.tv_nsec >= g_deadline.tv_nsec)))
      break;
  }
  /* expired, holding the mutex: no report is being committed */
  if (g_hook) g_hook(g_hook_ctx, g_msg, g_hint);
  say(g_msg, g_hint);
  _exit(2);
}

/* Start the thread once (its condition variable on the monotonic clock). */
static int start_locked(void) {
  if (g_started) return QC_OK;
  pthread_condattr_t ca;
  if (pthread_condattr_init(&ca) != 0 || pthread_condattr_setclock(&ca, CLOCK_MONOTONIC) != 0 ||
      pthread_cond_init(&g_cv, &ca) != 0)
    return qc_err_sys("cannot set up the run's timer");
  pthread_condattr_destroy(&ca);
  pthread_attr_t at;
  pthread_t th;
  int rc = pthread_attr_init(&at);
  if (!rc) rc = pthread_attr_setdetachstate(&at, PTHREAD_CREATE_DETACHED);
  if (!rc) rc = pthread_attr_setstacksize(&at, 256 << 10);
  if (!rc) rc = pthread_create(&th, &at, watch, NULL);
  pthread_attr_destroy(&at);
  if (rc) return qc_err_sys("cannot start the run's timer: %s", strerror(rc));
  g_started = 1;
  return QC_OK;
}

int qc_watchdog_arm(double seconds) {
  if (!isfinite(seconds) || seconds < 0 || seconds > 1e9)
    return qc_err("--timeout %g: expected a number of seconds from 0 (no limit) to 1e9", seconds);
  pthread_mutex_lock(&g_mu);
  int rc = QC_OK;
  g_armed = 0;
  if (seconds > 0 && !(rc = start_locked())) {
    snprintf(g_msg, sizeof g_msg, "the run did not finish within --timeout %g s: stopped, nothing judged", seconds);
    snprintf(g_hint, sizeof g_hint, "raise --timeout (0: no limit) if the run is legitimately long; --verbose shows its phases");
    clock_gettime(CLOCK_MONOTONIC, &g_deadline);
    double wait = seconds + (g_quiet ? QUIET_GRACE_S : 0); /* a quiet rank after the speaking one */
    double whole = floor(wait);
    g_deadline.tv_sec += (time_t)whole;
    g_deadline.tv_nsec += (long)((wait - whole) * 1e9);
    if (g_deadline.tv_nsec >= 1000000000L) {
      g_deadline.tv_sec++;
      g_deadline.tv_nsec -= 1000000000L;
    }
    g_armed = 1;
  }
  if (g_started) pthread_cond_signal(&g_cv);
  pthread_mutex_unlock(&g_mu);
  return rc;
}

void qc_watchdog_hook(qc_watchdog_fn fn, void *ctx) {
  pthread_mutex_lock(&g_mu);
  g_hook = fn;
  g_hook_ctx = fn ? ctx : NULL;
  pthread_mutex_unlock(&g_mu);
}

static void end_by_signal(int signo) __attribute__((noreturn));

void qc_watchdog_hold(void) {
  pthread_mutex_lock(&g_mu);
  int sig = g_hook ? qc_watchdog_signalled() : 0;
  if (sig) { /* a report about to be written while the run is being interrupted: the interruption's */
    pthread_mutex_unlock(&g_mu);
    end_by_signal(sig);
  }
}

void qc_watchdog_release(int disarm) {
  if (disarm) {
    g_armed = 0;
    g_hook = NULL;
    g_hook_ctx = NULL;
  }
  pthread_mutex_unlock(&g_mu);
}

/* The handler of SIGINT, SIGTERM and SIGHUP: hands the signal's number to
 * the signal thread through the pipe (write is async-signal-safe); errno
 * is kept for the code it interrupted. */
static void on_signal(int signo) {
  int saved = errno;
  if (!g_caught) g_caught = signo;
  unsigned char b = (unsigned char)signo;
  ssize_t w = write(g_sigpipe[1], &b, 1);
  (void)w;
  errno = saved;
}

/* End the run as interrupted by signal signo, from any thread that does
 * not hold the watchdog: once no report is being committed, the hook's
 * error reports, the line "the run was interrupted by SIGINT (signal 2):
 * nothing judged" (unless quiet), exit 128 + signo. Several threads may
 * race here (the signal thread, a reader that saw the dump sandbox's child
 * die of the same Ctrl-C): the first one ends the process, the others
 * wait on the mutex until it is gone. */
static void end_by_signal(int signo) {
  char msg[200];
  const char *name = signo == SIGINT ? "SIGINT" : signo == SIGTERM ? "SIGTERM" : signo == SIGHUP ? "SIGHUP" : "a signal";
  snprintf(msg, sizeof msg, "the run was interrupted by %s (signal %d): nothing judged", name, signo);
  const char *hint = "the requested reports hold this error report; rerun to get a verdict";
  pthread_mutex_lock(&g_mu); /* a report commit under way finishes first */
  if (g_hook) g_hook(g_hook_ctx, msg, hint);
  say(msg, hint);
  _exit(128 + signo);
}

/* The signal thread: waits for a byte from the handler, then ends the run
 * (end_by_signal). Never returns once a signal arrives. */
static void *sig_watch(void *arg) {
  (void)arg;
  unsigned char b = 0;
  for (;;) {
    ssize_t r = read(g_sigpipe[0], &b, 1);
    if (r == 1) break;
    if (r < 0 && errno == EINTR) continue;
    return NULL; /* the pipe is gone: nothing more to watch */
  }
  end_by_signal(b);
}

int qc_watchdog_signalled(void) {
  if (g_sigpipe[0] < 0) return 0; /* not catching signals */
  if (g_caught) return g_caught;
  sigset_t p;
  if (sigpending(&p) != 0) return 0;
  static const int sigs[] = {SIGINT, SIGTERM, SIGHUP};
  for (size_t i = 0; i < sizeof sigs / sizeof sigs[0]; i++)
    if (g_catching[sigs[i]] && sigismember(&p, sigs[i])) return sigs[i];
  return 0;
}

void qc_watchdog_interrupted(int signo) {
  int sig = qc_watchdog_signalled(); /* the signal this process caught, when it did */
  end_by_signal(sig ? sig : signo);
}

int qc_watchdog_signals(void) {
  static const int sigs[] = {SIGINT, SIGTERM, SIGHUP};
  if (g_sigpipe[0] >= 0) return QC_OK;
  if (pipe2(g_sigpipe, O_CLOEXEC) != 0) return qc_err_sys("cannot set up the run's signal handling: %s", strerror(errno));
  pthread_attr_t at;
  pthread_t th;
  int rc = pthread_attr_init(&at);
  if (!rc) rc = pthread_attr_setdetachstate(&at, PTHREAD_CREATE_DETACHED);
  if (!rc) rc = pthread_attr_setstacksize(&at, 256 << 10);
  if (!rc) rc = pthread_create(&th, &at, sig_watch, NULL);
  pthread_attr_destroy(&at);
  if (rc) return qc_err_sys("cannot start the run's signal thread: %s", strerror(rc));
  struct sigaction sa;
  memset(&sa, 0, sizeof sa);
  sa.sa_handler = on_signal;
  sa.sa_flags = SA_RESTART;
  sigfillset(&sa.sa_mask);
  for (size_t i = 0; i < sizeof sigs / sizeof sigs[0]; i++) {
    struct sigaction old;
    if (sigaction(sigs[i], NULL, &old) != 0) return qc_err_sys("cannot read the handler of signal %d: %s", sigs[i], strerror(errno));
    if (old.sa_handler == SIG_IGN) continue; /* started under nohup (or told to ignore it): keep ignoring it */
    if (sigaction(sigs[i], &sa, NULL) != 0) return qc_err_sys("cannot catch signal %d: %s", sigs[i], strerror(errno));
    g_catching[sigs[i]] = 1;
  }
  return QC_OK;
}


void qc_watchdog_end(const char *msg, const char *hint, int print, void (*done)(void)) {
  pthread_mutex_lock(&g_mu); /* a report commit under way finishes first */
  if (g_hook) g_hook(g_hook_ctx, msg, hint);
  g_quiet = !print;
  say(msg, hint);
  if (done) done();
  _exit(2);
}

void qc_watchdog_quiet(int quiet) {
  pthread_mutex_lock(&g_mu);
  g_quiet = quiet != 0;
  pthread_mutex_unlock(&g_mu);
}
