/* quant_many.c: the many-module modes of `qatcheck quant` (the branch
 * qc_cmd_quant takes for them, its options parsed): `--checkpoint DEPLOYED --master MASTER`
 * (safetensors: every quantized module's bytes against its master
 * re-quantized) and `--dump F` without `--module` (every module group with
 * deployed bytes). One row per module; exit 1 on any mismatch. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "cli/cli.h"
#include "core/qc.h"
#include "engine/ckpt_quant.h"
#include "io/dump.h"
#include "io/safetensors.h"
#include "report/report.h"
#include "report/run.h"

#define QUANT_NO_DEVICE "quant compares the deployed bytes with qatcheck's reference quantizers, which run on the host"

int qc_quant_many(const qc_quant_args *a) {
  const qc_common_opts co = a->co;
  const char *dep = a->checkpoint, *mst = a->master, *dump = a->dump;
  qc_quant_many_opts o;
  int rc;
  memset(&o, 0, sizeof o);
  o.modules = a->modules;
  o.format = a->format;
  if (dump && (dep || mst)) return qc_err("quant: --dump and --checkpoint/--master exclude each other");
  if (!dump && (!dep || !mst)) {
    qc_hint("qatcheck quant --checkpoint deployed/ --master master/");
    return qc_err("quant: --checkpoint DEPLOYED needs --master MASTER (the checkpoint it was quantized from)%s",
                  dep ? "" : ", and --master needs --checkpoint");
  }
  if ((rc = qc_opt_cpu_only("quant", co.device, QUANT_NO_DEVICE))) return rc;
  o.profile = co.profile;
  double t0 = qc_now_s();
  qc_st *sd = NULL, *sm = NULL;
  qc_dump *d = NULL;
  qc_quant_rows rows;
  qc_report_out out;
  char cfg[2048];
  memset(&rows, 0, sizeof rows);
  qc_run_out(co.run, &out, co.json, co.junit, co.markdown);
  if (dump) {
    if ((rc = qc_dump_open(dump, &d)) || (rc = qc_quant_dump_all(d, &o, &rows))) goto done;
  } else {
    o.config = qc_st_config_of(dep, cfg, sizeof cfg);
    if ((rc = qc_st_open(dep, &sd)) || (rc = qc_st_open(mst, &sm))) goto done;
    if ((rc = qc_quant_checkpoint(sd, sm, &o, &rows))) goto done;
  }
  int fails = 0;
  for (int i = 0; i < rows.n; i++) fails += !rows.row[i].c.ok;
  if (qc_verbose) fprintf(stderr, "quant: %d module(s) in %.3f s\n", rows.n, qc_now_s() - t0);
  qc_quant_many_info qi = {.deployed = dump ? dump : dep, .master = dump ? NULL : mst, .rows = &rows, .fails = fails,
                           .verdict = fails != 0};
  if ((rc = qc_report_quant_many(&out, &qi)) || (rc = qc_report_commit(&out))) goto done; /* all reports or none */
  if (!qc_quiet) qc_report_quant_many_table(&qi);
  rc = fails ? QC_FAIL : QC_OK;
done:
  qc_quant_rows_free(&rows);
  qc_report_out_free(&out);
  qc_st_close(sd);
  qc_st_close(sm);
  qc_dump_close(d);
  return rc;
}
