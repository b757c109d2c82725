/* diagnose_priv.h: the diagnosis's working state and its predictions from
 * the reference alone (diagnose_ref.c), shared by diagnose.c. Engine-private. */
#ifndef QC_DIAGNOSE_PRIV_H
#define QC_DIAGNOSE_PRIV_H

#include <stddef.h>
#include <stdint.h>

#include "model/check.h"
#include "model/module.h"

/* One diagnosis in progress: the candidate and reference as float64, their
 * view as [R, C] rows, and the noise level a prediction must reach. */
typedef struct dg {
  const qc_ctx *ctx;
  const qc_module *m;
  const qc_tensor *dy, *r, *cand;
  const qc_tset *ref_names;
  qc_check *k;
  double *g, *rd, *p;   /* candidate, reference, scratch prediction [n] */
  int64_t n, R, C;
  double e0;            /* rel_l2 of the candidate to the reference */
  double level, floor;  /* noise level of a correct candidate; the effective noise floor */
  char fitted[16];      /* per recorded hypothesis: fitted to the candidate (reported last) */
} dg;

/* Fill d's float64 copy of its candidate (d->g), scratch (d->p), [R, C]
 * view of its reference, the noise floor of d->k's judged dtype and e0
 * (d->r, d->cand and d->k set; d->level is the caller's). The caller frees
 * d->g and d->p, also on failure. A status; `what` names the subject. */
int qc_dg_setup(dg *d, const char *what);
/* Record the prediction in d->p: its error, distinct when it differs from
 * the reference by more than the level. */
void qc_dg_judge(dg *d, const char *name, const char *says, double lv);

/* The predictions from the reference alone (each records what it tested). */
void qc_dg_factor(dg *d, int want_factor, int want_sign); /* a constant factor, a sign flip */
void qc_dg_transpose(dg *d);                               /* the last two (equal) dimensions swapped */
int qc_dg_rows(dg *d);                                     /* rows shifted or permuted (QC_ESYS: memory) */
void qc_dg_zero(dg *d, const char *frozen);                /* a zero candidate */
void qc_dg_slice(dg *d);                                   /* zero slices: a missing term */
void qc_dg_one_slice(dg *d);                               /* the error in one slice of dim 0 alone (fitted) */
void qc_dg_nonfinite(dg *d);                               /* the first non-finite value, traced */

/* Every other value of each choice key of the class that keep accepts
 * (NULL: every key): run(d, alt, arg) predicts into d->p under the other
 * value (non-zero: no prediction); the best value per key, when it differs
 * from the reference, is judged as "<subject> matches <what> with KEY 'v'
 * rather than the declared 'cur'". QC_ESYS on memory. */
typedef int (*qc_dg_run_fn)(dg *d, const qc_module *alt, void *arg);
int qc_dg_scan_keys(dg *d, int (*keep)(const char *key), qc_dg_run_fn run, void *arg, const char *subject, const char *what);
/* Run fn on module mm with dY dyv, keeping only d->k->tensor, into d->p.
 * QC_NA when it gives no such tensor of the reference's size (diagnose_ref.c). */
int qc_dg_run_for(dg *d, qc_vjp_fn fn, const qc_module *mm, const qc_tensor *dyv);
/* One 128 x 128 block of a block-scaled weight off by a factor (a stale
 * scale of that block), fitted block by block (diagnose_block.c); work:
 * the diagnosis's size measure, bounding the blocks tried. QC_ESYS only. */
int qc_dg_block_scale(dg *d, double work);
/* Write d->k->diagnosis from the hypotheses recorded (diagnose.c). */
void qc_dg_summarize(dg *d);

#endif
