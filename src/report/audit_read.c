/* audit_read.c: JSON reports read back into evidence (model/evidence.h),
 * tolerantly: unknown fields are ignored, missing ones keep their
 * defaults, a field of an unexpected type counts as missing. What decides
 * a verdict is not read tolerantly: each report is re-judged first
 * (report.h, qc_report_rejudge), and a file that is not a qatcheck JSON
 * report, or that its own checks contradict, is refused. */
#include <cjson/cJSON.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "core/qc.h"
#include "core/sha256.h"
#include "report/audit.h"
#include "report/baseline.h"

/* ---- small accessors ------------------------------------------------------------- */

static const cJSON *get(const cJSON *o, const char *k) { return o ? cJSON_GetObjectItemCaseSensitive(o, k) : NULL; }

static void str(const cJSON *o, const char *k, char *buf, size_t n) {
  const cJSON *v = get(o, k);
  if (cJSON_IsString(v)) snprintf(buf, n, "%s", v->valuestring);
  else if (cJSON_IsNumber(v)) snprintf(buf, n, "%.10g", v->valuedouble);
  else if (cJSON_IsBool(v)) snprintf(buf, n, "%s", cJSON_IsTrue(v) ? "true" : "false");
  else if (v && !cJSON_IsNull(v)) {
    char *t = cJSON_PrintUnformatted(v);
    snprintf(buf, n, "%s", t ? t : "");
    free(t);
  }
}

static double num(const cJSON *o, const char *k, double dflt) {
  const cJSON *v = get(o, k);
  return cJSON_IsNumber(v) ? v->valuedouble : dflt;
}

/* A JSON number as a count or index: clamped into what the type holds (a
 * report from elsewhere may say anything; a cast out of range is undefined) */
static int64_t as_i64(double v) { return v != v ? 0 : v > 9e15 ? (int64_t)9e15 : v < -9e15 ? -(int64_t)9e15 : (int64_t)v; }
static int as_int(double v) { return v != v ? 0 : v > INT_MAX ? INT_MAX : v < INT_MIN ? INT_MIN : (int)v; }

static int flag(const cJSON *o, const char *k) { return cJSON_IsTrue(get(o, k)); }


/* Grow array *v of *n elements of size sz by one (zeroed); NULL out of
 * memory. Its capacity is the power of two at or above *n (every array
 * here grows only through this): a reallocation at each power of two, not
 * at each element (one per element copied a 20,000-module report's
 * checks quadratically under ASan's realloc: 13 minutes for 2.6 s). */
static void *grow(void **v, int *n, size_t sz) {
  char *nv = *v;
  if ((*n & (*n - 1)) == 0) { /* 0 or a power of two: full */
    if (!(nv = realloc(*v, (*n ? 2 * (size_t)*n : 1) * sz))) return NULL;
    *v = nv;
  }
  memset(nv + (size_t)*n * sz, 0, sz);
  return nv + (size_t)(*n)++ * sz;
}
#define GROW(arr, n) grow((void **)&(arr), &(n), sizeof *(arr))
#define OOM() qc_err_sys("out of memory reading the reports")

/* A float array (nulls as NaN), malloc'd into *out; its length. */
static int floats(const cJSON *a, double **out) {
  int n = cJSON_IsArray(a) ? cJSON_GetArraySize(a) : 0, i = 0;
  *out = NULL;
  if (n <= 0 || !(*out = malloc((size_t)n * sizeof **out))) return 0;
  const cJSON *e;
  cJSON_ArrayForEach(e, a) (*out)[i++] = cJSON_IsNumber(e) ? e->valuedouble : NAN;
  return n;
}

/* ---- layer 1 ------------------------------------------------------------------------- */

static void read_tol(const cJSON *t, qc_tol *o) {
  const cJSON *nr = get(t, "norm_ratio");
  if (cJSON_IsNumber(get(t, "rel_l2"))) { o->has_rel_l2 = 1; o->rel_l2 = num(t, "rel_l2", 0); }
  if (cJSON_IsNumber(get(t, "max_abs"))) { o->has_max_abs = 1; o->max_abs = num(t, "max_abs", 0); }
  if (cJSON_IsNumber(get(t, "cosine_min"))) { o->has_cosine_min = 1; o->cosine_min = num(t, "cosine_min", 0); }
  if (cJSON_IsNumber(get(t, "noise_multiple"))) { o->has_noise_multiple = 1; o->noise_multiple = num(t, "noise_multiple", 0); }
  if (cJSON_IsNumber(get(t, "bias_z"))) { o->has_bias_z = 1; o->bias_z = num(t, "bias_z", 0); }
  if (cJSON_IsArray(nr) && cJSON_GetArraySize(nr) == 2) {
    o->has_norm_ratio = 1;
    o->norm_lo = cJSON_GetArrayItem(nr, 0)->valuedouble;
    o->norm_hi = cJSON_GetArrayItem(nr, 1)->valuedouble;
  }
  str(t, "reasoning", o->reasoning, sizeof o->reasoning);
}

