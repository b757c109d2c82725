/* audit_l1.c: layer 1 in the audit document: per module class the gradient
 * contract, reference and candidate, dY construction, shapes covered,
 * metrics against their declared tolerances with the reasoning, failed
 * checks; the plot of every check's noise multiple against its bound; the
 * coverage matrix against the method's list, what is missing by name. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/qc.h"
#include "model/module.h"
#include "report/audit.h"
#include "report/svg.h"

/* The classes of layer 1, in order of first appearance (checks, then
 * module descriptions); n returned, names point into e. */
static int classes(const qc_evidence *e, const char **out, int max) {
  int n = 0;
  for (int i = 0; i < e->nl1 + e->nmod; i++) {
    const char *c = i < e->nl1 ? e->l1[i].c.cls : e->mod[i - e->nl1].mi.cls;
    int seen = 0;
    for (int j = 0; j < n && !seen; j++) seen = strcmp(out[j], c) == 0;
    if (!seen && n < max && c[0]) out[n++] = c;
  }
  return n;
}

#define MAXCLS 64

double qc_audit_bound_use(const qc_check *k) {
  const qc_tol *t = &k->tol;
  const qc_metrics *m = &k->m;
  double u = NAN;
  if (!k->has_tol || !k->has_metrics) return NAN;
#define USE(x) do { double v_ = (x); if (isfinite(v_) && !(v_ <= u)) u = v_; } while (0)
  if (t->has_rel_l2 && t->rel_l2 > 0) USE(m->rel_l2 / t->rel_l2);
  if (t->has_noise_multiple && t->noise_multiple > 0) USE(m->noise_multiple / t->noise_multiple);
  if (t->has_max_abs && t->max_abs > 0) USE(m->max_abs / t->max_abs);
  if (t->has_cosine_min && t->cosine_min < 1 && !m->cosine_null) USE((1 - m->cosine) / (1 - t->cosine_min));
  if (t->has_norm_ratio && t->norm_hi > t->norm_lo && isfinite(m->norm_ratio)) {
    double c = (t->norm_hi + t->norm_lo) / 2, h = (t->norm_hi - t->norm_lo) / 2;
    USE(fabs(m->norm_ratio - c) / h);
  }
  double bz = t->has_bias_z ? t->bias_z : QC_BIAS_Z_DEFAULT; /* the bias test, on by default where computed */
  if (bz > 0) USE(fabs(m->bias_z) / bz);
#undef USE
  return u;
}

/* ---- coverage ------------------------------------------------------------------------ */

/* Item c for class cls: -1 not applicable, else the instances showing it
 * (for context lengths: the distinct sequence lengths, covered at 2). */
static int cov_cell(const qc_evidence *e, const char *cls, int c) {
  int applies = 0, n = 0;
  int64_t seen[64];
  int ns = 0;
  for (int i = 0; i < e->nmod; i++) {
    const qc_modinfo *mi = &e->mod[i].mi;
    if (strcmp(mi->cls, cls) != 0) continue;
    applies |= qc_cov_applies(c, cls, mi->contract);
    if (c == QC_COV_CONTEXTS) {
      int dup = 0;
      for (int j = 0; j < ns && !dup; j++) dup = seen[j] == mi->seqlen;
      if (!dup && mi->seqlen > 0 && ns < 64) seen[ns++] = mi->seqlen;
    } else {
      n += mi->cover >> c & 1;
    }
  }
  if (!applies) {
    int any = 0; /* no module description: judge by the class alone */
    for (int i = 0; i < e->nmod && !any; i++) any = strcmp(e->mod[i].mi.cls, cls) == 0;
    if (any || !qc_cov_applies(c, cls, NULL)) return -1;
  }
  if (c == QC_COV_CONTEXTS) return ns >= 2 ? ns : 0;
  return n;
}

