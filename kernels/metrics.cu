/* metrics.cu: the fused, deterministic metrics pass (kernels.h, qk_metrics).
 * One read of g and r: 8 consecutive elements a thread a step (16-byte
 * loads of g in bf16, four 16-byte loads of r), float64 sums. The grid
 * depends on n only; each block sums a contiguous chunk in a fixed order,
 * then a fixed tree; one block combines the partials by a fixed tree. */
#include <cuda_bf16.h>
#include <cuda_runtime.h>
#include <math.h>

#include "kernels.h"

#define MT 256          /* threads per block */
#define MV 8            /* elements a thread per step */
#define MAXB 512        /* blocks at most (partials); 64 B each in shared memory */

struct macc {
  double sg, sr, sd, dt, snf, mx;
  long long idx, bad;
};

__device__ __forceinline__ void macc_init(macc &a) {
  a.sg = a.sr = a.sd = a.dt = a.snf = 0.0;
  a.mx = -1.0;
  a.idx = -1;
  a.bad = 0;
}

/* r rounded to bf16 as qc_noise_floor rounds it: via float32 (two of the
 * SM's slow 64-bit conversions: computed once an element) */
__device__ __forceinline__ double rnd_bf16(double r) { return (double)__bfloat162float(__float2bfloat16_rn((float)r)); }

/* One finite candidate g against r, whose bf16 rounding is q. */
__device__ __forceinline__ void macc_add_q(macc &a, double g, double r, double q, long long i) {
  double d = g - r;
  a.sg += g * g;
  a.sr += r * r;
  a.sd += d * d;
  a.dt += g * r;
  double e = q - r;
  a.snf += e * e;
  double ad = fabs(d);
  if (ad > a.mx) { a.mx = ad; a.idx = i; }
}

__device__ __forceinline__ void macc_add(macc &a, double g, double r, long long i) {
  if (!isfinite(g)) { a.bad++; return; }
  macc_add_q(a, g, r, rnd_bf16(r), i);
}

/* b covers indices after a's: ties keep the lower index. */
__device__ __forceinline__ void macc_merge(macc &a, const macc &b) {
  a.sg += b.sg; a.sr += b.sr; a.sd += b.sd; a.dt += b.dt; a.snf += b.snf;
  a.bad += b.bad;
  if (b.mx > a.mx || (b.mx == a.mx && b.idx >= 0 && (a.idx < 0 || b.idx < a.idx))) { a.mx = b.mx; a.idx = b.idx; }
}

/* Fixed tree over blockDim.x (a power of two) accumulators in shared memory. */
__device__ void tree(macc *sh, macc v) {
  sh[threadIdx.x] = v;
  __syncthreads();
  for (unsigned s = blockDim.x / 2; s; s >>= 1) {
    if (threadIdx.x < s) macc_merge(sh[threadIdx.x], sh[threadIdx.x + s]);
    __syncthreads();
  }
}

template <int KIND> __device__ __forceinline__ double gload(const void *g, long long i) {
  if (KIND == 0) return ((const double *)g)[i];
  if (KIND == 1) return (double)__bfloat162float(((const __nv_bfloat16 *)g)[i]);
  return (double)((const float *)g)[i];
}

/* 8 values of g from element i (a multiple of 8, so 16-byte aligned). */
template <int KIND> __device__ __forceinline__ void gload8(const void *g, long long i, double *o) {
  if (KIND == 1) {
    uint4 v = *(const uint4 *)((const __nv_bfloat16 *)g + i);
    const __nv_bfloat16 *h = (const __nv_bfloat16 *)&v;
#pragma unroll
    for (int k = 0; k < 8; k++) o[k] = (double)__bfloat162float(h[k]);
  } else if (KIND == 2) {
    float4 a = *(const float4 *)((const float *)g + i), b = *(const float4 *)((const float *)g + i + 4);
    o[0] = a.x; o[1] = a.y; o[2] = a.z; o[3] = a.w; o[4] = b.x; o[5] = b.y; o[6] = b.z; o[7] = b.w;
  } else {
#pragma unroll
    for (int k = 0; k < 4; k++) {
      double2 v = *(const double2 *)((const double *)g + i + 2 * k);
      o[2 * k] = v.x; o[2 * k + 1] = v.y;
    }
  }
}