static void read_shape(const cJSON *a, int *ndim, int64_t *shape) {
  const cJSON *e;
  *ndim = 0;
  cJSON_ArrayForEach(e, a) if (*ndim < QC_MAXDIM) shape[(*ndim)++] = as_i64(e->valuedouble);
}

static int read_vjp(const cJSON *r, int src, qc_evidence *e) {
  const cJSON *k, *mo;
  cJSON_ArrayForEach(k, get(r, "checks")) {
    qc_ev_check *c = GROW(e->l1, e->nl1);
    if (!c) return OOM();
    c->src = src;
    qc_check *q = &c->c;
    str(k, "module", q->module, sizeof q->module);
    str(k, "class", q->cls, sizeof q->cls);
    str(k, "dy", q->dy, sizeof q->dy);
    str(k, "tensor", q->tensor, sizeof q->tensor);
    str(k, "candidate_dtype", q->cand_dtype, sizeof q->cand_dtype);
    read_shape(get(k, "shape"), &q->ndim, q->shape);
    const cJSON *m = get(k, "metrics");
    q->m.rel_l2 = q->m.max_abs = q->m.norm_ratio = q->m.cosine = q->m.noise_multiple = q->m.noise_floor = NAN;
    q->m.bias_z = NAN;
    if (cJSON_IsObject(m)) {
      q->has_metrics = 1;
      q->m.rel_l2 = num(m, "rel_l2", NAN);
      q->m.max_abs = num(m, "max_abs", NAN);
      q->m.norm_ratio = num(m, "norm_ratio", NAN);
      q->m.cosine = num(m, "cosine", NAN);
      q->m.cosine_null = cJSON_IsNull(get(m, "cosine"));
      q->m.noise_floor = num(m, "noise_floor", NAN);
      q->m.noise_multiple = num(m, "noise_multiple", NAN);
      q->m.nonfinite = as_i64(num(m, "nonfinite", 0));
      q->m.bias_z = num(m, "bias_z", NAN);
    }
    if (cJSON_IsObject(get(k, "tolerance"))) {
      q->has_tol = 1;
      read_tol(get(k, "tolerance"), &q->tol);
    }
    char v[16] = "";
    str(k, "verdict", v, sizeof v);
    q->verdict = strcmp(v, "pass") == 0 ? QC_V_PASS : QC_V_FAIL;
    str(k, "why", q->why, sizeof q->why);
    str(k, "judged_dtype", q->judged_dtype, sizeof q->judged_dtype);
    const cJSON *rg = get(k, "reference_gemm"); /* absent (an older report): float64 */
    char meth[24] = "";
    str(rg, "method", meth, sizeof meth);
    q->ref.slices = strcmp(meth, "ozaki_int8") && strcmp(meth, "float64_fallback") ? 0 : (int)num(rg, "slices", 0);
    q->ref.kept = q->ref.slices > 0 && strcmp(meth, "ozaki_int8") == 0;
    q->ref.pairs = q->ref.kept ? (int)num(rg, "pairs", 0) : 0;
    /* a diagnosis is an object with its summary (vjp), or a string */
    const cJSON *dg = get(k, "diagnosis");
    str(cJSON_IsObject(dg) ? dg : k, cJSON_IsObject(dg) ? "summary" : "diagnosis", q->diagnosis, sizeof q->diagnosis);
  }
  cJSON_ArrayForEach(mo, get(r, "modules")) {
    qc_ev_mod *m = GROW(e->mod, e->nmod);
    if (!m) return OOM();
    qc_modinfo *mi = &m->mi;
    m->src = src;
    str(mo, "module", mi->module, sizeof mi->module);
    str(mo, "class", mi->cls, sizeof mi->cls);
    str(mo, "source", mi->source, sizeof mi->source);
    str(mo, "candidate", mi->candidate, sizeof mi->candidate);
    str(mo, "values", mi->values, sizeof mi->values);
    str(mo, "contract", mi->contract, sizeof mi->contract);
    str(mo, "reference", m->reference, sizeof m->reference);
    mi->tokens = as_i64(num(mo, "tokens", 0));
    mi->seqlen = as_i64(num(mo, "seqlen", 0));
    mi->nchecks = as_int(num(mo, "checks", 0));
    mi->seconds = num(mo, "seconds", 0);
    const cJSON *t;
    cJSON_ArrayForEach(t, get(mo, "tensors")) {
      if (mi->nt == QC_MI_TENSORS) break;
      qc_mi_tensor *x = &mi->t[mi->nt++];
      str(t, "role", x->role, sizeof x->role);
      str(t, "name", x->name, sizeof x->name);
      str(t, "dtype", x->dtype, sizeof x->dtype);
      read_shape(get(t, "shape"), &x->ndim, x->shape);
    }
    cJSON_ArrayForEach(t, get(mo, "dy")) {
      if (mi->ndy == QC_MI_DY) break;
      qc_mi_dy *d = &mi->dy[mi->ndy++];
      str(t, "name", d->name, sizeof d->name);
      str(t, "kind", d->kind, sizeof d->kind);
      d->nonzero = num(t, "nonzero", NAN);
    }
    cJSON_ArrayForEach(t, get(mo, "coverage")) {
      int c = cJSON_IsString(t) ? qc_cov_find(t->valuestring) : -1;
      if (c >= 0) mi->cover |= 1u << c;
    }
  }
  return QC_OK;
}

