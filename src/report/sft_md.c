/* sft_md.c: the Markdown report of `qatcheck sft` (see l3report.h): the
 * arms, the config-diff table of the controlled variables, the three-arm
 * table, and per pair its verdict, first deviation, localization, checks
 * and one SVG plot per judged metric (the pair's arms overlaid, the
 * pointwise or noise bound drawn around the second arm, the first deviation
 * marked), plus a plot of the cumulative mean difference against its bound
 * where a mean or equivalence bound is declared. The plots are files
 * beside the Markdown (<stem>.<pair>.<check>.svg), committed with it. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/qc.h"
#include "report/l3report.h"
#include "report/svg.h"

#define PLOT_MAX 3000  /* points per curve; longer series are thinned */

/* Indices of at most PLOT_MAX points of n, evenly spread, the first
 * failure kept. */
static int64_t thin(int64_t n, int64_t keep, int64_t *idx) {
  if (n <= PLOT_MAX) {
    for (int64_t i = 0; i < n; i++) idx[i] = i;
    return n;
  }
  int64_t m = 0;
  for (int64_t j = 0; j < PLOT_MAX - 1; j++) {
    int64_t i = j * (n - 1) / (PLOT_MAX - 2);
    if (keep >= 0 && m > 0 && idx[m - 1] < keep && i > keep) idx[m++] = keep;
    if (m == 0 || idx[m - 1] != i) idx[m++] = i;
  }
  return m;
}

/* A file name part from a metric or arm name: [A-Za-z0-9_-], others '_'. */
static void safe(char *dst, size_t n, const char *s) {
  size_t k = 0;
  for (; *s && k + 1 < n; s++) {
    char c = *s;
    dst[k++] = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '-' || c == '_' ? c : '_';
  }
  dst[k] = 0;
}

/* Arm a's values of `metric` with x in [x0, x1], thinned to PLOT_MAX points. */
static int other_arm(const qc_sft_view *v, int a, const char *metric, double x0, double x1, double *ox, double *oy) {
  const qc_l3_log *l = &v->logs[a];
  int c = qc_l3_log_col(l, metric), xc = v->cs->x_tokens ? qc_l3_log_col(l, "tokens") : -1;
  if (c < 0 || (v->cs->x_tokens && xc < 0)) return 0;
  int64_t n = 0;
  for (int64_t i = 0; i < l->n; i++) {
    double x = xc < 0 ? (double)l->step[i] : l->col[xc].has[i] ? l->col[xc].v[i] : NAN;
    n += l->col[c].has[i] && x >= x0 && x <= x1;
  }
  int64_t stride = n > PLOT_MAX ? (n + PLOT_MAX - 1) / PLOT_MAX : 1, j = 0, k = 0;
  for (int64_t i = 0; i < l->n && k < PLOT_MAX; i++) {
    double x = xc < 0 ? (double)l->step[i] : l->col[xc].has[i] ? l->col[xc].v[i] : NAN;
    if (!(l->col[c].has[i] && x >= x0 && x <= x1)) continue;
    if (j++ % stride) continue;
    ox[k] = x;
    oy[k++] = l->col[c].v[i];
  }
  return (int)k;
}

/* The plots of check i of pair p: added to o beside the Markdown; their
 * file names (relative to the Markdown's folder) appended to md. */
