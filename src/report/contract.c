/* contract.c: the reports of `qatcheck contract --master-vs-dequant`
 * (layer 2): the JSON of rows and class summaries (docs/contract.md), one
 * JUnit testcase per row, the Markdown document, the console table. */
#include <cjson/cJSON.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/qc.h"
#include "report/report.h"
#include "report/tlist.h"

/* ---- report ---------------------------------------------------------------------- */

static cJSON *num_or_null(double v) { return isfinite(v) ? cJSON_CreateNumber(v) : cJSON_CreateNull(); }

static cJSON *stats(double mn, double med, double mx) {
  cJSON *o = cJSON_CreateObject();
  cJSON_AddItemToObject(o, "min", num_or_null(mn));
  cJSON_AddItemToObject(o, "median", num_or_null(med));
  cJSON_AddItemToObject(o, "max", num_or_null(mx));
  return o;
}

static cJSON *int_or_null(int v) { return v >= 0 ? cJSON_CreateNumber(v) : cJSON_CreateNull(); }

/* Where the rows' dY came from. */
static const char *dy_source(const qc_sweep *s) {
  return !s->dy_generated ? "dump" : s->dy_dumped ? "dump and generated" : "generated";
}

/* How the weight formats were chosen: each layer's deployed one, the
 * --weight-format list, or the default list (nothing declared one). */
static const char *wmode(const qc_contract_info *ri, const qc_sweep *s) {
  return s->deployed ? "deployed" : ri->o->deployed < 0 ? "default" : "listed";
}

static cJSON *row_json(const qc_crow *r) {
  cJSON *o = cJSON_CreateObject(), *m = cJSON_CreateObject(), *sh = cJSON_CreateArray();
  cJSON_AddStringToObject(o, "module", r->module);
  cJSON_AddStringToObject(o, "class", r->cls);
  cJSON_AddItemToObject(o, "layer", int_or_null(r->layer));
  cJSON_AddItemToObject(o, "expert", int_or_null(r->expert));
  cJSON_AddStringToObject(o, "weight_format", r->wfmt);
  if (r->wfmt_why[0]) cJSON_AddStringToObject(o, "weight_format_source", r->wfmt_why);
  cJSON_AddStringToObject(o, "activation_format", r->afmt);
  cJSON_AddStringToObject(o, "dy", r->dy);
  cJSON_AddStringToObject(o, "tensor", r->tensor);
  cJSON_AddStringToObject(o, "profile", r->profile);
  cJSON_AddStringToObject(o, "profile_source", r->profile_why);
  cJSON_AddItemToArray(sh, cJSON_CreateNumber((double)r->shape[0]));
  cJSON_AddItemToArray(sh, cJSON_CreateNumber((double)r->shape[1]));
  cJSON_AddItemToObject(o, "shape", sh);
  cJSON_AddItemToObject(m, "cosine", r->m.cosine_null ? cJSON_CreateNull() : num_or_null(r->m.cosine));
  cJSON_AddItemToObject(m, "norm_ratio", num_or_null(r->m.norm_ratio));
  cJSON_AddItemToObject(m, "rel_l2", num_or_null(r->m.rel_l2));
  cJSON_AddItemToObject(m, "max_abs", num_or_null(r->m.max_abs));
  cJSON_AddItemToObject(o, "metrics", m);
  cJSON_AddBoolToObject(o, "outlier", r->outlier);
  if (r->outlier) cJSON_AddStringToObject(o, "outlier_why", r->outlier_why);
  cJSON_AddStringToObject(o, "verdict", r->fail ? "fail" : "pass");
  cJSON_AddStringToObject(o, "why", r->why);
  return o;
}

static cJSON *class_json(const qc_cclass *c) {
  cJSON *o = cJSON_CreateObject();
  cJSON_AddStringToObject(o, "class", c->cls);
  cJSON_AddStringToObject(o, "tensor", c->tensor);
  cJSON_AddStringToObject(o, "weight_format", c->wfmt);
  cJSON_AddStringToObject(o, "activation_format", c->afmt);
  cJSON_AddNumberToObject(o, "layers", c->layers);
  cJSON_AddNumberToObject(o, "rows", c->rows);
  cJSON_AddItemToObject(o, "cosine", stats(c->cos_min, c->cos_med, c->cos_max));
  cJSON_AddItemToObject(o, "norm_ratio", stats(c->nr_min, c->nr_med, c->nr_max));
  cJSON_AddItemToObject(o, "rel_l2_median", num_or_null(c->rel_med));
  cJSON_AddNumberToObject(o, "outliers", c->outliers);
  cJSON_AddNumberToObject(o, "failed", c->fails);
  return o;
}

