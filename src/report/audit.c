/* audit.c: the audit document assembled (audit.h): the one-screen summary
 * (verdict per layer, counts, coverage, the worst checks), the sections of
 * each layer, the regressions against the baselines, the inputs; and the
 * `report` verb's JSON summary and JUnit. */
#include <cjson/cJSON.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/qc.h"
#include "report/audit.h"
#include "report/tlist.h"

/* Counts of one verb's reports. */
typedef struct verb_sum {
  int reports, errors, checks, failed, pass;  /* pass: reports that say pass */
} verb_sum;

static verb_sum sum_of(const qc_evidence *e, const char *verb) {
  verb_sum v = {0};
  for (int i = 0; i < e->nsrc; i++) {
    const qc_ev_src *s = &e->src[i];
    if (verb ? strcmp(s->verb, verb) != 0 : (!strcmp(s->verb, "vjp") || !strcmp(s->verb, "contract") ||
                                             !strcmp(s->verb, "sft") || !strcmp(s->verb, "step")))
      continue;
    v.reports++;
    v.errors += strcmp(s->verdict, "error") == 0;
    v.pass += strcmp(s->verdict, "pass") == 0;
    v.checks += s->checks;
    v.failed += s->failed;
  }
  return v;
}

static const char *verdict_of(const verb_sum *v);
static const char *overall(const qc_audit_ctx *a, int *verdict);

/* A layer's word: its reports' verdict; "missing" when the method requires
 * it and no report holds it, "incomplete" when its reports pass but leave a
 * requirement missing; "not required" for a layer 2 nothing quantized asks
 * for; "not run" otherwise. */
static const char *layer_word(const qc_audit_ctx *a, const char *verb, const verb_sum *v) {
  int needed = qc_audit_need_has(&a->need, verb);
  if (!v->reports) return needed ? "missing" : verb && !strcmp(verb, "contract") && !a->need.l2_required ? "not required" : "not run";
  const char *w = verdict_of(v);
  return needed && !strcmp(w, "pass") ? "incomplete" : w;
}

void qc_audit_console(const qc_audit_ctx *a, qc_sbuf *b) {
  static const struct { const char *verb, *name; } L[] = {
      {"vjp", "layer 1 (vjp)"}, {"contract", "layer 2 (contract)"}, {"sft", "layer 3 (sft)"}, {"step", "one-step (step)"}, {NULL, "other"}};
  const qc_evidence *e = a->e;
  int verdict;
  qc_l1_summary s1;
  qc_audit_l1_summary(e, &s1);
  qc_sbuf_printf(b, "report: %s: %d report(s)", overall(a, &verdict), e->nsrc);
  for (size_t i = 0; i < sizeof L / sizeof *L; i++) {
    verb_sum v = sum_of(e, L[i].verb);
    if (!v.reports && !L[i].verb) continue; /* "other" only when there is some */
    if (!v.reports) qc_sbuf_printf(b, "; %s: %s", L[i].name, layer_word(a, L[i].verb, &v));
    else qc_sbuf_printf(b, "; %s: %d check(s), %d failed (%s)", L[i].name, v.checks, v.failed, layer_word(a, L[i].verb, &v));
  }
  if (a->need.n)
    qc_sbuf_printf(b, "; incomplete: %d requirement(s) of the method missing%s", a->need.n,
                   a->allow_incomplete ? " (accepted by --allow-incomplete)" : "");
  qc_sbuf_printf(b, "; coverage %d of %d applicable item(s)", s1.cov_covered, s1.cov_applicable);
  int ns = qc_audit_nsuspicious(e);
  if (ns) qc_sbuf_printf(b, "; %d suspicious pass(es) (>= %gx the noise floor or rel_l2 >= %g)", ns, QC_AUDIT_SUSPICIOUS,
                         QC_AUDIT_SUSPICIOUS_REL);
}

static const char *verdict_of(const verb_sum *v) {
  if (!v->reports) return "not run";
  if (v->errors) return "error";
  return v->pass == v->reports && !v->failed && v->checks > 0 ? "pass" : "FAIL"; /* no check is no pass */
}

static int nreg_total(const qc_audit_ctx *a) {
  int n = 0;
  for (int i = 0; a->reg && i < a->e->nsrc; i++) n += a->reg[i].n;
  return n;
}

