/* quant.cu: the quantizers of docs/numerics.md on the GPU, every producer
 * path, byte for byte as the CPU ones: a block's scale and element transform
 * come from the path's recipe through the same inline code the CPU runs
 * (numerics/recipe.h); every float32 step is a round-to-nearest intrinsic,
 * so nvcc neither contracts nor approximates it, and the GPU's approximate
 * operations are the instructions themselves (rcp.approx.f32, log2f),
 * which the CPU emulates from measured tables. E4M3 is CUDA's own
 * __nv_cvt_float_to_fp8(x, __NV_SATFINITE, __NV_E4M3), the conversion the
 * format is defined by (bench/fp8_conformance checks it against the rule
 * over all 2^32 inputs).
 *
 * Kernels: a tensor-wide amax (fp8_tensor, nvfp4's global scale), one warp
 * per 1xG group along a row (token/channel, group128, nvfp4, mx), one block
 * of 256 threads per 128x128 tile (block128, two-stage ue8m0). */
#include <cuda_bf16.h>
#include <cuda_fp8.h>
#include <cuda_runtime.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "kernels.h"
#include "qk_elem.cuh"

static __device__ __forceinline__ bool fmt_fp4(qk_fmt f) { return f == QK_NVFP4 || f == QK_MXFP4; }

/* Encode one element under its group's scale: the payload code (e4m3 byte
 * or e2m1 nibble) and its dequantized value q * s. The encoders saturate,
 * so a producer's clamp to the element range changes nothing. */
__device__ __forceinline__ uint8_t encode(bool fp4, const qc_bscale &sc, float x, float *deq) {
  float v = qr_elem(&sc, x);
  uint8_t c = fp4 ? qk_f32_to_e2m1(v) : qk_f32_to_e4m3(v);
  if (fp4 && sc.div == 2) c = qr_fp4_modelopt(v, c); /* ModelOpt's cast: +-0 -> 0, NaN -> 7 */
  float dec = fp4 ? qk_e2m1_to_f32(c) : qk_e4m3_to_f32(c);
  *deq = __fmul_rn(dec, sc.deq);
  return c;
}

/* ---- loads and stores -------------------------------------------------------- */

__device__ __forceinline__ float load_in(const qk_qargs &a, int64_t i) {
  return a.in_bf16 ? __bfloat162float(((const __nv_bfloat16 *)a.in)[i]) : ((const float *)a.in)[i];
}

__device__ __forceinline__ void store_deq(const qk_qargs &a, int64_t i, float d) {
  if (a.deq) a.deq[i] = d;
  if (a.deq_bf16) a.deq_bf16[i] = __bfloat16_as_ushort(__float2bfloat16_rn(d));
  if (a.deq_f64) a.deq_f64[i] = (double)d;
}

/* Threads a block of every kernel here but k_global_scale (one thread): the
 * launches and the __launch_bounds__ (k_block128 and k_block128v are written
 * for 8 warps: block_max, 2 rows x 128 columns a step; k_rowgroups takes
 * QT / 32 groups a block). */
#define QT 256

/* ---- tensor-wide amax ---------------------------------------------------------- */

/* scratch[0] = bits of max |x| (non-negative floats order as integers),
 * scratch[1] += non-finite count. */
__global__ void __launch_bounds__(QT) k_amax(qk_qargs a) {
  int64_t n = a.rows * a.cols;
  float m = 0.f;
  unsigned bad = 0;
  for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x) {
    float x = load_in(a, i);
    if (!isfinite(x)) bad++;
    else m = fmaxf(m, fabsf(x));
  }
  for (int o = 16; o; o >>= 1) {
    m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, o));
    bad += __shfl_xor_sync(0xffffffffu, bad, o);
  }
  if ((threadIdx.x & 31) == 0) {
    atomicMax(&a.scratch[0], __float_as_uint(m));
    if (bad) atomicAdd(&a.scratch[1], bad);
  }
}

/* nvfp4's global scale into scratch[2], as the recipe computes it from the
 * tensor's amax (qr_nvfp4_g; an all-zero tensor gets 1). */