template <int KIND> __global__ void __launch_bounds__(MT) k_metrics(const void *g, const double *r, long long n, long long chunk, macc *part) {
  __shared__ macc sh[MT];
  macc a;
  macc_init(a);
  const long long lo = blockIdx.x * chunk, hi = min(n, lo + chunk);
  for (long long base = lo; base < hi; base += MT * MV) {
    long long i = base + (long long)threadIdx.x * MV;
    if (i + MV <= hi) {
      double gv[MV], rv[MV];
      gload8<KIND>(g, i, gv);
#pragma unroll
      for (int k = 0; k < 4; k++) {
        double2 v = *(const double2 *)(r + i + 2 * k);
        rv[2 * k] = v.x; rv[2 * k + 1] = v.y;
      }
#pragma unroll
      for (int k = 0; k < MV; k++) macc_add(a, gv[k], rv[k], i + k);
    } else {
      for (long long j = i; j < hi; j++) macc_add(a, gload<KIND>(g, j), r[j], j);
    }
  }
  tree(sh, a);
  if (threadIdx.x == 0) part[blockIdx.x] = sh[0];
}

__global__ void __launch_bounds__(MAXB) k_metrics_final(const macc *part, int nb, qk_msum *res) {
  __shared__ macc sh[MAXB];
  macc a;
  macc_init(a);
  if ((int)threadIdx.x < nb) a = part[threadIdx.x];
  tree(sh, a);
  if (threadIdx.x == 0) {
    res->sg = sh[0].sg; res->sr = sh[0].sr; res->sd = sh[0].sd; res->dt = sh[0].dt; res->snf = sh[0].snf;
    res->mx = sh[0].mx; res->idx = sh[0].idx; res->bad = sh[0].bad;
  }
}

extern "C" size_t qk_metrics_scratch_bytes(void) { return MAXB * sizeof(macc); }

extern "C" int qk_metrics(const void *g, int g_kind, const double *r, int64_t n, void *scratch, qk_msum *res, void *stream) {
  cudaStream_t st = (cudaStream_t)stream;
  /* chunk: a multiple of one block step, so every chunk starts 16-byte aligned */
  long long step = MT * MV;
  long long chunk = ((n + MAXB - 1) / MAXB + step - 1) / step * step;
  if (chunk == 0) chunk = step;
  int nb = (int)((n + chunk - 1) / chunk);
  if (nb < 1) nb = 1;
  macc *part = (macc *)scratch;
  if (g_kind == 0) k_metrics<0><<<nb, MT, 0, st>>>(g, r, n, chunk, part);
  else if (g_kind == 1) k_metrics<1><<<nb, MT, 0, st>>>(g, r, n, chunk, part);
  else k_metrics<2><<<nb, MT, 0, st>>>(g, r, n, chunk, part);
  cudaError_t e = cudaGetLastError();
  if (e) return (int)e;
  k_metrics_final<<<1, MAXB, 0, st>>>(part, nb, res);
  return (int)cudaGetLastError();
}

/* ---- the bias test's terms: x = g - q(r), q the bf16 rounding (via
 * float32, as qc_round_to); the sums are the fused pass's (qk_audit_sums). */
#define BT 256
#define BS 7

#define FT 256 /* threads of the final reduction (one block; 13 x 256 doubles of shared memory) */

