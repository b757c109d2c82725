/* forward.c: see forward.h. The check (the reference forward, its error
 * model, the legal variants) and its diagnosis (the predictions of what
 * users get wrong in a forward). No class is named: the quantizer knobs
 * are the contract's keys, varied through the class's key table. */
#include "engine/forward.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/qc.h"
#include "engine/diagnose_priv.h"
#include "engine/variants.h"
#include "numerics/decode.h"
#include "numerics/formats.h"
#include "numerics/metrics.h"

/* Forward diagnoses only up to this many multiply-adds per forward run
 * (each hypothesis is one or more runs). */
#define FWD_DIAG_MAX_WORK 4e8

static int qc_diagnose_forward(const qc_ctx *ctx, const qc_module *m, const qc_tensor *y, const qc_tensor *r, qc_fwd_ref_fn fwd,
                               qc_check *k);

/* The reference forward of m into *r with its error model *tm: the
 * class's reference forward (with its model, or the one below when it
 * leaves tm->k 0), else its float64 forward when the contract
 * quantizes nothing (model: the reduction over the first input's last
 * dimension, terms not known). QC_NA when neither applies. */
static void default_model(const qc_module *m, qc_tol_model *tm);

static int ref_forward(const qc_ctx *ctx, const qc_module *m, qc_fwd_ref_fn fwd, qc_tensor *r, qc_tol_model *tm) {
  memset(tm, 0, sizeof *tm);
  int rc;
  if (fwd) { /* the class's reference forward; its model, or (k = 0) the one below */
    if ((rc = fwd(ctx, m, r, tm))) return rc;
    if (tm->k > 0) {
      qc_audit_bf16_compute(m, tm);
      return QC_OK;
    }
  } else {
    if (!m->cls->forward || qc_quantizes(m) || ctx->round_ops || ctx->wscale > 0) return QC_NA;
    if ((rc = m->cls->forward(m, m, r))) return rc;
  }
  default_model(m, tm);
  return QC_OK;
}

/* The forward's default error model of m into *tm: the reduction over the
 * last dimension of the input of the class's first gradient, or the class's
 * model of that gradient run forward where its accumulation term is the
 * larger; bf16 compute roundings added where the contract says so. */
static void default_model(const qc_module *m, qc_tol_model *tm) {
  /* the input of the class's first gradient that m holds as floats (d_x: x; d_q: q), not whichever
   * the dump lists first (moe's topk_weights, rope's inv_freq table); else the first floating input
   * (rope's positions are ids) */
  const qc_tensor *x = NULL;
  for (int j = 0, best = 0; j < m->inputs.n; j++) {
    const int k = qc_module_input_grad(m, m->inputs.t[j].name);
    if (k > 0 && (best == 0 || k < best) && qc_dtype_is_float(m->inputs.t[j].dtype)) {
      best = k;
      x = &m->inputs.t[j];
    }
  }
  for (int j = 0; j < m->inputs.n && !x; j++)
    if (qc_dtype_is_float(m->inputs.t[j].dtype)) x = &m->inputs.t[j];
  if (!x && m->inputs.n) x = &m->inputs.t[0];
  tm->k = x && x->ndim ? x->shape[x->ndim - 1] : 1;
  if (tm->k < 1) tm->k = 1;
  tm->lambda = 1;
  snprintf(tm->why, sizeof tm->why, "the %s forward, each output reducing over at most %lld values (the last dimension of "
           "inputs/%s)", m->cls->name, (long long)tm->k, x ? x->name : "-");
  /* A chain (an expert's three GEMMs, a scan) rounds in more steps than one
   * reduction, and rope's float32 angles err by ~u p inv_freq: the class's
   * error model of d_<first input>, the same chain run backward, when its
   * accumulation term lambda sqrt(K) u is the larger (its terms are the
   * gradient's, not the output's: not used) */
  const qc_tensor *y = qc_tset_get(&m->outputs, "y");
  char g[80];
  qc_tol_model gm;
  memset(&gm, 0, sizeof gm);
  qc_err_state es; /* the class may have no model of that gradient: the reduction's model then */
  qc_err_save(&es);
  const int have = x && y && m->cls->tol_model && snprintf(g, sizeof g, "d_%s", x->name) < (int)sizeof g &&
                   m->cls->tol_model(m, y, g, &gm) == QC_OK;
  qc_err_restore(&es);
  if (have && (gm.lambda > 0 ? gm.lambda : 1) * sqrt((double)gm.k) > tm->lambda * sqrt((double)tm->k)) {
    tm->k = gm.k;
    tm->lambda = gm.lambda > 0 ? gm.lambda : 1;
    tm->margin = gm.margin;
    snprintf(tm->why, sizeof tm->why, "the %s forward, modelled as its %s chain run forward: %s", m->cls->name, g, gm.why);
  }
  qc_audit_bf16_compute(m, tm);
}

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