void qc_audit_l1_summary(const qc_evidence *e, qc_l1_summary *s) {
  const char *cls[MAXCLS];
  memset(s, 0, sizeof *s);
  s->checks = e->nl1;
  for (int i = 0; i < e->nl1; i++) s->failed += e->l1[i].c.verdict != QC_V_PASS;
  s->modules = e->nmod;
  s->classes = classes(e, cls, MAXCLS);
  for (int k = 0; k < s->classes; k++)
    for (int c = 0; c < QC_COV_COUNT; c++) {
      int v = cov_cell(e, cls[k], c);
      if (v < 0) continue;
      s->cov_applicable++;
      s->cov_covered += v > 0;
    }
}

void qc_audit_missing(const qc_evidence *e, qc_sbuf *b, int max) {
  const char *cls[MAXCLS];
  int n = classes(e, cls, MAXCLS), shown = 0, more = 0;
  for (int c = 0; c < QC_COV_COUNT; c++) {
    char who[512] = "";
    for (int j = 0; j < n; j++)
      if (cov_cell(e, cls[j], c) == 0) qc_cat(who, sizeof who, "%s%s", who[0] ? ", " : "", cls[j]);
    if (!who[0]) continue;
    if (shown == max) { more++; continue; }
    qc_sbuf_printf(b, "%s%s (%s)", shown ? "; " : "", qc_coverage[c].label, who);
    shown++;
  }
  if (!n) qc_sbuf_printf(b, "every item: no layer-1 report");
  if (more) qc_sbuf_printf(b, "; and %d more item(s)", more);
}

/* The coverage section: each item of the layer-1 list per class, covered,
 * missing or n/a. */
static void qc_audit_coverage(qc_doc *d, const qc_evidence *e) {
  const char *cls[MAXCLS];
  int n = classes(e, cls, MAXCLS);
  qc_doc_h(d, 3, "coverage", "Coverage against the method's list");
  qc_doc_p(d);
  qc_doc_text(d, "Each item of the method's layer-1 coverage list, per class: covered (the number of instances "
                 "whose data shows it), missing, or n/a (the item does not apply to the class). What an item needs "
                 "is decided from each instance's data by qatcheck (the vjp report's module descriptions), not "
                 "assumed from the case's intent.");
  if (!n) {
    qc_doc_p(d);
    qc_doc_strong(d, "No layer-1 report: nothing of the coverage list is covered.");
    return;
  }
  char spec[2048] = "l:item";
  for (int j = 0; j < n; j++) qc_cat(spec, sizeof spec, "|l:%s", cls[j]);
  qc_cat(spec, sizeof spec, "|l:how it is shown");
  qc_doc_table(d, spec);
  for (int c = 0; c < QC_COV_COUNT; c++) {
    char how[1024];
    qc_cov_how(c, cls, n, how, sizeof how);
    qc_doc_tr(d);
    qc_doc_td(d, "%s", qc_coverage[c].label);
    for (int j = 0; j < n; j++) {
      int v = cov_cell(e, cls[j], c);
      if (v < 0) qc_doc_td_verdict(d, "n/a");
      else if (v == 0) qc_doc_td_verdict(d, "missing");
      else {
        char t[48];
        snprintf(t, sizeof t, c == QC_COV_CONTEXTS ? "covered (%d lengths)" : "covered (%d)", v);
        qc_doc_td(d, "%s", t);
      }
    }
    qc_doc_td(d, "%s", how);
  }
  qc_doc_table_end(d);
  qc_doc_h(d, 4, "missing", "Missing coverage, by name");
  int any = 0;
  for (int c = 0; c < QC_COV_COUNT; c++) {
    char who[512] = "", how[1024];
    const char *miss[MAXCLS];
    int nmiss = 0;
    for (int j = 0; j < n; j++)
      if (cov_cell(e, cls[j], c) == 0) {
        qc_cat(who, sizeof who, "%s%s", who[0] ? ", " : "", cls[j]);
        miss[nmiss++] = cls[j];
      }
    if (!who[0]) continue;
    qc_cov_how(c, miss, nmiss, how, sizeof how);
    qc_doc_li(d);
    qc_doc_strong(d, "%s", qc_coverage[c].label);
    qc_doc_text(d, " in class%s %s: needs %s%s", strchr(who, ',') ? "es" : "", who, how,
                qc_coverage[c].integration ? " (an integration-level item: no module-level audit can show it)" : "");
    any = 1;
  }
  if (!any) {
    qc_doc_p(d);
    qc_doc_text(d, "Nothing: every applicable item is covered.");
  }
  qc_doc_end_block(d);
}

