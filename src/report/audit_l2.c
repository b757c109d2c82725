/* audit_l2.c: layer 2 in the audit document: per contract report, the
 * class table (cosine and norm ratio of dX from the dequantized weight
 * against dX from the master weight), cosine and norm ratio per layer for
 * each class with the outliers marked (plots and a table), the outliers and
 * failed rows by name. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/qc.h"
#include "report/audit.h"
#include "report/svg.h"

/* One (class, tensor, formats, layer) cell: its rows summed up. */
typedef struct l2_cell {
  const char *cls, *tensor, *wfmt, *afmt;
  int layer, rows, outliers, fails;
  double cos_min, nr_far, rel_max;   /* the worst of its rows: lowest cosine, norm ratio farthest from 1 */
} l2_cell;

static const qc_sweep *g_sort_s; /* qsort has no context argument */

static int row_cmp(const void *a, const void *b) {
  const qc_crow *x = &g_sort_s->rows[*(const int *)a], *y = &g_sort_s->rows[*(const int *)b];
  int c;
  if ((c = strcmp(x->tensor, y->tensor)) || (c = strcmp(x->wfmt, y->wfmt)) || (c = strcmp(x->afmt, y->afmt)) ||
      (c = strcmp(x->cls, y->cls)))
    return c;
  if (x->layer != y->layer) return x->layer < y->layer ? -1 : 1;
  return *(const int *)a - *(const int *)b;
}

/* Cells of s sorted by (tensor, formats, class, layer); *n cells; NULL out of memory. */
static l2_cell *cells(const qc_sweep *s, int *n) {
  int *ix = malloc(((size_t)s->n + 1) * sizeof *ix);
  l2_cell *c = calloc((size_t)s->n + 1, sizeof *c);
  *n = 0;
  if (!ix || !c) { free(ix); free(c); return NULL; }
  for (int i = 0; i < s->n; i++) ix[i] = i;
  g_sort_s = s;
  qsort(ix, (size_t)s->n, sizeof *ix, row_cmp);
  for (int k = 0; k < s->n; k++) {
    const qc_crow *r = &s->rows[ix[k]];
    l2_cell *z = *n ? &c[*n - 1] : NULL;
    if (!z || strcmp(z->cls, r->cls) || strcmp(z->tensor, r->tensor) || strcmp(z->wfmt, r->wfmt) ||
        strcmp(z->afmt, r->afmt) || z->layer != r->layer) {
      z = &c[(*n)++];
      *z = (l2_cell){r->cls, r->tensor, r->wfmt, r->afmt, r->layer, 0, 0, 0, NAN, NAN, NAN};
    }
    z->rows++;
    z->outliers += r->outlier;
    z->fails += r->fail;
    if (!r->m.cosine_null && isfinite(r->m.cosine) && !(r->m.cosine >= z->cos_min)) z->cos_min = r->m.cosine;
    if (isfinite(r->m.norm_ratio) && !(fabs(r->m.norm_ratio - 1) <= fabs(z->nr_far - 1))) z->nr_far = r->m.norm_ratio;
    if (isfinite(r->m.rel_l2) && !(r->m.rel_l2 <= z->rel_max)) z->rel_max = r->m.rel_l2;
  }
  free(ix);
  return c;
}

static int same_combo(const l2_cell *a, const l2_cell *b) {
  return !strcmp(a->tensor, b->tensor) && !strcmp(a->wfmt, b->wfmt) && !strcmp(a->afmt, b->afmt);
}

