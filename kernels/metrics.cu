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

/* ---- the fused audit pass (qk_audit_sums in kernels.h) ----------------------
 * One read of a bf16 candidate g and its float64 reference r ([rows, cols])
 * for the metrics and both halves of the bias test (x = g - q(r), q the bf16
 * rounding via float32, as qc_round_to).
 *
 * Block (strip, chunk): one strip of SW = 32 x QK_SUM_COLS columns (a warp's
 * width: QK_SUM_COLS adjacent ones a lane, 16-byte loads where rows are
 * aligned) by QK_SUM_ROWS rows; warp w takes rows w, w + 8, ... of the chunk,
 * RB rows at a time. A lane keeps its metrics accumulator, the five sums that
 * need no cluster (x^2, x^2 r^2, x r^3, r^4, (q(r) - r)^2) and its columns'
 * (t, c) = (sum x r, sum r^2); each row's (t, c) over the strip is reduced
 * across the warp RB rows at once (a transposed butterfly: 12 shuffles of a
 * double for 4 rows, where one row alone takes 10). Then the warps' column
 * sums in warp order, and a fixed tree over the block. Every partial lands in
 * its own slot; the grid is a function of the shape alone, so the sums are
 * the same on every GPU and every run. Two small passes combine the slots in
 * fixed order (k_sums_mid: QK_SUM_FB blocks, k_sums_last: one). */
#define SW (32 * QK_SUM_COLS)
#define WARPS (QK_SUM_THREADS / 32)
#define RB 4
#define NG 5 /* the sums that need no cluster */
static_assert(QK_SUM_ROWS % (WARPS * RB) == 0, "a chunk is whole batches of every warp");

/* The metrics accumulator with the five unclustered sums. */
struct sacc {
  macc m;
  double s[NG];
};

/* One element: its metrics, and over finite pairs its bias terms: the five
 * unclustered sums into s, (x r, r^2) into its row's (rt, rc) and its
 * column's (t, c). */
__device__ __forceinline__ void sums_add(macc &a, double *s, double &rt, double &rc, double &t, double &c, double gv,
                                         double rv, long long i) {
  if (!isfinite(gv)) { a.bad++; return; }
  const double q = rnd_bf16(rv); /* one rounding for the metrics and the bias terms */
  macc_add_q(a, gv, rv, q, i);
  if (!isfinite(rv)) return;
  const double x = gv - q, e = q - rv, xr = x * rv, rr = rv * rv;
  s[0] += x * x;
  s[1] += xr * xr;
  s[2] += xr * rr;
  s[3] += rr * rr;
  s[4] += e * e;
  rt += xr;
  rc += rr;
  t += xr;
  c += rr;
}

/* v[RB][2]: a lane's (t, c) of RB rows. Afterwards lane l with l % 8 == 0
 * holds in o[2] row (l / 8)'s sums over the warp (lanes 0, 8, 16, 24: rows
 * 0 to 3): halves, then quarters of the rows change hands, then a plain
 * butterfly. The additions' order is fixed by the lane. */
__device__ __forceinline__ void rows_reduce(double (*v)[2], int lane, double *o) {
  const bool h = lane & 16, m = lane & 8;
  double k[2][2];
#pragma unroll
  for (int q = 0; q < 2; q++)
#pragma unroll
    for (int s = 0; s < 2; s++) {
      const double send = h ? v[q][s] : v[q + 2][s], keep = h ? v[q + 2][s] : v[q][s];
      k[q][s] = keep + __shfl_xor_sync(0xffffffffu, send, 16);
    }
#pragma unroll
  for (int s = 0; s < 2; s++) {
    const double send = m ? k[0][s] : k[1][s], keep = m ? k[1][s] : k[0][s];
    o[s] = keep + __shfl_xor_sync(0xffffffffu, send, 8);
  }
#pragma unroll
  for (int d = 4; d; d >>= 1)
#pragma unroll
    for (int s = 0; s < 2; s++) o[s] += __shfl_xor_sync(0xffffffffu, o[s], d);
}

/* b covers later indices than a (macc_merge's ties keep the lower index). */
__device__ __forceinline__ void sacc_merge(sacc &a, const sacc &b) {
  macc_merge(a.m, b.m);
#pragma unroll
  for (int k = 0; k < NG; k++) a.s[k] += b.s[k];
}

/* Fixed tree over blockDim.x (a power of two) accumulators; the result in sh[0]. */
__device__ void sacc_tree(sacc *sh, const sacc &v) {
  sh[threadIdx.x] = v;
  __syncthreads();
  for (unsigned s = blockDim.x / 2; s; s >>= 1) {
    if (threadIdx.x < s) sacc_merge(sh[threadIdx.x], sh[threadIdx.x + s]);
    __syncthreads();
  }
}

