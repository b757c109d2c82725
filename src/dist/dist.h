/* dist.h: qatcheck over several processes (docs/distributed.md). Started by
 * a process manager (`mpirun -np N qatcheck vjp|contract ...`), each
 * process is a rank of one MPI job; the engine and the sweep ask this
 * layer who does which unit of work, hand their results to rank 0 through
 * it, and agree through it on whether the run can go on. A unit split
 * across ranks (one module too big for one device) reduces its buffers
 * here: on the host through MPI, on a device through the backend's own
 * collectives (NCCL, behind backend.h).
 *
 * Without MPI at build time, or when not started by a process manager,
 * the run is one process of rank 0 in a world of one, and every function
 * here is trivial: nothing else changes. MPI is called in this layer only
 * (scripts/check-layers.sh). Collective functions (marked so) must be
 * called by every rank in the same order. */
#ifndef QC_DIST_H
#define QC_DIST_H

#include <stddef.h>
#include <stdint.h>

#include "backend/backend.h"
#include "core/tensor.h"

/* Start the job when started by a process manager (mpirun, srun: its
 * environment says so; QATCHECK_MPI=0 never, =1 always): MPI_Init, the
 * world and the node's ranks, each rank's thread budget (the node's cores
 * over its ranks, unless QATCHECK_THREADS says otherwise). QC_OK, or
 * QC_ESYS when MPI cannot start. Idempotent. */
int qc_dist_begin(void);
/* End the job (MPI_Finalize; collective). Idempotent. */
void qc_dist_end(void);
/* 1 when this process was started by a process manager (qc_dist_begin
 * then joins its job); no MPI call. */
int qc_dist_launched(void);
/* This process's rank as the process manager's environment gives it before
 * MPI starts (OMPI_COMM_WORLD_RANK, PMIX_RANK, PMI_RANK, SLURM_PROCID); 0
 * when none does, or when not started by one. No MPI call. */
int qc_dist_env_rank(void);

/* The stall check (docs/distributed.md, "A stopped rank"): from
 * qc_dist_begin to qc_dist_end, a thread of each rank stamps a heartbeat
 * in a segment shared by the ranks of its node (no MPI call off the main
 * thread) and reads the others'. A rank of the node that has not stamped
 * for the rank timeout (stopped, frozen) ends the job: the node's lowest
 * running rank ends its run as an expiry of --timeout does (core/watchdog.h:
 * its error reports, rank 0's being the job's) and prints the one line
 * "rank R (pid P) made no progress for --rank-timeout S s ...", and the
 * node's other running ranks exit 2 without a line. Under Open MPI the
 * segment is a file of the job's PMIx folder and the watch starts before
 * MPI_Init, so a rank stopped inside MPI startup is seen too; elsewhere it
 * starts once MPI_Init has returned. A rank alone on its node is watched
 * by nobody (--timeout still ends the job). */
#define QC_RANK_TIMEOUT_DEFAULT 60.0
/* The shortest rank timeout, in seconds: a rank stamps every tenth of the
 * timeout (at least every 20 ms), and a thread that waits a second for a
 * core on a busy node must not be taken for a stopped rank. */
#define QC_RANK_TIMEOUT_MIN 1.0
/* Set the rank timeout, in seconds (0: the check is off; the default is
 * QATCHECK_RANK_TIMEOUT, else QC_RANK_TIMEOUT_DEFAULT): QC_OK, or
 * QC_EINPUT with one line naming the range when it is neither 0 nor from
 * QC_RANK_TIMEOUT_MIN to 1e9 (QATCHECK_RANK_TIMEOUT is held to the same
 * range by qc_dist_begin). Any time, on any rank, also before
 * qc_dist_begin (then QATCHECK_RANK_TIMEOUT does not replace it). */
int qc_dist_rank_timeout(double seconds);

