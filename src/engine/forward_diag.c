/* forward_diag.c: the forward check's diagnosis (forward.h): the
 * predictions of what users get wrong in a forward (another profile or
 * format, a stale per-tensor scale, inputs rounded before their
 * quantizer, the class's own alterations), and the generic ones for a
 * saved tensor. No class is named: the quantizer knobs are the contract's
 * keys, varied through the class's key table. */
#include "engine/forward.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/qc.h"
#include "engine/diagnose_priv.h"
#include "engine/forward_priv.h"
#include "engine/variants.h"
#include "numerics/decode.h"

/* Forward diagnoses only up to this many multiply-adds per forward run
 * (each hypothesis is one or more runs). */
#define FWD_DIAG_MAX_WORK 4e8

/* The float values of set s rounded to dt in place; *changed = 1 when a
 * value moved. */
static void round_set(qc_tset *s, qc_dtype dt, int *changed) {
  for (int j = 0; j < s->n; j++) {
    qc_tensor *t = &s->t[j];
    int64_t n = qc_numel(t);
    for (int64_t i = 0; i < n; i++) {
      double v = t->dtype == QC_F32 ? ((float *)t->data)[i] : t->dtype == QC_F64 ? ((double *)t->data)[i] : NAN;
      if (!isfinite(v)) continue;
      double q = qc_round_to(v, dt);
      *changed |= q != v;
      if (t->dtype == QC_F32) ((float *)t->data)[i] = (float)q;
      else ((double *)t->data)[i] = q;
    }
  }
}

/* A copy of m's inputs with each float tensor rounded to dt (bf16, f16)
 * into alt; *changed = 1 when a value moved. Only the inputs the class
 * differentiates: a buffer it reads (rope's inv_freq) stays as stored. */
static int rounded_inputs(const qc_module *m, qc_module *alt, qc_dtype dt, int *changed) {
  int rc;
  memset(&alt->inputs, 0, sizeof alt->inputs);
  *changed = 0;
  if ((rc = qc_tset_clone(&alt->inputs, &m->inputs))) return rc;
  for (int j = 0; j < alt->inputs.n; j++)
    if (qc_module_input_grad(m, alt->inputs.t[j].name)) {
      qc_tset one = {.n = 1, .t = &alt->inputs.t[j]};
      round_set(&one, dt, changed);
    }
  return QC_OK;
}

/* Run the forward of variant (c, alt) into d->p; QC_NA when it does not
 * apply or gives another size. */
static int predict(dg *d, const qc_ctx *c, const qc_module *alt, qc_fwd_ref_fn fwd) {
  qc_tensor y = {0};
  qc_tol_model tm;
  qc_err_state es; /* a prediction that cannot be made is no error */
  qc_err_save(&es);
  int rc = qc_fwd_reference(c, alt, fwd, &y, &tm);
  if (!rc) rc = qc_numel(&y) == d->n ? qc_tensor_to_f64(&y, d->p) : QC_NA;
  qc_tensor_free(&y);
  qc_err_restore(&es);
  return rc;
}

/* The forward under an altered contract, for qc_dg_scan_keys. */
static int predict_key(dg *d, const qc_module *alt, void *arg) { return predict(d, d->ctx, alt, *(qc_fwd_ref_fn *)arg); }

/* Every other value of each choice key of the class (a profile, a format,
 * a mask's direction): the best value per key recorded, when its forward
 * differs from the reference. */
static int hyp_contract(dg *d, qc_fwd_ref_fn fwd) {
  return qc_dg_scan_keys(d, NULL, predict_key, &fwd, "outputs/y", "the forward");
}

/* The class's own hypotheses that alter the module (a mask shifted, the
 * other pair layout, W^T): the forward of each variant. */
static void hyp_class_alters(dg *d, qc_fwd_ref_fn fwd) {
  for (const qc_hypothesis *h = d->m->cls->hyps; h && h->name; h++) {
    if (!h->alter || h->via_production) continue;
    char detail[160] = "", says[256];
    qc_module alt = *d->m;
    qc_err_state es; /* a hypothesis that cannot be tested is skipped */
    qc_err_save(&es);
    int rc = h->alter(d->m, &alt, detail, sizeof detail);
    if (!rc) rc = predict(d, d->ctx, &alt, fwd);
    qc_module_variant_free(&alt, d->m);
    qc_err_restore(&es);
    if (rc || qc_rel_l2(d->p, d->rd, d->n) <= 1e-12) continue;
    snprintf(says, sizeof says, "outputs/y matches the forward with %s%s%s", h->says, detail[0] ? "; " : "", detail);
    qc_dg_judge(d, h->name, says, d->level);
  }
}

/* A stale per-tensor weight scale: the scale f times the weight's own,
 * f fitted on a grid (1% steps over [0.71, 1.41], then 0.05% around the best). */
