/* judge.c: a check's tolerance and verdict (qc_audit_judge and what it
 * builds on: the class's error model, the terms' scale from the reference's
 * terms mode, the verdict from the metrics); split from audit.c, which runs
 * the modules. */
#include "engine/audit.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend/backend.h"
#include "core/par.h"
#include "core/qc.h"
#include "model/tol.h"
#include "numerics/decode.h"
#include "numerics/formats.h"

/* The terms' sets of one (module, dY) while qc_audit_module judges its
 * gradients (the scope): one run of the reference's terms mode serves them
 * all. Outside a scope (tol --dump, a split or sharded check) each call
 * runs its own. */
#define MODELS_KEPT 16
static _Thread_local struct {
  const qc_module *m;
  const qc_tensor *dy;
  const qc_backend *be; /* the audit's backend: the terms' GEMMs run there too */
  qc_tset ts;
  int state; /* 0: none, 1: scoped, not run; 2: run (ts valid); 3: run, failed */
  /* the class's model of each gradient made in the scope (it depends on m, dY and the gradient alone):
   * a check judged against several variants (their references differ, the model does not) makes it once */
  int nkept;
  char kept_grad[MODELS_KEPT][QC_NAMELEN];
  qc_tol_model kept[MODELS_KEPT];
} g_terms;

void qc_audit_terms_scope(const qc_module *m, const qc_tensor *dy, const qc_backend *be) {
  qc_tset_free(&g_terms.ts);
  memset(&g_terms, 0, sizeof g_terms);
  g_terms.m = m;
  g_terms.dy = dy;
  g_terms.be = be;
  g_terms.state = m ? 1 : 0;
}

/* The sum of squares of a's finite values: blocks of SS_BLOCK elements
 * summed on qc_par_for's threads, then the blocks' sums in order, so the
 * result does not depend on the thread count. */
#define SS_BLOCK ((int64_t)1 << 16)
typedef struct ss_job {
  const double *a;
  int64_t n;
  double *part;
} ss_job;

static void ss_piece(void *ctx, int64_t lo, int64_t hi, int tid) {
  (void)tid;
  const ss_job *j = ctx;
  for (int64_t b = lo; b < hi; b++) {
    double ss = 0;
    for (int64_t i = b * SS_BLOCK, e = i + SS_BLOCK < j->n ? i + SS_BLOCK : j->n; i < e; i++)
      if (isfinite(j->a[i])) ss += j->a[i] * j->a[i];
    j->part[b] = ss;
  }
}

static double finite_ss(const double *a, int64_t n) {
  if (n <= 0) return 0.0;
  const int64_t nb = (n + SS_BLOCK - 1) / SS_BLOCK;
  double *part = malloc((size_t)nb * sizeof *part), ss = 0;
  ss_job j = {a, n, part};
  if (part) {
    qc_par_for(nb, 1, ss_piece, &j);
    for (int64_t b = 0; b < nb; b++) ss += part[b];
  } else { /* no memory for the blocks' sums: the same blocks one by one */
    double one;
    for (int64_t b = 0; b < nb; b++) {
      ss_job k = {a + b * SS_BLOCK, n - b * SS_BLOCK, &one};
      ss_piece(&k, 0, 1, 0);
      ss += one;
    }
  }
  free(part);
  return ss;
}

/* ||T||_2 of gradient `grad` from the class's reference run in its terms
 * mode (qc_ctx.terms: T_i the magnitudes of the terms element i adds up,
 * from the math); 0 when the row has no terms mode or the run fails (a
 * slice the reference cannot run alone): the relative model alone then. */
static double ref_terms(const qc_module *m, const qc_tensor *dy, const char *grad) {
  const qc_registry_row *row = qc_registry_find(m->cls->name);
  if (!row || !row->terms) return 0.0;
  const int scoped = g_terms.state && g_terms.m == m && g_terms.dy == dy;
  qc_tset own = {0}, *ts = scoped ? &g_terms.ts : &own;
  int ok = scoped ? g_terms.state == 2 : 0;
  if (!scoped || g_terms.state == 1) {
    qc_ctx c;
    memset(&c, 0, sizeof c);
    c.terms = 2; /* only ||T||_2 is read: a reference may return its blocks' norms */
    c.be = scoped && g_terms.be ? g_terms.be : qc_backend_cpu(); /* the MoE layer's: 5.7 s of its audit on the CPU */
    qc_err_state es; /* a terms run that fails leaves the relative model alone, no error */
    qc_err_save(&es);
    ok = row->reference(&c, m, dy, ts) == QC_OK;
    qc_err_restore(&es);
    if (scoped) g_terms.state = ok ? 2 : 3;
  }
  /* a run that failed may have added gradients it never finished writing: none is read */
  const qc_tensor *t = ok ? qc_tset_get(ts, grad) : NULL;
  const double ss = t && t->dtype == QC_F64 ? finite_ss((const double *)t->data, qc_numel(t)) : 0.0;
  qc_tset_free(&own);
  return sqrt(ss);
}

void qc_audit_bf16_compute(const qc_module *m, qc_tol_model *tm) {
  if (!qc_contract_bf16_compute(&m->contract)) return;
  if (m->cls->formats_are_arithmetic) return; /* a GEMM class whose contract is its arithmetic (linear) */
  tm->rounded_operands += QC_BF16_COMPUTE_ROUNDINGS;
  const size_t l = strlen(tm->why);
  snprintf(tm->why + l, sizeof tm->why - l, "%scompute_dtype bfloat16: %d more bf16 roundings (product, activation, sum)",
           l ? "; " : "", QC_BF16_COMPUTE_ROUNDINGS);
}

