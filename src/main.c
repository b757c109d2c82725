/* main.c: the verb table (git style). One verb = one file in src/cli/ and
 * one row here. */
#include <stdio.h>
#include <string.h>

#include "cli/cli.h"
#include "core/par.h"
#include "core/qc.h"
#include "core/watchdog.h"

static const qc_verb g_verbs[] = {
    {"vjp", qc_cmd_vjp, "layer 1: each production VJP against an independent float64 reference"},
    {"contract", qc_cmd_contract, "layer 2: dX from the master vs the dequantized weight, per class and layer"},
    {"tol", qc_cmd_tol, "derive tolerances, with their reasoning, from dtypes, reduction length and format"},
    {"fd", qc_cmd_fd, "finite differences: each float64 reference VJP against its float64 forward"},
    {"quant", qc_cmd_quant, "re-quantize a dump's master weight and check its deployed bytes"},
    {"report", qc_cmd_report, "one audit document (Markdown, HTML) from the JSON reports of vjp, contract, sft, step"},
    {"sft", qc_cmd_sft, "layer 3: three SFT arms' logs compared in a window against declared bounds"},
    {"step", qc_cmd_step, "one optimizer step recomputed in float64 and compared, per parameter"},
    {"classes", qc_cmd_classes, "every module class: tensors, gradients, contract keys, coverage (--json)"},
};
static const int g_nverbs = (int)(sizeof g_verbs / sizeof g_verbs[0]);

static void usage(FILE *f) {
  fprintf(f, "usage: qatcheck <verb> [options]\n\n"
             "qatcheck audits the backward pass of quantized, inference-aligned training.\n\n"
             "verbs:\n");
  for (int i = 0; i < g_nverbs; i++) fprintf(f, "  %-10s %s\n", g_verbs[i].name, g_verbs[i].help);
  fprintf(f, "\n`qatcheck <verb> --help` describes a verb. `qatcheck --version` prints the version.\n"
             "exit status: 0 pass, 1 a defect found, 2 cannot judge\n");
}

int main(int argc, char **argv) {
  qc_cli_sandbox(argc, argv); /* the dump sandbox's child never returns from here */
  qc_mem_tune();
  qc_blas_tune();
  if (qc_watchdog_arm(QC_TIMEOUT_DEFAULT) != QC_OK || qc_watchdog_signals() != QC_OK) { /* --timeout re-arms it */
    qc_err_print();
    return 2;
  }
  if (argc < 2) {
    usage(stderr);
    return 2;
  }
  if (strcmp(argv[1], "--version") == 0 || strcmp(argv[1], "version") == 0) {
    printf("qatcheck %s (source commit %s)\n", QC_VERSION, qc_build_commit());
    return 0;
  }
  if (strcmp(argv[1], "--help") == 0 || strcmp(argv[1], "-h") == 0 || strcmp(argv[1], "help") == 0) {
    usage(stdout);
    return 0;
  }
  for (int i = 0; i < g_nverbs; i++)
    if (strcmp(argv[1], g_verbs[i].name) == 0) {
      int rc = qc_cli_job(&g_verbs[i], argc - 1, argv + 1);
      if (rc == 2 && qc_err_msg()[0]) {
        qc_watchdog_hold(); /* a signal coming now waits for this line: its exit never cuts it */
        qc_err_print();
        qc_watchdog_release(0);
      }
      return rc;
    }
  qc_err("unknown verb '%s'", argv[1]);
  qc_hint("run 'qatcheck --help' for the list of verbs");
  qc_err_print();
  return 2;
}
