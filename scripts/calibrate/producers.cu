// producers.cu: the CUDA C++ producer paths of the calibration, written
// from the formulas of docs/numerics.md the way a CUDA C++ kernel states
// them (plain float operators, nvcc without fast math: `/` is div.rn,
// `1.0f / x` rcp.rn; e4m3 by CUDA's saturating conversion; the vLLM
// nvfp4 kernel's approximate reciprocal by rcp.approx.ftz.f32). Nothing is
// copied from a producer's source. One thread per scale group: simple, and
// fast enough for 10^7 values.
//
// cal_fp8(path, ...)   fp8 formats: codes [rows, cols], float scales
// cal_nvfp4(path, ...) nvfp4: e2m1 codes (one a byte), e4m3 scale bytes, g given
// cal_mx(path, ...)    mxfp8 / mxfp4: codes, e8m0 scale bytes
#include <cuda_bf16.h>
#include <cuda_fp8.h>
#include <cuda_runtime.h>
#include <float.h>
#include <stdint.h>

enum {
  F_VLLM_TENSOR = 0,   // dynamic per-tensor: s = amax / 448, x * (1 / s), clamp
  F_VLLM_TOKEN,        // dynamic per-token: s = max(amax / 448, 1 / (448 * 512)), x / s, clamp
  F_VLLM_GROUP,        // per-token-group: s = max(amax, 1e-10) / 448, x / s (div.rn), clamp
  F_VLLM_GROUP_UE8M0,  // max(amax, 1e-10) / 448, then the SCALE floored at 1e-10, rounded up on its bits (2^-33 min.)
  F_TE,                // scale = 448 / amax, x * scale, s = 1 / scale
  F_TE_POW2,           // the same, scale truncated to a power of two
  F_EXACT,             // s = max(amax, afloor) / 448 [, max(s, sfloor)] [, ceil on bits], x / s
  F_EXACT_BLOCK_UE8M0  // two stages of F_EXACT (the second with a power-of-two scale)
};
enum { N_TE = 0, N_EXACT, N_VLLM_CUDA };
enum { M_OCP = 0, M_EXACT, M_VLLM_EVEN };

struct Geo {
  int64_t rows, cols;
  int br, bc;  // 0: the whole extent
  int bf16;    // input is bfloat16 (else float32)
};

static __device__ __forceinline__ float ld(const void *in, int bf16, int64_t i) {
  return bf16 ? __bfloat162float(((const __nv_bfloat16 *)in)[i]) : ((const float *)in)[i];
}
static __device__ __forceinline__ uint8_t to_e4m3(float v) {
  return (uint8_t)__nv_cvt_float_to_fp8(v, __NV_SATFINITE, __NV_E4M3);
}
static __device__ __forceinline__ float from_e4m3(uint8_t b) {
  __half_raw h = __nv_cvt_fp8_to_halfraw((__nv_fp8_storage_t)b, __NV_E4M3);
  return __half2float(__half(h));
}
// e2m1: round to nearest, ties to the even code, saturate at 6, keep the sign.
static __device__ __forceinline__ uint8_t to_e2m1(float v) {
  float a = fabsf(v);
  uint8_t c = a <= 0.25f ? 0 : a < 0.75f ? 1 : a <= 1.25f ? 2 : a < 1.75f ? 3 : a <= 2.5f ? 4 : a < 3.5f ? 5 : a <= 5.0f ? 6 : 7;
  return (uint8_t)(c | (signbit(v) ? 8 : 0));
}
static __device__ __forceinline__ float ceil_pow2_bits(float s) {
  uint32_t u = __float_as_uint(s);
  if (u & 0x7fffffu) u = (u & 0xff800000u) + 0x800000u;
  return __uint_as_float(u);
}
static __device__ __forceinline__ float clamp448(float v) { return fminf(fmaxf(v, -448.0f), 448.0f); }
static __device__ __forceinline__ float rcp_approx_ftz(float x) {
  float r;
  asm("rcp.approx.ftz.f32 %0, %1;" : "=f"(r) : "f"(x));
  return r;
}

// The group g of geo: rows [r0, r1), columns [c0, c1).
static __device__ void group_of(const Geo &g, int64_t id, int64_t *r0, int64_t *r1, int64_t *c0, int64_t *c1) {
  int64_t br = g.br ? g.br : g.rows, bc = g.bc ? g.bc : g.cols, gc = (g.cols + bc - 1) / bc;
  *r0 = (id / gc) * br;
  *c0 = (id % gc) * bc;
  *r1 = min(*r0 + br, g.rows);
  *c1 = min(*c0 + bc, g.cols);
}

static __device__ float group_amax(const Geo &g, const void *in, int64_t r0, int64_t r1, int64_t c0, int64_t c1) {
  float m = 0.0f;
  for (int64_t r = r0; r < r1; r++)
    for (int64_t c = c0; c < c1; c++) m = fmaxf(m, fabsf(ld(in, g.bf16, r * g.cols + c)));
  return m;
}

