/* tlist.c: see tlist.h. */
#include "report/tlist.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "model/check.h"
#include "core/qc.h"
#include "report/report.h"

/* Offsets into text; -1: absent. */
typedef struct qc_tent {
  long suite, classname, name, failure, out;
  int error;          /* failure holds an <error> message: the case could not run */
  double time;        /* seconds; < 0: not set */
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
  e->error = 0;
  e->time = -1;
  if (l->text.oom) { l->oom = 1; return qc_err_sys("out of memory building the test list"); }
  l->n++;
  return QC_OK;
}

int qc_tlist_add_error(qc_tlist *l, const char *suite, const char *classname, const char *name, const char *message) {
  int rc = qc_tlist_add(l, suite, classname, name, message ? message : "", NULL);
  if (!rc) l->v[l->n - 1].error = 1;
  return rc;
}

void qc_tlist_time(qc_tlist *l, double seconds) {
  if (l->n > 0) l->v[l->n - 1].time = seconds >= 0 ? seconds : 0;
}

void qc_tlist_spread(qc_tlist *l, double total) {
  int k = 0;
  for (int i = 0; i < l->n; i++) k += l->v[i].time < 0;
  for (int i = 0; k && i < l->n; i++)
    if (l->v[i].time < 0) l->v[i].time = total > 0 ? total / k : 0;
}

/* The cases of l that failed (errors not counted). */
static int qc_tlist_failures(const qc_tlist *l) {
  int f = 0;
  for (int i = 0; i < l->n; i++) f += l->v[i].failure >= 0 && !l->v[i].error;
  return f;
}