/* Derive y's tolerance from model tm at the judged dtype, set the bias
 * allowance and the noise level, and give k its verdict. */
static int judge(const qc_tol_model *tm, qc_check *k) {
  qc_tol decl, use;
  memset(&decl, 0, sizeof decl);
  decl.derive = 1;
  decl.derive_rounded_operands = -1;
  qc_tol_spec spec;
  qc_tol_terms terms;
  double pre = 0;
  qc_dtype dt = QC_F32;
  if (qc_dtype_from_name(k->judged_dtype, &dt)) dt = QC_F32;
  int rc = qc_tol_from_model(tm, &decl, qc_dtype_name(dt), &spec, &terms, &pre);
  if (rc) return rc;
  qc_tol_fill_derived(tm, &spec, &terms, &decl, k->m.norm_r == 0, &use);
  k->level = terms.rel_l2;
  k->m.term_floor = tm->terms > 0 ? terms.margin * terms.lambda * terms.u_acc * tm->terms : 0.0;
  double te = k->m.norm_r > 0 ? k->m.term_floor / k->m.norm_r : 0.0;
  qc_bias_allow(&k->m, fmax(pre, te));
  k->has_tol = 1;
  k->tol = use;
  qc_audit_verdict(k, dt, &use);
  return QC_OK;
}

/* Compare y (the dump's tensor `what`: "y", "saved/lse") with r and judge
 * it into a fresh check *k. */
static int compare(const qc_ctx *ctx, const qc_module *m, const char *what, const qc_tensor *y, const qc_tensor *r,
                   const qc_tol_model *tm, qc_check *k) {
  qc_tol none;
  memset(&none, 0, sizeof none);
  qc_check_init(k, m, "forward", what, r->ndim, r->shape, &none);
  snprintf(k->kind, sizeof k->kind, "forward");
  snprintf(k->cand_dtype, sizeof k->cand_dtype, "%s", qc_dtype_name(y->dtype));
  int rc = qc_audit_compare(ctx, y, r, &none, k);
  return rc ? rc : judge(tm, k);
}

/* Add the forward check of m that could not be run: a failed check that
 * says "not judged" and why, counted against the verdict as a declared
 * gradient the candidate lacks is (engine/audit.c: "missing"), so outputs/y
 * is never silently left out. */
static int not_judged(qc_audit *a, const qc_module *m, const qc_tensor *y, const char *why) {
  qc_tol none;
  qc_check k;
  memset(&none, 0, sizeof none);
  qc_check_init(&k, m, "forward", "y", y->ndim, y->shape, &none);
  k.has_tol = 0;
  snprintf(k.kind, sizeof k.kind, "forward");
  snprintf(k.cand_dtype, sizeof k.cand_dtype, "%s", qc_dtype_name(y->dtype));
  k.verdict = QC_V_FAIL;
  snprintf(k.why, sizeof k.why, "not judged: %s", why);
  if (qc_verbose) fprintf(stderr, "qatcheck: %s: outputs/y not judged: %s\n", m->path, why);
  return qc_results_add(a->res, &k);
}

/* The forward check's variants: the module, its output and the forward
 * (or, name set, saved/<name> and the class's recomputation of it). */
typedef struct fwd_variants {
  const qc_ctx *ctx;
  const qc_module *m;
  const qc_tensor *y;
  qc_fwd_ref_fn fwd;
  const char *name;       /* NULL: outputs/y; else the saved tensor judged */
  qc_saved_ref_fn saved;
  qc_variants list;
} fwd_variants;

/* Saved tensor `name` of m recomputed by the class's fn into *r with its
 * error model *tm (the forward's default where the class leaves tm->k 0). */
static int saved_forward(const qc_ctx *ctx, const qc_module *m, qc_saved_ref_fn fn, const char *name, qc_tensor *r,
                         qc_tol_model *tm) {
  int rc = fn(ctx, m, name, r, tm);
  if (rc) return rc;
  if (tm->k > 0) qc_audit_bf16_compute(m, tm);
  else default_model(m, tm);
  return QC_OK;
}

