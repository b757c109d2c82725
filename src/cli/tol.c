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

#define TOL_NO_DEVICE "tol derives its bounds arithmetically on the host and has no device work"

static void tol_help(void) {
  printf("usage: qatcheck tol --out-dtype D --k K [options]\n"
         "       qatcheck tol --dump FILE.h5 --module PATH [--acc-dtype D] [--lambda L] [--margin M]\n\n"
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
         "  max_abs     with --scale S: margin*S*(u_out + lambda*sqrt(K)*u_acc + n*u_op + u_fmt)\n\n"
         "options:\n"
         "  --out-dtype D         dtype the gradient is stored in (bfloat16, float32, ...; required)\n"
         "  --k K                 reduction length (required): for a linear, N out-features\n"
         "                        for d_x, M tokens for d_weight and d_bias\n"
         "  --operand-dtype D     dtype the product's operands enter in (default: the output dtype)\n"
         "  --rounded-operands N  operands (0-2) the candidate rounds to the operand dtype that the\n"
         "                        reference takes unrounded, e.g. 1 for a dequantized weight cast to\n"
         "                        bf16 (default 0: operands are what the dump or generator holds)\n"
         "  --acc-dtype D         accumulator dtype (default float32)\n"
         "  --format F            one operand quantized to F (fp8_*, mxfp8, nvfp4, mxfp4, e4m3, ...)\n"
         "                        that the reference does not reproduce (default none)\n"
         "  --tensor NAME         the gradient's name (default d_x)\n"
         "  --lambda L            Higham-Mary lambda (default %g)\n"
         "  --margin M            safety factor, at least 1 (default sqrt(3) = %.4g: the output\n"
         "                        term becomes u, the worst case of one rounding)\n"
         "  --scale S             bound on (|A||B|)_i, adds max_abs (default: no max_abs)\n\n"
         "With --dump and --module, the module's class reads K and the dtypes of every gradient it\n"
         "checks from the dump (linear: K = N for d_x, the tokens M for d_weight and d_bias; operands\n"
         "in dY's dtype) and the whole \"tolerances\" member of the case file is printed.\n\n"
         "The JSON member goes to stdout (not under --quiet). The report options record the\n"
         "derivation: --json the inputs, every term and the member; --junit and --markdown\n"
         "list each derived bound as a passed testcase (tol judges nothing, so nothing fails).\n"
         "The command line in the reasoning leaves the report and output options out.\n\n",
         QC_TOL_LAMBDA, QC_TOL_MARGIN);
  qc_common_help_opts(QC_HELP_MARKDOWN | QC_HELP_CPU_ONLY | QC_HELP_NO_BASELINE);
  printf("exit status: 0 derived, 2 bad options\n");
}

/* Parse a number option value strictly; message names the option. */
int qc_tol_num_arg(const char *opt, const char *v, double lo, double *out) {
  char *end;
  errno = 0;
  double d = strtod(v, &end);
  if (errno || end == v || *end || !(d >= lo) || d > 1e15)
    return qc_err("option '%s' is '%s': expected a number of at least %g", opt, v, lo);
  *out = d;
  return QC_OK;
}

/* The command line as a shell would accept it, for the reasoning; the
 * arguments marked in skip (report and output options) left out. */
static void cmdline(int argc, char **argv, const char *skip, char *buf, size_t n) {
  size_t o = (size_t)snprintf(buf, n, "qatcheck tol");
  for (int i = 1; i < argc && o < n; i++) {
    if (skip[i]) continue;
    int plain = strspn(argv[i], "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789-_.=/+:,") ==
                strlen(argv[i]) && argv[i][0];
    o += (size_t)snprintf(buf + o, n - o, plain ? " %s" : " '%s'", argv[i]);
  }
}

int qc_cmd_tol(int argc, char **argv) {
  qc_tol_spec s = {0};
  qc_common_opts co = {0};
  const char *tensor = "d_x", *v = NULL;
  double d = 0;
  int rc = QC_OK;
  char *txt = NULL;
  qc_report_out out;
  if (qc_tol_dump_wanted(argc, argv)) return qc_cmd_tol_dump(argc, argv); /* tol_dump.c */
  qc_report_out_init(&out, NULL, NULL, NULL);
  char *skip = qc_calloc((size_t)argc + 1, 1, "tol arguments");
  if (!skip) return QC_ESYS;
  for (int i = 1; i < argc; i++) {
    int r, at = i;
    if (qc_opt_help(argv[i])) { tol_help(); goto done; }
    if ((r = qc_opt_common(argc, argv, &i, &co))) {
      if (r < 0) { rc = QC_EINPUT; goto done; }
      for (int j = at; j <= i; j++) skip[j] = 1;
      continue;
    }
    if ((r = qc_opt_value(argc, argv, &i, "--out-dtype", &s.out_dtype)) ||
        (r = qc_opt_value(argc, argv, &i, "--operand-dtype", &s.operand_dtype)) ||
        (r = qc_opt_value(argc, argv, &i, "--acc-dtype", &s.acc_dtype)) ||
        (r = qc_opt_value(argc, argv, &i, "--format", &s.format)) ||
        (r = qc_opt_value(argc, argv, &i, "--tensor", &tensor))) {
      if (r < 0) { rc = QC_EINPUT; goto done; }
      continue;
    }
    static const char *const nums[] = {"--k", "--rounded-operands", "--lambda", "--margin", "--scale"};
    int hit = -1;
    for (int j = 0; j < 5 && hit < 0; j++) {
      if ((r = qc_opt_value(argc, argv, &i, nums[j], &v)) < 0) { rc = QC_EINPUT; goto done; }
      if (r) hit = j;
    }
    if (hit < 0) {
      qc_err("tol: unknown option '%s'", argv[i]);
      qc_hint("run 'qatcheck tol --help'");
      rc = QC_EINPUT;
      goto done;
    }
    static const double lo[] = {1, 0, 1e-3, 1, 0};  /* --lambda > 0, --margin >= 1 */
    if ((rc = qc_tol_num_arg(nums[hit], v, lo[hit], &d))) goto done;
    if ((hit == 0 || hit == 1) && d != (double)(int64_t)d) {
      rc = qc_err("option '%s' is '%s': expected a whole number", nums[hit], v);
      goto done;
    }
    switch (hit) {
      case 0: s.k = (int64_t)d; break;
      case 1: s.rounded_operands = d > 2 ? 3 : (int)d; break;
      case 2: s.lambda = d; break;
      case 3: s.margin = d; break;
      default: s.scale = d; break;
    }
  }
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
  cmdline(argc, argv, skip, cmd, sizeof cmd);
  qc_tol_reasoning(&s, &t, cmd, why, sizeof why);

  qc_tol_info ti = {.tensor = tensor, .command = cmd, .reasoning = why, .s = &s, .t = &t};
  qc_report_out_init(&out, co.json, co.junit, co.markdown);
  if (!(txt = qc_report_tol_member(&ti))) { rc = qc_err_sys("tol: out of memory building the JSON"); goto done; }
  if ((rc = qc_report_tol(&out, &ti)) || (rc = qc_report_commit(&out))) goto done; /* all reports or none */
  if (!qc_quiet) printf("%s\n", txt);
  rc = QC_OK;
done:
  if (rc == QC_ESYS && !qc_err_msg()[0]) qc_err_sys("tol: out of memory building the JSON");
  free(skip);
  free(txt);
  qc_report_out_free(&out);
  return rc;
}
