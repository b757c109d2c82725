/* report.c: `qatcheck report IN.json... --markdown A.md --html A.html`: one
 * audit document from the JSON reports of vjp, contract, sft and step (any
 * mix, any number), in the method's structure (report/audit.h); with
 * --baseline, each input compared with the baseline of its verb. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli/cli.h"
#include "core/qc.h"
#include "report/audit.h"
#include "report/run.h"

/* The verb's --help: what it does and its options (p's table). */
static void help(const qc_opts *p) {
  printf("usage: qatcheck report IN.json... [--markdown A.md] [--html A.html] [options]\n\n"
         "Assembles one audit document from the JSON reports (--json) of vjp, contract, sft and\n"
         "step runs, in any mix: a one-screen summary (verdict per layer, counts, coverage, the\n"
         "worst checks); layer 1 per module class (gradient contract, reference, dY construction,\n"
         "shapes covered, metrics against their tolerances with the reasoning, failed checks), a\n"
         "plot of every check's noise multiple against its bound, the coverage matrix against the\n"
         "method's list with what is missing named; layer 2 per class and per layer with the\n"
         "outliers (plots); layer 3's config diff, pairs, curves and verdicts; the one-step update;\n"
         "regressions against baselines; the inputs with their SHA-256.\n\n");
  qc_opts_help(p->opt, 21);
  printf("\nEach report is judged again from the metrics and bounds its checks record, never taken at its\n"
         "verdict: one its own checks contradict is refused.\n");
  printf("\nThe method runs layer 1 -> 2 -> 3: the audit is incomplete, and says which layer is missing\n"
         "and why, without a vjp and a step report, an sft report comparing under_test with both\n"
         "gradient_reference and native_baseline, or (when an audited module quantizes) a contract\n"
         "report measuring each of its formats.\n");
  printf("\nexit status: 0 every input report passed and the audit is whole (or --allow-incomplete\n"
         "             accepts the missing layers), 1 one failed, deviates, is inconclusive or is an\n"
         "             error report, or a required layer is missing, 2 the reports cannot be read,\n"
         "             are contradicted by their checks, or judged nothing\n");
}

/* The regression lines for the console, as the verbs print them. */
static void console_lines(const qc_audit_ctx *a, qc_sbuf *b) {
  for (int i = 0; i < a->e->nsrc; i++) {
    const qc_regress_list *l = &a->reg[i];
    if (!a->reg_base[i]) continue;
    qc_sbuf_printf(b, "baseline %s: %s %s: %d regression(s); %d matched, %d new, %d vanished\n", a->reg_base[i],
                   a->e->src[i].verb, a->e->src[i].path, l->n, l->matched, l->added, l->vanished);
    for (int k = 0; k < l->n && k < 50; k++) qc_sbuf_printf(b, "  REGRESSION %s: %s\n", l->v[k].id, l->v[k].what);
  }
}