/* Two plots (cosine, norm ratio against the layer) for the combo of cells [a, b). */
static void combo_plots(qc_doc *d, const qc_sweep *s, const l2_cell *c, int a, int b) {
  enum { MAXS = 24 };
  qc_svg_series ser[MAXS + 1];
  double *xs[MAXS], *ys[MAXS], *ox = NULL, *oy = NULL;
  int ns = 0, no = 0;
  memset(xs, 0, sizeof xs);
  memset(ys, 0, sizeof ys);
  /* the legend names classes by what follows their common prefix ("/model.layers.*.") */
  int f = a;
  while (f < b && c[f].layer < 0) f++;
  size_t prefix = f < b ? strlen(c[f].cls) : 0;
  for (int k = f + 1; k < b; k++) {
    size_t p = 0;
    while (p < prefix && c[k].layer >= 0 && c[k].cls[p] == c[f].cls[p]) p++;
    if (c[k].layer >= 0) prefix = p;
  }
  while (prefix > 0 && c[f].cls[prefix - 1] != '.' && c[f].cls[prefix - 1] != '/') prefix--;
  const char *pname = f < b ? c[f].cls : "";
  for (int metric = 0; metric < 2; metric++) {
    qc_sbuf svg = {0};
    ns = no = 0;
    for (int k = a; k < b;) {
      int e = k;
      while (e < b && !strcmp(c[e].cls, c[k].cls)) e++;
      if (ns < MAXS && (xs[ns] = malloc((size_t)(e - k) * sizeof(double))) && (ys[ns] = malloc((size_t)(e - k) * sizeof(double)))) {
        int m = 0;
        for (int j = k; j < e; j++) {
          if (c[j].layer < 0) continue;
          xs[ns][m] = c[j].layer;
          ys[ns][m++] = metric == 0 ? c[j].cos_min : c[j].nr_far;
        }
        if (m) {
          ser[ns] = (qc_svg_series){.label = c[k].cls + prefix, .x = xs[ns], .y = ys[ns], .n = m, .style = QC_SVG_LINE_POINTS};
          ns++;
        } else {
          free(xs[ns]);
          free(ys[ns]);
          xs[ns] = ys[ns] = NULL;
        }
      }
      k = e;
    }
    /* the outlier rows, marked on top */
    ox = malloc(((size_t)s->n + 1) * sizeof *ox);
    oy = malloc(((size_t)s->n + 1) * sizeof *oy);
    for (int i = 0; ox && oy && i < s->n; i++) {
      const qc_crow *r = &s->rows[i];
      if (!r->outlier || r->layer < 0 || strcmp(r->tensor, c[a].tensor) || strcmp(r->wfmt, c[a].wfmt) || strcmp(r->afmt, c[a].afmt))
        continue;
      ox[no] = r->layer;
      oy[no++] = metric == 0 ? r->m.cosine : r->m.norm_ratio;
    }
    if (no) ser[ns++] = (qc_svg_series){.label = "outlier row", .x = ox, .y = oy, .n = no, .color = "#d62728",
                                        .style = QC_SVG_POINTS, .radius = 5.5};
    char title[200], cap[400];
    snprintf(title, sizeof title, "%s per layer: %s, weight %s, activation %s", metric == 0 ? "cosine" : "norm ratio",
             c[a].tensor, c[a].wfmt, c[a].afmt);
    qc_svg_plot p = {.title = title, .xlabel = "layer", .int_x = 1, .ylabel = metric == 0 ? "cosine (lowest row)" : "norm ratio (farthest row)",
                     .width = 900, .height = 320, .series = ser, .nseries = ns};
    if (metric == 1) qc_svg_hline(&p, 1.0, "norm ratio 1", NULL);
    snprintf(cap, sizeof cap, "%s of dX from the dequantized weight against dX from the master weight, per layer and "
             "class (a layer with several rows, experts or dYs, shows its %s); red: outlier rows. Classes are named by what "
             "follows '%.*s'; those without a layer index are in the tables only.", metric == 0 ? "Cosine" : "Norm ratio",
             metric == 0 ? "lowest cosine" : "norm ratio farthest from 1", (int)prefix, pname);
    if (qc_svg_render(&p, &svg) == QC_OK) qc_doc_figure(d, &svg, cap);
    qc_sbuf_free(&svg);
    for (int k = 0; k < MAXS; k++) {
      free(xs[k]);
      free(ys[k]);
      xs[k] = ys[k] = NULL;
    }
    free(ox);
    free(oy);
    ox = oy = NULL;
  }
}

static void rows_list(qc_doc *d, const qc_sweep *s, int outliers) {
  int any = 0;
  for (int i = 0; i < s->n; i++) {
    const qc_crow *r = &s->rows[i];
    if (outliers ? !r->outlier : !r->fail) continue;
    any = 1;
    qc_doc_li(d);
    qc_doc_code(d, r->module);
    qc_doc_text(d, " %s, weight %s, activation %s, dY %s: cosine %.6f, norm ratio %.6f, rel_l2 %.3g: %s", r->tensor, r->wfmt,
                r->afmt, r->dy, r->m.cosine, r->m.norm_ratio, r->m.rel_l2, outliers ? r->outlier_why : r->why);
  }
  if (!any) {
    qc_doc_p(d);
    qc_doc_text(d, "None.");
  }
  qc_doc_end_block(d);
}

