/* tlist.h: a flat list of named test cases, each passed or failed with a
 * message, and its JUnit XML and Markdown views. Every verb's JUnit report
 * is written from one (vjp's checks, contract's rows, fd's projections,
 * quant's comparisons, tol's derived bounds), so the XML and its escaping
 * live in one place. Strings are copied in; the caller's buffers can go. */
#ifndef QC_TLIST_H
#define QC_TLIST_H

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
int qc_tlist_failures(const qc_tlist *l);
/* JUnit XML: <testsuites name="qatcheck VERB" tests failures>, one
 * <testsuite> per suite, <testcase classname name>, <failure message/>,
 * <system-out>; XML-escaped; appended to out. */
int qc_tlist_junit(const qc_tlist *l, const char *verb, qc_sbuf *out);
/* Markdown: "# qatcheck VERB: pass|FAIL", the preamble lines (may be NULL),
 * then one table row per case (suite, case, verdict, message or output);
 * appended to out. */
int qc_tlist_markdown(const qc_tlist *l, const char *verb, const char *preamble, qc_sbuf *out);
void qc_tlist_free(qc_tlist *l);

#endif
