/* audit_cmp.c: one candidate gradient compared with its float64
 * reference into a check's metrics (audit.h, audit_priv.h). */
#include "engine/audit_priv.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend/backend.h"
#include "core/qc.h"
#include "numerics/decode.h"
#include "numerics/formats.h"

/* The precision check k is judged at (qc_audit_dtype of g's values gd). */
static qc_dtype judged_dtype(const qc_tensor *g, const double *gd, const qc_tol *t, qc_check *k) {
  int f = g->dtype == QC_F32 || g->dtype == QC_F64;
  return qc_audit_dtype(g->dtype, f ? qc_values_dtype(gd, qc_numel(g), g->dtype) : g->dtype, t, k);
}

int qc_audit_ref_not_finite(const qc_check *k) {
  qc_err("%s: the reference '%s' has %lld non-finite value(s) for dY '%s': its inputs, parameters or dY are not finite",
         k->module, k->tensor, (long long)k->m.ref_nonfinite, k->dy);
  qc_hint("a gradient computed from non-finite data cannot be judged; check the dump");
  return QC_EINPUT;
}

/* The narrowest float type holding every value of g when it is stored as
 * float32 or float64 (qc_values_dtype_of: one pass over g), else g's dtype. */
static qc_dtype audit_values(const qc_tensor *g) {
  return g->dtype == QC_F32 || g->dtype == QC_F64 ? qc_values_dtype_of(g) : g->dtype;
}

qc_dtype qc_audit_held_of(const qc_tensor *g) { return qc_compare_host_dtype(g->dtype) ? audit_values(g) : g->dtype; }

int qc_audit_compare_held(const qc_ctx *ctx, const qc_tensor *g, qc_dtype held, const qc_tensor *r, const qc_tol *t,
                          qc_check *k) {
  int64_t n = qc_numel(r);
  if (qc_compare_host_dtype(g->dtype)) {
    /* on the host, whatever the backend: g and r are host tensors, and one
     * pass reading the candidate as it is stored costs less than staging
     * both on a device (two float64 copies uploaded for one reduction) */
    const qc_dtype dt = qc_audit_dtype(g->dtype, held, t, k);
    const int64_t cols = r->ndim ? r->shape[r->ndim - 1] : 1;
    const int bias = dt == QC_BF16 || dt == QC_F16 || dt == QC_F32 || dt == QC_F64;
    int rc = qc_compare_host(g, (const double *)r->data, cols ? n / cols : 0, cols, dt, bias, &k->m);
    if (rc) return rc;
    if (k->m.ref_nonfinite) return qc_audit_ref_not_finite(k);
    snprintf(k->judged_dtype, sizeof k->judged_dtype, "%s", qc_dtype_name(dt));
    k->has_metrics = 1;
    return QC_OK;
  }
  double *gd = qc_malloc((size_t)n * sizeof *gd, "candidate gradient (float64)");
  if (!gd) return QC_ESYS;
  int rc = qc_tensor_to_f64(g, gd);
  if (!rc) rc = ctx->be->metrics(ctx->be, gd, (const double *)r->data, n, &k->m);
  if (rc) {
    free(gd);
    return rc;
  }
  if (k->m.ref_nonfinite) {
    free(gd);
    return qc_audit_ref_not_finite(k);
  }
  qc_dtype dt = judged_dtype(g, gd, t, k);
  if (dt == QC_BF16 || dt == QC_F16 || dt == QC_F32 || dt == QC_F64) {
    int64_t cols = r->ndim ? r->shape[r->ndim - 1] : 1;
    rc = qc_bias_pass(gd, (const double *)r->data, cols ? n / cols : 0, cols, dt, &k->m);
  }
  free(gd);
  if (rc) return rc;
  snprintf(k->judged_dtype, sizeof k->judged_dtype, "%s", qc_dtype_name(dt));
  k->has_metrics = 1;
  return QC_OK;
}

int qc_audit_compare(const qc_ctx *ctx, const qc_tensor *g, const qc_tensor *r, const qc_tol *t, qc_check *k) {
  return qc_audit_compare_held(ctx, g, qc_audit_held_of(g), r, t, k);
}

qc_dtype qc_audit_cand_dtype(const qc_tensor *g, const qc_tol *t, qc_check *k) {
  return qc_audit_dtype(g->dtype, audit_values(g), t, k); /* unreadable: judged at its storage dtype */
}

void qc_check_init(qc_check *k, const qc_module *m, const char *dy, const char *tensor, int ndim, const int64_t *shape,
                   const qc_tol *t) {
  memset(k, 0, sizeof *k);
  snprintf(k->module, sizeof k->module, "%s", m->path);
  snprintf(k->cls, sizeof k->cls, "%s", m->cls->name);
  snprintf(k->dy, sizeof k->dy, "%s", dy);
  snprintf(k->tensor, sizeof k->tensor, "%s", tensor);
  k->ndim = ndim;
  memcpy(k->shape, shape, (size_t)ndim * sizeof *shape);
  k->has_tol = 1;
  k->tol = *t;
  k->m.noise_multiple = k->m.noise_floor = NAN;
  k->m.e_par = k->m.bias_sd = k->m.bias_allow = k->m.bias_z_raw = k->m.bias_z = NAN;
}
