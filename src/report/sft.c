/* sft.c: the reports of `qatcheck sft` (see l3report.h): the JSON of
 * docs/layer3.md ("verb": "sft", "format_version": 1: the config-diff
 * table, per pair its verdict, first deviation, localization and one entry
 * per check), JUnit (a testcase per pair and metric, and one for a pair's
 * own reasons when it has any), the console table. */
#include <cJSON.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/qc.h"
#include "report/l3report.h"
#include "report/tlist.h"

static void add_num(cJSON *o, const char *k, double v) {
  if (isfinite(v)) cJSON_AddNumberToObject(o, k, v);
  else cJSON_AddNullToObject(o, k);
}

static cJSON *window_json(double w0, double w1) {
  cJSON *a = cJSON_CreateArray();
  cJSON_AddItemToArray(a, cJSON_CreateNumber(w0));
  cJSON_AddItemToArray(a, cJSON_CreateNumber(w1));
  return a;
}

/* A config value (canonical JSON text) back as JSON; NaN/Infinity, which
 * JSON cannot hold, as strings. */
static cJSON *value_json(const char *text) {
  if (!text) return cJSON_CreateNull();
  cJSON *v = cJSON_Parse(text);
  return v ? v : cJSON_CreateString(text);
}

static void check_window(const qc_sft_case *cs, const qc_sft_check *k, double *w0, double *w1) {
  *w0 = k->has_window ? k->w0 : cs->w0;
  *w1 = k->has_window ? k->w1 : cs->w1;
}

static cJSON *bounds_json(const qc_sft_bounds *b) {
  cJSON *o = cJSON_CreateObject();
  if (b->has_pw_abs) cJSON_AddNumberToObject(o, "pointwise_abs", b->pw_abs);
  if (b->has_pw_rel) cJSON_AddNumberToObject(o, "pointwise_rel", b->pw_rel);
  if (b->has_mean_abs) cJSON_AddNumberToObject(o, "mean_abs", b->mean_abs);
  if (b->has_mean_rel) cJSON_AddNumberToObject(o, "mean_rel", b->mean_rel);
  if (b->has_equiv) {
    cJSON *e = cJSON_AddObjectToObject(o, "equivalence");
    cJSON_AddNumberToObject(e, "delta", b->eq_delta);
    cJSON_AddNumberToObject(e, "alpha", b->eq_alpha);
    cJSON_AddNumberToObject(e, "seed", (double)b->eq_seed);
    cJSON_AddNumberToObject(e, "resamples", b->eq_resamples);
  }
  if (b->has_noise) {
    cJSON_AddNumberToObject(o, "noise_multiple", b->noise_multiple);
    cJSON *a = cJSON_AddArrayToObject(o, "noise_arms");
    for (int i = 0; i < b->nnoise; i++) cJSON_AddItemToArray(a, cJSON_CreateString(b->noise[i].log));
  }
  cJSON_AddStringToObject(o, "reasoning", b->reasoning);
  return o;
}

/* At most QC_SFT_SERIES_MAX points of the check's aligned series (evenly
 * strided, the first failure always among them): x, a, b and the pointwise
 * band lo, hi around b (null where none), for the audit document's curves. */
#define QC_SFT_SERIES_MAX 1000
static cJSON *series_json(const qc_sft_check_res *c) {
  const double *src[5] = {c->x, c->a, c->b, c->lo, c->hi};
  static const char *const keys[5] = {"x", "a", "b", "lo", "hi"};
  int64_t n = c->npoints, m = n < QC_SFT_SERIES_MAX ? n : QC_SFT_SERIES_MAX;
  cJSON *o = cJSON_CreateObject();
  if (!o) return NULL;
  cJSON_AddNumberToObject(o, "points", (double)n);
  cJSON_AddNumberToObject(o, "kept", (double)m);
  for (int k = 0; k < 5; k++) {
    cJSON *a = cJSON_AddArrayToObject(o, keys[k]);
    for (int64_t j = 0; a && j < m; j++) {
      int64_t i = m > 1 ? j * (n - 1) / (m - 1) : 0;
      /* the first failure replaces the kept point nearest it */
      if (c->has_fail && m < n) {
        int64_t nxt = m > 1 ? (j + 1) * (n - 1) / (m - 1) : n;
        for (int64_t t = i; t < nxt && t < n; t++)
          if (c->x[t] == c->fail_x) { i = t; break; }
      }
      double v = src[k][i];
      cJSON_AddItemToArray(a, isfinite(v) ? cJSON_CreateNumber(v) : cJSON_CreateNull());
    }
  }
  return o;
}

