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

static void help(void) {
  printf("usage: qatcheck report IN.json... [--markdown A.md] [--html A.html] [options]\n\n"
         "Assembles one audit document from the JSON reports (--json) of vjp, contract, sft and\n"
         "step runs, in any mix: a one-screen summary (verdict per layer, counts, coverage, the\n"
         "worst checks); layer 1 per module class (gradient contract, reference, dY construction,\n"
         "shapes covered, metrics against their tolerances with the reasoning, failed checks), a\n"
         "plot of every check's noise multiple against its bound, the coverage matrix against the\n"
         "method's list with what is missing named; layer 2 per class and per layer with the\n"
         "outliers (plots); layer 3's config diff, pairs, curves and verdicts; the one-step update;\n"
         "regressions against baselines; the inputs with their SHA-256.\n\n"
         "  --markdown PATH    the audit as GitHub-flavoured Markdown (the plots are in the HTML)\n"
         "  --html PATH        the audit as one self-contained HTML file (inline SVG, no scripts,\n"
         "                     no external resources; prints well)\n"
         "  --json PATH        the audit's summary as JSON (layers, coverage, regressions)\n"
         "  --junit PATH       one testcase per input report (and per regression)\n"
         "  --baseline OLD     a report of an earlier run; compared with the input report of the same\n"
         "                     verb (and case or dump, when several); repeatable, one per input\n"
         "  --fail-on regression   exit 1 when a check regressed against its baseline\n"
         "  --regression-factor F  how far a metric may rise over its baseline (default 1.1)\n"
         "  --quiet            print nothing but errors\n"
         "  --help             this text\n\n"
         "exit status: 0 every input report passed, 1 one failed, deviates, is inconclusive or is an\n"
         "             error report (the audit is then incomplete), 2 the reports cannot be read\n");
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

int qc_cmd_report(int argc, char **argv) {
  qc_common_opts co = {0};
  const char *html = NULL;
  const char **in = qc_calloc((size_t)argc + 1, sizeof *in, "report arguments");
  int nin = 0, rc = QC_OK, verdict = 0;
  qc_evidence e;
  qc_report_out out;
  qc_audit_ctx a = {.e = &e, .factor = qc_run_factor()};
  memset(&e, 0, sizeof e);
  qc_report_out_init(&out, NULL, NULL, NULL);
  if (!in) return QC_ESYS;
  for (int i = 1; i < argc; i++) {
    int r;
    if (qc_opt_help(argv[i])) { help(); goto done; }
    if ((r = qc_opt_value(argc, argv, &i, "--html", &html))) { if (r < 0) { rc = QC_EINPUT; goto done; } continue; }
    if ((r = qc_opt_common(argc, argv, &i, &co))) { if (r < 0) { rc = QC_EINPUT; goto done; } continue; }
    if (argv[i][0] == '-' && argv[i][1]) {
      qc_hint("run 'qatcheck report --help'");
      rc = qc_err("report: unknown option '%s'", argv[i]);
      goto done;
    }
    in[nin++] = argv[i];
  }
  if ((rc = qc_opt_cpu_only("report", co.device, "report reads JSON reports and has no device work"))) goto done;
  if (co.profile) { rc = qc_err("report: --profile is not supported: the audit reads reports, it quantizes nothing"); goto done; }
  if (!nin) {
    qc_hint("qatcheck report reports/vjp.json reports/contract.json --html reports/audit.html");
    rc = qc_err("report: expected at least one JSON report");
    goto done;
  }
  for (int i = 0; i < nin && !rc; i++) {
    if (!(rc = qc_run_input("report", in[i]))) rc = qc_audit_read(in[i], &e);
  }
  if (rc) goto done;
  a.factor = qc_run_factor();
  if (qc_run_nbaselines() && (rc = qc_audit_baselines(&a))) goto done;
  qc_report_out_init(&out, co.json, co.junit, co.markdown);
  qc_report_out_html(&out, html);
  if ((rc = qc_audit_render(&out, &a, &verdict)) || (rc = qc_report_commit(&out))) goto done; /* all or none */
  if (a.reg) {
    qc_sbuf s = {0};
    int nreg = 0;
    console_lines(&a, &s);
    for (int i = 0; i < e.nsrc; i++) nreg += a.reg[i].n;
    qc_run_regressions(nreg, s.s);
    qc_sbuf_free(&s);
  }
  if (!qc_quiet) {
    qc_sbuf line = {0};
    qc_audit_console(&e, verdict, &line);
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
  return rc;
}
