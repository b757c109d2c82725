/* quant.c: the reports of `qatcheck quant`: the JSON (each comparison:
 * module, format, profile, reproduced or mismatch, counts, the detail
 * line), JUnit and Markdown (a testcase per comparison; under --identify
 * one, failed when no profile reproduces the bytes), the console line. */
#include <cjson/cJSON.h>
#include <stdio.h>
#include <string.h>

#include "core/qc.h"
#include "report/report.h"
#include "report/tlist.h"

static int render_json(qc_sbuf *out, qc_prov *prov, const qc_quant_info *qi) {
  const qc_quant_cmp *c = qi->c;
  cJSON *root = qc_report_envelope(prov, "quant", qi->verdict);
  if (!root) return qc_err_sys("quant: out of memory building the report");
  cJSON_AddStringToObject(cJSON_AddObjectToObject(root, "dump"), "path", qi->dump);
  cJSON_AddStringToObject(root, "module", qi->module);
  cJSON_AddStringToObject(root, "format", qi->format);
  cJSON_AddStringToObject(root, "mode", qi->identify ? "identify" : "check");
  if (qi->identify) {
    cJSON *by = cJSON_AddArrayToObject(root, "reproduced_by");
    for (int i = 0; i < qi->n; i++)
      if (c[i].ok) cJSON_AddItemToArray(by, cJSON_CreateString(qc_qprof_name(c[i].prof)));
    if (qi->why) cJSON_AddStringToObject(root, "identification", qi->why);
  }
  int bad = 0;
  for (int i = 0; i < qi->n; i++) bad += !c[i].ok;
  qc_report_totals(root, qi->n, bad, 0);
  cJSON *checks = cJSON_AddArrayToObject(root, "checks");
  qc_qfmt fmt = QC_QF_NONE;
  qc_err_state es; /* a format the report cannot name: every profile is compared */
  qc_err_save(&es);
  if (qc_qfmt_parse(qi->format, &fmt)) fmt = QC_QF_NONE;
  qc_err_restore(&es);
  for (int i = 0; i < qi->n; i++) {
    cJSON *o = cJSON_CreateObject();
    cJSON_AddStringToObject(o, "module", qi->module);
    cJSON_AddStringToObject(o, "format", qi->format);
    cJSON_AddStringToObject(o, "profile", qc_qprof_name(c[i].prof));
    /* under --identify, a profile whose producer does not make the format is not compared */
    cJSON_AddStringToObject(o, "result", c[i].ok ? "reproduced" : qi->identify && !qc_qprof_makes(fmt, c[i].prof) ? "not_made" : "mismatch");
    cJSON_AddNumberToObject(o, "elements", (double)c[i].r.total_payload);
    cJSON *mm = cJSON_AddObjectToObject(o, "mismatches");
    cJSON_AddNumberToObject(mm, "payload", (double)c[i].r.n_payload);
    cJSON_AddNumberToObject(mm, "scale", (double)c[i].r.n_scale);
    cJSON_AddNumberToObject(mm, "global_scale", (double)c[i].r.n_global);
    cJSON_AddNumberToObject(mm, "decoded_bf16", (double)c[i].r.n_decoded);
    if (c[i].r.n_payload_given >= 0) cJSON_AddNumberToObject(mm, "payload_under_stored_scales", (double)c[i].r.n_payload_given);
    cJSON_AddStringToObject(o, "detail", c[i].line);
    cJSON_AddItemToArray(checks, o);
  }
  return qc_report_json_render(root, out);
}

/* JUnit/Markdown: a testcase per comparison; under --identify one, failed
 * when no profile reproduces the bytes. */
static int make_list(qc_tlist *l, const qc_quant_info *qi) {
  const qc_quant_cmp *c = qi->c;
  char name[96];
  if (!qi->identify) {
    for (int i = 0; i < qi->n; i++) {
      snprintf(name, sizeof name, "%s/%s", qi->format, qc_qprof_name(c[i].prof));
      int rc = qc_tlist_add(l, qi->module, qi->module, name, c[i].ok ? NULL : c[i].line, c[i].ok ? c[i].line : NULL);
      if (rc) return rc;
    }
    return QC_OK;
  }
  char out[512] = "";
  for (int i = 0, k = 0; i < qi->n && k < (int)sizeof out; i++)
    k += snprintf(out + k, sizeof out - (size_t)k, "%s%s %s", i ? ", " : "", qc_qprof_name(c[i].prof),
                  c[i].ok ? "reproduces" : "does not reproduce");
  snprintf(name, sizeof name, "%s/identify", qi->format);
  return qc_tlist_add(l, qi->module, qi->module, name, qi->any ? NULL : (qi->why ? qi->why : "no profile reproduces the deployed bytes"),
                      qi->any && qi->why ? qi->why : out);
}

int qc_report_quant(qc_report_out *o, const qc_quant_info *qi) {
  qc_tlist tl = {0};
  int rc = QC_OK;
  if ((qc_report_wants(o, QC_REP_JUNIT) || qc_report_wants(o, QC_REP_MARKDOWN)) && (rc = make_list(&tl, qi))) goto done;
  qc_tlist_spread(&tl, qi->seconds);
  if (qc_report_wants(o, QC_REP_JSON) && (rc = render_json(&o->doc[QC_REP_JSON], o->prov, qi))) goto done;
  if (qc_report_wants(o, QC_REP_JUNIT) && (rc = qc_tlist_junit(&tl, "quant", &o->doc[QC_REP_JUNIT]))) goto done;
  if (qc_report_wants(o, QC_REP_MARKDOWN)) {
    char pre[QC_PATHLEN + 1200];
    snprintf(pre, sizeof pre, "- dump: `%s`, module `%s`, format %s%s", qi->dump, qi->module, qi->format,
             qi->identify ? ", every profile (--identify)" : "");
    rc = qc_tlist_markdown(&tl, "quant", pre, o->prov, &o->doc[QC_REP_MARKDOWN]);
  }
done:
  qc_tlist_free(&tl);
  return rc;
}

