/* reference/logprob_dev.c: the logprob reference's rows (reference/
 * logprob.c's lp_row_piece is the definition) on the backend's device
 * (be->lp_rows, backend/cuda/lprows.cu). The logits go up as they are
 * stored (a bfloat16 [4096, 129280] is 1.1 GB, against 4.2 GB in
 * float64) and are widened there, with each row's loss weight times dY
 * and its token id (-1: not counted); d_logits comes down in float64. Not
 * taken (QC_NA: the host rows run) where the backend has no such pass or
 * host memory, for more rows than a grid holds (2^31 - 1), where the probe says no (QC_CUDA_LP_HOST=1), for logits
 * stored in another type than a float, or where the buffers would not fit
 * in 90% of the device's free memory or could not be allocated after
 * all. */
#include <stdint.h>

#include "backend/backend.h"
#include "core/qc.h"
#include "model/module.h"
#include "reference/ref_classes.h"
#include "reference/ref_dev.h"

/* 1 when be's lp_rows probe says the rows run there. */
static int probe(const qc_backend *be) {
  if (!be || !be->lp_rows) return 0;
  const qc_lp_rows p = {.op = QC_LP_PROBE};
  qc_err_state es; /* a probe that fails is an answer: the host path */
  qc_err_save(&es);
  const int ok = be->lp_rows(be, &p) == QC_OK;
  qc_err_restore(&es);
  return ok;
}

/* ref_classes.h. */
int qc_ref_lp_dev(const qc_backend *be, const qc_tensor *lt, const double *gw, const int64_t *id, int64_t K, double T, int ab,
                  double *dl) {
  const int64_t V = lt->shape[lt->ndim - 1], rows = V > 0 ? qc_numel(lt) / V : 0;
  const size_t zb = (size_t)(rows * V) * sizeof(double), rb = (size_t)rows * 8; /* rows of a double, or of an int64 */
  if (rows <= 0 || rows > INT32_MAX || V <= 0 || !qc_rdev_float(lt) || !qc_rdev_usable(be, probe(be), qc_rdev_bytes(lt) + (double)zb + 2.0 * (double)rb))
    return QC_NA;
  qc_rdev d;
  qc_rdev_begin(&d, be);
  qc_lp_rows j = {.op = QC_LP_ROWS, .ab = ab, .rows = rows, .V = V, .K = K, .T = T};
  double *Z, *G, *D;
  int64_t *I;
  int rc;
  if ((rc = qc_rdev_put(&d, lt, "reference logits", &Z)) || (rc = qc_rdev_alloc(&d, rb, "reference logprob weights", (void **)&G)) ||
      (rc = qc_rdev_alloc(&d, rb, "reference logprob ids", (void **)&I)) ||
      (rc = qc_rdev_alloc(&d, zb, "reference d_logits", (void **)&D)) || (rc = be->upload(be, G, gw, rb)) ||
      (rc = be->upload(be, I, id, rb)))
    return qc_rdev_finish(&d, rc);
  j.Z = Z;
  j.gw = G;
  j.id = I;
  j.dl = D;
  if (!(rc = be->lp_rows(be, &j))) rc = be->download(be, dl, D, zb);
  return qc_rdev_finish(&d, rc);
}
