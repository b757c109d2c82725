/* watchdog.h: the run's overall time limit (`--timeout SECONDS` on every
 * verb). Whatever hangs (a file system that stops answering, a plugin that
 * loops, a library stuck on a corrupt file outside the dump sandbox), the
 * run ends with exit 2 and one error line once the limit has passed,
 * instead of holding a CI runner until its own limit. */
#ifndef QC_WATCHDOG_H
#define QC_WATCHDOG_H

/* The default limit, in seconds (6 hours): far beyond any audit measured
 * (bench/RESULTS.md: a 32-layer contract sweep on 16 CPU cores takes under
 * 3 minutes), short of a CI runner's own limit. */
#define QC_TIMEOUT_DEFAULT 21600.0

/* Arm (or re-arm) the watchdog: `seconds` of wall-clock time from now; 0
 * turns it off. On expiry, from a signal handler, it writes
 * "qatcheck: error: the run did not finish within --timeout S s ..." and a
 * hint to stderr and exits 2 at once: no report is written after that
 * moment (one already renamed into place stays; a report writer that must
 * not be cut in half disarms it first with qc_watchdog_arm(0)). QC_EINPUT
 * for a negative or non-finite limit, QC_ESYS when the timer cannot be
 * set. */
int qc_watchdog_arm(double seconds);

#endif
