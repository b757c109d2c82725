/* step.c: `qatcheck step --case STEP.json`: the one-step update check.
 * Options, the plan (the case), the run (engine/step.c: the dumps, the
 * float64 recomputation, the comparisons), the reports. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli/caseverb.h"
#include "cli/cli.h"
#include "core/qc.h"
#include "engine/step.h"
#include "model/l3case.h"
#include "report/l3report.h"
#include "report/run.h"

#define STEP_NO_DEVICE "step recomputes the optimizer step in float64 on the host"

/* The verb's --help: what it does and its options (p's table). */
static void help(const qc_opts *p) {
  printf("usage: qatcheck step --case STEP.json [options]\n\n"
         "The one-step update: recomputes each arm's AdamW or SGD step in float64 as torch\n"
         "does (grad scale, global norm, clipping, decoupled weight decay, bias-corrected\n"
         "moments) and compares every parameter's update with it; frozen parameters that\n"
         "changed, parameters without gradients and gradients without parameters fail;\n"
         "two arms' gradients and updates are compared, and the localization said\n"
         "(gradients close but updates differ: scaling, clipping, optimizer state,\n"
         "parameter binding).\n\n");
  qc_opts_help(p->opt, 21);
  printf("exit status: 0 every judged check passed, 1 one failed,\n"
         "             2 the run could not be judged (bad case or dump, nothing judged)\n");
}

int qc_cmd_step(qc_run *qrun, int argc, char **argv) {
  qc_common_opts co;
  const char *case_path;
  static const qc_case_verb verb = {"step", help, "qatcheck step --case cases/proxy/step.json", STEP_NO_DEVICE,
                                    "step quantizes nothing"};
  int done, rc = qc_case_verb_opts(&verb, qrun, argc, argv, &co, &case_path, &done);
  if (rc || done) return rc;
  qc_step_case *cs = qc_calloc(1, sizeof *cs, "case");
  qc_step_run run;
  memset(&run, 0, sizeof run);
  qc_report_out out;
  qc_run_out(qrun, &out, co.json, co.junit, co.markdown);
  if (!cs) { rc = QC_ESYS; goto done; }
  if ((rc = qc_step_case_load(case_path, cs)) || (rc = qc_run_input(qrun, "case", case_path))) goto done;
  for (int i = 0; i < cs->ndump; i++) /* the dumps, hashed into the reports */
    if ((rc = qc_run_input(qrun, "dump", cs->dump[i]))) goto done;
  if ((rc = qc_step_load(&run, cs)) || (rc = qc_step_judge(&run))) goto done;
  if (qc_step_res_verdict(&run.res) == 2) {
    rc = qc_err("step: case '%s': nothing was judged (no declared tolerance applies)", case_path);
    qc_hint("declare 'update' (one arm) or 'grad_pair' / 'update_pair' (two arms) in 'tolerances'");
    goto done;
  }
  if (qc_verbose) fprintf(stderr, "step: read %.3f s, judged %.3f s\n", run.t_read, run.t_judge);
  qc_step_view v = {.cs = cs, .arms = run.arms, .narm = run.narm, .res = &run.res, .t_read = run.t_read, .t_judge = run.t_judge};
  if ((rc = qc_report_step(&out, &v)) || (rc = qc_report_commit(&out))) goto done; /* all reports or none */
  if (!qc_quiet) qc_report_step_table(&v);
  rc = qc_step_res_verdict(&run.res) ? QC_FAIL : QC_OK;
done:
  qc_report_out_free(&out);
  qc_step_run_free(&run);
  if (cs) qc_step_case_free(cs);
  free(cs);
  return rc;
}
