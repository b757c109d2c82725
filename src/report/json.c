/* json.c: the JSON envelope every verb's report starts with, and the vjp
 * report (docs/reports.md: one check per module, dY and gradient). */
#include <cJSON.h>
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "model/check.h"
#include "core/file.h"
#include "core/qc.h"
#include "report/report.h"

static const char *verdict_str(int v) { return v == 0 ? "pass" : v == 1 ? "fail" : "error"; }

/* A number, or null when not finite (JSON has no NaN/Inf). */
static void add_num(cJSON *o, const char *k, double v) {
  if (isfinite(v)) cJSON_AddNumberToObject(o, k, v);
  else cJSON_AddNullToObject(o, k);
}

static cJSON *shape_json(int ndim, const int64_t *shape) {
  cJSON *a = cJSON_CreateArray();
  for (int i = 0; i < ndim; i++) cJSON_AddItemToArray(a, cJSON_CreateNumber((double)shape[i]));
  return a;
}

/* Unravel a flat index into a shape (row-major). */
static cJSON *index_json(int64_t flat, int ndim, const int64_t *shape) {
  if (flat < 0) return cJSON_CreateNull();
  int64_t idx[QC_MAXDIM];
  for (int i = ndim - 1; i >= 0; i--) {
    int64_t s = shape[i] ? shape[i] : 1;
    idx[i] = flat % s;
    flat /= s;
  }
  return shape_json(ndim, idx);
}

cJSON *qc_report_tol_json(const qc_tol *t) {
  cJSON *o = cJSON_CreateObject();
  if (t->has_rel_l2) cJSON_AddNumberToObject(o, "rel_l2", t->rel_l2);
  if (t->has_max_abs) cJSON_AddNumberToObject(o, "max_abs", t->max_abs);
  if (t->has_cosine_min) cJSON_AddNumberToObject(o, "cosine_min", t->cosine_min);
  if (t->has_norm_ratio) {
    cJSON *a = cJSON_CreateArray();
    cJSON_AddItemToArray(a, cJSON_CreateNumber(t->norm_lo));
    cJSON_AddItemToArray(a, cJSON_CreateNumber(t->norm_hi));
    cJSON_AddItemToObject(o, "norm_ratio", a);
  }
  if (t->has_noise_multiple) cJSON_AddNumberToObject(o, "noise_multiple", t->noise_multiple);
  if (t->has_bias_z) cJSON_AddNumberToObject(o, "bias_z", t->bias_z);
  if (t->has_bias_allow) cJSON_AddNumberToObject(o, "bias_allowance", t->bias_allow);
  if (t->dtype[0]) cJSON_AddStringToObject(o, "dtype", t->dtype);
  if (t->derive && !t->has_rel_l2 && !t->has_max_abs) cJSON_AddBoolToObject(o, "derive", 1); /* not derived: no metrics */
  cJSON_AddStringToObject(o, "reasoning", t->reasoning);
  return o;
}

cJSON *qc_report_envelope(qc_prov *prov, const char *verb, int verdict) {
  cJSON *root = cJSON_CreateObject();
  if (!root) return NULL;
  cJSON_AddNumberToObject(root, "qatcheck_report", 1);
  cJSON_AddStringToObject(root, "tool_version", QC_VERSION);
  cJSON_AddStringToObject(root, "source_commit", qc_build_commit());
  cJSON_AddStringToObject(root, "verb", verb);
  cJSON_AddStringToObject(root, "verdict", verdict_str(verdict));
  qc_prov_json(prov, root);
  return root;
}

void qc_report_tool_md(qc_sbuf *b) {
  qc_sbuf_printf(b, "- qatcheck %s, source commit `", QC_VERSION);
  qc_sbuf_md(b, qc_build_commit());
  qc_sbuf_printf(b, "`\n");
}

void qc_report_totals(cJSON *root, int checks, int failed, int errors) {
  cJSON *t = cJSON_AddObjectToObject(root, "totals");
  cJSON_AddNumberToObject(t, "checks", checks);
  cJSON_AddNumberToObject(t, "passed", checks - failed);
  cJSON_AddNumberToObject(t, "failed", failed);
  cJSON_AddNumberToObject(t, "errors", errors);
}

/* Every number under n printed as the shortest of %.15g, %.16g and %.17g
 * that reads back as the same double (integers as cJSON prints them),
 * instead of cJSON's own printing, which keeps a 15-digit form that is
 * within DBL_EPSILON of the value: a report read back is re-judged
 * (qc_report_rejudge) on the very numbers the run judged. -1 out of memory. */