__global__ void __launch_bounds__(QK_SUM_THREADS, 2) k_audit_sums(const __nv_bfloat16 *g, const double *r, long long rows,
                                                                  long long cols, int vec, sacc *bpart, double *rowpart,
                                                                  double *colpart) {
  /* the warps' column sums, then the block's tree (sizeof(sacc) x 256 fits) */
  constexpr size_t cb = sizeof(double) * WARPS * SW * 2, tb = sizeof(sacc) * QK_SUM_THREADS;
  __shared__ __align__(16) double smem[(cb > tb ? cb : tb) / sizeof(double)];
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const long long strip = blockIdx.x, strips = gridDim.x, r0 = (long long)blockIdx.y * QK_SUM_ROWS;
  const long long j0 = strip * SW + (long long)lane * QK_SUM_COLS;
  const int nc = (int)max(0LL, min((long long)QK_SUM_COLS, cols - j0));
  sacc a;
  macc_init(a.m);
  double t[QK_SUM_COLS], c[QK_SUM_COLS];
#pragma unroll
  for (int k = 0; k < NG; k++) a.s[k] = 0;
#pragma unroll
  for (int v = 0; v < QK_SUM_COLS; v++) t[v] = c[v] = 0;
  for (int k0 = 0; k0 < QK_SUM_ROWS / WARPS; k0 += RB) {
    double rs[RB][2];
#pragma unroll
    for (int i = 0; i < RB; i++) {
      rs[i][0] = rs[i][1] = 0;
      const long long row = r0 + warp + (long long)WARPS * (k0 + i); /* the same for the whole warp */
      if (row >= rows) continue;
      const long long base = row * cols + j0;
      if (vec && nc == QK_SUM_COLS) { /* 16-byte loads: 8 bf16, 4 x 2 float64 */
        const uint4 gw = __ldcs((const uint4 *)(g + base));
        const __nv_bfloat16 *gh = (const __nv_bfloat16 *)&gw;
        double rv[QK_SUM_COLS];
#pragma unroll
        for (int q = 0; q < QK_SUM_COLS / 2; q++) {
          const double2 x = __ldcs((const double2 *)(r + base + 2 * q));
          rv[2 * q] = x.x;
          rv[2 * q + 1] = x.y;
        }
#pragma unroll
        for (int v = 0; v < QK_SUM_COLS; v++)
          sums_add(a.m, a.s, rs[i][0], rs[i][1], t[v], c[v], (double)__bfloat162float(gh[v]), rv[v], base + v);
      } else {
#pragma unroll
        for (int v = 0; v < QK_SUM_COLS; v++)
          if (v < nc)
            sums_add(a.m, a.s, rs[i][0], rs[i][1], t[v], c[v], (double)__bfloat162float(g[base + v]), r[base + v], base + v);
      }
    }
    double o[2];
    rows_reduce(rs, lane, o);
    const long long row = r0 + warp + (long long)WARPS * (k0 + (lane >> 3));
    if ((lane & 7) == 0 && row < rows) {
      rowpart[(row * strips + strip) * 2] = o[0];
      rowpart[(row * strips + strip) * 2 + 1] = o[1];
    }
  }
  /* the column sums over the warps, in warp order */
  double *ct = smem + (size_t)warp * SW * 2;
#pragma unroll
  for (int v = 0; v < QK_SUM_COLS; v++) {
    ct[(lane * QK_SUM_COLS + v) * 2] = t[v];
    ct[(lane * QK_SUM_COLS + v) * 2 + 1] = c[v];
  }
  __syncthreads();
  for (int j = threadIdx.x; j < SW; j += QK_SUM_THREADS) {
    const long long col = strip * SW + j;
    double tt = 0, cc = 0;
#pragma unroll
    for (int w = 0; w < WARPS; w++) {
      tt += smem[((size_t)w * SW + j) * 2];
      cc += smem[((size_t)w * SW + j) * 2 + 1];
    }
    if (col < cols) {
      colpart[((long long)blockIdx.y * cols + col) * 2] = tt;
      colpart[((long long)blockIdx.y * cols + col) * 2 + 1] = cc;
    }
  }
  __syncthreads();
  sacc_tree((sacc *)smem, a);
  if (threadIdx.x == 0) bpart[(long long)blockIdx.y * strips + blockIdx.x] = ((sacc *)smem)[0];
}

/* One of QK_SUM_FB blocks: a fixed share of the rows (their (t, c) over the
 * strips, in strip order), of the columns (over the chunks, in chunk order)
 * and of the blocks' partials, then a fixed tree: out.m the metrics, out.b
 * the bias sums (qk_bias order: 0 sum x r, 1 sum r^2, 2..6 the unclustered
 * ones, 7..9 the rows' t^2, t c, c^2, 10..12 the columns'). */
struct mid {
  macc m;
  double b[QK_BIAS_NSUM];
};

__device__ __forceinline__ void mid_merge(mid &a, const mid &b) {
  macc_merge(a.m, b.m);
#pragma unroll
  for (int k = 0; k < QK_BIAS_NSUM; k++) a.b[k] += b.b[k];
}

__device__ void mid_tree(mid *sh, const mid &v) {
  sh[threadIdx.x] = v;
  __syncthreads();
  for (unsigned s = blockDim.x / 2; s; s >>= 1) {
    if (threadIdx.x < s) mid_merge(sh[threadIdx.x], sh[threadIdx.x + s]);
    __syncthreads();
  }
}