/* ---- the plot: every check's noise multiple against its bound ------------------------------- */

static void l1_plot(qc_doc *d, const qc_evidence *e) {
  int n = e->nl1;
  double *x = calloc((size_t)n + 1, sizeof *x), *yp = calloc((size_t)n + 1, sizeof *yp);
  double *yf = calloc((size_t)n + 1, sizeof *yf), *yb = calloc((size_t)n + 1, sizeof *yb);
  qc_sbuf svg = {0};
  if (!x || !yp || !yf || !yb) goto done;
  for (int i = 0; i < n; i++) {
    const qc_check *k = &e->l1[i].c;
    double nm = k->has_metrics ? k->m.noise_multiple : NAN;
    x[i] = i;
    yp[i] = k->verdict == QC_V_PASS ? nm : NAN;
    yf[i] = k->verdict != QC_V_PASS ? nm : NAN;
    yb[i] = k->has_tol && k->tol.has_noise_multiple ? k->tol.noise_multiple : NAN;
  }
  qc_svg_series s[3] = {
      {.label = "noise multiple (passed)", .x = x, .y = yp, .n = n, .color = "#1f77b4", .style = QC_SVG_POINTS},
      {.label = "noise multiple (failed)", .x = x, .y = yf, .n = n, .color = "#d62728", .style = QC_SVG_POINTS, .radius = 4},
      {.label = "declared bound", .x = x, .y = yb, .n = n, .color = "#555555", .style = QC_SVG_TICKS}};
  qc_svg_plot p = {.title = "Layer 1: every check's noise multiple against its bound", .xlabel = "check (report order)",
                   .ylabel = "noise multiple", .width = 900, .height = 340, .logy = 1, .series = s, .nseries = 3};
  qc_svg_hline(&p, 1.0, "the noise floor (1x)", "#2ca02c");
  /* class boundaries */
  for (int i = 0; i < n; i++)
    if (i == 0 || strcmp(e->l1[i].c.cls, e->l1[i - 1].c.cls) != 0) qc_svg_vline(&p, i - 0.5, e->l1[i].c.cls, "#9467bd");
  if (qc_svg_render(&p, &svg) == QC_OK)
    qc_doc_figure(d, &svg, "Each point is one check (module, dY, gradient): its error in multiples of the noise floor "
                           "(the error that rounding the exact gradient to the candidate's dtype makes); a tick is the "
                           "check's declared noise_multiple bound, the dashed line the floor itself. Checks with zero "
                           "error (a zero dY) are off the log axis. Purple lines start each class.");
done:
  qc_sbuf_free(&svg);
  free(x);
  free(yp);
  free(yf);
  free(yb);
}

/* ---- per class ---------------------------------------------------------------------------- */

/* The distinct values key takes in the contracts of cls's modules, joined. */
static void contract_values(const qc_evidence *e, const char *cls, const char *key, char *out, size_t n) {
  char pat[64];
  out[0] = 0;
  snprintf(pat, sizeof pat, "\"%s\":", key);
  for (int i = 0; i < e->nmod; i++) {
    if (strcmp(e->mod[i].mi.cls, cls) != 0) continue;
    const char *p = strstr(e->mod[i].mi.contract, pat);
    if (!p) continue;
    p += strlen(pat);
    while (*p == ' ') p++;
    char v[96];
    size_t l = *p == '{' ? strcspn(p, "}") + 1 : strcspn(p, ",}");
    snprintf(v, sizeof v, "%.*s", (int)(l < sizeof v ? l : sizeof v - 1), p);
    for (char *q = v; *q; q++)
      if (*q == '"') memmove(q, q + 1, strlen(q));
    if (!strstr(out, v)) qc_cat(out, n, "%s%s", out[0] ? ", " : "", v);
  }
}

