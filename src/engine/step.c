/* step.c: the one-step update check (see step.h): per arm, per parameter,
 * the update against its float64 recomputation (a failed one diagnosed:
 * a gradient factor, Adam with L2, no weight decay, no bias correction),
 * frozen parameters, parameters without gradients and gradients without
 * parameters, the master copy against the updated main; per pair of arms,
 * gradients and updates against each other; the norms; the localization. */
#include "engine/step.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/qc.h"
#include "io/stepdump.h"
#include "numerics/decode.h"
#include "numerics/formats.h"
#include "numerics/metrics.h"

static int arm_rank(const char *name) {
  return strcmp(name, "under_test") == 0 ? 0 : strcmp(name, "gradient_reference") == 0 ? 1 : 2;
}

int qc_step_load(qc_step_run *r, const qc_step_case *cs) {
  memset(r, 0, sizeof *r);
  r->cs = cs;
  double t0 = qc_now_s();
  const char *want[QC_L3_MAXARMS];
  for (int i = 0; i < cs->narm; i++) want[i] = cs->arms[i];
  int rc;
  for (int d = 0; d < cs->ndump; d++)
    if ((rc = qc_step_dump_read(cs->dump[d], want, cs->narm, &r->arms, &r->narm))) return rc;
  for (int i = 0; i < cs->narm; i++) {
    int found = 0;
    for (int j = 0; j < r->narm; j++) found |= strcmp(r->arms[j].name, cs->arms[i]) == 0;
    if (!found) return qc_err("step: arm '%s' is in no dump of case '%s'", cs->arms[i], cs->path);
  }
  if (r->narm == 0) return qc_err("step: the dumps of case '%s' hold no arm group", cs->path);
  /* the arms in the method's order: under test first, then the reference, then the rest by name */
  for (int i = 1; i < r->narm; i++)
    for (int j = i; j > 0 && arm_rank(r->arms[j].name) < arm_rank(r->arms[j - 1].name); j--) {
      qc_step_arm t = r->arms[j];
      r->arms[j] = r->arms[j - 1];
      r->arms[j - 1] = t;
    }
  r->t_read = qc_now_s() - t0;
  return QC_OK;
}

void qc_step_run_free(qc_step_run *r) {
  for (int i = 0; i < r->narm; i++) qc_step_arm_free(&r->arms[i]);
  free(r->arms);
  qc_step_res_free(&r->res);
  memset(r, 0, sizeof *r);
}

static int frozen(const qc_step_run *r, const qc_step_arm *a, const char *name) {
  if (qc_step_arm_frozen(a, name)) return 1;
  for (int i = 0; i < r->cs->nfrozen; i++)
    if (strcmp(r->cs->frozen[i], name) == 0) return 1;
  return 0;
}

static void init_check(qc_step_check *c, const char *arm, const char *param, qc_step_kind kind) {
  memset(c, 0, sizeof *c);
  snprintf(c->arm, sizeof c->arm, "%s", arm);
  snprintf(c->param, sizeof c->param, "%s", param);
  c->kind = kind;
  c->fit_scale = NAN;
}

/* Judge metrics m against the tolerance the set gives `param` (unjudged when none). */
static void judge(qc_step_check *c, const qc_step_tolset *s, const qc_metrics *m) {
  c->has_metrics = 1;
  c->m = *m;
  const qc_tol *t = qc_step_tol_for(s, c->param);
  if (!t) {
    c->verdict = QC_V_PASS;
    snprintf(c->why, sizeof c->why, "not judged: no tolerance declared");
    return;
  }
  c->judged = c->has_tol = 1;
  c->tol = *t;
  c->verdict = qc_judge(m, t, c->why, sizeof c->why);
}

/* The unit roundoff of a stored floating-point type (its name), 0 when unknown. */
static double roundoff(const char *dtype) {
  qc_dtype t;
  return qc_dtype_from_name(dtype, &t) ? 0 : qc_dtype_unit(t);
}

/* An update no tolerance is declared for, judged against bounds derived
 * from the optimizer's float32 arithmetic and the precision of `after`
 * (docs/layer3.md, "Derived bounds"): err[i] bounds element i's error
 * (qc_step_update_err), rel_l2 <= 2 ||err|| / ||ref|| and max_abs <=
 * 2 max err; the factor 2 is the margin over the first-order bound. */
