/* audit_priv.h: what the module audit (audit.c) shares with its compare
 * (audit_cmp.c) and with the judging of a check against the reference
 * variants (audit_vars.c), so that neither calls audit.c back.
 * Engine-private. */
#ifndef QC_AUDIT_PRIV_H
#define QC_AUDIT_PRIV_H

#include "engine/audit.h"
#include "engine/stream.h"

/* What the compare of candidate g reads of it: its values' precision on
 * the host's compare path (one pass over a float32 or float64 g), its
 * storage dtype otherwise. */
qc_dtype qc_audit_held_of(const qc_tensor *g);
/* qc_audit_compare with held = qc_audit_held_of(g) given, for a candidate
 * compared with several references (a check's variants): the pass over g
 * that finds it is made once, not per reference. */
int qc_audit_compare_held(const qc_ctx *ctx, const qc_tensor *g, qc_dtype held, const qc_tensor *r, const qc_tol *t,
                          qc_check *k);
/* k's reference is not finite somewhere: QC_EINPUT naming it. */
int qc_audit_ref_not_finite(const qc_check *k);

/* One (module, dY)'s reference variants while its gradients are judged
 * (engine/variants.c owns which, in what order, and the rule): each
 * variant's reference computed once, on first use. */
typedef struct qc_gvars qc_gvars;

/* The variants of m under dY index i (dy = &m->grad_out.t[i]) for the
 * audit a, whose reference is row's; st the streams the contract's
 * reference handed its large gradients to (NULL: none), read for where a
 * gradient compared in blocks differs. *out, or NULL with a status. */
int qc_gvars_open(const qc_audit *a, const qc_registry_row *row, const qc_module *m, int i, const qc_streams *st,
                  qc_gvars **out);
/* Check k of candidate g (its values' precision held, QC_DTYPE_COUNT: not
 * yet found) under t, judged by the contract's reference, against the
 * variants (qc_variants_judge); a failure none passes, against the closest
 * (qc_variants_closest), remembered for qc_gvars_diagnose. A gradient the
 * contract's reference handed over in blocks is compared with each
 * variant's in blocks too. A status. */
int qc_gvars_try(qc_gvars *s, const qc_tensor *g, qc_dtype held, const qc_tol *t, qc_check *k);
/* Diagnose failed check k of g against the reference it was judged
 * against: the contract's (r, of the set ref; r without data when it was
 * handed over in blocks, then made whole again for the diagnosis where
 * the host's memory allows it) or the closest variant's (under its
 * roundings of module, dY and arithmetic), qc_gvars_try's for k. */
int qc_gvars_diagnose(qc_gvars *s, const qc_ctx *ctx, const qc_tensor *g, const qc_tensor *r, const qc_tset *ref,
                      const char *frozen, qc_check *k);
/* Release s (NULL: nothing), saying under -v how many variant references
 * it computed and saved. */
void qc_gvars_close(qc_gvars *s);

#endif
