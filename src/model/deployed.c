/* deployed.c: the summary line of a deployed-bytes comparison (see
 * model/deployed.h). */
#include "model/deployed.h"

#include <math.h>
#include <stdio.h>

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
