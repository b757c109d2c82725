/* normrows.cu: backend.h norm_rows, the RMSNorm / LayerNorm reference's two
 * passes on device buffers (qc_norm_rows). The host loops of
 * reference/rmsnorm.c (norm_rows, norm_cols_piece) are the definition:
 * the rows pass computes the same expressions element by element, one
 * thread block a row, the row's sums (mean, sum of squares, <g, c>, sum g)
 * as a fixed-shape tree over the block's threads (deterministic; within a
 * few float64 ulps of the host's sequential sums); the columns pass is one
 * thread a feature summing over the rows in row order, as the host does.
 * QC_CUDA_NORM_HOST=1 switches them off (QC_NORM_PROBE answers 1). */
#include <cuda_runtime.h>
#include <math.h>

#include "backend/cuda/cuda_priv.h"

#define NR_THREADS 256

/* norm_rows: one block a row. */
__global__ static void __launch_bounds__(NR_THREADS) nr_rows(qc_norm_rows j) {
  __shared__ double sh[NR_THREADS];
  const int64_t r = blockIdx.x, n = j.n;
  const double *xr = j.X + r * n, *gr = j.G + r * n, *W = j.W;
  double mu = 0, ss = 0, gc = 0, gs = 0;
  if (j.centered) {
    for (int64_t i = threadIdx.x; i < n; i += NR_THREADS) mu += xr[i];
    mu = cu_block_reduce<NR_THREADS>(mu, 0, sh) / (double)n;
  }
  for (int64_t i = threadIdx.x; i < n; i += NR_THREADS) ss += (xr[i] - mu) * (xr[i] - mu);
  const double s2 = cu_block_reduce<NR_THREADS>(ss, 0, sh) / (double)n + j.eps, s = sqrt(s2);
  for (int64_t i = threadIdx.x; i < n; i += NR_THREADS) {
    const double g = gr[i] * W[i];
    gc += g * (xr[i] - mu);
    gs += g;
  }
  gc = cu_block_reduce<NR_THREADS>(gc, 0, sh);
  gs = cu_block_reduce<NR_THREADS>(gs, 0, sh);
  const double pm = j.centered ? gs / (double)n : 0.0;
  for (int64_t i = threadIdx.x; i < n; i += NR_THREADS) j.dx[r * n + i] = (gr[i] * W[i] - pm - (xr[i] - mu) * gc / ((double)n * s2)) / s;
  if (threadIdx.x == 0) {
    j.mu[r] = mu;
    j.s[r] = s;
  }
}

/* norm_cols_piece: one thread a feature, the rows in order. */
__global__ static void __launch_bounds__(NR_THREADS) nr_cols(qc_norm_rows j) {
  const int64_t i = (int64_t)blockIdx.x * NR_THREADS + threadIdx.x, n = j.n;
  if (i >= n) return;
  double dw = 0, db = 0;
  for (int64_t r = 0; r < j.rows; r++) {
    const double g = j.G[r * n + i];
    dw += g * (j.X[r * n + i] - j.mu[r]) / j.s[r];
    db += g;
  }
  j.dw[i] = dw;
  if (j.db) j.db[i] = db;
}

/* backend.h norm_rows. */
int cu_norm_rows(const qc_backend *be, const qc_norm_rows *j) {
  cu *c = C(be);
  int rc = QC_OK;
  if (j->op == QC_NORM_PROBE) return c->sw[CU_SW_NORM_HOST] ? 1 : QC_OK; /* 1: switched off, no error set */
  if (j->rows <= 0 || j->n <= 0) return QC_OK;
  if (j->rows > 0x7fffffff) return qc_err("norm_rows: %lld rows: at most 2^31 - 1 (one thread block a row)", (long long)j->rows);
  switch (j->op) {
    case QC_NORM_ROWS: nr_rows<<<(unsigned)j->rows, NR_THREADS, 0, c->st>>>(*j); break;
    case QC_NORM_COLS: nr_cols<<<(unsigned)((j->n + NR_THREADS - 1) / NR_THREADS), NR_THREADS, 0, c->st>>>(*j); break;
    default: return qc_err("norm_rows: op %d: expected one of QC_NORM_*", j->op);
  }
  CK(cudaGetLastError(), "norm reference kernel");
done:
  return rc;
}