static void judge_derived(const qc_step_arm *a, const qc_step_param *p, double coef, const double *ref, double *err, const qc_metrics *m,
                          qc_step_check *c) {
  const double u32 = qc_dtype_unit(QC_F32);
  double ud = roundoff(p->after_dtype), u = fmax(ud, u32); /* AdamW and SGD compute in float32 at best */
  if (ud == 0) u = u32;
  double ua = ud > u ? ud : 0; /* a type coarser than the arithmetic rounds the result once more */
  qc_step_update_err(a, p, coef, u, ua, err);
  double ee = 0, emax = 0, rr = 0;
  for (int64_t i = 0; i < p->n; i++) {
    ee += err[i] * err[i];
    emax = fmax(emax, err[i]);
    rr += ref[i] * ref[i];
  }
  qc_tol t;
  memset(&t, 0, sizeof t);
  t.has_max_abs = 1;
  t.max_abs = 2 * emax;
  if (rr > 0) {
    t.has_rel_l2 = 1;
    t.rel_l2 = 2 * sqrt(ee / rr);
  }
  snprintf(t.reasoning, sizeof t.reasoning,
           "derived: the update recomputed with each operation's rounding in %s arithmetic (u = %.3g) bounded by its terms' "
           "magnitudes%s%s, x2; ||err|| / ||update|| = %.3g",
           u == u32 ? "float32" : p->after_dtype, u, ua > 0 ? ", plus after stored in " : "", ua > 0 ? p->after_dtype : "",
           rr > 0 ? sqrt(ee / rr) : 0.0);
  c->has_metrics = 1;
  c->m = *m;
  c->judged = c->has_tol = 1;
  c->tol = t;
  c->verdict = qc_judge(m, &t, c->why, sizeof c->why);
}

/* A failed update: which known deviation explains it (passes the same tolerance)? */
static int diagnose(const qc_step_arm *a, int k, const uint8_t *trained, double coef, const double *u, qc_step_check *c, double *tmp) {
  const qc_step_param *p = &a->params[k];
  uint8_t *one = calloc((size_t)a->nparam, 1);
  if (!one) return qc_err_sys("out of memory diagnosing '%s'", p->name);
  one[k] = 1;
  (void)trained;
  char why[512] = "";
  for (int v = QC_STEP_L2; v < QC_STEP_NVARIANT && !why[0]; v++) {
    if (a->opt == QC_OPT_SGD && v != QC_STEP_NO_WD) continue;
    if (v != QC_STEP_NO_BIASCORR && a->weight_decay == 0) continue;
    qc_step_update(a, p, coef, (qc_step_variant)v, tmp);
    qc_metrics m;
    qc_metrics_compute(u, tmp, p->n, &m);
    char w2[8];
    if (qc_judge(&m, &c->tol, w2, sizeof w2) == QC_V_PASS)
      snprintf(why, sizeof why, "; the update matches %s", qc_step_variant_text((qc_step_variant)v));
  }
  if (!why[0]) {
    double f, rel;
    int ident, rc = qc_step_fit(a, one, QC_STEP_ASIS, &f, &rel, &ident);
    if (rc) { free(one); return rc; }
    f /= coef;
    if (ident && fabs(f - 1) > 1e-3) {
      c->fit_scale = f;
      qc_step_update(a, p, coef * f, QC_STEP_ASIS, tmp);
      qc_metrics m;
      qc_metrics_compute(u, tmp, p->n, &m);
      char w2[8];
      snprintf(why, sizeof why, "; the update %s the recomputation with the gradient scaled by %.4g (rel_l2 %.3g)",
               qc_judge(&m, &c->tol, w2, sizeof w2) == QC_V_PASS ? "matches" : "is closest to", f, m.rel_l2);
    }
  }
  size_t n = strlen(c->why);
  snprintf(c->why + n, sizeof c->why - n, "%s", why);
  free(one);
  return QC_OK;
}

/* The trained parameters' flags: a gradient, and not frozen. */
static uint8_t *trained_of(const qc_step_run *r, const qc_step_arm *a) {
  uint8_t *t = calloc((size_t)(a->nparam ? a->nparam : 1), 1);
  if (t)
    for (int k = 0; k < a->nparam; k++) t[k] = a->params[k].grad && !frozen(r, a, a->params[k].name);
  return t;
}

