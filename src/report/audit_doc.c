/* audit_doc.c: one writer, two documents (audit.h): GitHub-flavoured
 * Markdown and a self-contained HTML page. Every piece of text goes
 * through the escaping of each format, so a module path or a reasoning
 * with markup in it stays text in both. */
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "core/qc.h"
#include "report/audit.h"

/* The page's style: system fonts only, no external resource; on paper the
 * summary, tables rows and plots do not split across pages. */
static const char g_css[] =
    "body{font-family:\"DejaVu Sans\",\"Segoe UI\",Roboto,Helvetica,Arial,sans-serif;color:#1b1b1b;background:#fff;"
    "margin:0;line-height:1.4}\n"
    "main{max-width:1120px;margin:0 auto;padding:12px 24px}\n"
    "h1{font-size:1.55em;border-bottom:2px solid #333;padding-bottom:4px}\n"
    "h2{font-size:1.3em;border-bottom:1px solid #bbb;margin-top:1.8em}\n"
    "h3{font-size:1.1em;margin-top:1.4em}h4{font-size:1em;margin:1em 0 .3em}\n"
    "table{border-collapse:collapse;margin:6px 0 12px;font-size:.84em}\n"
    "th,td{border:1px solid #c8c8c8;padding:2px 6px;vertical-align:top;text-align:left}\n"
    "th{background:#efefef}td.r,th.r{text-align:right;font-variant-numeric:tabular-nums}\n"
    "code{font-family:\"DejaVu Sans Mono\",Menlo,Consolas,monospace;font-size:.9em;background:#f3f3f3;padding:0 2px;"
    "word-break:break-all}\n"
    ".v{font-weight:bold;padding:0 4px;border-radius:3px;white-space:nowrap}\n"
    ".v-pass{color:#1a7f37}.v-fail{color:#fff;background:#cf222e}.v-error{color:#fff;background:#8250df}"
    ".v-warn{color:#000;background:#f5c542}.v-none{color:#666}\n"
    "figure{margin:10px 0 16px}figcaption{font-size:.84em;color:#444;max-width:900px}\n"
    "svg{max-width:100%;height:auto;border:1px solid #ddd}\n"
    "#summary{border:1px solid #888;background:#fafafa;padding:4px 18px 10px;margin-top:10px}\n"
    "#summary h2{margin-top:.6em;border:0}\n"
    "nav{font-size:.9em}nav a{margin-right:1em}\n"
    "@media print{body{font-size:9.5pt}main{max-width:none;padding:0}nav{display:none}"
    "h2,h3,h4{break-after:avoid;page-break-after:avoid}"
    "tr,figure,#summary{break-inside:avoid;page-break-inside:avoid}thead{display:table-header-group}"
    ".v-fail,.v-error,.v-warn,th{-webkit-print-color-adjust:exact;print-color-adjust:exact}"
    "a{color:inherit;text-decoration:none}svg{border:0}@page{margin:14mm}}\n";

void qc_cat(char *buf, size_t n, const char *fmt, ...) {
  size_t l = strnlen(buf, n);
  if (l + 1 >= n) return;
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(buf + l, n - l, fmt, ap);
  va_end(ap);
}

