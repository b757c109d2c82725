/* par.h: a parallel for over an index range on plain pthreads, for the
 * host-side passes that sit between GEMMs (quantizers, conversions). The
 * range is cut into one contiguous piece per thread, so each piece's work
 * and result do not depend on the thread count. */
#ifndef QC_PAR_H
#define QC_PAR_H

#include <stdint.h>

/* fn(ctx, lo, hi, tid) over [0, n) cut into at most qc_par_threads()
 * contiguous pieces (tid 0 .. pieces-1), each at least `grain` indices;
 * the caller's thread runs piece 0. Returns when every piece is done. A
 * thread that cannot be started runs its piece in the caller instead. */
void qc_par_for(int64_t n, int64_t grain, void (*fn)(void *ctx, int64_t lo, int64_t hi, int tid), void *ctx);

/* The most threads qc_par_for uses (QATCHECK_THREADS when set, a whole
 * number of at least 1, else the online processors, at most this). */
#define QC_PAR_MAX 64
int qc_par_threads(void);

#endif
