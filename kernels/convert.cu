/* convert.cu: element conversions between bf16, float32 and float64 (RNE). */
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include "kernels.h"

#define CV_THREADS 256 /* threads a block (the launch and the bound) */

template <typename A, typename B, typename F> __global__ void __launch_bounds__(CV_THREADS) k_map(const A *in, B *out, int64_t n, F f) {
  for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x)
    out[i] = f(in[i]);
}

struct f64_f64 { __device__ double operator()(double x) const { return x; } };
struct f32_f64 { __device__ double operator()(float x) const { return (double)x; } };
struct f16_f64 { __device__ double operator()(uint16_t h) const { return (double)__half2float(__ushort_as_half(h)); } };
struct f64_f32 { __device__ float operator()(double x) const { return (float)x; } };
struct f16_f32 { __device__ float operator()(uint16_t h) const { return __half2float(__ushort_as_half(h)); } };
struct bf16_f64 { __device__ double operator()(uint16_t h) const { return (double)__bfloat162float(__ushort_as_bfloat16(h)); } };
struct bf16_f32 { __device__ float operator()(uint16_t h) const { return __bfloat162float(__ushort_as_bfloat16(h)); } };
struct f32_bf16 { __device__ uint16_t operator()(float x) const { return __bfloat16_as_ushort(__float2bfloat16_rn(x)); } };
struct f64_bf16 { __device__ uint16_t operator()(double x) const { return __bfloat16_as_ushort(__double2bfloat16(x)); } };

template <typename A, typename B, typename F> static int launch(const A *in, B *out, int64_t n, void *stream) {
  if (n <= 0) return 0;
  int64_t blocks = (n + CV_THREADS - 1) / CV_THREADS;
  if (blocks > 132 * 16) blocks = 132 * 16;
  k_map<<<(unsigned)blocks, CV_THREADS, 0, (cudaStream_t)stream>>>(in, out, n, F());
  return (int)cudaGetLastError();
}

extern "C" int qk_bf16_to_f64(const uint16_t *in, double *out, int64_t n, void *s) { return launch<uint16_t, double, bf16_f64>(in, out, n, s); }
extern "C" int qk_bf16_to_f32(const uint16_t *in, float *out, int64_t n, void *s) { return launch<uint16_t, float, bf16_f32>(in, out, n, s); }
extern "C" int qk_f32_to_bf16(const float *in, uint16_t *out, int64_t n, void *s) { return launch<float, uint16_t, f32_bf16>(in, out, n, s); }
extern "C" int qk_f64_to_bf16(const double *in, uint16_t *out, int64_t n, void *s) { return launch<double, uint16_t, f64_bf16>(in, out, n, s); }

extern "C" int qk_to_f64(int kind, const void *in, double *out, int64_t n, void *s) {
  switch (kind) {
    case QK_T_F64: return launch<double, double, f64_f64>((const double *)in, out, n, s);
    case QK_T_F32: return launch<float, double, f32_f64>((const float *)in, out, n, s);
    case QK_T_F16: return launch<uint16_t, double, f16_f64>((const uint16_t *)in, out, n, s);
    case QK_T_BF16: return launch<uint16_t, double, bf16_f64>((const uint16_t *)in, out, n, s);
  }
  return (int)cudaErrorInvalidValue;
}

extern "C" int qk_to_f32(int kind, const void *in, float *out, int64_t n, void *s) {
  switch (kind) {
    case QK_T_F64: return launch<double, float, f64_f32>((const double *)in, out, n, s);
    case QK_T_F16: return launch<uint16_t, float, f16_f32>((const uint16_t *)in, out, n, s);
    case QK_T_BF16: return launch<uint16_t, float, bf16_f32>((const uint16_t *)in, out, n, s);
  }
  return (int)cudaErrorInvalidValue;
}

/* numerics/formats.h's qc_round_bf16 of (float)v, bit for bit. */
static __device__ double round_bf16(double v) {
  unsigned u = __float_as_uint((float)v);
  if ((u & 0x7fffffffu) > 0x7f800000u) u = ((u >> 16) | 0x0040u) << 16; /* quiet NaN */
  else u = ((u + 0x7fffu + ((u >> 16) & 1u)) >> 16) << 16;
  return (double)__uint_as_float(u);
}

template <typename A, typename F> struct widen_x {
  unsigned flags;
  __device__ double operator()(A x) const {
    double v = F()(x);
    if (flags & QK_X_BF16) v = round_bf16(v);
    return flags & QK_X_ABS ? fabs(v) : v;
  }
};

template <typename A, typename F> static int launch_x(const void *in, double *out, int64_t n, unsigned flags, void *s) {
  if (n <= 0) return 0;
  int64_t blocks = (n + CV_THREADS - 1) / CV_THREADS;
  if (blocks > 132 * 16) blocks = 132 * 16;
  k_map<<<(unsigned)blocks, CV_THREADS, 0, (cudaStream_t)s>>>((const A *)in, out, n, widen_x<A, F>{flags});
  return (int)cudaGetLastError();
}

extern "C" int qk_to_f64_x(int kind, const void *in, double *out, int64_t n, unsigned flags, void *s) {
  switch (kind) {
    case QK_T_F64: return launch_x<double, f64_f64>(in, out, n, flags, s);
    case QK_T_F32: return launch_x<float, f32_f64>(in, out, n, flags, s);
    case QK_T_F16: return launch_x<uint16_t, f16_f64>(in, out, n, flags, s);
    case QK_T_BF16: return launch_x<uint16_t, bf16_f64>(in, out, n, flags, s);
  }
  return (int)cudaErrorInvalidValue;
}
