/* audit.h: the audit document of `qatcheck report` (inside report/): the
 * evidence read back from the verbs' JSON reports (audit_read.c), one
 * writer that renders the same document as GitHub-flavoured Markdown and
 * as one self-contained HTML file (audit_doc.c: no scripts, no external
 * resources, plots inline as SVG, print CSS), and its sections, in the
 * method's order: the one-screen summary and the inputs (audit.c), layer 1
 * per class with the coverage matrix (audit_l1.c), layer 2 per class and
 * layer (audit_l2.c), layer 3 and the one-step update (audit_l3.c); where
 * a row came from, the suspicious passes and the reference GEMMs
 * (audit_extra.c). */
#ifndef QC_REPORT_AUDIT_H
#define QC_REPORT_AUDIT_H

#include <cjson/cJSON.h>

#include "model/evidence.h"
#include "report/baseline.h"
#include "report/report.h"
#include "report/sbuf.h"

/* Read one JSON report into e (appended). QC_OK, QC_EINPUT (not a
 * qatcheck JSON report, unreadable), QC_ESYS. */
int qc_audit_read(const char *path, qc_evidence *e);

/* The input report src names, for a row that came from it: its file's
 * base name and, when the report names one, its case ("v_fail.json: case
 * linear_dump"). A static buffer, valid until the next call. */
const char *qc_audit_src_name(const qc_evidence *e, int src);

/* A step report's per-arm numbers ({"under_test": {"recomputed": 1.8421,
 * "implied": 1.8421}, ...}) in words into out[cap]: "under_test 1.8421
 * (implied by the update 1.8421)", ", "-separated. */
void qc_audit_arm_numbers(const cJSON *n, char *out, size_t cap);

/* Append printf-style to the NUL-terminated buf of size n (truncating). */
void qc_cat(char *buf, size_t n, const char *fmt, ...) __attribute__((format(printf, 3, 4)));

/* ---- the writer: Markdown and HTML at once ------------------------------------------ */

typedef struct qc_doc {
  qc_sbuf md, html;
  int ncols, col;            /* the open table's columns and the next cell */
  const char *align;         /* per column: 'l' or 'r' */
  char aligns[32];
  int in_row, in_p, in_li;
} qc_doc;

