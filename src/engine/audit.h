/* audit.h: the run and compare stations: for one module instance and each
 * of its dYs, the reference VJP and the candidate (builtin, dump or plugin)
 * on the same inputs and the same dY, one judged check per reference
 * gradient. */
#ifndef QC_AUDIT_H
#define QC_AUDIT_H

#include "model/case.h"
#include "model/check.h"
#include "model/modinfo.h"
#include "model/module.h"
#include "model/tol.h"
#include "io/plugin.h"

typedef struct qc_audit {
  const qc_ctx *ctx;
  const qc_case *cs;          /* tolerances and candidate kind */
  qc_plugin *plugin;          /* when cs->cand == QC_CAND_PLUGIN */
  qc_results *res;            /* checks are appended here */
  const char *frozen;         /* "/d_weight/d_bias/": gradients of frozen parameters of
                                 the module being audited (dump attribute frozen="1");
                                 not expected, so no check when the candidate has none */
  qc_modinfos *info;          /* NULL, or where a case's run (vjp.c) describes each module */
  const char *split;          /* NULL, or split[u] = 1 for the units every rank runs together
                                 (engine/split.c), set by vjp.c for the merge */
  const char *autocast;       /* NULL, or the module group's attribute autocast as vjp.c read it ("off",
                                 or the dtype autocast ran in): evidence for engine/variants.c */
  int (*be_open)(void *arg);  /* NULL, or the backend is opened late (cli/vjp.c): ctx->be is NULL, a
                                 device's, until the dump's module loop calls this once, after the
                                 read-ahead of its first modules has begun; it sets ctx->be */
  void *be_arg;
} qc_audit;

/* Audit module m (cls and contract set; grad_out holds the dYs; cand set
 * when the candidate is the dump). Failed checks are results, not errors;
 * QC_EINPUT means the run cannot be judged (e.g. a gradient without a
 * declared tolerance). */
int qc_audit_module(qc_audit *a, const qc_module *m);

/* Compare candidate g (any float dtype) with reference r (float64) and fill
 * check k's metrics, the precision it is judged at (t's dtype, else the
 * narrowest type holding g's values), noise floor and bias test. No
 * verdict: qc_audit_judge gives it. */
int qc_audit_compare(const qc_ctx *ctx, const qc_tensor *g, const qc_tensor *r, const qc_tol *t, qc_check *k);


/* The precision candidate g is judged at, as qc_audit_compare judges it
 * (qc_audit_dtype of its values; k may be NULL). Never fails: a tensor
 * that cannot be read is judged at its storage dtype. */
qc_dtype qc_audit_cand_dtype(const qc_tensor *g, const qc_tol *t, qc_check *k);

/* A class's error model of one gradient and its derivation. */
typedef struct qc_audit_model {
  qc_tol_model tm;             /* the class's model (K, lambda, scale, terms, why) */
  qc_tol_spec spec;            /* the derivation's inputs (out_dtype: the judged dtype) */
  qc_tol_terms terms;          /* every term and bound */
  double pre;                  /* the systematic error the bias test allows */
} qc_audit_model;

/* A module whose contract says compute_dtype = bfloat16 (a pure-bf16
 * model: every elementwise op and matmul of its own rounds its result to
 * bf16) gets QC_BF16_COMPUTE_ROUNDINGS more bf16-rounded operands in its
 * error model tm, on the path to each output: a product, an activation and
 * a sum. A class with *_format keys (a quantized GEMM: bf16 operands,
 * float32 accumulation) is left alone: its contract is its arithmetic. */
#define QC_BF16_COMPUTE_ROUNDINGS 3
void qc_audit_bf16_compute(const qc_module *m, qc_tol_model *tm);
/* The one derivation of gradient `grad` of m under dY dy judged at dt,
 * shared by vjp's {"derive": true} and `tol --dump` so the two agree: the
 * class's tol_model, qc_tol_from_model with decl's derive options (NULL:
 * none), and (out non-NULL) the tolerance qc_tol_fill_derived makes of it
 * (ref_zero: the reference is exactly zero). QC_OK, or QC_EINPUT when the
 * class has no model for grad (message set). */
int qc_audit_derive(const qc_module *m, const qc_tensor *dy, const char *grad, qc_dtype dt, const qc_tol *decl, int ref_zero,
                    qc_audit_model *am, qc_tol *out);

/* Judge check k (metrics and judged_dtype filled) of gradient k->tensor of
 * module m under dY dy and the case's tolerance t: t itself, or the one
 * derived from the class's error model ({"derive": true}); the model also
 * sets the bias test's allowance and k->level. QC_OK or QC_EINPUT. */
int qc_audit_judge(const qc_module *m, const qc_tensor *dy, const qc_tol *t, qc_check *k);

/* Open (m, dy) as the terms' scope on backend be (m NULL: close it,
 * freeing the last): while it is open, one run of m's reference in its
 * terms mode, on be, serves every gradient qc_audit_judge derives a
 * tolerance for (judge.c); outside a scope each derivation runs its own on
 * the CPU. One scope a thread. */
void qc_audit_terms_scope(const qc_module *m, const qc_tensor *dy, const struct qc_backend *be);

/* Fill check k's noise multiple and verdict from its metrics and noise
 * floor (k->m) under tolerance t; gdt is the candidate's element type. */
void qc_audit_verdict(qc_check *k, qc_dtype gdt, const qc_tol *t);

/* Start check k: its names, the reference's shape, tolerance t; no metrics. */
void qc_check_init(qc_check *k, const qc_module *m, const char *dy, const char *tensor, int ndim, const int64_t *shape,
                   const qc_tol *t);

/* The case's tolerance for a gradient, or NULL with the error set. */
const qc_tol *qc_audit_tol(const qc_audit *a, const qc_module *m, const char *tensor);


/* Fail check k of gradient g of m where the class's zero_slices says a
 * slice along dimension 0 must be exactly zero and g holds anything else
 * there (why[] names the slice by its index in the whole, e.g. "expert 4
 * has no token ..."); no change otherwise. g is the slices [off0, off0 +
 * g->shape[0]) of the whole gradient's nwhole (a rank's piece of an
 * expert-parallel gradient; 0 and g->shape[0] for the whole). QC_OK or an
 * error (engine/zeros.c). */
int qc_audit_exact_zeros(const qc_module *m, const qc_tensor *g, int64_t off0, int64_t nwhole, qc_check *k);

#endif