void qc_report_quant_table(const qc_quant_info *qi) {
  const qc_quant_cmp *c = qi->c;
  if (!qi->identify) {
    printf("%s %s/%s: %s: %s\n", qi->module, qi->format, qc_qprof_name(c[0].prof), c[0].ok ? "reproduced" : "MISMATCH",
           c[0].line);
    return;
  }
  printf("%s %s: profiles that reproduce the deployed bytes:", qi->module, qi->format);
  for (int i = 0; i < qi->n; i++)
    if (c[i].ok) printf(" %s", qc_qprof_name(c[i].prof));
  printf("%s\n", qi->any ? "" : " none");
  if (!qi->any && qi->why) printf("  %s\n", qi->why);
}

/* ---- quant --calibration ------------------------------------------------------- */

static int calib_json(qc_sbuf *out, qc_prov *prov, const qc_calib_info *ci) {
  cJSON *root = qc_report_envelope(prov, "quant", ci->verdict);
  if (!root) return qc_err_sys("quant: out of memory building the report");
  cJSON_AddStringToObject(root, "mode", "calibration");
  cJSON *ps = cJSON_AddArrayToObject(root, "calibration");
  for (int i = 0; i < ci->npaths; i++) cJSON_AddItemToArray(ps, cJSON_CreateString(ci->paths[i]));
  cJSON_AddStringToObject(root, "device", ci->device);
  cJSON *rows = cJSON_AddArrayToObject(root, "paths");
  for (int i = 0; i < ci->n; i++) {
    const qc_calib_row *r = &ci->rows[i];
    cJSON *o = cJSON_CreateObject();
    cJSON_AddStringToObject(o, "profile", r->profile);
    cJSON_AddStringToObject(o, "format", r->format);
    cJSON_AddNumberToObject(o, "values", (double)r->values);
    cJSON_AddNumberToObject(o, "records", (double)r->records);
    cJSON *mm = cJSON_AddObjectToObject(o, "mismatching_bytes");
    cJSON_AddNumberToObject(mm, "payload", (double)r->bad_payload);
    cJSON_AddNumberToObject(mm, "scale", (double)r->bad_scale);
    cJSON_AddNumberToObject(mm, "global_scale", (double)r->bad_global);
    if (r->first[0]) cJSON_AddStringToObject(o, "first", r->first);
    cJSON_AddItemToArray(rows, o);
  }
  return qc_report_json_render(root, out);
}

int qc_report_calib(qc_report_out *o, const qc_calib_info *ci) {
  qc_tlist tl = {0};
  int rc = QC_OK;
  if (qc_report_wants(o, QC_REP_JUNIT) || qc_report_wants(o, QC_REP_MARKDOWN)) {
    for (int i = 0; !rc && i < ci->n; i++) {
      const qc_calib_row *r = &ci->rows[i];
      char name[96], msg[600];
      int bad = r->bad_payload || r->bad_scale || r->bad_global;
      snprintf(name, sizeof name, "%s/%s", r->format, r->profile);
      snprintf(msg, sizeof msg, "%lld values, %lld payload, %lld scale, %lld global-scale bytes differ%s%s", (long long)r->values,
               (long long)r->bad_payload, (long long)r->bad_scale, (long long)r->bad_global, r->first[0] ? "; first: " : "",
               r->first);
      rc = qc_tlist_add(&tl, ci->device, "calibration", name, bad ? msg : NULL, bad ? NULL : msg);
    }
  }
  if (!rc && qc_report_wants(o, QC_REP_JSON)) rc = calib_json(&o->doc[QC_REP_JSON], o->prov, ci);
  if (!rc && qc_report_wants(o, QC_REP_JUNIT)) rc = qc_tlist_junit(&tl, "quant", &o->doc[QC_REP_JUNIT]);
  if (!rc && qc_report_wants(o, QC_REP_MARKDOWN)) {
    char pre[256];
    snprintf(pre, sizeof pre, "- calibration: %d path(s) compared on %s", ci->n, ci->device);
    rc = qc_tlist_markdown(&tl, "quant", pre, o->prov, &o->doc[QC_REP_MARKDOWN]);
  }
  qc_tlist_free(&tl);
  return rc;
}

void qc_report_calib_table(const qc_calib_info *ci) {
  long long vals = 0, bad = 0;
  printf("%-20s %-20s %12s %8s %10s %10s %8s\n", "profile", "format", "values", "records", "payload", "scale", "global");
  for (int i = 0; i < ci->n; i++) {
    const qc_calib_row *r = &ci->rows[i];
    printf("%-20s %-20s %12lld %8lld %10lld %10lld %8lld\n", r->profile, r->format, (long long)r->values, (long long)r->records,
           (long long)r->bad_payload, (long long)r->bad_scale, (long long)r->bad_global);
    vals += r->values;
    bad += r->bad_payload + r->bad_scale + r->bad_global;
  }
  for (int i = 0; i < ci->n; i++)
    if (ci->rows[i].first[0]) printf("first mismatch of %s/%s: %s\n", ci->rows[i].profile, ci->rows[i].format, ci->rows[i].first);
  printf("quant --calibration on %s: %lld values over %d producer paths, %lld mismatching bytes\n", ci->device, vals, ci->n, bad);
}
