/* ozaki.cu: the kernels of the Ozaki-scheme reference GEMM
 * (src/backend/cuda/ozaki.cu, docs/gpu.md "The fast reference"): the
 * operands' power-of-two scales, their int8 digit slices in the layout
 * cuBLASLt's IMMA kernels read, the exact combination of the int32
 * products into float64, and the self-check on a sample of elements.
 *
 * A "panel" is one operand seen along its contraction: R rows (the
 * non-contraction index: the rows of op(A), the columns of op(B)) of k
 * elements, element (r, l) at base[r * sr + l * sl]; either sr or sl is 1.
 * Tiles of 32 rows x 32 contraction elements go through shared memory so
 * that the reads are coalesced whichever stride is 1 and the slices are
 * written contraction-contiguous. */
#include <cuda_bf16.h>
#include <cuda_runtime.h>
#include <math.h>

#include "kernels.h"

#define TILE 32
#define TILE_ROWS 8        /* k_exps, k_split: blocks of TILE x TILE_ROWS threads */
#define OZ_THREADS 256     /* k_combine, k_check: threads a block */

/* Load the 32 x 32 tile at (r0, l0) of the panel into t[r][l] (0 outside). */
__device__ static void load_tile(double (*t)[TILE + 1], const double *base, int64_t R, int64_t k, int64_t sr, int64_t sl,
                                 int64_t r0, int64_t l0) {
  const int tx = threadIdx.x, ty = threadIdx.y;
  if (sl == 1) { /* contraction contiguous: lanes along l */
    for (int rr = ty; rr < TILE; rr += blockDim.y) {
      int64_t r = r0 + rr, l = l0 + tx;
      t[rr][tx] = r < R && l < k ? base[r * sr + l] : 0.0;
    }
  } else { /* rows contiguous: lanes along r */
    for (int ll = ty; ll < TILE; ll += blockDim.y) {
      int64_t r = r0 + tx, l = l0 + ll;
      t[tx][ll] = r < R && l < k ? base[r + l * sl] : 0.0;
    }
  }
  __syncthreads();
}

/* Pass 1: exps[r] = 1 + max over the row of the binary exponent E (|v| <
 * 2^E, frexp's): the row's scale, with room for the first digit's rounding
 * (pass 2); by atomicMax (order-free, so deterministic); rows of zeros keep
 * QK_OZ_EZERO (the caller's memset). A non-finite element sets flag[0]. */
__global__ static void __launch_bounds__(TILE * TILE_ROWS) k_exps(const double *base, int64_t R, int64_t k, int64_t sr, int64_t sl, int *exps,
                              unsigned *flag) {
  __shared__ double t[TILE][TILE + 1];
  const int64_t r0 = (int64_t)blockIdx.y * TILE, l0 = (int64_t)blockIdx.x * TILE;
  load_tile(t, base, R, k, sr, sl, r0, l0);
  const int tx = threadIdx.x;
  for (int rr = threadIdx.y; rr < TILE; rr += blockDim.y) {
    double v = t[rr][tx];
    int e = QK_OZ_EZERO;
    if (!isfinite(v)) atomicOr(flag, 1u);
    else if (v != 0.0) frexp(v, &e);
    for (int o = 16; o > 0; o >>= 1) e = max(e, __shfl_xor_sync(0xffffffffu, e, o));
    if (tx == 0 && r0 + rr < R && e != QK_OZ_EZERO) atomicMax(&exps[r0 + rr], e + 1);
  }
}

/* Pass 2: the S int8 digits of every element, slice s at out + s * sstride,
 * element (r, l) at r * kp + l; zeros in the padding (r in [R, Rp), l in
 * [k, kp)). With e = exps[r], y = v 2^(7 - e) has |y| < 2^6; d = rint(y)
 * (to nearest: |d| <= 64, and |y - d| <= 1/2, so every later digit is in
 * [-64, 64] too) and y = (y - d) 2^7 are exact in float64, so v = 2^e
 * sum_s d_s 2^(-7 s) + 2^e y_S 2^(-7 S), |y_S| <= 1/2. Rounding, not
 * truncation: what a plan leaves out (the digits past S, the pairs it
 * drops) has either sign whatever v's, so a shorter plan adds noise to
 * the reference, not a shrink of every element towards zero that the
 * bias test would read as the candidate's. */
