/* audit.c: see audit.h. */
#include "engine/audit_priv.h"

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

int qc_audit_module(qc_audit *a, const qc_module *m) {
  const qc_registry_row *row = qc_registry_find(m->cls->name);
  if (!row) return qc_err("%s: class '%s' has no registry row", m->path, m->cls->name);
  for (int i = 0; i < m->grad_out.n; i++) {
    const qc_tensor *dy = &m->grad_out.t[i];
    qc_tset ref = {0}, cand = {0};
    qc_gvars *gv = NULL;
    const qc_tset *cset = NULL;
    char skip[QC_FAST_MAX * (QC_NAMELEN + 1) + 2];
    double t0 = qc_now_s();
    int first = a->res->n;
    int rc = run_fast(a, row, m, i, skip, sizeof skip);
    if (rc) return rc;
    qc_audit_terms_scope(m, dy, a->ctx->be);
    qc_ctx ctx = *a->ctx; /* the VJPs may leave out what the fast path judged */
    ctx.skip = skip[0] ? skip : NULL;
    qc_audit sub = *a;
    sub.ctx = &ctx;
    /* a dump's gradients the reference may hand over in blocks, each compared as it comes (engine/stream.h) */
    qc_streams *st = NULL;
    if (a->cs->cand == QC_CAND_DUMP && m->cand) rc = qc_streams_open(a->cs, m, &m->cand[i], &st);
    if (!rc) rc = qc_gvars_open(a, row, m, i, st, &gv);
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
      if (fk) { /* failed on the fast path, or passed with an elevated z: the legal variants as on the
                 * host path, else (a failure) its diagnosis */
        if (g && qc_shape_eq(g, r)) {
          qc_check kv = *fk;
          rc = qc_gvars_try(gv, g, QC_DTYPE_COUNT, t, &kv); /* g's values found if a variant is compared */
          if (!rc && (kv.verdict == QC_V_PASS || kv.variant_id[0])) *fk = kv; /* the same judgement the host path reaches */
          if (!rc && fk->verdict != QC_V_PASS) rc = qc_gvars_diagnose(gv, &ctx, g, r, &ref, a->frozen, fk);
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
          if (!rc && k.m.ref_nonfinite) rc = qc_audit_ref_not_finite(&k);
        } else {
          held = qc_audit_held_of(g);
          rc = qc_audit_compare_held(a->ctx, g, held, r, t, &k);
        }
        if (!rc) rc = qc_audit_judge(m, dy, t, &k);
        if (!rc) rc = qc_gvars_try(gv, g, held, t, &k);
        if (!rc) rc = qc_audit_exact_zeros(m, g, 0, g->shape[0], &k);
      }
      if (!rc && k.verdict != QC_V_PASS) rc = qc_gvars_diagnose(gv, &ctx, g, r, &ref, a->frozen, &k);
      if (!rc) rc = qc_results_add(a->res, &k);
    }
    if (qc_verbose)
      fprintf(stderr, "qatcheck: %s dy=%s: reference %.3f s, candidate %.3f s, compare %.3f s\n", m->path, dy->name, t1 - t0,
              t2 - t1, qc_now_s() - t2);
    qc_streams_free(st);
    qc_tset_free(&ref);
    qc_tset_free(&cand);
    qc_gvars_close(gv);
    qc_audit_terms_scope(NULL, NULL, NULL);
    if (rc) return rc;
  }
  return QC_OK;
}
