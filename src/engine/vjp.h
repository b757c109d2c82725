/* vjp.h: layer 1 over a whole case (the `vjp` verb's run): every module
 * instance the case names, generated or read from its dump, audited into
 * a->res. */
#ifndef QC_ENGINE_VJP_H
#define QC_ENGINE_VJP_H

#include "engine/audit.h"
#include "io/dump.h"

/* Run case a->cs: generated instances (its shapes, seed, values, dY kinds)
 * or its dump's matching module groups. profile (NULL: none) is --profile,
 * set over every module's contract. Checks go to a->res; QC_EINPUT/QC_ESYS
 * with the error set when the run cannot be judged. */
int qc_vjp_case(qc_audit *a, const char *profile);

/* ---- one module made ready (vjp_prep.c, used by vjp.c and shard.c) ------------
 * m's contract: the dump's attribute (dump_contract, "" or NULL: none), the
 * case's over it, --profile over both; validated against its class's keys. */
int qc_vjp_set_contract(qc_module *m, const qc_case *cs, const char *dump_contract, const char *profile);
/* Keep only the dYs the case names (all when it names none). */
int qc_vjp_select_dy(qc_module *m, const qc_case *cs, const char *dump_path);
/* Deployed bytes: when m's saved/ holds weight_q, a `quantizer` check in
 * a->res that qatcheck's quantizer reproduces them byte for byte (an auto
 * profile becomes the first that does); otherwise an auto profile becomes
 * vllm. QC_OK or a status with the error set. */
int qc_vjp_check_deployed(qc_audit *a, qc_module *m);
/* m's failed checks attributable, after its audit put its checks at
 * res->v[first..]: QC_EINPUT (cannot judge) when its class multiplies
 * matrices (qc_class.bf16_gemm), its group's cpu_bf16_gemm_acc (acc, ""
 * when absent) is "bfloat16" (the producer's bf16 GEMMs add each product
 * into a bf16 sum, which qatcheck does not model) and every failed check
 * of m is within the error such a sum can make; passes stand, and so does
 * every verdict of a module with one failure beyond that reach (or one
 * without metrics). Runs after the audit, unlike the rest of this section.
 * where names the dump and module. */
int qc_vjp_check_gemm_acc(const qc_module *m, const char *acc, const qc_results *res, int first, const char *where);

/* ---- a module that received no token (vjp_empty.c) ---------------------------
 * 1 when every inputs/ and grad_out/ dataset of m is empty (0 elements):
 * scripts/qatdump.py's empty call (an expert nobody was routed to). */
int qc_vjp_is_empty(const qc_module *m);
/* Its checks into a->res: each parameter gradient the dump holds (or the
 * class gives) exactly zero, each input gradient without an element. */
int qc_vjp_empty_audit(qc_audit *a, const qc_module *m);

/* ---- sharded dumps (shard.c; docs/interfaces.md, "Sharded dumps") --------------
 * 1 when a case's data.dump is a pattern (it holds *, ? or [): one file per
 * rank of a sharded run. */
int qc_shard_pattern(const char *dump);
/* Layer 1 over the files of pattern cs->dump: each file one rank's shards
 * (root attributes rank, world_size; a dataset's shard_dim attribute says
 * along which dimension its pieces concatenate in rank order, none: the
 * same on every rank). Whole tensors assembled, the reference run on them,
 * and every rank's gradients judged against the reference's piece for
 * that rank (the whole of it for a gradient of a tensor every rank holds
 * whole: what the trainer's all-reduce must have made), a failure
 * diagnosed (a missing, doubled or mis-scaled reduction, a shard in the
 * wrong place). This rank's units as in run_dump; *at, *nunits likewise. */
int qc_vjp_sharded(qc_audit *a, const qc_case *cs, const char *profile, long long *at, int *nunits);

/* ---- over the ranks of an MPI job (vjp_dist.c; docs/distributed.md) -----------
 * The units of a case (its generated instances, or its dump's matching
 * module groups, in order) go round robin to the ranks: *owner (malloc'd,
 * n entries) gets unit i's rank, i mod size; all 0 in one process. */
int qc_vjp_units(int n, int **owner);
/* The same when split[u] = 1 marks units every rank runs together (split
 * NULL: none): those get owner -1, the others go round robin among
 * themselves (a pure function of the plan, as before). */
int qc_vjp_units_split(int n, const char *split, int **owner);

/* ---- one module split across the ranks (split.c; docs/distributed.md) ---------- */
/* 1 when the case's "split" regex matches module path `path`. */
int qc_split_wanted(const qc_case *cs, const char *path);
/* Audit module m, unit `unit` of the case, together with every rank, each
 * on its slice of the class's split dimension (collective; the checks go
 * to a->res on rank 0 only). QC_OK, a failed check being a result; an
 * error of any rank is every rank's (the agreement of dist.h). */
int qc_split_audit(qc_audit *a, const qc_module *m, long long unit);
/* The automatic split: under several ranks on a device, every module of
 * ents[0 .. n) whose class splits (qc_split.device_bytes) and whose unsplit
 * audit needs more device memory than some rank has free gets split[i] = 1,
 * as if the case's "split" named it (QATCHECK_MEM_FREE=<bytes> pretends the
 * free memory, on any backend: for tests). Decided from the dump's shapes,
 * no data read, and agreed over the ranks (collective). QC_OK or the agreed error. */
int qc_split_auto(const qc_audit *a, qc_dump *d, const qc_dump_entry *ents, int n, char *split);
/* After the ranks ran their units (rc their status, at the unit a rank
 * failed on): the agreement (an error of any rank, named by rank, on every
 * rank), then every rank's checks and module facts to rank 0, in unit
 * order, as one process would have made them (collective). a->info must be
 * set. Returns the agreed status; in one process, rc. */
int qc_vjp_merge(qc_audit *a, int rc, long long at, int nunits);

#endif