static cJSON *check_json(const qc_sft_case *cs, const qc_sft_check *k, const qc_sft_check_res *c) {
  cJSON *o = cJSON_CreateObject();
  double w0, w1;
  check_window(cs, k, &w0, &w1);
  cJSON_AddStringToObject(o, "metric", k->metric);
  cJSON_AddItemToObject(o, "window", window_json(w0, w1));
  cJSON_AddStringToObject(o, "verdict", qc_l3_verdict_name(c->verdict));
  cJSON_AddNumberToObject(o, "points", (double)c->npoints);
  add_num(o, "mean_diff", c->mean_diff);
  add_num(o, "max_abs", c->max_abs);
  add_num(o, "max_rel", c->max_rel);
  cJSON_AddNumberToObject(o, "nonfinite", c->nonfinite);
  if (c->has_fail) {
    cJSON_AddNumberToObject(o, "first_fail_x", c->fail_x);
    cJSON_AddNumberToObject(o, "first_fail_step", (double)c->fail_step);
    cJSON_AddStringToObject(o, "bound", c->bound);
    if (c->has_onset) {
      cJSON *on = cJSON_AddObjectToObject(o, "onset");
      cJSON_AddNumberToObject(on, "x", c->onset_x);
      cJSON_AddNumberToObject(on, "step", (double)c->onset_step);
      cJSON_AddStringToObject(on, "kind", c->onset_kind);
    }
  } else {
    cJSON_AddNullToObject(o, "first_fail_x");
  }
  if (c->has_equiv) {
    cJSON *e = cJSON_AddObjectToObject(o, "equivalence");
    add_num(e, "mean", c->eq_mean);
    add_num(e, "lo", c->eq_lo);
    add_num(e, "hi", c->eq_hi);
    cJSON_AddNumberToObject(e, "block", c->eq_block);
  }
  cJSON_AddItemToObject(o, "bounds", bounds_json(&k->b));
  cJSON_AddStringToObject(o, "why", c->why);
  if (c->x && c->a && c->b && c->lo && c->hi && c->npoints > 0) cJSON_AddItemToObject(o, "series", series_json(c));
  return o;
}

static cJSON *pair_json(const qc_sft_view *v, int p) {
  const qc_sft_case *cs = v->cs;
  const qc_sft_pair *pc = &cs->pairs[p];
  const qc_sft_pair_res *pr = &v->pairs[p];
  cJSON *o = cJSON_CreateObject();
  cJSON_AddStringToObject(o, "a", cs->arms[pc->a].key);
  cJSON_AddStringToObject(o, "b", cs->arms[pc->b].key);
  cJSON_AddStringToObject(o, "verdict", qc_l3_pair_verdict_name(pr->verdict));
  if (pr->has_first) {
    cJSON *f = cJSON_AddObjectToObject(o, "first_deviation");
    cJSON_AddNumberToObject(f, "x", pr->first_x);
    cJSON_AddNumberToObject(f, "step", (double)pr->first_step);
    cJSON_AddStringToObject(f, "metric", pc->checks[pr->first_check].metric);
    cJSON_AddStringToObject(f, "bound", pr->checks[pr->first_check].bound);
    cJSON_AddBoolToObject(f, "relogged", qc_l3_log_is_dup(&v->logs[pc->a], pr->first_step) ||
                                         qc_l3_log_is_dup(&v->logs[pc->b], pr->first_step));
    if (pr->has_onset) {
      const qc_sft_check_res *oc = &pr->checks[pr->onset_check];
      cJSON *on = cJSON_AddObjectToObject(f, "onset");
      cJSON_AddNumberToObject(on, "x", pr->onset_x);
      cJSON_AddNumberToObject(on, "step", (double)pr->onset_step);
      cJSON_AddStringToObject(on, "metric", pc->checks[pr->onset_check].metric);
      cJSON_AddStringToObject(on, "kind", oc->onset_kind);
    }
  } else {
    cJSON_AddNullToObject(o, "first_deviation");
  }
  cJSON *und = cJSON_AddArrayToObject(o, "undeclared_differences");
  for (const char *q = pr->undeclared; *q;) {
    size_t len = strcspn(q, ",");
    char key[QC_L3_NAME];
    snprintf(key, sizeof key, "%.*s", (int)(len < sizeof key ? len : sizeof key - 1), q);
    cJSON_AddItemToArray(und, cJSON_CreateString(key));
    q += len;
    while (*q == ',' || *q == ' ') q++;
  }
  const char *loc = qc_l3_loc_name(pr->loc);
  if (loc) {
    cJSON_AddStringToObject(o, "localization", loc);
    if (pr->verdict == QC_L3_FAIL && pr->undeclared[0]) {
      char adv[1200];
      snprintf(adv, sizeof adv, "first explain the undeclared differences (%s): either can make the arms deviate by itself; then: %s",
               pr->undeclared, qc_l3_loc_advice(pr->loc));
      cJSON_AddStringToObject(o, "advice", adv);
    } else {
      cJSON_AddStringToObject(o, "advice", qc_l3_loc_advice(pr->loc));
    }
  } else {
    cJSON_AddNullToObject(o, "localization");
  }
  if (pr->has_x0) cJSON_AddNumberToObject(o, "x0_step", (double)pr->x0);
  cJSON *rs = cJSON_AddArrayToObject(o, "reasons");
  if (pr->reasons[0]) cJSON_AddItemToArray(rs, cJSON_CreateString(pr->reasons));
  cJSON *m = cJSON_AddArrayToObject(o, "metrics");
  for (int i = 0; i < pr->ncheck; i++) cJSON_AddItemToArray(m, check_json(cs, &pc->checks[i], &pr->checks[i]));
  return o;
}