/* ---- layer 2 ------------------------------------------------------------------------- */

static const char *tensor_name(const char *t) { return strcmp(t, "d_weight") == 0 ? "d_weight" : "d_x"; }

static int read_contract(const cJSON *r, int src, qc_evidence *e) {
  qc_ev_l2 *l = GROW(e->l2, e->nl2);
  if (!l) return OOM();
  l->src = src;
  const cJSON *o = get(r, "options"), *x;
  char w[128] = "", a[128] = "", t[32];
  cJSON_ArrayForEach(x, get(o, "weight_formats")) if (cJSON_IsString(x)) qc_cat(w, sizeof w, "%s%s", w[0] ? ", " : "", x->valuestring);
  cJSON_ArrayForEach(x, get(o, "activation_formats")) if (cJSON_IsString(x)) qc_cat(a, sizeof a, "%s%s", a[0] ? ", " : "", x->valuestring);
  snprintf(l->formats, sizeof l->formats, "weight formats: %s; activation formats: %s", w[0] ? w : "-", a[0] ? a : "-");
  char cm[32] = "none", nr[64] = "none";
  if (cJSON_IsNumber(get(o, "cosine_min"))) snprintf(cm, sizeof cm, "%g", num(o, "cosine_min", 0));
  if (cJSON_IsArray(get(o, "norm_ratio")) && cJSON_GetArraySize(get(o, "norm_ratio")) == 2)
    snprintf(nr, sizeof nr, "[%g, %g]", cJSON_GetArrayItem(get(o, "norm_ratio"), 0)->valuedouble,
             cJSON_GetArrayItem(get(o, "norm_ratio"), 1)->valuedouble);
  snprintf(l->thresholds, sizeof l->thresholds, "--cosine-min %s, --norm-ratio %s", cm, nr);
  str(r, "outlier_rule", l->outlier_rule, sizeof l->outlier_rule);
  qc_sweep *s = &l->s;
  cJSON_ArrayForEach(x, get(r, "rows")) {
    qc_crow *w2 = GROW(s->rows, s->n);
    if (!w2) return OOM();
    s->cap = s->n;
    str(x, "module", w2->module, sizeof w2->module);
    str(x, "class", w2->cls, sizeof w2->cls);
    w2->layer = as_int(num(x, "layer", -1));
    w2->expert = as_int(num(x, "expert", -1));
    str(x, "weight_format", w2->wfmt, sizeof w2->wfmt);
    str(x, "activation_format", w2->afmt, sizeof w2->afmt);
    str(x, "dy", w2->dy, sizeof w2->dy);
    t[0] = 0;
    str(x, "tensor", t, sizeof t);
    w2->tensor = tensor_name(t);
    const cJSON *m = get(x, "metrics");
    w2->m.cosine = num(m, "cosine", NAN);
    w2->m.cosine_null = cJSON_IsNull(get(m, "cosine"));
    w2->m.norm_ratio = num(m, "norm_ratio", NAN);
    w2->m.rel_l2 = num(m, "rel_l2", NAN);
    w2->m.max_abs = num(m, "max_abs", NAN);
    w2->outlier = flag(x, "outlier");
    str(x, "outlier_why", w2->outlier_why, sizeof w2->outlier_why);
    char v[16] = "";
    str(x, "verdict", v, sizeof v);
    w2->fail = strcmp(v, "fail") == 0;
    str(x, "why", w2->why, sizeof w2->why);
  }
  cJSON_ArrayForEach(x, get(r, "classes")) {
    qc_cclass *c = GROW(s->cls, s->ncls);
    if (!c) return OOM();
    str(x, "class", c->cls, sizeof c->cls);
    t[0] = 0;
    str(x, "tensor", t, sizeof t);
    c->tensor = tensor_name(t);
    str(x, "weight_format", c->wfmt, sizeof c->wfmt);
    str(x, "activation_format", c->afmt, sizeof c->afmt);
    c->layers = as_int(num(x, "layers", 0));
    c->rows = as_int(num(x, "rows", 0));
    c->outliers = as_int(num(x, "outliers", 0));
    c->fails = as_int(num(x, "failed", 0));
    const cJSON *cs = get(x, "cosine"), *ns = get(x, "norm_ratio");
    c->cos_min = num(cs, "min", NAN);
    c->cos_med = num(cs, "median", NAN);
    c->cos_max = num(cs, "max", NAN);
    c->nr_min = num(ns, "min", NAN);
    c->nr_med = num(ns, "median", NAN);
    c->nr_max = num(ns, "max", NAN);
    c->rel_med = num(x, "rel_l2_median", NAN);
  }
  return QC_OK;
}