static int plots(qc_report_out *o, const qc_sft_view *v, int p, int i, const char *stem_dir, const char *stem, qc_sbuf *md) {
  const qc_sft_case *cs = v->cs;
  const qc_sft_pair *pc = &cs->pairs[p];
  const qc_sft_check *k = &pc->checks[i];
  const qc_sft_check_res *c = &v->pairs[p].checks[i];
  if (!c->x || c->npoints == 0) return QC_OK;
  const char *xn = cs->x_tokens ? "tokens" : "step";
  int64_t n = c->npoints, *idx = malloc((size_t)(PLOT_MAX + 2) * sizeof *idx);
  double *buf = malloc((size_t)(PLOT_MAX + 2) * 7 * sizeof *buf), *others = NULL;
  int rc = QC_OK;
  if (!idx || !buf) { rc = qc_err_sys("out of memory drawing plots"); goto done; }
  int64_t keep = -1;
  if (c->has_fail)
    for (int64_t j = 0; j < n; j++) if (c->x[j] == c->fail_x) { keep = j; break; }
  int64_t m = thin(n, keep, idx);
  double *X = buf, *A = buf + m, *B = buf + 2 * m, *L = buf + 3 * m, *H = buf + 4 * m, *C = buf + 5 * m, *CB = buf + 6 * m;
  const qc_sft_bounds *b = &k->b;
  double sb = 0;
  for (int64_t j = 0, q = 0; j < n; j++) {
    sb += fabs(c->b[j]);
    if (q < m && idx[q] == j) {
      X[q] = c->x[j]; A[q] = c->a[j]; B[q] = c->b[j]; L[q] = c->lo[j]; H[q] = c->hi[j]; C[q] = c->cum[j];
      /* the mean bound, from the 10th point on, where it is judged */
      CB[q] = j + 1 < 10 ? NAN : (b->has_mean_abs ? b->mean_abs : 0) + (b->has_mean_rel ? b->mean_rel * sb / (double)(j + 1) : 0);
      q++;
    }
  }
  char title[400], file[QC_L3_PATH + 400], sm[QC_L3_NAME], label[96];
  safe(sm, sizeof sm, k->metric);
  qc_svg_series s[2 + QC_L3_MAXARMS] = {{.label = cs->arms[pc->a].key, .x = X, .y = A, .n = (int)m},
                                        {.label = cs->arms[pc->b].key, .x = X, .y = B, .n = (int)m, .dashed = 1}};
  snprintf(title, sizeof title, "%s: %s vs %s (%s)", k->metric, cs->arms[pc->a].key, cs->arms[pc->b].key, qc_l3_verdict_name(c->verdict));
  qc_svg_plot pl = {.title = title, .xlabel = xn, .ylabel = k->metric, .series = s, .nseries = 2};
  /* the other arms, grey, for the three-arm picture */
  others = malloc((size_t)(cs->narm ? cs->narm : 1) * 2 * (PLOT_MAX + 2) * sizeof *others);
  if (!others) { rc = qc_err_sys("out of memory drawing plots"); goto done; }
  for (int a = 0, q = 0; a < cs->narm; a++) {
    if (a == pc->a || a == pc->b) continue;
    double *ox = others + (size_t)q * 2 * (PLOT_MAX + 2), *oy = ox + PLOT_MAX + 2;
    int on = other_arm(v, a, k->metric, X[0], X[m - 1], ox, oy);
    if (on > 0) s[pl.nseries++] = (qc_svg_series){.label = cs->arms[a].key, .x = ox, .y = oy, .n = on, .color = "#9a9a9a", .dashed = 1};
    q++;
  }
  if (b->has_pw_abs || b->has_pw_rel || b->has_noise) {
    pl.band_x = X; pl.band_lo = L; pl.band_hi = H; pl.band_n = (int)m;
    snprintf(label, sizeof label, "%s bound", b->has_pw_abs || b->has_pw_rel ? "pointwise" : "noise");
    pl.band_label = label;
  }
  if (c->has_fail) qc_svg_vline(&pl, c->fail_x, "first deviation", NULL);
  if (c->has_onset && c->onset_x < c->fail_x) qc_svg_vline(&pl, c->onset_x, "onset", NULL);
  for (int pass = 0; pass < 2; pass++) {
    int mean_plot = pass == 1;
    if (mean_plot && !(b->has_mean_abs || b->has_mean_rel || b->has_equiv)) break;
    qc_sbuf svg = {0};
    qc_svg_series cm = {.label = "cumulative mean", .x = X, .y = C, .n = (int)m};
    double *nl = L, *nh = H;
    char t2[400];
    qc_svg_plot mp = {.title = t2, .xlabel = xn, .ylabel = "mean difference", .series = &cm, .nseries = 1};
    if (mean_plot) {
      snprintf(t2, sizeof t2, "%s: cumulative mean of %s - %s", k->metric, cs->arms[pc->a].key, cs->arms[pc->b].key);
      if (b->has_mean_abs || b->has_mean_rel) {
        for (int64_t q = 0; q < m; q++) { nl[q] = -CB[q]; nh[q] = CB[q]; }
        mp.band_x = X; mp.band_lo = nl; mp.band_hi = nh; mp.band_n = (int)m;
        mp.band_label = "mean bound";
      }
      if (b->has_equiv) {
        qc_svg_hline(&mp, b->eq_delta, "equivalence delta", NULL);
        qc_svg_hline(&mp, -b->eq_delta, NULL, NULL);
      }
      qc_svg_hline(&mp, 0, NULL, "#bbbbbb");
      if (c->has_fail) qc_svg_vline(&mp, c->fail_x, "first deviation", NULL);
    }
    if ((rc = qc_svg_render(mean_plot ? &mp : &pl, &svg))) { qc_sbuf_free(&svg); goto done; }
    char name[QC_L3_PATH];
    snprintf(name, sizeof name, "%s.%d-%d-%s%s.svg", stem, p + 1, i + 1, sm, mean_plot ? "-mean" : "");
    snprintf(file, sizeof file, "%s%s", stem_dir, name);
    if ((rc = qc_report_add_file(o, file, &svg))) { qc_sbuf_free(&svg); goto done; }
    qc_sbuf_printf(md, "![%s](%s)\n", mean_plot ? "cumulative mean difference" : k->metric, name);
  }
  qc_sbuf_printf(md, "\n");
done:
  free(idx);
  free(buf);
  free(others);
  return rc;
}