__global__ static void __launch_bounds__(TILE * TILE_ROWS) k_split(const double *base, int64_t R, int64_t k, int64_t sr, int64_t sl, const int *exps, int S,
                               int8_t *out, int64_t Rp, int64_t kp, int64_t rstride, int64_t sstride, int rev) {
  __shared__ double t[TILE][TILE + 1];
  const int64_t r0 = (int64_t)blockIdx.y * TILE, l0 = (int64_t)blockIdx.x * TILE;
  load_tile(t, base, R, k, sr, sl, r0, l0);
  const int tx = threadIdx.x;
  const int64_t l = l0 + tx;
  for (int rr = threadIdx.y; rr < TILE; rr += blockDim.y) {
    const int64_t r = r0 + rr;
    if (r >= Rp || l >= kp) continue;
    double y = 0.0;
    if (r < R) {
      int e = exps[r];
      if (e != QK_OZ_EZERO && isfinite(t[rr][tx])) y = scalbn(t[rr][tx], 7 - e);
    }
    for (int s = 0; s < S; s++) {
      double d = rint(y);
      out[(int64_t)(rev ? S - 1 - s : s) * sstride + r * rstride + l] = (int8_t)(int)d;
      y = (y - d) * 128.0;
    }
  }
}

extern "C" int qk_oz_split(const double *base, int64_t R, int64_t k, int64_t sr, int64_t sl, int S, int *exps,
                           unsigned *flag, int8_t *out, int64_t Rp, int64_t kp, int64_t rstride, int64_t sstride, int rev,
                           void *stream) {
  cudaStream_t st = (cudaStream_t)stream;
  if (Rp <= 0 || kp <= 0) return 0;
  if ((sr != 1 && sl != 1) || S < 1) return (int)cudaErrorInvalidValue;
  cudaError_t e = cudaMemsetAsync(exps, 0x80, (size_t)Rp * sizeof *exps, st); /* QK_OZ_EZERO in every word */
  if (e != cudaSuccess) return (int)e;
  dim3 blk(TILE, TILE_ROWS);
  if (R > 0 && k > 0) {
    dim3 g1((unsigned)((k + TILE - 1) / TILE), (unsigned)((R + TILE - 1) / TILE));
    k_exps<<<g1, blk, 0, st>>>(base, R, k, sr, sl, exps, flag);
    if ((e = cudaGetLastError()) != cudaSuccess) return (int)e;
  }
  dim3 g2((unsigned)((kp + TILE - 1) / TILE), (unsigned)((Rp + TILE - 1) / TILE));
  k_split<<<g2, blk, 0, st>>>(base, R, k, sr, sl, exps, S, out, Rp, kp, rstride, sstride, rev);
  return (int)cudaGetLastError();
}

/* C[i, j] (= or +=) 2^(e_i + f_j - 7 (S + 1)) sum_L T_L[i, j] 2^(7 (S + 1 - L)),
 * the levels L = 2 .. S + 1 combined exactly in int64 (|T_L| < 2^31, so the
 * sum stays below 2^(31 + 7 (S - 1) + 1) <= 2^60 for S <= 5), then one
 * conversion to float64 and an exact power-of-two scaling. */
__global__ static void __launch_bounds__(OZ_THREADS) k_combine(const int32_t *T, int64_t tstride, int S, int64_t m, int64_t n, int64_t np,
                                 const int *ea, const int *eb, double *C, int64_t ldc, int acc) {
  for (int64_t q = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; q < m * n; q += (int64_t)gridDim.x * blockDim.x) {
    const int64_t i = q / n, j = q - i * n;
    long long s = 0;
    for (int L = 2; L <= S + 1; L++) s += (long long)T[(int64_t)(L - 2) * tstride + i * np + j] * (1LL << (7 * (S + 1 - L)));
    int e1 = ea[i], e2 = eb[j];
    double v = s == 0 || e1 == QK_OZ_EZERO || e2 == QK_OZ_EZERO ? 0.0 : scalbn((double)s, e1 + e2 - 7 * (S + 1));
    if (acc) C[i * ldc + j] += v;
    else C[i * ldc + j] = v;
  }
}

extern "C" int qk_oz_combine(const int32_t *T, int64_t tstride, int S, int64_t m, int64_t n, int64_t np, const int *ea,
                             const int *eb, double *C, int64_t ldc, int acc, void *stream) {
  if (m <= 0 || n <= 0) return 0;
  if (S < 1 || S > QK_OZ_SMAX) return (int)cudaErrorInvalidValue;
  int64_t blocks = (m * n + OZ_THREADS - 1) / OZ_THREADS;
  if (blocks > 132 * 32) blocks = 132 * 32;
  k_combine<<<(unsigned)blocks, OZ_THREADS, 0, (cudaStream_t)stream>>>(T, tstride, S, m, n, np, ea, eb, C, ldc, acc);
  return (int)cudaGetLastError();
}