__global__ void __launch_bounds__(1) k_global_scale(qk_qargs a) {
  a.scratch[2] = __float_as_uint(qr_nvfp4_g(&a.rc, __uint_as_float(a.scratch[0])));
}

/* ---- 1xG groups along rows: one warp per group ------------------------------------ */

/* Lane l takes element pairs (2p, 2p+1) of the group, p = l, l+32, ...; so a
 * packed e2m1 byte has one writer. */
__global__ void __launch_bounds__(QT) k_rowgroups(qk_qargs a, int64_t G) {
  const int64_t ngr = (a.cols + G - 1) / G;
  const int64_t warp = (blockIdx.x * (int64_t)blockDim.x + threadIdx.x) >> 5;
  const int lane = threadIdx.x & 31;
  if (warp >= a.rows * ngr) return;
  const int64_t row = warp / ngr, grp = warp % ngr;
  const int64_t c0 = grp * G, gw = min(G, a.cols - c0);
  const int64_t base = row * a.cols + c0;
  float m = 0.f;
  unsigned bad = 0;
  for (int64_t j = 2 * lane; j < gw; j += 64) {
    float x0 = load_in(a, base + j);
    float x1 = j + 1 < gw ? load_in(a, base + j + 1) : 0.f;
    if (!isfinite(x0) || !isfinite(x1)) { bad++; continue; }
    m = fmaxf(m, fmaxf(fabsf(x0), fabsf(x1)));
  }
  for (int o = 16; o; o >>= 1) {
    m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, o));
    bad += __shfl_xor_sync(0xffffffffu, bad, o);
  }
  if (bad) {
    if (lane == 0) atomicAdd(&a.scratch[1], bad);
    return;
  }
  const float g = a.fmt == QK_NVFP4 ? __uint_as_float(a.scratch[2]) : 0.f;
  const qc_bscale sc = qr_block_scale(&a.rc, m, g);
  if (lane == 0) {
    if (a.scale) a.scale[warp] = sc.deq;
    if (a.scale_b)
      a.scale_b[warp] = a.fmt == QK_NVFP4 || a.fmt == QK_MXFP8 || a.fmt == QK_MXFP4 ? sc.byte
                        : a.fmt == QK_FP8_GROUP128_UE8M0 ? qk_e8m0_byte(sc.deq) : 0;
  }
  const bool fp4 = fmt_fp4(a.fmt);
  const int64_t prow = fp4 ? (a.cols + 1) / 2 : a.cols;
  for (int64_t j = 2 * lane; j < gw; j += 64) {
    float d0, d1 = 0.f;
    uint8_t c0b = encode(fp4, sc, load_in(a, base + j), &d0), c1b = 0;
    bool two = j + 1 < gw;
    if (two) c1b = encode(fp4, sc, load_in(a, base + j + 1), &d1);
    store_deq(a, base + j, d0);
    if (two) store_deq(a, base + j + 1, d1);
    if (a.q) {
      if (fp4) {
        a.q[row * prow + (c0 + j) / 2] = (uint8_t)(c0b | (c1b << 4));
      } else {
        a.q[base + j] = c0b;
        if (two) a.q[base + j + 1] = c1b;
      }
    }
  }
}

/* Whole-tensor scale (fp8_tensor): elementwise with the one scale. */
__global__ void __launch_bounds__(QT) k_tensor(qk_qargs a) {
  int64_t n = a.rows * a.cols;
  const qc_bscale sc = qr_block_scale(&a.rc, __uint_as_float(a.scratch[0]), 0.f);
  if (blockIdx.x == 0 && threadIdx.x == 0 && a.scale) a.scale[0] = sc.deq;
  for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x) {
    float d;
    uint8_t c = encode(false, sc, load_in(a, i), &d);
    store_deq(a, i, d);
    if (a.q) a.q[i] = c;
  }
}