static int render_json(qc_sbuf *out, qc_prov *prov, const qc_sft_view *v) {
  const qc_sft_case *cs = v->cs;
  cJSON *root = qc_report_envelope(prov, "sft", v->verdict);
  if (!root) return qc_err_sys("sft: out of memory building the report");
  cJSON_AddNumberToObject(root, "format_version", 1);
  cJSON_AddStringToObject(root, "case", cs->name);
  cJSON *cf = cJSON_AddObjectToObject(root, "case_file");
  cJSON_AddStringToObject(cf, "path", cs->path);
  cJSON_AddStringToObject(cf, "sha256", cs->sha256);
  int dev = 0, inc = 0;
  for (int p = 0; p < cs->npair; p++) {
    dev += v->pairs[p].verdict == QC_L3_FAIL;
    inc += v->pairs[p].verdict == QC_L3_INCONCLUSIVE;
  }
  cJSON_AddStringToObject(root, "conclusion", dev ? "deviates" : inc ? "inconclusive" : "pass");
  cJSON *ma = cJSON_AddArrayToObject(root, "missing_arms"); /* of the method's three: each makes every pair inconclusive */
  for (const char *q = v->missing_arms ? v->missing_arms : ""; *q;) {
    size_t k = strcspn(q, ",");
    char arm[QC_L3_NAME];
    snprintf(arm, sizeof arm, "%.*s", (int)k, q);
    cJSON_AddItemToArray(ma, cJSON_CreateString(arm));
    q += k;
    q += strspn(q, ", ");
  }
  cJSON_AddStringToObject(root, "x", cs->x_tokens ? "tokens" : "step");
  cJSON_AddItemToObject(root, "window", window_json(cs->w0, cs->w1));
  cJSON *arms = cJSON_AddArrayToObject(root, "arms");
  for (int a = 0; a < cs->narm; a++) {
    const qc_l3_log *l = &v->logs[a];
    cJSON *o = cJSON_CreateObject();
    cJSON_AddStringToObject(o, "arm", cs->arms[a].key);
    cJSON_AddStringToObject(o, "log", cs->arms[a].log);
    cJSON_AddStringToObject(o, "format", l->format);
    cJSON_AddNumberToObject(o, "steps", (double)l->n);
    if (l->n) {
      cJSON_AddNumberToObject(o, "first_step", (double)l->step[0]);
      cJSON_AddNumberToObject(o, "last_step", (double)l->step[l->n - 1]);
    }
    if (l->step_key[0]) cJSON_AddStringToObject(o, "step_key", l->step_key);
    else cJSON_AddNullToObject(o, "step_key");
    cJSON_AddNumberToObject(o, "placeholders", (double)l->placeholders);
    cJSON *ms = cJSON_AddArrayToObject(o, "metrics");
    for (int c = 0; c < l->ncol; c++) cJSON_AddItemToArray(ms, cJSON_CreateString(l->col[c].name));
    cJSON *d = cJSON_AddObjectToObject(o, "duplicates");
    cJSON_AddNumberToObject(d, "values", (double)l->dup_values);
    cJSON_AddNumberToObject(d, "records", (double)l->dup_records);
    if (l->dup_records) cJSON_AddNumberToObject(d, "first_step", (double)l->first_dup_step);
    if (cs->arms[a].config[0]) cJSON_AddStringToObject(o, "config", cs->arms[a].config);
    else cJSON_AddNullToObject(o, "config");
    cJSON_AddItemToArray(arms, o);
  }
  cJSON *cd = cJSON_AddArrayToObject(root, "config_diff");
  for (int k = 0; k < v->nrow; k++) {
    const qc_sft_cfgrow *row = &v->rows[k];
    cJSON *o = cJSON_CreateObject();
    cJSON_AddStringToObject(o, "key", row->key);
    cJSON *vals = cJSON_AddObjectToObject(o, "values");
    for (int a = 0; a < cs->narm; a++) cJSON_AddItemToObject(vals, cs->arms[a].key, value_json(row->val[a]));
    cJSON_AddBoolToObject(o, "differs", row->differs);
    cJSON_AddBoolToObject(o, "expected", row->expected);
    if (row->reason) cJSON_AddStringToObject(o, "reason", row->reason);
    cJSON_AddBoolToObject(o, "controlled", row->controlled);
    cJSON_AddItemToArray(cd, o);
  }
  cJSON *pairs = cJSON_AddArrayToObject(root, "pairs");
  for (int p = 0; p < cs->npair; p++) cJSON_AddItemToArray(pairs, pair_json(v, p));
  return qc_report_json_render(root, out);
}

