/* audit.c: see audit.h. */
#include "engine/audit.h"

#include <math.h>
#include <time.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend/backend.h"
#include "numerics/formats.h"
#include "core/qc.h"
#include "numerics/decode.h"
#include "model/tol.h"
#include "engine/diagnose.h"
#include "engine/stream.h"
#include "engine/variants.h"

/* The precision check k is judged at (qc_audit_dtype of g's values gd). */
static qc_dtype judged_dtype(const qc_tensor *g, const double *gd, const qc_tol *t, qc_check *k) {
  int f = g->dtype == QC_F32 || g->dtype == QC_F64;
  return qc_audit_dtype(g->dtype, f ? qc_values_dtype(gd, qc_numel(g), g->dtype) : g->dtype, t, k);
}

/* k's reference is not finite somewhere: QC_EINPUT naming it. */
static int ref_not_finite(const qc_check *k) {
  qc_err("%s: the reference '%s' has %lld non-finite value(s) for dY '%s': its inputs, parameters or dY are not finite",
         k->module, k->tensor, (long long)k->m.ref_nonfinite, k->dy);
  qc_hint("a gradient computed from non-finite data cannot be judged; check the dump");
  return QC_EINPUT;
}

/* The narrowest float type holding every value of g when it is stored as
 * float32 or float64 (qc_values_dtype_of: one pass over g), else g's dtype. */
static qc_dtype audit_values(const qc_tensor *g) {
  return g->dtype == QC_F32 || g->dtype == QC_F64 ? qc_values_dtype_of(g) : g->dtype;
}

/* What compare_held reads of g: its values' dtype on the host path (one
 * pass over g), nothing otherwise. */
static qc_dtype held_of(const qc_tensor *g) { return qc_compare_host_dtype(g->dtype) ? audit_values(g) : g->dtype; }

/* qc_audit_compare with held = held_of(g) given, for a candidate compared
 * with several references (a check's variants): the pass over g that
 * finds it is made once, not per reference. */
static int compare_held(const qc_ctx *ctx, const qc_tensor *g, qc_dtype held, const qc_tensor *r, const qc_tol *t,
                        qc_check *k) {
  int64_t n = qc_numel(r);
  if (qc_compare_host_dtype(g->dtype)) {
    /* on the host, whatever the backend: g and r are host tensors, and one
     * pass reading the candidate as it is stored costs less than staging
     * both on a device (two float64 copies uploaded for one reduction) */
    const qc_dtype dt = qc_audit_dtype(g->dtype, held, t, k);
    const int64_t cols = r->ndim ? r->shape[r->ndim - 1] : 1;
    const int bias = dt == QC_BF16 || dt == QC_F16 || dt == QC_F32 || dt == QC_F64;
    int rc = qc_compare_host(g, (const double *)r->data, cols ? n / cols : 0, cols, dt, bias, &k->m);
    if (rc) return rc;
    if (k->m.ref_nonfinite) return ref_not_finite(k);
    snprintf(k->judged_dtype, sizeof k->judged_dtype, "%s", qc_dtype_name(dt));
    k->has_metrics = 1;
    return QC_OK;
  }
  double *gd = qc_malloc((size_t)n * sizeof *gd, "candidate gradient (float64)");
  if (!gd) return QC_ESYS;
  int rc = qc_tensor_to_f64(g, gd);
  if (!rc) rc = ctx->be->metrics(ctx->be, gd, (const double *)r->data, n, &k->m);
  if (rc) {
    free(gd);
    return rc;
  }
  if (k->m.ref_nonfinite) {
    free(gd);
    return ref_not_finite(k);
  }
  qc_dtype dt = judged_dtype(g, gd, t, k);
  if (dt == QC_BF16 || dt == QC_F16 || dt == QC_F32 || dt == QC_F64) {
    int64_t cols = r->ndim ? r->shape[r->ndim - 1] : 1;
    rc = qc_bias_pass(gd, (const double *)r->data, cols ? n / cols : 0, cols, dt, &k->m);
  }
  free(gd);
  if (rc) return rc;
  snprintf(k->judged_dtype, sizeof k->judged_dtype, "%s", qc_dtype_name(dt));
  k->has_metrics = 1;
  return QC_OK;
}