/* ---- layer 3 and the one-step update ---------------------------------------------------- */

/* {"x": [...], "a": [...], ...}: the named arrays against x. */
static int read_series(const cJSON *o, qc_ev_sftcheck *m) {
  static const char *const keys[] = {"a", "b", "lo", "hi"};
  double *x = NULL;
  int nx = floats(get(o, "x"), &x);
  for (int k = 0; k < 4 && nx > 0; k++) {
    double *y = NULL;
    int ny = floats(get(o, keys[k]), &y);
    if (ny != nx) {
      free(y);
      continue;
    }
    qc_ev_series *s = &m->ser[m->nser++];
    snprintf(s->label, sizeof s->label, "%s", keys[k]);
    s->n = nx;
    s->y = y;
    if (!(s->x = malloc((size_t)nx * sizeof *s->x))) { free(x); return OOM(); }
    memcpy(s->x, x, (size_t)nx * sizeof *x);
  }
  free(x);
  return QC_OK;
}

static const char *const g_arms[3] = {"under_test", "gradient_reference", "native_baseline"};

static int read_sft(const cJSON *r, int src, qc_evidence *e) {
  qc_ev_sft *s = GROW(e->sft, e->nsft);
  if (!s) return OOM();
  s->src = src;
  str(r, "x", s->x, sizeof s->x);
  const cJSON *w = get(r, "window"), *x;
  if (cJSON_IsArray(w) && cJSON_GetArraySize(w) == 2) {
    s->has_window = 1;
    s->w0 = cJSON_GetArrayItem(w, 0)->valuedouble;
    s->w1 = cJSON_GetArrayItem(w, 1)->valuedouble;
  }
  cJSON_ArrayForEach(x, get(r, "config_diff")) {
    qc_ev_cfg *c = GROW(s->cfg, s->ncfg);
    if (!c) return OOM();
    str(x, "key", c->key, sizeof c->key);
    for (int a = 0; a < 3; a++) str(get(x, "values"), g_arms[a], c->v[a], sizeof c->v[a]);
    c->differs = flag(x, "differs");
    c->expected = flag(x, "expected");
  }
  cJSON_ArrayForEach(x, get(r, "pairs")) {
    qc_ev_pair *p = GROW(s->pair, s->npair);
    if (!p) return OOM();
    str(x, "a", p->a, sizeof p->a);
    str(x, "b", p->b, sizeof p->b);
    str(x, "verdict", p->verdict, sizeof p->verdict);
    str(x, "localization", p->localization, sizeof p->localization);
    const cJSON *fd = get(x, "first_deviation"), *m;
    if (cJSON_IsObject(fd)) {
      p->has_first = 1;
      p->first_x = num(fd, "x", NAN);
      str(fd, "metric", p->first_metric, sizeof p->first_metric);
      str(fd, "bound", p->first_bound, sizeof p->first_bound);
    }
    cJSON_ArrayForEach(m, get(x, "metrics")) {
      qc_ev_sftcheck *c = GROW(p->m, p->n);
      if (!c) return OOM();
      str(m, "metric", c->metric, sizeof c->metric);
      str(m, "verdict", c->verdict, sizeof c->verdict);
      str(m, "bound", c->bound, sizeof c->bound);
      str(m, "window", c->window, sizeof c->window);
      str(m, "why", c->why, sizeof c->why);
      c->mean_diff = num(m, "mean_diff", NAN);
      c->max_rel = num(m, "max_rel", NAN);
      c->has_fail = cJSON_IsNumber(get(m, "first_fail_x"));
      c->fail_x = num(m, "first_fail_x", NAN);
      if (cJSON_IsObject(get(m, "series")) && read_series(get(m, "series"), c)) return QC_ESYS;
    }
  }
  /* "curves": [{"metric", "x": [...], "arms": {"under_test": [...], ...}}] */
  cJSON_ArrayForEach(x, get(r, "curves")) {
    const cJSON *arm;
    double *xs = NULL;
    int nx = floats(get(x, "x"), &xs);
    char metric[48] = "";
    str(x, "metric", metric, sizeof metric);
    cJSON_ArrayForEach(arm, get(x, "arms")) {
      double *y = NULL;
      if (floats(arm, &y) != nx || nx == 0) { free(y); continue; }
      qc_ev_series *c = GROW(s->curve, s->ncurve);
      if (!c || !(c->x = malloc((size_t)nx * sizeof *c->x))) { free(y); free(xs); return OOM(); }
      memcpy(c->x, xs, (size_t)nx * sizeof *xs);
      c->y = y;
      c->n = nx;
      snprintf(c->label, sizeof c->label, "%s: %s", metric, arm->string ? arm->string : "?");
    }
    free(xs);
  }
  return QC_OK;
}