/* JUnit: a testcase per (pair, check); a check's name is its metric, with
 * its window when the pair checks the metric more than once. */
static int make_list(qc_tlist *l, const qc_sft_view *v) {
  const qc_sft_case *cs = v->cs;
  int rc;
  for (int p = 0; p < cs->npair; p++) {
    const qc_sft_pair *pc = &cs->pairs[p];
    const qc_sft_pair_res *pr = &v->pairs[p];
    char suite[2 * QC_L3_NAME + 2], name[QC_L3_NAME + 64], msg[1200];
    snprintf(suite, sizeof suite, "%s~%s", cs->arms[pc->a].key, cs->arms[pc->b].key);
    if (pr->reasons[0] && (rc = qc_tlist_add(l, suite, "sft", "controlled variables and x axis", pr->reasons, NULL))) return rc;
    for (int i = 0; i < pc->ncheck; i++) {
      const qc_sft_check_res *c = &pr->checks[i];
      int twice = 0;
      for (int j = 0; j < pc->ncheck; j++) twice |= j != i && strcmp(pc->checks[j].metric, pc->checks[i].metric) == 0;
      double w0, w1;
      check_window(cs, &pc->checks[i], &w0, &w1);
      if (twice) snprintf(name, sizeof name, "%s [%g, %g]", pc->checks[i].metric, w0, w1);
      else snprintf(name, sizeof name, "%s", pc->checks[i].metric);
      snprintf(msg, sizeof msg, "%s: %s", qc_l3_verdict_name(c->verdict), c->why);
      char outl[256];
      snprintf(outl, sizeof outl, "%lld points, mean diff %.4g, max rel %.4g", (long long)c->npoints, c->mean_diff, c->max_rel);
      if ((rc = qc_tlist_add(l, suite, "sft", name, c->verdict == QC_L3_PASS ? NULL : msg, outl))) return rc;
    }
  }
  return QC_OK;
}

int qc_report_sft(qc_report_out *o, const qc_sft_view *v) {
  qc_tlist tl = {0};
  int rc = QC_OK;
  if (qc_report_wants(o, QC_REP_JSON) && (rc = render_json(&o->doc[QC_REP_JSON], o->prov, v))) goto done;
  if (qc_report_wants(o, QC_REP_JUNIT) && ((rc = make_list(&tl, v)) || (rc = qc_tlist_junit(&tl, "sft", &o->doc[QC_REP_JUNIT]))))
    goto done;
  if (qc_report_wants(o, QC_REP_MARKDOWN)) rc = qc_report_sft_markdown(o, v);
done:
  qc_tlist_free(&tl);
  return rc;
}

