/* svg.h: plots as inline SVG, written by qatcheck itself (no plotting
 * dependency at run time): curves and point clouds over one x axis, with
 * the bounds a verdict used drawn on top. Self-contained markup (no
 * scripts, no external fonts or styles), so it reads the same inline in
 * HTML, as a file, or on paper.
 *
 *   qc_svg_plot p = {.title = "loss", .xlabel = "step", .ylabel = "loss"};
 *   qc_svg_series s[2] = {{.label = "under_test", .x = xs, .y = a, .n = n},
 *                         {.label = "native_baseline", .x = xs, .y = b, .n = n, .dashed = 1}};
 *   p.series = s; p.nseries = 2;
 *   qc_svg_vline(&p, 37, "first deviation", NULL);
 *   qc_svg_render(&p, &buf);
 */
#ifndef QC_SVG_H
#define QC_SVG_H

#include "report/sbuf.h"

#define QC_SVG_MAXMARK 8

/* LINE, POINTS (dots), LINE_POINTS, TICKS (a short horizontal dash at each
 * point: a per-point bound drawn beside the points it bounds). */
typedef enum { QC_SVG_LINE = 0, QC_SVG_POINTS = 1, QC_SVG_LINE_POINTS = 2, QC_SVG_TICKS = 3 } qc_svg_style;

/* One series. A NaN or infinite y (or x) leaves a gap in a line. */
typedef struct qc_svg_series {
  const char *label;
  const double *x, *y;       /* [n] (x NULL: 0 .. n-1) */
  int n;
  const char *color;         /* NULL: the palette's next colour */
  int dashed;
  qc_svg_style style;
  double radius;             /* of a point (0: 2.5 px); a larger one marks, e.g. an outlier */
} qc_svg_series;

/* A horizontal line at y (a bound), or a vertical one at x (an event). */
typedef struct qc_svg_mark {
  double at;
  const char *label;
  const char *color;         /* NULL: grey for hlines, red for vlines */
} qc_svg_mark;

typedef struct qc_svg_plot {
  const char *title, *xlabel, *ylabel;
  int width, height;         /* pixels; 0: 640 x 300 */
  int logy;                  /* log10 y axis (values <= 0 are left out) */
  int int_x;                 /* x is a count (a layer index): ticks on whole numbers only */
  const qc_svg_series *series;
  int nseries;
  /* a shaded band lo[i] .. hi[i] along band_x (a bound around a curve) */
  const double *band_x, *band_lo, *band_hi;
  int band_n;
  const char *band_label;
  qc_svg_mark hline[QC_SVG_MAXMARK], vline[QC_SVG_MAXMARK];
  int nh, nv;
  int has_ylim;              /* fix the y range instead of fitting the data */
  double ymin, ymax;
} qc_svg_plot;

/* Add a horizontal (bound) or vertical (event) line; ignored past QC_SVG_MAXMARK. */
void qc_svg_hline(qc_svg_plot *p, double y, const char *label, const char *color);
void qc_svg_vline(qc_svg_plot *p, double x, const char *label, const char *color);

/* Append the <svg> element to out. An empty plot (no finite point) draws
 * its frame and says "no data". Returns QC_OK, or QC_ESYS out of memory. */
int qc_svg_render(const qc_svg_plot *p, qc_sbuf *out);

#endif