/* The mean of `metric` in arm's log over the case's window, on its axis
 * (steps or tokens), and its last value there; NAN, NAN when none. Here,
 * below sft.c's console table, because both views use it. */
void qc_report_sft_summary(const qc_sft_view *v, int arm, const char *metric, double *mean, double *last) {
  const qc_l3_log *l = &v->logs[arm];
  int c = qc_l3_log_col(l, metric), xc = v->cs->x_tokens ? qc_l3_log_col(l, "tokens") : -1;
  double s = 0;
  int64_t n = 0;
  *mean = *last = NAN;
  if (c < 0 || (v->cs->x_tokens && xc < 0)) return;
  for (int64_t i = 0; i < l->n; i++) {
    if (!l->col[c].has[i]) continue;
    double x = xc < 0 ? (double)l->step[i] : l->col[xc].has[i] ? l->col[xc].v[i] : NAN;
    if (!(x >= v->cs->w0 && x <= v->cs->w1)) continue;
    s += l->col[c].v[i];
    n++;
    *last = l->col[c].v[i];
  }
  if (n) *mean = s / (double)n;
}

int qc_report_sft_markdown(qc_report_out *o, const qc_sft_view *v) {
  const qc_sft_case *cs = v->cs;
  qc_sbuf *md = &o->doc[QC_REP_MARKDOWN];
  const char *xn = cs->x_tokens ? "tokens" : "step";
  /* plots go beside the Markdown: its folder and its name without .md */
  char dir[QC_L3_PATH], stem[QC_L3_PATH];
  const char *path = o->path[QC_REP_MARKDOWN], *slash = strrchr(path, '/');
  snprintf(dir, sizeof dir, "%.*s", slash ? (int)(slash - path + 1) : 0, path);
  snprintf(stem, sizeof stem, "%s", slash ? slash + 1 : path);
  char *dot = strrchr(stem, '.');
  if (dot && dot != stem) *dot = 0;
  int dev = 0, inc = 0;
  for (int p = 0; p < cs->npair; p++) {
    dev += v->pairs[p].verdict == QC_L3_FAIL;
    inc += v->pairs[p].verdict == QC_L3_INCONCLUSIVE;
  }
  qc_sbuf_printf(md, "# qatcheck sft: %s\n\n", dev ? "DEVIATES" : inc ? "INCONCLUSIVE" : "pass");
  qc_sbuf_printf(md, "- case: `");
  qc_sbuf_md(md, cs->name);
  qc_sbuf_printf(md, "` (`");
  qc_sbuf_md(md, cs->path);
  qc_sbuf_printf(md, "`)\n- window: [%g, %g] on %s\n- pairs: %d, %d deviate, %d inconclusive\n", cs->w0, cs->w1, xn, cs->npair, dev, inc);
  qc_report_tool_md(md);
  qc_sbuf_printf(md, "\n");
  qc_sbuf_printf(md, "## Arms\n\n| arm | log | format | steps | duplicated values |\n| --- | --- | --- | --- | --- |\n");
  for (int a = 0; a < cs->narm; a++) {
    const qc_l3_log *l = &v->logs[a];
    qc_sbuf_printf(md, "| %s | `", cs->arms[a].key);
    qc_sbuf_md(md, cs->arms[a].log);
    qc_sbuf_printf(md, "` | %s | %lld | %lld |\n", l->format, (long long)l->n, (long long)l->dup_values);
  }
  qc_sbuf_printf(md, "\n## Controlled variables (config diff)\n\n| key |");
  for (int a = 0; a < cs->narm; a++) qc_sbuf_printf(md, " %s |", cs->arms[a].key);
  qc_sbuf_printf(md, " differs | expected |\n| --- |");
  for (int a = 0; a < cs->narm; a++) qc_sbuf_printf(md, " --- |");
  qc_sbuf_printf(md, " --- | --- |\n");
  for (int k = 0; k < v->nrow; k++) {
    const qc_sft_cfgrow *row = &v->rows[k];
    qc_sbuf_printf(md, "| %s |", row->key);
    for (int a = 0; a < cs->narm; a++) {
      qc_sbuf_printf(md, " ");
      qc_sbuf_md(md, !v->has_cfg[a] ? "(no config)" : row->val[a] ? row->val[a] : "-");
      qc_sbuf_printf(md, " |");
    }
    qc_sbuf_printf(md, " %s | ", row->differs ? "**yes**" : "no");
    qc_sbuf_md(md, row->reason ? row->reason : row->differs ? "**no**" : "");
    qc_sbuf_printf(md, " |\n");
  }
  qc_sbuf_printf(md, "\n## Three arms over the window (mean, last)\n\n| metric |");
  for (int a = 0; a < cs->narm; a++) qc_sbuf_printf(md, " %s |", cs->arms[a].key);
  qc_sbuf_printf(md, "\n| --- |");
  for (int a = 0; a < cs->narm; a++) qc_sbuf_printf(md, " --- |");
  qc_sbuf_printf(md, "\n");
  for (int p = 0, shown = 0; p < cs->npair; p++)
    for (int i = 0; i < cs->pairs[p].ncheck; i++) {
      const char *m = cs->pairs[p].checks[i].metric;
      int seen = 0;
      for (int q = 0; q <= p && !seen; q++)
        for (int j = 0; j < (q == p ? i : cs->pairs[q].ncheck); j++) seen |= strcmp(cs->pairs[q].checks[j].metric, m) == 0;
      if (seen) continue;
      shown++;
      qc_sbuf_printf(md, "| ");
      qc_sbuf_md(md, m);
      qc_sbuf_printf(md, " |");
      for (int a = 0; a < cs->narm; a++) {
        double mean, last;
        qc_report_sft_summary(v, a, m, &mean, &last);
        qc_sbuf_printf(md, " %.6g (%.6g) |", mean, last);
      }
      qc_sbuf_printf(md, "\n");
    }
  int rc = QC_OK;
  for (int p = 0; p < cs->npair && !rc; p++) {
    const qc_sft_pair *pc = &cs->pairs[p];
    const qc_sft_pair_res *pr = &v->pairs[p];
    qc_sbuf_printf(md, "\n## %s ~ %s: %s\n\n", cs->arms[pc->a].key, cs->arms[pc->b].key,
                   pr->verdict == QC_L3_FAIL ? "**deviates**" : pr->verdict == QC_L3_INCONCLUSIVE ? "**inconclusive**" : "pass");
    if (pr->verdict == QC_L3_FAIL && pr->undeclared[0]) {
      qc_sbuf_printf(md, "- **first explain the undeclared differences**: ");
      qc_sbuf_md(md, pr->undeclared);
      qc_sbuf_printf(md, " (either can make the arms deviate by itself; the localization below comes after)\n");
    }
    if (pr->has_first)
      qc_sbuf_printf(md, "- first deviation: %s %g (step %lld), `%s`, bound `%s`\n- localization: **%s**: %s\n", xn, pr->first_x,
                     (long long)pr->first_step, pc->checks[pr->first_check].metric, pr->checks[pr->first_check].bound,
                     qc_l3_loc_name(pr->loc), qc_l3_loc_advice(pr->loc));
    if (pr->has_first && pr->has_onset && pr->onset_x < pr->first_x)
      qc_sbuf_printf(md, "- onset: %s %g (step %lld), `%s`, a %s: where a - b began to change, before it crossed the bound\n", xn,
                     pr->onset_x, (long long)pr->onset_step, pc->checks[pr->onset_check].metric, pr->checks[pr->onset_check].onset_kind);
    if (pr->reasons[0]) {
      qc_sbuf_printf(md, "- cannot pass: ");
      qc_sbuf_md(md, pr->reasons);
      qc_sbuf_printf(md, "\n");
    }
    qc_sbuf_printf(md, "\n| metric | window | verdict | points | mean diff | max rel | first failure | why |\n"
                       "| --- | --- | --- | --- | --- | --- | --- | --- |\n");
    for (int i = 0; i < pc->ncheck; i++) {
      const qc_sft_check *k = &pc->checks[i];
      const qc_sft_check_res *c = &pr->checks[i];
      qc_sbuf_printf(md, "| ");
      qc_sbuf_md(md, k->metric);
      qc_sbuf_printf(md, " | [%g, %g] | %s | %lld | %.4g | %.4g | ", k->has_window ? k->w0 : cs->w0, k->has_window ? k->w1 : cs->w1,
                     qc_l3_verdict_name(c->verdict), (long long)c->npoints, c->mean_diff, c->max_rel);
      if (c->has_fail) qc_sbuf_printf(md, "%g (%s)", c->fail_x, c->bound);
      qc_sbuf_printf(md, " | ");
      qc_sbuf_md(md, c->why);
      qc_sbuf_printf(md, " |\n");
    }
    qc_sbuf_printf(md, "\nBounds, declared before the run:\n\n");
    for (int i = 0; i < pc->ncheck; i++) {
      qc_sbuf_printf(md, "- `");
      qc_sbuf_md(md, pc->checks[i].metric);
      qc_sbuf_printf(md, "`: ");
      qc_sbuf_md(md, pc->checks[i].b.reasoning);
      qc_sbuf_printf(md, "\n");
    }
    qc_sbuf_printf(md, "\n");
    for (int i = 0; i < pc->ncheck && !rc; i++) rc = plots(o, v, p, i, dir, stem, md);
  }
  if (!rc && md->oom) rc = qc_err_sys("out of memory rendering the Markdown report");
  return rc;
}