__global__ void k_fp8(int path, Geo g, const void *in, uint8_t *codes, float *scale, int64_t ngroups, float afloor,
                      float sfloor, int pow2) {
  int64_t id = blockIdx.x * (int64_t)blockDim.x + threadIdx.x;
  if (id >= ngroups) return;
  int64_t r0, r1, c0, c1;
  group_of(g, id, &r0, &r1, &c0, &c1);
  float amax = group_amax(g, in, r0, r1, c0, c1), s = 0.0f, mul = 0.0f;
  int div = 0, clamp = 1;
  switch (path) {
    case F_VLLM_TENSOR: s = amax / 448.0f; mul = 1.0f / s; break;
    case F_VLLM_TOKEN: s = fmaxf(amax / 448.0f, 1.0f / (448.0f * 512.0f)); div = 1; break;
    case F_VLLM_GROUP: s = fmaxf(amax, 1e-10f) / 448.0f; div = 1; break;
    case F_VLLM_GROUP_UE8M0: s = ceil_pow2_bits(fmaxf(fmaxf(amax, 1e-10f) / 448.0f, 1e-10f)); mul = 1.0f / s; break;
    case F_TE:
    case F_TE_POW2: {
      float sc = (amax == 0.0f || !isfinite(amax)) ? 1.0f : 448.0f / amax;
      if (isinf(sc)) sc = FLT_MAX;
      if (path == F_TE_POW2) sc = __uint_as_float(__float_as_uint(sc) & 0xff800000u);
      mul = sc;
      s = 1.0f / sc;
      clamp = 0;
      break;
    }
    default: { // F_EXACT, F_EXACT_BLOCK_UE8M0 (stage 1)
      s = fmaxf(amax, afloor) / 448.0f;
      if (pow2 && path == F_EXACT) s = ceil_pow2_bits(s);
      s = fmaxf(s, sfloor);
      div = 1;
      clamp = 0;
      break;
    }
  }
  for (int64_t r = r0; r < r1; r++)
    for (int64_t c = c0; c < c1; c++) {
      float x = ld(in, g.bf16, r * g.cols + c);
      float v = div ? (s == 0.0f ? x * 0.0f : x / s) : x * mul;
      codes[r * g.cols + c] = to_e4m3(clamp ? clamp448(v) : v);
    }
  if (path == F_EXACT_BLOCK_UE8M0) { // stage 2: dequantize, requantize with a power-of-two scale
    float m2 = 0.0f;
    for (int64_t r = r0; r < r1; r++)
      for (int64_t c = c0; c < c1; c++) m2 = fmaxf(m2, fabsf(from_e4m3(codes[r * g.cols + c]) * s));
    float s2 = ceil_pow2_bits(fmaxf(m2, 1e-4f) / 448.0f);
    for (int64_t r = r0; r < r1; r++)
      for (int64_t c = c0; c < c1; c++) codes[r * g.cols + c] = to_e4m3(from_e4m3(codes[r * g.cols + c]) * s / s2);
    s = s2;
  }
  scale[id] = s;
}

extern "C" int cal_fp8(int path, int64_t rows, int64_t cols, int br, int bc, int bf16, const void *in, uint8_t *codes,
                       float *scale, float afloor, float sfloor, int pow2) {
  Geo g = {rows, cols, br, bc, bf16};
  int64_t gbr = br ? br : rows, gbc = bc ? bc : cols;
  int64_t ng = ((rows + gbr - 1) / gbr) * ((cols + gbc - 1) / gbc);
  k_fp8<<<(unsigned)((ng + 127) / 128), 128>>>(path, g, in, codes, scale, ng, afloor, sfloor, pow2);
  int e = (int)cudaGetLastError();
  return e ? e : (int)cudaDeviceSynchronize();
}

// nvfp4: groups of 16 along rows; g is the per-tensor global scale (a
// divisor), computed by the caller as its producer does.
__global__ void k_nvfp4(int path, Geo geo, const void *in, float g, uint8_t *codes, uint8_t *sfb, int64_t ngroups) {
  int64_t id = blockIdx.x * (int64_t)blockDim.x + threadIdx.x;
  if (id >= ngroups) return;
  int64_t r0, r1, c0, c1;
  group_of(geo, id, &r0, &r1, &c0, &c1);
  float bmax = group_amax(geo, in, r0, r1, c0, c1), out = 0.0f, d = 0.0f;
  uint8_t sf;
  if (path == N_TE) {
    sf = to_e4m3(bmax * (g * (1.0f / 6.0f)));
    float v = from_e4m3(sf);
    out = fminf(1.0f / (v * (1.0f / g)), FLT_MAX); // TE: no zero case, 1/0 -> FLT_MAX
  } else if (path == N_VLLM_CUDA) {
    sf = to_e4m3(g * (bmax * rcp_approx_ftz(6.0f)));
    float v = from_e4m3(sf);
    out = v != 0.0f ? rcp_approx_ftz(v * rcp_approx_ftz(g)) : 0.0f;
  } else {
    sf = to_e4m3(fminf(g * (bmax / 6.0f), 448.0f));
    d = from_e4m3(sf) / g;
  }
  for (int64_t c = c0; c < c1; c++) {
    float x = ld(in, geo.bf16, r0 * geo.cols + c);
    float v = path == N_EXACT ? (d != 0.0f ? x / d : x * 0.0f) : x * out;
    codes[r0 * geo.cols + c] = to_e2m1(fminf(fmaxf(v, -6.0f), 6.0f));
  }
  sfb[id] = sf;
}