static void class_contract(qc_doc *d, const qc_evidence *e, const char *cls) {
  const qc_registry_row *row = qc_registry_find(cls);
  qc_doc_h(d, 4, NULL, "Gradient contract");
  if (!row || !row->cls->keys || !row->cls->keys[0].key) {
    qc_doc_p(d);
    qc_doc_text(d, "%s", row ? "The class takes no contract keys: its backward has no surrogate choice to make."
                             : "A class this qatcheck does not know: its contract keys cannot be listed.");
    return;
  }
  qc_doc_table(d, "l:key|l:value in this audit|l:what it decides");
  for (const qc_key_spec *k = row->cls->keys; k->key; k++) {
    char v[512];
    contract_values(e, cls, k->key, v, sizeof v);
    qc_doc_tr(d);
    qc_doc_td_code(d, k->key);
    qc_doc_td(d, "%s", v[0] ? v : k->dflt ? k->dflt : "-");
    qc_doc_td(d, "%s", k->help ? k->help : "");
  }
  qc_doc_table_end(d);
  if (row->cls->not_checked && row->cls->not_checked[0]) {
    qc_doc_p(d);
    qc_doc_text(d, "Not checked, by design: %s.", row->cls->not_checked);
  }
}

static const char *dy_what(const char *kind) {
  if (strcmp(kind, "random") == 0) return "N(0, 1) in every entry, rounded to bf16 (fixed seed)";
  if (strcmp(kind, "zero") == 0) return "+0 everywhere: every gradient must be exactly zero";
  if (strcmp(kind, "sparse") == 0)
    return "non-zero N(0, 1) only where a selected row (about 10%) meets a selected column (about 10%): shows transposes, "
           "permutations and shifted rows that a dense dY averages away";
  if (strcmp(kind, "ones") == 0) return "1 everywhere (y.sum().backward(): blind to transposes, kept for comparison)";
  if (strcmp(kind, "dump") == 0) return "the trainer's own upstream gradient, read from the dump's grad_out/";
  return "as the report names it";
}

static void class_sources(qc_doc *d, const qc_evidence *e, const char *cls) {
  char ref[QC_EV_TEXT] = "", cands[64] = "", kinds[8][16];
  int nk = 0;
  for (int i = 0; i < e->nmod; i++) {
    const qc_ev_mod *m = &e->mod[i];
    if (strcmp(m->mi.cls, cls) != 0) continue;
    if (!ref[0]) snprintf(ref, sizeof ref, "%s", m->reference);
    if (!strstr(cands, m->mi.candidate)) qc_cat(cands, sizeof cands, "%s%s", cands[0] ? ", " : "", m->mi.candidate);
    for (int j = 0; j < m->mi.ndy; j++) {
      int seen = 0;
      for (int k = 0; k < nk && !seen; k++) seen = strcmp(kinds[k], m->mi.dy[j].kind) == 0;
      if (!seen && nk < 8) snprintf(kinds[nk++], sizeof kinds[0], "%s", m->mi.dy[j].kind);
    }
  }
  qc_doc_h(d, 4, NULL, "Reference, candidate and upstream gradients");
  qc_doc_li(d);
  qc_doc_strong(d, "reference: ");
  qc_doc_text(d, "%s", ref[0] ? ref : "not in the reports (a vjp report without module descriptions)");
  qc_doc_li(d);
  qc_doc_strong(d, "candidate: ");
  qc_doc_text(d, "%s", cands[0] ? cands : "-");
  qc_doc_text(d, " (builtin: qatcheck's production VJP as a trainer runs it; dump: the gradients the trainer wrote; plugin: a "
                 "shared library's VJP)");
  for (int k = 0; k < nk; k++) {
    qc_doc_li(d);
    qc_doc_strong(d, "dY %s: ", kinds[k]);
    qc_doc_text(d, "%s", dy_what(kinds[k]));
  }
  qc_doc_end_block(d);
}

