/* audit_vars.c: a check judged against the reference variants of its
 * module and dY, and diagnosed against the one it is judged against
 * (audit_priv.h; engine/variants.c owns which variants, in what order,
 * and the rule). */
#include "engine/audit_priv.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/par.h"
#include "core/qc.h"
#include "engine/diagnose.h"
#include "engine/variants.h"

/* One (module, dY)'s variants while its gradients are judged: each
 * variant's reference gradients computed once, on first use, into vars. */
struct qc_gvars {
  const qc_ctx *ctx;
  const qc_case *cs;
  const qc_registry_row *row;
  const qc_module *m;
  const qc_tensor *dy;
  const qc_streams *st;        /* the contract's reference's gradients taken in blocks (NULL: none) */
  qc_variants list;
  qc_tset vars[QC_VARIANTS_MAX];
  unsigned long long done;     /* variant i's reference run whole (every gradient) */
  char asked[QC_VARIANTS_MAX][128]; /* "/d_x/...": the gradients variant i's reference was run for alone */
  /* the check being judged */
  const qc_tensor *g;
  qc_dtype held; /* qc_audit_held_of(g), found once for the check's variants (QC_DTYPE_COUNT: not yet) */
  const qc_tol *t;
  const qc_check *k;
  char tried[QC_NAMELEN]; /* the gradient of the last check tried, whose closest variant `chosen` is */
  int chosen; /* the failed check's closest variant (qc_variants_closest), -1: none */
  int blocks;  /* the check's gradient was taken in blocks: so are its variants' references */
  qc_check *kept;              /* [QC_VARIANTS_MAX]: a variant's check compared in blocks, for the second look */
  int kept_rc[QC_VARIANTS_MAX]; /* and its status (a variant that could not be judged is not run again) */
  unsigned long long has_kept; /* which of kept hold this check's */
  unsigned reads, same;    /* the variant parts the judged gradient reads, and those of them that are one
                              rounding (qc_grad_reads_of, qc_grad_same_of) */
  unsigned long long told; /* the variants -v has named as repeats for this check */
  unsigned long long judged; /* the variants judged for this check (a repeat of one that was not is judged itself) */
  int runs, saved;         /* variant references run; runs saved (a repeat not at hand: qc_variant_repeats) */
};
typedef struct qc_gvars grad_variants;

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

/* Variant i's reference run into *got under the variant's roundings,
 * with qc_ctx.skip and .sink as given (NULL: none). A status. */
static int run_variant(grad_variants *s, int i, const char *skip, const qc_grad_sink *sink, qc_tset *got) {
  qc_ctx c;
  qc_module alt;
  qc_tensor dv;
  s->runs++;
  int rc = qc_variant_apply(&s->list.v[i], s->ctx, s->m, s->dy, &c, &alt, &dv);
  if (skip) c.skip = skip;
  c.sink = sink;
  if (!rc) rc = s->row->reference(&c, &alt, &dv, got);
  qc_variant_release(&s->list.v[i], s->m, &alt, &dv);
  return rc;
}

/* The gradients of got made whole (not `except`, not one handed over in
 * blocks) moved into s->vars[i] where it has none of that name. A status. */
