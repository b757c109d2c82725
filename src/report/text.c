/* text.c: the human views of a result list: the stdout table, JUnit XML and
 * Markdown (see check.h). */
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "model/check.h"
#include "core/qc.h"
#include "report/sbuf.h"
#include "report/tlist.h"
#include "report/report.h"

static const char *fmt_num(char *buf, size_t n, double v, const char *f) {
  if (isnan(v)) snprintf(buf, n, "-");
  else snprintf(buf, n, f, v);
  return buf;
}

void qc_report_table(const qc_report_info *info, const qc_results *r) {
  if (qc_quiet) return;
  int wm = 6;
  for (int i = 0; i < r->n; i++) {
    int l = (int)strlen(r->v[i].module);
    if (l > wm) wm = l;
  }
  if (wm > 60) wm = 60;
  int wv = 7; /* the variant column: the reference each check was judged against */
  for (int i = 0; i < r->n; i++) {
    int l = (int)strlen(r->v[i].variant_id);
    if (l > wv) wv = l;
  }
  int wr = 9; /* the reference column: the GEMM that made each check's reference */
  for (int i = 0; i < r->n; i++) {
    char rb[64];
    int l = (int)strlen(qc_report_ref_name(&r->v[i], rb, sizeof rb));
    if (l > wr) wr = l;
  }
  printf("%-*s  %-10s  %-10s  %10s  %12s  %11s  %11s  %-*s  %-*s  %-7s %s\n", wm, "module", "dy", "tensor", "rel_l2", "cosine",
         "norm_ratio", "noise_x", wr, "reference", wv, "variant", "verdict", "why");
  for (int i = 0; i < r->n; i++) {
    const qc_check *k = &r->v[i];
    char a[32], b[32], c[32], d[32], rb[64];
    const char *mod = k->module;
    int l = (int)strlen(mod);
    if (l > wm) mod += l - wm;
    if (k->has_metrics)
      printf("%-*s  %-10s  %-10s  %10s  %12s  %11s  %11s  %-*s  %-*s  %-7s %s\n", wm, mod, k->dy, k->tensor,
             fmt_num(a, sizeof a, k->m.rel_l2, "%.3e"), k->m.cosine_null ? "null" : fmt_num(b, sizeof b, k->m.cosine, "%.9f"),
             fmt_num(c, sizeof c, k->m.norm_ratio, "%.6f"), fmt_num(d, sizeof d, k->m.noise_multiple, "%.2f"), wr,
             qc_report_ref_name(k, rb, sizeof rb), wv, k->variant_id[0] ? k->variant_id : "none",
             k->verdict == QC_V_PASS ? "pass" : "FAIL", k->why);
    else
      printf("%-*s  %-10s  %-10s  %10s  %12s  %11s  %11s  %-*s  %-*s  %-7s %s\n", wm, mod, k->dy, k->tensor, "-", "-", "-", "-",
             wr, "-", wv, "-", k->verdict == QC_V_PASS ? "pass" : "FAIL", k->why);
  }
  int nf = 0, nd = 0;
  for (int i = 0; i < r->n; i++) nf += r->v[i].verdict != QC_V_PASS;
  for (int i = 0; i < r->n; i++) /* what each failure's signature says */
    if (r->v[i].diagnosis[0])
      printf("%s%s %s %s: %s\n", nd++ ? "" : "\ndiagnosis:\n", r->v[i].module, r->v[i].dy, r->v[i].tensor, r->v[i].diagnosis);
  int v = qc_results_verdict(r);
  printf("\n%s: %s: %d checks, %d failed%s%s\n", info->verb, v == 0 ? "pass" : v == 1 ? "FAIL" : "nothing checked", r->n,
         nf, info->device ? " on " : "", info->device ? info->device : "");
}

const char *qc_report_check_name(const qc_check *k, char *buf, int n) {
  if (strcmp(k->tensor, "quantizer") == 0) snprintf(buf, (size_t)n, "deployed_bytes/weight_q");
  else if (strncmp(k->tensor, "quantizer/", 10) == 0) snprintf(buf, (size_t)n, "deployed_bytes/%s_q", k->tensor + 10);
  else snprintf(buf, (size_t)n, "%s/%s", k->dy, k->tensor);
  return buf;
}

