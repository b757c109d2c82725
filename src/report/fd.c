/* fd.c: the reports of `qatcheck fd`: the JSON (every projection with both
 * inner products, its relative error, tolerance and bound), one JUnit
 * testcase per projection, the Markdown, the console lines. */
#include <cjson/cJSON.h>
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "core/qc.h"
#include "report/report.h"
#include "report/tlist.h"

static cJSON *num_or_null(double v) { return isfinite(v) ? cJSON_CreateNumber(v) : cJSON_CreateNull(); }

static int render_json(qc_sbuf *out, qc_prov *prov, const qc_fd_info *fi) {
  const qc_fd_opts *o = fi->o;
  cJSON *root = qc_report_envelope(prov, "fd", fi->bad ? 1 : 0);
  if (!root) return qc_err_sys("fd: out of memory building the report");
  cJSON_AddStringToObject(root, "class", fi->cls);
  cJSON_AddStringToObject(root, "module", fi->module);
  cJSON_AddStringToObject(root, "shape", fi->shape);
  cJSON_AddStringToObject(root, "values", fi->values);
  cJSON_AddNumberToObject(root, "seed", (double)o->seed);
  cJSON_AddNumberToObject(root, "directions", o->directions);
  cJSON_AddNumberToObject(root, "h", o->h);
  cJSON_AddNumberToObject(root, "tol", o->tol);
  qc_report_totals(root, fi->n, fi->bad, 0);
  cJSON_AddStringToObject(root, "bound_rule", "|<u, J^T v> - <J u, v>| <= tol * ||u|| ||J^T v|| + 1e-12 sum |y v|");
  cJSON *rs = cJSON_AddArrayToObject(root, "rows");
  for (int i = 0; i < fi->n; i++) {
    const qc_fd_row *r = &fi->rows[i];
    cJSON *x = cJSON_CreateObject();
    cJSON_AddStringToObject(x, "class", fi->cls);
    cJSON_AddStringToObject(x, "tensor", r->tensor);
    cJSON_AddNumberToObject(x, "direction", r->dir);
    cJSON_AddItemToObject(x, "vjp", num_or_null(r->vjp));
    cJSON_AddItemToObject(x, "jvp", num_or_null(r->jvp));
    cJSON_AddItemToObject(x, "abs_diff", num_or_null(fabs(r->vjp - r->jvp)));
    cJSON_AddItemToObject(x, "rel_err", num_or_null(qc_fd_rel_err(r)));
    cJSON_AddNumberToObject(x, "tol", o->tol);
    cJSON_AddItemToObject(x, "bound", num_or_null(r->bound));
    cJSON_AddBoolToObject(x, "pass", r->pass);
    cJSON_AddItemToArray(rs, x);
  }
  return qc_report_json_render(root, out);
}

/* JUnit/Markdown: one testcase per projection. */
static int make_list(qc_tlist *l, const qc_fd_info *fi) {
  for (int i = 0; i < fi->n; i++) {
    const qc_fd_row *r = &fi->rows[i];
    char name[QC_NAMELEN + 32], msg[320];
    snprintf(name, sizeof name, "%s/dir%d", r->tensor, r->dir);
    snprintf(msg, sizeof msg, "<u, J^T v> = %.12e, <J u, v> = %.12e: |diff| %.2e %s bound %.2e (relative error %.2e)",
             r->vjp, r->jvp, fabs(r->vjp - r->jvp), r->pass ? "<=" : "exceeds", r->bound, qc_fd_rel_err(r));
    int rc = qc_tlist_add(l, fi->module, fi->cls, name, r->pass ? NULL : msg, r->pass ? msg : NULL);
    if (rc) return rc;
  }
  return QC_OK;
}

int qc_report_fd(qc_report_out *o, const qc_fd_info *fi) {
  qc_tlist tl = {0};
  int rc = QC_OK;
  if ((qc_report_wants(o, QC_REP_JUNIT) || qc_report_wants(o, QC_REP_MARKDOWN)) && (rc = make_list(&tl, fi))) goto done;
  qc_tlist_spread(&tl, fi->seconds);
  if (qc_report_wants(o, QC_REP_JSON) && (rc = render_json(&o->doc[QC_REP_JSON], o->prov, fi))) goto done;
  if (qc_report_wants(o, QC_REP_JUNIT) && (rc = qc_tlist_junit(&tl, "fd", &o->doc[QC_REP_JUNIT]))) goto done;
  if (qc_report_wants(o, QC_REP_MARKDOWN)) {
    char pre[QC_PATHLEN + 256];
    snprintf(pre, sizeof pre, "- module: `%s` (seed %llu, %d direction(s), tol %g, h %g)", fi->module,
             (unsigned long long)fi->o->seed, fi->o->directions, fi->o->tol, fi->o->h);
    rc = qc_tlist_markdown(&tl, "fd", pre, o->prov, &o->doc[QC_REP_MARKDOWN]);
  }
done:
  qc_tlist_free(&tl);
  return rc;
}

void qc_report_fd_table(const qc_fd_info *fi) {
  const qc_fd_row *rows = fi->rows;
  for (int i = 0; i < fi->n; i++)
    printf("%s %-10s dir %d: <u, J^T v> = % .12e  <J u, v> = % .12e  |diff| %.2e  bound %.2e  %s\n", fi->module,
           rows[i].tensor, rows[i].dir, rows[i].vjp, rows[i].jvp, fabs(rows[i].vjp - rows[i].jvp), rows[i].bound,
           rows[i].pass ? "agree" : "DISAGREE");
  printf("fd %s: %d of %d projections agree (tol %g, h %g): %s\n", fi->cls, fi->n - fi->bad, fi->n, fi->o->tol, fi->o->h,
         fi->bad ? "fail" : "pass");
}
