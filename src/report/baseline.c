/* baseline.c: the regression gate (baseline.h). */
#include "report/baseline.h"

#include <cjson/cJSON.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/qc.h"
#include "report/tlist.h"

typedef struct bl_metric {
  const char *path;   /* "metrics.noise_multiple": dotted, inside the check */
  double slack;       /* absolute floor of a rise */
} bl_metric;

/* What a check is in one verb's JSON report. */
typedef struct bl_verb {
  const char *verb;
  const char *array;       /* the checks: a top-level array */
  const char *sub;         /* NULL, or an array inside each element holding the checks */
  const char *key[6];      /* identity fields ("^a": the enclosing element's) */
  const char *pass_field;  /* where the verdict is */
  const char *pass_value;  /* the value that means passed (NULL: boolean true) */
  bl_metric metric[3];     /* rises judged: the first both reports hold */
  const char *flag;        /* a boolean that must not turn true (NULL: none) */
} bl_verb;

static const bl_verb g_rows[] = {
    {"vjp", "checks", NULL, {"module", "dy", "tensor"}, "verdict", "pass",
     {{"metrics.noise_multiple", 0.05}, {"metrics.rel_l2", 1e-9}, {"metrics.max_abs", 1e-12}}, NULL},
    {"contract", "rows", NULL, {"module", "tensor", "weight_format", "activation_format", "dy"}, "verdict", "pass",
     {{"metrics.rel_l2", 1e-9}}, "outlier"},
    {"fd", "rows", NULL, {"class", "tensor", "direction"}, "pass", NULL, {{"rel_err", 1e-9}}, NULL},
    {"quant", "checks", NULL, {"module", "format", "profile"}, "result", "reproduced", {{NULL, 0}}, NULL},
    {"sft", "pairs", "metrics", {"^a", "^b", "metric", "window"}, "verdict", "pass", {{"max_rel", 1e-6}}, NULL},
    {"step", "checks", NULL, {"arm", "param", "kind"}, "verdict", "pass", {{"metrics.rel_l2", 1e-9}}, NULL},
};

static const bl_verb *find_row(const char *verb) {
  for (size_t i = 0; verb && i < sizeof g_rows / sizeof g_rows[0]; i++)
    if (strcmp(g_rows[i].verb, verb) == 0) return &g_rows[i];
  return NULL;
}

int qc_baseline_known(const char *verb) { return find_row(verb) != NULL; }

int qc_baseline_applies(const qc_gate *g, const char *verb) { return g && g->nbase > 0 && find_row(verb) != NULL; }

const char *qc_baseline_rule(double factor) {
  static char buf[512];
  snprintf(buf, sizeof buf,
           "a check matched by identity is a regression when it vanished, when it fails and did not (or is new and "
           "fails), when its metric (the noise multiple where both reports have it, else rel_l2) rose above %g x "
           "its baseline value + a floor (0.05 for the noise multiple, 1e-9 for rel_l2), or when it became an outlier",
           factor);
  return buf;
}

/* ---- flattening a report into checks ---------------------------------------------- */

typedef struct bl_check {
  char *id;                 /* identity text, with the occurrence number of a repeated one */
  const cJSON *item, *parent;
  int used;
} bl_check;

typedef struct bl_set {
  int n, cap;
  bl_check *v;
  int *slot;                /* open addressing on id */
  size_t nslot;
} bl_set;

static const cJSON *get_path(const cJSON *o, const char *path) {
  char part[64];
  while (o && *path) {
    size_t n = strcspn(path, ".");
    if (n >= sizeof part) return NULL;
    memcpy(part, path, n);
    part[n] = 0;
    o = cJSON_GetObjectItemCaseSensitive(o, part);
    path += n + (path[n] == '.');
  }
  return o;
}

static uint64_t fnv(const char *s) {
  uint64_t h = 1469598103934665603ull;
  for (; *s; s++) h = (h ^ (unsigned char)*s) * 1099511628211ull;
  return h;
}

/* Find id in s: its index, or -1. */
static int find(const bl_set *s, const char *id) {
  if (!s->nslot) return -1;
  for (size_t h = fnv(id) & (s->nslot - 1);; h = (h + 1) & (s->nslot - 1)) {
    if (s->slot[h] < 0) return -1;
    if (strcmp(s->v[s->slot[h]].id, id) == 0) return s->slot[h];
  }
}

