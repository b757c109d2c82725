/* modes.h: the execution modes of a dump (docs/qatdump.md "Execution
 * modes"; docs/audit.md): a dump's root attribute `mode` says which one
 * produced it (eager, recompute, autocast, cuda_graph, grad_accum, tied),
 * and /qatcheck_mode holds the evidence the mode adds. After the vjp audit
 * of the same dump, each mode is judged from that evidence and, given the
 * eager dump of the same step, against it:
 *   recompute   the recomputed forward's inputs and outputs (saved tensors
 *               where the dump holds the first forward's) against the
 *               first forward's, bit for bit; with the eager
 *               dump: the forward state bit for bit, dY and gradients
 *               within one unit roundoff of their dtype
 *   cuda_graph  with the eager dump: as recompute's eager comparison
 *   autocast    its own reference only (the vjp checks); the mode recorded;
 *               no eager dump (refused)
 *   grad_accum  each parameter's accumulated .grad against the sum of the
 *               micro-batches' gradients; with the eager dump: that sum
 *               against the whole batch's gradient, within accumulation
 *               rounding
 *   tied        each tie's accumulated gradient against the sum of its
 *               sites' shares; no eager dump (refused)
 * Each comparison is a check in the result list (module, dY
 * "<mode>:<against>", tensor); a module whose mode checks all passed gets
 * the mode's coverage item in its facts. */
#ifndef QC_ENGINE_MODES_H
#define QC_ENGINE_MODES_H

#include "model/check.h"
#include "model/modinfo.h"

/* Judge the mode of dump `path` (its module groups matching regex `re`,
 * "" all), against `eager` (NULL: none), into res, setting coverage bits
 * in mods. A dump without a mode attribute is eager: nothing to judge
 * unless `eager` is given, or it holds /qatcheck_mode, which then is
 * refused. Every piece of evidence is compared with its counterpart in
 * both directions (docs/robustness.md, "Execution-mode evidence"): one
 * missing is QC_EINPUT naming it, never left out. QC_OK (failed checks
 * are results), or QC_EINPUT / QC_ESYS with the error set. */
int qc_modes_audit(const char *path, const char *re, const char *eager, qc_results *res, qc_modinfos *mods);
/* qc_modes_audit's checks of the pair alone (the mode attribute, --eager
 * given with an eager, autocast or tied dump, the eager dump's own mode),
 * before any module is audited: a wrong --eager is refused at once, not
 * after the audit. QC_OK, or QC_EINPUT / QC_ESYS with the error set. */
int qc_modes_check(const char *path, const char *eager);

#endif