static int exact_numbers(cJSON *n) {
  for (; n; n = n->next) {
    if (n->child && exact_numbers(n->child)) return -1;
    if (!cJSON_IsNumber(n)) continue;
    double d = n->valuedouble;
    char buf[40];
    if (!isfinite(d)) snprintf(buf, sizeof buf, "null");
    else if (d == (double)n->valueint) snprintf(buf, sizeof buf, "%d", n->valueint);
    else
      for (int p = 15; p <= 17; p++) {
        snprintf(buf, sizeof buf, "%.*g", p, d);
        if (strtod(buf, NULL) == d) break;
      }
    size_t l = strlen(buf) + 1;
    char *raw = cJSON_malloc(l);
    if (!raw) return -1;
    memcpy(raw, buf, l);
    n->type = cJSON_Raw;
    n->valuestring = raw;
  }
  return 0;
}

int qc_report_json_render(cJSON *root, qc_sbuf *out) {
  if (!root) return qc_err_sys("out of memory building the report");
  if (exact_numbers(root)) {
    cJSON_Delete(root);
    return qc_err_sys("out of memory printing the report");
  }
  char *text = cJSON_Print(root);
  cJSON_Delete(root);
  if (!text) return qc_err_sys("out of memory printing the report");
  qc_sbuf_printf(out, "%s\n", text);
  free(text);
  return out->oom ? qc_err_sys("out of memory printing the report") : QC_OK;
}

/* The GEMM that made a check's reference (--reference; docs/gpu.md): method
 * "float64", "ozaki_int8" (the fast reference, its self-check held) or
 * "float64_fallback" (it ran, its self-check failed, DGEMM recomputed it);
 * the last two with their slices and self-check. No times: deterministic. */
static cJSON *ref_gemm_json(const qc_refgemm *r) {
  cJSON *o = cJSON_CreateObject();
  cJSON_AddStringToObject(o, "method", !r->slices ? "float64" : r->kept ? "ozaki_int8" : "float64_fallback");
  if (!r->slices) return o;
  cJSON_AddNumberToObject(o, "slices", r->slices);
  if (r->kept && r->pairs > 0) cJSON_AddNumberToObject(o, "pairs", r->pairs);
  cJSON *c = cJSON_AddObjectToObject(o, "self_check");
  add_num(c, "max_error", r->err);
  add_num(c, "normwise_error", r->err_norm);
  add_num(c, "gate", r->gate);
  return o;
}

/* The modules of a vjp run: origin, contract, shapes, dYs, coverage, time. */
static cJSON *modules_json(const qc_modinfos *l) {
  cJSON *a = cJSON_CreateArray();
  for (int i = 0; a && i < l->n; i++) {
    const qc_modinfo *mi = &l->v[i];
    cJSON *o = cJSON_CreateObject();
    cJSON_AddStringToObject(o, "module", mi->module);
    cJSON_AddStringToObject(o, "class", mi->cls);
    cJSON_AddStringToObject(o, "source", mi->source);
    cJSON_AddStringToObject(o, "candidate", mi->candidate);
    if (mi->values[0]) cJSON_AddStringToObject(o, "values", mi->values);
    cJSON *c = cJSON_Parse(mi->contract);
    cJSON_AddItemToObject(o, "contract", c ? c : cJSON_CreateObject());
    char ref[160];
    snprintf(ref, sizeof ref, "qatcheck's float64 reference for class %s, written from the math; shares no code with "
             "the production VJP", mi->cls);
    cJSON_AddStringToObject(o, "reference", ref);
    cJSON_AddNumberToObject(o, "tokens", (double)mi->tokens);
    if (mi->seqlen) cJSON_AddNumberToObject(o, "seqlen", (double)mi->seqlen);
    cJSON *ts = cJSON_AddArrayToObject(o, "tensors");
    for (int j = 0; j < mi->nt; j++) {
      cJSON *t = cJSON_CreateObject();
      cJSON_AddStringToObject(t, "role", mi->t[j].role);
      cJSON_AddStringToObject(t, "name", mi->t[j].name);
      cJSON_AddStringToObject(t, "dtype", mi->t[j].dtype);
      cJSON_AddItemToObject(t, "shape", shape_json(mi->t[j].ndim, mi->t[j].shape));
      cJSON_AddItemToArray(ts, t);
    }
    cJSON *dy = cJSON_AddArrayToObject(o, "dy");
    for (int j = 0; j < mi->ndy; j++) {
      cJSON *d = cJSON_CreateObject();
      cJSON_AddStringToObject(d, "name", mi->dy[j].name);
      cJSON_AddStringToObject(d, "kind", mi->dy[j].kind);
      cJSON_AddNumberToObject(d, "nonzero", mi->dy[j].nonzero);
      cJSON_AddItemToArray(dy, d);
    }
    cJSON *cv = cJSON_AddArrayToObject(o, "coverage");
    for (int c = 0; c < QC_COV_COUNT; c++)
      if (mi->cover >> c & 1) cJSON_AddItemToArray(cv, cJSON_CreateString(qc_coverage[c].id));
    cJSON_AddNumberToObject(o, "checks", mi->nchecks);
    cJSON_AddNumberToObject(o, "seconds", mi->seconds);
    cJSON_AddItemToArray(a, o);
  }
  return a;
}

