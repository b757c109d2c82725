/* watchdog.h: the run's overall time limit (`--timeout SECONDS` on every
 * verb). Whatever hangs (a file system that stops answering, a plugin that
 * loops, a library stuck on a corrupt file outside the dump sandbox), the
 * run ends with exit 2 and one error line once the limit has passed,
 * instead of holding a CI runner until its own limit; the requested report
 * paths then hold its error report, as for any exit 2 (the expiry hook). */
#ifndef QC_WATCHDOG_H
#define QC_WATCHDOG_H

/* The default limit, in seconds (6 hours): far beyond any audit measured
 * (bench/RESULTS.md: a 32-layer contract sweep on 16 CPU cores takes under
 * 3 minutes), short of a CI runner's own limit. */
#define QC_TIMEOUT_DEFAULT 21600.0

/* Arm (or re-arm) the watchdog: `seconds` of wall-clock time from now; 0
 * turns it off. On expiry its own thread calls the hook (when one is set)
 * with the error line and hint, writes "qatcheck: error: the run did not
 * finish within --timeout S s ..." and the hint to stderr and exits 2.
 * QC_EINPUT for a negative or non-finite limit, QC_ESYS when its thread
 * cannot be started. */
int qc_watchdog_arm(double seconds);

/* What to do on expiry before the exit (the report layer writes the run's
 * error reports: report/run.c); NULL for nothing. It runs on the
 * watchdog's thread while the main thread may still be working, never
 * while a writer holds the watchdog (below), and gets ctx as given: the
 * watchdog keeps the one process-wide pointer to it (a timer thread or a
 * signal has no other way to reach the run), until released disarmed. */
typedef void (*qc_watchdog_fn)(void *ctx, const char *msg, const char *hint);
void qc_watchdog_hook(qc_watchdog_fn fn, void *ctx);

/* Hold off the expiry while a report is committed (so the hook never sees
 * one half-renamed); release with disarm 1 once the run's verdict is
 * written (the watchdog must not replace it: it is off and its hook unset),
 * 0 otherwise. Not nested, and no other watchdog call while held. While a
 * hook is set and a signal has been caught or is pending
 * (qc_watchdog_signalled), the hold never returns: the run ends as
 * interrupted (qc_watchdog_interrupted), so a report about to be written
 * as the run is interrupted is the interruption's error report. */
void qc_watchdog_hold(void);
void qc_watchdog_release(int disarm);

/* Catch SIGINT, SIGTERM and SIGHUP (those not ignored when the run
 * started): the handler only writes the signal's number to a pipe; a
 * thread reading it ends the run as an expiry does (the hook's error
 * reports, never during a report commit), with the line "qatcheck: error:
 * the run was interrupted by SIGTERM (signal 15): nothing judged" and exit
 * 128 + the signal's number. SIGKILL cannot be caught (docs/ci.md).
 * QC_ESYS when the pipe, thread or handlers cannot be set up. */
int qc_watchdog_signals(void);

/* The number of the signal (SIGINT, SIGTERM, SIGHUP) this process has
 * caught (qc_watchdog_signals), or of one pending for it and not yet
 * handled; 0 when none, or when signals are not caught. Any thread. */
int qc_watchdog_signalled(void);

/* End the run as interrupted, from any thread that does not hold the
 * watchdog, as a caught signal does (the hook's error reports once no
 * report is being committed, the line, exit 128 + the number): by the
 * signal this process caught, if any, else by signo. For a signal that
 * reached a child of the run instead (the dump sandbox's reader killed by
 * SIGINT is an interrupted run, not a damaged file). Never returns. */
void qc_watchdog_interrupted(int signo) __attribute__((noreturn));

/* End the run now, from a thread other than the main one, as an expiry
 * does: once no report is being committed, the hook (msg, hint), then the
 * error line and hint on stderr when `print` is 1 (nothing printed when 0),
 * then `done` (when not NULL), and exit 2. Never returns. The job's stall
 * check (dist/dist.h) ends a rank this way. */
void qc_watchdog_end(const char *msg, const char *hint, int print, void (*done)(void)) __attribute__((noreturn));

/* 1: the watchdog's own lines (an expiry, a signal) are not printed, the
 * hook still runs, and a limit armed from then on expires 5 s later than
 * asked. The ranks of an MPI job other than rank 0 are quiet, so a
 * --timeout or a Ctrl-C that reaches every rank prints one line, and a
 * --timeout that ends the job is rank 0's (its line and error report; the
 * others, later, only when rank 0 is not running). */
void qc_watchdog_quiet(int quiet);

#endif
