/* watchdog.c: see watchdog.h. A wall-clock interval timer (ITIMER_REAL,
 * SIGALRM); the handler only calls write and _exit (async-signal-safe).
 * Timers are not inherited across fork, so the dump sandbox's child
 * (io/dump_box.c) is never cut by it: its parent enforces its deadline. */
#include "core/watchdog.h"

#include <errno.h>
#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <sys/time.h>
#include <unistd.h>

#include "core/qc.h"

static char g_msg[256];
static volatile size_t g_len;

static void on_alarm(int sig) {
  (void)sig;
  ssize_t w = write(2, g_msg, g_len);
  (void)w;
  _exit(2);
}

int qc_watchdog_arm(double seconds) {
  if (!isfinite(seconds) || seconds < 0 || seconds > 1e9)
    return qc_err("--timeout %g: expected a number of seconds from 0 (no limit) to 1e9", seconds);
  struct itimerval off;
  memset(&off, 0, sizeof off);
  if (setitimer(ITIMER_REAL, &off, NULL) != 0) return qc_err_sys("cannot stop the run's timer: %s", strerror(errno));
  if (seconds == 0) return QC_OK;
  int n = snprintf(g_msg, sizeof g_msg,
                   "qatcheck: error: the run did not finish within --timeout %g s: stopped, nothing judged\n"
                   "hint: raise --timeout (0: no limit) if the run is legitimately long; --verbose shows its phases\n",
                   seconds);
  g_len = n > 0 && (size_t)n < sizeof g_msg ? (size_t)n : strlen(g_msg);
  struct sigaction sa;
  memset(&sa, 0, sizeof sa);
  sa.sa_handler = on_alarm;
  sigemptyset(&sa.sa_mask);
  if (sigaction(SIGALRM, &sa, NULL) != 0) return qc_err_sys("cannot install the run's timer: %s", strerror(errno));
  struct itimerval it;
  memset(&it, 0, sizeof it);
  it.it_value.tv_sec = (time_t)seconds;
  it.it_value.tv_usec = (suseconds_t)((seconds - floor(seconds)) * 1e6);
  if (it.it_value.tv_sec == 0 && it.it_value.tv_usec == 0) it.it_value.tv_usec = 1;
  if (setitimer(ITIMER_REAL, &it, NULL) != 0) return qc_err_sys("cannot start the run's timer: %s", strerror(errno));
  return QC_OK;
}
