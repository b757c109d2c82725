/* svg.c: line and point plots as SVG (see svg.h). */
#include "report/svg.h"

#include <math.h>
#include <stdio.h>
#include <string.h>

#include "core/qc.h"

static const char *const g_palette[] = {"#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e", "#17becf", "#8c564b", "#7f7f7f"};

void qc_svg_hline(qc_svg_plot *p, double y, const char *label, const char *color) {
  if (p->nh >= QC_SVG_MAXMARK) return;
  p->hline[p->nh++] = (qc_svg_mark){y, label, color};
}

void qc_svg_vline(qc_svg_plot *p, double x, const char *label, const char *color) {
  if (p->nv >= QC_SVG_MAXMARK) return;
  p->vline[p->nv++] = (qc_svg_mark){x, label, color};
}

/* The value plotted for y (log10 on a log axis; NAN when it cannot be). */
static double ty(const qc_svg_plot *p, double y) {
  if (!isfinite(y)) return NAN;
  if (p->logy) return y > 0 ? log10(y) : NAN;
  return y;
}

static double sx(const qc_svg_series *s, int i) { return s->x ? s->x[i] : (double)i; }

/* A step of 1, 2 or 5 times a power of ten giving about `want` ticks. */
static double nice_step(double span, int want) {
  if (!(span > 0)) return 1;
  double raw = span / want, p = pow(10, floor(log10(raw))), f = raw / p;
  return (f < 1.5 ? 1 : f < 3.5 ? 2 : f < 7.5 ? 5 : 10) * p;
}

/* A number for a tick label: short, no trailing zeros. */
static void fmt_tick(char *buf, size_t n, double v, double step) {
  if (v == 0 || (fabs(v) >= 1e-3 && fabs(v) < 1e6)) {
    double dd = step >= 1 ? 0 : ceil(-log10(step) - 1e-9); /* inf for a step that underflowed to 0 */
    int dec = dd > 8 || dd != dd ? 8 : dd < 0 ? 0 : (int)dd;
    snprintf(buf, n, "%.*f", dec, v);
  } else {
    snprintf(buf, n, "%.3g", v);
  }
}

static void text(qc_sbuf *b, double x, double y, const char *anchor, const char *extra, const char *s) {
  qc_sbuf_printf(b, "<text x=\"%.1f\" y=\"%.1f\" text-anchor=\"%s\"%s%s>", x, y, anchor, extra ? " " : "", extra ? extra : "");
  qc_sbuf_xml(b, s ? s : "");
  qc_sbuf_printf(b, "</text>\n");
}

