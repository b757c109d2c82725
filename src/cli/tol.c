/* cli/tol.c: `qatcheck tol`: derive tolerances for one gradient tensor from
 * precision and reduction length, and print the case-file JSON with the
 * reasoning (and the command line that derived it) filled in. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "model/check.h"
#include "core/qc.h"
#include "model/tol.h"
#include "cli/cli.h"
#include "report/report.h"
#include "report/run.h"

#define TOL_NO_DEVICE "tol derives its bounds arithmetically on the host and has no device work"

/* The verb's --help: what it does and its options (p's table). */
static void tol_help(const qc_opts *p) {
  printf("usage: qatcheck tol --out-dtype D --k K [options]\n"
         "       qatcheck tol --dump FILE.h5 --module PATH [--margin M] [--rounded-operands N] [--format F]\n\n"
         "Derives the tolerances of one gradient tensor g (a reduction of K products,\n"
         "compared with a float64 reference of the same inputs) and prints the JSON\n"
         "member for the case file's \"tolerances\", reasoning included:\n"
         "  rel_l2      margin * sqrt(e_out^2 + e_acc^2 + e_op^2 + e_fmt^2) = e\n"
         "              e_out = u_out/sqrt(3)        output rounding (rms)\n"
         "              e_acc = lambda*sqrt(K)*u_acc  accumulation (Higham & Mary 2019)\n"
         "              e_op  = sqrt(n)*u_op/sqrt(3) n operands rounded to the operand dtype\n"
         "              e_fmt = u_fmt/sqrt(3)        one operand quantized to --format\n"
         "  cosine_min  sqrt(1 - e^2);  norm_ratio [1 - e, 1 + e]\n"
         "  noise_multiple  sqrt(1 + (2d/e_out)^2), d = margin*sqrt(e_acc^2 + e_op^2 + e_fmt^2)\n"
         "  max_abs     with --scale S: margin*S*(u_out + lambda*sqrt(K)*u_acc + n*u_op + u_fmt)\n\n");
  qc_opts_help(p->opt, 24);
  printf("exit status: 0 derived, 2 bad options\n");
}

/* The command line as a shell would accept it, for the reasoning; the
 * common options (report and output options) and their values left out. */
static void cmdline(const qc_opts *p, char *buf, size_t n) {
  size_t o = (size_t)snprintf(buf, n, "qatcheck tol");
  int common = 0;
  for (int i = 1; i < p->argc && o < n; i++) {
    int w = p->which[i];
    if (w != QC_OPTS_VALUE) common = w >= 0 && (p->opt[w].flags & QC_OPT_COMMON);
    if (common) continue;
    const char *a = p->argv[i];
    int plain = strspn(a, "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789-_.=/+:,") == strlen(a) && a[0];
    o += (size_t)snprintf(buf + o, n - o, plain ? " %s" : " '%s'", a);
  }
}

/* tol's modes, for its options' modes field. */
enum { TM_ONE = 1, TM_DUMP = 2 };

