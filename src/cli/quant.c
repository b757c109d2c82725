/* quant.c: `qatcheck quant --dump F --module PATH [--format FMT] [--profile P]
 * [--identify] [common options]`: re-quantize a module's master weight and
 * compare with the deployed bytes in its saved/ group (numerics/deployed.h). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "model/case.h"
#include "model/check.h"
#include "io/dump.h"
#include "engine/deployed.h"
#include "core/qc.h"
#include "cli/cli.h"
#include "report/report.h"

#define QUANT_NO_DEVICE "quant compares the deployed bytes with qatcheck's reference quantizers, which run on the host"

static void help(void) {
  printf("usage: qatcheck quant --dump FILE.h5 --module PATH [--format FMT] [--profile P] [--identify] [options]\n"
         "       qatcheck quant --dump FILE.h5 [--modules REGEX] [--format FMT] [--profile P] [options]\n"
         "       qatcheck quant --checkpoint DEPLOYED --master MASTER [--modules REGEX] [--format FMT] [--profile P]\n\n"
         "Without --module: every module group of the dump with saved/weight_q, one row each.\n"
         "--checkpoint/--master: two safetensors checkpoints (file, folder or index); every quantized\n"
         "module of the deployed one (DeepSeek FP8 weight_scale_inv, compressed-tensors weight_scale /\n"
         "weight_packed / weight_global_scale, ModelOpt weight_scale / weight_scale_2; docs/interfaces.md\n"
         "section 2b) against its master's '<module>.weight' re-quantized, one row each.\n\n"
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

static int run_one(const qc_module *m, qc_qfmt f, qc_qprof p, const qc_sr *sr, qc_quant_cmp *c) {
  int rc = qc_deployed_check(m, f, p, sr, &c->r);
  if (rc) return rc;
  c->prof = p;
  qc_deployed_summary(&c->r, c->line, sizeof c->line);
  c->ok = !(c->r.n_payload || c->r.n_scale || c->r.n_global || c->r.n_decoded);
  return QC_OK;
}

int qc_cmd_quant(int argc, char **argv) {
  qc_common_opts co = {0};
  const char *dump = NULL, *path = NULL, *fmt = NULL, *prof = NULL;
  int identify = 0, rc;
  if (qc_quant_many_wanted(argc, argv)) return qc_cmd_quant_many(argc, argv); /* quant_many.c */
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
  qc_report_out out;
  qc_quant_cmp *cmp = NULL;
  char cj[4096] = "";
  memset(&m, 0, sizeof m);
  qc_report_out_init(&out, co.json, co.junit, co.markdown);
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
  qc_quant_info qi = {.dump = dump, .module = m.path, .format = qc_qfmt_name(f), .identify = identify, .c = cmp, .n = n,
                      .any = any, .verdict = verdict};
  if ((rc = qc_report_quant(&out, &qi)) || (rc = qc_report_commit(&out))) goto done; /* all reports or none */
  if (!qc_quiet) qc_report_quant_table(&qi);
  rc = verdict ? QC_FAIL : QC_OK;
done:
  free(cmp);
  qc_report_out_free(&out);
  qc_module_free(&m);
  qc_dump_close(d);
  return rc;
}
