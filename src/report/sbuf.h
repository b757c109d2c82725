/* sbuf.h: a growable string for building reports. */
#ifndef QC_SBUF_H
#define QC_SBUF_H
#include <stddef.h>
typedef struct qc_sbuf {
  char *s;
  size_t n, cap;
  int oom;
} qc_sbuf;
/* Append printf-style; on allocation failure sets oom and stops growing. */
void qc_sbuf_printf(qc_sbuf *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* Append s with XML escaping. */
void qc_sbuf_xml(qc_sbuf *b, const char *s);
/* Append s for a Markdown table cell: '|' escaped, backquotes and control
 * characters made harmless. */
void qc_sbuf_md(qc_sbuf *b, const char *s);
void qc_sbuf_free(qc_sbuf *b);
/* The next line of a "...\n"-separated text (info->warnings) into line
 * (cut at n - 1 characters); *p advances. 0 at the end (sbuf.c). */
int qc_report_line(const char **p, char *line, size_t n);
#endif
