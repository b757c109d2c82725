/* ref_util.c: see ref_util.h. */
#include "reference/ref_util.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "model/sink.h"

#include "core/par.h"
#include "core/qc.h"
#include "numerics/decode.h"
#include "numerics/formats.h"
#include "reference/ref_dev.h"

double *qc_refu_load(const qc_tensor *t, const char *what) {
  const int64_t n = qc_numel(t) * (t->dtype == QC_E2M1X2 ? 2 : 1); /* a packed byte holds two values */
  double *d = qc_malloc((size_t)(n + 1) * sizeof *d, what);
  if (d && qc_tensor_to_f64(t, d)) {
    free(d);
    return NULL;
  }
  return d;
}

int qc_refu_out(qc_tset *grads, const char *name, int ndim, const int64_t *shape, double **data) {
  return qc_refu_out_z(grads, name, ndim, shape, 1, data);
}

int qc_refu_out_z(qc_tset *grads, const char *name, int ndim, const int64_t *shape, int zero, double **data) {
  qc_tensor t = {0};
  int rc = zero ? qc_tensor_alloc(&t, name, QC_F64, ndim, shape) : qc_tensor_alloc_out(&t, name, QC_F64, ndim, shape);
  if (rc) return rc;
  double *p = t.data;
  if ((rc = qc_tset_add(grads, &t))) {
    qc_tensor_free(&t);
    return rc;
  }
  *data = p;
  return QC_OK;
}

int qc_refu_out_s(const qc_ctx *ctx, qc_tset *grads, const char *name, int ndim, const int64_t *shape, int zero,
                  double **data) {
  const qc_grad_sink *sk = ctx ? ctx->sink : NULL;
  if (!sk || !sk->begin(sk, name, ndim, shape)) return qc_refu_out_z(grads, name, ndim, shape, zero, data);
  qc_tensor t = {0};
  snprintf(t.name, sizeof t.name, "%s", name);
  t.dtype = QC_F64;
  t.ndim = ndim;
  memcpy(t.shape, shape, (size_t)ndim * sizeof *shape);
  *data = NULL;
  return qc_tset_add(grads, &t);
}

int qc_refu_ids(const qc_module *m, const qc_tensor *t, const char *what, int64_t **out) {
  double *v = qc_refu_load(t, what);
  int64_t *ids = v ? qc_malloc((size_t)(qc_numel(t) + 1) * sizeof *ids, what) : NULL;
  int rc = ids ? QC_OK : QC_ESYS;
  for (int64_t i = 0; ids && i < qc_numel(t); i++) {
    if (v[i] != nearbyint(v[i]) || !(fabs(v[i]) < 4.5e15)) {
      rc = qc_err("%s: dataset '%s' holds %g at element %lld: expected integer ids", m->path, what, v[i], (long long)i);
      break;
    }
    ids[i] = (int64_t)v[i];
  }
  free(v);
  if (rc) free(ids);
  else *out = ids;
  return rc;
}

typedef struct pw_job {
  const double *X, *G;
  double *dx;
  double (*grad)(double x, int variant);
  int variant, ab;
} pw_job;

/* Elements [lo, hi) of qc_refu_pointwise (each alone: any thread count
 * gives the same values). */
static void pw_piece(void *ctx, int64_t lo, int64_t hi, int tid) {
  (void)tid;
  const pw_job *j = ctx;
  for (int64_t i = lo; i < hi; i++) {
    double d = j->ab ? fabs(j->G[i]) * j->grad(j->X[i], j->variant | QC_REFU_TERMS) : j->G[i] * j->grad(j->X[i], j->variant);
    if (!j->ab && (j->variant & QC_REFU_BF16)) d = qc_round_bf16((float)d);
    j->dx[i] = d;
  }
}

int qc_refu_pointwise(const qc_ctx *ctx, const qc_module *m, const qc_tensor *dy, qc_tset *grads,
                      double (*grad)(double x, int variant), int variant) {
  return qc_refu_pointwise_dev(ctx, m, dy, grads, grad, variant, QC_PW_PROBE);
}

int qc_refu_pointwise_dev(const qc_ctx *ctx, const qc_module *m, const qc_tensor *dy, qc_tset *grads,
                          double (*grad)(double x, int variant), int variant, int pw_op) {
  const int ab = ctx && ctx->terms;
  const qc_tensor *xt;
  double *dx;
  int rc;
  if ((rc = qc_module_need(m, "inputs", "x", 1, QC_MAXDIM, &xt))) return rc;
  if ((rc = qc_module_check_dy(m, dy, qc_numel(xt), xt->shape[xt->ndim - 1], "the shape of inputs/x"))) return rc;
  if ((rc = qc_refu_out_z(grads, "d_x", xt->ndim, xt->shape, 0, &dx))) return rc;
  const qc_pw pj = {.op = pw_op, .mode = ab ? 1 : (variant & QC_REFU_BF16) ? 2 : 0, .form = variant & 0xff};
  if (pw_op != QC_PW_PROBE && (rc = qc_ref_pw_dev(ctx ? ctx->be : NULL, pj, xt, NULL, dy, dx, NULL)) != QC_NA) return rc;
  double *X = qc_refu_load(xt, "reference x"), *G = qc_refu_load(dy, "reference dY");
  rc = QC_ESYS;
  if (X && G) {
    pw_job j = {X, G, dx, grad, variant, ab};
    qc_par_for(qc_numel(xt), (int64_t)1 << 14, pw_piece, &j);
    rc = QC_OK;
  }
  free(X); free(G);
  return rc;
}

int64_t qc_refu_row_grain(int64_t width) { return width > 0 && width < ((int64_t)1 << 14) ? ((int64_t)1 << 14) / width : 1; }


int qc_refu_hold(const qc_backend *be, qc_gemm_x *o, int64_t rows, int64_t cols, double *d) {
  if (!be->host_memory || (o->dt == QC_F64 && !o->flags) || o->ld != cols) return QC_OK;
  int rc = qc_gemm_x_widen_into(o, rows * cols, d); /* straight into d: no second copy */
  if (!rc) *o = (qc_gemm_x){d, QC_F64, cols, 0};
  return rc;
}

int qc_refu_gemm(const qc_backend *be, qc_op ta, qc_op tb, int64_t m, int64_t n, int64_t k, const double *A, const double *B,
                 double *C) {
  return be->gemm_f64(be, ta, tb, m, n, k, A, ta == QC_OP_N ? k : m, B, tb == QC_OP_N ? n : k, C, n);
}