static int keep_made(grad_variants *s, int i, qc_tset *got, const char *except) {
  int rc = QC_OK;
  for (int j = 0; !rc && j < got->n; j++)
    if ((!except || strcmp(got->t[j].name, except) != 0) && (got->t[j].data || qc_numel(&got->t[j]) == 0) &&
        !qc_tset_get(&s->vars[i], got->t[j].name))
      rc = qc_tset_add(&s->vars[i], &got->t[j]); /* moved */
  return rc;
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
  qc_tset got = {0};
  int rc = run_variant(s, i, grad ? skip : NULL, NULL, &got);
  if (!rc) rc = keep_made(s, i, &got, NULL);
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

/* Variant i's reference of the judged gradient compared in blocks as the
 * reference makes it (the contract's was: engine/stream.h), so its float64
 * gradient is never whole; its check and status kept for
 * qc_variants_closest's second look, the other gradients it returned whole
 * kept in vars. A variant whose reference makes the judged one whole
 * anyway is kept in vars too (*whole = 1) for the caller's compare.
 * QC_NA: it has no such gradient. A status. */
static int variant_blocks(grad_variants *s, int i, qc_check *kv, int *whole) {
  *whole = 0;
  if (s->has_kept & (1ull << i)) {
    if (!s->kept_rc[i]) *kv = s->kept[i];
    return s->kept_rc[i];
  }
  const char *grad = s->k->tensor;
  char skip[512];
  qc_streams *st = NULL;
  qc_tset got = {0};
  if (!s->kept && !(s->kept = qc_calloc(QC_VARIANTS_MAX, sizeof *s->kept, "variant checks"))) return QC_ESYS;
  if (s->held == QC_DTYPE_COUNT) s->held = qc_audit_held_of(s->g);
  int rc = qc_streams_open_one(s->cs, s->m, s->g, s->held, &st);
  if (rc) return rc;
  skip_others(s->m->cls, grad, skip, sizeof skip);
  rc = run_variant(s, i, skip, qc_streams_sink(st), &got);
  const qc_tensor *r = rc ? NULL : qc_tset_get(&got, grad);
  if (!rc && !r) rc = QC_NA;
  if (!rc && qc_streams_has(st, grad, NULL)) {
    if (qc_verbose) {
      char id[48];
      qc_variant_id(&s->list.v[i], id, sizeof id);
      fprintf(stderr, "qatcheck: %s dy=%s: variant %s's %s compared in blocks as its reference made it\n", s->m->path,
              s->dy->name, id, grad);
    }
    qc_check_init(kv, s->m, s->dy->name, grad, r->ndim, r->shape, s->t);
    snprintf(kv->cand_dtype, sizeof kv->cand_dtype, "%s", s->k->cand_dtype);
    rc = qc_streams_finish(st, grad, s->t, kv);
    if (!rc && kv->m.ref_nonfinite) rc = qc_audit_ref_not_finite(kv);
    if (!rc) rc = qc_audit_judge(s->m, s->dy, s->t, kv);
    if (!rc) s->judged |= 1ull << i, s->kept[i] = *kv;
    if (!rc) rc = keep_made(s, i, &got, grad); /* what it made whole beside, as variant_ref keeps it */
  } else if (!rc) { /* made whole: kept as variant_ref keeps it */
    *whole = 1;
    rc = keep_made(s, i, &got, NULL);
  }
  if (rc != QC_ESYS && !*whole) s->kept_rc[i] = rc, s->has_kept |= 1ull << i;
  qc_tset_free(&got);
  qc_streams_free(st);
  return rc;
}

/* The candidate's gradient judged against variant i's reference
 * (qc_variant_judge_fn). */
static int grad_variant(void *arg, int i, const qc_variant *v, qc_check *kv) {
  grad_variants *s = arg;
  (void)v;
  if (repeats(s, i)) return QC_NA; /* judged already: it could never fit strictly better */
  int whole = 0, rc = QC_OK;
  if (s->blocks && !have_ref(s, i, s->k->tensor)) {
    rc = variant_blocks(s, i, kv, &whole);
    if (rc || !whole) return rc;
  }
  rc = variant_ref(s, i, s->k->tensor);
  if (rc) return rc;
  const qc_tensor *r = qc_tset_get(&s->vars[i], s->k->tensor);
  if (!r || !qc_shape_eq(s->g, r)) return QC_NA;
  qc_check_init(kv, s->m, s->dy->name, s->k->tensor, r->ndim, r->shape, s->t);
  snprintf(kv->cand_dtype, sizeof kv->cand_dtype, "%s", s->k->cand_dtype);
  if (s->held == QC_DTYPE_COUNT) s->held = qc_audit_held_of(s->g);
  rc = qc_audit_compare_held(s->ctx, s->g, s->held, r, s->t, kv);
  if (!rc) rc = qc_audit_judge(s->m, s->dy, s->t, kv);
  if (!rc) s->judged |= 1ull << i;
  return rc;
}

int qc_gvars_try(grad_variants *s, const qc_tensor *g, qc_dtype held, const qc_tol *t, qc_check *k) {
  s->g = g, s->held = held, s->t = t, s->k = k, s->chosen = -1, s->has_kept = 0;
  s->blocks = qc_streams_has(s->st, k->tensor, NULL);
  snprintf(s->tried, sizeof s->tried, "%s", k->tensor);
  s->reads = qc_grad_reads_of(s->m, k->tensor), s->same = qc_grad_same_of(s->m, k->tensor), s->told = 0, s->judged = 0;
  int rc = qc_variants_judge(&s->list, grad_variant, s, k);
  return rc ? rc : qc_variants_closest(&s->list, grad_variant, s, k, &s->chosen);
}

/* The float64 copies of a gradient's size a diagnosis holds at once: the
 * reference made whole, the candidate's and a prediction's copies
 * (engine/diagnose.c qc_dg_setup), a hypothesis's reference run, and the
 * best prediction a scan of the contract's keys or of block sizes keeps
 * beside it (qc_dg_scan_keys, diagnose_block.c). */
#define QC_DIAG_COPIES 5

/* 1 when the diagnosis of failed check k, whose reference r was compared
 * in blocks, fits in half the host memory the audit may assume
 * (core/par.h qc_host_memory); 0 with k's
 * diagnosis saying it was not made and where the difference lies. */
static int diagnosis_fits(const grad_variants *s, const qc_tensor *r, int variant, qc_check *k) {
  const double mem = (double)qc_host_memory();
  const double need = QC_DIAG_COPIES * 8.0 * (double)qc_numel(r);
  if (need <= 0.5 * mem) return 1;
  char where[256];
  int n = snprintf(k->diagnosis, sizeof k->diagnosis, "not diagnosed: %s was compared in blocks, and its diagnosis would "
                   "hold about %.1f GB of float64 copies, more than half of the host's %.1f GB", k->tensor, need / 1e9,
                   mem / 1e9);
  if (n > 0 && (size_t)n < sizeof k->diagnosis && qc_streams_where(s->st, k->tensor, where, sizeof where))
    snprintf(k->diagnosis + n, sizeof k->diagnosis - (size_t)n, "; against the contract's reference%s, %s",
             variant ? " (not the variant judged)" : "", where);
  return 0;
}

/* Diagnose check k against reference r of set ref, both the contract's or
 * both variant v's (NULL: the contract's), under its roundings. */
static int diagnose_as(const grad_variants *s, const qc_variant *v, const qc_ctx *ctx, const qc_tensor *g,
                       const qc_tensor *r, const qc_tset *ref, const char *frozen, qc_check *k) {
  if (!v) return qc_diagnose(ctx, s->m, s->dy, g, r, ref, frozen, k);
  qc_ctx c;
  qc_module alt;
  qc_tensor dv;
  int rc = qc_variant_apply(v, ctx, s->m, s->dy, &c, &alt, &dv);
  if (!rc) rc = qc_diagnose(&c, &alt, &dv, g, r, ref, frozen, k);
  qc_variant_release(v, s->m, &alt, &dv);
  return rc;
}

int qc_gvars_diagnose(grad_variants *s, const qc_ctx *ctx, const qc_tensor *g, const qc_tensor *r, const qc_tset *ref,
                      const char *frozen, qc_check *k) {
  const int ci = strcmp(s->tried, k->tensor) == 0 ? s->chosen : -1;
  const qc_variant *v = ci >= 0 ? &s->list.v[ci] : NULL;
  int rc;
  if (ci >= 0 && !(s->blocks && !qc_tset_get(&s->vars[ci], k->tensor))) {
    rc = variant_ref(s, ci, NULL); /* the diagnosis reads the variant's whole set */
    return rc ? rc : diagnose_as(s, v, ctx, g, qc_tset_get(&s->vars[ci], k->tensor), &s->vars[ci], frozen, k);
  }
  if (!v && (r->data || qc_numel(r) == 0)) return qc_diagnose(ctx, s->m, s->dy, g, r, ref, frozen, k);
  /* the judged reference was handed over in blocks (engine/stream.h): made whole again for the diagnosis, for
   * k's gradient alone, where it fits; a diagnosis that cannot be made is said in the check, the verdict stands */
  if (!diagnosis_fits(s, r, v != NULL, k)) return QC_OK;
  qc_tset whole = {0};
  char skip[512];
  qc_ctx c = *ctx;
  qc_module alt;
  qc_tensor dv;
  skip_others(s->m->cls, k->tensor, skip, sizeof skip);
  qc_err_state es; /* out of memory making it whole: not diagnosed, said below */
  qc_err_save(&es);
  rc = v ? qc_variant_apply(v, ctx, s->m, s->dy, &c, &alt, &dv) : QC_OK;
  c.skip = skip;
  if (!rc) rc = s->row->reference(&c, v ? &alt : s->m, v ? &dv : s->dy, &whole); /* the module itself: the memo's keys */
  if (v) qc_variant_release(v, s->m, &alt, &dv);
  const qc_tensor *w = rc ? NULL : qc_tset_get(&whole, k->tensor);
  if (!rc && !w) rc = qc_err("%s: the reference made whole again lacks '%s'", s->m->path, k->tensor);
  if (rc == QC_ESYS) {
    snprintf(k->diagnosis, sizeof k->diagnosis, "not diagnosed: %s's reference could not be made whole again: %s",
             k->tensor, qc_err_msg());
    qc_err_restore(&es);
    qc_tset_free(&whole);
    return QC_OK;
  }
  if (rc) qc_err_keep(&es); /* the run's error: the first message stays first */
  else qc_err_restore(&es);
  if (!rc) rc = diagnose_as(s, v, ctx, g, w, ref, frozen, k); /* ref: every gradient's name, for the hypotheses' skips */
  qc_tset_free(&whole);
  return rc;
}

int qc_gvars_open(const qc_audit *a, const qc_registry_row *row, const qc_module *m, int i, const qc_streams *st,
                  qc_gvars **out) {
  const qc_tensor *dy = &m->grad_out.t[i];
  grad_variants *s = *out = qc_calloc(1, sizeof *s, "reference variants");
  if (!s) return QC_ESYS;
  *s = (grad_variants){.ctx = a->ctx, .cs = a->cs, .row = row, .m = m, .dy = dy, .st = st, .chosen = -1};
  qc_variants_of(m, dy, QC_VARIANTS_GRADS, a->cs->variants_off, a->autocast, &s->list);
  if (qc_verbose && i == 0 && s->list.ruled_out)
    fprintf(stderr, "qatcheck: %s: the dump's evidence (autocast off, no 16-bit tensor) rules out the bf16_inputs and "
            "bf16_params variants\n", m->path);
  return QC_OK;
}

void qc_gvars_close(grad_variants *s) {
  if (!s) return;
  if (qc_verbose && (s->runs || s->saved))
    fprintf(stderr, "qatcheck: %s dy=%s: variant references: %d computed, %d saved (repeats of another's)\n", s->m->path,
            s->dy->name, s->runs, s->saved);
  for (int v = 0; v < QC_VARIANTS_MAX; v++) qc_tset_free(&s->vars[v]);
  free(s->kept);
  free(s);
}
