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
  cudaFree(dg);
  cudaFree(dr);
  return rc;
}


int cu_sync(const qc_backend *be) {
  cu *c = C(be);
  int rc = QC_OK;
  qk_msum s[PEND];
  if (c->npend) CK(cudaMemcpyAsync(s, c->mres + 2, (size_t)c->npend * sizeof *s, cudaMemcpyDeviceToHost, c->st), "download metrics");
  CK(cudaStreamSynchronize(c->st), "queued device work");
  for (int i = 0; i < c->npend; i++) {
    cu_metrics_fill(&s[i], c->pend[i]);
    c->pend[i]->noise_floor = NAN; /* as qc_metrics_compute: the caller computes it for its dtype */
  }
done:
  c->npend = 0;
  return rc;
}

int cu_metrics_buf(const qc_backend *be, const double *g, const double *r, int64_t n, qc_metrics *out) {
  cu *c = C(be);
  int rc = QC_OK;
  if (c->npend == PEND && (rc = cu_sync(be))) return rc;
  CK((cudaError_t)qk_metrics(g, 0, r, n, c->mscratch, c->mres + 2 + c->npend, c->st), "metrics kernel");
  c->pend[c->npend++] = out;
done:
  return rc;
}