/* after_master against the updated main rounded to after_master's type. */
static void master_check(const qc_step_param *p, qc_step_check *c) {
  int64_t bad = 0, first = -1;
  for (int64_t i = 0; i < p->n; i++) {
    double x = p->after[i], want;
    if (strcmp(p->after_master_dtype, "bfloat16") == 0) want = qc_round_bf16((float)x);
    else if (strcmp(p->after_master_dtype, "float16") == 0) want = qc_f16_to_f32(qc_f32_to_f16((float)x));
    else if (strcmp(p->after_master_dtype, "float32") == 0) want = (float)x;
    else want = x;
    if (!(p->after_master[i] == want || (isnan(want) && isnan(p->after_master[i])))) {
      if (first < 0) first = i;
      bad++;
    }
  }
  c->judged = 1;
  c->verdict = bad ? QC_V_FAIL : QC_V_PASS;
  if (bad)
    snprintf(c->why, sizeof c->why, "after_master is not the updated main rounded to %s at %lld element(s) (first: index %lld): the "
             "master was not refreshed from the main, or is bound to another tensor", p->after_master_dtype, (long long)bad, (long long)first);
}

static int judge_arm(qc_step_run *r, qc_step_arm *a, qc_step_norms *nm, int *upd_fail) {
  uint8_t *tr = trained_of(r, a);
  int64_t mx = 1;
  for (int k = 0; k < a->nparam; k++) if (a->params[k].n > mx) mx = a->params[k].n;
  double *ref = malloc((size_t)mx * sizeof *ref), *u = malloc((size_t)mx * sizeof *u), *tmp = malloc((size_t)mx * sizeof *tmp);
  int rc = QC_OK;
  if (!tr || !ref || !u || !tmp) { rc = qc_err_sys("out of memory judging arm '%s'", a->name); goto done; }
  snprintf(nm->arm, sizeof nm->arm, "%s", a->name);
  qc_step_norm(a, tr, &nm->grad_norm, &nm->clip_coef);
  for (int k = 0; k < a->nparam && !rc; k++) {
    qc_step_param *p = &a->params[k];
    qc_step_check c;
    for (int64_t i = 0; i < p->n; i++) u[i] = p->after[i] - p->before[i];
    double maxchg = 0;
    int changed = 0; /* any element not exactly unchanged, a NaN included (fmax would drop it) */
    for (int64_t i = 0; i < p->n; i++) {
      changed |= u[i] != 0;
      maxchg = isnan(u[i]) ? NAN : isnan(maxchg) ? maxchg : fmax(maxchg, fabs(u[i]));
    }
    if (frozen(r, a, p->name)) {
      init_check(&c, a->name, p->name, QC_SK_FROZEN);
      c.judged = 1;
      c.verdict = changed ? QC_V_FAIL : QC_V_PASS;
      if (c.verdict == QC_V_FAIL) {
        /* the classic: AdamW's weight decay on a parameter whose gradient was zeroed */
        double e = 0, uu = 0;
        for (int64_t i = 0; i < p->n; i++) {
          double d = u[i] + a->lr * a->weight_decay * p->before[i];
          e += d * d;
          uu += u[i] * u[i];
        }
        int decay = a->weight_decay > 0 && e <= 0.0025 * uu; /* within 5% rms: the trainer's float32 arithmetic */
        snprintf(c.why, sizeof c.why, "a frozen parameter changed: max |after - before| = %.3g%s", maxchg,
                 decay ? ": exactly weight decay (lr x weight_decay x before): the parameter is still in the optimizer with a zeroed "
                         "gradient; freeze it with grad None or leave it out of the optimizer" : "");
      }
      *upd_fail |= c.verdict != QC_V_PASS;
      if ((rc = qc_step_res_add(&r->res, &c))) break;
      continue;
    }
    if (!p->grad) {
      init_check(&c, a->name, p->name, QC_SK_MISSING);
      c.judged = 1;
      c.verdict = QC_V_FAIL;
      snprintf(c.why, sizeof c.why, "a parameter without a gradient (no grad/%s)%s: declare it in 'frozen' if it is not trained", p->name,
               changed ? ", and it changed" : "");
      if ((rc = qc_step_res_add(&r->res, &c))) break;
      continue;
    }
    init_check(&c, a->name, p->name, QC_SK_UPDATE);
    qc_step_update(a, p, nm->clip_coef, QC_STEP_ASIS, ref);
    qc_metrics m;
    qc_metrics_compute(u, ref, p->n, &m);
    if (qc_step_tol_for(&r->cs->update, p->name)) judge(&c, &r->cs->update, &m);
    else judge_derived(a, p, nm->clip_coef, ref, tmp, &m, &c);
    if (c.judged && c.verdict == QC_V_FAIL) {
      *upd_fail = 1;
      if ((rc = diagnose(a, k, tr, nm->clip_coef, u, &c, tmp))) break;
    }
    if ((rc = qc_step_res_add(&r->res, &c))) break;
    if (p->after_master) {
      init_check(&c, a->name, p->name, QC_SK_MASTER);
      master_check(p, &c);
      if ((rc = qc_step_res_add(&r->res, &c))) break;
    }
  }
  for (int s = 0; !rc && s < a->nstray; s++) {
    qc_step_check c;
    init_check(&c, a->name, a->stray[s], QC_SK_MISSING);
    c.judged = 1;
    c.verdict = QC_V_FAIL;
    snprintf(c.why, sizeof c.why, "a gradient without a parameter (grad/%s has no before/%s): it updates nothing; check the "
             "parameter binding", a->stray[s], a->stray[s]);
    rc = qc_step_res_add(&r->res, &c);
  }
  if (rc) goto done;
  /* the coefficient the trainer's update implies */
  double c, rel;
  int ident;
  if ((rc = qc_step_fit(a, tr, QC_STEP_ASIS, &c, &rel, &ident))) goto done;
  nm->implied_grad_norm = NAN;
  if (!ident) {
    snprintf(nm->implied_why, sizeof nm->implied_why, "not inferable: the update barely depends on the gradient's scale (AdamW's first step)");
  } else if (!(rel <= 0.01)) {
    snprintf(nm->implied_why, sizeof nm->implied_why, "not inferable: no clip coefficient explains the update (best relative rms error %.3g)", rel);
  } else {
    nm->has_implied = 1;
    nm->implied_clip_coef = c;
    if (a->max_grad_norm > 0 && c < 1 - 1e-6) {
      nm->implied_grad_norm = a->max_grad_norm / c - 1e-6;
      snprintf(nm->implied_why, sizeof nm->implied_why, "fitted (relative rms error %.3g)", rel);
    } else
      snprintf(nm->implied_why, sizeof nm->implied_why, "fitted (relative rms error %.3g); no clipping, so the norm is not implied", rel);
  }
done:
  free(tr);
  free(ref);
  free(u);
  free(tmp);
  return rc;
}

