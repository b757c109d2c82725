/* par.h: a parallel for over an index range on plain pthreads, for the
 * host-side passes that sit between GEMMs (quantizers, conversions). The
 * range is cut into one contiguous piece per thread, so each piece's work
 * and result do not depend on the thread count. */
#ifndef QC_PAR_H
#define QC_PAR_H

#include <stdint.h>

/* fn(ctx, lo, hi, tid) over [0, n) cut into at most qc_par_threads()
 * contiguous pieces (tid 0 .. pieces-1, piece tid at n * tid / pieces),
 * each at least `grain` indices. The pieces run on a pool of workers
 * started once, the caller taking pieces too; a call that finds the pool
 * busy (another thread's call, or one from inside a piece) starts threads
 * of its own, and a piece no thread could take runs in the caller. Returns
 * when every piece is done. Safe from any thread and after fork(). */
void qc_par_for(int64_t n, int64_t grain, void (*fn)(void *ctx, int64_t lo, int64_t hi, int tid), void *ctx);

/* The most threads qc_par_for uses (QATCHECK_THREADS when set, a whole
 * number of at least 1, else the online processors, at most this). */
#define QC_PAR_MAX 64
int qc_par_threads(void);

/* The host memory this process may assume, in bytes: QATCHECK_HOST_MEMORY
 * when set (core/number.c), else the physical memory, capped by the
 * container's limit (cgroup v2 memory.max, v1 memory.limit_in_bytes) and
 * shared among this host's ranks of an MPI or Slurm job (their launcher's
 * local size). What the memo keeps and whether a diagnosis fits are
 * sized from it. */
int64_t qc_host_memory(void);

/* OpenBLAS's idle threads spin (sched_yield) for 2^28 clock ticks, about
 * 0.1 s, after each BLAS call before they sleep; the host passes that sit
 * between the audit's GEMMs (qc_par_for above) then share the cores with
 * them: on 2 cores the CPU linear audit took 1.36-1.39 x its BLAS floor,
 * 1.25-1.31 x with 2^16 ticks (bench/cpu_linear.sh). This sets
 * OPENBLAS_THREAD_TIMEOUT to QC_BLAS_SPIN_LOG2 and restarts OpenBLAS's pool
 * so it takes effect; a no-op when the variable is set (the user's value
 * stands) or the BLAS is not OpenBLAS. Call it first
 * thing in main, before any thread starts. */
#define QC_BLAS_SPIN_LOG2 16
void qc_blas_tune(void);

#endif
