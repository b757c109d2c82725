// measure.cu: what the GPU's approximate float32 arithmetic computes,
// measured exhaustively (built by calibrate.py with nvcc into libcal.so with
// producers.cu; every function takes device pointers and runs on the
// default stream, which torch shares).
//
//   cal_rcpa_table     delta[m] = bits(rcp.approx.f32(1.m)) - bits(RN(1/1.m))
//                      for the 2^23 mantissas
//   cal_rcpa_check     every one of the 2^32 inputs: rcp.approx.f32 against
//                      the table's emulation (variants for subnormal inputs
//                      and results), mismatches counted per class
//   cal_div_check      q[i] (a division some engine computed) against
//                      RN(x * rcp.approx(y)) and against div.rn
//   cal_rcp_check      r[i] (a reciprocal some engine computed) against
//                      rcp.approx.f32 and rcp.rn
//   cal_divfull_sample div.full.f32 against RN(x * rcp.approx(y)) on n
//                      hashed pairs (two ranges)
//   cal_ceil2log_scan  every positive finite float v: exp2f(ceilf(log2f(v)))
//                      (CUDA C++) against the exact power-of-two ceiling;
//                      the inputs where they differ, listed
//   cal_ceil2log_check the same for values g[i] another engine computed
// Written from the definitions; nothing here is copied from a producer.
#include <cuda_runtime.h>
#include <stdint.h>

static __device__ __forceinline__ float rcpa(float x) {
  float r;
  asm("rcp.approx.f32 %0, %1;" : "=f"(r) : "f"(x));
  return r;
}
static __device__ __forceinline__ float rcpa_ftz(float x) {
  float r;
  asm("rcp.approx.ftz.f32 %0, %1;" : "=f"(r) : "f"(x));
  return r;
}
static __device__ __forceinline__ float divfull(float x, float y) {
  float r;
  asm("div.full.f32 %0, %1, %2;" : "=f"(r) : "f"(x), "f"(y));
  return r;
}

__global__ void k_rcpa_table(int8_t *delta, unsigned long long *bad) {
  uint32_t m = blockIdx.x * blockDim.x + threadIdx.x;
  if (m >= (1u << 23)) return;
  float x = __uint_as_float(0x3f800000u | m);
  int d = (int)__float_as_uint(rcpa(x)) - (int)__float_as_uint(__frcp_rn(x));
  if (d < -1 || d > 1) { atomicAdd(bad, 1ull); d = 0; }
  delta[m] = (int8_t)d;
}

// The emulation: RN(1/1.m) + delta, then the exponent; variant bits:
// 1 = a subnormal input is normalized (else flushed: +-Inf); 2 = a result
// below the normal range is rounded to nearest by the scaling (else
// flushed to a signed zero).
static __device__ uint32_t emulate(const int8_t *delta, uint32_t u, int variant) {
  uint32_t sign = u & 0x80000000u, a = u & 0x7fffffffu;
  if (a > 0x7f800000u) return 0x7fffffffu;
  if (a == 0x7f800000u) return sign;
  if (a == 0) return sign | 0x7f800000u;
  int e = (int)(a >> 23) - 127;
  uint32_t m = a & 0x7fffffu;
  if (!(a >> 23)) {
    if (!(variant & 1)) return sign | 0x7f800000u;
    e = -126;
    while (!(m & 0x800000u)) { m <<= 1; e--; }
    m &= 0x7fffffu;
  }
  float r = __frcp_rn(__uint_as_float(0x3f800000u | m));
  r = __uint_as_float(__float_as_uint(r) + (uint32_t)(int)delta[m]);
  int k = -e;
  if (k > 127) return sign | 0x7f800000u;
  float out;
  if (k >= -126) out = __fmul_rn(r, __uint_as_float((uint32_t)(k + 127) << 23));
  else if (variant & 2) out = __fmul_rn(__fmul_rn(r, __uint_as_float((uint32_t)(k + 126 + 127) << 23)), __uint_as_float(1u << 23));
  else out = 0.0f;
  return __float_as_uint(out) | sign;
}