int qc_cmd_report(qc_run *run, int argc, char **argv) {
  qc_common_opts co = {.run = run};
  const char *html = NULL;
  const char **in = qc_calloc((size_t)argc + 1, sizeof *in, "report arguments");
  int nin = 0, rc = QC_OK, verdict = 0;
  qc_evidence e;
  qc_report_out out;
  qc_audit_ctx a = {.e = &e, .factor = run->gate.factor};
  memset(&e, 0, sizeof e);
  qc_report_out_init(&out, NULL, NULL, NULL);
  if (!in) return QC_ESYS;
  /* the common options, in the words of a verb that reads reports: --device and --profile
   * parsed (and refused below), --timeout and --verbose taken, none of them listed */
  qc_opt opts[] = {
      QC_OPT_REPORT("markdown", &co.markdown, QC_REP_MARKDOWN, "the audit as GitHub-flavoured Markdown (the plots are in the HTML)"),
      QC_OPT_REPORT("html", &html, QC_REP_HTML,
                    "the audit as one self-contained HTML file (inline SVG, no scripts,\n"
                    "no external resources; prints well)"),
      QC_OPT_REPORT("json", &co.json, QC_REP_JSON, "the audit's summary as JSON (layers, coverage, regressions)"),
      QC_OPT_REPORT("junit", &co.junit, QC_REP_JUNIT, "one testcase per input report (and per regression)"),
      QC_OPT_CALLBACK("baseline", &co, "OLD", qc_opt_baseline,
                      "a report of an earlier run; compared with the input report of the same\n"
                      "verb (and case or dump, when several); repeatable, one per input"),
      QC_OPT_BOOL("allow-incomplete", &a.allow_incomplete,
                  "exit 0 when a layer the method requires is missing and every report given passed\n"
                  "(the audit still says incomplete, and names what is missing)"),
      QC_OPT_CALLBACK("fail-on", &co, "regression", qc_opt_fail_on, "exit 1 when a check regressed against its baseline"),
      QC_OPT_REGRESSION_FACTOR_ENTRY(&co, "how far a metric may rise over its baseline (default 1.1)", 0),
      {.type = QC_OT_STRING, .name = "device", .value = &co.device, .argh = "DEV", .flags = QC_OPT_HIDDEN},
      {.type = QC_OT_STRING, .name = "profile", .value = &co.profile, .argh = "NAME", .flags = QC_OPT_HIDDEN},
      QC_OPT_TIMEOUT_ENTRY(QC_OPT_HIDDEN),
      {.type = QC_OT_BOOL, .name = "quiet", .alias = 'q', .value = &qc_quiet, .help = "print nothing but errors"},
      {.type = QC_OT_BOOL, .name = "verbose", .alias = 'v', .value = &qc_verbose, .flags = QC_OPT_HIDDEN},
      QC_OPT_BOOL("help", NULL, "this text"),
      QC_OPT_END(),
  };
  qc_opts p = {.verb = "report", .opt = opts, .help = help, .positional = 1, .run = run};
  if ((rc = qc_opts_parse(&p, argc, argv)) || p.done) goto done;
  qc_opts_args(&p, in, &nin);
  if ((rc = qc_opt_cpu_only("report", co.device, "report reads JSON reports and has no device work"))) goto done;
  if (co.profile) { rc = qc_err("report: --profile is not supported: the audit reads reports, it quantizes nothing"); goto done; }
  if (!nin) {
    qc_hint("qatcheck report reports/vjp.json reports/contract.json --html reports/audit.html");
    rc = qc_err("report: expected at least one JSON report");
    goto done;
  }
  for (int i = 0; i < nin && !rc; i++) {
    if (!(rc = qc_run_input(run, "report", in[i]))) rc = qc_audit_read(in[i], &e);
  }
  if (rc) goto done;
  /* a report with no check is no pass (each is re-judged as it is read): an audit of
   * reports that judged nothing (tol, report summaries) cannot be judged */
  int judged = 0, other = 0;
  for (int i = 0; i < e.nsrc; i++) {
    judged += e.src[i].judged;
    other += strcmp(e.src[i].verdict, "pass") != 0;
  }
  if (!judged && !other) {
    qc_hint("give the --json reports of vjp, contract, sft, step, quant or fd: they hold the checks");
    rc = qc_err("report: the %d report(s) given hold no judged check: nothing to audit", e.nsrc);
    goto done;
  }
  a.factor = run->gate.factor;
  if (run->gate.nbase && (rc = qc_audit_baselines(&a, &run->gate))) goto done;
  qc_run_out(run, &out, co.json, co.junit, co.markdown);
  qc_report_out_html(&out, html);
  if ((rc = qc_audit_render(&out, &a, &verdict)) || (rc = qc_report_commit(&out))) goto done; /* all or none */
  if (a.reg) {
    qc_sbuf s = {0};
    int nreg = 0;
    console_lines(&a, &s);
    for (int i = 0; i < e.nsrc; i++) nreg += a.reg[i].n;
    qc_baseline_record(&run->gate, nreg, s.s);
    qc_sbuf_free(&s);
  }
  if (!qc_quiet) {
    qc_sbuf line = {0};
    qc_audit_console(&a, &line);
    printf("%s\n", line.s ? line.s : "report: out of memory");
    qc_sbuf_free(&line);
    for (int k = 0; k < QC_REP_KINDS; k++)
      if (out.path[k]) printf("  wrote %s\n", out.path[k]);
  }
  rc = verdict ? QC_FAIL : QC_OK;
done:
  for (int i = 0; a.reg && i < e.nsrc; i++) qc_regress_free(&a.reg[i]);
  free(a.reg);
  free((void *)a.reg_base);
  qc_report_out_free(&out);
  qc_evidence_free(&e);
  free((void *)in);
  qc_opts_free(&p);
  return rc;
}
