/* test_svg.c: the SVG plot writer: well-formed markup (checked by the
 * parser of the e2e test as well), gaps at non-finite values, bounds,
 * bands and events drawn, labels escaped, an empty plot framed. */
#include <criterion/criterion.h>
#include <math.h>
#include <string.h>

#include "core/qc.h"
#include "report/svg.h"

static int count(const char *s, const char *needle) {
  int n = 0;
  for (const char *p = strstr(s, needle); p; p = strstr(p + 1, needle)) n++;
  return n;
}

Test(svg, curves_gaps_bounds_and_events) {
  double x[6] = {1, 2, 3, 4, 5, 6}, a[6] = {1.0, 0.9, NAN, 0.7, 0.65, 0.6}, b[6] = {1.0, 0.91, 0.8, 0.71, 0.66, 0.62};
  qc_svg_series s[2] = {{.label = "under_test", .x = x, .y = a, .n = 6},
                        {.label = "native <baseline> & co", .x = x, .y = b, .n = 6, .dashed = 1, .style = QC_SVG_LINE_POINTS}};
  qc_svg_plot p = {.title = "loss", .xlabel = "step", .ylabel = "loss", .series = s, .nseries = 2};
  double lo[6], hi[6];
  for (int i = 0; i < 6; i++) { lo[i] = b[i] * 0.99; hi[i] = b[i] * 1.01; }
  p.band_x = x; p.band_lo = lo; p.band_hi = hi; p.band_n = 6; p.band_label = "pointwise_rel 0.01";
  qc_svg_hline(&p, 0.5, "floor", NULL);
  qc_svg_vline(&p, 4, "first deviation", NULL);
  qc_sbuf out = {0};
  cr_assert_eq(qc_svg_render(&p, &out), QC_OK);
  const char *t = out.s;
  cr_expect(strncmp(t, "<svg xmlns=\"http://www.w3.org/2000/svg\"", 39) == 0);
  cr_expect(strstr(t, "</svg>\n") != NULL);
  cr_expect_eq(count(t, "<polyline"), 3, "the NaN splits the first curve in two; the second is one line");
  cr_expect_eq(count(t, "<circle"), 6, "points of the second series");
  cr_expect_eq(count(t, "<polygon"), 1, "the band");
  cr_expect(strstr(t, "native &lt;baseline&gt; &amp; co") != NULL, "labels are escaped");
  cr_expect(strstr(t, "first deviation") && strstr(t, "floor") && strstr(t, "pointwise_rel 0.01"));
  cr_expect(strstr(t, "<script") == NULL && strstr(t, "href") == NULL, "self-contained");
  qc_sbuf_free(&out);
}

Test(svg, empty_and_log_plots) {
  qc_svg_plot p = {.title = "nothing"};
  qc_sbuf out = {0};
  cr_assert_eq(qc_svg_render(&p, &out), QC_OK);
  cr_expect(strstr(out.s, "no data") != NULL);
  qc_sbuf_free(&out);
  double y[4] = {1e-3, 0, 2e-2, 5e-1};
  qc_svg_series s = {.label = "noise multiple", .y = y, .n = 4, .style = QC_SVG_POINTS};
  qc_svg_plot q = {.series = &s, .nseries = 1, .logy = 1};
  qc_svg_hline(&q, 1.25, "bound", "#d62728");
  qc_sbuf o2 = {0};
  cr_assert_eq(qc_svg_render(&q, &o2), QC_OK);
  cr_expect_eq(count(o2.s, "<circle"), 4, "three points (a zero is left out on a log axis) and the legend's marker");
  cr_expect(strstr(o2.s, "(log)") == NULL, "no y label, no (log) suffix");
  qc_sbuf_free(&o2);
}

Test(svg, ticks_radius_and_a_wide_legend) {
  double x[3] = {0, 1, 2}, y[3] = {1, 2, 3}, b[3] = {1.5, 1.5, 4};
  qc_svg_series s[2] = {{.label = "a label far longer than the default legend is wide", .x = x, .y = y, .n = 3,
                         .style = QC_SVG_POINTS, .radius = 5.5},
                        {.label = "bound", .x = x, .y = b, .n = 3, .style = QC_SVG_TICKS}};
  qc_svg_plot p = {.series = s, .nseries = 2};
  qc_sbuf out = {0};
  cr_assert_eq(qc_svg_render(&p, &out), QC_OK);
  cr_expect_eq(count(out.s, "r=\"5.5\""), 4, "three marked points and the legend's");
  cr_expect(strstr(out.s, "width=\"150\"") == NULL, "the legend grows with its longest label");
  qc_sbuf_free(&out);
}

/* A plot against the layer (int_x): ticks on whole layers only, never 0.2. */
Test(svg, integer_x_ticks) {
  double x[3] = {0, 1, 2}, y[3] = {0.99, 0.98, 0.995};
  qc_svg_series s = {.label = "cosine", .x = x, .y = y, .n = 3};
  qc_svg_plot p = {.title = "t", .xlabel = "layer", .series = &s, .nseries = 1, .int_x = 1};
  qc_sbuf out = {0};
  cr_assert_eq(qc_svg_render(&p, &out), QC_OK);
  cr_expect(strstr(out.s, ">0.2<") == NULL && strstr(out.s, ">1.5<") == NULL && strstr(out.s, ">1.2<") == NULL, "a tick between layers");
  cr_expect(strstr(out.s, ">1<") != NULL && strstr(out.s, ">2<") != NULL, "the layers are ticked");
  qc_sbuf_free(&out);
  p.int_x = 0;
  cr_assert_eq(qc_svg_render(&p, &out), QC_OK);
  cr_expect(strstr(out.s, ">0.2<") != NULL, "without int_x the default ticks (the test would not see a change otherwise)");
  qc_sbuf_free(&out);
}