int qc_svg_render(const qc_svg_plot *p, qc_sbuf *b) {
  const int W = p->width > 0 ? p->width : 640, H = p->height > 0 ? p->height : 300;
  const double L = 70, R = 16, T = p->title ? 28 : 12, B = 44;
  const double pw = W - L - R, ph = H - T - B;
  /* the data range, bounds and marks included (so a bound is never off the plot) */
  double x0 = INFINITY, x1 = -INFINITY, y0 = INFINITY, y1 = -INFINITY;
  for (int k = 0; k < p->nseries; k++)
    for (int i = 0; i < p->series[k].n; i++) {
      double x = sx(&p->series[k], i), y = ty(p, p->series[k].y[i]);
      if (!isfinite(x) || !isfinite(y)) continue;
      x0 = fmin(x0, x); x1 = fmax(x1, x);
      y0 = fmin(y0, y); y1 = fmax(y1, y);
    }
  for (int i = 0; i < p->band_n; i++) {
    double x = p->band_x[i], lo = ty(p, p->band_lo[i]), hi = ty(p, p->band_hi[i]);
    if (!isfinite(x)) continue;
    if (isfinite(lo)) { y0 = fmin(y0, lo); y1 = fmax(y1, lo); }
    if (isfinite(hi)) { y0 = fmin(y0, hi); y1 = fmax(y1, hi); }
  }
  for (int i = 0; i < p->nh; i++) {
    double y = ty(p, p->hline[i].at);
    if (isfinite(y)) { y0 = fmin(y0, y); y1 = fmax(y1, y); }
  }
  for (int i = 0; i < p->nv; i++)
    if (isfinite(p->vline[i].at)) { x0 = fmin(x0, p->vline[i].at); x1 = fmax(x1, p->vline[i].at); }
  if (p->has_ylim) { y0 = ty(p, p->ymin); y1 = ty(p, p->ymax); }
  int empty = !(isfinite(x0) && isfinite(y0) && isfinite(x1) && isfinite(y1));
  if (empty) { x0 = 0; x1 = 1; y0 = 0; y1 = 1; }
  if (x1 == x0) { x0 -= 0.5; x1 += 0.5; }
  if (y1 == y0) { double d = y0 != 0 ? fabs(y0) * 0.05 : 0.5; y0 -= d; y1 += d; }
  double pad = (y1 - y0) * 0.05;
  y0 -= pad; y1 += pad;
#define PX(x) (L + ((x) - x0) / (x1 - x0) * pw)
#define PY(y) (T + ph - ((y) - y0) / (y1 - y0) * ph)
  qc_sbuf_printf(b, "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"%d\" height=\"%d\" viewBox=\"0 0 %d %d\" "
                    "font-family=\"sans-serif\" font-size=\"11\" role=\"img\">\n", W, H, W, H);
  if (p->title) {
    qc_sbuf_printf(b, "<title>");
    qc_sbuf_xml(b, p->title);
    qc_sbuf_printf(b, "</title>\n");
  }
  qc_sbuf_printf(b, "<rect x=\"0\" y=\"0\" width=\"%d\" height=\"%d\" fill=\"#ffffff\"/>\n", W, H);
  if (p->title) text(b, W / 2.0, 17, "middle", "font-size=\"13\" font-weight=\"bold\"", p->title);
  /* grid and ticks */
  double xs = nice_step(x1 - x0, 6), ys = nice_step(y1 - y0, 5);
  if (p->int_x && xs < 1) xs = 1; /* no tick between two layers */
  char tb[48];
  for (double v = ceil(x0 / xs) * xs; v <= x1 + xs * 1e-9; v += xs) {
    double X = PX(v);
    qc_sbuf_printf(b, "<line x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\" stroke=\"#e5e5e5\"/>\n", X, T, X, T + ph);
    fmt_tick(tb, sizeof tb, fabs(v) < xs * 1e-9 ? 0 : v, xs);
    text(b, X, T + ph + 14, "middle", NULL, tb);
  }
  for (double v = ceil(y0 / ys) * ys; v <= y1 + ys * 1e-9; v += ys) {
    double Y = PY(v);
    qc_sbuf_printf(b, "<line x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\" stroke=\"#e5e5e5\"/>\n", L, Y, L + pw, Y);
    if (p->logy) snprintf(tb, sizeof tb, "%.3g", pow(10, v));
    else fmt_tick(tb, sizeof tb, fabs(v) < ys * 1e-9 ? 0 : v, ys);
    text(b, L - 5, Y + 4, "end", NULL, tb);
  }
  qc_sbuf_printf(b, "<rect x=\"%.1f\" y=\"%.1f\" width=\"%.1f\" height=\"%.1f\" fill=\"none\" stroke=\"#333333\"/>\n", L, T, pw, ph);
  if (p->xlabel) text(b, L + pw / 2, H - 8, "middle", NULL, p->xlabel);
  if (p->ylabel) {
    qc_sbuf_printf(b, "<text x=\"14\" y=\"%.1f\" text-anchor=\"middle\" transform=\"rotate(-90 14 %.1f)\">", T + ph / 2, T + ph / 2);
    qc_sbuf_xml(b, p->ylabel);
    qc_sbuf_printf(b, "%s</text>\n", p->logy ? " (log)" : "");
  }
  if (empty) text(b, L + pw / 2, T + ph / 2, "middle", "fill=\"#777777\"", "no data");
  /* clip ids count up per process: unique within a document, and the
   * same in every run that draws the same plots in the same order */
  static int g_clip;
  int clip = ++g_clip;
  qc_sbuf_printf(b, "<clipPath id=\"qc-clip-%d\"><rect x=\"%.1f\" y=\"%.1f\" width=\"%.1f\" height=\"%.1f\"/></clipPath>\n",
                 clip, L, T, pw, ph);
  qc_sbuf_printf(b, "<g clip-path=\"url(#qc-clip-%d)\">\n", clip);
  /* the band: one polygon per run of finite points */
  for (int i = 0; i < p->band_n;) {
    while (i < p->band_n && !(isfinite(p->band_x[i]) && isfinite(ty(p, p->band_lo[i])) && isfinite(ty(p, p->band_hi[i])))) i++;
    int j = i;
    while (j < p->band_n && isfinite(p->band_x[j]) && isfinite(ty(p, p->band_lo[j])) && isfinite(ty(p, p->band_hi[j]))) j++;
    if (j > i) {
      qc_sbuf_printf(b, "<polygon fill=\"#f2b6b6\" fill-opacity=\"0.45\" stroke=\"none\" points=\"");
      for (int k = i; k < j; k++) qc_sbuf_printf(b, "%.1f,%.1f ", PX(p->band_x[k]), PY(ty(p, p->band_hi[k])));
      for (int k = j - 1; k >= i; k--) qc_sbuf_printf(b, "%.1f,%.1f ", PX(p->band_x[k]), PY(ty(p, p->band_lo[k])));
      qc_sbuf_printf(b, "\"/>\n");
    }
    i = j;
  }
  for (int i = 0; i < p->nh; i++) {
    double y = ty(p, p->hline[i].at);
    if (!isfinite(y)) continue;
    qc_sbuf_printf(b, "<line x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\" stroke=\"%s\" stroke-dasharray=\"6 3\"/>\n", L,
                   PY(y), L + pw, PY(y), p->hline[i].color ? p->hline[i].color : "#555555");
  }
  for (int k = 0; k < p->nseries; k++) {
    const qc_svg_series *s = &p->series[k];
    const char *col = s->color ? s->color : g_palette[k % 8];
    if (s->style == QC_SVG_TICKS) {
      for (int i = 0; i < s->n; i++) {
        double x = sx(s, i), y = ty(p, s->y[i]);
        if (isfinite(x) && isfinite(y))
          qc_sbuf_printf(b, "<line x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\" stroke=\"%s\" stroke-width=\"1.5\"/>\n",
                         PX(x) - 4, PY(y), PX(x) + 4, PY(y), col);
      }
      continue;
    }
    if (s->style != QC_SVG_POINTS) {
      int open = 0;
      for (int i = 0; i < s->n; i++) {
        double x = sx(s, i), y = ty(p, s->y[i]);
        if (!isfinite(x) || !isfinite(y)) {
          if (open) qc_sbuf_printf(b, "\"/>\n");
          open = 0;
          continue;
        }
        if (!open)
          qc_sbuf_printf(b, "<polyline fill=\"none\" stroke=\"%s\" stroke-width=\"1.5\"%s points=\"", col,
                         s->dashed ? " stroke-dasharray=\"5 3\"" : "");
        open = 1;
        qc_sbuf_printf(b, "%.1f,%.1f ", PX(x), PY(y));
      }
      if (open) qc_sbuf_printf(b, "\"/>\n");
    }
    if (s->style != QC_SVG_LINE)
      for (int i = 0; i < s->n; i++) {
        double x = sx(s, i), y = ty(p, s->y[i]);
        if (isfinite(x) && isfinite(y))
          qc_sbuf_printf(b, "<circle cx=\"%.1f\" cy=\"%.1f\" r=\"%.1f\" fill=\"%s\"%s/>\n", PX(x), PY(y),
                         s->radius > 0 ? s->radius : 2.5, col, s->radius > 2.5 ? " fill-opacity=\"0.8\"" : "");
      }
  }
  for (int i = 0; i < p->nv; i++) {
    double x = p->vline[i].at;
    if (!isfinite(x)) continue;
    qc_sbuf_printf(b, "<line x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\" stroke=\"%s\" stroke-width=\"1.5\"/>\n", PX(x), T,
                   PX(x), T + ph, p->vline[i].color ? p->vline[i].color : "#d62728");
  }
  qc_sbuf_printf(b, "</g>\n");
  /* labels of the marks, then the legend (series, band, bounds, events) */
  for (int i = 0; i < p->nv; i++)
    if (isfinite(p->vline[i].at) && p->vline[i].label) {
      char extra[64];
      snprintf(extra, sizeof extra, "fill=\"%s\"", p->vline[i].color ? p->vline[i].color : "#d62728");
      text(b, PX(p->vline[i].at) + 3, T + 12 + 12 * i, "start", extra, p->vline[i].label);
    }
  double ly = T + 12;
  int nleg = p->nseries + (p->band_n && p->band_label ? 1 : 0);
  size_t lmax = 0; /* the legend is as wide as its longest label (at most half the plot) */
  for (int k = 0; k < p->nseries; k++)
    if (p->series[k].label && strlen(p->series[k].label) > lmax) lmax = strlen(p->series[k].label);
  for (int i = 0; i < p->nh; i++) {
    int on = isfinite(ty(p, p->hline[i].at)) && p->hline[i].label;
    nleg += on;
    if (on && strlen(p->hline[i].label) > lmax) lmax = strlen(p->hline[i].label);
  }
  if (p->band_n && p->band_label && strlen(p->band_label) > lmax) lmax = strlen(p->band_label);
  double LW = fmin(fmax(150, 26 + 6.3 * (double)lmax), pw / 2);
  if (nleg) /* a light background keeps the legend readable over the data */
    qc_sbuf_printf(b, "<rect x=\"%.1f\" y=\"%.1f\" width=\"%.1f\" height=\"%d\" fill=\"#ffffff\" fill-opacity=\"0.8\"/>\n",
                   L + pw - LW - 4, T + 2, LW, 13 * nleg + 4);
  for (int k = 0; k < p->nseries; k++) {
    const qc_svg_series *s = &p->series[k];
    const char *col = s->color ? s->color : g_palette[k % 8];
    double X = L + pw - LW;
    if (s->style == QC_SVG_POINTS)
      qc_sbuf_printf(b, "<circle cx=\"%.1f\" cy=\"%.1f\" r=\"%.1f\" fill=\"%s\"/>\n", X + 9, ly - 4,
                     s->radius > 0 ? s->radius : 2.5, col);
    else
      qc_sbuf_printf(b, "<line x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\" stroke=\"%s\" stroke-width=\"2\"%s/>\n",
                     s->style == QC_SVG_TICKS ? X + 5 : X, ly - 4, s->style == QC_SVG_TICKS ? X + 13 : X + 18, ly - 4, col,
                     s->dashed ? " stroke-dasharray=\"5 3\"" : "");
    text(b, X + 22, ly, "start", NULL, s->label ? s->label : "");
    ly += 13;
  }
  if (p->band_n && p->band_label) {
    double X = L + pw - LW;
    qc_sbuf_printf(b, "<rect x=\"%.1f\" y=\"%.1f\" width=\"18\" height=\"8\" fill=\"#f2b6b6\"/>\n", X, ly - 8);
    text(b, X + 22, ly, "start", NULL, p->band_label);
    ly += 13;
  }
  for (int i = 0; i < p->nh; i++)
    if (isfinite(ty(p, p->hline[i].at)) && p->hline[i].label) {
      double X = L + pw - LW;
      qc_sbuf_printf(b, "<line x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\" stroke=\"%s\" stroke-dasharray=\"6 3\"/>\n", X,
                     ly - 4, X + 18, ly - 4, p->hline[i].color ? p->hline[i].color : "#555555");
      text(b, X + 22, ly, "start", NULL, p->hline[i].label);
      ly += 13;
    }
  qc_sbuf_printf(b, "</svg>\n");
#undef PX
#undef PY
  return b->oom ? qc_err_sys("out of memory drawing a plot") : QC_OK;
}
