/* ref_dev.h: device buffers for a reference whose passes run on the
 * backend's device (reference/norm_dev.c, reference/pointwise_dev.c,
 * reference/rope_dev.c, reference/conv1d_dev.c): the buffers a pass needs, a tensor uploaded as
 * stored and widened there, and one wait-and-free at the end. */
#ifndef QC_REF_DEV_H
#define QC_REF_DEV_H

#include <stddef.h>

#include "backend/backend.h"
#include "core/qc.h"
#include "core/tensor.h"

#define QC_RDEV_BUFS 16

typedef struct qc_rdev {
  const qc_backend *be;
  void *p[QC_RDEV_BUFS];
  int n;
  int short_of_memory;  /* a buffer could not be allocated */
  qc_err_state es;      /* the error state at qc_rdev_begin */
} qc_rdev;

/* Start d on be, saving the error state for qc_rdev_finish. */
void qc_rdev_begin(qc_rdev *d, const qc_backend *be);
/* 1 when t's values go up as stored (float64, float32, float16, bfloat16):
 * the device paths take no other dtype (the host loops read them). */
int qc_rdev_float(const qc_tensor *t);

/* 1 when be has device buffers (not host memory), its widening, a sync,
 * and `bytes` fit in 90% of its free memory; probe_ok: the pass's own
 * probe said yes. A memory query that fails is an answer (no: the host
 * path), its error not kept. */
int qc_rdev_usable(const qc_backend *be, int probe_ok, double bytes);
/* A device buffer of `bytes` in d, freed by qc_rdev_finish. */
int qc_rdev_alloc(qc_rdev *d, size_t bytes, const char *what, void **out);
/* A device float64 copy of t's values [numel] in d: uploaded as stored
 * and widened on the device (qc_rdev_float's dtypes only). */
int qc_rdev_put(qc_rdev *d, const qc_tensor *t, const char *what, double **out);
/* Wait for d's queued work (when rc is set the wait's own error is not
 * kept: rc's message stays the one), free d's buffers; returns rc, or the
 * wait's status when rc is QC_OK; QC_NA, the error state as it was at
 * qc_rdev_begin, when a buffer could not be allocated (the device was
 * shorter of memory than its free memory said: the host loops run). */
int qc_rdev_finish(qc_rdev *d, int rc);
/* The device buffers of a tensor qc_rdev_put uploads: its float64 copy and
 * its stored bytes (for the fit). */
double qc_rdev_bytes(const qc_tensor *t);

/* An elementwise reference j (backend.h qc_pw: op, mode, form, limit,
 * pass; its buffers filled here) on be's device (reference/
 * pointwise_dev.c): x (gate for swiglu), u (up, or NULL) and dy as
 * stored; dx [numel x] and du (or NULL) into the host's arrays. QC_OK;
 * QC_NA (no error set) where the device path is not taken: the caller runs
 * its host loop; or an error. */
int qc_ref_pw_dev(const qc_backend *be, qc_pw j, const qc_tensor *x, const qc_tensor *u, const qc_tensor *dy, double *dx,
                  double *du);

/* The RoPE reference's rotation j (backend.h qc_rope_rows: its settings;
 * its buffers filled here) of v [T, H, D] as stored, with positions p [T]
 * and the frequency table f [R/2] (or NULL: theta's), on be's device
 * (reference/rope_dev.c) into out [T, H, D] on the host. QC_OK; QC_NA (no
 * error set) where the device path is not taken: the caller runs its host
 * rows; or an error. */
int qc_ref_rope_dev(const qc_backend *be, qc_rope_rows j, const qc_tensor *v, const int64_t *p, const double *f, double *out);

/* The conv1d reference's sums j (backend.h qc_conv_rows: B, L, C, K, ab;
 * its buffers filled here) of x [B, L, C], w [C, K] (or [C, 1, K]) and dy
 * [B, L, C] as stored, on be's device (reference/conv1d_dev.c), into dx,
 * dw and db (or NULL: no bias) on the host. QC_OK; QC_NA (no error set)
 * where the device path is not taken: the caller runs its host loop; or
 * an error. */
int qc_ref_conv_dev(const qc_backend *be, qc_conv_rows j, const qc_tensor *x, const qc_tensor *w, const qc_tensor *dy, double *dx,
                    double *dw, double *db);

#endif