/* The sample's element s: every element when m n <= ns, else a fixed
 * pseudo-random one (splitmix64 of s), the two corners first. */
__device__ static void sample_ij(int64_t s, int64_t m, int64_t n, int ns, int64_t *i, int64_t *j) {
  if (m * n <= ns) { *i = s / n; *j = s - *i * n; return; }
  if (s == 0) { *i = 0; *j = 0; return; }
  if (s == 1) { *i = m - 1; *j = n - 1; return; }
  unsigned long long z = 0x9e3779b97f4a7c15ull * (unsigned long long)(s + 1);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  z ^= z >> 31;
  *i = (int64_t)((z >> 32) % (unsigned long long)m);
  *j = (int64_t)((z & 0xffffffffull) % (unsigned long long)n);
}

/* Error-free transformations (Knuth's TwoSum; the product's error by FMA). */
__device__ static void two_sum(double a, double b, double *s, double *e) {
  double x = a + b, z = x - a;
  *s = x;
  *e = (a - (x - z)) + (b - z);
}

/* One lane's step of a compensated dot product (Dot2): p = a b into
 * (hi, lo) with the product's and the sum's errors, |p| into sc. */
__device__ static void dot2_step(double a, double b, double *hi, double *lo, double *sc) {
  double p = a * b, pe = fma(a, b, -p), t, te;
  two_sum(*hi, p, &t, &te);
  *hi = t;
  *lo += pe + te;
  *sc += fabs(p);
}

/* The warp's lanes' (hi, lo, sc) summed by a fixed tree (every lane ends
 * with the total). */
__device__ static void dot2_warp(double *hi, double *lo, double *sc) {
  for (int o = 16; o > 0; o >>= 1) {
    double h2 = __shfl_xor_sync(0xffffffffu, *hi, o), l2 = __shfl_xor_sync(0xffffffffu, *lo, o);
    double c2 = __shfl_xor_sync(0xffffffffu, *sc, o), t, te;
    two_sum(*hi, h2, &t, &te);
    *hi = t;
    *lo += l2 + te;
    *sc += c2;
  }
}

/* One warp per sampled element: the dot product op(A)[i, :] op(B)[:, j]
 * compensated (Ogita-Rump-Oishi Dot2: as if in twice the working
 * precision), its scale sum |a| |b|, and the fast result C[i, j]; per
 * sample: out[4 s ..]: |C - exact| / scale (0 when both are 0, +inf when
 * only the scale is), (C - exact)^2, exact^2, (bf16(exact) - exact)^2.
 * Lanes take strided parts, then a fixed tree over the lanes. */
__global__ static void __launch_bounds__(OZ_THREADS) k_check(const double *A, int64_t sar, int64_t sal, const double *B, int64_t sbl, int64_t sbc,
                               const double *C, int64_t ldc, int64_t m, int64_t n, int64_t k, int ns, double *out) {
  const int lane = threadIdx.x & 31;
  const int64_t s = ((int64_t)blockIdx.x * blockDim.x + threadIdx.x) >> 5;
  if (s >= ns || (m * n <= ns && s >= m * n)) return;
  int64_t i, j;
  sample_ij(s, m, n, ns, &i, &j);
  double hi = 0, lo = 0, sc = 0;
  for (int64_t l = lane; l < k; l += 32) dot2_step(A[i * sar + l * sal], B[l * sbl + j * sbc], &hi, &lo, &sc);
  dot2_warp(&hi, &lo, &sc);
  if (lane) return;
  double ex = hi + lo, f = C[i * ldc + j], d = fabs(f - ex);
  double rb = (double)__bfloat162float(__double2bfloat16(ex)) - ex;
  out[4 * s + 0] = d == 0 ? 0.0 : sc > 0 ? d / sc : INFINITY;
  out[4 * s + 1] = d * d;
  out[4 * s + 2] = ex * ex;
  out[4 * s + 3] = rb * rb;
  if (!(d == d)) out[4 * s + 0] = out[4 * s + 1] = NAN; /* a NaN stays a NaN: the gate refuses it */
}