int qc_audit_compare(const qc_ctx *ctx, const qc_tensor *g, const qc_tensor *r, const qc_tol *t, qc_check *k) {
  return compare_held(ctx, g, held_of(g), r, t, k);
}

qc_dtype qc_audit_cand_dtype(const qc_tensor *g, const qc_tol *t, qc_check *k) {
  return qc_audit_dtype(g->dtype, audit_values(g), t, k); /* unreadable: judged at its storage dtype */
}

void qc_check_init(qc_check *k, const qc_module *m, const char *dy, const char *tensor, int ndim, const int64_t *shape,
                   const qc_tol *t) {
  memset(k, 0, sizeof *k);
  snprintf(k->module, sizeof k->module, "%s", m->path);
  snprintf(k->cls, sizeof k->cls, "%s", m->cls->name);
  snprintf(k->dy, sizeof k->dy, "%s", dy);
  snprintf(k->tensor, sizeof k->tensor, "%s", tensor);
  k->ndim = ndim;
  memcpy(k->shape, shape, (size_t)ndim * sizeof *shape);
  k->has_tol = 1;
  k->tol = *t;
  k->m.noise_multiple = k->m.noise_floor = NAN;
  k->m.e_par = k->m.bias_sd = k->m.bias_allow = k->m.bias_z_raw = k->m.bias_z = NAN;
}

const qc_tol *qc_audit_tol(const qc_audit *a, const qc_module *m, const char *tensor) {
  const qc_tol *t = qc_case_tol_for(a->cs, m->cls->name, tensor);
  if (!t) {
    qc_err("case '%s': no tolerance for '%s': module '%s' (class %s) has this gradient", a->cs->path, tensor, m->path,
           m->cls->name);
    qc_hint("declare \"%s\": {\"rel_l2\": ..., \"reasoning\": \"...\"} under tolerances; 'qatcheck tol' derives one",
            tensor);
  }
  return t;
}

/* 1 when `name` is a word of the space-separated list (NULL: none). */
static int in_words(const char *list, const char *name) {
  /* list is "/d_a/d_b/": '/' cannot occur in an HDF5 dataset name */
  size_t n = strlen(name);
  for (const char *p = list ? strstr(list, name) : NULL; p; p = strstr(p + 1, name))
    if (p > list && p[-1] == '/' && p[n] == '/') return 1;
  return 0;
}


/* The candidate's gradients for dY index i. */
static int run_candidate(qc_audit *a, const qc_module *m, int i, qc_tset *out, const qc_tset **use) {
  const qc_tensor *dy = &m->grad_out.t[i];
  switch (a->cs->cand) {
    case QC_CAND_BUILTIN: *use = out; return m->cls->production(a->ctx, m, dy, out);
    case QC_CAND_PLUGIN: *use = out; return qc_plugin_vjp(a->plugin, m, dy, out);
    case QC_CAND_DUMP: *use = m->cand ? &m->cand[i] : out; return QC_OK;
  }
  return qc_err("unknown candidate kind");
}

/* The fast path of m's class for dY index i, where it applies: its
 * gradients judged here; *skip gets "/d_x/d_weight/" (what it covered and
 * passed) so the general path leaves those out: a failed one is computed
 * there again, for its diagnosis only. */