/* The identity of item: "k=v k=v", with #N for the N-th repeat. */
static char *identity(const bl_verb *row, const cJSON *item, const cJSON *parent, const bl_set *s) {
  qc_sbuf b = {0};
  for (int i = 0; i < 6 && row->key[i]; i++) {
    const char *k = row->key[i];
    const cJSON *v = k[0] == '^' ? (parent ? cJSON_GetObjectItemCaseSensitive(parent, k + 1) : NULL)
                                 : cJSON_GetObjectItemCaseSensitive(item, k);
    if (k[0] == '^') k++;
    if (!v) continue;
    if (cJSON_IsString(v)) qc_sbuf_printf(&b, "%s%s=%s", b.n ? " " : "", k, v->valuestring);
    else {
      char *t = cJSON_PrintUnformatted(v);
      qc_sbuf_printf(&b, "%s%s=%s", b.n ? " " : "", k, t ? t : "?");
      free(t);
    }
  }
  if (!b.s) qc_sbuf_printf(&b, "(unnamed)");
  for (int rep = 2; !b.oom && find(s, b.s) >= 0; rep++) {
    size_t at = b.n;
    qc_sbuf_printf(&b, " #%d", rep);
    if (find(s, b.s) < 0) break;
    b.n = at;
    b.s[at] = 0;
  }
  if (b.oom) {
    qc_sbuf_free(&b);
    return NULL;
  }
  return b.s;
}

static int add(bl_set *s, char *id, const cJSON *item, const cJSON *parent) {
  if (s->n == s->cap) {
    int cap = s->cap ? 2 * s->cap : 64;
    bl_check *nv = realloc(s->v, (size_t)cap * sizeof *nv);
    if (!nv) return -1;
    s->v = nv;
    s->cap = cap;
  }
  if ((size_t)(s->n + 1) * 2 > s->nslot) { /* grow and rehash */
    size_t ns = s->nslot ? 2 * s->nslot : 128;
    int *sl = malloc(ns * sizeof *sl);
    if (!sl) return -1;
    for (size_t i = 0; i < ns; i++) sl[i] = -1;
    free(s->slot);
    s->slot = sl;
    s->nslot = ns;
    for (int i = 0; i < s->n; i++) {
      size_t h = fnv(s->v[i].id) & (ns - 1);
      while (sl[h] >= 0) h = (h + 1) & (ns - 1);
      sl[h] = i;
    }
  }
  size_t h = fnv(id) & (s->nslot - 1);
  while (s->slot[h] >= 0) h = (h + 1) & (s->nslot - 1);
  s->slot[h] = s->n;
  s->v[s->n++] = (bl_check){id, item, parent, 0};
  return 0;
}

static void set_free(bl_set *s) {
  for (int i = 0; i < s->n; i++) free(s->v[i].id);
  free(s->v);
  free(s->slot);
}

static int flatten(const bl_verb *row, const cJSON *rep, bl_set *s) {
  const cJSON *arr = cJSON_GetObjectItemCaseSensitive(rep, row->array), *e;
  cJSON_ArrayForEach(e, arr) {
    if (!row->sub) {
      char *id = identity(row, e, NULL, s);
      if (!id || add(s, id, e, NULL)) { free(id); return qc_err_sys("out of memory comparing with the baseline"); }
      continue;
    }
    const cJSON *c;
    cJSON_ArrayForEach(c, cJSON_GetObjectItemCaseSensitive(e, row->sub)) {
      char *id = identity(row, c, e, s);
      if (!id || add(s, id, c, e)) { free(id); return qc_err_sys("out of memory comparing with the baseline"); }
    }
  }
  return QC_OK;
}

static int passed(const bl_verb *row, const cJSON *item) {
  const cJSON *v = cJSON_GetObjectItemCaseSensitive(item, row->pass_field);
  if (!row->pass_value) return cJSON_IsTrue(v);
  return cJSON_IsString(v) && strcmp(v->valuestring, row->pass_value) == 0;
}

static int push(qc_regress_list *l, qc_reg_kind k, const char *id, const char *what) {
  if (l->n == l->cap) {
    int cap = l->cap ? 2 * l->cap : 16;
    qc_regress *nv = realloc(l->v, (size_t)cap * sizeof *nv);
    if (!nv) return qc_err_sys("out of memory comparing with the baseline");
    l->v = nv;
    l->cap = cap;
  }
  qc_regress *r = &l->v[l->n++];
  r->kind = k;
  snprintf(r->id, sizeof r->id, "%s", id);
  snprintf(r->what, sizeof r->what, "%s", what);
  return QC_OK;
}