#define MIDT 128
__global__ void __launch_bounds__(MIDT) k_sums_mid(const sacc *bpart, long long nb, const double *rowpart, long long rows,
                                                   long long strips, const double *colpart, long long chunks, long long cols,
                                                   long long ucols, mid *out) {
  __shared__ mid sh[MIDT];
  mid a;
  macc_init(a.m);
#pragma unroll
  for (int k = 0; k < QK_BIAS_NSUM; k++) a.b[k] = 0;
  const long long T = (long long)gridDim.x * MIDT, id = (long long)blockIdx.x * MIDT + threadIdx.x;
  for (long long i = id; i < rows; i += T) {
    double tt = 0, cc = 0;
    for (long long s = 0; s < strips; s++) {
      tt += rowpart[(i * strips + s) * 2];
      cc += rowpart[(i * strips + s) * 2 + 1];
    }
    a.b[0] += tt;
    a.b[1] += cc;
    a.b[7] += tt * tt;
    a.b[8] += tt * cc;
    a.b[9] += cc * cc;
  }
  for (long long j = id; j < ucols; j += T) {
    double tt = 0, cc = 0;
#pragma unroll 8
    for (long long k = 0; k < chunks; k++) {
      tt += colpart[(k * cols + j) * 2];
      cc += colpart[(k * cols + j) * 2 + 1];
    }
    a.b[10] += tt * tt;
    a.b[11] += tt * cc;
    a.b[12] += cc * cc;
  }
  for (long long k = id; k < nb; k += T) { /* in index order within the thread: macc_merge's tie rule holds */
    macc_merge(a.m, bpart[k].m);
#pragma unroll
    for (int q = 0; q < NG; q++) a.b[2 + q] += bpart[k].s[q];
  }
  mid_tree(sh, a);
  if (threadIdx.x == 0) out[blockIdx.x] = sh[0];
}

__global__ void __launch_bounds__(QK_SUM_FB) k_sums_last(const mid *part, qk_msum *res, double *bias_out) {
  __shared__ mid sh[QK_SUM_FB];
  mid_tree(sh, part[threadIdx.x]);
  if (threadIdx.x == 0) {
    const macc &m = sh[0].m;
    res->sg = m.sg; res->sr = m.sr; res->sd = m.sd; res->dt = m.dt; res->snf = m.snf;
    res->mx = m.mx; res->idx = m.idx; res->bad = m.bad;
  }
  if (threadIdx.x < QK_BIAS_NSUM) bias_out[threadIdx.x] = sh[0].b[threadIdx.x];
}

static_assert(sizeof(sacc) % 8 == 0 && sizeof(mid) % 8 == 0, "partials are whole doubles");

extern "C" size_t qk_audit_sums_doubles(int64_t rows, int64_t cols) {
  const long long strips = (cols + SW - 1) / SW, chunks = (rows + QK_SUM_ROWS - 1) / QK_SUM_ROWS;
  return (size_t)(strips * chunks * (long long)(sizeof(sacc) / 8) + rows * strips * 2 + chunks * cols * 2 +
                  QK_SUM_FB * (long long)(sizeof(mid) / 8));
}

extern "C" int qk_audit_sums(const void *g, const double *r, int64_t rows, int64_t cols, int use_cols, double *scratch,
                             qk_msum *res, double *bias_out, void *stream) {
  cudaStream_t st = (cudaStream_t)stream;
  if (rows < 1 || cols < 1) return (int)cudaErrorInvalidValue;
  const long long strips = (cols + SW - 1) / SW, chunks = (rows + QK_SUM_ROWS - 1) / QK_SUM_ROWS;
  /* 16-byte loads where every row starts 16-byte aligned */
  const int vec = cols % QK_SUM_COLS == 0 && ((uintptr_t)g & 15) == 0 && ((uintptr_t)r & 15) == 0;
  sacc *bpart = (sacc *)scratch;
  double *rowpart = scratch + strips * chunks * (long long)(sizeof(sacc) / 8);
  double *colpart = rowpart + rows * strips * 2;
  mid *mp = (mid *)(colpart + chunks * cols * 2);
  cudaError_t e;
  k_audit_sums<<<dim3((unsigned)strips, (unsigned)chunks), QK_SUM_THREADS, 0, st>>>((const __nv_bfloat16 *)g, r, rows, cols,
                                                                                     vec, bpart, rowpart, colpart);
  if ((e = cudaGetLastError())) return (int)e;
  k_sums_mid<<<QK_SUM_FB, MIDT, 0, st>>>(bpart, strips * chunks, rowpart, rows, strips, colpart, chunks, cols,
                                         use_cols ? cols : 0, mp);
  if ((e = cudaGetLastError())) return (int)e;
  k_sums_last<<<1, QK_SUM_FB, 0, st>>>(mp, res, bias_out);
  return (int)cudaGetLastError();
}
