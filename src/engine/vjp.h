/* vjp.h: layer 1 over a whole case (the `vjp` verb's run): every module
 * instance the case names, generated or read from its dump, audited into
 * a->res. */
#ifndef QC_ENGINE_VJP_H
#define QC_ENGINE_VJP_H

#include "engine/audit.h"

/* Run case a->cs: generated instances (its shapes, seed, values, dY kinds)
 * or its dump's matching module groups. profile (NULL: none) is --profile,
 * set over every module's contract. Checks go to a->res; QC_EINPUT/QC_ESYS
 * with the error set when the run cannot be judged. */
int qc_vjp_case(qc_audit *a, const char *profile);

/* ---- over the ranks of an MPI job (vjp_dist.c; docs/distributed.md) -----------
 * The units of a case (its generated instances, or its dump's matching
 * module groups, in order) go round robin to the ranks: *owner (malloc'd,
 * n entries) gets unit i's rank, i mod size; all 0 in one process. */
int qc_vjp_units(int n, int **owner);
/* After the ranks ran their units (rc their status, at the unit a rank
 * failed on): the agreement (an error of any rank, named by rank, on every
 * rank), then every rank's checks and module facts to rank 0, in unit
 * order, as one process would have made them (collective). a->info must be
 * set. Returns the agreed status; in one process, rc. */
int qc_vjp_merge(qc_audit *a, int rc, long long at, int nunits);

#endif