// counts[c * 4 + v]: class c (0 normal in, normal out; 1 normal in,
// subnormal out; 2 subnormal in; 3 zero/inf/nan), variant v mismatches;
// counts[16 + c]: inputs of class c; counts[20]: rcp.approx.ftz differs from
// rcp.approx; ex[c * 8 + j]: the first mismatching inputs of variant 3.
__global__ void k_rcpa_check(const int8_t *delta, uint64_t start, uint64_t count, unsigned long long *counts, uint32_t *ex) {
  for (uint64_t i = blockIdx.x * (uint64_t)blockDim.x + threadIdx.x; i < count; i += (uint64_t)gridDim.x * blockDim.x) {
    uint32_t u = (uint32_t)(start + i), a = u & 0x7fffffffu;
    float x = __uint_as_float(u);
    uint32_t hw = __float_as_uint(rcpa(x));
    /* class 1: x > 2^126, so 1/x is below the normal range */
    int c = a == 0 || a >= 0x7f800000u ? 3 : !(a >> 23) ? 2 : a > 0x7e800000u ? 1 : 0;
    atomicAdd(&counts[16 + c], 1ull);
    for (int v = 0; v < 4; v++) {
      uint32_t em = emulate(delta, u, v);
      bool same = em == hw || (((em & 0x7fffffffu) > 0x7f800000u) && ((hw & 0x7fffffffu) > 0x7f800000u));
      if (!same) {
        unsigned long long n = atomicAdd(&counts[c * 4 + v], 1ull);
        if (v == 3 && n < 8) ex[c * 8 + n] = u;
      }
    }
    if (__float_as_uint(rcpa_ftz(x)) != hw) atomicAdd(&counts[20], 1ull);
  }
}

extern "C" int cal_rcpa_table(int8_t *delta, unsigned long long *bad) {
  k_rcpa_table<<<(1u << 23) / 256, 256>>>(delta, bad);
  return (int)cudaGetLastError();
}

extern "C" int cal_rcpa_check(const int8_t *delta, unsigned long long *counts, uint32_t *ex) {
  for (uint64_t s = 0; s < (1ull << 32); s += (1ull << 30)) {
    k_rcpa_check<<<132 * 16, 256>>>(delta, s, 1ull << 30, counts, ex);
    int e = (int)cudaGetLastError();
    if (e) return e;
  }
  return (int)cudaDeviceSynchronize();
}

// out[0]: q differs from RN(x * rcpa(y)); out[1]: q differs from div.rn;
// out[2]: pairs compared (finite q, normal y, normal x * rcpa(y) result).
__global__ void k_div_check(const float *x, const float *y, const float *q, int64_t n, unsigned long long *out) {
  for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x) {
    float a = __fmul_rn(x[i], rcpa(y[i])), b = __fdiv_rn(x[i], y[i]);
    if (__float_as_uint(a) != __float_as_uint(q[i])) atomicAdd(&out[0], 1ull);
    if (__float_as_uint(b) != __float_as_uint(q[i])) atomicAdd(&out[1], 1ull);
    atomicAdd(&out[2], 1ull);
  }
}
extern "C" int cal_div_check(const float *x, const float *y, const float *q, int64_t n, unsigned long long *out) {
  k_div_check<<<132 * 8, 256>>>(x, y, q, n, out);
  return (int)cudaGetLastError();
}

// out[0]: r differs from rcp.approx(y); out[1]: from rcp.rn(y).
__global__ void k_rcp_check(const float *y, const float *r, int64_t n, unsigned long long *out) {
  for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x) {
    if (__float_as_uint(rcpa(y[i])) != __float_as_uint(r[i])) atomicAdd(&out[0], 1ull);
    if (__float_as_uint(__frcp_rn(y[i])) != __float_as_uint(r[i])) atomicAdd(&out[1], 1ull);
  }
}
extern "C" int cal_rcp_check(const float *y, const float *r, int64_t n, unsigned long long *out) {
  k_rcp_check<<<132 * 8, 256>>>(y, r, n, out);
  return (int)cudaGetLastError();
}

static __device__ __forceinline__ uint32_t mix32(uint64_t z) {
  z += 0x9E3779B97F4A7C15ull;
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return (uint32_t)(z ^ (z >> 31));
}

