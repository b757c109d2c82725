/* contract.c: the `contract` verb, layer 2 (spec/interfaces.md section 5):
 * `qatcheck contract --master-vs-dequant --dump CKPT.h5 [...]`. Parses the
 * options, runs the sweep (src/contract_sweep.c), prints the per-class table
 * and outliers, writes the JSON report atomically, and returns the verdict. */
#include <cjson/cJSON.h>
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "backend/backend.h"
#include "model/check.h"
#include "sweep/sweep.h"
#include "io/dump.h"
#include "numerics/quant.h"
#include "core/qc.h"
#include "report/sbuf.h"
#include "report/tlist.h"
#include "cli/cli.h"
#include "report/report.h"

#define DEFAULT_WFMT "nvfp4,fp8_block128,mxfp8"
#define DEFAULT_TOKENS 512

static void help(void) {
  printf("usage: qatcheck contract --master-vs-dequant --dump CKPT.h5 [options]\n\n"
         "Layer 2: for every linear module group of the dump (routed experts [E, N, K]: every expert),\n"
         "every dY and every precision combination, compares dX = dY W (master weight) with\n"
         "dX = dY dequant(quant(W)) (the weight the forward used), both in float64, and reports\n"
         "cosine, norm ratio and rel-L2 per layer and per class (layer index replaced by *).\n\n"
         "options:\n"
         "  --master-vs-dequant       the comparison to run (required; the only one so far)\n"
         "  --dump PATH               the checkpoint dump (HDF5, spec section 2)\n"
         "  --modules REGEX           only module groups whose path matches (POSIX extended)\n"
         "  --weight-format LIST      weight formats for the d_x rows (default " DEFAULT_WFMT ")\n"
         "                            of: " QC_WEIGHT_FORMATS "\n"
         "  --activation-format LIST  adds d_weight rows: dY^T X against dY^T dequant(quant(X)),\n"
         "                            X from inputs/x or generated (default none); of: " QC_ACT_FORMATS "\n"
         "  --tokens M                tokens of a generated dY (modules without grad_out/; default %d)\n"
         "  --seed S                  seed of generated dY and X (default 0)\n"
         "  --cosine-min X            a row with cosine below X fails (exit 1)\n"
         "  --norm-ratio LO,HI        a row with norm ratio outside [LO, HI] fails (exit 1)\n\n"
         "Without thresholds the verb reports and exits 0. Outliers (docs/contract.md) are marked,\n"
         "never failed.\n\n",
         DEFAULT_TOKENS);
  qc_common_help();
}

/* Is name one of the '|'-separated words of list? */
static int in_list(const char *name, const char *list) {
  size_t n = strlen(name);
  for (const char *p = list; *p;) {
    size_t w = strcspn(p, "|");
    if (w == n && strncmp(p, name, n) == 0) return 1;
    p += w + (p[w] == '|');
  }
  return 0;
}

/* Split a comma list of formats into names (pointing into buf, a copy of
 * val), each in `allowed` and implemented by the quantizer library. */
static int parse_formats(const char *opt, const char *val, const char *allowed, char *buf, size_t buflen,
                         const char **out, int *n) {
  if (snprintf(buf, buflen, "%s", val) >= (int)buflen) return qc_err("%s: list too long", opt);
  *n = 0;
  for (char *save = NULL, *t = strtok_r(buf, ",", &save); t; t = strtok_r(NULL, ",", &save)) {
    while (*t == ' ') t++;
    if (!in_list(t, allowed)) {
      qc_err("%s: unknown format '%s': expected a comma list of %s", opt, t, allowed);
      return QC_EINPUT;
    }
    if (!qc_quant_known(t)) return qc_err("%s: format '%s' is not implemented by this build's quantizer library", opt, t);
    for (int i = 0; i < *n; i++)
      if (strcmp(out[i], t) == 0) return qc_err("%s: format '%s' named twice", opt, t);
    if (*n == QC_SWEEP_MAXFMT) return qc_err("%s: more than %d formats", opt, QC_SWEEP_MAXFMT);
    out[(*n)++] = t;
  }
  if (*n == 0) return qc_err("%s: '%s': expected at least one format", opt, val);
  return QC_OK;
}

/* Parse a finite number, the whole string. */
static int parse_num(const char *opt, const char *s, double *out) {
  char *end;
  errno = 0;
  double v = strtod(s, &end);
  if (!*s || *end || errno || !isfinite(v)) return qc_err("%s '%s': expected a finite number", opt, s);
  *out = v;
  return QC_OK;
}

