/* reference/rope_dev.c: the RoPE reference's rotation (reference/rope.c's
 * rope_rows is the definition) on the backend's device (be->rope_rows,
 * backend/cuda/roperows.cu). The tensor goes up as it is stored and is
 * widened there, with the positions and the frequency table; the result
 * comes down in float64. Not taken (QC_NA: the host rows run) where the
 * backend has no such pass or host memory, where the probe says no
 * (QC_CUDA_ROPE_HOST=1), for a tensor stored in another type than a
 * float, or where the buffers would not fit in 90% of the device's free
 * memory or could not be allocated after all. */
#include <stdint.h>

#include "backend/backend.h"
#include "core/qc.h"
#include "model/module.h"
#include "reference/ref_dev.h"

/* 1 when be's rope_rows probe says the rotation runs there. */
static int probe(const qc_backend *be) {
  if (!be || !be->rope_rows) return 0;
  const qc_rope_rows p = {.op = QC_ROPE_PROBE};
  qc_err_state es; /* a probe that fails is an answer: the host path */
  qc_err_save(&es);
  const int ok = be->rope_rows(be, &p) == QC_OK;
  qc_err_restore(&es);
  return ok;
}

/* ref_dev.h. */
int qc_ref_rope_dev(const qc_backend *be, qc_rope_rows j, const qc_tensor *v, const int64_t *p, const double *f, double *out) {
  const int64_t n = qc_numel(v);
  const size_t ob = (size_t)n * sizeof(double), pb = (size_t)j.T * sizeof(int64_t), fb = (size_t)(j.R / 2) * sizeof(double);
  if (n <= 0 || n != j.T * j.H * j.D || !qc_rdev_float(v) ||
      !qc_rdev_usable(be, probe(be), qc_rdev_bytes(v) + (double)ob + (double)pb + (f ? (double)fb : 0.0)))
    return QC_NA;
  qc_rdev d;
  qc_rdev_begin(&d, be);
  double *V, *O, *Fd = NULL;
  int64_t *P;
  int rc;
  if ((rc = qc_rdev_put(&d, v, "reference rope input", &V)) || (rc = qc_rdev_alloc(&d, pb, "reference rope positions", (void **)&P)) ||
      (f && (rc = qc_rdev_alloc(&d, fb, "reference rope inv_freq", (void **)&Fd))) ||
      (rc = qc_rdev_alloc(&d, ob, "reference rope output", (void **)&O)) || (rc = be->upload(be, P, p, pb)) ||
      (f && (rc = be->upload(be, Fd, f, fb))))
    return qc_rdev_finish(&d, rc);
  j.op = QC_ROPE_ROWS;
  j.v = V;
  j.p = P;
  j.f = Fd;
  j.out = O;
  if (!(rc = be->rope_rows(be, &j))) rc = be->download(be, out, O, ob);
  return qc_rdev_finish(&d, rc);
}