static void hyp_stale_scale(dg *d, qc_fwd_ref_fn fwd) {
  qc_ctx c = *d->ctx;
  double bf = 0, be = INFINITY;
  for (int pass = 0; pass < 2; pass++) {
    /* over one octave: a float8 grid is the same at scales a power of two apart */
    double lo = pass ? bf * 0.99 : 0.7071, step = pass ? bf * 0.0005 : 0.01;
    int n = pass ? 41 : 71;
    for (int i = 0; i < n; i++) {
      c.wscale = pass ? lo + i * step : lo * pow(1.01, i);
      if (predict(d, &c, d->m, fwd)) return; /* not a per-tensor weight */
      double e = qc_rel_l2(d->g, d->p, d->n);
      if (e < be) { be = e; bf = c.wscale; }
    }
  }
  c.wscale = bf;
  if (predict(d, &c, d->m, fwd)) return;
  char says[256];
  snprintf(says, sizeof says, "outputs/y matches a forward with a stale per-tensor weight scale: %.4g x the current weight's "
           "amax / 448 (a scale from an earlier step's amax, as delayed scaling keeps it)", bf);
  qc_dg_judge(d, "stale_scale", says, d->level);
}

/* Inputs rounded to bf16 or fp16 before their quantizer. */
static int hyp_rounded_inputs(dg *d, qc_fwd_ref_fn fwd) {
  static const struct { qc_dtype dt; const char *name; } v[] = {{QC_BF16, "bfloat16"}, {QC_F16, "float16"}};
  if (!qc_quantizes(d->m)) return QC_OK; /* without a quantizer it is the legal variant */
  for (size_t j = 0; j < sizeof v / sizeof v[0]; j++) {
    qc_module alt = *d->m;
    qc_err_state es; /* out of memory copying the inputs is the run's error; nothing else is */
    qc_err_save(&es);
    int changed = 0, rc = rounded_inputs(d->m, &alt, v[j].dt, &changed);
    if (!rc && changed && !predict(d, d->ctx, &alt, fwd)) {
      char says[256], names[128] = "";
      for (int i = 0; i < d->m->inputs.n; i++) {
        size_t l = strlen(names);
        snprintf(names + l, sizeof names - l, "%s%s", i ? ", " : "", d->m->inputs.t[i].name);
      }
      snprintf(says, sizeof says, "outputs/y matches the input (%s) rounded to %s before quantization: a cast before the "
               "quantizer the contract does not have", names, v[j].name);
      qc_dg_judge(d, "rounded_input", says, d->level);
    }
    qc_module_variant_free(&alt, d->m);
    if (rc == QC_ESYS) {
      qc_err_keep(&es);
      return rc;
    }
    qc_err_restore(&es);
  }
  return QC_OK;
}

/* (forward.h) */
int qc_diagnose_saved(const qc_ctx *ctx, const qc_module *m, const qc_tensor *t, const qc_tensor *r, qc_check *k) {
  dg d = {.ctx = ctx, .m = m, .r = r, .cand = t, .k = k};
  char what[QC_PATHLEN + QC_NAMELEN + 16];
  int rc;
  k->nhyp = 0;
  snprintf(what, sizeof what, "%s's %s", m->path, k->tensor);
  if ((rc = qc_dg_setup(&d, what))) goto done;
  d.level = k->level > 0 ? k->level : 3 * d.floor;
  qc_dg_factor(&d, 1, 1);
  if ((rc = qc_dg_rows(&d))) goto done;
  qc_dg_summarize(&d);
done:
  free(d.g);
  free(d.p);
  return rc;
}

int qc_diagnose_forward(const qc_ctx *ctx, const qc_module *m, const qc_tensor *y, const qc_tensor *r, qc_fwd_ref_fn fwd,
                        qc_check *k) {
  dg d = {.ctx = ctx, .m = m, .r = r, .cand = y, .k = k};
  int rc = QC_OK;
  k->nhyp = 0;
  char what[QC_PATHLEN + 16];
  snprintf(what, sizeof what, "%s's forward", m->path);
  if ((rc = qc_dg_setup(&d, what))) goto done;
  d.level = k->level > 0 ? k->level : 3 * d.floor;
  if (k->m.nonfinite) {
    qc_dg_nonfinite(&d);
  } else {
    double work = 1;
    for (int i = 0; i < m->inputs.n; i++) work = fmax(work, (double)qc_numel(&m->inputs.t[i]));
    for (int i = 0; i < m->params.n; i++) work = fmax(work, (double)qc_numel(&m->params.t[i]) * (double)d.R);
    qc_dg_factor(&d, 1, 1);
    if ((rc = qc_dg_rows(&d))) goto done;
    if (work <= FWD_DIAG_MAX_WORK) {
      if ((rc = hyp_contract(&d, fwd))) goto done;
      hyp_class_alters(&d, fwd);
      if ((rc = hyp_rounded_inputs(&d, fwd))) goto done;
      if (fwd) hyp_stale_scale(&d, fwd);
    }
  }
  qc_dg_summarize(&d);
done:
  free(d.g);
  free(d.p);
  return rc;
}