/* The outlier rule in words (model/layer2.h's QC_OUTLIER_*). */
static const char *qc_report_outlier_rule(void) {
  static char buf[512];
  snprintf(buf, sizeof buf,
           "within each (class, tensor, weight_format, activation_format) of at least %d rows: "
           "|log10(rel_l2) - median| > %.1f * max(1.4826 * MAD, %.2f decades), or "
           "|norm_ratio - median| > %.1f * max(1.4826 * MAD, 0.1 * median rel_l2)",
           QC_OUTLIER_MIN_ROWS, QC_OUTLIER_Z, QC_OUTLIER_LOG_FLOOR, QC_OUTLIER_Z);
  return buf;
}

static int render_json(qc_sbuf *out, qc_prov *prov, const qc_contract_info *ri, const qc_sweep *s) {
  const qc_sweep_opts *o = ri->o;
  cJSON *root = qc_report_envelope(prov, "contract", ri->fails ? 1 : 0);
  if (!root) return qc_err_sys("out of memory building the report");
  cJSON_AddStringToObject(root, "comparison", "master_vs_dequant");
  qc_report_totals(root, s->n, ri->fails, 0);
  cJSON_AddNumberToObject(cJSON_GetObjectItemCaseSensitive(root, "totals"), "outliers", ri->outliers);
  cJSON *dump = cJSON_AddObjectToObject(root, "dump");
  cJSON_AddStringToObject(dump, "path", ri->dump);
  cJSON *op = cJSON_AddObjectToObject(root, "options");
  cJSON *wf = cJSON_AddArrayToObject(op, "weight_formats"), *af = cJSON_AddArrayToObject(op, "activation_formats");
  for (int i = 0; i < o->nw; i++) cJSON_AddItemToArray(wf, cJSON_CreateString(o->wfmt[i]));
  for (int i = 0; i < o->na; i++) cJSON_AddItemToArray(af, cJSON_CreateString(o->afmt[i]));
  cJSON_AddStringToObject(op, "profile", ri->profile);
  cJSON_AddItemToObject(op, "modules", ri->modules ? cJSON_CreateString(ri->modules) : cJSON_CreateNull());
  cJSON_AddStringToObject(op, "device", ri->device);
  cJSON_AddItemToObject(op, "cosine_min", o->has_cos_min ? cJSON_CreateNumber(o->cos_min) : cJSON_CreateNull());
  if (o->has_norm) {
    cJSON *nr = cJSON_AddArrayToObject(op, "norm_ratio");
    cJSON_AddItemToArray(nr, cJSON_CreateNumber(o->norm_lo));
    cJSON_AddItemToArray(nr, cJSON_CreateNumber(o->norm_hi));
  } else {
    cJSON_AddNullToObject(op, "norm_ratio");
  }
  cJSON *wfs = cJSON_AddObjectToObject(root, "weight_formats");
  cJSON_AddStringToObject(wfs, "mode", wmode(ri, s));
  cJSON_AddStringToObject(wfs, "source", s->deployed ? s->wsource : ri->o->deployed < 0 ? "no module declares a deployed format: the default list" : "--weight-format");
  cJSON_AddNumberToObject(wfs, "unquantized_units", s->unquantized);
  cJSON_AddStringToObject(root, "dy_source", dy_source(s));
  cJSON *gen = cJSON_AddObjectToObject(root, "generated");
  cJSON_AddBoolToObject(gen, "dy", s->dy_generated);
  cJSON_AddBoolToObject(gen, "x", s->x_generated);
  cJSON_AddNumberToObject(gen, "tokens", (double)o->tokens);
  cJSON_AddNumberToObject(gen, "seed", (double)o->seed);
  cJSON_AddStringToObject(gen, "distribution", "normal(0, 1), float64");
  cJSON_AddStringToObject(gen, "seed_rule", "one tensor per shape, shared by every module of that width: xoshiro256** seeded by splitmix64(seed XOR fnv1a64(\"<M>x<N>#dy\" or \"<M>x<K>#x\"))");
  cJSON_AddStringToObject(root, "outlier_rule", qc_report_outlier_rule());
  cJSON *sum = cJSON_AddObjectToObject(root, "summary");
  cJSON_AddNumberToObject(sum, "modules", s->modules);
  cJSON_AddNumberToObject(sum, "expert_groups", s->expert_groups);
  cJSON_AddNumberToObject(sum, "units", s->units);
  cJSON_AddNumberToObject(sum, "rows", s->n);
  cJSON_AddNumberToObject(sum, "failed", ri->fails);
  cJSON_AddNumberToObject(sum, "outliers", ri->outliers);
  cJSON *tm = cJSON_AddObjectToObject(root, "timing_s");
  cJSON_AddNumberToObject(tm, "total", s->t_total);
  cJSON_AddNumberToObject(tm, "generate", s->t_gen);
  cJSON_AddNumberToObject(tm, "read", s->t_read);
  cJSON_AddNumberToObject(tm, "wait_read", s->t_wait);
  cJSON_AddNumberToObject(tm, "quantize", s->t_quant);
  cJSON_AddNumberToObject(tm, "gemm", s->t_gemm);
  cJSON_AddNumberToObject(tm, "metrics", s->t_metrics);
  cJSON_AddNumberToObject(tm, "queue", s->t_queue);
  cJSON_AddNumberToObject(tm, "sync", s->t_sync);
  cJSON_AddNumberToObject(tm, "gemm_flops", s->gemm_flops);
  cJSON_AddNumberToObject(tm, "units_ahead", s->ahead);
  cJSON_AddNumberToObject(tm, "units_in_flight", s->in_flight);
  /* over the ranks of an MPI job: the t_* above are the slowest rank's */
  cJSON_AddNumberToObject(tm, "ranks", s->ranks > 0 ? s->ranks : 1);
  cJSON_AddNumberToObject(tm, "rank_fastest", s->t_rank_min);
  cJSON_AddNumberToObject(tm, "rank_slowest", s->t_rank_max);
  cJSON_AddNumberToObject(tm, "merge", s->t_merge);
  cJSON_AddNumberToObject(tm, "rank_gemm_flops_max", s->gemm_flops_rank_max);
  cJSON *rows = cJSON_AddArrayToObject(root, "rows");
  for (int i = 0; i < s->n; i++) cJSON_AddItemToArray(rows, row_json(&s->rows[i]));
  cJSON *cls = cJSON_AddArrayToObject(root, "classes");
  for (int i = 0; i < s->ncls; i++) cJSON_AddItemToArray(cls, class_json(&s->cls[i]));
  return qc_report_json_render(root, out);
}