int qc_report_json(qc_sbuf *out, qc_prov *prov, const qc_report_info *info, const qc_results *r) {
  int v = qc_results_verdict(r);
  cJSON *root = qc_report_envelope(prov, info->verb, v);
  if (!root) return qc_err_sys("out of memory building the report");
  if (info->case_path) {
    cJSON *c = cJSON_AddObjectToObject(root, "case");
    cJSON_AddStringToObject(c, "name", info->case_name ? info->case_name : "");
    cJSON_AddStringToObject(c, "path", info->case_path);
    cJSON_AddStringToObject(c, "sha256", info->case_sha256 ? info->case_sha256 : "");
  }
  if (info->device) cJSON_AddStringToObject(root, "device", info->device);
  if (info->profile) cJSON_AddStringToObject(root, "profile", info->profile);
  if (info->warnings && info->warnings[0]) { /* one string per line */
    cJSON *wa = cJSON_AddArrayToObject(root, "warnings");
    const char *p = info->warnings;
    char line[1024];
    while (qc_report_line(&p, line, sizeof line)) cJSON_AddItemToArray(wa, cJSON_CreateString(line));
  }
  /* a module's checks are consecutive; classes are few */
  int failed = 0, nmod = 0, ncls = 0;
  const char *cls[64];
  for (int i = 0; i < r->n; i++) {
    failed += r->v[i].verdict != QC_V_PASS;
    nmod += i == 0 || strcmp(r->v[i - 1].module, r->v[i].module) != 0;
    int seen = 0;
    for (int j = 0; j < ncls && !seen; j++) seen = strcmp(cls[j], r->v[i].cls) == 0;
    if (!seen && ncls < 64) cls[ncls++] = r->v[i].cls;
  }
  qc_report_totals(root, r->n, failed, 0);
  cJSON *tot = cJSON_GetObjectItemCaseSensitive(root, "totals");
  cJSON_AddNumberToObject(tot, "modules", nmod);
  cJSON_AddNumberToObject(tot, "classes", ncls);
  /* differentiable inputs each class deliberately leaves unchecked, and why */
  cJSON *nc = NULL;
  for (int i = 0; i < r->n; i++) {
    const qc_registry_row *row = qc_registry_find(r->v[i].cls);
    if (!row || !row->cls->not_checked || !row->cls->not_checked[0]) continue;
    if (!nc) nc = cJSON_AddObjectToObject(root, "not_checked");
    if (!cJSON_GetObjectItemCaseSensitive(nc, r->v[i].cls)) cJSON_AddStringToObject(nc, r->v[i].cls, row->cls->not_checked);
  }
  if (info->modules) cJSON_AddItemToObject(root, "modules", modules_json(info->modules));
  cJSON *checks = cJSON_AddArrayToObject(root, "checks");
  for (int i = 0; i < r->n; i++) {
    const qc_check *k = &r->v[i];
    cJSON *o = cJSON_CreateObject();
    cJSON_AddStringToObject(o, "module", k->module);
    cJSON_AddStringToObject(o, "class", k->cls);
    cJSON_AddStringToObject(o, "dy", k->dy);
    cJSON_AddStringToObject(o, "tensor", k->tensor);
    if (k->kind[0]) cJSON_AddStringToObject(o, "kind", k->kind);
    cJSON_AddItemToObject(o, "shape", shape_json(k->ndim, k->shape));
    if (k->cand_dtype[0]) cJSON_AddStringToObject(o, "candidate_dtype", k->cand_dtype);
    if (k->has_metrics) {
      cJSON *m = cJSON_AddObjectToObject(o, "metrics");
      add_num(m, "max_abs", k->m.max_abs);
      add_num(m, "rel_l2", k->m.rel_l2);
      add_num(m, "norm_ratio", k->m.norm_ratio);
      add_num(m, "norm", k->m.norm_g);
      add_num(m, "norm_reference", k->m.norm_r);
      if (k->m.cosine_null) cJSON_AddNullToObject(m, "cosine");
      else add_num(m, "cosine", k->m.cosine);
      if (isinf(k->m.sqnr_db) && k->m.sqnr_db > 0) cJSON_AddStringToObject(m, "sqnr_db", "inf");
      else add_num(m, "sqnr_db", k->m.sqnr_db);
      cJSON_AddNumberToObject(m, "nonfinite", (double)k->m.nonfinite);
      add_num(m, "noise_floor", k->m.noise_floor);
      add_num(m, "noise_multiple", k->m.noise_multiple);
      if (k->m.term_floor > 0) add_num(m, "term_floor", k->m.term_floor);
      cJSON_AddItemToObject(m, "worst_index", index_json(k->m.worst, k->ndim, k->shape));
      add_num(m, "bias_z", k->m.bias_z);
      if (!isnan(k->m.bias_z)) {
        cJSON *b = cJSON_AddObjectToObject(m, "bias");
        add_num(b, "e_par", k->m.e_par);
        add_num(b, "sd", k->m.bias_sd);
        add_num(b, "allowance", k->m.bias_allow);
        add_num(b, "z_raw", k->m.bias_z_raw);
      }
    }
    if (k->judged_dtype[0]) cJSON_AddStringToObject(o, "judged_dtype", k->judged_dtype);
    if (k->precision[0]) cJSON_AddStringToObject(o, "precision", k->precision);
    cJSON_AddStringToObject(o, "variant", k->variant_id[0] ? k->variant_id : "none"); /* the reference judged against */
    if (k->variant[0]) cJSON_AddStringToObject(o, "reference_variant", k->variant);
    cJSON_AddItemToObject(o, "reference_gemm", ref_gemm_json(&k->ref));
    if (k->has_tol) cJSON_AddItemToObject(o, "tolerance", qc_report_tol_json(&k->tol));
    cJSON_AddStringToObject(o, "verdict", k->verdict == QC_V_PASS ? "pass" : "fail");
    cJSON_AddStringToObject(o, "why", k->why);
    if (k->diagnosis[0]) {
      cJSON *dg = cJSON_AddObjectToObject(o, "diagnosis");
      cJSON_AddStringToObject(dg, "summary", k->diagnosis);
      cJSON *hs = cJSON_AddArrayToObject(dg, "hypotheses");
      for (int h = 0; h < k->nhyp; h++) {
        cJSON *x = cJSON_CreateObject();
        cJSON_AddStringToObject(x, "name", k->hyp[h].name);
        cJSON_AddStringToObject(x, "says", k->hyp[h].says);
        add_num(x, "rel_l2", k->hyp[h].rel_l2);
        add_num(x, "level", k->hyp[h].level);
        cJSON_AddBoolToObject(x, "consistent", k->hyp[h].consistent);
        cJSON_AddItemToArray(hs, x);
      }
    }
    cJSON_AddItemToArray(checks, o);
  }
  return qc_report_json_render(root, out);
}