static int run_fast(qc_audit *a, const qc_registry_row *row, const qc_module *m, int i, char *skip, size_t skiplen) {
  static const qc_tset empty;
  const qc_tensor *dy = &m->grad_out.t[i];
  skip[0] = 0;
  if (!row->fast || a->cs->cand == QC_CAND_PLUGIN) return QC_OK;
  const qc_tset *cand = a->cs->cand == QC_CAND_DUMP ? (m->cand ? &m->cand[i] : &empty) : NULL;
  qc_fast_out fo;
  memset(&fo, 0, sizeof fo);
  double t0 = qc_now_s();
  int rc = row->fast(a->ctx, m, dy, cand, &fo);
  if (rc || fo.n == 0) return rc;
  if (qc_verbose) fprintf(stderr, "qatcheck: %s dy=%s: fast path on %s %.3f s\n", m->path, dy->name, a->ctx->be->name, qc_now_s() - t0);
  size_t l = 0;
  for (int j = 0; j < fo.n; j++) {
    const qc_fast_grad *g = &fo.g[j];
    const qc_tol *t = qc_audit_tol(a, m, g->name);
    if (!t) return QC_EINPUT;
    qc_check k;
    qc_check_init(&k, m, dy->name, g->name, g->ndim, g->shape, t);
    snprintf(k.cand_dtype, sizeof k.cand_dtype, "%s", qc_dtype_name(g->cand_dtype));
    snprintf(k.judged_dtype, sizeof k.judged_dtype, "%s", qc_dtype_name(g->cand_dtype));
    k.m = g->m;
    k.ref = g->ref;
    k.has_metrics = 1;
    if ((rc = qc_audit_judge(m, dy, t, &k)) || (rc = qc_results_add(a->res, &k))) return rc;
    /* a pass is final unless its z is elevated: then, as on the host
     * path, the legal variants judge it too (the same reference chosen
     * on either path) */
    if (!qc_variants_wanted(&k))
      l += (size_t)snprintf(skip + l, l < skiplen ? skiplen - l : 0, "%s%s/", l ? "" : "/", g->name);
  }
  return QC_OK;
}

/* The check of (m, dy, tensor) the fast path already added at or after
 * index `from`, or NULL. */
static qc_check *fast_check(qc_audit *a, int from, const char *dy, const char *tensor) {
  for (int i = from; i < a->res->n; i++)
    if (strcmp(a->res->v[i].dy, dy) == 0 && strcmp(a->res->v[i].tensor, tensor) == 0) return &a->res->v[i];
  return NULL;
}

/* QC_OK when every gradient the dump holds for (m, dy) is one the
 * reference produced (or the fast path judged, at or after index `from`);
 * otherwise QC_EINPUT naming the first that would go unjudged (a linear
 * module's grads/d_bias without its params/bias): nothing in a dump is
 * silently left out of the report. */
static int unjudged_grads(qc_audit *a, const qc_module *m, const char *dy, const qc_tset *cand, const qc_tset *ref, int from) {
  for (int j = 0; cand && j < cand->n; j++) {
    const char *g = cand->t[j].name;
    if (qc_tset_get(ref, g) || fast_check(a, from, dy, g)) continue;
    qc_err("dump '%s': module '%s' (class %s): holds gradient 'grads/%s' but the module has nothing it is the gradient of: "
           "it would go unjudged", a->cs->dump, m->path, m->cls->name, g);
    qc_hint("the class produces '%s' only from a parameter or input the dump (or checkpoint) lacks here (for d_bias: "
            "params/bias); add it, or leave grads/%s out of the dump", g, g);
    return QC_EINPUT;
  }
  return QC_OK;
}

/* ---- reference variants (engine/variants.c owns which, in what order, and the rule) ---- */

/* One (module, dY)'s variants while its gradients are judged: each
 * variant's reference gradients computed once, on first use, into vars. */