/* Parse an unsigned integer in [lo, hi], the whole string. */
static int parse_int(const char *opt, const char *s, unsigned long long lo, unsigned long long hi,
                     unsigned long long *out) {
  char *end;
  errno = 0;
  unsigned long long v = strtoull(s, &end, 10);
  if (!*s || *s == '-' || *end || errno || v < lo || v > hi)
    return qc_err("%s '%s': expected an integer in [%llu, %llu]", opt, s, lo, hi);
  *out = v;
  return QC_OK;
}

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

static cJSON *row_json(const qc_crow *r) {
  cJSON *o = cJSON_CreateObject(), *m = cJSON_CreateObject(), *sh = cJSON_CreateArray();
  cJSON_AddStringToObject(o, "module", r->module);
  cJSON_AddStringToObject(o, "class", r->cls);
  cJSON_AddItemToObject(o, "layer", int_or_null(r->layer));
  cJSON_AddItemToObject(o, "expert", int_or_null(r->expert));
  cJSON_AddStringToObject(o, "weight_format", r->wfmt);
  cJSON_AddStringToObject(o, "activation_format", r->afmt);
  cJSON_AddStringToObject(o, "dy", r->dy);
  cJSON_AddStringToObject(o, "tensor", r->tensor);
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

static const char *outlier_rule(void) {
  static char buf[512];
  snprintf(buf, sizeof buf,
           "within each (class, tensor, weight_format, activation_format) of at least %d rows: "
           "|log10(rel_l2) - median| > %.1f * max(1.4826 * MAD, %.2f decades), or "
           "|norm_ratio - median| > %.1f * max(1.4826 * MAD, 0.1 * median rel_l2)",
           QC_OUTLIER_MIN_ROWS, QC_OUTLIER_Z, QC_OUTLIER_LOG_FLOOR, QC_OUTLIER_Z);
  return buf;
}

typedef struct run_info {
  const char *dump, *device, *profile, *modules;
  const char *wlist, *alist;
  const qc_sweep_opts *o;
  int fails, outliers;
} run_info;

static int write_report(const char *path, const run_info *ri, const qc_sweep *s) {
  const qc_sweep_opts *o = ri->o;
  cJSON *root = cJSON_CreateObject();
  cJSON_AddNumberToObject(root, "qatcheck_report", 1);
  cJSON_AddStringToObject(root, "tool_version", QC_VERSION);
  cJSON_AddStringToObject(root, "verb", "contract");
  cJSON_AddStringToObject(root, "comparison", "master_vs_dequant");
  cJSON_AddStringToObject(root, "verdict", ri->fails ? "fail" : "pass");
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
  cJSON *gen = cJSON_AddObjectToObject(root, "generated");
  cJSON_AddBoolToObject(gen, "dy", s->dy_generated);
  cJSON_AddBoolToObject(gen, "x", s->x_generated);
  cJSON_AddNumberToObject(gen, "tokens", (double)o->tokens);
  cJSON_AddNumberToObject(gen, "seed", (double)o->seed);
  cJSON_AddStringToObject(gen, "distribution", "normal(0, 1), float64");
  cJSON_AddStringToObject(gen, "seed_rule", "one tensor per shape, shared by every module of that width: xoshiro256** seeded by splitmix64(seed XOR fnv1a64(\"<M>x<N>#dy\" or \"<M>x<K>#x\"))");
  cJSON_AddStringToObject(root, "outlier_rule", outlier_rule());
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
  cJSON_AddNumberToObject(tm, "sync", s->t_sync);
  cJSON_AddNumberToObject(tm, "gemm_flops", s->gemm_flops);
  cJSON_AddNumberToObject(tm, "units_ahead", s->ahead);
  cJSON *rows = cJSON_AddArrayToObject(root, "rows");
  for (int i = 0; i < s->n; i++) cJSON_AddItemToArray(rows, row_json(&s->rows[i]));
  cJSON *cls = cJSON_AddArrayToObject(root, "classes");
  for (int i = 0; i < s->ncls; i++) cJSON_AddItemToArray(cls, class_json(&s->cls[i]));
  char *text = cJSON_Print(root);
  cJSON_Delete(root);
  if (!text) return qc_err_sys("out of memory rendering the JSON report");
  size_t n = strlen(text);
  char *withnl = realloc(text, n + 2);
  if (!withnl) { free(text); return qc_err_sys("out of memory rendering the JSON report"); }
  memcpy(withnl + n, "\n", 2);
  int rc = qc_write_atomic(path, withnl, n + 1);
  free(withnl);
  return rc;
}

/* JUnit: one testcase per row (suite: the class; module; tensor/format/dy),
 * a failure when the row crossed --cosine-min or --norm-ratio. */
static int write_junit(const char *path, const qc_sweep *s) {
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
  if (!rc) rc = qc_tlist_junit(&l, path, "contract");
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
static int write_markdown(const char *path, const run_info *ri, const qc_sweep *s) {
  qc_sbuf b = {0};
  qc_sbuf_printf(&b, "# qatcheck contract: %s\n\n- comparison: master vs dequant (`--master-vs-dequant`)\n",
                 ri->fails ? "FAIL" : "pass");
  qc_sbuf_printf(&b, "- dump: `");
  qc_sbuf_md(&b, ri->dump);
  qc_sbuf_printf(&b, "`\n- device: %s, profile: %s\n- weight formats: ", ri->device, ri->profile);
  qc_sbuf_md(&b, ri->wlist);
  qc_sbuf_printf(&b, "; activation formats: ");
  qc_sbuf_md(&b, ri->alist);
  qc_sbuf_printf(&b, "\n- %d linear module group(s), %d unit(s), %d row(s), %d failed, %d outlier(s)\n", s->modules,
                 s->units, s->n, ri->fails, ri->outliers);
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
  qc_sbuf_md(&b, outlier_rule());
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
  int rc = b.oom ? qc_err_sys("out of memory rendering the Markdown report") : qc_write_atomic(path, b.s, b.n);
  qc_sbuf_free(&b);
  return rc;
}

/* ---- console ----------------------------------------------------------------------- */

static void print_table(const run_info *ri, const qc_sweep *s) {
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
  printf("\noutliers (%d): %s\n", ri->outliers, outlier_rule());
  for (int i = 0; i < s->n; i++)
    if (s->rows[i].outlier) {
      const qc_crow *r = &s->rows[i];
      printf("  OUTLIER %s %s weight=%s activation=%s dy=%s: cosine %.6f, norm ratio %.6f: %s\n", r->module, r->tensor,
             r->wfmt, r->afmt, r->dy, r->m.cosine, r->m.norm_ratio, r->outlier_why);
    }
  printf("\nverdict: %s (%d rows, %d failed, %d outliers)\n", ri->fails ? "FAIL" : "pass", s->n, ri->fails,
         ri->outliers);
}

int qc_cmd_contract(int argc, char **argv) {
  qc_common_opts co = {0};
  const char *dump_path = NULL, *wlist = DEFAULT_WFMT, *alist = "none", *v = NULL;
  int mvd = 0, rc;
  qc_sweep_opts o;
  memset(&o, 0, sizeof o);
  o.tokens = DEFAULT_TOKENS;
  for (int i = 1; i < argc; i++) {
    const char *a = argv[i];
    int r;
    if (qc_opt_help(a)) { help(); return 0; }
    if (strcmp(a, "--master-vs-dequant") == 0) { mvd = 1; continue; }
    if ((r = qc_opt_common(argc, argv, &i, &co))) { if (r < 0) return QC_EINPUT; continue; }
    if ((r = qc_opt_value(argc, argv, &i, "--dump", &dump_path))) { if (r < 0) return QC_EINPUT; continue; }
    if ((r = qc_opt_value(argc, argv, &i, "--modules", &o.modules))) { if (r < 0) return QC_EINPUT; continue; }
    if ((r = qc_opt_value(argc, argv, &i, "--weight-format", &wlist))) { if (r < 0) return QC_EINPUT; continue; }
    if ((r = qc_opt_value(argc, argv, &i, "--activation-format", &alist))) { if (r < 0) return QC_EINPUT; continue; }
    unsigned long long u;
    if ((r = qc_opt_value(argc, argv, &i, "--tokens", &v))) {
      if (r < 0 || (rc = parse_int("--tokens", v, 1, 1ull << 24, &u))) return QC_EINPUT;
      o.tokens = (int64_t)u;
      continue;
    }
    if ((r = qc_opt_value(argc, argv, &i, "--seed", &v))) {
      /* at most 2^53: the report records the seed as a JSON number, exactly */
      if (r < 0 || (rc = parse_int("--seed", v, 0, 1ull << 53, &u))) return QC_EINPUT;
      o.seed = u;
      continue;
    }
    if ((r = qc_opt_value(argc, argv, &i, "--cosine-min", &v))) {
      if (r < 0 || parse_num("--cosine-min", v, &o.cos_min)) return QC_EINPUT;
      if (o.cos_min < -1 || o.cos_min > 1) return qc_err("--cosine-min '%s': expected a number in [-1, 1]", v);
      o.has_cos_min = 1;
      continue;
    }
    if ((r = qc_opt_value(argc, argv, &i, "--norm-ratio", &v))) {
      if (r < 0) return QC_EINPUT;
      char lo[64];
      const char *comma = strchr(v, ',');
      if (!comma || comma - v >= (int)sizeof lo) return qc_err("--norm-ratio '%s': expected LOW,HIGH", v);
      snprintf(lo, sizeof lo, "%.*s", (int)(comma - v), v);
      if (parse_num("--norm-ratio", lo, &o.norm_lo) || parse_num("--norm-ratio", comma + 1, &o.norm_hi)) return QC_EINPUT;
      if (!(o.norm_lo > 0 && o.norm_lo <= o.norm_hi))
        return qc_err("--norm-ratio '%s': expected 0 < LOW <= HIGH", v);
      o.has_norm = 1;
      continue;
    }
    qc_err("contract: unknown option '%s'", a);
    qc_hint("run 'qatcheck contract --help'");
    return QC_EINPUT;
  }
  if (!mvd) {
    qc_err("contract: expected --master-vs-dequant (the comparison to run)");
    qc_hint("qatcheck contract --master-vs-dequant --dump CKPT.h5");
    return QC_EINPUT;
  }
  if (!dump_path) return qc_err("contract: expected --dump CKPT.h5");
  if (co.profile && !in_list(co.profile, QC_PROFILES))
    return qc_err("--profile '%s': unknown profile: expected one of %s", co.profile, QC_PROFILES);
  char wbuf[512], abuf[512];
  if ((rc = parse_formats("--weight-format", wlist, QC_WEIGHT_FORMATS, wbuf, sizeof wbuf, o.wfmt, &o.nw))) return rc;
  if ((rc = parse_formats("--activation-format", alist, QC_ACT_FORMATS, abuf, sizeof abuf, o.afmt, &o.na))) return rc;
  o.profile = co.profile ? co.profile : "vllm";
  o.progress = !qc_quiet && isatty(2);

  const qc_backend *be = NULL;
  qc_dump *d = NULL;
  qc_sweep s;
  memset(&s, 0, sizeof s);
  if ((rc = qc_backend_open(co.device, &be))) return rc;
  if (access(dump_path, R_OK) != 0) {
    rc = qc_err("--dump '%s': cannot read: %s", dump_path, strerror(errno));
    goto done;
  }
  if ((rc = qc_dump_open(dump_path, &d))) goto done;
  if ((rc = qc_contract_sweep(d, be, &o, &s))) goto done;

  run_info ri = {.dump = dump_path, .device = be->name, .profile = o.profile, .modules = o.modules,
                 .wlist = wlist, .alist = alist, .o = &o};
  for (int i = 0; i < s.n; i++) {
    ri.fails += s.rows[i].fail;
    ri.outliers += s.rows[i].outlier;
  }
  if (co.json && (rc = write_report(co.json, &ri, &s))) goto done;
  if (co.junit && (rc = write_junit(co.junit, &s))) { /* every report or none */
    if (co.json) unlink(co.json);
    goto done;
  }
  if (co.markdown && (rc = write_markdown(co.markdown, &ri, &s))) {
    if (co.json) unlink(co.json);
    if (co.junit) unlink(co.junit);
    goto done;
  }
  if (!qc_quiet) print_table(&ri, &s);
  if (qc_verbose)
    fprintf(stderr,
            "contract: %.3f s total: generate %.3f, read %.3f (waited %.3f), quantize %.3f, gemm %.3f (%.3g GFLOP), "
            "metrics %.3f, sync %.3f\n",
            s.t_total, s.t_gen, s.t_read, s.t_wait, s.t_quant, s.t_gemm, s.gemm_flops * 1e-9, s.t_metrics, s.t_sync);
  rc = ri.fails ? QC_FAIL : QC_OK;
done:
  qc_sweep_free(&s);
  if (d) qc_dump_close(d);
  qc_backend_close(be);
  return rc;
}
