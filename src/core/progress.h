/* progress.h: one progress line on stderr for long runs (a contract sweep,
 * a multi-module vjp, an sft over big logs): done / total, rate and ETA,
 * redrawn in place a few times a second. Only when stderr is a terminal
 * and --quiet is off: in a CI log or a pipe it prints nothing at all.
 *
 *   qc_progress p;
 *   qc_progress_start(&p, "vjp", "modules", n);
 *   for (i = 0; i < n; i++) { ...; qc_progress_step(&p, i + 1, name); }
 *   qc_progress_end(&p);
 */
#ifndef QC_PROGRESS_H
#define QC_PROGRESS_H

#include <stdint.h>

typedef struct qc_progress {
  const char *what, *unit;  /* "vjp", "modules" */
  int64_t total, done;
  double t0, drawn;         /* start; last redraw (qc_now_s) */
  int on;                   /* drawing at all */
  int shown;                /* a line is on the screen */
} qc_progress;

/* Start counting `total` units; on when stderr is a terminal and not quiet. */
void qc_progress_start(qc_progress *p, const char *what, const char *unit, int64_t total);
/* `done` units finished, the last one named `item` (may be NULL); redraws at
 * most every 0.2 s, and at the last unit. */
void qc_progress_step(qc_progress *p, int64_t done, const char *item);
/* Format the line for done units after `elapsed` seconds into buf (for the
 * tests; what qc_progress_step draws). */
void qc_progress_line(const qc_progress *p, int64_t done, double elapsed, const char *item, char *buf, int n);
/* Clear the line (if one is shown). */
void qc_progress_end(qc_progress *p);

#endif