static void one_report(qc_doc *d, const qc_evidence *e, const qc_ev_l2 *l, int idx) {
  const qc_sweep *s = &l->s;
  int fails = 0, outl = 0, nc = 0;
  for (int i = 0; i < s->n; i++) {
    fails += s->rows[i].fail;
    outl += s->rows[i].outlier;
  }
  qc_doc_h(d, 3, NULL, "Contract report %d: %s", idx + 1, e->src[l->src].title[0] ? e->src[l->src].title : e->src[l->src].path);
  qc_doc_p(d);
  qc_doc_verdict(d, fails ? "FAIL" : "pass");
  qc_doc_text(d, ": %d row(s), %d crossed a threshold (%s), %d outlier(s). %s. Report: ", s->n, fails, l->thresholds, outl,
              l->formats);
  qc_doc_code(d, e->src[l->src].path);
  qc_doc_text(d, ".");
  qc_doc_h(d, 4, NULL, "Per class");
  qc_doc_table(d, "l:class|l:tensor|l:weight|l:activation|r:rows|r:layers|r:cosine min|r:median|r:norm ratio min|r:median|"
                  "r:max|r:outliers|r:failed");
  for (int i = 0; i < s->ncls; i++) {
    const qc_cclass *c = &s->cls[i];
    qc_doc_tr(d);
    qc_doc_td_code(d, c->cls);
    qc_doc_td(d, "%s", c->tensor);
    qc_doc_td(d, "%s", c->wfmt);
    qc_doc_td(d, "%s", c->afmt);
    qc_doc_td(d, "%d", c->rows);
    qc_doc_td(d, "%d", c->layers);
    qc_doc_td_num(d, c->cos_min, 7);
    qc_doc_td_num(d, c->cos_med, 7);
    qc_doc_td_num(d, c->nr_min, 7);
    qc_doc_td_num(d, c->nr_med, 7);
    qc_doc_td_num(d, c->nr_max, 7);
    qc_doc_td(d, "%d", c->outliers);
    qc_doc_td(d, "%d", c->fails);
  }
  qc_doc_table_end(d);
  l2_cell *c = cells(s, &nc);
  if (c) {
    for (int a = 0; a < nc;) {
      int b = a;
      while (b < nc && same_combo(&c[a], &c[b])) b++;
      combo_plots(d, s, c, a, b);
      a = b;
    }
    qc_doc_h(d, 4, NULL, "Per class and layer");
    qc_doc_table(d, "l:class|l:tensor|l:weight|l:activation|r:layer|r:rows|r:cosine (lowest)|r:norm ratio (farthest)|"
                    "r:rel_l2 (largest)|r:outliers|r:failed");
    for (int i = 0; i < nc; i++) {
      qc_doc_tr(d);
      qc_doc_td_code(d, c[i].cls);
      qc_doc_td(d, "%s", c[i].tensor);
      qc_doc_td(d, "%s", c[i].wfmt);
      qc_doc_td(d, "%s", c[i].afmt);
      if (c[i].layer >= 0) qc_doc_td(d, "%d", c[i].layer);
      else qc_doc_td(d, "-");
      qc_doc_td(d, "%d", c[i].rows);
      qc_doc_td_num(d, c[i].cos_min, 7);
      qc_doc_td_num(d, c[i].nr_far, 7);
      qc_doc_td_num(d, c[i].rel_max, 4);
      if (c[i].outliers) qc_doc_td_verdict(d, "outlier");
      else qc_doc_td(d, "0");
      qc_doc_td(d, "%d", c[i].fails);
    }
    qc_doc_table_end(d);
  }
  free(c);
  qc_doc_h(d, 4, NULL, "Outlier rows (%d)", outl);
  if (l->outlier_rule[0]) {
    qc_doc_p(d);
    qc_doc_text(d, "The rule: %s.", l->outlier_rule);
  }
  rows_list(d, s, 1);
  if (fails) {
    qc_doc_h(d, 4, NULL, "Rows that crossed a threshold (%d)", fails);
    rows_list(d, s, 0);
  }
}

void qc_audit_l2(qc_doc *d, const qc_evidence *e) {
  qc_doc_h(d, 2, "layer2", "Layer 2: the gradient contract, dX from the master vs the dequantized weight");
  if (!e->nl2) {
    qc_doc_p(d);
    qc_doc_strong(d, "Not run: no contract report among the inputs.");
    qc_doc_text(d, " A contract whose dX uses the master weight needs this comparison (the method makes it mandatory).");
    qc_doc_end_block(d);
    return;
  }
  qc_doc_p(d);
  qc_doc_text(d, "On a fixed checkpoint and dY, dX is computed under both conventions in float64 for every quantized "
                 "layer; cosine and norm ratio are reported per class and per layer, per precision combination, and "
                 "layers far from their class are marked as outliers.");
  for (int i = 0; i < e->nl2; i++) one_report(d, e, &e->l2[i], i);
}