int qc_audit_derive(const qc_module *m, const qc_tensor *dy, const char *grad, qc_dtype dt, const qc_tol *decl, int ref_zero,
                    qc_audit_model *am, qc_tol *out) {
  memset(am, 0, sizeof *am);
  if (!m->cls->tol_model) {
    qc_err("%s: class %s has no error model for '%s': its tolerance cannot be derived", m->path, m->cls->name, grad);
    return QC_EINPUT;
  }
  const int scoped = g_terms.state && g_terms.m == m && g_terms.dy == dy;
  int rc = QC_OK, kept = -1;
  for (int i = 0; scoped && i < g_terms.nkept; i++)
    if (strcmp(g_terms.kept_grad[i], grad) == 0) kept = i;
  if (kept >= 0) {
    am->tm = g_terms.kept[kept];
  } else {
    rc = m->cls->tol_model(m, dy, grad, &am->tm);
    if (!rc) qc_audit_bf16_compute(m, &am->tm);
    if (!rc && !(am->tm.terms > 0)) am->tm.terms = ref_terms(m, dy, grad); /* the class's model leaves it to the reference */
    if (!rc && scoped && g_terms.nkept < MODELS_KEPT && strlen(grad) < QC_NAMELEN) {
      snprintf(g_terms.kept_grad[g_terms.nkept], QC_NAMELEN, "%s", grad);
      g_terms.kept[g_terms.nkept++] = am->tm;
    }
  }
  if (!rc) { /* the derivation's refusal names the tol option, not the module: say which check */
    qc_err_state es;
    qc_err_save(&es);
    rc = qc_tol_from_model(&am->tm, decl, qc_dtype_name(dt), &am->spec, &am->terms, &am->pre);
    char why[sizeof es.msg - 128];
    snprintf(why, sizeof why, "%s", qc_err_msg());
    qc_err_restore(&es);
    if (rc && why[0]) qc_err("%s: the tolerance of '%s' cannot be derived: %s", m->path, grad, why);
  }
  if (rc) return rc;
  if (out) qc_tol_fill_derived(&am->tm, &am->spec, &am->terms, decl, ref_zero, out);
  return QC_OK;
}

/* The check's tolerance: the declared one, or (derive) the one derived
 * from the class's error model, the shapes and the judged dtype
 * (qc_audit_derive, which `tol --dump` shares); the model also gives the
 * bias test's allowance and the diagnosis's noise level. QC_EINPUT when a
 * derived tolerance cannot be made. */
int qc_audit_judge(const qc_module *m, const qc_tensor *dy, const qc_tol *t, qc_check *k) {
  qc_tol use = *t;
  qc_audit_model am;
  qc_dtype dt = QC_F32;
  if (qc_dtype_from_name(k->judged_dtype, &dt)) dt = QC_F32;
  /* a sharded dump's per-rank check "d_x@rank2" is judged by d_x's model */
  char grad[sizeof k->tensor];
  snprintf(grad, sizeof grad, "%s", k->tensor);
  grad[strcspn(grad, "@")] = 0;
  qc_err_state es; /* declared bounds: the model is optional (the bias allowance, the noise level) */
  qc_err_save(&es);
  if (qc_audit_derive(m, dy, grad, dt, t, k->m.norm_r == 0, &am, t->derive ? &use : NULL)) {
    if (t->derive) {
      qc_hint("declare the bounds of \"%s\" (rel_l2, noise_multiple, ...) instead of {\"derive\": true}", grad);
      qc_err_keep(&es);
      return QC_EINPUT;
    }
    qc_err_restore(&es);
  } else {
    qc_err_restore(&es);
    k->level = am.terms.rel_l2;
    /* the terms' scale: float32 working precision over ||T|| (the class's
     * model), with the derivation's margin */
    const double tl = am.tm.terms_lambda > 0 ? am.tm.terms_lambda : am.terms.lambda;
    k->m.term_floor = am.tm.terms > 0 ? am.terms.margin * tl * am.terms.u_acc * am.tm.terms : 0.0;
    double te = k->m.norm_r > 0 ? k->m.term_floor / k->m.norm_r : 0.0;
    qc_bias_allow(&k->m, fmax(am.pre, te));
  }
  if (t->has_bias_allow) qc_bias_set_allow(&k->m, t->bias_allow); /* the case's allowance replaces the model's */
  k->has_tol = 1;
  k->tol = use;
  qc_audit_verdict(k, dt, &use);
  return QC_OK;
}

void qc_audit_verdict(qc_check *k, qc_dtype gdt, const qc_tol *t) {
  k->has_metrics = 1;
  snprintf(k->judged_dtype, sizeof k->judged_dtype, "%s", qc_dtype_name(gdt));
  /* A reference (nearly) exact in the candidate's type has a floor near 0,
   * and any harmless difference would be an enormous multiple. The divisor
   * never drops below a tenth of the type's nominal floor u/sqrt(3); a type
   * qc_noise_floor does not round to counts as float64. */
  double u = qc_dtype_unit(gdt == QC_BF16 || gdt == QC_F16 || gdt == QC_F32 ? gdt : QC_F64);
  double floor_eff = fmax(k->m.noise_floor, 0.1 * u / sqrt(3.0));
  /* the arithmetic's error from the terms' scale adds to the floor */
  if (k->m.term_floor > 0 && k->m.norm_r > 0) floor_eff = hypot(floor_eff, k->m.term_floor / k->m.norm_r);
  if (isnan(k->m.noise_floor)) k->m.noise_multiple = NAN;
  else k->m.noise_multiple = k->m.rel_l2 / floor_eff;
  k->verdict = qc_judge(&k->m, t, k->why, sizeof k->why);
}