/* JUnit: one testcase per row (suite: the class; module; tensor/format/dy),
 * a failure when the row crossed --cosine-min or --norm-ratio. */
static int render_junit(qc_sbuf *out, const qc_sweep *s) {
  qc_tlist l = {0};
  int rc = QC_OK;
  for (int i = 0; i < s->n && !rc; i++) {
    const qc_crow *r = &s->rows[i];
    char name[QC_NAMELEN + 2 * QC_FMTLEN + 16], out[320];
    snprintf(name, sizeof name, "%s/%s/%s", r->tensor, strcmp(r->tensor, "d_x") == 0 ? r->wfmt : r->afmt, r->dy);
    snprintf(out, sizeof out, "cosine=%.9g norm_ratio=%.9g rel_l2=%.6g%s%s", r->m.cosine, r->m.norm_ratio, r->m.rel_l2,
             r->outlier ? " outlier: " : "", r->outlier ? r->outlier_why : "");
    rc = qc_tlist_add(&l, r->cls, r->module, name, r->fail ? r->why : NULL, out);
  }
  qc_tlist_spread(&l, s->t_total);
  if (!rc) rc = qc_tlist_junit(&l, "contract", out);
  qc_tlist_free(&l);
  return rc;
}

/* One Markdown list item naming a row, then `note`. */
static void md_item(qc_sbuf *b, const qc_crow *r, const char *note) {
  qc_sbuf_printf(b, "- `");
  qc_sbuf_md(b, r->module);
  qc_sbuf_printf(b, "` %s weight=%s activation=%s dy=", r->tensor, r->wfmt, r->afmt);
  qc_sbuf_md(b, r->dy);
  qc_sbuf_printf(b, ": ");
  qc_sbuf_md(b, note);
  qc_sbuf_printf(b, "\n");
}