/* The JSON values a report of n bytes may hold. */
static long qc_report_max_values(size_t n) {
  long v = (long)(n / QC_REPORT_BYTES_PER_VALUE);
  return v > QC_REPORT_MIN_VALUES ? v : QC_REPORT_MIN_VALUES;
}

/* The lexical state of a JSON text read in parts. */
typedef struct json_scan {
  long values;               /* one per opening bracket, comma or colon outside strings, plus one */
  int in_str, esc;
} json_scan;

/* Scan the n bytes at t (from offset at of the file): count the JSON
 * values (an upper bound on the nodes cJSON would make) and stop at a byte
 * no JSON text holds (a control character: qatcheck escapes them in
 * strings). Its offset, or -1 when every byte can be JSON. */
static long long json_scan_part(json_scan *s, const char *t, size_t n, size_t at) {
  for (size_t i = 0; i < n; i++) {
    unsigned char c = (unsigned char)t[i];
    if (c < 0x20 && c != '\t' && c != '\n' && c != '\r') return (long long)(at + i);
    if (s->in_str) {
      if (s->esc) s->esc = 0;
      else if (c == '\\') s->esc = 1;
      else if (c == '"') s->in_str = 0;
    } else if (c == '"') {
      s->in_str = 1;
    } else if (c == '[' || c == '{' || c == ',' || c == ':') {
      s->values++;
    }
  }
  return -1;
}

