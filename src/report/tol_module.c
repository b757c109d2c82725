/* tol_module.c: the output and reports of `qatcheck tol --dump F --module
 * PATH`: every gradient's derived member merged into one case-file
 * "tolerances" object (stdout), the JSON (dump, module, each derivation's
 * command and member), one passed JUnit/Markdown testcase per gradient. */
#include <cjson/cJSON.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/qc.h"
#include "report/report.h"
#include "report/tlist.h"

/* {"tolerances": {<every member>}} as a cJSON tree, NULL out of memory. */
static cJSON *merged(const qc_tol_info *ti, int n) {
  cJSON *root = cJSON_CreateObject(), *tols = root ? cJSON_AddObjectToObject(root, "tolerances") : NULL;
  if (!tols) { cJSON_Delete(root); return NULL; }
  for (int i = 0; i < n; i++) {
    char *txt = qc_report_tol_member(&ti[i]);
    cJSON *m = txt ? cJSON_Parse(txt) : NULL;
    free(txt);
    cJSON *one = m ? cJSON_DetachItemFromObjectCaseSensitive(m, ti[i].tensor) : NULL;
    cJSON_Delete(m);
    if (!one) { cJSON_Delete(root); return NULL; }
    cJSON_AddItemToObject(tols, ti[i].tensor, one);
  }
  return root;
}

char *qc_report_tol_members(const qc_tol_info *ti, int n) {
  cJSON *root = merged(ti, n);
  char *txt = root ? cJSON_Print(root) : NULL;
  cJSON_Delete(root);
  return txt;
}

int qc_report_tol_module(qc_report_out *o, const qc_tol_info *ti, int n, const char *dump, const char *module) {
  qc_tlist tl = {0};
  int rc = QC_OK;
  if (qc_report_wants(o, QC_REP_JSON)) {
    cJSON *root = qc_report_envelope(o->prov, "tol", 0), *m = merged(ti, n);
    if (!root || !m) {
      cJSON_Delete(root);
      cJSON_Delete(m);
      return qc_err_sys("tol: out of memory building the report");
    }
    cJSON_AddStringToObject(cJSON_AddObjectToObject(root, "dump"), "path", dump);
    cJSON_AddStringToObject(root, "module", module);
    cJSON *d = cJSON_AddArrayToObject(root, "derivations");
    for (int i = 0; i < n; i++) {
      cJSON *x = cJSON_CreateObject();
      cJSON_AddStringToObject(x, "tensor", ti[i].tensor);
      cJSON_AddStringToObject(x, "command", ti[i].command);
      cJSON_AddStringToObject(x, "reasoning", ti[i].reasoning);
      cJSON_AddItemToArray(d, x);
    }
    cJSON_AddItemToObject(root, "tolerances", cJSON_DetachItemFromObjectCaseSensitive(m, "tolerances"));
    cJSON_Delete(m);
    if ((rc = qc_report_json_render(root, &o->doc[QC_REP_JSON]))) return rc;
  }
  if (!qc_report_wants(o, QC_REP_JUNIT) && !qc_report_wants(o, QC_REP_MARKDOWN)) return QC_OK;
  for (int i = 0; i < n && !rc; i++) rc = qc_tlist_add(&tl, module, "tol", ti[i].tensor, NULL, ti[i].reasoning);
  if (!rc && qc_report_wants(o, QC_REP_JUNIT)) rc = qc_tlist_junit(&tl, "tol", &o->doc[QC_REP_JUNIT]);
  if (!rc && qc_report_wants(o, QC_REP_MARKDOWN)) {
    char pre[2400];
    snprintf(pre, sizeof pre, "- dump: `%s`, module `%s`: every gradient's tolerance, K and dtypes read from the dump", dump, module);
    rc = qc_tlist_markdown(&tl, "tol", pre, o->prov, &o->doc[QC_REP_MARKDOWN]);
  }
  qc_tlist_free(&tl);
  return rc;
}