/* The first metric finite in both; a rise beyond F x old + slack is a regression. */
static int judge_rise(const bl_verb *row, const bl_check *o, const bl_check *c, double f, qc_regress_list *l) {
  for (int m = 0; m < 3 && row->metric[m].path; m++) {
    const cJSON *a = get_path(o->item, row->metric[m].path), *b = get_path(c->item, row->metric[m].path);
    if (!cJSON_IsNumber(a) || !cJSON_IsNumber(b) || !isfinite(a->valuedouble) || !isfinite(b->valuedouble)) continue;
    double before = a->valuedouble, now = b->valuedouble, lim = f * fabs(before) + row->metric[m].slack;
    if (!(now > lim)) return QC_OK;
    const char *name = strrchr(row->metric[m].path, '.');
    char what[256];
    snprintf(what, sizeof what, "%s %.4g -> %.4g (above %g x %.4g + %g)", name ? name + 1 : row->metric[m].path, before,
             now, f, before, row->metric[m].slack);
    return push(l, QC_REG_RISE, c->id, what);
  }
  return QC_OK;
}

int qc_baseline_compare(const cJSON *old, const cJSON *cur, double factor, qc_regress_list *out) {
  const cJSON *vo = cJSON_GetObjectItemCaseSensitive(old, "verb"), *vc = cJSON_GetObjectItemCaseSensitive(cur, "verb");
  memset(out, 0, sizeof *out);
  if (!cJSON_IsString(vo) || !cJSON_IsString(vc) || strcmp(vo->valuestring, vc->valuestring) != 0)
    return qc_err("baseline: a '%s' report cannot be compared with a '%s' report", cJSON_IsString(vo) ? vo->valuestring : "?",
                  cJSON_IsString(vc) ? vc->valuestring : "?");
  const bl_verb *row = find_row(vc->valuestring);
  if (!row) return QC_OK; /* nothing to compare: supported stays 0 */
  out->supported = 1;
  bl_set so = {0}, sc = {0};
  int rc = flatten(row, old, &so);
  if (!rc) rc = flatten(row, cur, &sc);
  for (int i = 0; !rc && i < sc.n; i++) {
    bl_check *c = &sc.v[i];
    int j = find(&so, c->id);
    if (j < 0) {
      out->added++;
      if (!passed(row, c->item)) rc = push(out, QC_REG_FAILURE, c->id, "new check, fails");
      continue;
    }
    bl_check *o = &so.v[j];
    o->used = 1;
    out->matched++;
    if (!passed(row, c->item)) {
      if (passed(row, o->item)) rc = push(out, QC_REG_FAILURE, c->id, "fails now, passed in the baseline");
      continue;
    }
    if ((rc = judge_rise(row, o, c, factor, out))) break;
    if (row->flag && cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(c->item, row->flag)) &&
        !cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(o->item, row->flag))) {
      char what[128];
      snprintf(what, sizeof what, "became an %s", row->flag);
      rc = push(out, QC_REG_FLAG, c->id, what);
    }
  }
  for (int j = 0; !rc && j < so.n; j++)
    if (!so.v[j].used) {
      out->vanished++;
      rc = push(out, QC_REG_VANISHED, so.v[j].id, "vanished: in the baseline, not in this run");
    }
  set_free(&so);
  set_free(&sc);
  return rc;
}

void qc_regress_free(qc_regress_list *l) {
  free(l->v);
  memset(l, 0, sizeof *l);
}

static const char *kind_name(qc_reg_kind k) {
  return k == QC_REG_VANISHED ? "vanished" : k == QC_REG_FAILURE ? "new failure" : k == QC_REG_RISE ? "rise" : "flag";
}

/* ---- the run's comparison ---------------------------------------------------------- */

/* Add the comparison to the rendered JSON text (parsed, amended, printed). */
static int amend_json(qc_report_out *o, const qc_regress_list *l, const char *bpath, double f, int fail_on) {
  cJSON *root = cJSON_Parse(o->doc[QC_REP_JSON].s);
  if (!root) return qc_err_sys("out of memory comparing with the baseline");
  cJSON *b = cJSON_AddObjectToObject(root, "baseline");
  cJSON_AddStringToObject(b, "path", bpath);
  cJSON_AddNumberToObject(b, "factor", f);
  cJSON_AddStringToObject(b, "rule", qc_baseline_rule(f));
  cJSON_AddBoolToObject(b, "fail_on_regression", fail_on);
  cJSON_AddNumberToObject(b, "matched", l->matched);
  cJSON_AddNumberToObject(b, "new", l->added);
  cJSON_AddNumberToObject(b, "vanished", l->vanished);
  cJSON *rs = cJSON_AddArrayToObject(b, "regressions");
  for (int i = 0; i < l->n; i++) {
    cJSON *r = cJSON_CreateObject();
    cJSON_AddStringToObject(r, "check", l->v[i].id);
    cJSON_AddStringToObject(r, "kind", kind_name(l->v[i].kind));
    cJSON_AddStringToObject(r, "what", l->v[i].what);
    cJSON_AddItemToArray(rs, r);
  }
  cJSON *t = cJSON_GetObjectItemCaseSensitive(root, "totals");
  if (t) cJSON_AddNumberToObject(t, "regressions", l->n);
  qc_sbuf_free(&o->doc[QC_REP_JSON]);
  return qc_report_json_render(root, &o->doc[QC_REP_JSON]);
}

