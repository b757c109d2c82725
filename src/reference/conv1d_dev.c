/* reference/conv1d_dev.c: the conv1d reference's sums (reference/
 * conv1d.c's conv_channels is the definition) on the backend's device
 * (be->conv_rows, backend/cuda/convrows.cu). x, the weight and dY go up
 * as they are stored and are widened there; d_x, d_weight and d_bias come
 * down in float64, the host's values to the bit. Not taken (QC_NA: the
 * host loop runs) where the backend has no such pass or host memory,
 * where the probe says no (QC_CUDA_CONV_HOST=1), for tensors stored in
 * another type than a float, or where the buffers would not fit in 90% of
 * the device's free memory or could not be allocated after all. */
#include <stdint.h>

#include "backend/backend.h"
#include "core/qc.h"
#include "model/module.h"
#include "reference/ref_dev.h"

/* 1 when be's conv_rows probe says the sums run there. */
static int probe(const qc_backend *be) {
  if (!be || !be->conv_rows) return 0;
  const qc_conv_rows p = {.op = QC_CONV_PROBE};
  qc_err_state es; /* a probe that fails is an answer: the host path */
  qc_err_save(&es);
  const int ok = be->conv_rows(be, &p) == QC_OK;
  qc_err_restore(&es);
  return ok;
}

/* ref_dev.h. */
int qc_ref_conv_dev(const qc_backend *be, qc_conv_rows j, const qc_tensor *x, const qc_tensor *w, const qc_tensor *dy, double *dx,
                    double *dw, double *db) {
  const int64_t n = j.B * j.L * j.C;
  const size_t xb = (size_t)n * sizeof(double), wb = (size_t)(j.C * j.K) * sizeof(double), bb = (size_t)j.C * sizeof(double);
  const double bytes = qc_rdev_bytes(x) + qc_rdev_bytes(w) + qc_rdev_bytes(dy) + (double)xb + (double)wb + (db ? (double)bb : 0.0);
  if (n <= 0 || qc_numel(x) != n || qc_numel(dy) != n || qc_numel(w) != j.C * j.K || !qc_rdev_float(x) || !qc_rdev_float(w) ||
      !qc_rdev_float(dy) || !qc_rdev_usable(be, probe(be), bytes))
    return QC_NA;
  qc_rdev d;
  qc_rdev_begin(&d, be);
  double *X, *W, *G, *DX, *DW, *DB = NULL;
  int rc;
  if ((rc = qc_rdev_put(&d, x, "reference conv1d x", &X)) || (rc = qc_rdev_put(&d, w, "reference conv1d weight", &W)) ||
      (rc = qc_rdev_put(&d, dy, "reference conv1d dY", &G)) || (rc = qc_rdev_alloc(&d, xb, "reference d_x", (void **)&DX)) ||
      (rc = qc_rdev_alloc(&d, wb, "reference d_weight", (void **)&DW)) ||
      (db && (rc = qc_rdev_alloc(&d, bb, "reference d_bias", (void **)&DB))))
    return qc_rdev_finish(&d, rc);
  j.op = QC_CONV_VJP;
  j.X = X;
  j.W = W;
  j.G = G;
  j.dx = DX;
  j.dw = DW;
  j.db = DB;
  if (!(rc = be->conv_rows(be, &j)) && !(rc = be->download(be, dx, DX, xb)) && !(rc = be->download(be, dw, DW, wb)) && db)
    rc = be->download(be, db, DB, bb);
  return qc_rdev_finish(&d, rc);
}