/* Markdown: the verdict, the run, the per-class table, outliers, failed rows,
 * then every row (per layer), written atomically. */
static int render_markdown(qc_sbuf *out, const qc_contract_info *ri, const qc_sweep *s) {
  qc_sbuf b = *out;
  qc_sbuf_printf(&b, "# qatcheck contract: %s\n\n- comparison: master vs dequant (`--master-vs-dequant`)\n",
                 ri->fails ? "FAIL" : "pass");
  qc_report_tool_md(&b);
  qc_sbuf_printf(&b, "- dump: `");
  qc_sbuf_md(&b, ri->dump);
  qc_sbuf_printf(&b, "`\n- device: %s, profile: %s\n- weight formats: ", ri->device, ri->profile);
  if (s->deployed) {
    qc_sbuf_printf(&b, "each layer's deployed one (");
    qc_sbuf_md(&b, s->wsource);
    qc_sbuf_printf(&b, "; %d unit(s) deployed unquantized)", s->unquantized);
  } else {
    qc_sbuf_md(&b, ri->wlist);
  }
  qc_sbuf_printf(&b, "; activation formats: ");
  qc_sbuf_md(&b, ri->alist);
  qc_sbuf_printf(&b, "\n- %d linear module group(s), %d unit(s), %d row(s), %d failed, %d outlier(s)\n", s->modules,
                 s->units, s->n, ri->fails, ri->outliers);
  qc_sbuf_printf(&b, "- dY source: %s\n", dy_source(s));
  if (s->dy_generated)
    qc_sbuf_printf(&b, "- dY: generated, normal, %lld tokens, seed %llu\n", (long long)ri->o->tokens,
                   (unsigned long long)ri->o->seed);
  qc_sbuf_printf(&b, "- d_x: g = dY dequant(quant(W)), r = dY W; d_weight: g = dY^T dequant(quant(X)), r = dY^T X; "
                     "float64\n\n## Classes\n\n"
                     "| tensor | weight | activation | class | rows | layers | cosine min | median | max "
                     "| norm ratio min | median | max | outliers | failed |\n"
                     "| --- | --- | --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |\n");
  for (int i = 0; i < s->ncls; i++) {
    const qc_cclass *c = &s->cls[i];
    qc_sbuf_printf(&b, "| %s | %s | %s | `", c->tensor, c->wfmt, c->afmt);
    qc_sbuf_md(&b, c->cls);
    qc_sbuf_printf(&b, "` | %d | %d | %.6f | %.6f | %.6f | %.6f | %.6f | %.6f | %d | %d |\n", c->rows, c->layers,
                   c->cos_min, c->cos_med, c->cos_max, c->nr_min, c->nr_med, c->nr_max, c->outliers, c->fails);
  }
  qc_sbuf_printf(&b, "\n## Outliers (%d)\n\n", ri->outliers);
  qc_sbuf_md(&b, qc_report_outlier_rule());
  qc_sbuf_printf(&b, "\n\n");
  for (int i = 0; i < s->n; i++)
    if (s->rows[i].outlier) md_item(&b, &s->rows[i], s->rows[i].outlier_why);
  if (ri->fails) {
    qc_sbuf_printf(&b, "\n## Failed rows (%d)\n\n", ri->fails);
    for (int i = 0; i < s->n; i++)
      if (s->rows[i].fail) md_item(&b, &s->rows[i], s->rows[i].why);
  }
  qc_sbuf_printf(&b, "\n## Rows\n\n| module | layer | expert | tensor | weight | activation | dY | cosine | norm ratio "
                     "| rel_l2 | verdict |\n| --- | ---: | ---: | --- | --- | --- | --- | ---: | ---: | ---: | --- |\n");
  for (int i = 0; i < s->n; i++) {
    const qc_crow *r = &s->rows[i];
    qc_sbuf_printf(&b, "| `");
    qc_sbuf_md(&b, r->module);
    qc_sbuf_printf(&b, "` | %d | %d | %s | %s | %s | ", r->layer, r->expert, r->tensor, r->wfmt, r->afmt);
    qc_sbuf_md(&b, r->dy);
    qc_sbuf_printf(&b, " | %.9f | %.9f | %.4g | %s%s |\n", r->m.cosine, r->m.norm_ratio, r->m.rel_l2,
                   r->fail ? "FAIL" : "pass", r->outlier ? ", outlier" : "");
  }
  *out = b;
  return b.oom ? qc_err_sys("out of memory rendering the Markdown report") : QC_OK;
}

