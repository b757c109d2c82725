/* step.c: the reports of `qatcheck step` (see l3report.h): the JSON of
 * docs/layer3.md ("verb": "step", "format_version": 1: the arms, grad_norm
 * and clip_coef per arm as recomputed and as implied, the localization,
 * one check per arm or pair of arms, parameter and kind), JUnit and
 * Markdown (a testcase per check, suite the arm or pair), the console. */
#include <cJSON.h>
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "core/qc.h"
#include "report/l3report.h"
#include "report/tlist.h"

static void add_num(cJSON *o, const char *k, double v) {
  if (isfinite(v)) cJSON_AddNumberToObject(o, k, v);
  else cJSON_AddNullToObject(o, k);
}

static const char *check_verdict(const qc_step_check *c) { return !c->judged ? "unjudged" : c->verdict == QC_V_PASS ? "pass" : "fail"; }

static cJSON *metrics_json(const qc_metrics *m) {
  cJSON *o = cJSON_CreateObject();
  add_num(o, "rel_l2", m->rel_l2);
  if (m->cosine_null) cJSON_AddNullToObject(o, "cosine");
  else add_num(o, "cosine", m->cosine);
  add_num(o, "norm_ratio", m->norm_ratio);
  add_num(o, "max_abs", m->max_abs);
  add_num(o, "norm", m->norm_g);
  add_num(o, "norm_reference", m->norm_r);
  cJSON_AddNumberToObject(o, "nonfinite", (double)m->nonfinite);
  return o;
}

static int render_json(qc_sbuf *out, qc_prov *prov, const qc_step_view *v) {
  const qc_step_res *r = v->res;
  int verdict = qc_step_res_verdict(r);
  cJSON *root = qc_report_envelope(prov, "step", verdict);
  if (!root) return qc_err_sys("step: out of memory building the report");
  cJSON_AddNumberToObject(root, "format_version", 1);
  cJSON_AddStringToObject(root, "case", v->cs->name);
  cJSON *cf = cJSON_AddObjectToObject(root, "case_file");
  cJSON_AddStringToObject(cf, "path", v->cs->path);
  cJSON_AddStringToObject(cf, "sha256", v->cs->sha256);
  cJSON *dumps = cJSON_AddArrayToObject(root, "dumps");
  for (int i = 0; i < v->cs->ndump; i++) cJSON_AddItemToArray(dumps, cJSON_CreateString(v->cs->dump[i]));
  cJSON *arms = cJSON_AddArrayToObject(root, "arms");
  for (int i = 0; i < v->narm; i++) {
    const qc_step_arm *a = &v->arms[i];
    cJSON *o = cJSON_CreateObject();
    cJSON_AddStringToObject(o, "arm", a->name);
    cJSON_AddStringToObject(o, "file", a->file);
    cJSON_AddStringToObject(o, "optimizer", a->opt == QC_OPT_SGD ? "sgd" : "adamw");
    cJSON_AddNumberToObject(o, "lr", a->lr);
    if (a->opt == QC_OPT_ADAMW) {
      cJSON_AddNumberToObject(o, "beta1", a->beta1);
      cJSON_AddNumberToObject(o, "beta2", a->beta2);
      cJSON_AddNumberToObject(o, "eps", a->eps);
    } else cJSON_AddNumberToObject(o, "momentum", a->momentum);
    cJSON_AddNumberToObject(o, "weight_decay", a->weight_decay);
    cJSON_AddNumberToObject(o, "step", (double)a->step);
    cJSON_AddNumberToObject(o, "max_grad_norm", a->max_grad_norm);
    cJSON_AddNumberToObject(o, "grad_scale", a->grad_scale);
    cJSON_AddNumberToObject(o, "params", a->nparam);
    cJSON *fz = cJSON_AddArrayToObject(o, "frozen");
    for (int k = 0; k < a->nfrozen; k++) cJSON_AddItemToArray(fz, cJSON_CreateString(a->frozen[k]));
    cJSON_AddItemToArray(arms, o);
  }
  cJSON *gn = cJSON_AddObjectToObject(root, "grad_norm"), *cc = cJSON_AddObjectToObject(root, "clip_coef");
  for (int i = 0; i < r->nnorms; i++) {
    const qc_step_norms *n = &r->norms[i];
    cJSON *g = cJSON_AddObjectToObject(gn, n->arm), *c = cJSON_AddObjectToObject(cc, n->arm);
    add_num(g, "recomputed", n->grad_norm);
    add_num(g, "implied", n->has_implied ? n->implied_grad_norm : NAN);
    add_num(c, "recomputed", n->clip_coef);
    add_num(c, "implied", n->has_implied ? n->implied_clip_coef : NAN);
    cJSON_AddStringToObject(c, "implied_note", n->implied_why);
  }
  if (r->localization[0]) {
    cJSON *l = cJSON_AddObjectToObject(root, "localization");
    cJSON_AddStringToObject(l, "kind", r->localization);
    cJSON_AddStringToObject(l, "text", r->loc_text);
  } else cJSON_AddNullToObject(root, "localization");
  int judged = 0, failed = 0;
  cJSON *checks = cJSON_AddArrayToObject(root, "checks");
  for (int i = 0; i < r->n; i++) {
    const qc_step_check *c = &r->v[i];
    judged += c->judged;
    failed += c->judged && c->verdict != QC_V_PASS;
    cJSON *o = cJSON_CreateObject();
    cJSON_AddStringToObject(o, "arm", c->arm);
    cJSON_AddStringToObject(o, "param", c->param);
    cJSON_AddStringToObject(o, "kind", qc_step_kind_name(c->kind));
    cJSON_AddStringToObject(o, "verdict", check_verdict(c));
    if (c->has_metrics) cJSON_AddItemToObject(o, "metrics", metrics_json(&c->m));
    else cJSON_AddNullToObject(o, "metrics");
    if (c->has_tol) cJSON_AddItemToObject(o, "tolerance", qc_report_tol_json(&c->tol));
    if (isfinite(c->fit_scale)) cJSON_AddNumberToObject(o, "fitted_gradient_factor", c->fit_scale);
    cJSON_AddStringToObject(o, "why", c->why);
    cJSON_AddItemToArray(checks, o);
  }
  cJSON *tot = cJSON_AddObjectToObject(root, "totals");
  cJSON_AddNumberToObject(tot, "checks", r->n);
  cJSON_AddNumberToObject(tot, "judged", judged);
  cJSON_AddNumberToObject(tot, "failed", failed);
  return qc_report_json_render(root, out);
}