// A finite float with a random sign and mantissa, exponent field in [lo, hi].
static __device__ __forceinline__ float rnd_float(uint64_t key, int lo, int hi) {
  uint32_t r = mix32(key), e = (uint32_t)lo + mix32(key ^ 0x5555ull) % (uint32_t)(hi - lo + 1);
  return __uint_as_float((r & 0x807fffffu) | (e << 23));
}

// out[0]: div.full differs from RN(x * rcpa(y)); out[1]: div.full differs
// from div.rn; out[2]: pairs. Range 0: exponent fields in [64, 190]; range
// 1: all normal exponents of x, y in [1, 252] (results may leave the range).
__global__ void k_divfull(uint64_t n, int range, unsigned long long *out, float *ex) {
  unsigned long long c0 = 0, c1 = 0;
  for (uint64_t i = blockIdx.x * (uint64_t)blockDim.x + threadIdx.x; i < n; i += (uint64_t)gridDim.x * blockDim.x) {
    float x = rnd_float(2 * i + ((uint64_t)range << 40), range ? 1 : 64, range ? 254 : 190);
    float y = rnd_float(2 * i + 1 + ((uint64_t)range << 40), range ? 1 : 64, range ? 252 : 190);
    float d = divfull(x, y), a = __fmul_rn(x, rcpa(y));
    if (__float_as_uint(d) != __float_as_uint(a)) {
      if (c0 == 0 && ex && (blockIdx.x & 7) == 0 && threadIdx.x < 4) { ex[2 * threadIdx.x] = x; ex[2 * threadIdx.x + 1] = y; }
      c0++;
    }
    if (__float_as_uint(d) != __float_as_uint(__fdiv_rn(x, y))) c1++;
  }
  atomicAdd(&out[0], c0);
  atomicAdd(&out[1], c1);
  if (blockIdx.x == 0 && threadIdx.x == 0) atomicAdd(&out[2], (unsigned long long)n);
}
extern "C" int cal_divfull_sample(uint64_t n, int range, unsigned long long *out, float *ex) {
  k_divfull<<<132 * 16, 256>>>(n, range, out, ex);
  int e = (int)cudaGetLastError();
  return e ? e : (int)cudaDeviceSynchronize();
}

// The exact power-of-two ceiling of a positive finite float, as float bits
// (Inf above 2^127).
static __device__ __forceinline__ uint32_t exact_ceil2(uint32_t a) {
  if (a >> 23) {
    uint32_t e = (a >> 23) + ((a & 0x7fffffu) != 0);
    return e >= 255 ? 0x7f800000u : e << 23;
  }
  uint32_t p = 0;
  while ((1u << p) < a) p++;                    // a = m 2^-149, ceil = 2^(p - 149)
  return p >= 23 ? 0x00800000u : (1u << p);  // 2^-126 = 0x00800000
}

// list: inputs where g differs from the exact ceiling; counts[0] such
// inputs, counts[1] those where g is not half the exact ceiling.
static __device__ void note(uint32_t a, uint32_t g, uint32_t *list, uint32_t cap, unsigned long long *counts) {
  uint32_t want = exact_ceil2(a);
  if (g == want) return;
  unsigned long long k = atomicAdd(&counts[0], 1ull);
  if (k < cap) list[k] = a;
  uint32_t half = want == 0x7f800000u ? 0x7f000000u : (want >> 23) > 1 ? want - 0x800000u : want >> 1;
  if (g != half) atomicAdd(&counts[1], 1ull);
}

__global__ void k_ceil2log_scan(uint32_t *list, uint32_t cap, unsigned long long *counts) {
  for (uint64_t a = 1 + blockIdx.x * (uint64_t)blockDim.x + threadIdx.x; a < 0x7f800000ull; a += (uint64_t)gridDim.x * blockDim.x) {
    float v = __uint_as_float((uint32_t)a);
    note((uint32_t)a, __float_as_uint(exp2f(ceilf(log2f(v)))), list, cap, counts);
  }
}
extern "C" int cal_ceil2log_scan(uint32_t *list, uint32_t cap, unsigned long long *counts) {
  k_ceil2log_scan<<<132 * 16, 256>>>(list, cap, counts);
  int e = (int)cudaGetLastError();
  return e ? e : (int)cudaDeviceSynchronize();
}