/* The metrics some pair judges, each once, in case order. */
static int judged_metrics(const qc_sft_case *cs, const char **out, int max) {
  int n = 0;
  for (int p = 0; p < cs->npair; p++)
    for (int i = 0; i < cs->pairs[p].ncheck; i++) {
      const char *m = cs->pairs[p].checks[i].metric;
      int seen = 0;
      for (int j = 0; j < n; j++) seen |= strcmp(out[j], m) == 0;
      if (!seen && n < max) out[n++] = m;
    }
  return n;
}

/* The bounds of a check in a few words ("pointwise_rel 0.002"). */
static void bounds_short(const qc_sft_bounds *b, char *out, size_t n) {
  size_t k = 0;
  out[0] = 0;
#define B(cond, fmt, val) if ((cond) && k < n) k += (size_t)snprintf(out + k, n - k, "%s" fmt, k ? " " : "", val)
  B(b->has_pw_abs, "pw_abs %g", b->pw_abs);
  B(b->has_pw_rel, "pw_rel %g", b->pw_rel);
  B(b->has_mean_abs, "mean_abs %g", b->mean_abs);
  B(b->has_mean_rel, "mean_rel %g", b->mean_rel);
  B(b->has_equiv, "equiv +-%g", b->eq_delta);
  B(b->has_noise, "noise x%g", b->noise_multiple);
#undef B
}

/* s cut to at most max characters at a word boundary (a space, comma or
 * slash), "..." added when cut: a value is never cut mid-word. */
static void clip_words(const char *s, size_t max, char *out, size_t outn) {
  size_t n = strlen(s);
  if (n <= max || max < 8) { snprintf(out, outn, "%s", s); return; }
  size_t cut = max - 3;
  while (cut > max / 2 && s[cut] != ' ' && s[cut] != ',' && s[cut] != '/' && s[cut - 1] != ',') cut--;
  if (cut <= max / 2) cut = max - 3; /* one long word: cut it, marked */
  while (cut > 0 && s[cut - 1] == ' ') cut--;
  snprintf(out, outn, "%.*s...", (int)cut, s);
}

/* An x for people: "step 490", or on a tokens axis "tokens 1,254,400 (step
 * 490)" (digits grouped when a whole number). */
static void fmt_x(const qc_sft_case *cs, double x, int64_t step, char *out, size_t n) {
  if (!cs->x_tokens) { snprintf(out, n, "step %lld", (long long)step); return; }
  char num[64];
  if (x == floor(x) && fabs(x) < 1e18) {
    char raw[32];
    snprintf(raw, sizeof raw, "%lld", (long long)llabs((long long)x));
    size_t len = strlen(raw), k = 0;
    if (x < 0) num[k++] = '-';
    for (size_t i = 0; i < len; i++) {
      if (i && (len - i) % 3 == 0) num[k++] = ',';
      num[k++] = raw[i];
    }
    num[k] = 0;
  } else {
    snprintf(num, sizeof num, "%.6g", x);
  }
  snprintf(out, n, "tokens %s (step %lld)", num, (long long)step);
}

/* Which of the pair's logs re-logged `step` (a duplicate with another
 * value), as " (step S re-logged in 'log'...: the last value is judged)",
 * or "". */
static void dup_note(const qc_sft_view *v, const qc_sft_pair *pc, int64_t step, char *out, size_t n) {
  out[0] = 0;
  const qc_l3_log *l[2] = {&v->logs[pc->a], &v->logs[pc->b]};
  for (int s = 0; s < 2; s++)
    if (qc_l3_log_is_dup(l[s], step) && !(s == 1 && strcmp(l[0]->path, l[1]->path) == 0 && out[0])) {
      size_t k = strlen(out);
      snprintf(out + k, n - k, " [step %lld was re-logged in '%s' with another value: the last one is judged]", (long long)step,
               l[s]->path);
    }
}

