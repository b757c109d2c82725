/* step.h: the one-step update check (docs/layer3.md): each arm's optimizer
 * step recomputed in float64 exactly as torch.optim.AdamW / SGD compute it
 * (the gradient divided by grad_scale, the global norm over every trained
 * parameter, the clip coefficient min(1, max_norm / (norm + 1e-6)),
 * decoupled weight decay, bias-corrected moments), compared per parameter
 * with the trainer's update; frozen parameters that changed, parameters
 * without gradients and gradients without parameters named; two arms'
 * gradients and updates compared, and the localization said: gradients
 * close but updates differ -> scaling, clipping, optimizer state,
 * parameter binding; gradients differ -> the backward. */
#ifndef QC_ENGINE_STEP_H
#define QC_ENGINE_STEP_H

#include "model/l3case.h"
#include "model/layer3.h"

typedef struct qc_step_run {
  const qc_step_case *cs;
  qc_step_arm *arms;
  int narm;
  qc_step_res res;
  double t_read, t_judge;
} qc_step_run;

/* Read the case's dumps (every arm group, or the case's arms; an arm group
 * found twice is an error). */
int qc_step_load(qc_step_run *r, const qc_step_case *cs);
/* Judge every arm and pair of arms into r->res. */
int qc_step_judge(qc_step_run *r);
void qc_step_run_free(qc_step_run *r);

/* ---- the recomputation (step_opt.c), exposed for tests -------------------------- */

/* The optimizer as declared, or a known deviation from it (to name what a
 * trainer did when its update does not match). */
typedef enum {
  QC_STEP_ASIS = 0,
  QC_STEP_L2,          /* AdamW declared, Adam with L2 run: weight decay added to the gradient */
  QC_STEP_NO_WD,       /* no weight decay */
  QC_STEP_NO_BIASCORR, /* AdamW without bias correction */
  QC_STEP_NVARIANT
} qc_step_variant;
const char *qc_step_variant_text(qc_step_variant v);

/* The reference update of parameter p of arm a (out[p->n] = new value -
 * before), float64, the gradient multiplied by coef (the clip coefficient)
 * after the division by grad_scale. p must have a gradient. */
void qc_step_update(const qc_step_arm *a, const qc_step_param *p, double coef, qc_step_variant v, double *out);
/* A first-order bound on each element's error in the trainer's update of
 * p (err[p->n] >= 0) when its optimizer computes in arithmetic of unit
 * roundoff u (2^-24 for float32) and stores `after` in a type of unit
 * roundoff ua (the rounding of the new value, on top of the arithmetic's
 * own): every operation of the recomputation (step.h's formulas) rounds
 * its result, and the bound sums those roundings' effects on the update
 * by the magnitudes of their terms, so a moment that cancels (b1 m against
 * (1 - b1) g) is bounded by its terms, not by its small result. */
void qc_step_update_err(const qc_step_arm *a, const qc_step_param *p, double coef, double u, double ua, double *err);
/* The global norm of the gradients (divided by grad_scale) of the trained
 * parameters (trained[i] 1), and the clip coefficient (1 without clipping). */
void qc_step_norm(const qc_step_arm *a, const uint8_t *trained, double *norm, double *coef);
/* The coefficient c (in [1e-4, 1e4]) whose recomputed updates best match
 * the trainer's over the parameters with trained[i] 1 (least squares),
 * *rel the relative rms error there, *ident 0 when the updates barely
 * depend on c (Adam's first step is invariant to the gradient's scale).
 * QC_OK or QC_ESYS. */
int qc_step_fit(const qc_step_arm *a, const uint8_t *trained, qc_step_variant v, double *c, double *rel, int *ident);

#endif
