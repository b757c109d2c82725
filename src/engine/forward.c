/* forward.c: see forward.h. The check of outputs/y and of the saved
 * tensors (the reference forward and its error model are forward_ref.c's,
 * the diagnosis forward_diag.c's): the comparison, the derived tolerance,
 * the legal variants, the not-judged and non-finite rows. No class is
 * named. */
#include "engine/forward.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/qc.h"
#include "engine/forward_priv.h"
#include "engine/variants.h"
#include "numerics/decode.h"
#include "numerics/formats.h"
#include "numerics/metrics.h"

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
  if (tm->exact) { /* every element bit for bit (qc_tol_model.exact) */
    use.has_max_abs = 1;
    use.max_abs = 0;
    size_t o = strlen(use.reasoning);
    snprintf(use.reasoning + o, sizeof use.reasoning - o, "; exact: max_abs 0, every element bit for bit");
  }
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
  if (!rc) rc = s->name ? qc_fwd_saved(&c, &alt, s->saved, s->name, &rv, &tv) : qc_fwd_reference(&c, &alt, s->fwd, &rv,
                                                                                                  &tv);
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
  int rc = qc_fwd_reference(a->ctx, m, row->forward, &r, &tm);
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
  qc_check k;
  qc_fwd_saved_init(&k, m, t, "forward");
  k.verdict = QC_V_FAIL;
  snprintf(k.why, sizeof k.why, "%s", why);
  if (qc_verbose) fprintf(stderr, "qatcheck: %s: %s: %s\n", m->path, k.tensor, why);
  return qc_results_add(a->res, &k);
}

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
    rc = qc_fwd_saved(a->ctx, m, row->saved, t->name, &r, &tm);
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
  if (k.verdict != QC_V_PASS && (rc = qc_diagnose_saved(a->ctx, m, cand, &r, &k))) goto done;
  snprintf(k.cand_dtype, sizeof k.cand_dtype, "%s", qc_dtype_name(t->dtype));
  if (k.verdict != QC_V_PASS && !k.why[0])
    snprintf(k.why, sizeof k.why, "saved/%s is not the forward of the module's inputs under its contract", t->name);
  rc = qc_results_add(a->res, &k);
done:
  qc_tensor_free(&r);
  qc_tensor_free(&gc);
  return rc;
}

/* x rounded to dt, the saved copy's element type (a float8 copy as CUDA's
 * saturating cast); x itself for a wider or non-float type. */
static double copy_round(double x, qc_dtype dt) {
  if (dt == QC_E4M3) return qc_e4m3_to_f32(qc_f32_to_e4m3((float)x));
  if (dt == QC_E5M2) return qc_e5m2_to_f32(qc_f32_to_e5m2((float)x));
  return dt == QC_BF16 || dt == QC_F16 || dt == QC_F32 ? qc_round_to(x, dt) : x;
}

/* Saved tensor t of m, a copy of input x (qc_module_saved_copy): each value
 * is x's, or x's rounded to t's element type (a bf16 or float8 copy; a
 * float8 value beyond the format's range may be its Inf or NaN, as torch's
 * cast gives); anything else is a stale or mismatched copy, which the
 * backward reads in place of the input: a failed check naming the
 * dataset, the count and the first index. Another shape than x's, or a
 * packed or scale type, cannot be compared: QC_EINPUT. */
static int copy_check(qc_audit *a, const qc_module *m, const qc_tensor *t, const qc_tensor *x) {
  char s1[64], s2[64];
  if (t->ndim != x->ndim || qc_numel(t) != qc_numel(x) || memcmp(t->shape, x->shape, (size_t)t->ndim * sizeof *t->shape)) {
    qc_hint("a saved copy of an input is compared with it element by element: save it in the input's layout, or name "
            "None for it in qatcheck_saved (docs/qatdump.md)");
    return qc_err("%s: saved/%s is %s but inputs/%s is %s: as a saved copy of the input it must have its shape", m->path,
                  t->name, qc_shape_str(t->ndim, t->shape, s1, sizeof s1), x->name,
                  qc_shape_str(x->ndim, x->shape, s2, sizeof s2));
  }
  if (t->dtype == QC_E2M1X2 || t->dtype == QC_E8M0)
    return qc_err("%s: saved/%s has dtype %s: a saved copy of inputs/%s holds one value an element, as the input does "
                  "(float32, bfloat16, float16, float8 or the input's own type)", m->path, t->name,
                  qc_dtype_name(t->dtype), x->name);
  const int64_t n = qc_numel(t);
  double *sv = qc_malloc((size_t)n * sizeof *sv, "saved copy"), *xv = qc_malloc((size_t)n * sizeof *xv, "saved copy's input");
  int rc = QC_ESYS;
  if (!sv || !xv || (rc = qc_tensor_to_f64(t, sv)) || (rc = qc_tensor_to_f64(x, xv))) goto done;
  const double big = t->dtype == QC_E4M3 ? 448.0 : t->dtype == QC_E5M2 ? 57344.0 : INFINITY;
  int64_t bad = 0, first = -1;
  for (int64_t i = 0; i < n; i++) {
    const double s = sv[i], v = xv[i];
    if (s == v || (isnan(s) && isnan(v)) || s == copy_round(v, t->dtype) || (!isfinite(s) && fabs(v) > big)) continue;
    if (first < 0) first = i;
    bad++;
  }
  rc = QC_OK;
  if (!bad) {
    if (qc_verbose) fprintf(stderr, "qatcheck: %s: saved/%s is a copy of inputs/%s (%s)\n", m->path, t->name, x->name,
                            qc_dtype_name(t->dtype));
    goto done;
  }
  char idx[160], why[480];
  index_str(t, first, idx, sizeof idx);
  char rnd[48] = "";
  if (t->dtype != x->dtype) snprintf(rnd, sizeof rnd, " and from their rounding to %s", qc_dtype_name(t->dtype));
  snprintf(why, sizeof why, "saved/%s is not a copy of inputs/%s: %lld of %lld values differ from the input's%s, the first "
           "at %s (%.9g saved, %.9g in the input): a stale or mismatched copy, which the backward reads in place of the "
           "input", t->name, x->name, (long long)bad, (long long)n, rnd, idx, sv[first], xv[first]);
  rc = saved_failed(a, m, t, why);
done:
  free(sv);
  free(xv);
  return rc;
}

int qc_forward_check(qc_audit *a, const qc_module *m) {
  int rc = output_check(a, m);
  if (rc) return rc;
  const qc_registry_row *row = qc_registry_find(m->cls->name);
  if (!row || a->cs->data == QC_DATA_GENERATE) return QC_OK; /* a generator's saved tensors are qatcheck's own forward */
  for (int i = 0; i < m->saved.n && !rc; i++) {
    const qc_tensor *t = &m->saved.t[i], *x = qc_module_saved_copy(m, t->name);
    if (x) rc = copy_check(a, m, t, x);
    else if (t->dtype == QC_F64 || t->dtype == QC_F32 || t->dtype == QC_F16 || t->dtype == QC_BF16) rc = saved_check(a, m, row, t);
    else if (row->select) rc = qc_fwd_select_check(a, m, row, t); /* QC_NA inside: not a selection it judges */
  }
  return rc;
}