/* The cases of l that could not be judged. */
static int qc_tlist_errors(const qc_tlist *l) {
  int f = 0;
  for (int i = 0; i < l->n; i++) f += l->v[i].error;
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

/* For each case, 0 or the repeat number of its (classname, name) pair in
 * insertion order (2 for the second, ...), into rep[] (the caller's, n
 * long). -1 out of memory. */
static int repeats(const qc_tlist *l, int *rep) {
  size_t cap = 16;
  while (cap < 2 * (size_t)l->n) cap *= 2;
  int *slot = malloc(cap * sizeof *slot), *count = calloc((size_t)l->n + 1, sizeof *count);
  if (!slot || !count) { free(slot); free(count); return -1; }
  for (size_t i = 0; i < cap; i++) slot[i] = -1;
  for (int i = 0; i < l->n; i++) {
    const char *c = str(l, l->v[i].classname), *nm = str(l, l->v[i].name);
    size_t h = (size_t)((fnv1a(c) * 31) ^ fnv1a(nm)) & (cap - 1);
    for (;; h = (h + 1) & (cap - 1)) {
      int j = slot[h];
      if (j < 0) { slot[h] = i; break; }
      if (strcmp(str(l, l->v[j].classname), c) == 0 && strcmp(str(l, l->v[j].name), nm) == 0) break;
    }
    int first = slot[h];
    rep[i] = count[first]++ ? count[first] : 0;
  }
  free(slot);
  free(count);
  return 0;
}

static double case_time(const qc_tent *e) { return e->time > 0 ? e->time : 0; }

/* Render the <testsuite> elements of l into b. */
static int suites(const qc_tlist *l, qc_sbuf *b) {
  int *sid = malloc(((size_t)l->n + 1) * sizeof *sid), *order = malloc(((size_t)l->n + 1) * sizeof *order);
  int *rep = malloc(((size_t)l->n + 1) * sizeof *rep);
  if (!sid || !order || !rep || group(l, sid, order) < 0 || repeats(l, rep) < 0) {
    free(sid); free(order); free(rep);
    return qc_err_sys("out of memory building the JUnit report");
  }
  char host[256] = "localhost", stamp[32];
  if (gethostname(host, sizeof host - 1) != 0) snprintf(host, sizeof host, "localhost");
  host[sizeof host - 1] = 0;
  time_t now = time(NULL);
  struct tm tm;
  if (gmtime_r(&now, &tm)) strftime(stamp, sizeof stamp, "%Y-%m-%dT%H:%M:%S", &tm);
  else snprintf(stamp, sizeof stamp, "1970-01-01T00:00:00");
  for (int k = 0, id = 0; k < l->n; id++) {
    int s = sid[order[k]], end = k, tf = 0, te = 0;
    double tt = 0;
    while (end < l->n && sid[order[end]] == s) {
      const qc_tent *e = &l->v[order[end++]];
      tf += e->failure >= 0 && !e->error;
      te += e->error;
      tt += case_time(e);
    }
    qc_sbuf_printf(b, "  <testsuite name=\"");
    qc_sbuf_xml(b, str(l, l->v[order[k]].suite));
    qc_sbuf_printf(b, "\" id=\"%d\" tests=\"%d\" failures=\"%d\" errors=\"%d\" skipped=\"0\" time=\"%.6f\" timestamp=\"%s\" hostname=\"",
                   id, end - k, tf, te, tt, stamp);
    qc_sbuf_xml(b, host);
    qc_sbuf_printf(b, "\">\n    <properties><property name=\"qatcheck.version\" value=\"%s\"/><property name=\"qatcheck.source_commit\" value=\"", QC_VERSION);
    qc_sbuf_xml(b, qc_build_commit());
    qc_sbuf_printf(b, "\"/></properties>\n");
    for (; k < end; k++) {
      const qc_tent *e = &l->v[order[k]];
      qc_sbuf_printf(b, "    <testcase classname=\"");
      qc_sbuf_xml(b, str(l, e->classname));
      qc_sbuf_printf(b, "\" name=\"");
      qc_sbuf_xml(b, str(l, e->name));
      if (rep[order[k]]) qc_sbuf_printf(b, " [%d]", rep[order[k]]);
      qc_sbuf_printf(b, "\" time=\"%.6f\">", case_time(e));
      if (e->failure >= 0) {
        qc_sbuf_printf(b, e->error ? "<error type=\"error\" message=\"" : "<failure type=\"failure\" message=\"");
        qc_sbuf_xml(b, str(l, e->failure));
        qc_sbuf_printf(b, "\"/>");
      }
      if (e->out >= 0) {
        qc_sbuf_printf(b, "<system-out>");
        qc_sbuf_xml(b, str(l, e->out));
        qc_sbuf_printf(b, "</system-out>");
      }
      qc_sbuf_printf(b, "</testcase>\n");
    }
    qc_sbuf_printf(b, "  </testsuite>\n");
  }
  free(sid);
  free(order);
  free(rep);
  return b->oom ? qc_err_sys("out of memory building the JUnit report") : QC_OK;
}

static double total_time(const qc_tlist *l) {
  double t = 0;
  for (int i = 0; i < l->n; i++) t += case_time(&l->v[i]);
  return t;
}

int qc_tlist_junit(const qc_tlist *l, const char *verb, qc_sbuf *out) {
  qc_sbuf b = *out;
  qc_sbuf_printf(&b, "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n<testsuites name=\"qatcheck ");
  qc_sbuf_xml(&b, verb);
  qc_sbuf_printf(&b, "\" tests=\"%d\" failures=\"%d\" errors=\"%d\" time=\"%.6f\">\n", l->n, qc_tlist_failures(l),
                 qc_tlist_errors(l), total_time(l));
  int rc = suites(l, &b);
  qc_sbuf_printf(&b, "</testsuites>\n");
  *out = b;
  if (rc) return rc;
  return b.oom ? qc_err_sys("out of memory building the JUnit report") : QC_OK;
}

/* The integer (or number) after ` name="` in the element text [s, e). */
static double attr_num(const char *s, const char *e, const char *name) {
  char pat[32];
  snprintf(pat, sizeof pat, " %s=\"", name);
  const char *p = strstr(s, pat);
  return p && p < e ? strtod(p + strlen(pat), NULL) : 0;
}

int qc_tlist_junit_append(const qc_tlist *l, qc_sbuf *doc) {
  const char *root = doc->s ? strstr(doc->s, "<testsuites ") : NULL;
  const char *rend = root ? strchr(root, '>') : NULL, *close = NULL;
  for (const char *p = rend; p && (p = strstr(p, "</testsuites>")) != NULL; p++) close = p;
  if (!root || !rend || !close) return qc_err_sys("JUnit report: no <testsuites> element to extend");
  const char *nm = strstr(root, " name=\"");
  qc_sbuf b = {0};
  qc_sbuf_printf(&b, "%.*s<testsuites", (int)(root - doc->s), doc->s);
  if (nm && nm < rend) qc_sbuf_printf(&b, "%.*s", (int)(strchr(nm + 7, '"') + 1 - nm), nm);
  qc_sbuf_printf(&b, " tests=\"%d\" failures=\"%d\" errors=\"%d\" time=\"%.6f\"", (int)attr_num(root, rend, "tests") + l->n,
                 (int)attr_num(root, rend, "failures") + qc_tlist_failures(l),
                 (int)attr_num(root, rend, "errors") + qc_tlist_errors(l), attr_num(root, rend, "time") + total_time(l));
  qc_sbuf_printf(&b, "%.*s", (int)(close - rend), rend);
  int rc = suites(l, &b);
  qc_sbuf_printf(&b, "</testsuites>\n");
  if (!rc && b.oom) rc = qc_err_sys("out of memory building the JUnit report");
  if (rc) { qc_sbuf_free(&b); return rc; }
  qc_sbuf_free(doc);
  *doc = b;
  return QC_OK;
}

int qc_tlist_markdown(const qc_tlist *l, const char *verb, const char *preamble, qc_prov *prov, qc_sbuf *out) {
  qc_sbuf b = *out;
  int nf = qc_tlist_failures(l);
  qc_sbuf_printf(&b, "# qatcheck %s: %s\n\n", verb, l->n == 0 ? "nothing checked" : nf ? "FAIL" : "pass");
  if (preamble && preamble[0]) qc_sbuf_printf(&b, "%s\n", preamble);
  qc_sbuf_printf(&b, "- %d check(s): %d passed, %d failed\n", l->n, l->n - nf, nf);
  qc_report_tool_md(&b);
  qc_prov_markdown(prov, &b);
  qc_sbuf_printf(&b, "\n");
  qc_sbuf_printf(&b, "| suite | check | verdict | detail |\n|---|---|---|---|\n");
  for (int i = 0; i < l->n; i++) {
    const qc_tent *e = &l->v[i];
    const char *detail = e->failure >= 0 ? str(l, e->failure) : e->out >= 0 ? str(l, e->out) : "";
    qc_sbuf_printf(&b, "| `");
    qc_sbuf_md(&b, str(l, e->suite));
    qc_sbuf_printf(&b, "` | ");
    qc_sbuf_md(&b, str(l, e->name));
    qc_sbuf_printf(&b, " | %s | ", e->error ? "**ERROR**" : e->failure >= 0 ? "**FAIL**" : "pass");
    qc_sbuf_md(&b, detail);
    qc_sbuf_printf(&b, " |\n");
  }
  if (nf || qc_tlist_errors(l)) {
    qc_sbuf_printf(&b, "\n## Failures (%d)\n\n", nf + qc_tlist_errors(l));
    for (int i = 0; i < l->n; i++) {
      const qc_tent *e = &l->v[i];
      if (e->failure < 0) continue;
      qc_sbuf_printf(&b, "- `");
      qc_sbuf_md(&b, str(l, e->suite));
      qc_sbuf_printf(&b, "` ");
      qc_sbuf_md(&b, str(l, e->name));
      qc_sbuf_printf(&b, ": ");
      qc_sbuf_md(&b, str(l, e->failure));
      qc_sbuf_printf(&b, "\n");
    }
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