void qc_doc_begin(qc_doc *d, const char *title) {
  memset(d, 0, sizeof *d);
  qc_sbuf_printf(&d->html, "<!DOCTYPE html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\">\n"
                           "<meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">\n<title>");
  qc_sbuf_xml(&d->html, title);
  qc_sbuf_printf(&d->html, "</title>\n<style>\n%s</style>\n</head>\n<body>\n<main>\n", g_css);
}

int qc_doc_end(qc_doc *d) {
  qc_doc_end_block(d);
  qc_sbuf_printf(&d->html, "</main>\n</body>\n</html>\n");
  return d->md.oom || d->html.oom ? qc_err_sys("out of memory rendering the audit") : QC_OK;
}

/* Markdown text outside code: ASCII punctuation that could start markup is
 * backslash-escaped, newlines become spaces. */
static void md_text(qc_sbuf *b, const char *s) {
  for (; *s; s++) {
    unsigned char c = (unsigned char)*s;
    if (strchr("\\`*_[]<>|#~!", c)) qc_sbuf_printf(b, "\\%c", c);
    else if (c == '\n' || c == '\r' || c == '\t') qc_sbuf_printf(b, " ");
    else if (c < 0x20) qc_sbuf_printf(b, "\\\\x%02x", c);
    else qc_sbuf_printf(b, "%c", c);
  }
}

static void vtext(qc_doc *d, const char *fmt, va_list ap) {
  char buf[2048];
  vsnprintf(buf, sizeof buf, fmt, ap);
  md_text(&d->md, buf);
  qc_sbuf_xml(&d->html, buf);
}

void qc_doc_h(qc_doc *d, int level, const char *id, const char *fmt, ...) {
  char buf[512];
  va_list ap;
  qc_doc_end_block(d);
  va_start(ap, fmt);
  vsnprintf(buf, sizeof buf, fmt, ap);
  va_end(ap);
  if (level < 1) level = 1;
  if (level > 4) level = 4;
  qc_sbuf_printf(&d->md, "%s%.*s ", d->md.n ? "\n" : "", level, "####");
  md_text(&d->md, buf);
  qc_sbuf_printf(&d->md, "\n\n");
  qc_sbuf_printf(&d->html, "<h%d%s%s%s>", level, id ? " id=\"" : "", id ? id : "", id ? "\"" : "");
  qc_sbuf_xml(&d->html, buf);
  qc_sbuf_printf(&d->html, "</h%d>\n", level);
}

void qc_doc_end_block(qc_doc *d) {
  if (d->in_p) {
    qc_sbuf_printf(&d->md, "\n\n");
    qc_sbuf_printf(&d->html, "</p>\n");
  }
  if (d->in_li) {
    qc_sbuf_printf(&d->md, "\n\n");
    qc_sbuf_printf(&d->html, "</li>\n</ul>\n");
  }
  d->in_p = d->in_li = 0;
}

void qc_doc_p(qc_doc *d) {
  qc_doc_end_block(d);
  qc_sbuf_printf(&d->html, "<p>");
  d->in_p = 1;
}

void qc_doc_li(qc_doc *d) {
  if (d->in_p) qc_doc_end_block(d);
  if (d->in_li) {
    qc_sbuf_printf(&d->md, "\n");
    qc_sbuf_printf(&d->html, "</li>\n");
  } else {
    qc_sbuf_printf(&d->html, "<ul>\n");
  }
  qc_sbuf_printf(&d->md, "- ");
  qc_sbuf_printf(&d->html, "<li>");
  d->in_li = 1;
}

void qc_doc_text(qc_doc *d, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  vtext(d, fmt, ap);
  va_end(ap);
}

/* Inline code in Markdown: backquotes cannot be escaped inside, so a
 * backquote in s becomes a quote; '|' is escaped (GFM tables split on it
 * even inside code). */
static void md_code(qc_sbuf *b, const char *s) {
  qc_sbuf_printf(b, "`");
  qc_sbuf_md(b, s);
  qc_sbuf_printf(b, "`");
}

void qc_doc_code(qc_doc *d, const char *s) {
  md_code(&d->md, s);
  qc_sbuf_printf(&d->html, "<code>");
  qc_sbuf_xml(&d->html, s);
  qc_sbuf_printf(&d->html, "</code>");
}

void qc_doc_strong(qc_doc *d, const char *fmt, ...) {
  va_list ap;
  qc_sbuf_printf(&d->md, "**");
  qc_sbuf_printf(&d->html, "<b>");
  va_start(ap, fmt);
  vtext(d, fmt, ap);
  va_end(ap);
  qc_sbuf_printf(&d->md, "**");
  qc_sbuf_printf(&d->html, "</b>");
}

/* The class of a verdict word: pass, fail, error, warn or none. */
static const char *vclass(const char *v) {
  if (!v || !v[0]) return "none";
  if (strcmp(v, "pass") == 0 || strcmp(v, "PASS") == 0 || strcmp(v, "covered") == 0) return "pass";
  if (strcmp(v, "error") == 0 || strcmp(v, "ERROR") == 0 || strcmp(v, "INCOMPLETE") == 0) return "error";
  if (strcmp(v, "inconclusive") == 0 || strcmp(v, "outlier") == 0 || strcmp(v, "missing") == 0 ||
      strcmp(v, "regression") == 0)
    return "warn";
  if (strcmp(v, "not run") == 0 || strcmp(v, "n/a") == 0 || strcmp(v, "-") == 0) return "none";
  return "fail";
}

static void verdict_to(qc_doc *d, const char *v, int cell) {
  const char *c = vclass(v);
  int loud = strcmp(c, "fail") == 0 || strcmp(c, "error") == 0;
  (void)cell;
  if (loud) qc_sbuf_printf(&d->md, "**");
  md_text(&d->md, v);
  if (loud) qc_sbuf_printf(&d->md, "**");
  qc_sbuf_printf(&d->html, "<span class=\"v v-%s\">", c);
  qc_sbuf_xml(&d->html, v);
  qc_sbuf_printf(&d->html, "</span>");
}

void qc_doc_verdict(qc_doc *d, const char *v) { verdict_to(d, v, 0); }

void qc_doc_ref(qc_doc *d, const char *id, const char *text) {
  qc_sbuf_printf(&d->md, "[");
  md_text(&d->md, text);
  qc_sbuf_printf(&d->md, "](#%s)", id);
  qc_sbuf_printf(&d->html, "<a href=\"#%s\">", id);
  qc_sbuf_xml(&d->html, text);
  qc_sbuf_printf(&d->html, "</a>");
}

/* ---- tables ---------------------------------------------------------------------------- */

void qc_doc_table(qc_doc *d, const char *spec) {
  qc_doc_end_block(d);
  d->ncols = 0;
  qc_sbuf_printf(&d->md, "\n|");
  qc_sbuf_printf(&d->html, "<table>\n<thead><tr>");
  for (const char *p = spec; *p && d->ncols < (int)sizeof d->aligns - 1;) {
    char al = 'l';
    if (p[0] && p[1] == ':') {
      al = p[0];
      p += 2;
    }
    size_t n = strcspn(p, "|");
    char h[128];
    snprintf(h, sizeof h, "%.*s", (int)(n < sizeof h ? n : sizeof h - 1), p);
    d->aligns[d->ncols++] = al;
    qc_sbuf_printf(&d->md, " ");
    md_text(&d->md, h);
    qc_sbuf_printf(&d->md, " |");
    qc_sbuf_printf(&d->html, "<th%s>", al == 'r' ? " class=\"r\"" : "");
    qc_sbuf_xml(&d->html, h);
    qc_sbuf_printf(&d->html, "</th>");
    p += n + (p[n] == '|');
  }
  d->aligns[d->ncols] = 0;
  qc_sbuf_printf(&d->md, "\n|");
  for (int i = 0; i < d->ncols; i++) qc_sbuf_printf(&d->md, "%s|", d->aligns[i] == 'r' ? " ---: " : " --- ");
  qc_sbuf_printf(&d->md, "\n");
  qc_sbuf_printf(&d->html, "</tr></thead>\n<tbody>\n");
}

static void row_close(qc_doc *d) {
  if (!d->in_row) return;
  while (d->col < d->ncols) qc_doc_td(d, "%s", "");
  qc_sbuf_printf(&d->md, "\n");
  qc_sbuf_printf(&d->html, "</tr>\n");
  d->in_row = 0;
}

void qc_doc_tr(qc_doc *d) {
  row_close(d);
  qc_sbuf_printf(&d->md, "|");
  qc_sbuf_printf(&d->html, "<tr>");
  d->in_row = 1;
  d->col = 0;
}

/* Open cell d->col (a cell past the last column is dropped: returns 0). */
static int cell_open(qc_doc *d) {
  if (!d->in_row) qc_doc_tr(d);
  if (d->col >= d->ncols) return 0;
  qc_sbuf_printf(&d->md, " ");
  qc_sbuf_printf(&d->html, "<td%s>", d->aligns[d->col] == 'r' ? " class=\"r\"" : "");
  return 1;
}

static void cell_close(qc_doc *d) {
  qc_sbuf_printf(&d->md, " |");
  qc_sbuf_printf(&d->html, "</td>");
  d->col++;
}

void qc_doc_td(qc_doc *d, const char *fmt, ...) {
  char buf[2048];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(buf, sizeof buf, fmt, ap);
  va_end(ap);
  if (!cell_open(d)) return;
  md_text(&d->md, buf);
  qc_sbuf_xml(&d->html, buf);
  cell_close(d);
}

void qc_doc_td_code(qc_doc *d, const char *s) {
  if (!cell_open(d)) return;
  if (s && s[0]) {
    md_code(&d->md, s);
    qc_sbuf_printf(&d->html, "<code>");
    qc_sbuf_xml(&d->html, s);
    qc_sbuf_printf(&d->html, "</code>");
  }
  cell_close(d);
}

void qc_doc_td_verdict(qc_doc *d, const char *v) {
  if (!cell_open(d)) return;
  verdict_to(d, v, 1);
  cell_close(d);
}

void qc_doc_td_num(qc_doc *d, double v, int digits) {
  if (!isfinite(v)) qc_doc_td(d, "-");
  else qc_doc_td(d, "%.*g", digits, v);
}

void qc_doc_table_end(qc_doc *d) {
  row_close(d);
  qc_sbuf_printf(&d->md, "\n");
  qc_sbuf_printf(&d->html, "</tbody>\n</table>\n");
  d->ncols = 0;
}

void qc_doc_figure(qc_doc *d, const qc_sbuf *svg, const char *caption) {
  qc_doc_end_block(d);
  qc_sbuf_printf(&d->md, "*Plot (in the HTML audit): ");
  md_text(&d->md, caption);
  qc_sbuf_printf(&d->md, "*\n\n");
  qc_sbuf_printf(&d->html, "<figure>\n%s<figcaption>", svg->s ? svg->s : "");
  qc_sbuf_xml(&d->html, caption);
  qc_sbuf_printf(&d->html, "</figcaption>\n</figure>\n");
}