/* The overall word: FAIL (an input failed, deviates or is inconclusive),
 * INCOMPLETE (an input could not be judged, or a layer the method requires
 * is missing), pass. *verdict 1 unless pass, or INCOMPLETE only for missing
 * layers under --allow-incomplete. */
static const char *overall(const qc_audit_ctx *a, int *verdict) {
  const qc_evidence *e = a->e;
  int fail = 0, err = 0;
  for (int i = 0; i < e->nsrc; i++) {
    err |= strcmp(e->src[i].verdict, "error") == 0;
    fail |= strcmp(e->src[i].verdict, "pass") != 0 && strcmp(e->src[i].verdict, "error") != 0;
  }
  *verdict = fail || err || (a->need.n && !a->allow_incomplete);
  return fail ? "FAIL" : err || a->need.n ? "INCOMPLETE" : "pass";
}

/* ---- the summary --------------------------------------------------------------------------- */

/* One entry of "the worst checks". */
typedef struct worst {
  double key;                /* larger is worse */
  char layer[8], what[600], metric[160], verdict[24];
} worst;

static int worst_cmp(const void *a, const void *b) {
  double x = ((const worst *)a)->key, y = ((const worst *)b)->key;
  return x < y ? 1 : x > y ? -1 : 0;
}

/* Every candidate, kept in a growable list. */
typedef struct worst_list {
  int n, cap;
  worst *v;
} worst_list;

static void keep(worst_list *l, const worst *c) {
  if (l->n == l->cap) {
    int cap = l->cap ? 2 * l->cap : 64;
    worst *nv = realloc(l->v, (size_t)cap * sizeof *nv);
    if (!nv) return; /* the summary shows fewer: no failure of its own */
    l->v = nv;
    l->cap = cap;
  }
  l->v[l->n++] = *c;
}

#define NWORST 6

/* The worst checks: the worst of each layer first, then the next worst. */
static int pick_worst(worst_list *l, worst *w) {
  int n = 0;
  char *taken = calloc((size_t)l->n + 1, 1);
  if (!taken) return 0;
  if (l->n > 0) qsort(l->v, (size_t)l->n, sizeof *l->v, worst_cmp); /* l->v is NULL when there are none */
  for (int i = 0; i < l->n && n < NWORST; i++) {
    int first = 1;
    for (int j = 0; j < i && first; j++) first = strcmp(l->v[j].layer, l->v[i].layer) != 0;
    if (first && l->v[i].key >= 0.5) {
      w[n++] = l->v[i];
      taken[i] = 1;
    }
  }
  for (int i = 0; i < l->n && n < NWORST; i++)
    if (!taken[i]) w[n++] = l->v[i];
  free(taken);
  if (n > 0) qsort(w, (size_t)n, sizeof *w, worst_cmp);
  return n;
}