/* Each column's cluster sums over the chunks, in chunk order, into chunk 0's slot. */
__global__ void __launch_bounds__(BT) k_bias_colsum(double *parts, int chunks, long long cols) {
  const long long j = (long long)blockIdx.x * BT + threadIdx.x;
  if (j >= cols) return;
  /* eight chunks' loads in flight before their adds, in chunk order */
  double t = 0, c = 0;
  int k = 0;
  for (; k + 8 <= chunks; k += 8) {
    double pt[8], pc[8]; /* scalar loads: the slots need not be 16-byte aligned */
#pragma unroll
    for (int q = 0; q < 8; q++) {
      pt[q] = parts[((long long)(k + q) * cols + j) * 2];
      pc[q] = parts[((long long)(k + q) * cols + j) * 2 + 1];
    }
#pragma unroll
    for (int q = 0; q < 8; q++) { t += pt[q]; c += pc[q]; }
  }
  for (; k < chunks; k++) {
    t += parts[((long long)k * cols + j) * 2];
    c += parts[((long long)k * cols + j) * 2 + 1];
  }
  parts[j * 2] = t;
  parts[j * 2 + 1] = c;
}

__global__ void __launch_bounds__(FT) k_bias_final(const double *rows7, long long rows, const double *cols2, long long cols,
                                                   double *out) {
  __shared__ double sh[QK_BIAS_NSUM][FT];
  double a[QK_BIAS_NSUM];
  for (int k = 0; k < QK_BIAS_NSUM; k++) a[k] = 0;
  for (long long i = threadIdx.x; i < rows; i += FT) {
    const double *r = rows7 + i * BS;
    for (int k = 0; k < BS; k++) a[k] += r[k];
    a[7] += r[0] * r[0];
    a[8] += r[0] * r[1];
    a[9] += r[1] * r[1];
  }
  for (long long j = threadIdx.x; j < cols; j += FT) {
    double t = cols2[j * 2], c = cols2[j * 2 + 1];
    a[10] += t * t;
    a[11] += t * c;
    a[12] += c * c;
  }
  for (int k = 0; k < QK_BIAS_NSUM; k++) sh[k][threadIdx.x] = a[k];
  __syncthreads();
  for (unsigned s = FT / 2; s; s >>= 1) {
    if (threadIdx.x < s)
      for (int k = 0; k < QK_BIAS_NSUM; k++) sh[k][threadIdx.x] += sh[k][threadIdx.x + s];
    __syncthreads();
  }
  if (threadIdx.x < QK_BIAS_NSUM) out[threadIdx.x] = sh[threadIdx.x][0];
}

extern "C" int qk_bias_final(const double *rows7, int64_t rows, double *parts, int chunks, int64_t cols, double *out,
                             void *stream) {
  cudaStream_t st = (cudaStream_t)stream;
  if (chunks > 0 && cols > 0) {
    k_bias_colsum<<<(unsigned)((cols + BT - 1) / BT), BT, 0, st>>>(parts, chunks, cols);
    cudaError_t e = cudaGetLastError();
    if (e) return (int)e;
  }
  k_bias_final<<<1, FT, 0, st>>>(rows7, rows, parts, chunks > 0 ? cols : 0, out);
  return (int)cudaGetLastError();
}

/* ---- the fused audit pass (qk_audit_sums in kernels.h) ----------------------
 * One read of a bf16 candidate g and its float64 reference r ([rows, cols])
 * for the metrics and both halves of the bias test. A block is QK_SUM_THREADS
 * x QK_SUM_COLS columns (QK_SUM_COLS adjacent ones a thread, 16-byte loads
 * where rows are aligned) by QK_SUM_ROWS rows, walked in row order: each
 * thread keeps its metrics accumulator and its columns' (t, c); each row's 7
 * bias sums are reduced over a warp by a fixed shuffle tree, kept per warp
 * in shared memory and summed over the warps in order at the end; every
 * partial lands in its own slot. Then fixed-order reductions over the slots. */

/* One element's metrics, its bias terms (over finite pairs: x r, r^2, x^2,
 * x^2 r^2, x r^3, r^4, (q(r) - r)^2 into b) and its column sums (x r, r^2). */
