/* pointwise.cu: backend.h pointwise, the elementwise classes' references on
 * device buffers (qc_pw). The host functions of reference/gelu.c
 * (gelu_grad, gelu_tanh_bf16, gelu_erf_bf16), swiglu.c (swiglu_clamp, swiglu_elem) and ref_util.c (qc_refu_pointwise)
 * are the definition; these kernels compute the same expressions, one
 * thread an element. In the bf16 variants every product that feeds a sum
 * is rounded on its own (__dmul_rn, never fused), as the host computes it;
 * the device's exp, erf, erfc, tanh and cosh are within 2 float64 ulps of
 * the host's, so a variant's rounded value can differ on an element whose
 * value sits on a bf16 rounding boundary, no more (tests/gpu/
 * test_gpu_pointwise.c counts them). QC_CUDA_PW_HOST=1 switches them off
 * (QC_PW_PROBE answers 1). */
#include <cuda_runtime.h>
#include <math.h>

#include "backend/cuda/cuda_priv.h"

#define PW_THREADS 256

/* formats.h qc_round_bf16 of (float)x, widened back: RNE on the bits. */
__device__ static double pw_bfr(double x) {
  const float f = (float)x;
  unsigned u = __float_as_uint(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) return (double)f;
  u += 0x7fffu + ((u >> 16) & 1u);
  return (double)__uint_as_float(u & 0xffff0000u);
}

__device__ static double pw_sigma(double z) { return z >= 0 ? 1.0 / (1.0 + exp(-z)) : exp(z) / (1.0 + exp(z)); }

/* gelu.c gelu_grad (ab: QC_REFU_TERMS). */
__device__ static double pw_gelu_grad(double x, int tanh_form, int ab) {
  if (tanh_form) {
    const double r = sqrt(2.0 / M_PI), u = r * (x + 0.044715 * x * x * x), ch = cosh(u);
    const double sech2 = isfinite(ch) ? 1.0 / (ch * ch) : 0.0;
    if (ab) return 0.5 * (1.0 + fabs(tanh(u))) + 0.5 * fabs(x) * sech2 * r * (1.0 + 0.134145 * x * x);
    return 0.5 * (1.0 + tanh(u)) + 0.5 * x * sech2 * r * (1.0 + 0.134145 * x * x);
  }
  if (ab) return 0.5 * (1.0 + fabs(erf(x / M_SQRT2))) + fabs(x) * exp(-0.5 * x * x) / sqrt(2.0 * M_PI);
  return 0.5 * erfc(-x / M_SQRT2) + x * exp(-0.5 * x * x) / sqrt(2.0 * M_PI);
}

/* gelu.c gelu_tanh_bf16 / gelu_erf_bf16, the derivative. */
__device__ static double pw_gelu_bf16(double x, int tanh_form) {
  if (tanh_form) {
    const double beta = pw_bfr(sqrt(2.0 / M_PI)), kappa = pw_bfr(0.044715), k3 = pw_bfr(3.0 * kappa);
    const double xx = pw_bfr(__dmul_rn(x, x));
    const double t = pw_bfr(tanh(pw_bfr(__dmul_rn(beta, pw_bfr(x + pw_bfr(__dmul_rn(kappa, pw_bfr(__dmul_rn(xx, x)))))))));
    const double half = pw_bfr(__dmul_rn(0.5, x)), inner = pw_bfr(__dmul_rn(beta, pw_bfr(1.0 + pw_bfr(__dmul_rn(k3, xx)))));
    return pw_bfr(pw_bfr(__dmul_rn(0.5, pw_bfr(1.0 + t))) + pw_bfr(__dmul_rn(pw_bfr(__dmul_rn(half, pw_bfr(1.0 - pw_bfr(__dmul_rn(t, t))))), inner)));
  }
  const double alpha = pw_bfr(sqrt(0.5)), beta = pw_bfr(1.0 / sqrt(2.0 * M_PI));
  const double one_erf = pw_bfr(1.0 + pw_bfr(erf(pw_bfr(__dmul_rn(alpha, x)))));
  const double c = pw_bfr(__dmul_rn(0.5, one_erf)), p = pw_bfr(__dmul_rn(beta, pw_bfr(exp(pw_bfr(__dmul_rn(pw_bfr(__dmul_rn(x, x)), -0.5))))));
  return pw_bfr(c + pw_bfr(__dmul_rn(x, p)));
}

