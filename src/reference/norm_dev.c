/* reference/norm_dev.c: the RMSNorm / LayerNorm reference (reference/
 * rmsnorm.c, whose host loops are the definition) with its two passes on
 * the backend's device (be->norm_rows, backend/cuda/normrows.cu).
 *
 * x and dY go up as they are stored (a bfloat16 [4096, 7168] is 59 MB,
 * against 235 MB in float64) and are widened there; the scale W goes up
 * as the host made it (1 + w for zero_centered). The rows pass leaves each
 * row's mean and s on the device for the columns pass; d_x, d_weight and
 * d_bias come down in float64. Not taken (QC_NA: the host loops run) where
 * the backend has no such passes or host memory, where the probe says no
 * (QC_CUDA_NORM_HOST=1), for more rows than a grid holds (2^31 - 1), for
 * x or dY stored in another type than a float,
 * or where the buffers would not fit in 90% of the device's free memory
 * or could not be allocated after all. */
#include <stdint.h>

#include "backend/backend.h"
#include "core/qc.h"
#include "model/module.h"
#include "reference/ref_classes.h"
#include "reference/ref_dev.h"

/* 1 when be's norm_rows probe says the passes run there. */
static int probe(const qc_backend *be) {
  if (!be || !be->norm_rows) return 0;
  const qc_norm_rows p = {.op = QC_NORM_PROBE};
  qc_err_state es; /* a probe that fails is an answer: the host path */
  qc_err_save(&es);
  const int ok = be->norm_rows(be, &p) == QC_OK;
  qc_err_restore(&es);
  return ok;
}

/* ref_classes.h. */
int qc_ref_norm_dev(const qc_backend *be, const qc_tensor *xt, const qc_tensor *dy, const double *W, int centered, double eps,
                    double *dx, double *dw, double *db) {
  const int64_t n = xt->shape[xt->ndim - 1], rows = n > 0 ? qc_numel(xt) / n : 0;
  const size_t xb = (size_t)(rows * n) * sizeof(double), wb = (size_t)n * sizeof(double);
  if (rows <= 0 || rows > INT32_MAX || n <= 0 || !qc_rdev_float(xt) || !qc_rdev_float(dy) ||
      !qc_rdev_usable(be, probe(be), qc_rdev_bytes(xt) + qc_rdev_bytes(dy) + (double)xb + 8.0 * (2.0 * (double)rows + 3.0 * (double)n)))
    return QC_NA;
  qc_rdev d;
  qc_rdev_begin(&d, be);
  qc_norm_rows j = {.rows = rows, .n = n, .centered = centered, .eps = eps};
  double *X, *G, *Wd, *st, *ddx, *ddw, *ddb = NULL;
  int rc;
  if ((rc = qc_rdev_put(&d, xt, "reference norm x", &X)) || (rc = qc_rdev_put(&d, dy, "reference norm dY", &G)) ||
      (rc = qc_rdev_alloc(&d, wb, "reference norm weight", (void **)&Wd)) || (rc = be->upload(be, Wd, W, wb)) ||
      (rc = qc_rdev_alloc(&d, (size_t)(2 * rows) * sizeof(double), "reference norm rows", (void **)&st)) ||
      (rc = qc_rdev_alloc(&d, xb, "reference norm d_x", (void **)&ddx)) ||
      (rc = qc_rdev_alloc(&d, wb, "reference norm d_weight", (void **)&ddw)) ||
      (db && (rc = qc_rdev_alloc(&d, wb, "reference norm d_bias", (void **)&ddb))))
    return qc_rdev_finish(&d, rc);
  j.X = X;
  j.G = G;
  j.W = Wd;
  j.mu = st;
  j.s = st + rows;
  j.dx = ddx;
  j.dw = ddw;
  j.db = ddb;
  j.op = QC_NORM_ROWS;
  if ((rc = be->norm_rows(be, &j))) return qc_rdev_finish(&d, rc);
  j.op = QC_NORM_COLS;
  if (!(rc = be->norm_rows(be, &j)) && !(rc = be->download(be, dx, ddx, xb)) && !(rc = be->download(be, dw, ddw, wb)) && db)
    rc = be->download(be, db, ddb, wb);
  return qc_rdev_finish(&d, rc);
}
