/* sft.c: `qatcheck sft --case SFT.json`: layer 3, the three-arm proxy-SFT
 * comparison. Options, the plan (the case), the run (engine/sft.c: logs,
 * configs, pairs), the reports. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "cli/caseverb.h"
#include "cli/cli.h"
#include "core/qc.h"
#include "engine/sft.h"
#include "model/l3case.h"
#include "report/l3report.h"
#include "report/run.h"

#define SFT_NO_DEVICE "sft compares logs on the host"

/* The verb's --help: what it does and its options (p's table). */
static void help(const qc_opts *p) {
  printf("usage: qatcheck sft --case SFT.json [options]\n\n"
         "Layer 3: compares per-step logs of SFT runs (under_test, gradient_reference,\n"
         "native_baseline) within a window, against bounds declared in advance; builds\n"
         "the config-diff table of the controlled variables; says per pair pass, deviates\n"
         "or inconclusive, the first deviation, and where to look (forward, backward, late).\n\n"
         "Logs: JSONL (verl's {\"step\", \"data\"} too), CSV, TensorBoard event files or run\n"
         "folders, Megatron golden values, Hugging Face trainer_state.json (told by content).\n"
         "Configs: JSON or YAML.\n\n");
  qc_opts_help(p->opt, 21);
  printf("  (--markdown writes one SVG plot per judged metric beside the report)\n\n"
         "exit status: 0 every pair passed, 1 a pair deviates or is inconclusive,\n"
         "             2 the run could not be judged (bad case, unreadable log or config)\n");
}

/* The run's inputs, hashed into its reports: the case, every arm's log and
 * config, the noise logs (a TensorBoard run folder is not hashed: only files are). */
static int register_inputs(qc_run *run, const char *case_path, const qc_sft_case *cs) {
  struct stat st;
  int rc = qc_run_input(run, "case", case_path);
  for (int a = 0; !rc && a < cs->narm; a++) {
    if (stat(cs->arms[a].log, &st) == 0 && S_ISREG(st.st_mode)) rc = qc_run_input(run, "log", cs->arms[a].log);
    if (!rc && cs->arms[a].config[0]) rc = qc_run_input(run, "config", cs->arms[a].config);
  }
  for (int p = 0; !rc && p < cs->npair; p++)
    for (int k = 0; !rc && k < cs->pairs[p].ncheck; k++)
      for (int j = 0; !rc && j < cs->pairs[p].checks[k].b.nnoise; j++) {
        const char *log = cs->pairs[p].checks[k].b.noise[j].log;
        if (stat(log, &st) == 0 && S_ISREG(st.st_mode)) rc = qc_run_input(run, "noise log", log);
      }
  return rc;
}

int qc_cmd_sft(qc_run *qrun, int argc, char **argv) {
  qc_common_opts co;
  const char *case_path;
  static const qc_case_verb verb = {"sft", help, "qatcheck sft --case cases/proxy/sft.json", SFT_NO_DEVICE,
                                    "sft reads logs, it quantizes nothing"};
  int done, rc = qc_case_verb_opts(&verb, qrun, argc, argv, &co, &case_path, &done);
  if (rc || done) return rc;
  qc_sft_case *cs = qc_calloc(1, sizeof *cs, "case");
  qc_sft_run *run = qc_calloc(1, sizeof *run, "sft run");
  qc_report_out out;
  qc_run_out(qrun, &out, co.json, co.junit, co.markdown);
  if (!cs || !run) { rc = QC_ESYS; goto done; }
  if ((rc = qc_sft_case_load(case_path, cs)) || (rc = register_inputs(qrun, case_path, cs)) || (rc = qc_sft_load(run, cs))) goto done;
  run->keep_series = co.markdown != NULL || co.json != NULL; /* the plots, and the curves the audit draws */
  if ((rc = qc_sft_judge(run))) goto done;
  if (qc_verbose) fprintf(stderr, "sft: read %.3f s, judged %.3f s\n", run->t_read, run->t_judge);
  qc_sft_view v = {.cs = cs, .logs = run->logs, .has_cfg = run->has_cfg, .rows = run->rows, .nrow = run->nrow, .missing_arms = run->missing_arms,
                   .pairs = run->pairs, .verdict = run->verdict, .t_read = run->t_read, .t_judge = run->t_judge};
  if ((rc = qc_report_sft(&out, &v)) || (rc = qc_report_commit(&out))) goto done; /* all reports or none */
  if (!qc_quiet) qc_report_sft_table(&v);
  rc = run->verdict ? QC_FAIL : QC_OK;
done:
  qc_report_out_free(&out);
  if (run) qc_sft_run_free(run);
  if (cs) qc_sft_case_free(cs);
  free(run);
  free(cs);
  return rc;
}