static void amend_markdown(qc_sbuf *b, const qc_regress_list *l, const char *bpath, double f) {
  qc_sbuf_printf(b, "\n## Regressions against the baseline: %d\n\n- baseline: `", l->n);
  qc_sbuf_md(b, bpath);
  qc_sbuf_printf(b, "`; %d check(s) matched, %d new, %d vanished\n- rule: %s\n\n", l->matched, l->added, l->vanished,
                 qc_baseline_rule(f));
  for (int i = 0; i < l->n; i++) {
    qc_sbuf_printf(b, "- **%s** `", kind_name(l->v[i].kind));
    qc_sbuf_md(b, l->v[i].id);
    qc_sbuf_printf(b, "`: ");
    qc_sbuf_md(b, l->v[i].what);
    qc_sbuf_printf(b, "\n");
  }
}

static int amend_junit(qc_sbuf *doc, const qc_regress_list *l, const char *bpath) {
  qc_tlist t = {0};
  int rc = QC_OK;
  for (int i = 0; i < l->n && !rc; i++) rc = qc_tlist_add(&t, "baseline", "baseline", l->v[i].id, l->v[i].what, NULL);
  if (!rc && l->n == 0) {
    char out[1200];
    snprintf(out, sizeof out, "%d check(s) matched against %s, %d new, none regressed", l->matched, bpath, l->added);
    rc = qc_tlist_add(&t, "baseline", "baseline", "no regression", NULL, out);
  }
  if (!rc) rc = qc_tlist_junit_append(&t, doc);
  qc_tlist_free(&t);
  return rc;
}

int qc_baseline_apply(qc_report_out *o) {
  qc_gate *g = o->gate;
  if (!g || g->nbase < 1 || !o->doc[QC_REP_JSON].s) return QC_OK;
  const cJSON *old = g->base[0];
  const char *bpath = g->base_path[0];
  double f = g->factor;
  cJSON *cur = cJSON_Parse(o->doc[QC_REP_JSON].s);
  if (!cur) return qc_err_sys("out of memory comparing with the baseline");
  qc_regress_list l;
  int rc = qc_baseline_compare(old, cur, f, &l);
  cJSON_Delete(cur);
  if (rc) return rc;
  if ((rc = amend_json(o, &l, bpath, f, g->fail_on))) goto done;
  if (o->path[QC_REP_MARKDOWN]) amend_markdown(&o->doc[QC_REP_MARKDOWN], &l, bpath, f);
  if (o->path[QC_REP_JUNIT] && g->fail_on && (rc = amend_junit(&o->doc[QC_REP_JUNIT], &l, bpath)))
    goto done;
  /* the console lines, printed when the run ends */
  qc_sbuf s = {0};
  qc_sbuf_printf(&s, "\nbaseline %s: %d regression(s); %d check(s) matched, %d new, %d vanished\n", bpath, l.n, l.matched,
                 l.added, l.vanished);
  for (int i = 0; i < l.n && i < 50; i++) qc_sbuf_printf(&s, "  REGRESSION %s: %s\n", l.v[i].id, l.v[i].what);
  if (l.n > 50) qc_sbuf_printf(&s, "  ... %d more in the JSON report\n", l.n - 50);
  qc_baseline_record(g, l.n, s.s);
  qc_sbuf_free(&s);
done:
  qc_regress_free(&l);
  return rc;
}

void qc_baseline_record(qc_gate *g, int n, const char *summary) {
  g->nreg += n;
  if (summary && summary[0]) qc_sbuf_printf(&g->regs, "%s", summary);
}

void qc_gate_free(qc_gate *g) {
  for (int i = 0; i < g->nbase; i++) {
    cJSON_Delete(g->base[i]);
    free(g->base_path[i]);
  }
  qc_sbuf_free(&g->regs);
  memset(g, 0, sizeof *g);
}
