/* fd.h: finite-difference cross-check of a class's float64 reference VJP
 * against its float64 forward (qc_class.forward), as JAX's check_vjp does:
 * for random directions u (per differentiable tensor) and v (on the output),
 * <u, J^T v> from the reference VJP with dY = v must equal <J u, v>, where
 * J u comes from central 4-point differences of the forward:
 *   J u ~ (f(x - 2hu) - 8 f(x - hu) + 8 f(x + hu) - f(x + 2hu)) / (12 h).
 * Discrete branches are fixed at the unperturbed point (the forward's
 * `branch` argument), so the differences stay on one smooth piece. */
#ifndef QC_FD_H
#define QC_FD_H

#include <stdint.h>

#include "model/fdcheck.h"
#include "model/module.h"

/* Defaults for opts (seed 0, 3 directions, h 1e-3, tol 1e-6). */
void qc_fd_defaults(qc_fd_opts *o);

/* Check vjp against fwd on module m (contract validated). The bound per
 * row is tol * ||u|| ||J^T v|| (Cauchy-Schwarz scale of <u, J^T v>) plus
 * 1e-12 sum_i |y_i v_i| (the rounding of the differenced forward, which is
 * ~1.5e-16 / h of that sum). Fills *rows (malloc'd, caller frees) and
 * *nrows. QC_OK whether or not rows pass; an error status when the module
 * cannot be evaluated (a gradient naming no input/parameter included). */
int qc_fd_check(const qc_ctx *ctx, const qc_module *m, qc_fwd_fn fwd, qc_vjp_fn vjp, const qc_fd_opts *o,
                qc_fd_row **rows, int *nrows);

/* Make a generated instance of class cls: path "gen/<class>[shape]",
 * contract validated against the class keys (defaults filled), tensors from
 * the class generator (seeded with g->seed). On error m is freed. */
int qc_fd_instance(const qc_class *cls, const qc_gen *g, const qc_contract *c, qc_module *m);

/* Parse "key=value" into c: a number when value parses whole as one, else a
 * string ("key=word:N" gives the word with number N). QC_EINPUT otherwise. */
int qc_fd_parse_set(qc_contract *c, const char *kv);

#endif
