/* lprows.cu: backend.h lp_rows, the logprob reference's rows on device
 * buffers (qc_lp_rows). reference/logprob.c's lp_row_piece is the
 * definition: one thread block a row computes the same expressions, each
 * shard's max and sum of exp as a fixed-shape tree over the block's
 * threads (deterministic; within a few float64 ulps of the host's
 * sequential sums), the shards folded in order as the host folds them.
 * QC_CUDA_LP_HOST=1 switches them off (QC_LP_PROBE answers 1). */
#include <cuda_runtime.h>
#include <math.h>

#include "backend/cuda/cuda_priv.h"

#define LP_THREADS 256

/* lp_row_piece: one block a row. */
__global__ static void __launch_bounds__(LP_THREADS) lp_row(qc_lp_rows j) {
  __shared__ double sh[LP_THREADS];
  const int64_t r = blockIdx.x, V = j.V, P = j.V / j.K, id = j.id[r];
  const double *z = j.Z + r * V, gw = j.gw[r], T = j.T;
  double *dl = j.dl + r * V;
  if (id < 0) { /* not counted: the host leaves the row zero */
    for (int64_t v = threadIdx.x; v < V; v += LP_THREADS) dl[v] = 0;
    return;
  }
  double lse = -INFINITY;
  for (int64_t k = 0; k < j.K; k++) {
    double mk = -INFINITY, sk = 0;
    for (int64_t v = k * P + threadIdx.x; v < (k + 1) * P; v += LP_THREADS) mk = fmax(mk, z[v] / T);
    mk = cu_block_reduce<LP_THREADS>(mk, 1, sh);
    for (int64_t v = k * P + threadIdx.x; v < (k + 1) * P; v += LP_THREADS) sk += exp(z[v] / T - mk);
    sk = cu_block_reduce<LP_THREADS>(sk, 0, sh);
    const double lk = mk + log(sk), hi = fmax(lse, lk);
    lse = hi + log(exp(lse - hi) + exp(lk - hi));
  }
  for (int64_t v = threadIdx.x; v < V; v += LP_THREADS)
    dl[v] = j.ab ? fabs(gw) * ((v == id) + exp(z[v] / T - lse) * (1 + fabs(z[v] / T) + fabs(lse))) / T
                 : gw * ((v == id) - exp(z[v] / T - lse)) / T;
}

/* backend.h lp_rows. */
int cu_lp_rows(const qc_backend *be, const qc_lp_rows *j) {
  cu *c = C(be);
  int rc = QC_OK;
  if (j->op == QC_LP_PROBE) return c->sw[CU_SW_LP_HOST] ? 1 : QC_OK; /* 1: switched off, no error set */
  if (j->op != QC_LP_ROWS) return qc_err("lp_rows: op %d: expected QC_LP_ROWS", j->op);
  if (j->rows <= 0 || j->V <= 0) return QC_OK;
  if (j->K < 1 || j->V % j->K || !(j->T > 0) || j->rows > 0x7fffffff)
    return qc_err("lp_rows: %lld rows of vocab %lld in %lld shards at temperature %g: expected shards dividing the vocab, "
                  "a positive temperature and at most 2^31 - 1 rows", (long long)j->rows, (long long)j->V, (long long)j->K, j->T);
  lp_row<<<(unsigned)j->rows, LP_THREADS, 0, c->st>>>(*j);
  CK(cudaGetLastError(), "logprob reference row kernel");
done:
  return rc;
}