void qc_report_sft_table(const qc_sft_view *v) {
  const qc_sft_case *cs = v->cs;
  const char *xn = cs->x_tokens ? "tokens" : "step";
  printf("sft: case %s, window [%.15g, %.15g] on %s\n", cs->name, cs->w0, cs->w1, xn);
  const char *ms[64];
  int nm = judged_metrics(cs, ms, 64);
  printf("%-22s", "mean (last) in window");
  for (int a = 0; a < cs->narm; a++) printf(" %24s", cs->arms[a].key);
  printf("\n");
  for (int i = 0; i < nm; i++) {
    printf("%-22s", ms[i]);
    for (int a = 0; a < cs->narm; a++) {
      double mean, last;
      qc_report_sft_summary(v, a, ms[i], &mean, &last);
      char cell[48];
      snprintf(cell, sizeof cell, "%.6g (%.6g)", mean, last);
      printf(" %24s", cell);
    }
    printf("\n");
  }
  for (int a = 0; a < cs->narm; a++) {
    const qc_l3_log *l = &v->logs[a];
    if (l->dup_values)
      printf("log %s: %lld step(s) re-logged with another value (first at step %lld, %lld value(s)): the last value of a step is "
             "judged\n", cs->arms[a].key, (long long)l->ndup_steps, (long long)l->first_dup_step, (long long)l->dup_values);
  }
  int ndiff = 0;
  for (int k = 0; k < v->nrow; k++) ndiff += v->rows[k].differs;
  printf("config diff: %d key(s), %d differ\n", v->nrow, ndiff);
  for (int k = 0; k < v->nrow; k++) {
    const qc_sft_cfgrow *row = &v->rows[k];
    if (!row->differs) continue;
    printf("  %-20s", row->key);
    for (int a = 0; a < cs->narm; a++) {
      char cell[64];
      clip_words(row->val[a] ? row->val[a] : "-", 40, cell, sizeof cell);
      printf(" %s", cell);
    }
    printf("  %s\n", row->expected ? "(expected)" : "(NOT EXPECTED)");
  }
  int dev = 0, inc = 0;
  for (int p = 0; p < cs->npair; p++) {
    const qc_sft_pair *pc = &cs->pairs[p];
    const qc_sft_pair_res *pr = &v->pairs[p];
    dev += pr->verdict == QC_L3_FAIL;
    inc += pr->verdict == QC_L3_INCONCLUSIVE;
    printf("pair %s~%s: %s", cs->arms[pc->a].key, cs->arms[pc->b].key, pr->verdict == QC_L3_FAIL ? "DEVIATES" : qc_l3_pair_verdict_name(pr->verdict));
    char fx[96], dn[2 * QC_L3_PATH + 200];
    if (pr->has_first) {
      fmt_x(cs, pr->first_x, pr->first_step, fx, sizeof fx);
      printf(" at %s (%s, %s); localization: %s", fx, pc->checks[pr->first_check].metric, pr->checks[pr->first_check].bound,
             qc_l3_loc_name(pr->loc));
    }
    if (pr->has_first && pr->has_onset && pr->onset_x < pr->first_x) {
      fmt_x(cs, pr->onset_x, pr->onset_step, fx, sizeof fx);
      printf("; onset ~%s (%s, %s: where a - b began to change)", fx, pc->checks[pr->onset_check].metric,
             pr->checks[pr->onset_check].onset_kind);
    }
    printf("\n");
    if (pr->has_first) {
      dup_note(v, pc, pr->first_step, dn, sizeof dn);
      if (dn[0]) printf(" %s\n", dn);
    }
    if (pr->reasons[0]) printf("  %s\n", pr->reasons);
    for (int i = 0; i < pc->ncheck; i++) {
      const qc_sft_check_res *c = &pr->checks[i];
      char bs[64];
      bounds_short(&pc->checks[i].b, bs, sizeof bs);
      printf("  %-14s %-24s %-12s %5lld points  mean diff %-10.3g max rel %-10.3g %s\n", pc->checks[i].metric, bs,
             qc_l3_verdict_name(c->verdict), (long long)c->npoints, c->mean_diff, c->max_rel, c->why);
    }
    if (pr->verdict == QC_L3_FAIL && pr->undeclared[0])
      printf("  -> first explain the undeclared differences (%s): either can make the arms deviate by itself\n", pr->undeclared);
    if (pr->loc != QC_LOC_NONE) printf("  -> %s%s\n", pr->verdict == QC_L3_FAIL && pr->undeclared[0] ? "then: " : "", qc_l3_loc_advice(pr->loc));
  }
  printf("sft: %s: %d pair(s), %d deviate, %d inconclusive\n", v->verdict ? "FAIL" : "pass", cs->npair, dev, inc);
}
