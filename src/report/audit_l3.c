/* audit_l3.c: layer 3 (the three-arm proxy SFT) and the one-step update in
 * the audit document: the config-diff table of the arms, each pair's
 * verdict, first deviation and where to look, its metrics, the curves
 * (when the sft report holds them), and the step checks. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/qc.h"
#include "report/audit.h"
#include "report/svg.h"

static const char *loc_advice(const char *loc) {
  if (strcmp(loc, "forward") == 0) return "the loss differs at the initial weights: check the forward, the data and the mask";
  if (strcmp(loc, "backward") == 0)
    return "the loss matches at the start but the first update differs: check the backward, the reduction, the scale, "
           "clipping and the optimizer";
  if (strcmp(loc, "late") == 0)
    return "agreement for several steps, then divergence: keep the first abnormal checkpoint; check recompute, "
           "quantization refresh, the learning rate and RNG; replay at the same weights";
  return "";
}

/* A plot of one pair metric's aligned curves: a and b, the band, the first failure. */
static void metric_plot(qc_doc *d, const qc_ev_pair *p, const qc_ev_sftcheck *m, const char *xname) {
  const qc_ev_series *a = NULL, *b = NULL, *lo = NULL, *hi = NULL;
  for (int k = 0; k < m->nser; k++) {
    const qc_ev_series *s = &m->ser[k];
    if (!strcmp(s->label, "a")) a = s;
    else if (!strcmp(s->label, "b")) b = s;
    else if (!strcmp(s->label, "lo")) lo = s;
    else if (!strcmp(s->label, "hi")) hi = s;
  }
  if (!a && !b) return;
  qc_svg_series ser[2];
  int ns = 0;
  if (a) ser[ns++] = (qc_svg_series){.label = p->a, .x = a->x, .y = a->y, .n = a->n};
  if (b) ser[ns++] = (qc_svg_series){.label = p->b, .x = b->x, .y = b->y, .n = b->n, .dashed = 1};
  char title[200], cap[300];
  snprintf(title, sizeof title, "%s: %s vs %s", m->metric, p->a, p->b);
  qc_svg_plot pl = {.title = title, .xlabel = xname[0] ? xname : "step", .ylabel = m->metric, .width = 900, .height = 300,
                    .series = ser, .nseries = ns};
  if (lo && hi && lo->n == hi->n) {
    pl.band_x = lo->x;
    pl.band_lo = lo->y;
    pl.band_hi = hi->y;
    pl.band_n = lo->n;
    pl.band_label = "bound around b";
  }
  if (m->has_fail && isfinite(m->fail_x)) qc_svg_vline(&pl, m->fail_x, "first failure", NULL);
  qc_sbuf svg = {0};
  snprintf(cap, sizeof cap, "%s of %s (solid) and %s (dashed) over the window; the shaded band is the declared bound "
           "around %s; the red line the first x where a bound failed.", m->metric, p->a, p->b, p->b);
  if (qc_svg_render(&pl, &svg) == QC_OK) qc_doc_figure(d, &svg, cap);
  qc_sbuf_free(&svg);
}