/* 1 when the run is a job of a process manager (even of one rank). */
int qc_dist_active(void);
int qc_dist_rank(void);        /* 0 when not active */
int qc_dist_size(void);        /* 1 when not active */
int qc_dist_local_rank(void);  /* this rank's index among the ranks on its node */

/* Who does which unit: owner[i] in [0, size) for n units of cost[i] (any
 * positive measure of their work), by longest processing time first:
 * units in decreasing cost (ties: lower index first) each to the rank
 * with the least work so far (ties: the lower rank). The same on every
 * rank; with equal costs it is round robin (unit i to rank i mod size).
 * QC_OK, or QC_ESYS out of memory (no fallback: an assignment that
 * differed between ranks would lose or repeat units). */
int qc_dist_assign(const double *cost, int n, int *owner);
/* The same for a world of `size` ranks. QC_OK, or QC_ESYS (memory). */
int qc_dist_assign_n(const double *cost, int n, int size, int *owner);

/* The agreement (collective): every rank gives its status rc and, when
 * rc is an error (QC_EINPUT, QC_ESYS), the index `at` of the unit of work
 * it failed on (-1: not tied to a unit). When any rank failed, the failing
 * rank with the lowest `at` (ties: the lower rank) is chosen, every rank's
 * error becomes "rank R: <its message>" with its hint (no prefix in a world
 * of one), and its status is returned on every rank; else QC_OK. Statuses
 * below QC_EINPUT (QC_FAIL) are not errors and agree as QC_OK. */
int qc_dist_agree(int rc, long long at);
/* The run's last agreement (collective; the cli calls it once, around the
 * verb): an error of any rank as in qc_dist_agree, else rank 0's status
 * (its verdict: QC_OK or QC_FAIL) on every rank. After an agreement that
 * already failed, the agreed error without talking to the others. A rank
 * that fails before the others reach an agreement meets them here: every
 * agreement is the same exchange, so one rank's early exit never leaves
 * the others waiting. Every collective of this layer must therefore come
 * after an agreement that succeeded (and before the next one). */
int qc_dist_finish(int rc);
/* 1 once an agreement found an error (this job does no more collectives). */
int qc_dist_failed(void);

/* Gather to rank 0 (collective): each rank's n bytes at buf. On rank 0,
 * *all gets their concatenation in rank order (malloc'd; free it) and
 * lens[r] rank r's byte count (lens holds qc_dist_size() entries); other
 * ranks get *all = NULL. QC_OK or QC_ESYS. */
int qc_dist_gather(const void *buf, size_t n, void **all, size_t *lens);

/* The collectives of a device backend (collective): on a backend with
 * coll_init (CUDA built with NCCL), after an agreement, rank 0 makes the
 * communicator's id (ncclGetUniqueId), broadcasts it over MPI and every
 * rank joins (ncclCommInitRank), as nccl-tests bootstraps. In one process
 * (no mpirun), a communicator of one when QATCHECK_NCCL=1, so the device
 * path runs without MPI. A no-op on a host backend or one without
 * collectives. */
int qc_dist_device_begin(const qc_backend *be);

/* Sum buf (n elements of dt: float64, float32 or bfloat16) over the ranks,
 * in place, every rank getting the sum (collective). buf is a buffer of
 * backend be (buf_alloc): on a host-memory backend, an MPI all-reduce in a
 * fixed order (float64 accumulation; the same result on every rank); on a
 * device with collectives (qc_dist_device_begin), the backend's (NCCL, on
 * its stream); on a device without, through the host. In a world of one
 * without device collectives, nothing to do. */
int qc_dist_allreduce(const qc_backend *be, void *buf, int64_t n, qc_dtype dt);
/* The same with the operation: QC_RED_SUM (qc_dist_allreduce), or
 * QC_RED_MAX (the elementwise maximum; NaN wins; ncclMax on a device). */
int qc_dist_allreduce_op(const qc_backend *be, void *buf, int64_t n, qc_dtype dt, qc_redop op);

#endif