static void class_shapes(qc_doc *d, const qc_evidence *e, const char *cls) {
  qc_doc_h(d, 4, NULL, "Shapes and paths covered");
  qc_doc_table(d, "l:instance|l:report|l:source|r:tokens|l:tensors|l:values|l:dY|r:checks|r:seconds");
  for (int i = 0; i < e->nmod; i++) {
    const qc_modinfo *mi = &e->mod[i].mi;
    if (strcmp(mi->cls, cls) != 0) continue;
    char ts[1024] = "", dy[256] = "", sh[96];
    for (int j = 0; j < mi->nt; j++) {
      qc_shape_str(mi->t[j].ndim, mi->t[j].shape, sh, sizeof sh);
      qc_cat(ts, sizeof ts, "%s%s/%s %s %s", j ? "; " : "", mi->t[j].role, mi->t[j].name, sh, mi->t[j].dtype);
    }
    for (int j = 0; j < mi->ndy; j++) qc_cat(dy, sizeof dy, "%s%s", j ? ", " : "", mi->dy[j].name);
    qc_doc_tr(d);
    qc_doc_td_code(d, mi->module);
    qc_doc_td_code(d, qc_audit_src_name(e, e->mod[i].src));
    qc_doc_td(d, "%s", mi->source);
    qc_doc_td(d, "%lld", (long long)mi->tokens);
    qc_doc_td(d, "%s", ts);
    qc_doc_td(d, "%s", mi->values[0] ? mi->values : "as dumped");
    qc_doc_td(d, "%s", dy);
    qc_doc_td(d, "%d", mi->nchecks);
    qc_doc_td(d, "%.3f", mi->seconds);
  }
  qc_doc_table_end(d);
}

static void tol_text(const qc_tol *t, char *b, size_t n) {
  b[0] = 0;
  if (t->has_rel_l2) qc_cat(b, n, "rel_l2 <= %g; ", t->rel_l2);
  if (t->has_max_abs) qc_cat(b, n, "max_abs <= %g; ", t->max_abs);
  if (t->has_cosine_min) qc_cat(b, n, "cosine >= %.12g; ", t->cosine_min);
  if (t->has_norm_ratio) qc_cat(b, n, "norm ratio in [%.9g, %.9g]; ", t->norm_lo, t->norm_hi);
  if (t->has_noise_multiple) qc_cat(b, n, "noise multiple <= %g; ", t->noise_multiple);
  if (t->has_bias_z) qc_cat(b, n, t->bias_z > 0 ? "|bias_z| <= %g; " : "no bias test; ", t->bias_z);
  size_t l = strlen(b);
  if (l >= 2) b[l - 2] = 0;
}

