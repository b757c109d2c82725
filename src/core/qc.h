/* qc.h: what every part of qatcheck shares: status codes, the one error
 * channel, version. Functions return QC_OK or a status; the first error
 * message set wins and main() prints it as "qatcheck: error: ...". */
#ifndef QC_H
#define QC_H

#include <stddef.h>
#include <stdint.h>

#define QC_VERSION "0.1.0"

/* Statuses, chosen to equal the exit codes of the verdict. */
enum {
  QC_OK = 0,      /* fine / verdict pass */
  QC_FAIL = 1,    /* verdict: a defect found */
  QC_EINPUT = 2,  /* cannot judge: bad input, usage, missing data */
  QC_ESYS = 3     /* internal or system failure (out of memory, I/O); exits 2 */
};

/* Set the error message (printf-style). Keeps the first one set since the
 * last qc_err_clear(), so the deepest, most specific cause survives.
 * Always returns QC_EINPUT so callers can `return qc_err(...)`. */
int qc_err(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
/* Like qc_err but returns QC_ESYS. */
int qc_err_sys(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
/* Attach a "hint: ..." line to the current error (first one wins). */
void qc_hint(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
const char *qc_err_msg(void);   /* "" when none */
const char *qc_err_hint(void);  /* "" when none */
void qc_err_clear(void);
/* Print the current error (and hint) to stderr in the house format. */
void qc_err_print(void);

/* Allocation that reports failure through qc_err_sys (naming what). */
void *qc_malloc(size_t n, const char *what);
void *qc_calloc(size_t n, size_t size, const char *what);

/* Keep freed large buffers in the heap for reuse instead of returning them
 * to the system: an audit allocates and frees the same tensor-sized
 * buffers per dY and module, and fresh pages cost a fault and a zeroing
 * each (measured: ~10% of a 2048^3 linear audit). Called once by main. */
void qc_mem_tune(void);

/* Seconds on the monotonic clock (for phase timings). */
double qc_now_s(void);

/* Verbosity flags set by the CLI. */
extern int qc_quiet;
extern int qc_verbose;

#endif
