/* convrows.cu: backend.h conv_rows, the conv1d reference's sums on device
 * buffers (qc_conv_rows). reference/conv1d.c's conv_channels is the
 * definition: one thread an element of d_x, of d_weight or of d_bias adds
 * that element's terms in the order the host loop adds them (b, then t),
 * each product and sum rounded on its own (__dmul_rn, __dadd_rn: never
 * fused), so the values are the host's to the bit (tests/gpu/
 * test_gpu_conv1d.c compares them byte for byte). QC_CUDA_CONV_HOST=1
 * switches it off (QC_CONV_PROBE answers 1). */
#include <cuda_runtime.h>
#include <math.h>

#include "backend/cuda/cuda_priv.h"

#define CV_THREADS 256

__device__ static double cv_v(double v, int ab) { return ab ? fabs(v) : v; }

/* d_x[b, s, c]: the outputs t = s .. s + K - 1 that read x[b, s, c], in t's
 * order (the host's: its loop runs t ascending, tap k = s - t + K - 1). */
__global__ static void __launch_bounds__(CV_THREADS) cv_dx(qc_conv_rows j) {
  const int64_t L = j.L, C = j.C, K = j.K, n = j.B * L * C;
  for (int64_t i = (int64_t)blockIdx.x * CV_THREADS + threadIdx.x; i < n; i += (int64_t)gridDim.x * CV_THREADS) {
    const int64_t c = i % C, s = i / C % L, b = i / C / L;
    double acc = 0;
    for (int64_t t = s; t < L && t < s + K; t++)
      acc = __dadd_rn(acc, __dmul_rn(cv_v(j.W[c * K + (s - t + K - 1)], j.ab), cv_v(j.G[(b * L + t) * C + c], j.ab)));
    j.dx[i] = acc;
  }
}

/* d_weight[c, k] over b, then t (the host's order); thread k * C + c, so
 * that neighbours read neighbouring channels. */
__global__ static void __launch_bounds__(CV_THREADS) cv_dw(qc_conv_rows j) {
  const int64_t L = j.L, C = j.C, K = j.K, n = C * K;
  for (int64_t i = (int64_t)blockIdx.x * CV_THREADS + threadIdx.x; i < n; i += (int64_t)gridDim.x * CV_THREADS) {
    const int64_t c = i % C, k = i / C;
    double acc = 0;
    for (int64_t b = 0; b < j.B; b++)
      for (int64_t t = K - 1 - k; t < L; t++) {
        const int64_t s = t - (K - 1) + k;
        acc = __dadd_rn(acc, __dmul_rn(cv_v(j.G[(b * L + t) * C + c], j.ab), cv_v(j.X[(b * L + s) * C + c], j.ab)));
      }
    j.dw[c * K + k] = acc;
  }
}

/* d_bias[c] over b, then t. */
__global__ static void __launch_bounds__(CV_THREADS) cv_db(qc_conv_rows j) {
  const int64_t L = j.L, C = j.C;
  for (int64_t c = (int64_t)blockIdx.x * CV_THREADS + threadIdx.x; c < C; c += (int64_t)gridDim.x * CV_THREADS) {
    double acc = 0;
    for (int64_t r = 0; r < j.B * L; r++) acc = __dadd_rn(acc, cv_v(j.G[r * C + c], j.ab));
    j.db[c] = acc;
  }
}

static unsigned cv_grid(int64_t n) {
  const int64_t nb = (n + CV_THREADS - 1) / CV_THREADS;
  return (unsigned)(nb < 65536 ? (nb > 0 ? nb : 1) : 65536);
}

/* backend.h conv_rows. */
int cu_conv_rows(const qc_backend *be, const qc_conv_rows *j) {
  cu *c = C(be);
  int rc = QC_OK;
  if (j->op == QC_CONV_PROBE) return c->sw[CU_SW_CONV_HOST] ? 1 : QC_OK; /* 1: switched off, no error set */
  if (j->op != QC_CONV_VJP) return qc_err("conv_rows: op %d: expected QC_CONV_VJP", j->op);
  if (j->B <= 0 || j->L <= 0 || j->C <= 0) return QC_OK;
  if (j->K < 1) return qc_err("conv_rows: %lld taps: expected at least 1", (long long)j->K);
  cv_dx<<<cv_grid(j->B * j->L * j->C), CV_THREADS, 0, c->st>>>(*j);
  CK(cudaGetLastError(), "conv1d reference d_x kernel");
  cv_dw<<<cv_grid(j->C * j->K), CV_THREADS, 0, c->st>>>(*j);
  CK(cudaGetLastError(), "conv1d reference d_weight kernel");
  if (j->db) {
    cv_db<<<cv_grid(j->C), CV_THREADS, 0, c->st>>>(*j);
    CK(cudaGetLastError(), "conv1d reference d_bias kernel");
  }
done:
  return rc;
}