typedef struct grad_variants {
  const qc_ctx *ctx;
  const qc_registry_row *row;
  const qc_module *m;
  const qc_tensor *dy;
  qc_variants list;
  qc_tset vars[QC_VARIANTS_MAX];
  unsigned long long done;     /* variant i's reference run whole (every gradient) */
  char asked[QC_VARIANTS_MAX][128]; /* "/d_x/...": the gradients variant i's reference was run for alone */
  /* the check being judged */
  const qc_tensor *g;
  qc_dtype held; /* held_of(g), found once for the check's variants (QC_DTYPE_COUNT: not yet) */
  const qc_tol *t;
  const qc_check *k;
  int chosen; /* the failed check's closest variant (qc_variants_closest), -1: none */
  unsigned reads, same;    /* the variant parts the judged gradient reads, and those of them that are one
                              rounding (qc_grad_reads_of, qc_grad_same_of) */
  unsigned long long told; /* the variants -v has named as repeats for this check */
  unsigned long long judged; /* the variants judged for this check (a repeat of one that was not is judged itself) */
  int runs, saved;         /* variant references run; runs saved (a repeat not at hand: qc_variant_repeats) */
} grad_variants;

/* 1 when variant i's reference of `grad` is at hand: its reference ran
 * whole, or for grad, or returned grad with another's. */
static int have_ref(const grad_variants *s, int i, const char *grad) {
  char key[QC_NAMELEN + 3];
  snprintf(key, sizeof key, "/%s/", grad);
  return (s->done & (1ull << i)) || qc_tset_get(&s->vars[i], grad) || strstr(s->asked[i], key);
}

/* skip [n] = "/" + every gradient of class c but `grad` + "/" (qc_ctx.skip:
 * a reference run for `grad` alone). */
static void skip_others(const qc_class *c, const char *grad, char *skip, size_t n) {
  snprintf(skip, n, "/");
  for (const char *g = c->grads ? c->grads : ""; *g;) {
    size_t l = strcspn(g, " ");
    if (l && !(l == strlen(grad) && strncmp(g, grad, l) == 0) && strlen(skip) + l + 2 < n) strncat(skip, g, l), strcat(skip, "/");
    g += l + (g[l] == ' ');
  }
}

/* Variant i's reference gradients into s->vars[i]: `grad` alone (the
 * class's other gradients skipped, where its reference honours qc_ctx.skip),
 * or every one (grad NULL), unless already there. A variant is tried for
 * one check at a time, and most of its gradients are never asked for: the
 * quantized linears' d_x alone was half of their variants' time (the MoE
 * layer of bench/dsv3_layer.sh). Returns a status. */
static int variant_ref(grad_variants *s, int i, const char *grad) {
  if (s->done & (1ull << i)) return QC_OK;
  char key[QC_NAMELEN + 3], skip[512] = "/";
  if (grad) {
    snprintf(key, sizeof key, "/%s/", grad);
    if (have_ref(s, i, grad)) return QC_OK;
    if (strlen(s->asked[i]) + strlen(key) >= sizeof s->asked[i] || !qc_class_has_grad(s->m->cls, grad))
      grad = NULL; /* no room to remember, or a name the class does not list ("d_x@rank2"): run it whole */
  }
  if (grad) {
    skip_others(s->m->cls, grad, skip, sizeof skip);
    strcat(s->asked[i], key + (s->asked[i][0] ? 1 : 0));
  } else {
    s->done |= 1ull << i;
  }
  qc_ctx c;
  qc_module alt;
  qc_tensor dv;
  qc_tset got = {0};
  s->runs++;
  int rc = qc_variant_apply(&s->list.v[i], s->ctx, s->m, s->dy, &c, &alt, &dv);
  if (grad) c.skip = skip;
  if (!rc) rc = s->row->reference(&c, &alt, &dv, &got);
  qc_variant_release(&s->list.v[i], s->m, &alt, &dv);
  for (int j = 0; !rc && j < got.n; j++)
    if (!qc_tset_get(&s->vars[i], got.t[j].name)) rc = qc_tset_add(&s->vars[i], &got.t[j]); /* moved */
  qc_tset_free(&got);
  return rc;
}

/* 1 when variant i's reference of the judged gradient repeats the
 * contract's or an earlier variant's (qc_variant_repeats): it is neither
 * computed nor judged, and -v says so once for the check. */
