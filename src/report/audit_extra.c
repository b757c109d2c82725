/* audit_extra.c: the audit's cross-cutting pieces (see audit.h): where a
 * row came from (the input report's file and case), the suspicious passes
 * (the rule, their count and their section), the reference GEMMs a
 * gradient's checks used, and a step report's per-arm numbers in words. */
#include <cjson/cJSON.h>
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "core/qc.h"
#include "report/audit.h"

const char *qc_audit_src_name(const qc_evidence *e, int src) {
  static char buf[QC_EV_TEXT + 64];
  if (src < 0 || src >= e->nsrc) return "?";
  const qc_ev_src *s = &e->src[src];
  const char *base = strrchr(s->path, '/');
  base = base ? base + 1 : s->path;
  if (s->title[0] && strcmp(s->title, base) != 0) snprintf(buf, sizeof buf, "%.60s: %s", base, s->title);
  else snprintf(buf, sizeof buf, "%s", base);
  return buf;
}

void qc_audit_ref_gemms(const qc_evidence *e, const char *cls, const char *tensor, char *buf, size_t n) {
  char names[8][48];
  int count[8], nn = 0;
  for (int i = 0; i < e->nl1; i++) {
    const qc_check *k = &e->l1[i].c;
    char one[48];
    int j = 0;
    if (strcmp(k->cls, cls) || strcmp(k->tensor, tensor)) continue;
    qc_report_ref_name(k, one, sizeof one);
    while (j < nn && strcmp(names[j], one)) j++;
    if (j == nn && nn < 8) snprintf(names[nn], sizeof names[0], "%s", one), count[nn++] = 0;
    if (j < nn) count[j]++;
  }
  buf[0] = 0;
  for (int j = 0; j < nn; j++) qc_cat(buf, n, "%s%s (%d)", j ? "; " : "", names[j], count[j]);
  if (!nn) snprintf(buf, n, "-");
}

/* 1 when k passed at QC_AUDIT_SUSPICIOUS times its noise floor or more, or
 * with rel_l2 >= QC_AUDIT_SUSPICIOUS_REL (audit.h). */
static int qc_audit_is_suspicious(const qc_check *k) {
  if (k->verdict != QC_V_PASS || !k->has_metrics) return 0;
  return (isfinite(k->m.noise_multiple) && k->m.noise_multiple >= QC_AUDIT_SUSPICIOUS) ||
         (isfinite(k->m.rel_l2) && k->m.rel_l2 >= QC_AUDIT_SUSPICIOUS_REL);
}

int qc_audit_nsuspicious(const qc_evidence *e) {
  int n = 0;
  for (int i = 0; i < e->nl1; i++) n += qc_audit_is_suspicious(&e->l1[i].c);
  return n;
}

void qc_audit_suspicious(qc_doc *d, const qc_evidence *e) {
  int n = qc_audit_nsuspicious(e);
  if (!n) return;
  qc_doc_h(d, 3, "suspicious", "Suspicious passes");
  qc_doc_p(d);
  qc_doc_text(d, "%d check(s) passed with an error at least %g times their noise floor (noise multiple) or a relative error of "
                 "%g or more: a tolerance that loose passes a real defect too (a transposed weight gradient measures about "
                 "850 times). Tighten it, or say in its reasoning why such an error is expected.",
              n, QC_AUDIT_SUSPICIOUS, QC_AUDIT_SUSPICIOUS_REL);
  qc_doc_table(d, "l:check|l:report|r:noise x|r:rel_l2|l:declared reasoning");
  for (int i = 0; i < e->nl1; i++) {
    const qc_check *k = &e->l1[i].c;
    if (!qc_audit_is_suspicious(k)) continue;
    char name[2 * QC_NAMELEN + 2], what[3 * QC_NAMELEN];
    snprintf(what, sizeof what, "%s %s", k->module, qc_report_check_name(k, name, sizeof name));
    qc_doc_tr(d);
    qc_doc_td_code(d, what);
    qc_doc_td_code(d, qc_audit_src_name(e, e->l1[i].src));
    qc_doc_td_num(d, k->m.noise_multiple, 4);
    qc_doc_td_num(d, k->m.rel_l2, 3);
    qc_doc_td(d, "%s", k->has_tol && k->tol.reasoning[0] ? k->tol.reasoning : "-");
  }
  qc_doc_table_end(d);
}

/* A step report's per-arm numbers ({"under_test": {"recomputed": 1.8421,
 * "implied": null}, ...}) in words: "under_test 1.842 (implied 1.842)". */
void qc_audit_arm_numbers(const cJSON *n, char *out, size_t cap) {
  out[0] = 0;
  const cJSON *arm;
  cJSON_ArrayForEach(arm, n) {
    size_t l = strlen(out);
    const cJSON *rc = cJSON_GetObjectItemCaseSensitive(arm, "recomputed"), *im = cJSON_GetObjectItemCaseSensitive(arm, "implied");
    char a[32] = "-", b[48] = "";
    if (cJSON_IsNumber(arm)) snprintf(a, sizeof a, "%.6g", arm->valuedouble);
    if (cJSON_IsNumber(rc)) snprintf(a, sizeof a, "%.6g", rc->valuedouble);
    if (cJSON_IsNumber(im)) snprintf(b, sizeof b, " (implied by the update %.6g)", im->valuedouble);
    else if (cJSON_IsObject(arm) && im) snprintf(b, sizeof b, " (not implied by the update)");
    snprintf(out + l, cap - l, "%s%s %s%s", l ? ", " : "", arm->string ? arm->string : "?", a, b);
  }
}

/* The regressions against the baselines, per input report. */
void qc_audit_regressions(qc_doc *d, const qc_audit_ctx *a) {
  const qc_evidence *e = a->e;
  qc_doc_h(d, 2, "regressions", "Regressions against the baselines");
  if (!a->reg) {
    qc_doc_p(d);
    qc_doc_text(d, "No baseline given (--baseline OLD.json).");
    return;
  }
  qc_doc_p(d);
  qc_doc_text(d, "The rule: %s.", qc_baseline_rule(a->factor));
  for (int i = 0; i < e->nsrc; i++) {
    const qc_regress_list *l = &a->reg[i];
    if (!a->reg_base[i]) continue;
    qc_doc_h(d, 3, NULL, "%s %s: %d regression(s)", e->src[i].verb, e->src[i].title, l->n);
    qc_doc_p(d);
    qc_doc_text(d, "Against ");
    qc_doc_code(d, a->reg_base[i]);
    qc_doc_text(d, ": %d check(s) matched, %d new, %d vanished.", l->matched, l->added, l->vanished);
    for (int k = 0; k < l->n; k++) {
      qc_doc_li(d);
      qc_doc_code(d, l->v[k].id);
      qc_doc_text(d, ": %s", l->v[k].what);
    }
    qc_doc_end_block(d);
  }
}