/* The entries r (float64) leaves without a value (non-finite: the LSE of
 * a query with no visible key) set to 0 in r and, g non-NULL, in g: they
 * are not compared. */
static void zero_unvalued(qc_tensor *r, double *g) {
  double *v = r->data;
  for (int64_t i = 0, n = qc_numel(r); i < n; i++)
    if (!isfinite(v[i])) {
      v[i] = 0;
      if (g) g[i] = 0;
    }
}

/* outputs/y judged against the forward of variant v, under the variant's
 * own error model (qc_variant_judge_fn). QC_NA where the forward has no
 * such rounding or gives another size. */
static int fwd_variant(void *arg, int i, const qc_variant *v, qc_check *kv) {
  fwd_variants *s = arg;
  (void)i;
  qc_ctx c;
  qc_module alt;
  qc_tensor rv = {0};
  qc_tol_model tv;
  int rc = qc_variant_apply(v, s->ctx, s->m, NULL, &c, &alt, NULL);
  if (!rc) rc = s->name ? saved_forward(&c, &alt, s->saved, s->name, &rv, &tv) : ref_forward(&c, &alt, s->fwd, &rv, &tv);
  if (!rc && qc_numel(&rv) != qc_numel(s->y)) rc = QC_NA;
  if (!rc && s->name) zero_unvalued(&rv, NULL); /* the candidate's were zeroed with the contract's */
  if (!rc) {
    char what[QC_NAMELEN + 8];
    snprintf(what, sizeof what, s->name ? "saved/%s" : "y", s->name);
    memcpy(rv.shape, s->y->shape, sizeof rv.shape); /* the same values, laid out as the dump's */
    rv.ndim = s->y->ndim;
    rc = compare(s->ctx, s->m, what, s->y, &rv, &tv, kv);
  }
  qc_tensor_free(&rv);
  qc_variant_release(v, s->m, &alt, NULL);
  return rc;
}

/* outputs/y's check (qc_forward_check). */
static int output_check(qc_audit *a, const qc_module *m) {
  const qc_tensor *y = qc_tset_get(&m->outputs, "y");
  const qc_registry_row *row = qc_registry_find(m->cls->name);
  if (!y || !row || !qc_dtype_is_float(y->dtype) || y->dtype == QC_E2M1X2 || qc_numel(y) == 0) return QC_OK;
  qc_tensor r = {0};
  qc_tol_model tm;
  qc_check k;
  char why[sizeof k.why - 16];
  qc_err_state es; /* the class's fd forward may refuse what the VJP takes: the check is then not judged */
  qc_err_save(&es);
  int rc = ref_forward(a->ctx, m, row->forward, &r, &tm);
  if (rc && rc != QC_NA && !row->forward)
    snprintf(why, sizeof why, "the %s forward cannot be computed: %s", m->cls->name,
             qc_err_msg()[0] ? qc_err_msg() : "no reason given");
  if (rc && rc != QC_NA && row->forward) qc_err_keep(&es); /* the reference forward's refusal: the module cannot be judged */
  else qc_err_restore(&es);
  if (rc == QC_NA) { /* no forward for this contract (a quantized one, without the class's reference forward) */
    if (qc_verbose) fprintf(stderr, "qatcheck: %s: outputs/y not checked: no forward of class %s for this contract\n", m->path,
                            m->cls->name);
    return QC_OK;
  }
  if (rc && !row->forward) {
    rc = not_judged(a, m, y, why);
    goto done;
  }
  if (rc) goto done;
  if (qc_numel(&r) != qc_numel(y) && !row->forward) { /* a class's output may be another tensor than its fd forward's */
    char s1[64], s2[64];
    snprintf(why, sizeof why, "outputs/y is %s but the %s forward gives %s: it cannot be modelled",
             qc_shape_str(y->ndim, y->shape, s1, sizeof s1), m->cls->name, qc_shape_str(r.ndim, r.shape, s2, sizeof s2));
    rc = not_judged(a, m, y, why);
    goto done;
  }
  if (qc_numel(&r) != qc_numel(y) || !qc_shape_eq(&r, y)) {
    if (qc_numel(&r) != qc_numel(y)) {
      char s1[64], s2[64];
      rc = qc_err("%s: outputs/y is %s but the forward the contract defines gives %s", m->path,
                  qc_shape_str(y->ndim, y->shape, s1, sizeof s1), qc_shape_str(r.ndim, r.shape, s2, sizeof s2));
      qc_hint("outputs/y is the module's output as its forward returned it; drop it from the dump if it is something else");
      goto done;
    }
    memcpy(r.shape, y->shape, sizeof r.shape); /* the same values, laid out as the dump's */
    r.ndim = y->ndim;
  }
  if ((rc = compare(a->ctx, m, "y", y, &r, &tm, &k))) goto done;
  /* the legal variants (engine/variants.c): operands rounded to bf16 (a
   * quantizer's output, the class's ops, autocast's inputs), for a failed
   * check or a pass whose |z| is above half its bound, as the gradients' */
  fwd_variants fv = {.ctx = a->ctx, .m = m, .y = y, .fwd = row->forward};
  qc_variants_of(m, NULL, QC_VARIANTS_FORWARD, a->cs->variants_off, a->autocast, &fv.list);
  if ((rc = qc_variants_judge(&fv.list, fwd_variant, &fv, &k))) goto done;
  if (k.verdict != QC_V_PASS && (rc = qc_diagnose_forward(a->ctx, m, y, &r, row->forward, &k))) goto done;
  rc = qc_results_add(a->res, &k);
done:
  qc_tensor_free(&r);
  return rc;
}