/* Read the report file whole, a part at a time, refusing it at the first
 * byte that cannot be JSON or the first value over the limit. */
static int read_report_file(const char *path, const char *what, char **text, size_t *len) {
  const size_t part = (size_t)4 << 20;
  int fd = -1, rc;
  int64_t size;
  char *b = NULL;
  *text = NULL;
  *len = 0;
  if ((rc = qc_open_regular(path, what, &fd, &size))) return rc;
  if ((uint64_t)size > QC_REPORT_MAX_BYTES) {
    rc = qc_err("%s '%s': %lld bytes: larger than the limit of %zu bytes", what, path, (long long)size, QC_REPORT_MAX_BYTES);
    qc_hint("no qatcheck report is larger: cJSON, which writes them, prints at most %zu bytes", QC_REPORT_MAX_BYTES);
    goto done;
  }
  if ((rc = qc_refuse_gzip_fd(what, path, fd))) goto done;
  const long maxv = qc_report_max_values((size_t)size);
  /* the buffer grows as the parts arrive (doubling, up to the size): a file
   * refused at an early byte never costs its whole size */
  size_t cap = ((size_t)size < part ? (size_t)size : part) + 1;
  if (!(b = qc_malloc(cap, what))) { rc = QC_ESYS; goto done; }
  json_scan sc = {1, 0, 0};
  size_t got = 0;
  while (got < (size_t)size) {
    size_t want = (size_t)size - got < part ? (size_t)size - got : part;
    if (got + want + 1 > cap) {
      size_t nc = 2 * cap > got + want + 1 ? 2 * cap : got + want + 1;
      if (nc > (size_t)size + 1) nc = (size_t)size + 1;
      char *nb = realloc(b, nc);
      if (!nb) { rc = qc_err_sys("%s '%s': out of memory for %zu bytes", what, path, nc); goto done; }
      b = nb;
      cap = nc;
    }
    ssize_t r = read(fd, b + got, want);
    if (r < 0 && errno == EINTR) continue;
    if (r < 0) { rc = qc_err("%s '%s': read failed: %s", what, path, strerror(errno)); goto done; }
    if (r == 0) break; /* shrank while reading: take what is there */
    long long bad = json_scan_part(&sc, b + got, (size_t)r, got);
    if (bad >= 0) {
      rc = qc_err("%s '%s': byte %lld is 0x%02x: not JSON text, not a qatcheck report", what, path, bad,
                  (unsigned char)b[bad]);
      goto done;
    }
    got += (size_t)r;
    if (sc.values > maxv) {
      rc = qc_err("%s '%s': more than %ld JSON values in %lld bytes: denser than any qatcheck report (at most one value "
                  "per %d bytes, or %ld), refused", what, path, maxv, (long long)size, QC_REPORT_BYTES_PER_VALUE,
                  QC_REPORT_MIN_VALUES);
      goto done;
    }
  }
  b[got] = 0;
  *text = b;
  *len = got;
  b = NULL;
done:
  free(b);
  if (fd >= 0) close(fd);
  return rc;
}

int qc_report_read_json(const char *path, const char *what, char **text, size_t *n, cJSON **tree, qc_report_counts *counts) {
  qc_report_counts c0;
  if (tree) *tree = NULL;
  int rc = read_report_file(path, what, text, n);
  if (rc) return rc;
  cJSON *r = cJSON_ParseWithLength(*text, *n);
  const cJSON *v = cJSON_IsObject(r) ? cJSON_GetObjectItemCaseSensitive(r, "verb") : NULL;
  if (cJSON_IsString(v) &&
      (cJSON_GetObjectItemCaseSensitive(r, "qatcheck_report") || cJSON_GetObjectItemCaseSensitive(r, "format_version")))
    rc = qc_report_rejudge(r, what, path, counts ? counts : &c0);
  else {
    cJSON_Delete(r);
    r = NULL; /* not a report: the caller says what it is not */
  }
  if (rc) {
    cJSON_Delete(r);
    free(*text);
    *text = NULL;
    *n = 0;
    return rc;
  }
  if (tree) *tree = r;
  else cJSON_Delete(r);
  return QC_OK;
}

int qc_report_read_text(const char *path, const char *what, char **text, size_t *n) {
  return qc_report_read_json(path, what, text, n, NULL, NULL);
}
