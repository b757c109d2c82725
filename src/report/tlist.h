/* tlist.h: a flat list of named test cases, each passed or failed with a
 * message, and its JUnit XML and Markdown views. Every verb's JUnit report
 * is written from one (vjp's checks, contract's rows, fd's projections,
 * quant's comparisons, tol's derived bounds), so the XML and its escaping
 * live in one place. Strings are copied in; the caller's buffers can go. */
#ifndef QC_TLIST_H
#define QC_TLIST_H

#include "report/prov.h"
#include "report/sbuf.h"

typedef struct qc_tlist {
  qc_sbuf text;              /* every string, NUL-terminated, back to back */
  struct qc_tent *v;
  int n, cap;
  int oom;
} qc_tlist;

/* Add one test case. suite groups cases into a <testsuite> (suites in the
 * order they first appear); failure NULL: passed, else the failure message
 * (may be ""); out NULL or the <system-out> text. QC_OK or QC_ESYS. */
int qc_tlist_add(qc_tlist *l, const char *suite, const char *classname, const char *name, const char *failure,
                 const char *out);
/* Add a case that could not run: an <error message/> (a run that exits 2). */
int qc_tlist_add_error(qc_tlist *l, const char *suite, const char *classname, const char *name, const char *message);
/* The wall time of the last case added (seconds; by default a case gets an
 * equal share of qc_tlist_spread's total, else 0). */
void qc_tlist_time(qc_tlist *l, double seconds);
/* Give each case without its own time total / n seconds. */
void qc_tlist_spread(qc_tlist *l, double total);
/* JUnit XML (the common schema: Jenkins' junit-10): <testsuites name=
 * "qatcheck VERB" tests failures errors time>, one <testsuite> per suite
 * (name tests failures errors skipped time timestamp hostname),
 * <testcase classname name time>, <failure message/> or <error message/>,
 * <system-out>; XML-escaped; appended to out. A (classname, name) pair
 * that repeats gets " [2]", " [3]", ... so every testcase is unique. */
int qc_tlist_junit(const qc_tlist *l, const char *verb, qc_sbuf *out);
/* Append l's suites to a JUnit document qc_tlist_junit rendered (the
 * counts of its <testsuites> updated). */
int qc_tlist_junit_append(const qc_tlist *l, qc_sbuf *doc);
/* Markdown: "# qatcheck VERB: pass|FAIL", the run's provenance (prov, may
 * be NULL), the preamble lines (may be NULL), then one table row per case
 * (suite, case, verdict, message or output); appended to out. */
int qc_tlist_markdown(const qc_tlist *l, const char *verb, const char *preamble, qc_prov *prov, qc_sbuf *out);
void qc_tlist_free(qc_tlist *l);

#endif