/* QC_PW_GELU: ref_util.c qc_refu_pointwise's element. */
__global__ static void __launch_bounds__(PW_THREADS) pw_gelu(qc_pw j) {
  for (int64_t i = (int64_t)blockIdx.x * PW_THREADS + threadIdx.x; i < j.n; i += (int64_t)gridDim.x * PW_THREADS) {
    const double x = j.x[i], g = j.dy[i];
    const double d = j.mode == 2 ? pw_gelu_bf16(x, j.form & 1) : pw_gelu_grad(x, j.form & 1, j.mode == 1);
    j.dx[i] = j.mode == 1 ? fabs(g) * d : j.mode == 2 ? pw_bfr(__dmul_rn(g, d)) : g * d;
  }
}

/* QC_PW_SWIGLU: swiglu.c swiglu_clamp then swiglu_elem. */
__global__ static void __launch_bounds__(PW_THREADS) pw_swiglu(qc_pw j) {
  const int ab = j.mode == 1, rnd = j.mode >= 2 ? j.mode - 1 : 0;
  const double L = j.limit;
  for (int64_t i = (int64_t)blockIdx.x * PW_THREADS + threadIdx.x; i < j.n; i += (int64_t)gridDim.x * PW_THREADS) {
    double z = j.x[i], w = j.u[i], dy = j.dy[i], da = 1.0, db = 1.0, dg, du;
    if (L > 0) {
      if (z > L || (z == L && !j.pass)) da = 0.0;
      if (fabs(w) > L || (fabs(w) == L && !j.pass)) db = 0.0;
      z = z > L ? L : z;
      w = w > L ? L : (w < -L ? -L : w);
    }
    if (ab || rnd == 0) {
      const double sg = pw_sigma(z);
      dg = da == 0.0 ? 0.0 : ab ? fabs(dy * w) * (sg + fabs(z) * sg * (1.0 - sg)) : dy * w * (sg + z * sg * (1.0 - sg));
      du = db == 0.0 ? 0.0 : ab ? fabs(dy * z * sg) : dy * z * sg;
    } else if (rnd == 1) {
      const double ds = pw_bfr(__dmul_rn(dy, w)), sg = pw_sigma(z);
      dg = da == 0.0 ? 0.0 : pw_bfr(__dmul_rn(__dmul_rn(ds, sg), __dadd_rn(1.0, __dmul_rn(z, 1.0 - sg))));
      du = db == 0.0 ? 0.0 : pw_bfr(__dmul_rn(dy, pw_bfr(__dmul_rn(z, sg))));
    } else {
      const double ds = pw_bfr(__dmul_rn(dy, w)), q = pw_bfr(1.0 + pw_bfr(exp(-z))), sg = pw_bfr(1.0 / q);
      dg = da == 0.0 ? 0.0 : pw_bfr(__dmul_rn(pw_bfr(__dmul_rn(ds, sg)), pw_bfr(1.0 + pw_bfr(__dmul_rn(z, pw_bfr(1.0 - sg))))));
      du = db == 0.0 ? 0.0 : pw_bfr(__dmul_rn(dy, pw_bfr(z / q)));
    }
    j.dx[i] = dg;
    j.du[i] = du;
  }
}

/* backend.h pointwise. */
int cu_pointwise(const qc_backend *be, const qc_pw *j) {
  cu *c = C(be);
  int rc = QC_OK;
  if (j->op == QC_PW_PROBE) return c->sw[CU_SW_PW_HOST] ? 1 : QC_OK; /* 1: switched off, no error set */
  if (j->n <= 0) return QC_OK;
  const int64_t nb = (j->n + PW_THREADS - 1) / PW_THREADS;
  const unsigned g = (unsigned)(nb < 65536 ? nb : 65536);
  switch (j->op) {
    case QC_PW_GELU: pw_gelu<<<g, PW_THREADS, 0, c->st>>>(*j); break;
    case QC_PW_SWIGLU: pw_swiglu<<<g, PW_THREADS, 0, c->st>>>(*j); break;
    default: return qc_err("pointwise: op %d: expected one of QC_PW_*", j->op);
  }
  CK(cudaGetLastError(), "elementwise reference kernel");
done:
  return rc;
}
