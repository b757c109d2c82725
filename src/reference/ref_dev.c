/* ref_dev.c: see ref_dev.h. */
#include "reference/ref_dev.h"

#include <string.h>

#include "core/qc.h"
#include "model/module.h"

int qc_rdev_usable(const qc_backend *be, int probe_ok, double bytes) {
  if (!be || !probe_ok || be->host_memory || !be->buf_alloc || !be->buf_free || !be->upload || !be->download ||
      !be->to_f64 || !be->sync)
    return 0;
  if (!be->mem_free) return 1;
  qc_err_state es;
  qc_err_save(&es);
  size_t fr = 0;
  const int ok = be->mem_free(be, &fr) == QC_OK && bytes < 0.9 * (double)fr;
  qc_err_restore(&es);
  return ok;
}

void qc_rdev_begin(qc_rdev *d, const qc_backend *be) {
  memset(d, 0, sizeof *d);
  d->be = be;
  qc_err_save(&d->es);
}

int qc_rdev_float(const qc_tensor *t) {
  return t->dtype == QC_F64 || t->dtype == QC_F32 || t->dtype == QC_F16 || t->dtype == QC_BF16;
}

int qc_rdev_alloc(qc_rdev *d, size_t bytes, const char *what, void **out) {
  if (d->n >= QC_RDEV_BUFS) return qc_err("%s: more than %d device buffers", what, QC_RDEV_BUFS);
  int rc = d->be->buf_alloc(d->be, bytes ? bytes : 1, what, out);
  if (!rc) d->p[d->n++] = *out;
  else d->short_of_memory = 1;
  return rc;
}

int qc_rdev_put(qc_rdev *d, const qc_tensor *t, const char *what, double **out) {
  const qc_backend *be = d->be;
  const int64_t n = qc_numel(t);
  int rc;
  void *raw;
  if ((rc = qc_rdev_alloc(d, (size_t)n * sizeof(double), what, (void **)out))) return rc;
  if (n <= 0) return QC_OK;
  if (!qc_rdev_float(t)) return qc_err("%s: element type %s does not go up as stored", what, qc_dtype_name(t->dtype));
  if (t->dtype == QC_F64) return be->upload(be, *out, t->data, (size_t)n * sizeof(double));
  if ((rc = qc_rdev_alloc(d, t->nbytes, what, &raw)) || (rc = be->upload(be, raw, t->data, t->nbytes))) return rc;
  return be->to_f64(be, t->dtype, raw, n, *out);
}

int qc_rdev_finish(qc_rdev *d, int rc) {
  if (rc) {
    qc_err_state es;
    qc_err_save(&es);
    (void)d->be->sync(d->be);
    qc_err_restore(&es);
  } else {
    rc = d->be->sync(d->be);
  }
  for (int i = 0; i < d->n; i++) d->be->buf_free(d->be, d->p[i]);
  d->n = 0;
  if (rc && d->short_of_memory) {
    qc_err_restore(&d->es);
    return QC_NA;
  }
  return rc;
}

double qc_rdev_bytes(const qc_tensor *t) { return 8.0 * (double)qc_numel(t) + (t->dtype == QC_F64 ? 0.0 : (double)t->nbytes); }