static int make_list(qc_tlist *l, const qc_step_view *v) {
  for (int i = 0; i < v->res->n; i++) {
    const qc_step_check *c = &v->res->v[i];
    char out[256];
    if (c->has_metrics)
      snprintf(out, sizeof out, "rel_l2 %.3g, cosine %.9g, norm ratio %.6g, max_abs %.3g%s", c->m.rel_l2, c->m.cosine, c->m.norm_ratio,
               c->m.max_abs, c->judged ? "" : " (not judged)");
    else snprintf(out, sizeof out, "%s", c->judged ? "" : "not judged");
    int rc = qc_tlist_add(l, c->arm, qc_step_kind_name(c->kind), c->param, c->judged && c->verdict != QC_V_PASS ? c->why : NULL, out);
    if (rc) return rc;
  }
  return QC_OK;
}

int qc_report_step(qc_report_out *o, const qc_step_view *v) {
  qc_tlist tl = {0};
  int rc = QC_OK;
  if ((qc_report_wants(o, QC_REP_JUNIT) || qc_report_wants(o, QC_REP_MARKDOWN)) && (rc = make_list(&tl, v))) goto done;
  if (qc_report_wants(o, QC_REP_JSON) && (rc = render_json(&o->doc[QC_REP_JSON], o->prov, v))) goto done;
  if (qc_report_wants(o, QC_REP_JUNIT) && (rc = qc_tlist_junit(&tl, "step", &o->doc[QC_REP_JUNIT]))) goto done;
  if (qc_report_wants(o, QC_REP_MARKDOWN)) {
    qc_sbuf pre = {0};
    qc_sbuf_printf(&pre, "- case: `%s`", v->cs->name);
    for (int i = 0; i < v->res->nnorms; i++) {
      const qc_step_norms *n = &v->res->norms[i];
      qc_sbuf_printf(&pre, "\n- %s: grad norm %.6g, clip coef %.6g recomputed; implied clip coef ", n->arm, n->grad_norm, n->clip_coef);
      if (n->has_implied) qc_sbuf_printf(&pre, "%.6g", n->implied_clip_coef);
      else qc_sbuf_printf(&pre, "-");
      qc_sbuf_printf(&pre, " (%s)", n->implied_why);
    }
    if (v->res->localization[0]) qc_sbuf_printf(&pre, "\n- localization: **%s**: %s", v->res->localization, v->res->loc_text);
    rc = pre.oom ? qc_err_sys("out of memory rendering the Markdown report") : qc_tlist_markdown(&tl, "step", pre.s, o->prov, &o->doc[QC_REP_MARKDOWN]);
    qc_sbuf_free(&pre);
  }
done:
  qc_tlist_free(&tl);
  return rc;
}

void qc_report_step_table(const qc_step_view *v) {
  const qc_step_res *r = v->res;
  for (int i = 0; i < r->nnorms; i++) {
    const qc_step_norms *n = &r->norms[i];
    printf("%s: grad_norm %.6g, clip_coef %.6g (recomputed); implied clip_coef ", n->arm, n->grad_norm, n->clip_coef);
    if (n->has_implied) printf("%.6g", n->implied_clip_coef);
    else printf("-");
    if (n->has_implied && isfinite(n->implied_grad_norm)) printf(", grad_norm %.6g", n->implied_grad_norm);
    printf(" (%s)\n", n->implied_why);
  }
  printf("%-34s %-40s %-12s %11s %13s %10s %-8s %s\n", "arm", "param", "kind", "rel_l2", "cosine", "norm_ratio", "verdict", "why");
  int judged = 0, failed = 0;
  for (int i = 0; i < r->n; i++) {
    const qc_step_check *c = &r->v[i];
    judged += c->judged;
    failed += c->judged && c->verdict != QC_V_PASS;
    if (c->has_metrics)
      printf("%-34s %-40s %-12s %11.3e %13.9f %10.6f %-8s %s\n", c->arm, c->param, qc_step_kind_name(c->kind), c->m.rel_l2, c->m.cosine,
             c->m.norm_ratio, c->judged ? (c->verdict == QC_V_PASS ? "pass" : "FAIL") : "-", c->judged && c->verdict == QC_V_PASS ? "" : c->why);
    else
      printf("%-34s %-40s %-12s %11s %13s %10s %-8s %s\n", c->arm, c->param, qc_step_kind_name(c->kind), "-", "-", "-",
             c->verdict == QC_V_PASS ? "pass" : "FAIL", c->why);
  }
  if (r->localization[0]) printf("localization: %s: %s\n", r->localization, r->loc_text);
  int v2 = qc_step_res_verdict(r);
  printf("step: %s: %d checks, %d judged, %d failed\n", v2 == 0 ? "pass" : v2 == 1 ? "FAIL" : "nothing judged", r->n, judged, failed);
}