static void class_metrics(qc_doc *d, const qc_evidence *e, const char *cls) {
  char tens[16][QC_NAMELEN];
  int nt = 0;
  for (int i = 0; i < e->nl1; i++) {
    const qc_check *k = &e->l1[i].c;
    int seen = 0;
    if (strcmp(k->cls, cls) != 0) continue;
    for (int j = 0; j < nt && !seen; j++) seen = strcmp(tens[j], k->tensor) == 0;
    if (!seen && nt < 16) snprintf(tens[nt++], sizeof tens[0], "%s", k->tensor);
  }
  qc_doc_h(d, 4, NULL, "Metrics against the tolerances declared in advance");
  qc_doc_table(d, "l:gradient|l:declared bounds|r:checks|r:failed|r:max noise x|r:max rel_l2|r:min cosine|r:norm ratio "
                  "min|r:max|r:most of a bound used|l:reference GEMM");
  for (int t = 0; t < nt; t++) {
    int n = 0, f = 0;
    double nm = NAN, rl = NAN, cs = NAN, lo = NAN, hi = NAN, use = NAN;
    for (int i = 0; i < e->nl1; i++) {
      const qc_check *k = &e->l1[i].c;
      if (strcmp(k->cls, cls) || strcmp(k->tensor, tens[t])) continue;
      n++;
      f += k->verdict != QC_V_PASS;
      if (!k->has_metrics) continue;
#define MAXF(a, v) do { double v_ = (v); if (isfinite(v_) && !(v_ <= (a))) (a) = v_; } while (0)
#define MINF(a, v) do { double v_ = (v); if (isfinite(v_) && !(v_ >= (a))) (a) = v_; } while (0)
      MAXF(nm, k->m.noise_multiple);
      MAXF(rl, k->m.rel_l2);
      if (!k->m.cosine_null) MINF(cs, k->m.cosine);
      MINF(lo, k->m.norm_ratio);
      MAXF(hi, k->m.norm_ratio);
      MAXF(use, qc_audit_bound_use(k));
#undef MAXF
#undef MINF
    }
    /* the declared bound sets, each once (reports of several cases may differ) */
    char tb[1024] = "";
    for (int i = 0; i < e->nl1; i++) {
      const qc_check *k = &e->l1[i].c;
      char one[256];
      if (strcmp(k->cls, cls) || strcmp(k->tensor, tens[t]) || !k->has_tol) continue;
      tol_text(&k->tol, one, sizeof one);
      if (!strstr(tb, one)) qc_cat(tb, sizeof tb, "%s%s", tb[0] ? " | or: " : "", one);
    }
    if (!tb[0]) snprintf(tb, sizeof tb, "-");
    qc_doc_tr(d);
    qc_doc_td_code(d, tens[t]);
    qc_doc_td(d, "%s", tb);
    qc_doc_td(d, "%d", n);
    qc_doc_td(d, "%d", f);
    qc_doc_td_num(d, nm, 3);
    qc_doc_td_num(d, rl, 3);
    qc_doc_td_num(d, cs, 10);
    qc_doc_td_num(d, lo, 7);
    qc_doc_td_num(d, hi, 7);
    if (isfinite(use) && use < 10) qc_doc_td(d, "%.0f%%", 100 * use);
    else if (isfinite(use)) qc_doc_td(d, "%.3g times", use);
    else qc_doc_td(d, "-");
    qc_audit_ref_gemms(e, cls, tens[t], tb, sizeof tb);
    qc_doc_td(d, "%s", tb);
  }
  qc_doc_table_end(d);
  /* the reasoning, once per gradient and distinct text (32 modules of one
   * case, or several reports, declare the same text: said once, with how
   * many checks it covers) */
  enum { MAXR = 64 };
  for (int t = 0; t < nt; t++) {
    const char *seen[MAXR];
    int count[MAXR], ns = 0, more = 0;
    for (int i = 0; i < e->nl1; i++) {
      const qc_check *k = &e->l1[i].c;
      if (strcmp(k->cls, cls) || strcmp(k->tensor, tens[t]) || !k->has_tol || !k->tol.reasoning[0]) continue;
      int j = 0;
      while (j < ns && strcmp(seen[j], k->tol.reasoning) != 0) j++;
      if (j < ns) { count[j]++; continue; }
      if (ns == MAXR) { more++; continue; }
      seen[ns] = k->tol.reasoning;
      count[ns++] = 1;
    }
    for (int j = 0; j < ns; j++) {
      qc_doc_li(d);
      qc_doc_code(d, tens[t]);
      qc_doc_text(d, ": %s", seen[j]);
      if (count[j] > 1) qc_doc_text(d, " (%d checks)", count[j]);
    }
    if (more) {
      qc_doc_li(d);
      qc_doc_code(d, tens[t]);
      qc_doc_text(d, ": %d more check(s) with other reasoning (in their reports)", more);
    }
  }
  qc_doc_end_block(d);
}

