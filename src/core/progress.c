/* progress.c: see progress.h. */
#include "core/progress.h"

#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "core/qc.h"

void qc_progress_start(qc_progress *p, const char *what, const char *unit, int64_t total) {
  memset(p, 0, sizeof *p);
  p->what = what;
  p->unit = unit;
  p->total = total;
  p->t0 = qc_now_s();
  p->drawn = p->t0;
  p->on = !qc_quiet && total > 1 && isatty(2);
}

/* "1:05", "12 s": a duration for the ETA. */
static void fmt_secs(double s, char *buf, int n) {
  if (s < 0 || s != s) s = 0;
  long t = (long)(s + 0.5);
  if (t < 60) snprintf(buf, (size_t)n, "%ld s", t);
  else if (t < 3600) snprintf(buf, (size_t)n, "%ld:%02ld", t / 60, t % 60);
  else snprintf(buf, (size_t)n, "%ld:%02ld:%02ld", t / 3600, t / 60 % 60, t % 60);
}

void qc_progress_line(const qc_progress *p, int64_t done, double elapsed, const char *item, char *buf, int n) {
  double rate = elapsed > 0 ? (double)done / elapsed : 0;
  char eta[32] = "?";
  if (done > 0 && rate > 0) fmt_secs((double)(p->total - done) / rate, eta, sizeof eta);
  int k = snprintf(buf, (size_t)n, "%s: %lld/%lld %s (%d%%), %.3g %s/s, ETA %s", p->what, (long long)done,
                   (long long)p->total, p->unit, p->total ? (int)(100 * done / p->total) : 100, rate, p->unit, eta);
  if (item && item[0] && k > 0 && k < n) {
    /* the tail of a long name: the end says most (".layers.7.mlp.down_proj") */
    int room = n - k - 4, l = (int)strlen(item);
    if (room > 48) room = 48;
    if (room > 3) snprintf(buf + k, (size_t)(n - k), ": %s%s", l > room ? "..." : "", l > room ? item + l - room + 3 : item);
  }
}

void qc_progress_step(qc_progress *p, int64_t done, const char *item) {
  p->done = done;
  if (!p->on) return;
  double now = qc_now_s();
  if (now - p->drawn < 0.2 && done < p->total) return;
  p->drawn = now;
  char line[256];
  qc_progress_line(p, done, now - p->t0, item, line, sizeof line);
  fprintf(stderr, "\r\033[K%s", line);
  fflush(stderr);
  p->shown = 1;
}

void qc_progress_end(qc_progress *p) {
  if (p->on && p->shown) {
    fprintf(stderr, "\r\033[K");
    fflush(stderr);
  }
  p->shown = 0;
  p->on = 0;
}
