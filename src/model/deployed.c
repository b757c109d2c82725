/* deployed.c: the summary line of a deployed-bytes comparison (see
 * model/deployed.h). */
#include "model/deployed.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/qc.h"

void qc_deployed_summary(const qc_deployed_result *r, char *buf, int n) {
  int k = snprintf(buf, (size_t)n, "%lld payload, %lld scale, %lld global-scale, %lld decoded-bf16 mismatches of %lld elements",
                   (long long)r->n_payload, (long long)r->n_scale, (long long)r->n_global, (long long)r->n_decoded,
                   (long long)r->total_payload);
  for (int i = 0; i < r->nfirst && k > 0 && k < n; i++) {
    const qc_qmismatch *q = &r->first[i];
    int w = q->part[0] == 'p' ? 2 : q->part[0] == 'd' ? 4 : q->part[0] == 'g' ? 8 : 2;
    k += isnan(q->master)
             ? snprintf(buf + k, (size_t)(n - k), "%s %s[%lld]: expected 0x%0*x found 0x%0*x", i ? ";" : "; first:", q->part,
                        (long long)q->index, w, q->expected, w, q->found)
             : snprintf(buf + k, (size_t)(n - k), "%s %s[%lld] master %.9g: expected 0x%0*x found 0x%0*x", i ? ";" : "; first:",
                        q->part, (long long)q->index, q->master, w, q->expected, w, q->found);
  }
}

int qc_quant_rows_add(qc_quant_rows *r, qc_quant_row **out) {
  if (r->n == r->cap) {
    int nc = r->cap ? 2 * r->cap : 16;
    void *p = realloc(r->row, (size_t)nc * sizeof *r->row);
    if (!p) return qc_err_sys("out of memory for quant rows");
    r->row = p;
    r->cap = nc;
  }
  *out = &r->row[r->n++];
  memset(*out, 0, sizeof **out);
  return QC_OK;
}

int qc_quant_rows_skip(qc_quant_rows *r, const char *module, const char *why) {
  if (r->nskip == r->capskip) {
    int nc = r->capskip ? 2 * r->capskip : 16;
    void *p = realloc(r->skip, (size_t)nc * sizeof *r->skip);
    if (!p) return qc_err_sys("out of memory for quant rows");
    r->skip = p;
    r->capskip = nc;
  }
  qc_quant_skip *k = &r->skip[r->nskip++];
  snprintf(k->module, sizeof k->module, "%s", module);
  snprintf(k->why, sizeof k->why, "%s", why);
  return QC_OK;
}

void qc_quant_rows_free(qc_quant_rows *r) {
  free(r->row);
  free(r->skip);
  memset(r, 0, sizeof *r);
}