static int repeats(grad_variants *s, int i) {
  const int j = qc_variant_repeats(&s->list, i, s->reads, s->same);
  if (j == i || (j >= 0 && !(s->judged & (1ull << j)))) return 0; /* new, or what it repeats could not be judged */
  if (!(s->told & (1ull << i))) {
    s->told |= 1ull << i;
    s->saved += !have_ref(s, i, s->k->tensor); /* a run saved, not one another gradient's run made */
    if (qc_verbose) {
      char a[48], b[48];
      qc_variant_id(&s->list.v[i], a, sizeof a);
      if (j >= 0) qc_variant_id(&s->list.v[j], b, sizeof b);
      fprintf(stderr, "qatcheck: %s dy=%s: variant %s for %s: the same reference as %s, not judged again\n", s->m->path,
              s->dy->name, a, s->k->tensor, j >= 0 ? b : "the contract's");
    }
  }
  return 1;
}

/* The candidate's gradient judged against variant i's reference
 * (qc_variant_judge_fn). */
static int grad_variant(void *arg, int i, const qc_variant *v, qc_check *kv) {
  grad_variants *s = arg;
  (void)v;
  if (repeats(s, i)) return QC_NA; /* judged already: it could never fit strictly better */
  int rc = variant_ref(s, i, s->k->tensor);
  if (rc) return rc;
  const qc_tensor *r = qc_tset_get(&s->vars[i], s->k->tensor);
  if (!r || !qc_shape_eq(s->g, r)) return QC_NA;
  qc_check_init(kv, s->m, s->dy->name, s->k->tensor, r->ndim, r->shape, s->t);
  snprintf(kv->cand_dtype, sizeof kv->cand_dtype, "%s", s->k->cand_dtype);
  if (s->held == QC_DTYPE_COUNT) s->held = held_of(s->g);
  rc = compare_held(s->ctx, s->g, s->held, r, s->t, kv);
  if (!rc) rc = qc_audit_judge(s->m, s->dy, s->t, kv);
  if (!rc) s->judged |= 1ull << i;
  return rc;
}

/* Check k of g under t against the variants of s (qc_variants_judge); a failure
 * none passes, against the closest (qc_variants_closest: s->chosen, else -1). */
static int try_variants(grad_variants *s, const qc_tensor *g, qc_dtype held, const qc_tol *t, qc_check *k) {
  s->g = g, s->held = held, s->t = t, s->k = k, s->chosen = -1;
  s->reads = qc_grad_reads_of(s->m, k->tensor), s->same = qc_grad_same_of(s->m, k->tensor), s->told = 0, s->judged = 0;
  int rc = qc_variants_judge(&s->list, grad_variant, s, k);
  return rc ? rc : qc_variants_closest(&s->list, grad_variant, s, k, &s->chosen);
}

/* Diagnose failed check k of g against the reference it is judged against:
 * the contract's (r, of set ref) or variant s->chosen's (under its roundings
 * of module, dY and arithmetic): every fit is made against what it matches. */
