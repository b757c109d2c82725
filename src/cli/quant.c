/* quant.c: `qatcheck quant --dump F --module PATH [--format FMT] [--profile P]
 * [--identify] [common options]`: re-quantize a module's master weight and
 * compare with the deployed bytes in its saved/ group (engine/deployed.h);
 * `qatcheck quant --calibration PATH...`: qatcheck's quantizers (the host's,
 * or --device cuda's kernels) against the bytes real producers made
 * (engine/calib.h). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "model/case.h"
#include "model/check.h"
#include "io/dump.h"
#include "backend/backend.h"
#include "engine/calib.h"
#include "engine/deployed.h"
#include "core/qc.h"
#include "cli/cli.h"
#include "report/report.h"
#include "report/run.h"

#define QUANT_NO_DEVICE "quant compares the deployed bytes with qatcheck's reference quantizers, which run on the host"

/* The verb's --help: what it does and its options (p's table). */
static void help(const qc_opts *p) {
  printf("usage: qatcheck quant --dump FILE.h5 --module PATH [--format FMT] [--profile P] [--identify] [options]\n"
         "       qatcheck quant --dump FILE.h5 [--modules REGEX] [--format FMT] [--profile P] [options]\n"
         "       qatcheck quant --checkpoint DEPLOYED --master MASTER [--modules REGEX] [--format FMT] [--profile P]\n"
         "       qatcheck quant --calibration PATH [--calibration PATH ...] [--device cpu|cuda[:N]] [options]\n\n"
         "Without --module: every module group of the dump with saved/weight_q, one row each.\n"
         "--checkpoint/--master: two safetensors checkpoints (file, folder or index); every quantized\n"
         "module of the deployed one (DeepSeek FP8 weight_scale_inv, compressed-tensors weight_scale /\n"
         "weight_packed / weight_global_scale, ModelOpt weight_scale / weight_scale_2; docs/interfaces.md\n"
         "section 2b) against its master's '<module>.weight' re-quantized, one row each.\n\n"
         "Re-quantizes params/weight of module PATH and compares with its deployed bytes\n"
         "(saved/weight_q, saved/weight_scale or weight_scale_inv, and for nvfp4\n"
         "saved/weight_global_scale or weight_scale_2, each taken as stored): payload,\n"
         "scales, global scale and decoded bf16 bits, negative zero included.\n\n");
  qc_opts_help(p->opt, 25);
  printf("exit status: 0 the bytes are reproduced (--identify: by some profile), 1 they are not,\n"
         "             2 cannot judge\n");
}

/* --calibration PATH: one path more (at most 15). */
static int opt_calibration(const qc_opt *o, const char *v) {
  qc_quant_args *a = o->value;
  a->cal[a->ncal] = v;
  if (++a->ncal == 16) return qc_err("quant: at most 15 --calibration paths");
  return QC_OK;
}

/* --calibration: every path compared on the device asked for. */
static int run_calibration(const qc_common_opts *co, const char *const *paths, int npaths) {
  const qc_backend *be = NULL;
  qc_calib_row *rows = NULL;
  qc_report_out out;
  int n = 0, rc, cuda = co->device && strcmp(co->device, "cpu") != 0;
  if (co->profile) return qc_err("quant: --profile and --calibration exclude each other: each record names its profile");
  qc_run_out(co->run, &out, co->json, co->junit, co->markdown);
  if (cuda && (rc = qc_backend_open(co->device, &be))) goto done;
  if ((rc = qc_calib_check(paths, npaths, be, &rows, &n))) goto done;
  long long bad = 0;
  for (int i = 0; i < n; i++) bad += rows[i].bad_payload + rows[i].bad_scale + rows[i].bad_global;
  qc_calib_info ci = {.paths = paths, .npaths = npaths, .device = be ? be->name : "cpu", .rows = rows, .n = n, .verdict = bad != 0};
  if ((rc = qc_report_calib(&out, &ci)) || (rc = qc_report_commit(&out))) goto done;
  if (!qc_quiet) qc_report_calib_table(&ci);
  rc = bad ? QC_FAIL : QC_OK;
done:
  free(rows);
  qc_report_out_free(&out);
  if (be) qc_backend_close(be);
  return rc;
}

