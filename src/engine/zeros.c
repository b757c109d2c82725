/* zeros.c: a class's exact zeros in a gradient (qc_class.zero_slices),
 * judged beside the metrics (engine/audit.c): whole slices along dimension
 * 0 that nothing is summed into (an expert no token is routed to) must be
 * exactly zero in the candidate, whatever its rounding. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/qc.h"
#include "engine/audit.h"
#include "numerics/decode.h"

/* The class's exact zeros (qc_class.zero_slices): where gradient g of m
 * must be zero in whole slices along dimension 0 (an expert no token is
 * routed to), anything else there fails check k whatever its metrics,
 * naming the first such slice, how many values and the largest. */
int qc_audit_exact_zeros(const qc_module *m, const qc_tensor *g, int64_t off0, int64_t nwhole, qc_check *k) {
  if (!m->cls->zero_slices || g->ndim < 2 || g->shape[0] < 1 || off0 < 0 || off0 + g->shape[0] > nwhole) return QC_OK;
  const int64_t n = g->shape[0], per = qc_numel(g) / n;
  unsigned char *zero = qc_calloc((size_t)nwhole, 1, "exact zeros");
  double *v = qc_malloc((size_t)per * sizeof *v + 8, "exact zeros");
  const char *what = "slice";
  int rc = QC_ESYS;
  if (!zero || !v) goto done;
  qc_err_state es;
  qc_err_save(&es);
  char grad[QC_NAMELEN]; /* a sharded dump's per-rank check "d_w1@rank2" is d_w1's */
  snprintf(grad, sizeof grad, "%s", k->tensor);
  grad[strcspn(grad, "@")] = 0;
  rc = m->cls->zero_slices(m, grad, nwhole, zero, &what);
  if (rc == QC_NA) {
    qc_err_restore(&es);
    rc = QC_OK;
    goto done;
  }
  if (rc) { qc_err_keep(&es); goto done; }
  qc_err_restore(&es);
  int64_t nbad = 0, first = -1, cnt = 0;
  double mx = 0;
  for (int64_t i = 0; i < n; i++) {
    if (!zero[off0 + i]) continue;
    qc_tensor s = *g;
    s.ndim = 1;
    s.shape[0] = per;
    s.data = (char *)g->data + (size_t)(i * per) * qc_dtype_size(g->dtype);
    s.nbytes = (size_t)per * qc_dtype_size(g->dtype);
    if ((rc = qc_tensor_to_f64(&s, v))) goto done;
    int64_t c = 0;
    double smx = 0;
    for (int64_t j = 0; j < per; j++)
      if (v[j] != 0) { c++; smx = fmax(smx, fabs(v[j])); }
    if (!c) continue;
    if (nbad++ == 0) { first = off0 + i; cnt = c; mx = smx; }
  }
  if (nbad) {
    k->verdict = QC_V_FAIL;
    char w[sizeof k->why];
    snprintf(w, sizeof w, "%s %lld has no token, so %s[%lld] must be zero, but it holds %lld nonzero value(s), max |.| %.3g "
             "(%lld such %s(s))%s%s", what, (long long)first, grad, (long long)first, (long long)cnt, mx, (long long)nbad, what,
             k->why[0] ? "; " : "", k->why);
    snprintf(k->why, sizeof k->why, "%s", w);
  }
  rc = QC_OK;
done:
  free(zero);
  free(v);
  return rc;
}