static int diagnose_judged(grad_variants *s, const qc_ctx *ctx, const qc_tensor *g, const qc_tensor *r, const qc_tset *ref,
                           const char *frozen, qc_check *k) {
  if (s->chosen < 0 || !qc_tset_get(&s->vars[s->chosen], k->tensor)) {
    if (r->data || qc_numel(r) == 0) return qc_diagnose(ctx, s->m, s->dy, g, r, ref, frozen, k);
    qc_tset whole = {0}; /* r was handed over in blocks (engine/stream.h): made again whole for the diagnosis */
    char skip[512];
    qc_ctx c = *ctx;
    skip_others(s->m->cls, k->tensor, skip, sizeof skip);
    c.skip = skip;
    int rc = s->row->reference(&c, s->m, s->dy, &whole);
    const qc_tensor *w = rc ? NULL : qc_tset_get(&whole, k->tensor);
    if (!rc && !w) rc = qc_err("%s: the reference made whole again lacks '%s'", s->m->path, k->tensor);
    if (!rc) rc = qc_diagnose(ctx, s->m, s->dy, g, w, &whole, frozen, k);
    qc_tset_free(&whole);
    return rc;
  }
  const qc_variant *v = &s->list.v[s->chosen];
  qc_ctx c;
  qc_module alt;
  qc_tensor dv;
  int rc = variant_ref(s, s->chosen, NULL); /* the diagnosis reads the variant's whole set */
  if (rc) return rc;
  rc = qc_variant_apply(v, ctx, s->m, s->dy, &c, &alt, &dv);
  if (!rc) rc = qc_diagnose(&c, &alt, &dv, g, qc_tset_get(&s->vars[s->chosen], k->tensor), &s->vars[s->chosen], frozen, k);
  qc_variant_release(v, s->m, &alt, &dv);
  return rc;
}