const char *qc_report_ref_name(const qc_check *k, char *buf, int n) {
  if (!k->ref.slices) snprintf(buf, (size_t)n, "float64");
  else if (k->ref.kept) snprintf(buf, (size_t)n, "ozaki_int8:%d", k->ref.slices);
  else snprintf(buf, (size_t)n, "float64 (ozaki_int8:%d fell back)", k->ref.slices);
  return buf;
}

/* Seconds of check i: its module's audit time shared by its checks. */
static double check_time(const qc_report_info *info, int i) {
  for (int j = 0; info->modules && j < info->modules->n; j++) {
    const qc_modinfo *mi = &info->modules->v[j];
    if (i >= mi->first && i < mi->first + mi->nchecks) return mi->nchecks ? mi->seconds / mi->nchecks : 0;
  }
  return 0;
}

/* The JUnit report of a vjp run into out: one testcase per check, suite
 * the module. */
static int qc_report_junit(qc_sbuf *out, const qc_report_info *info, const qc_results *r) {
  /* one testsuite per module, in the order modules first appear; a testcase
   * is the module (classname) and dY/tensor (name) */
  qc_tlist l = {0};
  int rc = QC_OK;
  for (int i = 0; i < r->n && !rc; i++) {
    const qc_check *k = &r->v[i];
    char name[2 * QC_NAMELEN + 2], out[320], rb[64];
    if (k->has_metrics)
      snprintf(out, sizeof out, "rel_l2=%.6g cosine=%.12g norm_ratio=%.9g max_abs=%.6g noise_multiple=%.4g variant=%s reference=%s",
               k->m.rel_l2, k->m.cosine, k->m.norm_ratio, k->m.max_abs, k->m.noise_multiple,
               k->variant_id[0] ? k->variant_id : "none", qc_report_ref_name(k, rb, sizeof rb));
    rc = qc_tlist_add(&l, k->module, k->module, qc_report_check_name(k, name, sizeof name),
                      k->verdict != QC_V_PASS ? k->why : NULL, k->has_metrics ? out : NULL);
    if (!rc) qc_tlist_time(&l, check_time(info, i));
  }
  /* warnings (weak tolerances run with --allow-weak-tolerances): one passed testcase each, the text as its output */
  const char *p = info->warnings;
  char line[1024];
  while (!rc && qc_report_line(&p, line, sizeof line)) {
    char out[1040];
    snprintf(out, sizeof out, "warning: %s", line);
    rc = qc_tlist_add(&l, "qatcheck warnings", "warning", "weak tolerance", NULL, out);
  }
  if (!rc) rc = qc_tlist_junit(&l, info->verb, out);
  qc_tlist_free(&l);
  return rc;
}

