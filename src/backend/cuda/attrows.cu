/* attrows.cu: backend.h att_rows, the attention reference's row passes on
 * device buffers (qc_att_rows). The host loops of reference/attention_gemm.c
 * (vjp_rows1, vjp_rows2, fwd_rows, fwd_norm) are the definition; these
 * kernels compute the same expressions element by element, one thread
 * block a row, and the row's sums (max, z, pd, pda) as a fixed-shape tree
 * over the block's threads: deterministic, and within a few float64 ulps
 * of the host's sequential sums (tests/gpu/test_gpu_attention.c compares
 * the two references). QC_CUDA_ATT_HOST=1 switches them off (QC_ATT_PROBE
 * answers 1): the reference's rows run on the host, its GEMMs staged. */
#include <cuda_runtime.h>
#include <math.h>

#include "backend/cuda/cuda_priv.h"

#define AR_THREADS 256

/* The keys [*lo, *hi) of block row r, relative to jlo and clipped to nk: 1
 * when it sees any (attention_gemm.c's keys_of and row_keys). */
__device__ static int ar_keys(const qc_att_rows &j, int64_t r, int64_t *lo, int64_t *hi) {
  const int64_t i = j.i0 + r;
  int64_t n = j.causal ? i + 1 + j.off : j.S;
  if (n > j.S) n = j.S;
  *lo = (j.W > 0 && i - j.W + 1 > 0 ? i - j.W + 1 : 0) - j.jlo;
  *hi = n - j.jlo;
  if (*hi > j.nk) *hi = j.nk;
  return *hi > *lo && *hi > 0;
}

/* x [0, lo) and [hi, n) set to 0 (all of it when hi <= lo), by the block. */
__device__ static void ar_zero_out(double *x, int64_t lo, int64_t hi, int64_t n) {
  if (hi <= lo) lo = hi = n;
  for (int64_t k = threadIdx.x; k < n; k += blockDim.x)
    if (k < lo || k >= hi) x[k] = 0;
}

/* vjp_rows1: one block a row. */
__global__ static void __launch_bounds__(AR_THREADS) ar_vjp1(qc_att_rows j) {
  __shared__ double sh[AR_THREADS];
  const int64_t r = blockIdx.x, nk = j.nk;
  double *R = j.M1 + r * nk, *dP = j.M2 + r * nk, *P = j.M3 + r * nk;
  double *Wt = j.ab ? j.M4 + r * nk : NULL, *Pa = j.ab ? j.M5 + r * nk : NULL;
  int64_t lo, hi;
  const int vis = ar_keys(j, r, &lo, &hi);
  ar_zero_out(R, lo, hi, nk);
  ar_zero_out(P, lo, hi, nk);
  if (Wt) ar_zero_out(Wt, lo, hi, nk);
  if (!vis) {
    if (threadIdx.x == 0) j.z[r] = 0;
    return;
  }
  double mx = -INFINITY;
  for (int64_t k = lo + threadIdx.x; k < hi; k += blockDim.x) {
    const double x = R[k] * j.sc;
    if (j.cap > 0) {
      const double th = tanh(x / j.cap);
      P[k] = j.cap * th;
      R[k] = 1 - th * th;
    } else {
      P[k] = x;
      R[k] = 1;
    }
    mx = fmax(mx, P[k]);
  }
  mx = cu_block_reduce<AR_THREADS>(mx, 1, sh);
  double z = 0;
  for (int64_t k = lo + threadIdx.x; k < hi; k += blockDim.x) z += (P[k] = exp(P[k] - mx));
  z = cu_block_reduce<AR_THREADS>(z, 0, sh);
  double pd = 0, pda = 0;
  for (int64_t k = lo + threadIdx.x; k < hi; k += blockDim.x) {
    P[k] /= z;
    pd += P[k] * dP[k];
    if (Wt) {
      Wt[k] = 1 + j.sc * Wt[k] + fabs(mx);
      pda += P[k] * Pa[k];
    }
  }
  pd = cu_block_reduce<AR_THREADS>(pd, 0, sh);
  if (Wt) pda = cu_block_reduce<AR_THREADS>(pda, 0, sh);
  if (threadIdx.x == 0) {
    j.z[r] = z;
    j.pd[r] = pd;
    j.pda[r] = pda;
  }
}

