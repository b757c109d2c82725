/* quant.c: `qatcheck quant --dump F --module PATH [--format FMT] [--profile P]
 * [--identify]`: re-quantize a module's master weight and compare with the
 * deployed bytes in its saved/ group (numerics/deployed.h). */
#include <stdio.h>
#include <string.h>

#include "../case.h"
#include "../dump.h"
#include "../numerics/deployed.h"
#include "../qc.h"
#include "cli.h"

static void help(void) {
  printf("usage: qatcheck quant --dump FILE.h5 --module PATH [--format FMT] [--profile P] [--identify]\n\n"
         "Re-quantizes params/weight of module PATH and compares with its deployed bytes\n"
         "(saved/weight_q, saved/weight_scale, saved/weight_global_scale for nvfp4):\n"
         "payload, scales, global scale and decoded bf16 bits, negative zero included.\n\n"
         "  --format FMT   %s\n"
         "                 (default: the module's contract weight_format)\n"
         "  --profile P    %s (default: the contract's, else vllm)\n"
         "  --identify     try every profile and list those that reproduce the bytes\n"
         "exit status: 0 the bytes are reproduced, 1 they are not, 2 cannot judge\n",
         QC_WEIGHT_FORMATS, QC_PROFILES);
}

/* One comparison, printed; *ok set when nothing mismatches. */
static int run_one(const qc_module *m, qc_qfmt f, qc_qprof p, const qc_sr *sr, int quiet, int *ok) {
  qc_deployed_result r;
  int rc = qc_deployed_check(m, f, p, sr, &r);
  if (rc) return rc;
  char line[2048];
  qc_deployed_summary(&r, line, sizeof line);
  *ok = !(r.n_payload || r.n_scale || r.n_global || r.n_decoded);
  if (!quiet) printf("%s %s/%s: %s: %s\n", m->path, qc_qfmt_name(f), qc_qprof_name(p), *ok ? "reproduced" : "MISMATCH", line);
  return QC_OK;
}

int qc_cmd_quant(int argc, char **argv) {
  const char *dump = NULL, *path = NULL, *fmt = NULL, *prof = NULL;
  int identify = 0, rc;
  for (int i = 1; i < argc; i++) {
    int r;
    if (qc_opt_help(argv[i])) { help(); return 0; }
    if (strcmp(argv[i], "--identify") == 0) { identify = 1; continue; }
    if ((r = qc_opt_value(argc, argv, &i, "--dump", &dump)) || (r = qc_opt_value(argc, argv, &i, "--module", &path)) ||
        (r = qc_opt_value(argc, argv, &i, "--format", &fmt)) || (r = qc_opt_value(argc, argv, &i, "--profile", &prof))) {
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
  qc_dump *d = NULL;
  qc_module m;
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
  int ok = 0;
  if (!identify) {
    if (!(rc = run_one(&m, f, p, &sr, 0, &ok))) rc = ok ? QC_OK : QC_FAIL;
    goto done;
  }
  int any = 0;
  printf("%s %s: profiles that reproduce the deployed bytes:", path, fmt);
  for (int i = 0; i < QC_QP_COUNT && !rc; i++) {
    if ((rc = run_one(&m, f, (qc_qprof)i, &sr, 1, &ok))) break;
    if (ok) { printf(" %s", qc_qprof_name((qc_qprof)i)); any = 1; }
  }
  printf("%s\n", any ? "" : " none");
  if (!rc) rc = any ? QC_OK : QC_FAIL;
done:
  qc_module_free(&m);
  qc_dump_close(d);
  return rc;
}