__device__ __forceinline__ void sums_add(macc &a, double *b, double &t, double &c, double gv, double rv, long long i) {
  if (!isfinite(gv)) { a.bad++; return; }
  const double q = rnd_bf16(rv); /* one rounding for the metrics and the bias terms */
  macc_add_q(a, gv, rv, q, i);
  if (!isfinite(rv)) return;
  double x = gv - q, e = q - rv, xr = x * rv, rr = rv * rv;
  b[0] += xr;
  b[1] += rr;
  b[2] += x * x;
  b[3] += xr * xr;
  b[4] += xr * rr;
  b[5] += rr * rr;
  b[6] += e * e;
  t += xr;
  c += rr;
}

__global__ void __launch_bounds__(QK_SUM_THREADS) k_audit_sums(const __nv_bfloat16 *g, const double *r, long long rows,
                                                               long long cols, int vec, macc *mpart, double *rowpart,
                                                               double *colpart) {
  __shared__ double wrow[QK_SUM_ROWS][QK_SUM_THREADS / 32][BS];
  __shared__ macc sh[QK_SUM_THREADS];
  const long long j0 = ((long long)blockIdx.x * QK_SUM_THREADS + threadIdx.x) * QK_SUM_COLS, strips = gridDim.x;
  const long long r0 = (long long)blockIdx.y * QK_SUM_ROWS;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int nr = (int)min((long long)QK_SUM_ROWS, rows - r0);
  const int nc = (int)max(0LL, min((long long)QK_SUM_COLS, cols - j0));
  macc a;
  macc_init(a);
  double t[QK_SUM_COLS], c[QK_SUM_COLS];
#pragma unroll
  for (int v = 0; v < QK_SUM_COLS; v++) t[v] = c[v] = 0;
  for (int k = 0; k < nr; k++) {
    double b[BS] = {0, 0, 0, 0, 0, 0, 0};
    const long long base = (r0 + k) * cols + j0;
    if (vec && nc == QK_SUM_COLS) { /* 16-byte loads: 8 bf16, 4 x 2 float64 */
      uint4 gw = *(const uint4 *)(g + base);
      const __nv_bfloat16 *gh = (const __nv_bfloat16 *)&gw;
      double rv[QK_SUM_COLS];
#pragma unroll
      for (int q = 0; q < QK_SUM_COLS / 2; q++) {
        double2 x = *(const double2 *)(r + base + 2 * q);
        rv[2 * q] = x.x;
        rv[2 * q + 1] = x.y;
      }
#pragma unroll
      for (int v = 0; v < QK_SUM_COLS; v++) sums_add(a, b, t[v], c[v], (double)__bfloat162float(gh[v]), rv[v], base + v);
    } else {
#pragma unroll
      for (int v = 0; v < QK_SUM_COLS; v++)
        if (v < nc) sums_add(a, b, t[v], c[v], (double)__bfloat162float(g[base + v]), r[base + v], base + v);
    }
#pragma unroll
    for (int q = 0; q < BS; q++)
      for (int o = 16; o; o >>= 1) b[q] += __shfl_down_sync(0xffffffffu, b[q], o);
    if (lane == 0)
      for (int q = 0; q < BS; q++) wrow[k][warp][q] = b[q];
  }
#pragma unroll
  for (int v = 0; v < QK_SUM_COLS; v++)
    if (v < nc) {
      colpart[((long long)blockIdx.y * cols + j0 + v) * 2] = t[v];
      colpart[((long long)blockIdx.y * cols + j0 + v) * 2 + 1] = c[v];
    }
  __syncthreads();
  for (int idx = threadIdx.x; idx < nr * BS; idx += QK_SUM_THREADS) {
    int k = idx / BS, q = idx % BS;
    double v = 0;
    for (int w = 0; w < QK_SUM_THREADS / 32; w++) v += wrow[k][w][q];
    rowpart[((r0 + k) * strips + blockIdx.x) * BS + q] = v;
  }
  tree(sh, a);
  if (threadIdx.x == 0) mpart[(long long)blockIdx.y * strips + blockIdx.x] = sh[0];
}