static int read_step(const cJSON *r, int src, qc_evidence *e) {
  const cJSON *x;
  cJSON_ArrayForEach(x, get(r, "checks")) {
    qc_ev_step *c = GROW(e->step, e->nstep);
    if (!c) return OOM();
    c->src = src;
    str(x, "arm", c->arm, sizeof c->arm);
    str(x, "param", c->param, sizeof c->param);
    str(x, "kind", c->kind, sizeof c->kind);
    str(x, "verdict", c->verdict, sizeof c->verdict);
    str(x, "why", c->why, sizeof c->why);
    const cJSON *m = get(x, "metrics");
    c->has_metrics = cJSON_IsObject(m);
    c->rel_l2 = num(m, "rel_l2", NAN);
    c->cosine = num(m, "cosine", NAN);
    c->norm_ratio = num(m, "norm_ratio", NAN);
    c->max_abs = num(m, "max_abs", NAN);
  }
  static const char *const notes[] = {"grad_norm", "clip_coef"};
  for (int i = 0; i < 2; i++) {
    const cJSON *n = get(r, notes[i]);
    if (!n) continue;
    char t[512];
    qc_audit_arm_numbers(n, t, sizeof t);
    size_t l = strlen(e->step_notes);
    snprintf(e->step_notes + l, sizeof e->step_notes - l, "%s%s: %s", l ? "; " : "", notes[i], t);
  }
  return QC_OK;
}

/* ---- one report ------------------------------------------------------------------------ */