void qc_doc_begin(qc_doc *d, const char *title);
/* Close the HTML page; QC_OK or QC_ESYS (out of memory anywhere). */
int qc_doc_end(qc_doc *d);
/* A heading of level 1-4 with an anchor id (NULL: none). */
void qc_doc_h(qc_doc *d, int level, const char *id, const char *fmt, ...) __attribute__((format(printf, 4, 5)));
/* Paragraphs and list items: open, then inline pieces, then close. */
void qc_doc_p(qc_doc *d);
void qc_doc_li(qc_doc *d);
void qc_doc_end_block(qc_doc *d);
void qc_doc_text(qc_doc *d, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
void qc_doc_code(qc_doc *d, const char *s);
void qc_doc_strong(qc_doc *d, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* A verdict word, marked: pass, FAIL, error, deviates, ... */
void qc_doc_verdict(qc_doc *d, const char *v);
/* A link to an anchor of the document. */
void qc_doc_ref(qc_doc *d, const char *id, const char *text);
/* A table: spec "l:module|r:rel_l2|..." (alignment, header); then rows of
 * cells. A row with fewer cells is padded, so every row has them all. */
void qc_doc_table(qc_doc *d, const char *spec);
void qc_doc_tr(qc_doc *d);
void qc_doc_td(qc_doc *d, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
void qc_doc_td_code(qc_doc *d, const char *s);
void qc_doc_td_verdict(qc_doc *d, const char *v);
/* A number cell: %.*g with the given significant digits, "-" when not finite. */
void qc_doc_td_num(qc_doc *d, double v, int digits);
void qc_doc_table_end(qc_doc *d);
/* A plot (an <svg> element) with its caption; Markdown gets the caption and
 * a pointer to the HTML document, where the plot is. */
void qc_doc_figure(qc_doc *d, const qc_sbuf *svg, const char *caption);

/* ---- the sections ------------------------------------------------------------------------ */

/* What the method requires of a whole audit and the reports leave missing
 * (audit_need.c; docs/audit.md, "A whole audit"): one entry per missing
 * requirement, its layer ("layer 1", "one-step", "layer 2", "layer 3") and
 * why it is required; and whether layer 2 is required at all (l2_why: the
 * module that makes it so). */
#define QC_AUDIT_MAXNEED 16
typedef struct qc_audit_need {
  int n;
  char layer[QC_AUDIT_MAXNEED][16];
  char why[QC_AUDIT_MAXNEED][800];
  int l2_required;
  char l2_why[800];
} qc_audit_need;
void qc_audit_needs(const qc_evidence *e, qc_audit_need *n);

/* What the document and its summary need beyond the evidence. */
typedef struct qc_audit_ctx {
  const qc_evidence *e;
  double factor;             /* of the regression rule */
  int nreg;                  /* baseline comparisons: one list per input report (NULL rows: none) */
  qc_regress_list *reg;      /* [e->nsrc] */
  const char **reg_base;     /* [e->nsrc] the baseline each was compared with (NULL: none) */
  int allow_incomplete;      /* --allow-incomplete: a layer the method requires may be missing (exit 0, still "incomplete") */
  qc_audit_need need;        /* set by qc_audit_render */
} qc_audit_ctx;

/* 1 when a requirement of the layer of verb ("vjp", "step", "contract",
 * "sft") is missing. */
int qc_audit_need_has(const qc_audit_need *n, const char *verb);
/* The summary's completeness paragraph: what is missing and why, or that
 * the audit is whole. */
void qc_audit_completeness(qc_doc *d, const qc_audit_ctx *a);

/* The section of the regressions against the baselines (audit_extra.c). */
void qc_audit_regressions(qc_doc *d, const qc_audit_ctx *a);

/* Layer 1 in numbers, for the summary. */
typedef struct qc_l1_summary {
  int checks, failed, modules, classes;
  int cov_applicable, cov_covered;   /* (class, item) pairs */
} qc_l1_summary;

void qc_audit_l1_summary(const qc_evidence *e, qc_l1_summary *s);
/* The missing coverage, "item (class)" by name, "; "-separated, into b (at most `max` entries, then "and N more"). */
void qc_audit_missing(const qc_evidence *e, qc_sbuf *b, int max);
/* How much of its tightest bound check k uses (1 = at the bound; NAN: no bound). */
double qc_audit_bound_use(const qc_check *k);
void qc_audit_l1(qc_doc *d, const qc_evidence *e);
void qc_audit_l2(qc_doc *d, const qc_evidence *e);
void qc_audit_l3(qc_doc *d, const qc_evidence *e);
void qc_audit_step(qc_doc *d, const qc_evidence *e);

/* Suspicious passes: a check that passed with its error at least
 * QC_AUDIT_SUSPICIOUS times its noise floor (noise_multiple), or with a
 * relative error of QC_AUDIT_SUSPICIOUS_REL or more (an error half the
 * gradient's size): a tolerance so loose it passes a real defect (a
 * transposed weight gradient measures ~850x, so 1000x would miss it).
 * Their number, listed by qc_audit_suspicious. */
#define QC_AUDIT_SUSPICIOUS 100.0
#define QC_AUDIT_SUSPICIOUS_REL 0.5
int qc_audit_nsuspicious(const qc_evidence *e);
void qc_audit_suspicious(qc_doc *d, const qc_evidence *e);

/* The GEMMs the references of class cls's checks of gradient `tensor` came
 * from (vjp --reference; report.h qc_report_ref_name), each with its number
 * of checks: "float64 (12)", "ozaki_int8:4 (3); float64 (9)". Into buf. */
void qc_audit_ref_gemms(const qc_evidence *e, const char *cls, const char *tensor, char *buf, size_t n);

/* The console's one-line summary: the verdict, the reports, and each layer
 * (vjp, contract, sft, step, other) with its reports, checks and failures,
 * the coverage and the suspicious passes. Into b. */
void qc_audit_console(const qc_audit_ctx *a, qc_sbuf *b);

/* Compare each baseline of the run's gate g with the input report of its
 * verb (of its case or dump when several have the verb): fills a->reg and
 * a->reg_base (allocated here, [e->nsrc]). A baseline that matches no input,
 * or a second one for an input, is an error. */
int qc_audit_baselines(qc_audit_ctx *a, const qc_gate *g);

/* The whole document into o's Markdown and HTML docs (those asked for), its
 * JSON summary and JUnit (a->need filled first); *verdict 0 every input
 * passed and the audit is whole (or --allow-incomplete accepts what is
 * missing), 1 not. */
int qc_audit_render(qc_report_out *o, qc_audit_ctx *a, int *verdict);

#endif