static const qc_step_param *find_param(const qc_step_arm *a, const char *name) {
  for (int k = 0; k < a->nparam; k++)
    if (strcmp(a->params[k].name, name) == 0) return &a->params[k];
  return NULL;
}

/* Two arms must start from the same parameters and optimizer state. */
static int same_start(const qc_step_arm *a, const qc_step_arm *b, const qc_step_param *pa, const qc_step_param *pb) {
  const double *x[3][2] = {{pa->before, pb->before}, {pa->exp_avg, pb->exp_avg}, {pa->exp_avg_sq, pb->exp_avg_sq}};
  static const char *const what[3] = {"before", "state/exp_avg", "state/exp_avg_sq"};
  if (pa->n != pb->n) return qc_err("step: parameter '%s' has %lld elements in arm '%s' and %lld in '%s'", pa->name, (long long)pa->n, a->name, (long long)pb->n, b->name);
  for (int w = 0; w < 3; w++) {
    if (!x[w][0] || !x[w][1]) continue;
    for (int64_t i = 0; i < pa->n; i++)
      if (x[w][0][i] != x[w][1][i]) {
        qc_err("step: arms '%s' and '%s' do not start from the same state: %s/%s differs at index %lld (%.9g vs %.9g)", a->name, b->name,
               what[w], pa->name, (long long)i, x[w][0][i], x[w][1][i]);
        qc_hint("a one-step comparison starts both arms from the same parameters and optimizer state");
        return QC_EINPUT;
      }
  }
  return QC_OK;
}