/* Plots of the report's per-arm curves, one per metric. */
static void curves_plots(qc_doc *d, const qc_ev_sft *s) {
  for (int i = 0; i < s->ncurve; i++) {
    const char *colon = strstr(s->curve[i].label, ": ");
    size_t ml = colon ? (size_t)(colon - s->curve[i].label) : strlen(s->curve[i].label);
    int first = 1;
    for (int j = 0; j < i && first; j++) first = strncmp(s->curve[j].label, s->curve[i].label, ml + 1) != 0;
    if (!first) continue;
    qc_svg_series ser[8];
    int ns = 0;
    for (int j = i; j < s->ncurve && ns < 8; j++)
      if (strncmp(s->curve[j].label, s->curve[i].label, ml) == 0 && s->curve[j].label[ml] == ':') {
        ser[ns] = (qc_svg_series){.label = s->curve[j].label + ml + 2, .x = s->curve[j].x, .y = s->curve[j].y,
                                  .n = s->curve[j].n, .dashed = ns > 0 && ns % 2 == 0};
        ns++; /* after the series reads it (one statement would leave the order undefined) */
      }
    char title[128], cap[200];
    snprintf(title, sizeof title, "%.*s per arm", (int)ml, s->curve[i].label);
    snprintf(cap, sizeof cap, "%.*s of every arm against %s, as the sft report holds them.", (int)ml, s->curve[i].label,
             s->x[0] ? s->x : "step");
    qc_svg_plot pl = {.title = title, .xlabel = s->x[0] ? s->x : "step", .ylabel = "value", .width = 900, .height = 300,
                      .series = ser, .nseries = ns};
    if (s->has_window) {
      qc_svg_vline(&pl, s->w0, "window", "#777777");
      qc_svg_vline(&pl, s->w1, NULL, "#777777");
    }
    qc_sbuf svg = {0};
    if (qc_svg_render(&pl, &svg) == QC_OK) qc_doc_figure(d, &svg, cap);
    qc_sbuf_free(&svg);
  }
}

static void one_sft(qc_doc *d, const qc_evidence *e, const qc_ev_sft *s, int idx) {
  const qc_ev_src *src = &e->src[s->src];
  int plots = s->ncurve;
  qc_doc_h(d, 3, NULL, "SFT report %d: %s", idx + 1, src->title[0] ? src->title : src->path);
  qc_doc_p(d);
  qc_doc_verdict(d, src->verdict[0] ? src->verdict : "-");
  qc_doc_text(d, ": %d pair(s); x axis %s", s->npair, s->x[0] ? s->x : "step");
  if (s->has_window) qc_doc_text(d, ", window [%g, %g]", s->w0, s->w1);
  qc_doc_text(d, ". Report: ");
  qc_doc_code(d, src->path);
  qc_doc_text(d, ".");
  qc_doc_h(d, 4, NULL, "Configuration of the three arms");
  if (!s->ncfg) {
    qc_doc_p(d);
    qc_doc_text(d, "The report holds no config diff.");
  } else {
    qc_doc_table(d, "l:controlled variable|l:under_test|l:gradient_reference|l:native_baseline|l:differs|l:expected");
    for (int i = 0; i < s->ncfg; i++) {
      const qc_ev_cfg *c = &s->cfg[i];
      qc_doc_tr(d);
      qc_doc_td_code(d, c->key);
      for (int a = 0; a < 3; a++) qc_doc_td(d, "%s", c->v[a][0] ? c->v[a] : "-");
      if (c->differs && !c->expected) qc_doc_td_verdict(d, "differs, not expected");
      else qc_doc_td(d, "%s", c->differs ? "yes" : "no");
      qc_doc_td(d, "%s", c->expected ? "yes" : "no");
    }
    qc_doc_table_end(d);
  }
  for (int i = 0; i < s->npair; i++) {
    const qc_ev_pair *p = &s->pair[i];
    qc_doc_h(d, 4, NULL, "%s vs %s", p->a, p->b);
    qc_doc_p(d);
    qc_doc_verdict(d, p->verdict[0] ? p->verdict : "-");
    if (p->has_first) qc_doc_text(d, "; first deviation at %s %g (%s, %s)", s->x[0] ? s->x : "step", p->first_x,
                                  p->first_metric, p->first_bound);
    if (p->localization[0]) {
      qc_doc_text(d, "; localization ");
      qc_doc_strong(d, "%s", p->localization);
      qc_doc_text(d, ": %s", loc_advice(p->localization));
    }
    qc_doc_text(d, ".");
    if (p->n) {
      qc_doc_table(d, "l:metric|l:window|l:verdict|r:mean diff|r:max rel|r:first failure|l:why");
      for (int k = 0; k < p->n; k++) {
        const qc_ev_sftcheck *m = &p->m[k];
        qc_doc_tr(d);
        qc_doc_td_code(d, m->metric);
        qc_doc_td(d, "%s", m->window[0] ? m->window : "the case's");
        qc_doc_td_verdict(d, m->verdict[0] ? m->verdict : "-");
        qc_doc_td_num(d, m->mean_diff, 4);
        qc_doc_td_num(d, m->max_rel, 4);
        if (m->has_fail) qc_doc_td(d, "%g", m->fail_x);
        else qc_doc_td(d, "-");
        qc_doc_td(d, "%s", m->why);
      }
      qc_doc_table_end(d);
    }
    for (int k = 0; k < p->n; k++) {
      plots += p->m[k].nser > 0;
      metric_plot(d, p, &p->m[k], s->x);
    }
  }
  curves_plots(d, s);
  if (!plots) {
    qc_doc_p(d);
    qc_doc_text(d, "This sft report holds no curve data (\"series\" per pair metric, or \"curves\"): the curves are in "
                   "the sft run's own Markdown report.");
  }
  qc_doc_end_block(d);
}

