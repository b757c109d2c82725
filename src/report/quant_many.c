/* quant_many.c: the reports of a many-module `quant` run (a deployed
 * checkpoint against its master, or every module of a dump with deployed
 * bytes): JSON (each module: format, profile, naming convention, the
 * tensors compared, reproduced or mismatch, counts, the detail line; the
 * modules skipped and why), JUnit and Markdown (a testcase per module, a
 * mismatch a failure), and the console table. */
#include <cjson/cJSON.h>
#include <stdio.h>
#include <string.h>

#include "core/qc.h"
#include "report/report.h"
#include "report/tlist.h"

static int render_json(qc_sbuf *out, qc_prov *prov, const qc_quant_many_info *qi) {
  const qc_quant_rows *r = qi->rows;
  cJSON *root = qc_report_envelope(prov, "quant", qi->verdict);
  if (!root) return qc_err_sys("quant: out of memory building the report");
  cJSON_AddStringToObject(root, "mode", qi->master ? "checkpoint" : "dump");
  if (qi->master) {
    cJSON_AddStringToObject(cJSON_AddObjectToObject(root, "checkpoint"), "path", qi->deployed);
    cJSON_AddStringToObject(cJSON_AddObjectToObject(root, "master"), "path", qi->master);
  } else {
    cJSON_AddStringToObject(cJSON_AddObjectToObject(root, "dump"), "path", qi->deployed);
  }
  cJSON *sum = cJSON_AddObjectToObject(root, "summary");
  cJSON_AddNumberToObject(sum, "modules", r->n);
  cJSON_AddNumberToObject(sum, "mismatch", qi->fails);
  cJSON_AddNumberToObject(sum, "skipped", r->nskip);
  cJSON *checks = cJSON_AddArrayToObject(root, "checks");
  for (int i = 0; i < r->n; i++) {
    const qc_quant_row *w = &r->row[i];
    cJSON *o = cJSON_CreateObject();
    cJSON_AddStringToObject(o, "module", w->module);
    cJSON_AddStringToObject(o, "format", w->format);
    cJSON_AddStringToObject(o, "profile", qc_qprof_name(w->c.prof));
    cJSON_AddStringToObject(o, "convention", w->convention);
    cJSON_AddStringToObject(o, "tensors", w->tensors);
    cJSON_AddStringToObject(o, "result", w->c.ok ? "reproduced" : "mismatch");
    cJSON_AddNumberToObject(o, "elements", (double)w->c.r.total_payload);
    cJSON *mm = cJSON_AddObjectToObject(o, "mismatches");
    cJSON_AddNumberToObject(mm, "payload", (double)w->c.r.n_payload);
    cJSON_AddNumberToObject(mm, "scale", (double)w->c.r.n_scale);
    cJSON_AddNumberToObject(mm, "global_scale", (double)w->c.r.n_global);
    cJSON_AddNumberToObject(mm, "decoded_bf16", (double)w->c.r.n_decoded);
    cJSON_AddStringToObject(o, "detail", w->c.line);
    cJSON_AddItemToArray(checks, o);
  }
  cJSON *sk = cJSON_AddArrayToObject(root, "skipped");
  for (int i = 0; i < r->nskip; i++) {
    cJSON *o = cJSON_CreateObject();
    cJSON_AddStringToObject(o, "module", r->skip[i].module);
    cJSON_AddStringToObject(o, "why", r->skip[i].why);
    cJSON_AddItemToArray(sk, o);
  }
  return qc_report_json_render(root, out);
}

int qc_report_quant_many(qc_report_out *o, const qc_quant_many_info *qi) {
  qc_tlist tl = {0};
  int rc = QC_OK;
  char name[96];
  if (qc_report_wants(o, QC_REP_JUNIT) || qc_report_wants(o, QC_REP_MARKDOWN))
    for (int i = 0; i < qi->rows->n && !rc; i++) {
      const qc_quant_row *w = &qi->rows->row[i];
      snprintf(name, sizeof name, "%s/%s", w->format, qc_qprof_name(w->c.prof));
      rc = qc_tlist_add(&tl, "quant", w->module, name, w->c.ok ? NULL : w->c.line, w->c.ok ? w->c.line : NULL);
    }
  if (!rc && qc_report_wants(o, QC_REP_JSON)) rc = render_json(&o->doc[QC_REP_JSON], o->prov, qi);
  if (!rc && qc_report_wants(o, QC_REP_JUNIT)) rc = qc_tlist_junit(&tl, "quant", &o->doc[QC_REP_JUNIT]);
  if (!rc && qc_report_wants(o, QC_REP_MARKDOWN)) {
    char pre[2400];
    if (qi->master)
      snprintf(pre, sizeof pre, "- deployed checkpoint: `%s`, master `%s`: %d module(s), %d mismatch, %d skipped", qi->deployed,
               qi->master, qi->rows->n, qi->fails, qi->rows->nskip);
    else
      snprintf(pre, sizeof pre, "- dump: `%s`: %d module(s), %d mismatch", qi->deployed, qi->rows->n, qi->fails);
    rc = qc_tlist_markdown(&tl, "quant", pre, o->prov, &o->doc[QC_REP_MARKDOWN]);
  }
  qc_tlist_free(&tl);
  return rc;
}

void qc_report_quant_many_table(const qc_quant_many_info *qi) {
  const qc_quant_rows *r = qi->rows;
  int wm = 6;
  for (int i = 0; i < r->n; i++)
    if ((int)strlen(r->row[i].module) > wm) wm = (int)strlen(r->row[i].module);
  if (wm > 72) wm = 72;
  if (qi->master) printf("qatcheck quant: %s against master %s\n", qi->deployed, qi->master);
  else printf("qatcheck quant: %s\n", qi->deployed);
  printf("%-*s  %-18s  %-12s  %-18s  %-10s  %s\n", wm, "module", "format", "profile", "convention", "result", "detail");
  for (int i = 0; i < r->n; i++) {
    const qc_quant_row *w = &r->row[i];
    printf("%-*s  %-18s  %-12s  %-18s  %-10s  %s\n", wm, w->module, w->format, qc_qprof_name(w->c.prof), w->convention,
           w->c.ok ? "reproduced" : "MISMATCH", w->c.line);
  }
  if (r->nskip) {
    printf("\nnot compared (%d):\n", r->nskip);
    for (int i = 0; i < r->nskip && i < 20; i++) printf("  %s: %s\n", r->skip[i].module, r->skip[i].why);
    if (r->nskip > 20) printf("  ... and %d more (every one in the JSON report)\n", r->nskip - 20);
  }
  printf("\nquant: %s: %d module(s), %d mismatch\n", qi->fails ? "FAIL" : "pass", r->n, qi->fails);
}