/* vjp_rows2 (Delta from P and dP: the reference keeps the rounded-O path on the host). */
__global__ static void __launch_bounds__(AR_THREADS) ar_vjp2(qc_att_rows j) {
  const int64_t r = blockIdx.x, nk = j.nk;
  int64_t lo, hi;
  if (!j.z[r] || !ar_keys(j, r, &lo, &hi)) return;
  double *R = j.M1 + r * nk, *dP = j.M2 + r * nk, *P = j.M3 + r * nk;
  const double pd = j.pd[r], pda = j.pda[r];
  if (j.ab) {
    double *Wt = j.M4 + r * nk, *Pa = j.M5 + r * nk;
    for (int64_t k = lo + threadIdx.x; k < hi; k += blockDim.x) {
      R[k] = j.sc * (P[k] * (Pa[k] + pda + Wt[k] * fabs(dP[k] - pd)) * fabs(R[k]));
      Wt[k] = P[k] * Wt[k];
    }
  } else
    for (int64_t k = lo + threadIdx.x; k < hi; k += blockDim.x) R[k] = j.sc * (P[k] * (dP[k] - pd) * R[k]);
}

/* fwd_rows. */
__global__ static void __launch_bounds__(AR_THREADS) ar_fwd(qc_att_rows j) {
  __shared__ double sh[AR_THREADS];
  const int64_t r = blockIdx.x, nk = j.nk;
  double *P = j.M1 + r * nk;
  int64_t lo, hi;
  const int vis = nk > 0 && ar_keys(j, r, &lo, &hi);
  if (!j.lse && nk > 0) ar_zero_out(P, vis ? lo : 0, vis ? hi : 0, nk);
  if (!vis) { /* no visible key: O_i = 0, no LSE */
    if (threadIdx.x == 0) {
      j.z[r] = 1;
      if (j.lse) {
        j.out[j.i0 + r] = -INFINITY;
        j.t[j.i0 + r] = 0;
      }
    }
    return;
  }
  double mx = -INFINITY, amax = 0;
  for (int64_t k = lo + threadIdx.x; k < hi; k += blockDim.x) {
    const double s = P[k] * j.sc;
    P[k] = j.cap > 0 ? j.cap * tanh(s / j.cap) : s;
    mx = fmax(mx, P[k]);
    if (j.lse) amax = fmax(amax, j.sc * j.M2[r * nk + k]);
  }
  mx = cu_block_reduce<AR_THREADS>(mx, 1, sh);
  if (j.lse) amax = cu_block_reduce<AR_THREADS>(amax, 1, sh);
  double z = 0;
  for (int64_t k = lo + threadIdx.x; k < hi; k += blockDim.x) z += (P[k] = exp(P[k] - mx));
  z = cu_block_reduce<AR_THREADS>(z, 0, sh);
  if (threadIdx.x == 0) {
    j.z[r] = z;
    if (j.lse) {
      j.out[j.i0 + r] = mx + log(z);
      j.t[j.i0 + r] = fabs(mx) + amax + 1;
    }
  }
}

/* fwd_norm: the block's O rows divided by their z. */
__global__ static void __launch_bounds__(128) ar_norm(qc_att_rows j) {
  const int64_t r = blockIdx.x;
  for (int64_t d = threadIdx.x; d < j.Dv; d += blockDim.x) j.out[r * j.Dv + d] /= j.z[r];
}

__global__ static void __launch_bounds__(AR_THREADS) ar_add(double *dst, const double *src, int64_t n) {
  for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x) dst[i] += src[i];
}

/* backend.h att_rows. */
int cu_att_rows(const qc_backend *be, const qc_att_rows *j) {
  cu *c = C(be);
  int rc = QC_OK;
  if (j->op == QC_ATT_PROBE) return c->sw[CU_SW_ATT_HOST] ? 1 : QC_OK; /* 1: switched off, no error set */
  if (j->op == QC_ATT_ADD) {
    if (j->n <= 0) return QC_OK;
    const int64_t nb = (j->n + AR_THREADS - 1) / AR_THREADS;
    ar_add<<<(unsigned)(nb < 4096 ? nb : 4096), AR_THREADS, 0, c->st>>>(j->dst, j->src, j->n);
  } else {
    if (j->rows <= 0) return QC_OK;
    const dim3 g((unsigned)j->rows);
    switch (j->op) {
      case QC_ATT_VJP1: ar_vjp1<<<g, AR_THREADS, 0, c->st>>>(*j); break;
      case QC_ATT_VJP2: ar_vjp2<<<g, AR_THREADS, 0, c->st>>>(*j); break;
      case QC_ATT_FWD: ar_fwd<<<g, AR_THREADS, 0, c->st>>>(*j); break;
      case QC_ATT_FWD_NORM: ar_norm<<<g, 128, 0, c->st>>>(*j); break;
      default: return qc_err("att_rows: op %d: expected one of QC_ATT_*", j->op);
    }
  }
  CK(cudaGetLastError(), "attention reference row kernel");
done:
  return rc;
}