static void worst_checks(qc_doc *d, const qc_evidence *e) {
  worst w[NWORST], c;
  worst_list all = {0};
  int n = 0;
  for (int i = 0; i < e->nl1; i++) {
    const qc_check *k = &e->l1[i].c;
    double use = qc_audit_bound_use(k);
    char name[2 * QC_NAMELEN + 2];
    memset(&c, 0, sizeof c);
    c.key = (k->verdict != QC_V_PASS ? 1e6 : 0) + (isfinite(use) ? use : k->verdict != QC_V_PASS ? 1e5 : -1);
    snprintf(c.layer, sizeof c.layer, "1");
    snprintf(c.what, sizeof c.what, "%s %s", k->module, qc_report_check_name(k, name, sizeof name));
    if (k->has_metrics) snprintf(c.metric, sizeof c.metric, "noise x %.3g, rel_l2 %.3g", k->m.noise_multiple, k->m.rel_l2);
    if (isfinite(use) && use < 10) qc_cat(c.metric, sizeof c.metric, "; %.0f%% of its tightest bound", 100 * use);
    else if (isfinite(use)) qc_cat(c.metric, sizeof c.metric, "; %.3g times its tightest bound", use);
    snprintf(c.verdict, sizeof c.verdict, "%s", k->verdict == QC_V_PASS ? "pass" : "FAIL");
    if (k->verdict != QC_V_PASS) qc_cat(c.metric, sizeof c.metric, "%s%s", c.metric[0] ? ": " : "", k->why);
    keep(&all, &c);
  }
  for (int j = 0; j < e->nl2; j++)
    for (int i = 0; i < e->l2[j].s.n; i++) {
      const qc_crow *r = &e->l2[j].s.rows[i];
      if (!r->fail && !r->outlier) continue;
      memset(&c, 0, sizeof c);
      c.key = (r->fail ? 1e6 : 0.5) + (isfinite(r->m.rel_l2) ? fmin(r->m.rel_l2, 0.49) : 0);
      snprintf(c.layer, sizeof c.layer, "2");
      snprintf(c.what, sizeof c.what, "%s %s %s/%s %s", r->module, r->tensor, r->wfmt, r->afmt, r->dy);
      snprintf(c.metric, sizeof c.metric, "cosine %.6f, norm ratio %.6f: %s", r->m.cosine, r->m.norm_ratio,
               r->fail ? r->why : r->outlier_why);
      snprintf(c.verdict, sizeof c.verdict, "%s", r->fail ? "FAIL" : "outlier");
      keep(&all, &c);
    }
  for (int j = 0; j < e->nsft; j++)
    for (int p = 0; p < e->sft[j].npair; p++) {
      const qc_ev_pair *q = &e->sft[j].pair[p];
      if (!strcmp(q->verdict, "pass")) continue;
      memset(&c, 0, sizeof c);
      c.key = 2e6;
      snprintf(c.layer, sizeof c.layer, "3");
      snprintf(c.what, sizeof c.what, "%s vs %s", q->a, q->b);
      if (q->has_first) snprintf(c.metric, sizeof c.metric, "first deviation at %g (%s, %s)%s%s", q->first_x, q->first_metric,
                                 q->first_bound, q->localization[0] ? ", " : "", q->localization);
      snprintf(c.verdict, sizeof c.verdict, "%s", q->verdict);
      keep(&all, &c);
    }
  for (int i = 0; i < e->nstep; i++) {
    const qc_ev_step *s = &e->step[i];
    if (strcmp(s->verdict, "fail")) continue;
    memset(&c, 0, sizeof c);
    c.key = 1e6;
    snprintf(c.layer, sizeof c.layer, "step");
    snprintf(c.what, sizeof c.what, "%s %s %s", s->arm, s->param, s->kind);
    snprintf(c.metric, sizeof c.metric, "%s", s->why);
    snprintf(c.verdict, sizeof c.verdict, "FAIL");
    keep(&all, &c);
  }
  n = pick_worst(&all, w);
  free(all.v);
  qc_doc_h(d, 3, NULL, "The worst checks");
  if (!n) {
    qc_doc_p(d);
    qc_doc_text(d, "No check to rank.");
    return;
  }
  qc_doc_table(d, "l:layer|l:check|l:verdict|l:measured");
  for (int i = 0; i < n; i++) {
    qc_doc_tr(d);
    qc_doc_td(d, "%s", w[i].layer);
    qc_doc_td_code(d, w[i].what);
    qc_doc_td_verdict(d, w[i].verdict);
    qc_doc_td(d, "%s", w[i].metric);
  }
  qc_doc_table_end(d);
}

static void summary_row(qc_doc *d, const qc_audit_ctx *a, const char *verb, const char *layer, const char *question,
                        const verb_sum *v, const char *extra) {
  qc_doc_tr(d);
  qc_doc_td(d, "%s", layer);
  qc_doc_td(d, "%s", question);
  qc_doc_td(d, "%d", v->reports);
  if (v->reports) qc_doc_td(d, "%d", v->checks);
  else qc_doc_td(d, "-");
  if (v->reports) qc_doc_td(d, "%d%s", v->failed, extra ? extra : "");
  else qc_doc_td(d, "-");
  qc_doc_td_verdict(d, layer_word(a, verb, v));
}