/* Each row's 7 sums over its strips, in strip order. */
__global__ void k_rows_final(const double *rowpart, long long rows, long long strips, double *rows7) {
  const long long t = (long long)blockIdx.x * blockDim.x + threadIdx.x;
  if (t >= rows * BS) return;
  const long long i = t / BS;
  const int q = (int)(t % BS);
  double v = 0;
  for (long long s = 0; s < strips; s++) v += rowpart[(i * strips + s) * BS + q];
  rows7[t] = v;
}

/* Any number of metrics partials: thread k merges partials k, k + MAXB, ...
 * in order, then a fixed tree (ties keep the lower index: macc_merge). */
__global__ void __launch_bounds__(MAXB) k_mpart_final(const macc *part, long long nb, qk_msum *res) {
  __shared__ macc sh[MAXB];
  macc a;
  macc_init(a);
  for (long long k = threadIdx.x; k < nb; k += MAXB) macc_merge(a, part[k]);
  tree(sh, a);
  if (threadIdx.x == 0) {
    res->sg = sh[0].sg; res->sr = sh[0].sr; res->sd = sh[0].sd; res->dt = sh[0].dt; res->snf = sh[0].snf;
    res->mx = sh[0].mx; res->idx = sh[0].idx; res->bad = sh[0].bad;
  }
}

extern "C" size_t qk_audit_sums_doubles(int64_t rows, int64_t cols) {
  const long long strips = (cols + QK_SUM_THREADS * QK_SUM_COLS - 1) / (QK_SUM_THREADS * QK_SUM_COLS),
                  chunks = (rows + QK_SUM_ROWS - 1) / QK_SUM_ROWS;
  return (size_t)(strips * chunks * (long long)(sizeof(macc) / 8) + rows * strips * BS + rows * BS + chunks * cols * 2);
}

extern "C" int qk_audit_sums(const void *g, const double *r, int64_t rows, int64_t cols, int use_cols, double *scratch,
                             qk_msum *res, double *bias_out, void *stream) {
  cudaStream_t st = (cudaStream_t)stream;
  if (rows < 1 || cols < 1) return (int)cudaErrorInvalidValue;
  const long long strips = (cols + QK_SUM_THREADS * QK_SUM_COLS - 1) / (QK_SUM_THREADS * QK_SUM_COLS),
                  chunks = (rows + QK_SUM_ROWS - 1) / QK_SUM_ROWS;
  /* 16-byte loads where every row starts 16-byte aligned */
  const int vec = cols % QK_SUM_COLS == 0 && ((uintptr_t)g & 15) == 0 && ((uintptr_t)r & 15) == 0;
  macc *mpart = (macc *)scratch;
  double *rowpart = scratch + strips * chunks * (long long)(sizeof(macc) / 8);
  double *rows7 = rowpart + rows * strips * BS;
  double *colpart = rows7 + rows * BS;
  cudaError_t e;
  k_audit_sums<<<dim3((unsigned)strips, (unsigned)chunks), QK_SUM_THREADS, 0, st>>>(
      (const __nv_bfloat16 *)g, r, rows, cols, vec, mpart, rowpart, colpart);
  if ((e = cudaGetLastError())) return (int)e;
  k_mpart_final<<<1, MAXB, 0, st>>>(mpart, strips * chunks, res);
  if ((e = cudaGetLastError())) return (int)e;
  k_rows_final<<<(unsigned)((rows * BS + 255) / 256), 256, 0, st>>>(rowpart, rows, strips, rows7);
  if ((e = cudaGetLastError())) return (int)e;
  return qk_bias_final(rows7, rows, colpart, use_cols ? (int)chunks : 0, cols, bias_out, stream);
}