/* The flat index i of t as "[a, b, ...]" into buf[n]. */
static void index_str(const qc_tensor *t, int64_t i, char *buf, size_t n) {
  size_t l = 0;
  int64_t div = qc_numel(t);
  buf[0] = 0;
  for (int d = 0; d < t->ndim && l < n; d++) {
    div = t->shape[d] ? div / t->shape[d] : 1;
    l += (size_t)snprintf(buf + l, n - l, "%s%lld", d ? ", " : "[", (long long)(div ? i / div % t->shape[d] : 0));
  }
  if (l < n) snprintf(buf + l, n - l, t->ndim ? "]" : "[]");
}

/* Add a failed check of saved tensor t of m: why[] says what. */
static int saved_failed(qc_audit *a, const qc_module *m, const qc_tensor *t, const char *why) {
  qc_tol none;
  qc_check k;
  char what[QC_NAMELEN + 8];
  memset(&none, 0, sizeof none);
  snprintf(what, sizeof what, "saved/%s", t->name);
  qc_check_init(&k, m, "forward", what, t->ndim, t->shape, &none);
  k.has_tol = 0;
  snprintf(k.kind, sizeof k.kind, "forward");
  snprintf(k.cand_dtype, sizeof k.cand_dtype, "%s", qc_dtype_name(t->dtype));
  k.verdict = QC_V_FAIL;
  snprintf(k.why, sizeof k.why, "%s", why);
  if (qc_verbose) fprintf(stderr, "qatcheck: %s: %s: %s\n", m->path, what, why);
  return qc_results_add(a->res, &k);
}

static int diagnose_saved(const qc_ctx *ctx, const qc_module *m, const qc_tensor *t, const qc_tensor *r, qc_check *k);

/* Saved tensor t of m (a float: what the forward saved and the backward
 * reads): its non-finite values, NaN anywhere or +-Inf where the class's
 * recomputation (row's `saved`; QC_NA or none: not recomputed) has a
 * value, are a failed check naming the dataset and the first index; else,
 * recomputed, it is judged against the recomputation as outputs/y is
 * against the forward (the same model, variants and verdict; the entries
 * the forward leaves without a value are not compared). */