/* The plan's evidence (src/backend/ozplan.h): one warp per sampled element
 * (the self-check's sample), from the S digit slices of op(A)'s row i (its
 * slice t, 0-based, at as + i arow + t astride) and of op(B)'s column j (bs,
 * brow, bstride likewise; a stride may be negative): every pair's exact integer product P[t][u] = sum_l
 * d_t(i, l) d'_u(j, l) (int64 per lane: |d d'| <= 127^2), the exact value
 * from the float64 operands as k_check takes it (hi, lo), sum |a||b|, the
 * scale exponent e_i + f_j (QC_OZPLAN_ZERO's -1e300 for a row of zeros) and
 * (bf16(exact) - exact)^2; out[s * QK_OZ_PLAN_W ..] in ozplan.h's layout. */
__global__ static void __launch_bounds__(OZ_THREADS) k_plan(const int8_t *as, int64_t arow, int64_t astride, const int8_t *bs,
                               int64_t brow, int64_t bstride, int S, const int *ea, const int *eb, const double *A, int64_t sar, int64_t sal,
                               const double *B, int64_t sbl, int64_t sbc, int64_t m, int64_t n, int64_t k, int ns,
                               double *out) {
  const int lane = threadIdx.x & 31;
  const int64_t s = ((int64_t)blockIdx.x * blockDim.x + threadIdx.x) >> 5;
  if (s >= ns || (m * n <= ns && s >= m * n)) return;
  int64_t i, j;
  sample_ij(s, m, n, ns, &i, &j);
  long long P[QK_OZ_SMAX][QK_OZ_SMAX];
  for (int t = 0; t < QK_OZ_SMAX; t++)
    for (int u = 0; u < QK_OZ_SMAX; u++) P[t][u] = 0;
  double hi = 0, lo = 0, sc = 0;
  const int8_t *ar = as + i * arow, *br = bs + j * brow;
  for (int64_t l = lane; l < k; l += 32) {
    int da[QK_OZ_SMAX], db[QK_OZ_SMAX];
    for (int t = 0; t < QK_OZ_SMAX; t++) {
      da[t] = t < S ? ar[t * astride + l] : 0;
      db[t] = t < S ? br[t * bstride + l] : 0;
    }
    for (int t = 0; t < QK_OZ_SMAX; t++)
      for (int u = 0; u < QK_OZ_SMAX; u++) P[t][u] += (long long)(da[t] * db[u]);
    dot2_step(A[i * sar + l * sal], B[l * sbl + j * sbc], &hi, &lo, &sc);
  }
  for (int o = 16; o > 0; o >>= 1)
    for (int t = 0; t < QK_OZ_SMAX; t++)
      for (int u = 0; u < QK_OZ_SMAX; u++) P[t][u] += __shfl_xor_sync(0xffffffffu, P[t][u], o);
  dot2_warp(&hi, &lo, &sc);
  if (lane) return;
  double *w = out + s * QK_OZ_PLAN_W;
  for (int t = 0; t < QK_OZ_SMAX; t++)
    for (int u = 0; u < QK_OZ_SMAX; u++) w[t * QK_OZ_SMAX + u] = (double)P[t][u]; /* exact: below 2^53 */
  const double ex = hi + lo, rb = (double)__bfloat162float(__double2bfloat16(ex)) - ex;
  double *x = w + QK_OZ_SMAX * QK_OZ_SMAX;
  x[0] = hi;
  x[1] = lo;
  x[2] = sc;
  x[3] = ea[i] == QK_OZ_EZERO || eb[j] == QK_OZ_EZERO ? -1e300 : (double)(ea[i] + eb[j]);
  x[4] = rb * rb;
}

extern "C" int qk_oz_plan(const int8_t *as, int64_t arow, int64_t astride, const int8_t *bs, int64_t brow, int64_t bstride, int S,
                          const int *ea, const int *eb, const double *A, int64_t sar, int64_t sal, const double *B,
                          int64_t sbl, int64_t sbc, int64_t m, int64_t n, int64_t k, int ns, double *out, void *stream) {
  if (m <= 0 || n <= 0 || ns <= 0) return 0;
  if (S < 1 || S > QK_OZ_SMAX) return (int)cudaErrorInvalidValue;
  int nuse = m * n < ns ? (int)(m * n) : ns;
  k_plan<<<(unsigned)((nuse * 32 + OZ_THREADS - 1) / OZ_THREADS), OZ_THREADS, 0, (cudaStream_t)stream>>>(
      as, arow, astride, bs, brow, bstride, S, ea, eb, A, sar, sal, B, sbl, sbc, m, n, k, ns, out);
  return (int)cudaGetLastError();
}

/* res[0] = max of the per-sample relative errors (NaN if any is NaN),
 * res[1..3] the sums of the other three columns: one block, each thread a
 * strided set of samples in order, then a fixed tree (deterministic). */