int qc_report_contract(qc_report_out *o, const qc_contract_info *ri, const qc_sweep *s) {
  int rc = QC_OK;
  if (qc_report_wants(o, QC_REP_JSON)) rc = render_json(&o->doc[QC_REP_JSON], o->prov, ri, s);
  if (!rc && qc_report_wants(o, QC_REP_JUNIT)) rc = render_junit(&o->doc[QC_REP_JUNIT], s);
  if (!rc && qc_report_wants(o, QC_REP_MARKDOWN)) rc = render_markdown(&o->doc[QC_REP_MARKDOWN], ri, s);
  return rc;
}

/* ---- console ----------------------------------------------------------------------- */

void qc_report_contract_table(const qc_contract_info *ri, const qc_sweep *s) {
  int w = 5;
  for (int i = 0; i < s->ncls; i++) {
    int l = (int)strlen(s->cls[i].cls);
    if (l > w) w = l;
  }
  printf("qatcheck contract --master-vs-dequant: %s\n", ri->dump);
  printf("  %d linear module group(s)", s->modules);
  if (s->expert_groups) printf(" (%d routed-expert group(s))", s->expert_groups);
  printf(", %d unit(s), %d row(s); dY: %s", s->units, s->n, s->dy_generated ? "generated where grad_out/ is empty" : "grad_out/");
  if (s->dy_generated) printf(" (normal, %lld tokens, seed %llu)", (long long)ri->o->tokens, (unsigned long long)ri->o->seed);
  if (s->deployed)
    printf("\n  weight formats: each layer's deployed one, from %s; %d unit(s) deployed unquantized (rows weight=none: "
           "dX exact)", s->wsource, s->unquantized);
  else if (ri->o->deployed < 0)
    printf("\n  weight formats: no module declares a deployed format: every layer under each of %s", ri->wlist);
  printf("\n  d_x: g = dY dequant(quant(W)), r = dY W; d_weight: g = dY^T dequant(quant(X)), r = dY^T X; float64\n\n");
  printf("%-8s  %-18s  %-18s  %-*s  %5s  %6s  %-29s  %-29s  %s\n", "tensor", "weight", "activation", w, "class", "rows",
         "layers", "cosine min / median / max", "norm ratio min / median / max", "outliers");
  for (int i = 0; i < s->ncls; i++) {
    const qc_cclass *c = &s->cls[i];
    printf("%-8s  %-18s  %-18s  %-*s  %5d  %6d  %9.6f %9.6f %9.6f  %9.6f %9.6f %9.6f  %d\n", c->tensor, c->wfmt,
           c->afmt, w, c->cls, c->rows, c->layers, c->cos_min, c->cos_med, c->cos_max, c->nr_min, c->nr_med,
           c->nr_max, c->outliers);
  }
  if (ri->fails) {
    printf("\nfailed rows (%d):\n", ri->fails);
    int shown = 0;
    for (int i = 0; i < s->n && shown < 50; i++)
      if (s->rows[i].fail) {
        const qc_crow *r = &s->rows[i];
        printf("  FAIL %s %s weight=%s activation=%s dy=%s: %s\n", r->module, r->tensor, r->wfmt, r->afmt, r->dy, r->why);
        shown++;
      }
    if (shown < ri->fails) printf("  ... %d more in the JSON report\n", ri->fails - shown);
  }
  printf("\noutliers (%d): %s\n", ri->outliers, qc_report_outlier_rule());
  for (int i = 0; i < s->n; i++)
    if (s->rows[i].outlier) {
      const qc_crow *r = &s->rows[i];
      printf("  OUTLIER %s %s weight=%s activation=%s dy=%s: cosine %.6f, norm ratio %.6f: %s\n", r->module, r->tensor,
             r->wfmt, r->afmt, r->dy, r->m.cosine, r->m.norm_ratio, r->outlier_why);
    }
  printf("\nverdict: %s (%d rows, %d failed, %d outliers)\n", ri->fails ? "FAIL" : "pass", s->n, ri->fails,
         ri->outliers);
}

