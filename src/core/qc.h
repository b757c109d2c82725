/* qc.h: what every part of qatcheck shares: status codes, the one error
 * channel, version. Functions return QC_OK or a status; the first error
 * message set wins and main() prints it as "qatcheck: error: ...". */
#ifndef QC_H
#define QC_H

#include <stddef.h>
#include <stdint.h>

#define QC_VERSION "0.1.0"

/* The qatcheck source commit the binary was built from (`git describe
 * --always --dirty`, embedded by the Makefile; "unknown" when built outside
 * a git checkout). Every report names it beside QC_VERSION. */
const char *qc_build_commit(void);

/* Statuses, chosen to equal the exit codes of the verdict. */
enum {
  QC_OK = 0,      /* fine / verdict pass */
  QC_FAIL = 1,    /* verdict: a defect found */
  QC_EINPUT = 2,  /* cannot judge: bad input, usage, missing data */
  QC_ESYS = 3     /* internal or system failure (out of memory, I/O); exits 2 */
};

/* Set the error message (printf-style). Keeps the first one set since the
 * last qc_err_clear() or qc_err_save(), so the deepest, most specific cause
 * survives.
 * Always returns QC_EINPUT so callers can `return qc_err(...)`. */
int qc_err(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
/* Like qc_err but returns QC_ESYS. */
int qc_err_sys(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
/* Attach a "hint: ..." line to the current error (first one wins). */
void qc_hint(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
const char *qc_err_msg(void);   /* "" when none */
const char *qc_err_hint(void);  /* "" when none */

/* A speculative call (a reference variant, the forward check, a diagnosis's
 * hypothesis, a probe for an optional attribute) may fail without the run
 * failing: its failure is an answer. Such a call runs between
 * qc_err_save, which keeps this thread's message and hint in *s and
 * clears them (so the call's own first error is the one it sets, and
 * qc_err_msg reads it), and one of:
 *   qc_err_restore  the call's failure was an answer: its message is
 *                   dropped and the saved one put back, so an error set
 *                   before the call is never lost;
 *   qc_err_keep     the call's failure is the run's error after all: the
 *                   saved message stays first if there was one (first
 *                   error wins), else the call's.
 *     qc_err_state s;
 *     qc_err_save(&s);
 *     int ok = probe(...) == QC_OK;
 *     qc_err_restore(&s);
 */
typedef struct qc_err_state {
  char msg[1024];
  char hint[512];
} qc_err_state;
void qc_err_save(qc_err_state *s);
void qc_err_restore(const qc_err_state *s);
void qc_err_keep(const qc_err_state *s);
/* Drop the message and hint. Only where that is the semantics, never to
 * end a speculative call: the message was printed or handed on (the end
 * of a run, a rank's error once agreed), it is replaced by a better one
 * (a timeout, an option's own words), or a worker thread starts fresh. */
void qc_err_clear(void);
/* Print the current error (and hint) to stderr in the house format. */
void qc_err_print(void);

/* Allocation that reports failure through qc_err_sys (naming what); a
 * buffer of 32 MB or more gets qc_mem_huge. */
void *qc_malloc(size_t n, const char *what);
void *qc_calloc(size_t n, size_t size, const char *what);
/* Ask for p's n bytes (32 MB or more; a smaller buffer is left alone) to
 * be backed by transparent huge pages, over the 2 MB pages inside it
 * (madvise MADV_HUGEPAGE: where THP is "madvise", the usual default, the
 * heap's buffers get 4 KB pages otherwise). A first touch then faults once
 * a 2 MB page, and the exit releases them at once: on the 2-core VM a
 * fresh 4 GB buffer's first pass took 3.4 to 5.8 s in 4 KB pages and 2.4
 * to 3.6 s in huge ones, and the exit 0.3 s against none. An advice: where
 * the kernel has no THP nothing changes. Returns p. */
void *qc_mem_huge(void *p, size_t n);

/* Keep freed large buffers in the heap for reuse instead of returning them
 * to the system: an audit allocates and frees the same tensor-sized
 * buffers per dY and module, and fresh pages cost a fault and a zeroing
 * each (measured: ~10% of a 2048^3 linear audit, and 10% of a whole
 * Qwen2-MoE audit whose lm_head tensors, 2.5 GB each, were still trimmed
 * under a 2 GB threshold). The heap is never trimmed: the process keeps
 * its high-water mark. Every thread allocates from that one heap (one
 * arena): another thread's arena maps a block over 64 MB afresh and
 * unmaps it when freed (the reader thread's module tensors). Called once
 * by main. */
void qc_mem_tune(void);

/* Seconds on the monotonic clock (for phase timings). */
double qc_now_s(void);

/* Verbosity flags set by the CLI. */
extern int qc_quiet;
extern int qc_verbose;

#endif