int qc_audit_read(const char *path, qc_evidence *e) {
  char *text = NULL;
  size_t got = 0;
  cJSON *r = NULL;
  qc_report_counts cnt;
  /* read, limits, and re-judged: a report is evidence, never taken at its verdict (qc_report_rejudge) */
  int rc0 = qc_report_read_json(path, "report", &text, &got, &r, &cnt);
  if (rc0) return rc0;
  qc_ev_src *s = GROW(e->src, e->nsrc);
  int rc = s ? QC_OK : OOM();
  if (!rc) {
    qc_sha256_hex(text, (size_t)got, s->sha256);
    snprintf(s->path, sizeof s->path, "%s", path);
  }
  free(text);
  if (rc) goto done;
  if (!r) {
    rc = qc_err("report '%s': not a qatcheck JSON report (expected an object with \"verb\" and \"qatcheck_report\")", path);
    qc_hint("give the --json reports of vjp, contract, sft or step");
    goto done;
  }
  str(r, "verb", s->verb, sizeof s->verb);
  str(r, "verdict", s->verdict, sizeof s->verdict);
  str(r, "error", s->error, sizeof s->error);
  str(r, "source_commit", s->commit, sizeof s->commit);
  const cJSON *c = get(r, "case"), *d = get(r, "dump");
  if (cJSON_IsObject(c)) str(c, "name", s->title, sizeof s->title);
  else str(r, "case", s->title, sizeof s->title);
  if (!s->title[0] && cJSON_IsObject(d)) str(d, "path", s->title, sizeof s->title);
  if (!s->title[0] && cJSON_IsObject(get(r, "checkpoint"))) str(get(r, "checkpoint"), "path", s->title, sizeof s->title); /* quant */
  if (!s->title[0]) str(r, "module", s->title, sizeof s->title);
  s->checks = cnt.checks;
  s->failed = cnt.failed;
  s->judged = cnt.judged;
  int src = e->nsrc - 1;
  if (strcmp(s->verdict, "error") == 0) goto done; /* nothing judged: listed, not read */
  if (strcmp(s->verb, "vjp") == 0) rc = read_vjp(r, src, e);
  else if (strcmp(s->verb, "contract") == 0) rc = read_contract(r, src, e);
  else if (strcmp(s->verb, "sft") == 0) rc = read_sft(r, src, e);
  else if (strcmp(s->verb, "step") == 0) rc = read_step(r, src, e);
done:
  cJSON_Delete(r);
  return rc;
}

/* ---- baselines ------------------------------------------------------------------------- */

/* The input report that baseline b is compared with, -1 with the error set. */
static int pair_of(const qc_evidence *e, const cJSON *b, const char *bpath) {
  const cJSON *v = get(b, "verb"), *c = get(b, "case"), *d = get(b, "dump");
  char title[QC_EV_TEXT] = "";
  if (cJSON_IsObject(c)) str(c, "name", title, sizeof title);
  else str(b, "case", title, sizeof title);
  if (!title[0] && cJSON_IsObject(d)) str(d, "path", title, sizeof title);
  int found = -1, n = 0;
  for (int i = 0; i < e->nsrc; i++)
    if (!strcmp(e->src[i].verb, v->valuestring) && strcmp(e->src[i].verdict, "error")) {
      n++;
      if (found < 0) found = i;
    }
  if (n > 1) {
    found = -1;
    for (int i = 0; i < e->nsrc && found < 0; i++)
      if (!strcmp(e->src[i].verb, v->valuestring) && !strcmp(e->src[i].title, title)) found = i;
  }
  if (found < 0)
    qc_err("--baseline '%s': no input report to compare it with (%s%s%s)", bpath, v->valuestring, title[0] ? " of " : "",
           title);
  return found;
}

/* The report at path parsed again (the evidence keeps no JSON), or NULL
 * with the error set. */
static cJSON *parse_file(const char *path) {
  char *text = NULL;
  size_t n = 0;
  cJSON *j = NULL;
  if (qc_report_read_json(path, "report", &text, &n, &j, NULL)) return NULL;
  free(text);
  if (!j) qc_err("report '%s': cannot parse it again: it changed while being read", path);
  return j;
}

int qc_audit_baselines(qc_audit_ctx *a, const qc_gate *g) {
  const qc_evidence *e = a->e;
  a->reg = calloc((size_t)e->nsrc + 1, sizeof *a->reg);
  a->reg_base = calloc((size_t)e->nsrc + 1, sizeof *a->reg_base);
  if (!a->reg || !a->reg_base) return OOM();
  for (int b = 0; b < g->nbase; b++) {
    const char *bpath = g->base_path[b];
    int s = pair_of(e, g->base[b], bpath), rc;
    if (s < 0) return QC_EINPUT;
    if (a->reg_base[s])
      return qc_err("--baseline '%s': report '%s' has a baseline already ('%s')", bpath, e->src[s].path, a->reg_base[s]);
    cJSON *cur = parse_file(e->src[s].path);
    if (!cur) return QC_EINPUT;
    rc = qc_baseline_compare(g->base[b], cur, a->factor, &a->reg[s]);
    cJSON_Delete(cur);
    if (rc) return rc;
    a->reg_base[s] = bpath;
  }
  return QC_OK;
}