static void summary(qc_doc *d, const qc_audit_ctx *a, const char *word) {
  const qc_evidence *e = a->e;
  verb_sum v1 = sum_of(e, "vjp"), v2 = sum_of(e, "contract"), v3 = sum_of(e, "sft"), vs = sum_of(e, "step"),
           vo = sum_of(e, NULL);
  int outl = 0;
  for (int j = 0; j < e->nl2; j++)
    for (int i = 0; i < e->l2[j].s.n; i++) outl += e->l2[j].s.rows[i].outlier;
  qc_l1_summary s1;
  qc_audit_l1_summary(e, &s1);
  qc_sbuf_printf(&d->html, "<section id=\"summary\">\n");
  qc_doc_h(d, 2, NULL, "Summary");
  qc_doc_p(d);
  qc_doc_strong(d, "Verdict: ");
  qc_doc_verdict(d, word);
  qc_doc_text(d, ". %d report(s) read; qatcheck %s, source commit ", e->nsrc, QC_VERSION);
  qc_doc_code(d, qc_build_commit());
  qc_doc_text(d, ".");
  qc_doc_table(d, "l:layer|l:question it answers|r:reports|r:checks|r:failed|l:verdict");
  char ex[48] = "";
  summary_row(d, a, "vjp", "1. module VJPs (vjp)", "does the implementation compute the agreed gradient contract", &v1, NULL);
  if (outl) snprintf(ex, sizeof ex, " (%d outlier%s)", outl, outl == 1 ? "" : "s");
  summary_row(d, a, "contract", "2. gradient contract (contract)", "does dX from the master weight bias the gradient", &v2, ex);
  summary_row(d, a, "sft", "3. proxy SFT (sft)", "is the whole training chain biased (pairs of arms)", &v3, NULL);
  summary_row(d, a, "step", "one-step update (step)", "does the optimizer step use the gradients as intended", &vs, NULL);
  if (vo.reports) summary_row(d, a, NULL, "other (fd, quant, tol)", "cross-checks of the references and quantizers", &vo, NULL);
  if (a->reg) {
    int nb = 0;
    for (int i = 0; i < e->nsrc; i++) nb += a->reg_base[i] != NULL;
    qc_doc_tr(d);
    qc_doc_td(d, "baseline");
    qc_doc_td(d, "did a check regress against the accepted baseline");
    qc_doc_td(d, "%d", nb);
    qc_doc_td(d, "-");
    qc_doc_td(d, "%d regression(s)", nreg_total(a));
    qc_doc_td_verdict(d, nreg_total(a) ? "regression" : "pass");
  }
  qc_doc_table_end(d);
  qc_audit_completeness(d, a);
  qc_doc_p(d);
  qc_doc_strong(d, "Coverage: ");
  qc_doc_text(d, "%d of %d applicable (class, item) pairs of the method's coverage list covered. ", s1.cov_covered,
              s1.cov_applicable);
  qc_sbuf miss = {0};
  qc_audit_missing(e, &miss, 6);
  if (miss.s && miss.s[0]) {
    qc_doc_text(d, "Missing: %s (", miss.s);
    qc_doc_ref(d, "missing", "every missing item");
    qc_doc_text(d, ").");
  }
  qc_sbuf_free(&miss);
  for (int i = 0; i < e->nsrc; i++)
    if (!strcmp(e->src[i].verdict, "error")) {
      qc_doc_p(d);
      qc_doc_verdict(d, "error");
      qc_doc_text(d, " the %s run of ", e->src[i].verb);
      qc_doc_code(d, e->src[i].path);
      qc_doc_text(d, " could not be judged: %s", e->src[i].error);
    }
  int nsus = qc_audit_nsuspicious(e);
  if (nsus) {
    qc_doc_p(d);
    qc_doc_strong(d, "Suspicious passes: ");
    qc_doc_text(d, "%d check(s) passed at %g times their noise floor or more, or with rel_l2 >= %g (", nsus, QC_AUDIT_SUSPICIOUS,
                QC_AUDIT_SUSPICIOUS_REL);
    qc_doc_ref(d, "suspicious", "the list");
    qc_doc_text(d, ").");
  }
  worst_checks(d, e);
  qc_doc_end_block(d);
  qc_sbuf_printf(&d->html, "</section>\n");
}

static void nav(qc_doc *d) {
  static const char *const ids[][2] = {{"layer1", "Layer 1"}, {"coverage", "Coverage"}, {"layer2", "Layer 2"},
                                       {"layer3", "Layer 3"}, {"step", "One-step update"}, {"regressions", "Regressions"},
                                       {"inputs", "Inputs"}};
  qc_doc_p(d);
  for (size_t i = 0; i < sizeof ids / sizeof ids[0]; i++) {
    if (i) qc_doc_text(d, " | ");
    qc_doc_ref(d, ids[i][0], ids[i][1]);
  }
  qc_doc_end_block(d);
}