static void class_failures(qc_doc *d, const qc_evidence *e, const char *cls) {
  int any = 0;
  for (int i = 0; i < e->nl1; i++) {
    const qc_ev_check *c = &e->l1[i];
    if (strcmp(c->c.cls, cls) || c->c.verdict == QC_V_PASS) continue;
    if (!any) qc_doc_h(d, 4, NULL, "Failed checks");
    any = 1;
    char name[2 * QC_NAMELEN + 2];
    qc_doc_li(d);
    qc_doc_code(d, c->c.module);
    qc_doc_text(d, " ");
    qc_doc_code(d, qc_report_check_name(&c->c, name, sizeof name));
    qc_doc_text(d, " (from ");
    qc_doc_code(d, qc_audit_src_name(e, c->src));
    qc_doc_text(d, "): %s", c->c.why);
    if (isfinite(c->c.m.bias_z) && !strstr(c->c.why, "bias_z")) { /* the why names it when it failed */
      double bz = c->c.has_tol && c->c.tol.has_bias_z ? c->c.tol.bias_z : QC_BIAS_Z_DEFAULT;
      if (bz > 0) qc_doc_text(d, " (bias_z %.3g, within +-%.3g)", c->c.m.bias_z, bz);
      else qc_doc_text(d, " (bias_z %.3g, the bias test off)", c->c.m.bias_z);
    }
    if (c->c.diagnosis[0]) {
      qc_doc_text(d, ". ");
      qc_doc_strong(d, "Diagnosis:");
      qc_doc_text(d, " %s", c->c.diagnosis);
    }
  }
  qc_doc_end_block(d);
}

void qc_audit_l1(qc_doc *d, const qc_evidence *e) {
  const char *cls[MAXCLS];
  int n = classes(e, cls, MAXCLS), nsrc = 0, failed = 0;
  for (int i = 0; i < e->nsrc; i++) nsrc += strcmp(e->src[i].verb, "vjp") == 0;
  for (int i = 0; i < e->nl1; i++) failed += e->l1[i].c.verdict != QC_V_PASS;
  qc_doc_h(d, 2, "layer1", "Layer 1: each module's VJP against an independent reference");
  qc_doc_p(d);
  if (!nsrc) {
    qc_doc_strong(d, "Not run: no vjp report among the inputs.");
    return;
  }
  qc_doc_text(d, "%d check(s) of %d module instance(s) in %d class(es), from %d vjp report(s): %d failed. Every gradient "
                 "of every instance is compared with qatcheck's float64 reference on the same inputs and the same dY, "
                 "against tolerances declared before the run.", e->nl1, e->nmod, n, nsrc, failed);
  if (e->nl1) l1_plot(d, e);
  for (int j = 0; j < n; j++) {
    char id[96];
    int nc = 0, nf = 0;
    for (int i = 0; i < e->nl1; i++)
      if (strcmp(e->l1[i].c.cls, cls[j]) == 0) {
        nc++;
        nf += e->l1[i].c.verdict != QC_V_PASS;
      }
    snprintf(id, sizeof id, "l1-%s", cls[j]);
    qc_doc_h(d, 3, id, "Class %s", cls[j]);
    qc_doc_p(d);
    qc_doc_verdict(d, nc == 0 ? "-" : nf ? "FAIL" : "pass");
    qc_doc_text(d, ": %d check(s), %d failed.", nc, nf);
    class_contract(d, e, cls[j]);
    class_sources(d, e, cls[j]);
    class_shapes(d, e, cls[j]);
    class_metrics(d, e, cls[j]);
    class_failures(d, e, cls[j]);
  }
  qc_audit_coverage(d, e);
}