/* quant's modes, for its options' modes field. */
enum { QM_ONE = 1, QM_MANY = 2, QM_CAL = 4 };

int qc_cmd_quant(qc_run *run, int argc, char **argv) {
  qc_quant_args qa;
  memset(&qa, 0, sizeof qa);
  qa.co.run = run;
  qc_opt opts[] = {
      {.type = QC_OT_STRING, .name = "dump", .value = &qa.dump, .argh = "FILE.h5", .help = "the dump (spec section 2)",
       .modes = QM_ONE | QM_MANY},
      {.type = QC_OT_STRING, .name = "module", .value = &qa.module, .argh = "PATH", .help = "the module group", .modes = QM_ONE},
      {.type = QC_OT_STRING, .name = "modules", .value = &qa.modules, .argh = "REGEX",
       .help = "without --module: only module groups (or modules) whose path matches", .modes = QM_MANY},
      {.type = QC_OT_STRING, .name = "checkpoint", .value = &qa.checkpoint, .argh = "DEPLOYED",
       .help = "the deployed safetensors checkpoint (file, folder or index)", .modes = QM_MANY},
      {.type = QC_OT_STRING, .name = "master", .value = &qa.master, .argh = "MASTER",
       .help = "with --checkpoint: the master checkpoint it was quantized from", .modes = QM_MANY},
      {.type = QC_OT_STRING, .name = "format", .value = &qa.format, .argh = "FMT",
       .help = QC_WEIGHT_FORMATS "\n(default: the module's contract weight_format)", .modes = QM_ONE | QM_MANY},
      QC_OPT_STRING("profile", &qa.co.profile, "P",
                    QC_PROFILES "\n(default: the contract's, else auto: the first that reproduces the bytes)"),
      {.type = QC_OT_BOOL, .name = "identify", .value = &qa.identify,
       .help = "try every profile: those that reproduce the bytes, or the closest and\n"
               "what differs (scales off by ulps, the scale and element rules the bytes fit)",
       .modes = QM_ONE | QM_MANY /* refused by the many modes with their reason */},
      {.type = QC_OT_CALLBACK, .name = "calibration", .value = &qa, .argh = "PATH", .fn = opt_calibration,
       .help = "a calibration file (.qcal) or a folder of them (scripts/calibrate/):\n"
               "every record quantized by qatcheck, compared byte for byte; --device cuda\n"
               "runs the CUDA kernels instead of the host quantizers",
       .modes = QM_CAL},
      QC_OPT_TEXT("\nReports: --json holds each comparison (module, format, profile, reproduced or\n"
                  "mismatch, counts, the detail line); --junit and --markdown have one testcase per\n"
                  "comparison, a mismatch a failure. Under --identify they have one testcase, failed\n"
                  "when no profile reproduces the bytes (the JSON still lists every profile).\n"),
      QC_OPTS_COMMON(&qa.co, QC_HELP_MARKDOWN),
      QC_OPT_END(),
  };
  qc_opts po = {.verb = "quant", .opt = opts, .help = help, .run = run};
  int rc = qc_opts_parse(&po, argc, argv);
  if (rc || po.done) {
    qc_opts_free(&po);
    return rc;
  }
  /* the mode, from the options given */
  int many = qa.checkpoint || qa.master || (qa.dump && !qa.module);
  if (many && qa.identify) {
    qc_opts_free(&po);
    qc_hint("qatcheck quant --dump F --module PATH --identify");
    return qc_err("quant: --identify checks one module: give --dump and --module");
  }
  int at = qc_opts_outside(&po, many ? QM_MANY : QM_ONE | QM_CAL);
  const char *bad = at ? argv[at] : NULL;
  qc_opts_free(&po);
  if (bad) {
    qc_hint("run 'qatcheck quant --help'");
    return qc_err("quant: unknown option '%s'", bad);
  }
  if (many) return qc_quant_many(&qa); /* quant_many.c */
  const qc_common_opts co = qa.co;
  const char *dump = qa.dump, *path = qa.module, *fmt = qa.format, *prof = NULL;
  int identify = qa.identify;
  if (qa.ncal) {
    if (dump || path || fmt || identify) return qc_err("quant: --calibration takes no --dump, --module, --format or --identify");
    return run_calibration(&co, qa.cal, qa.ncal);
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
  qc_identify *idf = NULL;
  char cj[4096] = "";
  memset(&m, 0, sizeof m);
  qc_run_out(co.run, &out, co.json, co.junit, co.markdown);
  if ((rc = qc_dump_open(dump, &d))) return rc;
  if ((rc = qc_run_input(co.run, "dump", dump))) goto done;
  if ((rc = qc_dump_load_module(d, path, 0, &m, cj, sizeof cj))) goto done;
  char where[QC_PATHLEN + 64];
  snprintf(where, sizeof where, "module '%s'", path);
  if (cj[0] && (rc = qc_contract_parse(cj, where, &m.contract))) goto done;
  if (!fmt) fmt = qc_contract_str(&m.contract, "weight_format", NULL);
  if (!fmt) {
    rc = qc_err("quant: module '%s' has no contract weight_format: pass --format", path);
    goto done;
  }
  if (!prof) prof = qc_contract_str(&m.contract, "profile", "auto");
  qc_qfmt f;
  qc_qprof p = QC_QP_VLLM;
  qc_sr sr;
  int autop = strcmp(prof, "auto") == 0;
  if ((rc = qc_qfmt_parse(fmt, &f)) || (!autop && (rc = qc_qprof_parse(prof, &p)))) goto done;
  if (f == QC_QF_NONE) { rc = qc_err("quant: format 'none' has no deployed bytes to check"); goto done; }
  if (!qc_tset_get(&m.saved, "weight_q")) {
    rc = qc_err("dump '%s': module '%s' has no dataset 'saved/weight_q': nothing to check", dump, path);
    goto done;
  }
  if ((rc = qc_sr_from_contract(&m.contract, m.path, &sr))) goto done;
  /* every profile (--identify, or auto: the first that reproduces the bytes) or one */
  if (!(idf = qc_calloc(1, sizeof *idf, "quant comparisons"))) { rc = QC_ESYS; goto done; }
  if (identify || autop) {
    if ((rc = qc_deployed_identify_module(&m, f, &sr, idf))) goto done;
  } else {
    qc_quant_cmp *c = &idf->c[0];
    if ((rc = qc_deployed_check(&m, f, p, &sr, &c->r))) goto done;
    c->prof = p;
    qc_deployed_summary(&c->r, c->line, sizeof c->line);
    c->ok = !(c->r.n_payload || c->r.n_scale || c->r.n_global || c->r.n_decoded);
    idf->n = 1;
    idf->any = c->ok;
  }
  cmp = identify ? idf->c : autop ? &idf->c[idf->chosen] : &idf->c[0];
  int n = identify ? idf->n : 1, any = idf->any;
  if (autop && !identify && !qc_quiet) printf("%s %s: profile auto: %s\n", m.path, qc_qfmt_name(f), idf->why);
  int verdict = identify ? !any : !cmp[0].ok;
  if (qc_verbose) fprintf(stderr, "quant: %d comparison(s) in %.3f s\n", n, qc_now_s() - t0);
  qc_quant_info qi = {.dump = dump, .module = m.path, .format = qc_qfmt_name(f), .identify = identify, .c = cmp, .n = n,
                      .any = any, .verdict = verdict, .seconds = qc_now_s() - t0,
                      .why = identify || autop ? idf->why : NULL};
  if ((rc = qc_report_quant(&out, &qi)) || (rc = qc_report_commit(&out))) goto done; /* all reports or none */
  if (!qc_quiet) qc_report_quant_table(&qi);
  rc = verdict ? QC_FAIL : QC_OK;
done:
  free(idf);
  qc_report_out_free(&out);
  qc_module_free(&m);
  qc_dump_close(d);
  return rc;
}