static int saved_check(qc_audit *a, const qc_module *m, const qc_registry_row *row, const qc_tensor *t) {
  qc_tensor r = {0}, gc = {0};
  qc_tol_model tm;
  qc_check k;
  int rc = QC_NA, have = 0;
  if (row->saved) {
    qc_err_state es; /* QC_NA: not one the class recomputes; a refusal is the run's error */
    qc_err_save(&es);
    rc = saved_forward(a->ctx, m, row->saved, t->name, &r, &tm);
    if (rc && rc != QC_NA) {
      qc_err_keep(&es);
      return rc;
    }
    qc_err_restore(&es);
    have = rc == QC_OK;
    if (have && qc_numel(&r) != qc_numel(t)) {
      char s1[64], s2[64];
      rc = qc_err("%s: saved/%s is %s but the %s forward gives %s", m->path, t->name,
                  qc_shape_str(t->ndim, t->shape, s1, sizeof s1), m->cls->name, qc_shape_str(r.ndim, r.shape, s2, sizeof s2));
      goto done;
    }
  }
  const int64_t n = qc_numel(t);
  if ((rc = qc_tensor_alloc(&gc, t->name, QC_F64, t->ndim, t->shape)) || (rc = qc_tensor_to_f64(t, gc.data))) goto done;
  double *g = gc.data, *rv = have ? r.data : NULL;
  int64_t bad = 0, first = -1, unvalued = 0;
  for (int64_t i = 0; i < n; i++) {
    if (rv && !isfinite(rv[i])) unvalued++;
    if (isfinite(g[i]) || (!isnan(g[i]) && rv && !isfinite(rv[i]))) continue;
    if (first < 0) first = i;
    bad++;
  }
  if (bad) {
    char idx[160], why[400];
    index_str(t, first, idx, sizeof idx);
    snprintf(why, sizeof why, "saved/%s holds %lld non-finite value(s), the first at %s (%g): the forward saved them and the "
             "backward reads them", t->name, (long long)bad, idx, g[first]);
    rc = saved_failed(a, m, t, why);
    goto done;
  }
  rc = QC_OK;
  if (!have) goto done; /* finite, not recomputed: nothing more to judge */
  const qc_tensor *cand = t;
  if (unvalued) { /* compared without the entries the forward leaves without a value */
    zero_unvalued(&r, g);
    cand = &gc;
  }
  memcpy(r.shape, t->shape, sizeof r.shape);
  r.ndim = t->ndim;
  char what[QC_NAMELEN + 8];
  snprintf(what, sizeof what, "saved/%s", t->name);
  if ((rc = compare(a->ctx, m, what, cand, &r, &tm, &k))) goto done;
  fwd_variants fv = {.ctx = a->ctx, .m = m, .y = cand, .name = t->name, .saved = row->saved};
  qc_variants_of(m, NULL, QC_VARIANTS_FORWARD, a->cs->variants_off, a->autocast, &fv.list);
  if ((rc = qc_variants_judge(&fv.list, fwd_variant, &fv, &k))) goto done;
  if (k.verdict != QC_V_PASS && (rc = diagnose_saved(a->ctx, m, cand, &r, &k))) goto done;
  snprintf(k.cand_dtype, sizeof k.cand_dtype, "%s", qc_dtype_name(t->dtype));
  if (k.verdict != QC_V_PASS && !k.why[0])
    snprintf(k.why, sizeof k.why, "saved/%s is not the forward of the module's inputs under its contract", t->name);
  rc = qc_results_add(a->res, &k);
done:
  qc_tensor_free(&r);
  qc_tensor_free(&gc);
  return rc;
}

int qc_forward_check(qc_audit *a, const qc_module *m) {
  int rc = output_check(a, m);
  if (rc) return rc;
  const qc_registry_row *row = qc_registry_find(m->cls->name);
  if (!row || a->cs->data == QC_DATA_GENERATE) return QC_OK; /* a generator's saved tensors are qatcheck's own forward */
  for (int i = 0; i < m->saved.n && !rc; i++) {
    const qc_tensor *t = &m->saved.t[i];
    if (t->dtype == QC_F64 || t->dtype == QC_F32 || t->dtype == QC_F16 || t->dtype == QC_BF16) rc = saved_check(a, m, row, t);
  }
  return rc;
}

/* ---- the diagnosis ------------------------------------------------------ */

/* Run the forward of variant (c, alt) into d->p; QC_NA when it does not
 * apply or gives another size. */
static int predict(dg *d, const qc_ctx *c, const qc_module *alt, qc_fwd_ref_fn fwd) {
  qc_tensor y = {0};
  qc_tol_model tm;
  qc_err_state es; /* a prediction that cannot be made is no error */
  qc_err_save(&es);
  int rc = ref_forward(c, alt, fwd, &y, &tm);
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

/* Diagnose failed check k of saved tensor t against its recomputation r
 * (float64): the generic predictions only (a factor, such as log2(e) for
 * an LSE in the other base; moved or zeroed rows), since the class's
 * hypotheses predict outputs/y. QC_OK, or QC_ESYS out of memory. */
static int diagnose_saved(const qc_ctx *ctx, const qc_module *m, const qc_tensor *t, const qc_tensor *r, qc_check *k) {
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

/* Diagnose failed forward check k: candidate y against reference r
 * (float64) of module m, fwd the class's reference forward (NULL: none, so
 * only the predictions from r). Fills k's hypotheses and diagnosis. QC_OK,
 * or QC_ESYS out of memory. */
static int qc_diagnose_forward(const qc_ctx *ctx, const qc_module *m, const qc_tensor *y, const qc_tensor *r, qc_fwd_ref_fn fwd,
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