/* The Markdown report of a vjp run into out (prov: its inputs). */
static int qc_report_markdown(qc_sbuf *out, qc_prov *prov, const qc_report_info *info, const qc_results *r) {
  qc_sbuf b = *out;
  int v = qc_results_verdict(r), nf = 0;
  for (int i = 0; i < r->n; i++) nf += r->v[i].verdict != QC_V_PASS;
  qc_sbuf_printf(&b, "# qatcheck %s: %s\n\n", info->verb, v == 0 ? "pass" : v == 1 ? "FAIL" : "nothing checked");
  qc_sbuf_printf(&b, "- %d check(s): %d passed, %d failed", r->n, r->n - nf, nf);
  if (info->modules) qc_sbuf_printf(&b, "; %d module instance(s)", info->modules->n);
  qc_sbuf_printf(&b, "\n");
  if (info->case_path)
    qc_sbuf_printf(&b, "- case: `%s` (%s), sha256 `%s`\n", info->case_name ? info->case_name : "", info->case_path,
                   info->case_sha256 ? info->case_sha256 : "");
  qc_sbuf_printf(&b, "- device: %s\n", info->device ? info->device : "cpu");
  qc_report_tool_md(&b);
  qc_prov_markdown(prov, &b);
  const char *p = info->warnings;
  char line[1024];
  if (p && *p) qc_sbuf_printf(&b, "\n");
  while (qc_report_line(&p, line, sizeof line)) {
    qc_sbuf_printf(&b, "> **warning**: ");
    qc_sbuf_md(&b, line);
    qc_sbuf_printf(&b, "\n\n");
  }
  if (nf) {
    qc_sbuf_printf(&b, "\n## Failures (%d)\n\n", nf);
    for (int i = 0; i < r->n; i++) {
      const qc_check *k = &r->v[i];
      char name[2 * QC_NAMELEN + 2];
      if (k->verdict == QC_V_PASS) continue;
      qc_sbuf_printf(&b, "- `");
      qc_sbuf_md(&b, k->module);
      qc_sbuf_printf(&b, "` ");
      qc_sbuf_md(&b, qc_report_check_name(k, name, sizeof name));
      qc_sbuf_printf(&b, ": ");
      qc_sbuf_md(&b, k->why);
      qc_sbuf_printf(&b, "\n");
    }
  }
  qc_sbuf_printf(&b, "\n## Checks\n\n");
  qc_sbuf_printf(&b, "| module | dy | tensor | rel_l2 | cosine | norm_ratio | max_abs | noise x | reference | variant | verdict | why |\n");
  qc_sbuf_printf(&b, "|---|---|---|---:|---:|---:|---:|---:|---|---|---|---|\n");
  for (int i = 0; i < r->n; i++) {
    const qc_check *k = &r->v[i];
    qc_sbuf_printf(&b, "| `");
    qc_sbuf_md(&b, k->module);
    qc_sbuf_printf(&b, "` | ");
    qc_sbuf_md(&b, k->dy);
    qc_sbuf_printf(&b, " | ");
    qc_sbuf_md(&b, k->tensor);
    char rb[64];
    if (k->has_metrics)
      qc_sbuf_printf(&b, " | %.3e | %.9f | %.6f | %.3e | %.2f | %s | %s | %s | ", k->m.rel_l2, k->m.cosine, k->m.norm_ratio,
                     k->m.max_abs, k->m.noise_multiple, qc_report_ref_name(k, rb, sizeof rb),
                     k->variant_id[0] ? k->variant_id : "none", k->verdict == QC_V_PASS ? "pass" : "**FAIL**");
    else
      qc_sbuf_printf(&b, " | - | - | - | - | - | - | - | %s | ", k->verdict == QC_V_PASS ? "pass" : "**FAIL**");
    qc_sbuf_md(&b, k->why);
    qc_sbuf_printf(&b, " |\n");
  }
  int nd = 0;
  for (int i = 0; i < r->n; i++) { /* what each failure's signature says */
    const qc_check *k = &r->v[i];
    if (!k->diagnosis[0]) continue;
    qc_sbuf_printf(&b, "%s- `", nd++ ? "" : "\n## Diagnosis\n\n");
    qc_sbuf_md(&b, k->module);
    qc_sbuf_printf(&b, "` ");
    qc_sbuf_md(&b, k->dy);
    qc_sbuf_printf(&b, " ");
    qc_sbuf_md(&b, k->tensor);
    qc_sbuf_printf(&b, ": ");
    qc_sbuf_md(&b, k->diagnosis);
    qc_sbuf_printf(&b, "\n");
  }
  qc_sbuf_printf(&b, "\n## Tolerances and their reasoning\n\n");
  for (int i = 0; i < r->n; i++) {
    const qc_check *k = &r->v[i];
    int seen = 0;
    for (int j = 0; j < i && !seen; j++) seen = strcmp(r->v[j].tensor, k->tensor) == 0;
    if (seen || !k->has_tol) continue;
    qc_sbuf_printf(&b, "- `%s`: ", k->tensor);
    qc_sbuf_md(&b, k->tol.reasoning);
    qc_sbuf_printf(&b, "\n");
  }
  *out = b;
  return b.oom ? qc_err_sys("out of memory building the Markdown report") : QC_OK;
}

int qc_report_vjp(qc_report_out *o, const qc_report_info *info, const qc_results *r) {
  int rc = QC_OK;
  if (qc_report_wants(o, QC_REP_JSON)) rc = qc_report_json(&o->doc[QC_REP_JSON], o->prov, info, r);
  if (!rc && qc_report_wants(o, QC_REP_JUNIT)) rc = qc_report_junit(&o->doc[QC_REP_JUNIT], info, r);
  if (!rc && qc_report_wants(o, QC_REP_MARKDOWN)) rc = qc_report_markdown(&o->doc[QC_REP_MARKDOWN], o->prov, info, r);
  return rc;
}