extern "C" int cal_nvfp4(int path, int64_t rows, int64_t cols, int bf16, const void *in, float g, uint8_t *codes, uint8_t *sfb) {
  Geo geo = {rows, cols, 1, 16, bf16};
  int64_t ng = rows * ((cols + 15) / 16);
  k_nvfp4<<<(unsigned)((ng + 127) / 128), 128>>>(path, geo, in, g, codes, sfb, ng);
  int e = (int)cudaGetLastError();
  return e ? e : (int)cudaDeviceSynchronize();
}

// amax of a whole tensor (for the global scales computed in CUDA C++).
__global__ void k_amax(const void *in, int bf16, int64_t n, unsigned *out) {
  float m = 0.0f;
  for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x)
    m = fmaxf(m, fabsf(ld(in, bf16, i)));
  atomicMax(out, __float_as_uint(m));
}
__global__ void k_gdiv(const unsigned *amax, float *g, int te) {
  float a = __uint_as_float(*amax);
  *g = a == 0.0f ? 1.0f : te ? fminf(2688.0f / a, FLT_MAX) : 2688.0f / a;
}
// g = 2688 / amax in CUDA C++ (div.rn), into *g (device); te: at most FLT_MAX
// (Transformer Engine's compute_global_encode_scaling_factor_FP4).
extern "C" int cal_gdiv(const void *in, int bf16, int64_t n, unsigned *scratch, float *g, int te) {
  cudaMemset(scratch, 0, 4);
  k_amax<<<264, 256>>>(in, bf16, n, scratch);
  k_gdiv<<<1, 1>>>(scratch, g, te);
  int e = (int)cudaGetLastError();
  return e ? e : (int)cudaDeviceSynchronize();
}

// mx: groups of 32 along rows.
__global__ void k_mx(int path, Geo geo, const void *in, int fp4, uint8_t *codes, uint8_t *sb, int64_t ngroups) {
  int64_t id = blockIdx.x * (int64_t)blockDim.x + threadIdx.x;
  if (id >= ngroups) return;
  int64_t r0, r1, c0, c1;
  group_of(geo, id, &r0, &r1, &c0, &c1);
  float amax = group_amax(geo, in, r0, r1, c0, c1);
  int e;
  if (path == M_OCP) {
    int ex;
    frexpf(amax, &ex); // amax = f 2^ex, f in [0.5, 1)
    e = amax > 0.0f ? ex - 1 - (fp4 ? 2 : 8) : -127;
  } else if (path == M_VLLM_EVEN) {
    e = (int)(((__float_as_uint(amax) + 0x200000u) >> 23) & 0xffu) - 127 - (fp4 ? 2 : 8);
  } else {
    e = (int)((__float_as_uint(ceil_pow2_bits(amax / (fp4 ? 6.0f : 448.0f))) >> 23) & 0xffu) - 127;
  }
  e = max(-127, min(127, e));
  // OCP MX v1.0: X = 2^e exactly (exp2f(-127) is one ulp under 2^-127 on the GPU; vLLM's and torch's
  // paths divide by it, the spec does not)
  float scale = path == M_OCP ? ldexpf(1.0f, e) : exp2f((float)e);
  for (int64_t c = c0; c < c1; c++) {
    float v = ld(in, geo.bf16, r0 * geo.cols + c) / scale;
    codes[r0 * geo.cols + c] = fp4 ? to_e2m1(v) : to_e4m3(v);
  }
  sb[id] = (uint8_t)(e + 127);
}

extern "C" int cal_mx(int path, int64_t rows, int64_t cols, int bf16, int fp4, const void *in, uint8_t *codes, uint8_t *sb) {
  Geo geo = {rows, cols, 1, 32, bf16};
  int64_t ng = rows * ((cols + 31) / 32);
  k_mx<<<(unsigned)((ng + 127) / 128), 128>>>(path, geo, in, fp4, codes, sb, ng);
  int e = (int)cudaGetLastError();
  return e ? e : (int)cudaDeviceSynchronize();
}
