/* quant.c: `qatcheck quant --dump F --module PATH [--format FMT] [--profile P]
 * [--identify] [common options]`: re-quantize a module's master weight and
 * compare with the deployed bytes in its saved/ group (numerics/deployed.h). */
#include <cjson/cJSON.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "model/case.h"
#include "model/check.h"
#include "io/dump.h"
#include "engine/deployed.h"
#include "core/qc.h"
#include "report/tlist.h"
#include "cli/cli.h"
#include "report/report.h"

#define QUANT_NO_DEVICE "quant compares the deployed bytes with qatcheck's reference quantizers, which run on the host"

static void help(void) {
  printf("usage: qatcheck quant --dump FILE.h5 --module PATH [--format FMT] [--profile P] [--identify] [options]\n\n"
         "Re-quantizes params/weight of module PATH and compares with its deployed bytes\n"
         "(saved/weight_q, saved/weight_scale, saved/weight_global_scale for nvfp4):\n"
         "payload, scales, global scale and decoded bf16 bits, negative zero included.\n\n"
         "  --dump FILE.h5 the dump (spec section 2)\n"
         "  --module PATH  the module group\n"
         "  --format FMT   %s\n"
         "                 (default: the module's contract weight_format)\n"
         "  --profile P    %s (default: the contract's, else vllm)\n"
         "  --identify     try every profile and list those that reproduce the bytes\n\n"
         "Reports: --json holds each comparison (module, format, profile, reproduced or\n"
         "mismatch, counts, the detail line); --junit and --markdown have one testcase per\n"
         "comparison, a mismatch a failure. Under --identify they have one testcase, failed\n"
         "when no profile reproduces the bytes (the JSON still lists every profile).\n\n",
         QC_WEIGHT_FORMATS, QC_PROFILES);
  qc_common_help_opts(QC_HELP_MARKDOWN | QC_HELP_PROFILE | QC_HELP_CPU_ONLY);
  printf("exit status: 0 the bytes are reproduced (--identify: by some profile), 1 they are not,\n"
         "             2 cannot judge\n");
}

/* One comparison: a profile and what it gave. */
typedef struct quant_cmp {
  qc_qprof prof;
  qc_deployed_result r;
  int ok;
  char line[2048];
} quant_cmp;

static int run_one(const qc_module *m, qc_qfmt f, qc_qprof p, const qc_sr *sr, quant_cmp *c) {
  int rc = qc_deployed_check(m, f, p, sr, &c->r);
  if (rc) return rc;
  c->prof = p;
  qc_deployed_summary(&c->r, c->line, sizeof c->line);
  c->ok = !(c->r.n_payload || c->r.n_scale || c->r.n_global || c->r.n_decoded);
  return QC_OK;
}

static int write_json(const char *path, const char *dump, const char *module, qc_qfmt f, int identify,
                      const quant_cmp *c, int n, int verdict) {
  cJSON *root = qc_report_envelope("quant", verdict);
  if (!root) return qc_err_sys("quant: out of memory building the report");
  cJSON_AddStringToObject(cJSON_AddObjectToObject(root, "dump"), "path", dump);
  cJSON_AddStringToObject(root, "module", module);
  cJSON_AddStringToObject(root, "format", qc_qfmt_name(f));
  cJSON_AddStringToObject(root, "mode", identify ? "identify" : "check");
  if (identify) {
    cJSON *by = cJSON_AddArrayToObject(root, "reproduced_by");
    for (int i = 0; i < n; i++)
      if (c[i].ok) cJSON_AddItemToArray(by, cJSON_CreateString(qc_qprof_name(c[i].prof)));
  }
  cJSON *checks = cJSON_AddArrayToObject(root, "checks");
  for (int i = 0; i < n; i++) {
    cJSON *o = cJSON_CreateObject();
    cJSON_AddStringToObject(o, "module", module);
    cJSON_AddStringToObject(o, "format", qc_qfmt_name(f));
    cJSON_AddStringToObject(o, "profile", qc_qprof_name(c[i].prof));
    cJSON_AddStringToObject(o, "result", c[i].ok ? "reproduced" : "mismatch");
    cJSON_AddNumberToObject(o, "elements", (double)c[i].r.total_payload);
    cJSON *mm = cJSON_AddObjectToObject(o, "mismatches");
    cJSON_AddNumberToObject(mm, "payload", (double)c[i].r.n_payload);
    cJSON_AddNumberToObject(mm, "scale", (double)c[i].r.n_scale);
    cJSON_AddNumberToObject(mm, "global_scale", (double)c[i].r.n_global);
    cJSON_AddNumberToObject(mm, "decoded_bf16", (double)c[i].r.n_decoded);
    cJSON_AddStringToObject(o, "detail", c[i].line);
    cJSON_AddItemToArray(checks, o);
  }
  return qc_report_json_write(path, root);
}

/* JUnit/Markdown: a testcase per comparison; under --identify one, failed
 * when no profile reproduces the bytes. */
static int make_list(qc_tlist *l, const char *module, qc_qfmt f, int identify, const quant_cmp *c, int n, int any) {
  char name[96];
  if (!identify) {
    for (int i = 0; i < n; i++) {
      snprintf(name, sizeof name, "%s/%s", qc_qfmt_name(f), qc_qprof_name(c[i].prof));
      int rc = qc_tlist_add(l, module, "quant", name, c[i].ok ? NULL : c[i].line, c[i].ok ? c[i].line : NULL);
      if (rc) return rc;
    }
    return QC_OK;
  }
  char out[512] = "";
  for (int i = 0, k = 0; i < n && k < (int)sizeof out; i++)
    k += snprintf(out + k, sizeof out - (size_t)k, "%s%s %s", i ? ", " : "", qc_qprof_name(c[i].prof),
                  c[i].ok ? "reproduces" : "does not reproduce");
  snprintf(name, sizeof name, "%s/identify", qc_qfmt_name(f));
  return qc_tlist_add(l, module, "quant", name, any ? NULL : "no profile reproduces the deployed bytes", out);
}