static void inputs(qc_doc *d, const qc_evidence *e, const qc_prov *prov) {
  qc_doc_h(d, 2, "inputs", "Inputs");
  qc_doc_table(d, "l:report|l:verb|l:of|l:verdict|r:checks|r:failed|l:written by|l:sha256");
  for (int i = 0; i < e->nsrc; i++) {
    const qc_ev_src *s = &e->src[i];
    qc_doc_tr(d);
    qc_doc_td_code(d, s->path);
    qc_doc_td(d, "%s", s->verb);
    qc_doc_td(d, "%s", s->title);
    qc_doc_td_verdict(d, s->verdict[0] ? s->verdict : "-");
    qc_doc_td(d, "%d", s->checks);
    qc_doc_td(d, "%d", s->failed);
    if (s->commit[0]) qc_doc_td_code(d, s->commit);
    else qc_doc_td(d, "-"); /* a report of a qatcheck that did not name its commit */
    qc_doc_td_code(d, s->sha256);
  }
  qc_doc_table_end(d);
  qc_sbuf cmd = {0};
  qc_prov_cmdline(prov, &cmd);
  qc_doc_p(d);
  qc_doc_text(d, "Assembled by ");
  qc_doc_code(d, cmd.s ? cmd.s : "qatcheck report");
  qc_doc_text(d, " (qatcheck %s, source commit ", QC_VERSION);
  qc_doc_code(d, qc_build_commit());
  qc_doc_text(d, ").");
  qc_doc_end_block(d);
  qc_sbuf_free(&cmd);
}

/* ---- JSON and JUnit ------------------------------------------------------------------------- */

static int render_json(qc_sbuf *out, qc_prov *prov, const qc_audit_ctx *a, const char *word, int verdict) {
  const qc_evidence *e = a->e;
  cJSON *root = qc_report_envelope(prov, "report", verdict);
  if (!root) return qc_err_sys("out of memory");
  cJSON_AddStringToObject(root, "audit", word);
  cJSON_AddBoolToObject(root, "complete", a->need.n == 0);
  cJSON_AddBoolToObject(root, "allow_incomplete", a->allow_incomplete);
  cJSON *ms = cJSON_AddArrayToObject(root, "missing");
  for (int k = 0; k < a->need.n; k++) {
    cJSON *o = cJSON_CreateObject();
    cJSON_AddStringToObject(o, "layer", a->need.layer[k]);
    cJSON_AddStringToObject(o, "why", a->need.why[k]);
    cJSON_AddItemToArray(ms, o);
  }
  cJSON_AddBoolToObject(root, "layer2_required", a->need.l2_required);
  if (a->need.l2_required) cJSON_AddStringToObject(root, "layer2_required_by", a->need.l2_why);
  static const char *const verbs[] = {"vjp", "contract", "sft", "step"};
  cJSON *ls = cJSON_AddObjectToObject(root, "layers");
  int checks = 0, failed = 0;
  for (int i = 0; i < 4; i++) {
    verb_sum v = sum_of(e, verbs[i]);
    cJSON *o = cJSON_AddObjectToObject(ls, verbs[i]);
    cJSON_AddNumberToObject(o, "reports", v.reports);
    cJSON_AddNumberToObject(o, "checks", v.checks);
    cJSON_AddNumberToObject(o, "failed", v.failed);
    cJSON_AddStringToObject(o, "verdict", layer_word(a, verbs[i], &v));
    checks += v.checks;
    failed += v.failed;
  }
  qc_report_totals(root, checks, failed, sum_of(e, "vjp").errors + sum_of(e, "contract").errors + sum_of(e, "sft").errors +
                                             sum_of(e, "step").errors);
  qc_l1_summary s1;
  qc_audit_l1_summary(e, &s1);
  cJSON *cv = cJSON_AddObjectToObject(root, "coverage");
  cJSON_AddNumberToObject(cv, "applicable", s1.cov_applicable);
  cJSON_AddNumberToObject(cv, "covered", s1.cov_covered);
  qc_sbuf miss = {0};
  qc_audit_missing(e, &miss, 1000);
  cJSON_AddStringToObject(cv, "missing", miss.s ? miss.s : "");
  qc_sbuf_free(&miss);
  cJSON *rg = cJSON_AddArrayToObject(root, "regressions");
  for (int i = 0; a->reg && i < e->nsrc; i++)
    for (int k = 0; k < a->reg[i].n; k++) {
      cJSON *o = cJSON_CreateObject();
      cJSON_AddStringToObject(o, "report", e->src[i].path);
      cJSON_AddStringToObject(o, "baseline", a->reg_base[i]);
      cJSON_AddStringToObject(o, "check", a->reg[i].v[k].id);
      cJSON_AddStringToObject(o, "what", a->reg[i].v[k].what);
      cJSON_AddItemToArray(rg, o);
    }
  cJSON *rs = cJSON_AddArrayToObject(root, "reports");
  for (int i = 0; i < e->nsrc; i++) {
    cJSON *o = cJSON_CreateObject();
    cJSON_AddStringToObject(o, "path", e->src[i].path);
    cJSON_AddStringToObject(o, "verb", e->src[i].verb);
    cJSON_AddStringToObject(o, "verdict", e->src[i].verdict);
    cJSON_AddNumberToObject(o, "checks", e->src[i].checks);
    cJSON_AddNumberToObject(o, "failed", e->src[i].failed);
    cJSON_AddItemToArray(rs, o);
  }
  return qc_report_json_render(root, out);
}