static int judge_pair(qc_step_run *r, const qc_step_arm *a, const qc_step_arm *b, int *grad_fail, int *grad_judged, int *upd_fail) {
  char name[2 * QC_L3_NAME + 2];
  snprintf(name, sizeof name, "%s~%s", a->name, b->name);
  int64_t mx = 1;
  for (int k = 0; k < a->nparam; k++) if (a->params[k].n > mx) mx = a->params[k].n;
  double *x = malloc((size_t)mx * sizeof *x), *y = malloc((size_t)mx * sizeof *y);
  int rc = QC_OK;
  if (!x || !y) { rc = qc_err_sys("out of memory comparing arms"); goto done; }
  for (int s = 0; s < 2 && !rc; s++) {
    const qc_step_arm *p = s ? b : a, *q = s ? a : b;
    for (int k = 0; k < p->nparam && !rc; k++)
      if (!find_param(q, p->params[k].name)) {
        qc_step_check c;
        init_check(&c, name, p->params[k].name, QC_SK_MISSING);
        c.judged = 1;
        c.verdict = QC_V_FAIL;
        snprintf(c.why, sizeof c.why, "parameter in arm '%s' but not in arm '%s': the arms bind different parameters", p->name, q->name);
        rc = qc_step_res_add(&r->res, &c);
      }
  }
  for (int k = 0; k < a->nparam && !rc; k++) {
    const qc_step_param *pa = &a->params[k], *pb = find_param(b, pa->name);
    if (!pb) continue;
    if ((rc = same_start(a, b, pa, pb))) break;
    if (frozen(r, a, pa->name) || !pa->grad || !pb->grad) continue;
    qc_step_check c;
    qc_metrics m;
    for (int64_t i = 0; i < pa->n; i++) { x[i] = pa->grad[i] / a->grad_scale; y[i] = pb->grad[i] / b->grad_scale; }
    init_check(&c, name, pa->name, QC_SK_GRAD_PAIR);
    qc_metrics_compute(x, y, pa->n, &m);
    judge(&c, &r->cs->grad_pair, &m);
    *grad_judged |= c.judged;
    *grad_fail |= c.judged && c.verdict == QC_V_FAIL;
    if (c.judged && c.verdict == QC_V_FAIL && m.norm_g > 0 && m.norm_r > 0) {
      double k2 = m.cosine * m.norm_g / m.norm_r; /* <x, y> / <y, y>: the factor x carries */
      size_t n = strlen(c.why);
      snprintf(c.why + n, sizeof c.why - n, "; %s's gradient is %.4g x %s's (fitted)", a->name, k2, b->name);
    }
    if ((rc = qc_step_res_add(&r->res, &c))) break;
    for (int64_t i = 0; i < pa->n; i++) { x[i] = pa->after[i] - pa->before[i]; y[i] = pb->after[i] - pb->before[i]; }
    init_check(&c, name, pa->name, QC_SK_UPDATE_PAIR);
    qc_metrics_compute(x, y, pa->n, &m);
    judge(&c, &r->cs->update_pair, &m);
    *upd_fail |= c.judged && c.verdict == QC_V_FAIL;
    rc = qc_step_res_add(&r->res, &c);
  }
done:
  free(x);
  free(y);
  return rc;
}

int qc_step_judge(qc_step_run *r) {
  double t0 = qc_now_s();
  int rc = QC_OK, upd_fail = 0, grad_fail = 0, grad_judged = 0, missing = 0;
  for (int i = 0; i < r->narm && i < (int)(sizeof r->res.norms / sizeof r->res.norms[0]); i++) {
    if ((rc = judge_arm(r, &r->arms[i], &r->res.norms[i], &upd_fail))) return rc;
    r->res.nnorms = i + 1;
  }
  for (int i = 0; i < r->narm; i++)
    for (int j = i + 1; j < r->narm; j++)
      if ((rc = judge_pair(r, &r->arms[i], &r->arms[j], &grad_fail, &grad_judged, &upd_fail))) return rc;
  for (int i = 0; i < r->res.n; i++)
    if ((r->res.v[i].kind == QC_SK_MISSING || r->res.v[i].kind == QC_SK_MASTER) && r->res.v[i].verdict != QC_V_PASS) missing = 1;
  /* the localization */
  const char *loc = "", *text = "";
  if (grad_fail) {
    loc = "gradients";
    text = upd_fail ? "the gradients differ between the arms (and the updates with them): check the backward, reduction and loss scale (layer 1)"
                    : "the gradients differ between the arms: check the backward, reduction and loss scale (layer 1)";
  } else if (upd_fail) {
    loc = "update";
    text = grad_judged ? "gradients close but updates differ: check scaling, clipping, optimizer state and parameter binding"
                       : "the updates differ from the recomputation (gradients not compared): check scaling, clipping, optimizer state and "
                         "parameter binding";
  } else if (missing) {
    loc = "binding";
    text = "parameters and gradients do not pair up, or the master is not the updated main: check the parameter binding";
  }
  snprintf(r->res.localization, sizeof r->res.localization, "%s", loc);
  snprintf(r->res.loc_text, sizeof r->res.loc_text, "%s", text);
  r->t_judge = qc_now_s() - t0;
  return rc;
}
