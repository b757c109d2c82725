/* tol.c: the output and reports of `qatcheck tol`: the case-file member
 * (stdout), the JSON (inputs with defaults resolved, every term, the
 * member), one passed JUnit/Markdown testcase per derived bound. */
#include <cjson/cJSON.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/qc.h"
#include "report/report.h"
#include "report/tlist.h"

static cJSON *num_or_null(double v, int has) { return has ? cJSON_CreateNumber(v) : cJSON_CreateNull(); }

/* The case-file member: {"<tensor>": {rel_l2, max_abs, cosine_min, norm_ratio, noise_multiple, reasoning}}. */
static cJSON *member_json(const char *tensor, const qc_tol_terms *t, const char *why) {
  cJSON *root = cJSON_CreateObject();
  cJSON *o = root ? cJSON_AddObjectToObject(root, tensor) : NULL;
  cJSON *nr = cJSON_CreateArray();
  if (!o || !nr) {
    cJSON_Delete(nr);
    cJSON_Delete(root);
    return NULL;
  }
  cJSON_AddNumberToObject(o, "rel_l2", t->rel_l2);
  if (t->has_max_abs) cJSON_AddNumberToObject(o, "max_abs", t->max_abs);
  cJSON_AddNumberToObject(o, "cosine_min", t->cosine_min);
  cJSON_AddItemToArray(nr, cJSON_CreateNumber(t->norm_lo));
  cJSON_AddItemToArray(nr, cJSON_CreateNumber(t->norm_hi));
  cJSON_AddItemToObject(o, "norm_ratio", nr);
  cJSON_AddNumberToObject(o, "noise_multiple", t->noise_multiple);
  cJSON_AddStringToObject(o, "reasoning", why);
  return root;
}

/* The JSON report: envelope, the command, the inputs with defaults
 * resolved, every term, and the member as a case file takes it. */
static int render_json(qc_sbuf *out, qc_prov *prov, const char *tensor, const qc_tol_spec *s, const qc_tol_terms *t,
                       const char *cmd, cJSON *member) {
  cJSON *root = qc_report_envelope(prov, "tol", 0);
  if (!root) return qc_err_sys("tol: out of memory building the report");
  cJSON_AddStringToObject(root, "command", cmd);
  qc_report_totals(root, t->has_max_abs ? 5 : 4, 0, 0);
  cJSON *in = cJSON_AddObjectToObject(root, "inputs");
  cJSON_AddStringToObject(in, "tensor", tensor);
  cJSON_AddStringToObject(in, "out_dtype", s->out_dtype);
  cJSON_AddStringToObject(in, "operand_dtype", s->operand_dtype ? s->operand_dtype : s->out_dtype);
  cJSON_AddStringToObject(in, "acc_dtype", s->acc_dtype ? s->acc_dtype : "float32");
  cJSON_AddStringToObject(in, "format", s->format ? s->format : "none");
  cJSON_AddNumberToObject(in, "k", (double)s->k);
  cJSON_AddNumberToObject(in, "rounded_operands", s->rounded_operands);
  cJSON_AddNumberToObject(in, "lambda", t->lambda);
  cJSON_AddNumberToObject(in, "margin", t->margin);
  cJSON_AddItemToObject(in, "scale", num_or_null(s->scale, s->scale > 0));
  cJSON *tm = cJSON_AddObjectToObject(root, "terms");
  cJSON_AddNumberToObject(tm, "u_out", t->u_out);
  cJSON_AddNumberToObject(tm, "u_op", t->u_op);
  cJSON_AddNumberToObject(tm, "u_acc", t->u_acc);
  cJSON_AddNumberToObject(tm, "u_fmt", t->u_fmt);
  cJSON_AddNumberToObject(tm, "e_out", t->e_out);
  cJSON_AddNumberToObject(tm, "e_acc", t->e_acc);
  cJSON_AddNumberToObject(tm, "e_op", t->e_op);
  cJSON_AddNumberToObject(tm, "e_fmt", t->e_fmt);
  cJSON *dup = cJSON_Duplicate(member, 1);
  if (!dup) {
    cJSON_Delete(root);
    return qc_err_sys("tol: out of memory building the report");
  }
  cJSON_AddItemToObject(root, "tolerances", dup);
  return qc_report_json_render(root, out);
}

/* The JUnit/Markdown list: one passed testcase per derived bound (the
 * reasoning is the JSON's and the Markdown preamble's). */
static int bounds_list(qc_tlist *l, const char *tensor, const qc_tol_terms *t) {
  char out[160];
  int rc;
  snprintf(out, sizeof out, "rel_l2 <= %.9g", t->rel_l2);
  if ((rc = qc_tlist_add(l, tensor, tensor, "rel_l2", NULL, out))) return rc;
  if (t->has_max_abs) {
    snprintf(out, sizeof out, "max_abs <= %.9g", t->max_abs);
    if ((rc = qc_tlist_add(l, tensor, tensor, "max_abs", NULL, out))) return rc;
  }
  snprintf(out, sizeof out, "cosine >= %.12g", t->cosine_min);
  if ((rc = qc_tlist_add(l, tensor, tensor, "cosine_min", NULL, out))) return rc;
  snprintf(out, sizeof out, "norm_ratio in [%.9g, %.9g]", t->norm_lo, t->norm_hi);
  if ((rc = qc_tlist_add(l, tensor, tensor, "norm_ratio", NULL, out))) return rc;
  snprintf(out, sizeof out, "noise_multiple <= %.9g", t->noise_multiple);
  return qc_tlist_add(l, tensor, tensor, "noise_multiple", NULL, out);
}


char *qc_report_tol_member(const qc_tol_info *ti) {
  cJSON *member = member_json(ti->tensor, ti->t, ti->reasoning);
  char *txt = member ? cJSON_Print(member) : NULL;
  cJSON_Delete(member);
  return txt;
}

int qc_report_tol(qc_report_out *o, const qc_tol_info *ti) {
  qc_tlist tl = {0};
  cJSON *member = member_json(ti->tensor, ti->t, ti->reasoning);
  int rc = member ? QC_OK : qc_err_sys("tol: out of memory building the JSON");
  if (!rc && (qc_report_wants(o, QC_REP_JUNIT) || qc_report_wants(o, QC_REP_MARKDOWN)) &&
      (rc = bounds_list(&tl, ti->tensor, ti->t)))
    goto done;
  if (!rc && qc_report_wants(o, QC_REP_JSON) &&
      (rc = render_json(&o->doc[QC_REP_JSON], o->prov, ti->tensor, ti->s, ti->t, ti->command, member)))
    goto done;
  if (!rc && qc_report_wants(o, QC_REP_JUNIT) && (rc = qc_tlist_junit(&tl, "tol", &o->doc[QC_REP_JUNIT]))) goto done;
  if (!rc && qc_report_wants(o, QC_REP_MARKDOWN)) {
    char pre[1700];
    snprintf(pre, sizeof pre, "- tensor: `%s`\n- reasoning: %s", ti->tensor, ti->reasoning);
    rc = qc_tlist_markdown(&tl, "tol", pre, o->prov, &o->doc[QC_REP_MARKDOWN]);
  }
done:
  cJSON_Delete(member);
  qc_tlist_free(&tl);
  return rc;
}
