/* sbuf.c: see sbuf.h. */
#include "report/sbuf.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

void qc_sbuf_printf(qc_sbuf *b, const char *fmt, ...) {
  if (b->oom) return;
  for (;;) {
    va_list ap;
    va_start(ap, fmt);
    size_t room = b->cap - b->n;
    int k = vsnprintf(b->s ? b->s + b->n : NULL, b->s ? room : 0, fmt, ap);
    va_end(ap);
    if (k < 0) { b->oom = 1; return; }
    if (b->s && (size_t)k < room) { b->n += (size_t)k; return; }
    size_t cap = b->cap ? b->cap * 2 : 4096;
    while (cap < b->n + (size_t)k + 1) cap *= 2;
    char *ns = realloc(b->s, cap);
    if (!ns) { b->oom = 1; return; }
    b->s = ns;
    b->cap = cap;
  }
}

/* Length of the well-formed UTF-8 sequence at s that XML 1.0 allows (no
 * surrogates, no U+FFFE/U+FFFF, no overlong forms), or 0. */
static int utf8_len(const unsigned char *s) {
  unsigned c = s[0], cp;
  int n;
  if (c < 0x80) return 1;
  if (c >= 0xc2 && c <= 0xdf) { n = 2; cp = c & 0x1f; }
  else if (c >= 0xe0 && c <= 0xef) { n = 3; cp = c & 0x0f; }
  else if (c >= 0xf0 && c <= 0xf4) { n = 4; cp = c & 0x07; }
  else return 0;
  for (int i = 1; i < n; i++) {
    if ((s[i] & 0xc0) != 0x80) return 0;
    cp = cp << 6 | (s[i] & 0x3f);
  }
  if ((n == 3 && cp < 0x800) || (n == 4 && (cp < 0x10000 || cp > 0x10ffff))) return 0;
  if ((cp >= 0xd800 && cp <= 0xdfff) || cp == 0xfffe || cp == 0xffff) return 0;
  return n;
}

void qc_sbuf_xml(qc_sbuf *b, const char *s) {
  while (*s) {
    unsigned char c = (unsigned char)*s;
    int n = 1;
    switch (c) {
      case '<': qc_sbuf_printf(b, "&lt;"); break;
      case '>': qc_sbuf_printf(b, "&gt;"); break;
      case '&': qc_sbuf_printf(b, "&amp;"); break;
      case '"': qc_sbuf_printf(b, "&quot;"); break;
      default:
        /* XML 1.0 has no place for other control characters or bytes that
         * are not UTF-8 (an HDF5 name can hold any): escape them visibly */
        if (c < 0x20 && c != '\t' && c != '\n' && c != '\r') qc_sbuf_printf(b, "\\x%02x", c);
        else if ((n = utf8_len((const unsigned char *)s)) == 0) { qc_sbuf_printf(b, "\\x%02x", c); n = 1; }
        else qc_sbuf_printf(b, "%.*s", n, s);
        break;
    }
    s += n;
  }
}

void qc_sbuf_free(qc_sbuf *b) {
  free(b->s);
  b->s = NULL;
  b->n = b->cap = 0;
}

void qc_sbuf_md(qc_sbuf *b, const char *s) {
  for (; *s; s++) {
    if (*s == '|') qc_sbuf_printf(b, "\\|");
    else if (*s == '`') qc_sbuf_printf(b, "'");
    else if ((unsigned char)*s < 0x20) qc_sbuf_printf(b, "\\x%02x", (unsigned char)*s);
    else qc_sbuf_printf(b, "%c", *s);
  }
}

/* The next line of *p into line; 0 at the end (sbuf.h). Here, the lowest
 * report file, because json.c and text.c both read warnings with it. */
int qc_report_line(const char **p, char *line, size_t n) {
  if (!*p || !**p) return 0;
  const char *nl = strchr(*p, '\n');
  size_t len = nl ? (size_t)(nl - *p) : strlen(*p);
  snprintf(line, n, "%.*s", (int)(len < n ? len : n - 1), *p);
  *p += len + (nl ? 1 : 0);
  return 1;
}