__global__ void k_ceil2log_check(const float *v, const float *g, int64_t n, uint32_t *list, uint32_t cap, unsigned long long *counts) {
  for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x)
    note(__float_as_uint(v[i]), __float_as_uint(g[i]), list, cap, counts);
}
extern "C" int cal_ceil2log_check(const float *v, const float *g, int64_t n, uint32_t *list, uint32_t cap, unsigned long long *counts) {
  k_ceil2log_check<<<132 * 16, 256>>>(v, g, n, list, cap, counts);
  return (int)cudaGetLastError();
}

// The GPU's ceil(log2(v)) and exp2 of it against the emulation from the
// exception list exc (sorted float bits where ceil(log2f(v)) is one below
// the exact ceiling). v, G, K: an engine's inputs and results (G = exp2(ceil(
// log2(v))), K = ceil(log2(v)) as float); v == NULL: every positive finite
// float from index 1 on, G and K computed here (CUDA C++ log2f / exp2f).
// counts[c]: mismatches of class c (0: v >= 2^-126, G against 2^k; 1: the
// band 2^-127 < v < 2^-126, K against k; 2: smaller v, K against k);
// counts[3 + c]: inputs of class c; ex[4 c + j]: mismatching inputs.
static __device__ int emul_k(const uint32_t *exc, uint32_t n, uint32_t u) {
  int c;
  if (u >> 23) c = (int)(u >> 23) - 127 + ((u & 0x7fffffu) != 0);
  else { int p = 0; while ((1u << p) < u) p++; c = p - 149; }
  uint32_t lo = 0, hi = n;
  while (lo < hi) { uint32_t mid = (lo + hi) / 2; if (exc[mid] < u) lo = mid + 1; else hi = mid; }
  return lo < n && exc[lo] == u ? c - 1 : c;
}
static __device__ float exp2i(int k) {
  if (k >= 128) return __uint_as_float(0x7f800000u);
  if (k >= -126) return __uint_as_float((uint32_t)(k + 127) << 23);
  if (k >= -149) return __uint_as_float(1u << (k + 149));
  return 0.0f;
}
__global__ void k_c2l_cmp(const float *v, const float *G, const float *K, int64_t n, const uint32_t *exc, uint32_t nexc,
                          unsigned long long *counts, uint32_t *ex) {
  for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x) {
    float x = v ? v[i] : __uint_as_float((uint32_t)(i + 1));
    uint32_t u = __float_as_uint(x);
    if (u == 0 || u >= 0x7f800000u) continue;
    float g = G ? G[i] : exp2f(ceilf(log2f(x)));
    float kk = K ? K[i] : ceilf(log2f(x));
    int k = emul_k(exc, nexc, u);
    int c = u >= 0x00800000u ? 0 : u > 0x00400000u ? 1 : 2;
    bool bad = c == 0 ? __float_as_uint(g) != __float_as_uint(exp2i(k)) : !(kk == (float)k);
    atomicAdd(&counts[3 + c], 1ull);
    if (bad) {
      unsigned long long m = atomicAdd(&counts[c], 1ull);
      if (m < 4) ex[4 * c + m] = u;
    }
  }
}
extern "C" int cal_ceil2log_cmp(const float *v, const float *G, const float *K, int64_t n, const uint32_t *exc, uint32_t nexc,
                                unsigned long long *counts, uint32_t *ex) {
  k_c2l_cmp<<<132 * 16, 256>>>(v, G, K, n, exc, nexc, counts, ex);
  int e = (int)cudaGetLastError();
  return e ? e : (int)cudaDeviceSynchronize();
}

// exp2f(x) in CUDA C++ (nvcc, no fast math), for out[0..n).
__global__ void k_exp2f(const float *x, float *out, int n) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) out[i] = exp2f(x[i]);
}
extern "C" int cal_exp2f(const float *x, float *out, int64_t n) {
  k_exp2f<<<(unsigned)((n + 255) / 256), 256>>>(x, out, (int)n);
  int e = (int)cudaGetLastError();
  return e ? e : (int)cudaDeviceSynchronize();
}