/* ---- 128x128 tiles: one block of 256 threads, 2 rows x 128 columns a step.
 * No array of the tile's values: the amax pass reads the tile, the encode
 * pass reads it again (from L2) and, for the two-stage recipe, re-derives
 * the first stage's value. Keeping the 64 values a thread in registers
 * (with the producer recipes' arithmetic) took 216 registers a thread, one
 * block an SM and 0.53 ms for the decode-shape weight (ncu, H200). (A
 * version with 8 adjacent columns a thread, 16-byte loads and stores and
 * float64 staged through shared memory ran slower: 0.29 against 0.16 ms
 * before the recipes.) ------------------------------------------------------ */

__device__ __forceinline__ float block_max(float v, float *sh) {
  for (int o = 16; o; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
  __syncthreads();
  if ((threadIdx.x & 31) == 0) sh[threadIdx.x >> 5] = v;
  __syncthreads();
  float r = sh[0];
  for (int w = 1; w < 8; w++) r = fmaxf(r, sh[w]);
  return r;
}

/* Thread 0 of block (br, bc) stores its scale: the value and, for
 * fp8_block128_ue8m0, its e8m0 byte (0 for the other formats). */
__device__ __forceinline__ void store_block_scale(const qk_qargs &a, int64_t br, int64_t bc, const qc_bscale &sc) {
  const int64_t sidx = br * ((a.cols + 127) / 128) + bc;
  if (threadIdx.x == 0) {
    if (a.scale) a.scale[sidx] = sc.deq;
    if (a.scale_b) a.scale_b[sidx] = a.fmt == QK_FP8_BLOCK128_UE8M0 ? qk_e8m0_byte(sc.deq) : 0;
  }
}

/* One 128 x 128 tile a block (256 threads: 128 columns by 2 interleaved
 * rows). FUSE: the tile's share of the reference d_x = dY W_ref as well
 * (a.fuse_m <= QK_FUSE_M rows of bf16 dY [fuse_m, rows]): each column's
 * sum over the tile's rows of dY[m, row] * W_ref[row, col] in float64
 * (exact products), into fuse_part[tile row][m][col]; qk_fuse_dx_final
 * sums the tile rows in order. The decode shape's reference d_x then never
 * needs W_ref in float64. */
template <bool FUSE> __global__ void __launch_bounds__(QT) k_block128(qk_qargs a) {
  __shared__ float sh[8];
  __shared__ double sdy[FUSE ? 128 : 1][FUSE ? QK_FUSE_M : 1];
  __shared__ double sred[FUSE ? 128 : 1][FUSE ? QK_FUSE_M : 1];
  const int64_t br = blockIdx.y, bc = blockIdx.x;
  const int tc = threadIdx.x & 127, tr = threadIdx.x >> 7;
  const int64_t col = bc * 128 + tc;
  const bool colok = col < a.cols;
  const int64_t r0 = br * 128 + tr;
  const int steps = (int)min((int64_t)64, (a.rows - r0 + 1) / 2); /* rows r0, r0 + 2, ... below a.rows */
  float m = 0.f;
  unsigned bad = 0;
  if (FUSE)
    for (int idx = threadIdx.x; idx < 128 * QK_FUSE_M; idx += 256) {
      const int i = idx / QK_FUSE_M, mm = idx % QK_FUSE_M;
      const int64_t row = br * 128 + i;
      sdy[FUSE ? i : 0][FUSE ? mm : 0] =
          mm < a.fuse_m && row < a.rows ? (double)__bfloat162float(((const __nv_bfloat16 *)a.fuse_dy)[mm * a.rows + row]) : 0.0;
    }
  if (colok)
#pragma unroll 8
    for (int s = 0; s < steps; s++) {
      float v = load_in(a, (r0 + 2 * s) * a.cols + col);
      if (!isfinite(v)) bad++;
      else m = fmaxf(m, fabsf(v));
    }
  if (bad) atomicAdd(&a.scratch[1], bad);
  /* a non-finite value anywhere in the tile makes the block max infinite
   * (block-wide: every thread of the block returns here alike) */
  m = block_max(bad ? INFINITY : m, sh);
  if (isinf(m)) return;
  qc_bscale sc = qr_block_scale(&a.rc, m, 0.f), sc1 = sc;
  if (a.two_stage) {
    /* second stage: requantize the dequantized tile with a power-of-two scale */
    float m2 = 0.f;
    if (colok)
#pragma unroll 8
      for (int s = 0; s < steps; s++) {
        float d;
        encode(false, sc1, load_in(a, (r0 + 2 * s) * a.cols + col), &d);
        m2 = fmaxf(m2, fabsf(d));
      }
    m2 = block_max(m2, sh);
    sc = qr_block_scale(&a.rc2, m2, 0.f);
  }
  store_block_scale(a, br, bc, sc);
  double acc[FUSE ? QK_FUSE_M : 1];
#pragma unroll
  for (int mm = 0; mm < (FUSE ? QK_FUSE_M : 1); mm++) acc[mm] = 0.0;
  if (colok)
#pragma unroll 4
    for (int s = 0; s < steps; s++) {
      const int64_t i = (r0 + 2 * s) * a.cols + col;
      float v = load_in(a, i), d;
      if (a.two_stage) encode(false, sc1, v, &v);
      uint8_t c = encode(false, sc, v, &d);
      store_deq(a, i, d);
      if (a.q) a.q[i] = c;
      if (FUSE) {
        const double dd = (double)d;
        const int li = tr + 2 * s;
#pragma unroll
        for (int mm = 0; mm < (FUSE ? QK_FUSE_M : 1); mm++) acc[mm] = fma(sdy[FUSE ? li : 0][FUSE ? mm : 0], dd, acc[mm]);
      }
    }
  if (FUSE) { /* the two rows' threads of a column: row-1 thread's sums added to row-0's, in that order */
    if (tr == 1)
#pragma unroll
      for (int mm = 0; mm < (FUSE ? QK_FUSE_M : 1); mm++) sred[FUSE ? tc : 0][FUSE ? mm : 0] = acc[mm];
    __syncthreads();
    if (tr == 0 && colok)
#pragma unroll
      for (int mm = 0; mm < (FUSE ? QK_FUSE_M : 1); mm++)
        if (mm < a.fuse_m) a.fuse_part[(br * a.fuse_m + mm) * a.cols + col] = acc[mm] + sred[FUSE ? tc : 0][FUSE ? mm : 0];
  }
}

/* The bf16 tile kernel (the audit's weights: bf16 input, cols a multiple
 * of 8, every pointer aligned; k_block128 takes the rest, and all of it
 * under QC_CUDA_QK_SCALAR=1). One 128 x 128 tile a block of 256 threads:
 * 16 column groups of 8 adjacent columns by 16 rows, 8 passes of 16 rows.
 * Each thread loads its 64 values once with 16-byte loads and keeps them
 * packed as bf16 pairs (32 registers): W is read once, not two or three
 * times, and the stores are 8 to 64 bytes wide. The arithmetic per element
 * is encode()'s, so the bytes are k_block128's.
 *
 * FUSE: the tile's payload codes go to shared memory (17 KB), and a second
 * phase sums the tile's share of the reference d_x, dY[m, row] *
 * W_ref[row, col] over the tile's rows, on the float64 tensor cores (mma
 * m8n8k4: exact products, float64 sums, as DGEMM's), W_ref made from each
 * code as encode() makes it. (The first version summed with a thread's own
 * float64 FMAs, one column and 8 rows m a thread, W_ref from a 256-entry
 * table in shared memory: ncu 197 to 209 us for the decode weight, bound by
 * the shared loads, about 10 for 8 products.) */
__device__ __forceinline__ float bf_lo(uint32_t w) { return __uint_as_float(w << 16); }
__device__ __forceinline__ float bf_hi(uint32_t w) { return __uint_as_float(w & 0xffff0000u); }
__device__ __forceinline__ float bf_at(const uint4 &v, int j) {
  const uint32_t w = j < 2 ? v.x : j < 4 ? v.y : j < 6 ? v.z : v.w;
  return (j & 1) ? bf_hi(w) : bf_lo(w);
}

template <bool FUSE> __global__ void __launch_bounds__(QT) k_block128v(qk_qargs a) {
  __shared__ float sh[8];
  /* FUSE: the codes, rows padded to 136 bytes (a B fragment's 4 rows x 8
   * columns fall in 32 different banks), and dY as the MMA's A fragments:
   * sa[k-step][m half][lane] */
  __shared__ __align__(16) uint8_t scode[FUSE ? 128 : 1][FUSE ? 136 : 16];
  __shared__ __align__(16) double sa[FUSE ? 32 : 1][FUSE ? 2 : 1][FUSE ? 32 : 1];
  const int64_t br = blockIdx.y, bc = blockIdx.x;
  const int cg = threadIdx.x & 15, rr = threadIdx.x >> 4;
  const int64_t col = bc * 128 + cg * 8; /* cols % 8 == 0: a group is wholly inside or outside */
  const bool colok = col < a.cols;
  const int64_t row0 = br * 128 + rr;
  const uint16_t *in = (const uint16_t *)a.in;
  uint4 v[8];
  if (FUSE) /* consecutive threads, consecutive rows of dY: coalesced; dY[mm, i] is A's element (mm % 8, i % 4) of k-step i / 4 */
    for (int idx = threadIdx.x; idx < 128 * QK_FUSE_M; idx += 256) {
      const int i = idx % 128, mm = idx / 128;
      const int64_t row = br * 128 + i;
      sa[FUSE ? i / 4 : 0][FUSE ? mm / 8 : 0][FUSE ? (mm % 8) * 4 + i % 4 : 0] =
          mm < a.fuse_m && row < a.rows ? (double)__bfloat162float(((const __nv_bfloat16 *)a.fuse_dy)[mm * a.rows + row]) : 0.0;
    }
#pragma unroll
  for (int s = 0; s < 8; s++) {
    const int64_t row = row0 + 16 * s;
    v[s] = colok && row < a.rows ? __ldg((const uint4 *)(in + row * a.cols + col)) : make_uint4(0, 0, 0, 0);
  }
  float m = 0.f;
  unsigned bad = 0;
#pragma unroll
  for (int s = 0; s < 8; s++)
#pragma unroll
    for (int j = 0; j < 8; j++) { /* out-of-range elements were loaded as zeros: finite, below any amax */
      const float x = bf_at(v[s], j);
      if (!isfinite(x)) bad++;
      else m = fmaxf(m, fabsf(x));
    }
  if (bad) atomicAdd(&a.scratch[1], bad);
  m = block_max(bad ? INFINITY : m, sh);
  if (isinf(m)) return; /* block-wide, as k_block128 */
  qc_bscale sc = qr_block_scale(&a.rc, m, 0.f), sc1 = sc;
  if (a.two_stage) {
    float m2 = 0.f;
#pragma unroll
    for (int s = 0; s < 8; s++)
#pragma unroll
      for (int j = 0; j < 8; j++) {
        float d;
        encode(false, sc1, bf_at(v[s], j), &d);
        m2 = fmaxf(m2, fabsf(d));
      }
    m2 = block_max(m2, sh);
    sc = qr_block_scale(&a.rc2, m2, 0.f);
  }
  store_block_scale(a, br, bc, sc);
#pragma unroll
  for (int s = 0; s < 8; s++) {
    const int64_t row = row0 + 16 * s;
    float d[8];
    uint32_t cw[2] = {0, 0};
#pragma unroll
    for (int j = 0; j < 8; j++) {
      float x = bf_at(v[s], j);
      if (a.two_stage) encode(false, sc1, x, &x);
      const uint8_t c = encode(false, sc, x, &d[j]);
      cw[j >> 2] |= (uint32_t)c << (8 * (j & 3));
    }
    if (FUSE) *(uint2 *)&scode[FUSE ? rr + 16 * s : 0][FUSE ? cg * 8 : 0] = make_uint2(cw[0], cw[1]);
    if (!colok || row >= a.rows) continue;
    const int64_t i = row * a.cols + col;
    if (a.q) *(uint2 *)(a.q + i) = make_uint2(cw[0], cw[1]);
    if (a.deq) {
      *(float4 *)(a.deq + i) = make_float4(d[0], d[1], d[2], d[3]);
      *(float4 *)(a.deq + i + 4) = make_float4(d[4], d[5], d[6], d[7]);
    }
    if (a.deq_bf16) {
      uint32_t p[4];
#pragma unroll
      for (int k = 0; k < 4; k++)
        p[k] = (uint32_t)__bfloat16_as_ushort(__float2bfloat16_rn(d[2 * k])) |
               ((uint32_t)__bfloat16_as_ushort(__float2bfloat16_rn(d[2 * k + 1])) << 16);
      *(uint4 *)(a.deq_bf16 + i) = make_uint4(p[0], p[1], p[2], p[3]);
    }
    if (a.deq_f64)
#pragma unroll
      for (int k = 0; k < 4; k++) *(double2 *)(a.deq_f64 + i + 2 * k) = make_double2((double)d[2 * k], (double)d[2 * k + 1]);
  }
  if (FUSE) {
    __syncthreads();
    /* the tile's share of d_x, [16 x 128 rows] x [128 rows x 128 columns],
     * on the float64 tensor cores (mma m8n8k4: exact products of bf16 dY
     * and the float W_ref, float64 sums): warp w takes columns 16w to
     * 16w + 15 (two 8-column tiles) for both halves of m, the 32 k-steps of
     * 4 rows in order. B's element (row ks 4 + lane % 4, column lane / 4)
     * is W_ref, as encode() computes it, from the code. */
    const int lane = threadIdx.x & 31, w = threadIdx.x >> 5;
    double acc[2][2][2] = {{{0, 0}, {0, 0}}, {{0, 0}, {0, 0}}};
#pragma unroll 4
    for (int ks = 0; ks < 32; ks++) {
      const double a0 = sa[FUSE ? ks : 0][0][FUSE ? lane : 0], a1 = sa[FUSE ? ks : 0][FUSE ? 1 : 0][FUSE ? lane : 0];
#pragma unroll
      for (int nt = 0; nt < 2; nt++) {
        const uint8_t code = scode[FUSE ? ks * 4 + (lane & 3) : 0][FUSE ? (2 * w + nt) * 8 + (lane >> 2) : 0];
        const double b = (double)__fmul_rn(qk_e4m3_to_f32(code), sc.deq);
        asm("mma.sync.aligned.m8n8k4.row.col.f64.f64.f64.f64 {%0, %1}, {%2}, {%3}, {%0, %1};"
            : "+d"(acc[0][nt][0]), "+d"(acc[0][nt][1]) : "d"(a0), "d"(b));
        asm("mma.sync.aligned.m8n8k4.row.col.f64.f64.f64.f64 {%0, %1}, {%2}, {%3}, {%0, %1};"
            : "+d"(acc[1][nt][0]), "+d"(acc[1][nt][1]) : "d"(a1), "d"(b));
      }
    }
    /* D's elements (row lane / 4, columns 2 (lane % 4) + 0, 1) of each 8 x 8 tile */
#pragma unroll
    for (int mh = 0; mh < 2; mh++)
#pragma unroll
      for (int nt = 0; nt < 2; nt++) {
        const int mm = mh * 8 + (lane >> 2);
        const int64_t c = bc * 128 + (2 * w + nt) * 8 + 2 * (lane & 3); /* cols % 8 == 0: both columns in or out */
        if (mm < a.fuse_m && c < a.cols)
          *(double2 *)(a.fuse_part + (br * a.fuse_m + mm) * a.cols + c) = make_double2(acc[mh][nt][0], acc[mh][nt][1]);
      }
  }
}

/* k_block128v's conditions: not forced element-wise (scalar), bf16 input,
 * whole groups of 8 columns, every pointer aligned to its vector width. */
static bool block128v_ok(const qk_qargs *a) {
  if (a->scalar) return false;
  return a->in_bf16 && a->cols % 8 == 0 && (uintptr_t)a->in % 16 == 0 && (uintptr_t)a->q % 8 == 0 &&
         (uintptr_t)a->deq % 16 == 0 && (uintptr_t)a->deq_bf16 % 16 == 0 && (uintptr_t)a->deq_f64 % 16 == 0;
}

/* d_x[m, col] = sum over tile rows t, in order, of part[t][m][col]. */
__global__ void __launch_bounds__(QT) k_fuse_dx_final(const double *part, int tiles, int mrows, int64_t cols, double *dx) {
  const int64_t t = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
  if (t >= (int64_t)mrows * cols) return;
  /* eight loads in flight before their adds (the same order of sums):
   * one dependent load a tile made this pass latency-bound */
  const int64_t stride = (int64_t)mrows * cols;
  double v = 0.0;
  int k = 0;
  for (; k + 8 <= tiles; k += 8) {
    double p[8];
#pragma unroll
    for (int j = 0; j < 8; j++) p[j] = part[(int64_t)(k + j) * stride + t];
#pragma unroll
    for (int j = 0; j < 8; j++) v += p[j];
  }
  for (; k < tiles; k++) v += part[(int64_t)k * stride + t];
  dx[t] = v;
}

extern "C" int qk_fuse_dx_final(const double *part, int tiles, int mrows, int64_t cols, double *dx, void *stream) {
  const int64_t n = (int64_t)mrows * cols;
  if (n < 1 || tiles < 1) return (int)cudaErrorInvalidValue;
  k_fuse_dx_final<<<(unsigned)((n + QT - 1) / QT), QT, 0, (cudaStream_t)stream>>>(part, tiles, mrows, cols, dx);
  return (int)cudaGetLastError();
}

/* ---- launcher ------------------------------------------------------------------ */

static int64_t group_width(const qk_qargs *a) {
  switch (a->fmt) {
  case QK_FP8_ROW: return a->cols;
  case QK_FP8_GROUP128:
  case QK_FP8_GROUP128_UE8M0: return 128;
  case QK_NVFP4: return 16;
  case QK_MXFP8:
  case QK_MXFP4: return 32;
  default: return 0;
  }
}

extern "C" int qk_quantize(const qk_qargs *a, void *stream) {
  cudaStream_t st = (cudaStream_t)stream;
  cudaError_t e = cudaMemsetAsync(a->scratch, 0, 4 * sizeof(uint32_t), st);
  if (e) return (int)e;
  const int64_t n = a->rows * a->cols;
  if (n == 0) return 0;
  const int amax_blocks = (int)min((int64_t)1024, (n + QT - 1) / QT);
  if (a->fmt == QK_FP8_TENSOR || a->fmt == QK_NVFP4) {
    k_amax<<<amax_blocks, QT, 0, st>>>(*a);
    if ((e = cudaGetLastError())) return (int)e;
  }
  if (a->fmt == QK_FP8_TENSOR) {
    k_tensor<<<amax_blocks, QT, 0, st>>>(*a);
  } else if (a->fmt == QK_FP8_BLOCK128 || a->fmt == QK_FP8_BLOCK128_UE8M0) {
    dim3 grid((unsigned)((a->cols + 127) / 128), (unsigned)((a->rows + 127) / 128));
    const bool vec = block128v_ok(a);
    if (a->fuse_m > 0) {
      if (a->fuse_m > QK_FUSE_M || !a->fuse_dy || !a->fuse_part) return (int)cudaErrorInvalidValue;
      if (vec) k_block128v<true><<<grid, QT, 0, st>>>(*a);
      else k_block128<true><<<grid, QT, 0, st>>>(*a);
    } else {
      if (vec) k_block128v<false><<<grid, QT, 0, st>>>(*a);
      else k_block128<false><<<grid, QT, 0, st>>>(*a);
    }
  } else {
    int64_t G = group_width(a);
    if (G <= 0) return (int)cudaErrorInvalidValue;
    if (a->fmt == QK_NVFP4) {
      k_global_scale<<<1, 1, 0, st>>>(*a);
      if ((e = cudaGetLastError())) return (int)e;
    }
    int64_t warps = a->rows * ((a->cols + G - 1) / G);
    k_rowgroups<<<(unsigned)((warps + QT / 32 - 1) / (QT / 32)), QT, 0, st>>>(*a, G);
  }
  return (int)cudaGetLastError();
}
