/* fuzz harness `report`: the JSON report reader of `qatcheck report`
 * (report/audit_read.c: size and value limits, the self-consistency of
 * verdict, totals and checks) and the audit rendered from what it read
 * (report/audit.c), on any bytes (docs/robustness.md, "Fuzzing"). */
// fuzz-seeds: tests/fuzz/seeds/report
// fuzz-options: -max_len=65536 -timeout=10
#include <stdint.h>
#include <string.h>

#include "core/qc.h"
#include "model/evidence.h"
#include "report/audit.h"
#include "report/report.h"
#include "hdf5_input.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  static int inited;
  if (!inited) {
    hdf5_input_init("report");
    inited = 1;
  }
  if (!hdf5_input_write(data, size)) return 0;
  qc_evidence e;
  memset(&e, 0, sizeof e);
  if (qc_audit_read(g_path, &e) == QC_OK) {
    qc_audit_ctx a = {.e = &e, .factor = 1.1};
    qc_report_out out;
    int verdict = 0;
    qc_report_out_init(&out, NULL, NULL, "fuzz.md"); /* rendered in memory, never committed */
    qc_report_out_html(&out, "fuzz.html");
    (void)qc_audit_render(&out, &a, &verdict);
    qc_report_out_free(&out);
  }
  qc_evidence_free(&e);
  qc_err_clear();
  return 0;
}