/* One testcase per input report (a failed one fails, an error report
 * errs) and per regression. */
static int render_junit(qc_sbuf *out, const qc_audit_ctx *a) {
  const qc_evidence *e = a->e;
  qc_tlist l = {0};
  int rc = QC_OK;
  for (int i = 0; i < e->nsrc && !rc; i++) {
    const qc_ev_src *s = &e->src[i];
    char msg[700], name[1100];
    snprintf(name, sizeof name, "%s %s", s->verb, s->path);
    snprintf(msg, sizeof msg, "%s: %d check(s), %d failed", s->verdict, s->checks, s->failed);
    if (!strcmp(s->verdict, "error")) rc = qc_tlist_add_error(&l, "audit", "audit", name, s->error);
    else rc = qc_tlist_add(&l, "audit", "audit", name, strcmp(s->verdict, "pass") ? msg : NULL, msg);
  }
  for (int k = 0; k < a->need.n && !rc; k++) { /* a missing requirement fails, unless --allow-incomplete accepts it */
    char msg[1000];
    snprintf(msg, sizeof msg, "incomplete: %s%s", a->need.why[k], a->allow_incomplete ? " (accepted by --allow-incomplete)" : "");
    rc = qc_tlist_add(&l, "completeness", "audit", a->need.layer[k], a->allow_incomplete ? NULL : msg, msg);
  }
  for (int i = 0; a->reg && i < e->nsrc && !rc; i++)
    for (int k = 0; k < a->reg[i].n && !rc; k++)
      rc = qc_tlist_add(&l, "baseline", e->src[i].path, a->reg[i].v[k].id, a->reg[i].v[k].what, NULL);
  if (!rc) rc = qc_tlist_junit(&l, "report", out);
  qc_tlist_free(&l);
  return rc;
}

int qc_audit_render(qc_report_out *o, qc_audit_ctx *a, int *verdict) {
  const qc_evidence *e = a->e;
  qc_audit_needs(e, &a->need);
  const char *word = overall(a, verdict);
  char title[64];
  int rc = QC_OK;
  snprintf(title, sizeof title, "qatcheck audit: %s", word);
  if (qc_report_wants(o, QC_REP_MARKDOWN) || qc_report_wants(o, QC_REP_HTML)) {
    qc_doc d;
    qc_doc_begin(&d, title);
    qc_doc_h(&d, 1, NULL, "%s", title);
    summary(&d, a, word);
    nav(&d);
    qc_audit_l1(&d, e);
    qc_audit_suspicious(&d, e);
    qc_audit_l2(&d, e);
    qc_audit_l3(&d, e);
    qc_audit_step(&d, e);
    qc_audit_regressions(&d, a);
    inputs(&d, e, o->prov);
    rc = qc_doc_end(&d);
    if (!rc) {
      o->doc[QC_REP_MARKDOWN] = d.md;
      o->doc[QC_REP_HTML] = d.html;
    } else {
      qc_sbuf_free(&d.md);
      qc_sbuf_free(&d.html);
    }
  }
  if (!rc && qc_report_wants(o, QC_REP_JSON)) rc = render_json(&o->doc[QC_REP_JSON], o->prov, a, word, *verdict);
  if (!rc && qc_report_wants(o, QC_REP_JUNIT)) rc = render_junit(&o->doc[QC_REP_JUNIT], a);
  return rc;
}