void qc_audit_l3(qc_doc *d, const qc_evidence *e) {
  qc_doc_h(d, 2, "layer3", "Layer 3: proxy SFT, three arms");
  if (!e->nsft) {
    qc_doc_p(d);
    qc_doc_strong(d, "Not run: no sft report among the inputs.");
    qc_doc_text(d, " Layers 1 and 2 do not show whether the whole training chain is biased; the three-arm SFT does.");
    qc_doc_end_block(d);
    return;
  }
  qc_doc_p(d);
  qc_doc_text(d, "The arm under test (aligned inference numerics, production backward), the gradient reference (the same "
                 "forward, an independent backward) and the native baseline, with the same data and hyperparameters; "
                 "verdicts within the declared window only.");
  for (int i = 0; i < e->nsft; i++) one_sft(d, e, &e->sft[i], i);
}

void qc_audit_step(qc_doc *d, const qc_evidence *e) {
  int nsrc = 0, failed = 0;
  for (int i = 0; i < e->nsrc; i++) nsrc += strcmp(e->src[i].verb, "step") == 0;
  qc_doc_h(d, 2, "step", "One-step update");
  qc_doc_p(d);
  if (!nsrc) {
    qc_doc_strong(d, "Not run: no step report among the inputs.");
    qc_doc_end_block(d);
    return;
  }
  for (int i = 0; i < e->nstep; i++) failed += strcmp(e->step[i].verdict, "fail") == 0;
  qc_doc_text(d, "%d check(s) from %d step report(s), %d failed: each arm's update (after - before) against the float64 "
                 "recomputation of the optimizer step, and the arms against each other.", e->nstep, nsrc, failed);
  if (e->step_notes[0]) {
    qc_doc_p(d);
    qc_doc_text(d, "%s", e->step_notes);
  }
  if (e->nstep) {
    qc_doc_table(d, "l:arm|l:parameter|l:kind|l:verdict|r:rel_l2|r:cosine|r:norm ratio|r:max_abs|l:why");
    for (int i = 0; i < e->nstep; i++) {
      const qc_ev_step *s = &e->step[i];
      qc_doc_tr(d);
      qc_doc_td(d, "%s", s->arm);
      qc_doc_td_code(d, s->param);
      qc_doc_td(d, "%s", s->kind);
      qc_doc_td_verdict(d, s->verdict[0] ? s->verdict : "-");
      qc_doc_td_num(d, s->rel_l2, 4);
      qc_doc_td_num(d, s->cosine, 9);
      qc_doc_td_num(d, s->norm_ratio, 7);
      qc_doc_td_num(d, s->max_abs, 4);
      qc_doc_td(d, "%s", s->why);
    }
    qc_doc_table_end(d);
  }
  qc_doc_end_block(d);
}