int qc_audit_module(qc_audit *a, const qc_module *m) {
  const qc_registry_row *row = qc_registry_find(m->cls->name);
  if (!row) return qc_err("%s: class '%s' has no registry row", m->path, m->cls->name);
  for (int i = 0; i < m->grad_out.n; i++) {
    const qc_tensor *dy = &m->grad_out.t[i];
    qc_tset ref = {0}, cand = {0};
    grad_variants *gv = qc_calloc(1, sizeof *gv, "reference variants");
    if (!gv) return QC_ESYS;
    const qc_tset *cset = NULL;
    char skip[QC_FAST_MAX * (QC_NAMELEN + 1) + 2];
    double t0 = qc_now_s();
    int first = a->res->n;
    int rc = run_fast(a, row, m, i, skip, sizeof skip);
    if (rc) {
      free(gv);
      return rc;
    }
    *gv = (grad_variants){.ctx = a->ctx, .row = row, .m = m, .dy = dy, .chosen = -1};
    qc_variants_of(m, dy, QC_VARIANTS_GRADS, a->cs->variants_off, a->autocast, &gv->list);
    if (qc_verbose && i == 0 && gv->list.ruled_out)
      fprintf(stderr, "qatcheck: %s: the dump's evidence (autocast off, no 16-bit tensor) rules out the bf16_inputs and "
              "bf16_params variants\n", m->path);
    qc_audit_terms_scope(m, dy, a->ctx->be);
    qc_ctx ctx = *a->ctx; /* the VJPs may leave out what the fast path judged */
    ctx.skip = skip[0] ? skip : NULL;
    qc_audit sub = *a;
    sub.ctx = &ctx;
    /* a dump's gradients the reference may hand over in blocks, each compared as it comes (engine/stream.h) */
    qc_streams *st = NULL;
    if (a->cs->cand == QC_CAND_DUMP && m->cand) rc = qc_streams_open(a->cs, m, &m->cand[i], &st);
    ctx.sink = st ? qc_streams_sink(st) : NULL;
    if (!rc) rc = row->reference(&ctx, m, dy, &ref);
    ctx.sink = NULL; /* the variants' and diagnoses' references are made whole */
    double t1 = qc_now_s();
    if (!rc) rc = run_candidate(&sub, m, i, &cand, &cset);
    double t2 = qc_now_s();
    if (!rc && a->cs->cand == QC_CAND_DUMP) rc = unjudged_grads(a, m, dy->name, cset, &ref, first);
    for (int j = 0; !rc && j < ref.n; j++) {
      const qc_tensor *r = &ref.t[j];
      if (!qc_ctx_wants(&ctx, r->name)) continue; /* judged by the fast path */
      const qc_tol *t = qc_audit_tol(a, m, r->name);
      if (!t) {
        rc = QC_EINPUT;
        break;
      }
      const qc_tensor *g = qc_tset_get(cset, r->name);
      qc_check *fk = fast_check(a, first, dy->name, r->name);
      gv->chosen = -1; /* set by try_variants for this gradient's check */
      if (fk) { /* failed on the fast path, or passed with an elevated z: the legal variants as on the
                 * host path, else (a failure) its diagnosis */
        if (g && qc_shape_eq(g, r)) {
          qc_check kv = *fk;
          rc = try_variants(gv, g, QC_DTYPE_COUNT, t, &kv); /* g's values found if a variant is compared */
          if (!rc && (kv.verdict == QC_V_PASS || gv->chosen >= 0)) *fk = kv; /* the same judgement the host path reaches */
          if (!rc && fk->verdict != QC_V_PASS) rc = diagnose_judged(gv, &ctx, g, r, &ref, a->frozen, fk);
        }
        continue;
      }
      qc_check k;
      qc_check_init(&k, m, dy->name, r->name, r->ndim, r->shape, t);
      if (!g && in_words(a->frozen, r->name)) {
        if (qc_verbose) fprintf(stderr, "qatcheck: %s: %s not checked: its parameter is frozen\n", m->path, r->name);
        continue;
      }
      char s1[96], s2[96];
      if (g) snprintf(k.cand_dtype, sizeof k.cand_dtype, "%s", qc_dtype_name(g->dtype));
      if (!g) {
        k.verdict = QC_V_FAIL;
        snprintf(k.why, sizeof k.why, "missing");
      } else if (!qc_dtype_is_float(g->dtype) || g->dtype == QC_E2M1X2) {
        k.verdict = QC_V_FAIL;
        snprintf(k.why, sizeof k.why, "candidate has element type %s: expected a float gradient", qc_dtype_name(g->dtype));
      } else if (!qc_shape_eq(g, r)) {
        k.verdict = QC_V_FAIL;
        snprintf(k.why, sizeof k.why, "shape mismatch: candidate %s, reference %s", qc_shape_str(g->ndim, g->shape, s1, sizeof s1),
                 qc_shape_str(r->ndim, r->shape, s2, sizeof s2));
      } else {
        qc_dtype held;
        const int streamed = qc_streams_has(st, r->name, &held);
        if (streamed) {
          if (qc_verbose) fprintf(stderr, "qatcheck: %s dy=%s: %s compared in blocks as the reference made it\n", m->path, dy->name, r->name);
          rc = qc_streams_finish(st, r->name, t, &k);
          if (!rc && k.m.ref_nonfinite) rc = ref_not_finite(&k);
        } else {
          held = held_of(g);
          rc = compare_held(a->ctx, g, held, r, t, &k);
        }
        if (!rc) rc = qc_audit_judge(m, dy, t, &k);
        if (!rc) rc = try_variants(gv, g, held, t, &k);
        if (!rc) rc = qc_audit_exact_zeros(m, g, 0, g->shape[0], &k);
      }
      if (!rc && k.verdict != QC_V_PASS) rc = diagnose_judged(gv, &ctx, g, r, &ref, a->frozen, &k);
      if (!rc) rc = qc_results_add(a->res, &k);
    }
    if (qc_verbose)
      fprintf(stderr, "qatcheck: %s dy=%s: reference %.3f s, candidate %.3f s, compare %.3f s\n", m->path, dy->name, t1 - t0,
              t2 - t1, qc_now_s() - t2);
    if (qc_verbose && (gv->runs || gv->saved))
      fprintf(stderr, "qatcheck: %s dy=%s: variant references: %d computed, %d saved (repeats of another's)\n", m->path,
              dy->name, gv->runs, gv->saved);
    qc_streams_free(st);
    qc_tset_free(&ref);
    qc_tset_free(&cand);
    for (int v = 0; v < QC_VARIANTS_MAX; v++) qc_tset_free(&gv->vars[v]);
    free(gv);
    qc_audit_terms_scope(NULL, NULL, NULL);
    if (rc) return rc;
  }
  return QC_OK;
}
