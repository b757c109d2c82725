/* tol_dump.c: `qatcheck tol --dump F --module PATH` (the branch qc_cmd_tol
 * takes for it, its options parsed): the module's class reads K and dtypes of each of its
 * gradients from the dump (the class's tol_rules), each is derived as
 * `qatcheck tol` would, and the whole case-file "tolerances" member is
 * printed, every reasoning naming where its K came from. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli/cli.h"
#include "core/qc.h"
#include "io/dump.h"
#include "model/case.h"
#include "model/module.h"
#include "model/tol.h"
#include "report/report.h"
#include "report/run.h"

#define TOL_NO_DEVICE "tol derives its bounds arithmetically on the host and has no device work"
#define MAXG 16

int qc_tol_dump(const qc_common_opts *cop, const char *dump, const char *path, const char *acc, double lambda,
                double margin) {
  const qc_common_opts co = *cop;
  int rc;
  if (!path) {
    qc_hint("qatcheck tol --dump step.h5 --module /model.layers.0.mlp.down_proj");
    return qc_err("tol: --dump needs --module PATH (the module group whose tolerances to derive)");
  }
  if ((rc = qc_opt_cpu_only("tol", co.device, TOL_NO_DEVICE))) return rc;
  if (co.profile) return qc_err("tol: --profile is not supported: the bounds do not depend on a quantizer profile");
  qc_dump *d = NULL;
  qc_module m;
  qc_report_out out;
  qc_tol_ask ask[MAXG];
  qc_tol_spec spec[MAXG];
  qc_tol_terms terms[MAXG];
  qc_tol_info ti[MAXG];
  char cmd[MAXG][640], why[MAXG][1024], cls[64], cj[4096], where[QC_PATHLEN + 64];
  char *txt = NULL;
  int n = 0;
  memset(&m, 0, sizeof m);
  qc_run_out(co.run, &out, co.json, co.junit, co.markdown);
  if ((rc = qc_dump_open(dump, &d))) goto done;
  if (qc_dump_get_attr(d, path, "class", cls, sizeof cls) != QC_OK) {
    rc = qc_err("dump '%s': '%s' is not a module group (no string attribute 'class')", dump, path);
    goto done;
  }
  const qc_registry_row *row = qc_registry_find(cls);
  if (!row) { rc = qc_err("dump '%s': module '%s' has class '%s', which is not known", dump, path, cls); goto done; }
  if (!row->cls->tol_rules) {
    qc_hint("derive each gradient with 'qatcheck tol --out-dtype D --k K --tensor NAME' (docs/tolerances.md: K per class)");
    rc = qc_err("tol --dump: class '%s' does not read its reduction lengths from a dump yet", cls);
    goto done;
  }
  if ((rc = qc_dump_load_module(d, path, 1, &m, cj, sizeof cj))) goto done;
  m.cls = row->cls;
  snprintf(where, sizeof where, "module '%s'", path);
  if ((rc = qc_module_check_known(&m, where))) goto done;
  if (cj[0] && (rc = qc_contract_parse(cj, where, &m.contract))) goto done;
  if ((rc = qc_contract_validate(&m.contract, m.cls->keys, where))) goto done;
  if ((rc = row->cls->tol_rules(&m, ask, MAXG, &n))) goto done;
  for (int i = 0; i < n; i++) {
    memset(&spec[i], 0, sizeof spec[i]);
    spec[i].out_dtype = ask[i].out_dtype;
    spec[i].operand_dtype = ask[i].operand_dtype;
    spec[i].acc_dtype = acc;
    spec[i].k = ask[i].k;
    spec[i].rounded_operands = ask[i].rounded_operands;
    spec[i].lambda = lambda;
    spec[i].margin = margin;
    if ((rc = qc_tol_derive(&spec[i], &terms[i]))) goto done;
    int k = snprintf(cmd[i], sizeof cmd[i], "qatcheck tol --out-dtype %s --operand-dtype %s --acc-dtype %s --k %lld",
                     ask[i].out_dtype, ask[i].operand_dtype, acc ? acc : "float32", (long long)ask[i].k);
    if (ask[i].rounded_operands) k += snprintf(cmd[i] + k, sizeof cmd[i] - (size_t)k, " --rounded-operands %d", ask[i].rounded_operands);
    if (lambda > 0) k += snprintf(cmd[i] + k, sizeof cmd[i] - (size_t)k, " --lambda %g", lambda);
    if (margin > 0) k += snprintf(cmd[i] + k, sizeof cmd[i] - (size_t)k, " --margin %g", margin);
    snprintf(cmd[i] + k, sizeof cmd[i] - (size_t)k, " --tensor %s (from the dump: %s)", ask[i].tensor, ask[i].why);
    qc_tol_reasoning(&spec[i], &terms[i], cmd[i], why[i], sizeof why[i]);
    ti[i] = (qc_tol_info){.tensor = ask[i].tensor, .command = cmd[i], .reasoning = why[i], .s = &spec[i], .t = &terms[i]};
  }
  if (!(txt = qc_report_tol_members(ti, n))) { rc = qc_err_sys("tol: out of memory building the JSON"); goto done; }
  if ((rc = qc_report_tol_module(&out, ti, n, dump, path)) || (rc = qc_report_commit(&out))) goto done;
  if (!qc_quiet) printf("%s\n", txt);
  rc = QC_OK;
done:
  free(txt);
  qc_report_out_free(&out);
  qc_module_free(&m);
  qc_dump_close(d);
  return rc;
}
