/* sbuf.c: see sbuf.h. */
#include "sbuf.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>

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

void qc_sbuf_xml(qc_sbuf *b, const char *s) {
  for (; *s; s++) {
    switch (*s) {
      case '<': qc_sbuf_printf(b, "&lt;"); break;
      case '>': qc_sbuf_printf(b, "&gt;"); break;
      case '&': qc_sbuf_printf(b, "&amp;"); break;
      case '"': qc_sbuf_printf(b, "&quot;"); break;
      default:
        /* XML 1.0 has no place for other control characters: escape them visibly */
        if ((unsigned char)*s < 0x20 && *s != '\t' && *s != '\n' && *s != '\r') qc_sbuf_printf(b, "\\x%02x", (unsigned char)*s);
        else qc_sbuf_printf(b, "%c", *s);
        break;
    }
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
