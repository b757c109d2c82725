/* tlist.c: see tlist.h. */
#include "report/tlist.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "model/check.h"
#include "core/qc.h"
#include "report/report.h"

/* Offsets into text; -1: absent. */
typedef struct qc_tent {
  long suite, classname, name, failure, out;
} qc_tent;

static long put(qc_tlist *l, const char *s) {
  if (!s) return -1;
  long at = (long)l->text.n;
  qc_sbuf_printf(&l->text, "%s%c", s, 0);
  return at;
}

int qc_tlist_add(qc_tlist *l, const char *suite, const char *classname, const char *name, const char *failure,
                 const char *out) {
  if (l->oom) return qc_err_sys("out of memory building the test list");
  if (l->n == l->cap) {
    int cap = l->cap ? 2 * l->cap : 64;
    qc_tent *nv = realloc(l->v, (size_t)cap * sizeof *nv);
    if (!nv) { l->oom = 1; return qc_err_sys("out of memory building the test list"); }
    l->v = nv;
    l->cap = cap;
  }
  qc_tent *e = &l->v[l->n];
  e->suite = put(l, suite ? suite : "");
  e->classname = put(l, classname ? classname : "");
  e->name = put(l, name ? name : "");
  e->failure = put(l, failure);
  e->out = put(l, out);
  if (l->text.oom) { l->oom = 1; return qc_err_sys("out of memory building the test list"); }
  l->n++;
  return QC_OK;
}

int qc_tlist_failures(const qc_tlist *l) {
  int f = 0;
  for (int i = 0; i < l->n; i++) f += l->v[i].failure >= 0;
  return f;
}

static const char *str(const qc_tlist *l, long at) { return at < 0 ? NULL : l->text.s + at; }

static uint64_t fnv1a(const char *s) {
  uint64_t h = 1469598103934665603ull;
  for (; *s; s++) h = (h ^ (unsigned char)*s) * 1099511628211ull;
  return h;
}

/* Number the suites in order of first appearance into sid[i] (a hash of
 * names, so a contract sweep's hundred thousand rows stay linear) and put
 * the cases, grouped by suite, in order[] (both l->n long, the caller's).
 * Returns the suite count, or -1 out of memory. */
static int group(const qc_tlist *l, int *sid, int *order) {
  size_t cap = 16;
  while (cap < 2 * (size_t)l->n) cap *= 2;
  int *slot = malloc(cap * sizeof *slot), *first = malloc(((size_t)l->n + 1) * sizeof *first);
  int *count = calloc((size_t)l->n + 1, sizeof *count);
  int ns = 0;
  if (!slot || !first || !count) { ns = -1; goto done; }
  for (size_t i = 0; i < cap; i++) slot[i] = -1;
  for (int i = 0; i < l->n; i++) {
    const char *s = str(l, l->v[i].suite);
    size_t h = (size_t)fnv1a(s) & (cap - 1);
    while (slot[h] >= 0 && strcmp(str(l, l->v[first[slot[h]]].suite), s) != 0) h = (h + 1) & (cap - 1);
    if (slot[h] < 0) {
      slot[h] = ns;
      first[ns++] = i;
    }
    sid[i] = slot[h];
    count[slot[h]]++;
  }
  /* counting sort by suite, stable */
  for (int s = 0, at = 0; s < ns; s++) {
    int c = count[s];
    count[s] = at;
    at += c;
  }
  for (int i = 0; i < l->n; i++) order[count[sid[i]]++] = i;
done:
  free(slot);
  free(first);
  free(count);
  return ns;
}

int qc_tlist_junit(const qc_tlist *l, const char *verb, qc_sbuf *out) {
  int *sid = malloc(((size_t)l->n + 1) * sizeof *sid), *order = malloc(((size_t)l->n + 1) * sizeof *order);
  if (!sid || !order || group(l, sid, order) < 0) {
    free(sid);
    free(order);
    return qc_err_sys("out of memory building the JUnit report");
  }
  qc_sbuf b = *out;
  qc_sbuf_printf(&b, "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n<testsuites name=\"qatcheck ");
  qc_sbuf_xml(&b, verb);
  qc_sbuf_printf(&b, "\" tests=\"%d\" failures=\"%d\">\n", l->n, qc_tlist_failures(l));
  for (int k = 0; k < l->n;) {
    int s = sid[order[k]], end = k, tf = 0;
    while (end < l->n && sid[order[end]] == s) tf += l->v[order[end++]].failure >= 0;
    qc_sbuf_printf(&b, "  <testsuite name=\"");
    qc_sbuf_xml(&b, str(l, l->v[order[k]].suite));
    qc_sbuf_printf(&b, "\" tests=\"%d\" failures=\"%d\">\n", end - k, tf);
    for (; k < end; k++) {
      const qc_tent *e = &l->v[order[k]];
      qc_sbuf_printf(&b, "    <testcase classname=\"");
      qc_sbuf_xml(&b, str(l, e->classname));
      qc_sbuf_printf(&b, "\" name=\"");
      qc_sbuf_xml(&b, str(l, e->name));
      qc_sbuf_printf(&b, "\">");
      if (e->failure >= 0) {
        qc_sbuf_printf(&b, "<failure message=\"");
        qc_sbuf_xml(&b, str(l, e->failure));
        qc_sbuf_printf(&b, "\"/>");
      }
      if (e->out >= 0) {
        qc_sbuf_printf(&b, "<system-out>");
        qc_sbuf_xml(&b, str(l, e->out));
        qc_sbuf_printf(&b, "</system-out>");
      }
      qc_sbuf_printf(&b, "</testcase>\n");
    }
    qc_sbuf_printf(&b, "  </testsuite>\n");
  }
  qc_sbuf_printf(&b, "</testsuites>\n");
  free(sid);
  free(order);
  *out = b;
  return b.oom ? qc_err_sys("out of memory building the JUnit report") : QC_OK;
}

int qc_tlist_markdown(const qc_tlist *l, const char *verb, const char *preamble, qc_sbuf *out) {
  qc_sbuf b = *out;
  int nf = qc_tlist_failures(l);
  qc_sbuf_printf(&b, "# qatcheck %s: %s\n\n", verb, l->n == 0 ? "nothing checked" : nf ? "FAIL" : "pass");
  if (preamble && preamble[0]) qc_sbuf_printf(&b, "%s\n", preamble);
  qc_sbuf_printf(&b, "- %d check(s), %d failed\n- qatcheck %s\n\n", l->n, nf, QC_VERSION);
  qc_sbuf_printf(&b, "| suite | check | verdict | detail |\n|---|---|---|---|\n");
  for (int i = 0; i < l->n; i++) {
    const qc_tent *e = &l->v[i];
    const char *detail = e->failure >= 0 ? str(l, e->failure) : e->out >= 0 ? str(l, e->out) : "";
    qc_sbuf_printf(&b, "| `");
    qc_sbuf_md(&b, str(l, e->suite));
    qc_sbuf_printf(&b, "` | ");
    qc_sbuf_md(&b, str(l, e->name));
    qc_sbuf_printf(&b, " | %s | ", e->failure >= 0 ? "**FAIL**" : "pass");
    qc_sbuf_md(&b, detail);
    qc_sbuf_printf(&b, " |\n");
  }
  *out = b;
  return b.oom ? qc_err_sys("out of memory building the Markdown report") : QC_OK;
}

void qc_tlist_free(qc_tlist *l) {
  qc_sbuf_free(&l->text);
  free(l->v);
  l->v = NULL;
  l->n = l->cap = 0;
  l->oom = 0;
}
