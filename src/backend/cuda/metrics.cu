/* metrics.cu: the fused deterministic metrics pass (kernels/metrics.cu),
 * its queued results, and sync. */
#include <cublasLt.h>
#include <cublas_v2.h>
#include <cuda_runtime.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend/cuda/cuda_priv.h"

void cu_metrics_fill(const qk_msum *s, qc_metrics *m) {
  memset(m, 0, sizeof *m);
  m->nonfinite = s->bad;
  m->max_abs = s->mx < 0 ? 0 : s->mx;
  m->worst = s->idx;
  m->noise_multiple = NAN;
  m->e_par = m->bias_sd = m->bias_allow = m->bias_z_raw = m->bias_z = NAN; /* qc_bias_finish fills them */
  qc_metrics_finish(s->sg, s->sr, s->sd, s->dt, m);
  m->noise_floor = sqrt(s->snf) / fmax(m->norm_r, QC_EPS_NORM);
}

/* The metrics pass on device data, result downloaded into *out (syncs). */
int cu_metrics_dev(cu *c, const void *g, int g_kind, const double *r, int64_t n, int slot, qc_metrics *out) {
  int rc = QC_OK;
  qk_msum s;
  CK((cudaError_t)qk_metrics(g, g_kind, r, n, c->mscratch, c->mres + slot, c->st), "metrics kernel");
  if (out) {
    CK(cudaMemcpyAsync(&s, c->mres + slot, sizeof s, cudaMemcpyDeviceToHost, c->st), "download metrics");
    CK(cudaStreamSynchronize(c->st), "metrics kernel");
    cu_metrics_fill(&s, out);
  }
done:
  return rc;
}

/* backend.h metrics: host g and r (float64) through the fused kernel. */
int cu_metrics(const qc_backend *be, const double *g, const double *r, int64_t n, qc_metrics *out) {
  cu *c = C(be);
  int rc = QC_OK;
  void *dg = NULL, *dr = NULL;
  if ((rc = cu_dalloc(c, (size_t)n * 8, "metrics candidate", &dg)) || (rc = cu_dalloc(c, (size_t)n * 8, "metrics reference", &dr)))
    goto done;
  CK(cudaMemcpyAsync(dg, g, (size_t)n * 8, cudaMemcpyHostToDevice, c->st), "upload candidate");
  CK(cudaMemcpyAsync(dr, r, (size_t)n * 8, cudaMemcpyHostToDevice, c->st), "upload reference");
  rc = cu_metrics_dev(c, dg, 0, (const double *)dr, n, 0, out);
  out->noise_floor = NAN; /* as qc_metrics_compute: the caller computes it for its dtype */
done:
  rc = cu_keep(c, rc, cudaFree(dg), "cudaFree");
  rc = cu_keep(c, rc, cudaFree(dr), "cudaFree");
  return rc;
}


/* Fill n queued metrics from their sums (the noise floor as qc_metrics_compute
 * leaves it: the caller computes it for its dtype). */
static void fill_pending(const qk_msum *s, qc_metrics *const *dst, int n) {
  for (int i = 0; i < n; i++) {
    cu_metrics_fill(&s[i], dst[i]);
    dst[i]->noise_floor = NAN;
  }
}

/* backend.h sync: the whole stream; the metrics pending since the last
 * fence and those of every fence not yet waited for are filled; a failed
 * buf_free / host_free since the last sync is reported here. */
int cu_sync(const qc_backend *be) {
  cu *c = C(be);
  int rc = QC_OK;
  qk_msum s[PEND];
  if (c->npend) CK(cudaMemcpyAsync(s, c->mres + 2, (size_t)c->npend * sizeof *s, cudaMemcpyDeviceToHost, c->st), "download metrics");
  CK(cudaStreamSynchronize(c->st), "queued device work");
  fill_pending(s, c->pend, c->npend);
  for (int k = 0; k < QC_FENCES; k++)
    if (c->fence[k].armed) fill_pending(c->fence[k].hres, c->fence[k].dst, c->fence[k].n);
done:
  c->npend = 0;
  for (int k = 0; k < QC_FENCES; k++) c->fence[k].armed = c->fence[k].recorded = c->fence[k].n = 0;
  if (!rc) rc = c->rel_rc; /* a buffer release that failed since the last sync */
  c->rel_rc = QC_OK;
  return rc;
}

/* backend.h metrics_buf: the fused pass queued; its sums stay in mres
 * [2 + npend] until sync or a fence downloads them (in stream order, so the
 * next unit's passes may reuse the slot). */
int cu_metrics_buf(const qc_backend *be, const double *g, const double *r, int64_t n, qc_metrics *out) {
  cu *c = C(be);
  int rc = QC_OK;
  if (c->npend == PEND && (rc = cu_sync(be))) return rc;
  CK((cudaError_t)qk_metrics(g, 0, r, n, c->mscratch, c->mres + 2 + c->npend, c->st), "metrics kernel");
  c->pend[c->npend++] = out;
done:
  return rc;
}

/* backend.h fence: the pending metrics' sums downloaded into fence k's
 * pinned buffer behind the ops queued so far, then its event recorded. */
int cu_fence(const qc_backend *be, int k) {
  cu *c = C(be);
  int rc = QC_OK;
  if (k < 0 || k >= QC_FENCES) return qc_err_sys("%s: fence %d out of range 0 to %d", c->name, k, QC_FENCES - 1);
  struct cu::cu_fence *f = &c->fence[k];
  if (f->armed) return qc_err_sys("%s: fence %d set again before it was waited for", c->name, k);
  if (c->npend)
    CK(cudaMemcpyAsync(f->hres, c->mres + 2, (size_t)c->npend * sizeof *f->hres, cudaMemcpyDeviceToHost, c->st),
       "download metrics");
  memcpy(f->dst, c->pend, (size_t)c->npend * sizeof *f->dst);
  f->n = c->npend;
  c->npend = 0;
  f->armed = 1; /* from here on its results are the fence's, whatever comes next */
  CK(cudaEventRecord(f->ev, c->st), "record a fence");
  f->recorded = 1;
done:
  return rc;
}

/* backend.h wait_fence: fence k's ops done (the ops queued after it may
 * still run); its metrics filled. */
int cu_wait_fence(const qc_backend *be, int k) {
  cu *c = C(be);
  int rc = QC_OK;
  if (k < 0 || k >= QC_FENCES) return qc_err_sys("%s: fence %d out of range 0 to %d", c->name, k, QC_FENCES - 1);
  struct cu::cu_fence *f = &c->fence[k];
  if (!f->armed) return QC_OK; /* a sync came between and filled them */
  if (f->recorded) CK(cudaEventSynchronize(f->ev), "queued device work");
  else CK(cudaStreamSynchronize(c->st), "queued device work");
  fill_pending(f->hres, f->dst, f->n);
done:
  f->armed = f->recorded = f->n = 0;
  return rc;
}