#define CHK_THREADS 256
__global__ static void __launch_bounds__(CHK_THREADS) k_check_final(const double *v, int ns, double *res) {
  __shared__ double sh[4][CHK_THREADS];
  const int t = threadIdx.x;
  double mx = 0, a = 0, b = 0, c = 0;
  for (int s = t; s < ns; s += CHK_THREADS) {
    double r = v[4 * s];
    mx = r == r && mx == mx ? fmax(mx, r) : NAN;
    a += v[4 * s + 1];
    b += v[4 * s + 2];
    c += v[4 * s + 3];
  }
  sh[0][t] = mx; sh[1][t] = a; sh[2][t] = b; sh[3][t] = c;
  __syncthreads();
  for (int w = CHK_THREADS / 2; w > 0; w >>= 1) {
    if (t < w) {
      double x = sh[0][t], y = sh[0][t + w];
      sh[0][t] = x == x && y == y ? fmax(x, y) : NAN;
      for (int q = 1; q < 4; q++) sh[q][t] += sh[q][t + w];
    }
    __syncthreads();
  }
  if (t < 4) res[t] = sh[t][0];
}

/* The self-check of a planned GEMM from its plan's evidence (k_plan: the
 * same sample, the exact values already computed): one thread per sample,
 * out[4 s ..] as k_check writes them. */
__global__ static void __launch_bounds__(OZ_THREADS) k_check_ev(const double *ev, const double *C, int64_t ldc, int64_t m, int64_t n,
                                  int ns, double *out) {
  const int64_t s = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
  if (s >= ns || (m * n <= ns && s >= m * n)) return;
  int64_t i, j;
  sample_ij(s, m, n, ns, &i, &j);
  const double *x = ev + s * QK_OZ_PLAN_W + QK_OZ_SMAX * QK_OZ_SMAX;
  const double hi = x[0], lo = x[1], sc = x[2], f = C[i * ldc + j];
  const double d = fabs((f - hi) - lo), ex = hi + lo;
  out[4 * s + 0] = d == 0 ? 0.0 : sc > 0 ? d / sc : INFINITY;
  out[4 * s + 1] = d * d;
  out[4 * s + 2] = ex * ex;
  out[4 * s + 3] = x[4];
  if (!(d == d)) out[4 * s + 0] = out[4 * s + 1] = NAN;
}

extern "C" int qk_oz_check_ev(const double *ev, const double *C, int64_t ldc, int64_t m, int64_t n, int ns, double *scratch,
                              double *res, void *stream) {
  cudaStream_t st = (cudaStream_t)stream;
  if (m <= 0 || n <= 0 || ns <= 0) return (int)cudaMemsetAsync(res, 0, 4 * sizeof *res, st);
  int nuse = m * n < ns ? (int)(m * n) : ns;
  k_check_ev<<<(unsigned)((nuse + OZ_THREADS - 1) / OZ_THREADS), OZ_THREADS, 0, st>>>(ev, C, ldc, m, n, ns, scratch);
  cudaError_t e = cudaGetLastError();
  if (e != cudaSuccess) return (int)e;
  k_check_final<<<1, CHK_THREADS, 0, st>>>(scratch, nuse, res);
  return (int)cudaGetLastError();
}

extern "C" int qk_oz_check(const double *A, int64_t sar, int64_t sal, const double *B, int64_t sbl, int64_t sbc,
                           const double *C, int64_t ldc, int64_t m, int64_t n, int64_t k, int ns, double *scratch,
                           double *res, void *stream) {
  cudaStream_t st = (cudaStream_t)stream;
  if (m <= 0 || n <= 0 || ns <= 0) return (int)cudaMemsetAsync(res, 0, 4 * sizeof *res, st);
  int nuse = m * n < ns ? (int)(m * n) : ns;
  cudaError_t e = cudaMemsetAsync(scratch, 0, (size_t)nuse * 4 * sizeof *scratch, st);
  if (e != cudaSuccess) return (int)e;
  k_check<<<(unsigned)((nuse * 32 + OZ_THREADS - 1) / OZ_THREADS), OZ_THREADS, 0, st>>>(A, sar, sal, B, sbl, sbc, C, ldc, m, n, k, ns, scratch);
  if ((e = cudaGetLastError()) != cudaSuccess) return (int)e;
  k_check_final<<<1, CHK_THREADS, 0, st>>>(scratch, nuse, res);
  return (int)cudaGetLastError();
}
