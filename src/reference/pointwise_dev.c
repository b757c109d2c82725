/* reference/pointwise_dev.c: the elementwise references of gelu and
 * swiglu (their host loops are the definition) on the backend's device
 * (be->pointwise, backend/cuda/pointwise.cu). The inputs go up as they are
 * stored and are widened there; the gradients come down in float64. Not
 * taken (QC_NA: the host loop runs) where the backend has no such pass or
 * host memory, where the probe says no (QC_CUDA_PW_HOST=1), for inputs
 * stored in another type than a float, or where the buffers would not fit
 * in 90% of the device's free memory or could not be allocated after
 * all. */
#include <stdint.h>

#include "backend/backend.h"
#include "core/qc.h"
#include "model/module.h"
#include "reference/ref_dev.h"

/* 1 when be's pointwise probe says the references run there. */
static int probe(const qc_backend *be) {
  if (!be || !be->pointwise) return 0;
  const qc_pw p = {.op = QC_PW_PROBE};
  qc_err_state es; /* a probe that fails is an answer: the host path */
  qc_err_save(&es);
  const int ok = be->pointwise(be, &p) == QC_OK;
  qc_err_restore(&es);
  return ok;
}

/* ref_dev.h. */
int qc_ref_pw_dev(const qc_backend *be, qc_pw j, const qc_tensor *x, const qc_tensor *u, const qc_tensor *dy, double *dx,
                  double *du) {
  const int64_t n = qc_numel(x);
  const size_t ob = (size_t)n * sizeof(double);
  const double bytes = qc_rdev_bytes(x) + qc_rdev_bytes(dy) + (u ? qc_rdev_bytes(u) + (double)ob : 0.0) + (double)ob;
  if (n <= 0 || !qc_rdev_float(x) || !qc_rdev_float(dy) || (u && !qc_rdev_float(u)) || !qc_rdev_usable(be, probe(be), bytes))
    return QC_NA;
  qc_rdev d;
  qc_rdev_begin(&d, be);
  double *X, *U = NULL, *G, *DX, *DU = NULL;
  int rc;
  if ((rc = qc_rdev_put(&d, x, "reference x", &X)) || (u && (rc = qc_rdev_put(&d, u, "reference up", &U))) ||
      (rc = qc_rdev_put(&d, dy, "reference dY", &G)) || (rc = qc_rdev_alloc(&d, ob, "reference d_x", (void **)&DX)) ||
      (u && (rc = qc_rdev_alloc(&d, ob, "reference d_up", (void **)&DU))))
    return qc_rdev_finish(&d, rc);
  j.n = n;
  j.x = X;
  j.u = U;
  j.dy = G;
  j.dx = DX;
  j.du = DU;
  if (!(rc = be->pointwise(be, &j)) && !(rc = be->download(be, dx, DX, ob)) && u) rc = be->download(be, du, DU, ob);
  return qc_rdev_finish(&d, rc);
}