int qc_cmd_tol(qc_run *run, int argc, char **argv) {
  qc_tol_spec s = {0};
  qc_common_opts co = {.run = run};
  const char *tensor = "d_x", *dump = NULL, *module = NULL;
  double k = 0, rounded = 0, lambda = 0, margin = 0, scale = 0;
  int rc = QC_OK;
  char *txt = NULL;
  qc_report_out out;
  char lambda_help[64], margin_help[160];
  snprintf(lambda_help, sizeof lambda_help, "Higham-Mary lambda (default %g)", QC_TOL_LAMBDA);
  snprintf(margin_help, sizeof margin_help,
           "safety factor, at least 1 (default sqrt(3) = %.4g: the output\nterm becomes u, the worst case of one rounding)",
           QC_TOL_MARGIN);
  qc_opt opts[] = {
      QC_OPT_GROUP("options:", 24),
      {.type = QC_OT_STRING, .name = "out-dtype", .value = &s.out_dtype, .argh = "D", .modes = TM_ONE,
       .help = "dtype the gradient is stored in (bfloat16, float32, ...; required)"},
      {.type = QC_OT_NUMBER, .name = "k", .value = &k, .argh = "K", .lo = 1, .hi = QC_NUM_HUGE, .flags = QC_OPT_WHOLE, .modes = TM_ONE,
       .help = "reduction length (required): for a linear, N out-features\nfor d_x, M tokens for d_weight and d_bias"},
      {.type = QC_OT_STRING, .name = "operand-dtype", .value = &s.operand_dtype, .argh = "D", .modes = TM_ONE,
       .help = "dtype the product's operands enter in (default: the output dtype)"},
      {.type = QC_OT_NUMBER, .name = "rounded-operands", .value = &rounded, .argh = "N", .lo = 0, .hi = 2, .flags = QC_OPT_WHOLE,
       .modes = TM_ONE | TM_DUMP,
       .help = "operands (0-2) the candidate rounds to the operand dtype that the\n"
               "reference takes unrounded, e.g. 1 for a dequantized weight cast to\n"
               "bf16 (default 0: operands are what the dump or generator holds)"},
      {.type = QC_OT_STRING, .name = "acc-dtype", .value = &s.acc_dtype, .argh = "D", .modes = TM_ONE,
       .help = "accumulator dtype (default float32)"},
      {.type = QC_OT_STRING, .name = "format", .value = &s.format, .argh = "F", .modes = TM_ONE | TM_DUMP,
       .help = "one operand quantized to F (fp8_*, mxfp8, nvfp4, mxfp4, e4m3, ...)\n"
               "that the reference does not reproduce (default none)"},
      {.type = QC_OT_STRING, .name = "tensor", .value = &tensor, .argh = "NAME", .modes = TM_ONE,
       .help = "the gradient's name (default d_x)"},
      {.type = QC_OT_NUMBER, .name = "lambda", .value = &lambda, .argh = "L", .lo = 1e-3, .hi = QC_NUM_HUGE, .modes = TM_ONE,
       .help = lambda_help},
      {.type = QC_OT_NUMBER, .name = "margin", .value = &margin, .argh = "M", .lo = 1, .hi = QC_NUM_HUGE, .modes = TM_ONE | TM_DUMP,
       .help = margin_help},
      {.type = QC_OT_NUMBER, .name = "scale", .value = &scale, .argh = "S", .lo = 0, .hi = QC_NUM_HUGE, .modes = TM_ONE,
       .help = "bound on (|A||B|)_i, adds max_abs (default: no max_abs)"},
      {.type = QC_OT_STRING, .name = "dump", .value = &dump, .argh = "FILE.h5", .modes = TM_DUMP,
       .help = "with --module: read K and the dtypes from the dump (below)"},
      {.type = QC_OT_STRING, .name = "module", .value = &module, .argh = "PATH", .modes = TM_DUMP,
       .help = "with --dump: the module group whose tolerances to derive"},
      QC_OPT_TEXT("\nWith --dump and --module, every gradient of the module (any class) gets exactly the\n"
                  "tolerance vjp's {\"derive\": true} gives it: the class's error model, judged at the\n"
                  "candidate's dtype as dumped; --margin, --rounded-operands and --format stand for the\n"
                  "derive options of those names. The whole \"tolerances\" member of the case file is printed.\n\n"
                  "The JSON member goes to stdout (not under --quiet). The report options record the\n"
                  "derivation: --json the inputs, every term and the member; --junit and --markdown\n"
                  "list each derived bound as a passed testcase (tol judges nothing, so nothing fails).\n"
                  "The command line in the reasoning leaves the report and output options out.\n"),
      QC_OPTS_COMMON(&co, QC_HELP_MARKDOWN | QC_HELP_CPU_ONLY | QC_HELP_NO_BASELINE),
      QC_OPT_END(),
  };
  qc_opts p = {.verb = "tol", .opt = opts, .help = tol_help, .run = run};
  qc_report_out_init(&out, NULL, NULL, NULL);
  if ((rc = qc_opts_parse(&p, argc, argv)) || p.done) goto done;
  /* the mode, from the options given: --dump derives a module's gradients (tol_dump.c) */
  int bad = qc_opts_outside(&p, dump ? TM_DUMP : TM_ONE);
  if (bad && dump) {
    qc_hint("with --dump, tol derives as vjp's {\"derive\": true} does; it takes --module, --margin, --rounded-operands, --format");
    rc = qc_err("tol: option '%s' does not go with --dump", argv[bad]);
    goto done;
  }
  if (bad) {
    qc_hint("run 'qatcheck tol --help'");
    rc = qc_err("tol: unknown option '%s'", argv[bad]);
    goto done;
  }
  if (dump) {
    qc_tol_dump_opts dopt = {.margin = margin, .rounded_operands = qc_opts_given(&p, "rounded-operands") ? (int)rounded : -1,
                             .format = s.format};
    rc = qc_tol_dump(&co, dump, module, &dopt);
    goto done;
  }
  s.k = (int64_t)k;
  s.rounded_operands = (int)rounded;
  s.lambda = lambda;
  s.margin = margin;
  s.scale = scale;
  if ((rc = qc_opt_cpu_only("tol", co.device, TOL_NO_DEVICE))) goto done;
  if (co.profile) {
    rc = qc_err("tol: --profile is not supported: the bounds do not depend on a quantizer profile (the format's unit "
                "roundoff is the same under every profile)");
    goto done;
  }
  if (!s.k) {
    rc = qc_err("tol: '--k' is required: expected the reduction length");
    goto done;
  }
  qc_tol_terms t;
  if ((rc = qc_tol_derive(&s, &t))) goto done;
  char cmd[512], why[1024];
  cmdline(&p, cmd, sizeof cmd);
  qc_tol_reasoning(&s, &t, cmd, why, sizeof why);

  qc_tol_info ti = {.tensor = tensor, .command = cmd, .reasoning = why, .s = &s, .t = &t};
  qc_run_out(run, &out, co.json, co.junit, co.markdown);
  if (!(txt = qc_report_tol_member(&ti))) { rc = qc_err_sys("tol: out of memory building the JSON"); goto done; }
  if ((rc = qc_report_tol(&out, &ti)) || (rc = qc_report_commit(&out))) goto done; /* all reports or none */
  if (!qc_quiet) printf("%s\n", txt);
  rc = QC_OK;
done:
  if (rc == QC_ESYS && !qc_err_msg()[0]) qc_err_sys("tol: out of memory building the JSON");
  qc_opts_free(&p);
  free(txt);
  qc_report_out_free(&out);
  return rc;
}