int qc_cmd_quant(int argc, char **argv) {
  qc_common_opts co = {0};
  const char *dump = NULL, *path = NULL, *fmt = NULL, *prof = NULL;
  int identify = 0, rc;
  for (int i = 1; i < argc; i++) {
    int r;
    if (qc_opt_help(argv[i])) { help(); return 0; }
    if (strcmp(argv[i], "--identify") == 0) { identify = 1; continue; }
    if ((r = qc_opt_common(argc, argv, &i, &co))) { if (r < 0) return QC_EINPUT; continue; }
    if ((r = qc_opt_value(argc, argv, &i, "--dump", &dump)) || (r = qc_opt_value(argc, argv, &i, "--module", &path)) ||
        (r = qc_opt_value(argc, argv, &i, "--format", &fmt))) {
      if (r < 0) return QC_EINPUT;
      continue;
    }
    qc_hint("run 'qatcheck quant --help'");
    return qc_err("quant: unknown option '%s'", argv[i]);
  }
  if (!dump || !path) {
    qc_hint("qatcheck quant --dump run.h5 --module /model.layers.0.mlp.down_proj --format nvfp4");
    return qc_err("quant: options '--dump' and '--module' are required");
  }
  if ((rc = qc_opt_cpu_only("quant", co.device, QUANT_NO_DEVICE))) return rc;
  if (identify && co.profile)
    return qc_err("quant: '--profile %s' and '--identify' exclude each other: --identify tries every profile", co.profile);
  prof = co.profile;
  double t0 = qc_now_s();
  qc_dump *d = NULL;
  qc_module m;
  qc_tlist tl = {0};
  quant_cmp *cmp = NULL;
  char cj[4096] = "";
  memset(&m, 0, sizeof m);
  if ((rc = qc_dump_open(dump, &d))) return rc;
  if ((rc = qc_dump_load_module(d, path, 0, &m, cj, sizeof cj))) goto done;
  char where[QC_PATHLEN + 64];
  snprintf(where, sizeof where, "module '%s'", path);
  if (cj[0] && (rc = qc_contract_parse(cj, where, &m.contract))) goto done;
  if (!fmt) fmt = qc_contract_str(&m.contract, "weight_format", NULL);
  if (!fmt) {
    rc = qc_err("quant: module '%s' has no contract weight_format: pass --format", path);
    goto done;
  }
  if (!prof) prof = qc_contract_str(&m.contract, "profile", "vllm");
  qc_qfmt f;
  qc_qprof p;
  qc_sr sr;
  if ((rc = qc_qfmt_parse(fmt, &f)) || (rc = qc_qprof_parse(prof, &p))) goto done;
  if (f == QC_QF_NONE) { rc = qc_err("quant: format 'none' has no deployed bytes to check"); goto done; }
  if (!qc_tset_get(&m.saved, "weight_q")) {
    rc = qc_err("dump '%s': module '%s' has no dataset 'saved/weight_q': nothing to check", dump, path);
    goto done;
  }
  qc_sr_from_contract(&m.contract, m.path, &sr);
  int n = identify ? QC_QP_COUNT : 1, any = 0;
  if (!(cmp = qc_calloc((size_t)n, sizeof *cmp, "quant comparisons"))) { rc = QC_ESYS; goto done; }
  for (int i = 0; i < n; i++) {
    if ((rc = run_one(&m, f, identify ? (qc_qprof)i : p, &sr, &cmp[i]))) goto done;
    any |= cmp[i].ok;
  }
  int verdict = identify ? !any : !cmp[0].ok;
  if (qc_verbose) fprintf(stderr, "quant: %d comparison(s) in %.3f s\n", n, qc_now_s() - t0);
  /* all reports or none: a later one that cannot be written takes the earlier ones back */
  if ((co.junit || co.markdown) && (rc = make_list(&tl, m.path, f, identify, cmp, n, any))) goto done;
  if (co.json && (rc = write_json(co.json, dump, m.path, f, identify, cmp, n, verdict))) goto done;
  if (co.junit && (rc = qc_tlist_junit(&tl, co.junit, "quant"))) {
    if (co.json) unlink(co.json);
    goto done;
  }
  if (co.markdown) {
    char pre[QC_PATHLEN + 1200];
    snprintf(pre, sizeof pre, "- dump: `%s`, module `%s`, format %s%s", dump, m.path, qc_qfmt_name(f),
             identify ? ", every profile (--identify)" : "");
    if ((rc = qc_tlist_markdown(&tl, co.markdown, "quant", pre))) {
      if (co.json) unlink(co.json);
      if (co.junit) unlink(co.junit);
      goto done;
    }
  }
  if (!qc_quiet && !identify)
    printf("%s %s/%s: %s: %s\n", m.path, qc_qfmt_name(f), qc_qprof_name(p), cmp[0].ok ? "reproduced" : "MISMATCH", cmp[0].line);
  if (!qc_quiet && identify) {
    printf("%s %s: profiles that reproduce the deployed bytes:", path, fmt);
    for (int i = 0; i < n; i++)
      if (cmp[i].ok) printf(" %s", qc_qprof_name(cmp[i].prof));
    printf("%s\n", any ? "" : " none");
  }
  rc = verdict ? QC_FAIL : QC_OK;
done:
  free(cmp);
  qc_tlist_free(&tl);
  qc_module_free(&m);
  qc_dump_close(d);
  return rc;
}
