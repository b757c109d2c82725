/* roperows.cu: backend.h rope_rows, the RoPE reference's rotation on
 * device buffers (qc_rope_rows). reference/rope.c's rope_rows is the
 * definition: one thread an element computes its pair's angle and the
 * same expression, every product and sum rounded on its own (__dmul_rn,
 * __dadd_rn: never fused), as the host computes them. The reference passes
 * the host's frequency table (theta's made there, once, for both paths),
 * so each angle is the host's to the bit; the device's cos and sin are
 * within 2 float64 ulps of the host's, so the float64 results agree to
 * about 1e-15 relative and a bf16 variant can differ on an element whose
 * value sits on a rounding boundary, no more (tests/gpu/test_gpu_rope.c
 * counts them). Without a table (f NULL) the device makes theta's with
 * its own exp and log, an ulp from the host's: an angle at position p
 * then moves by about p ulps of the frequency. QC_CUDA_ROPE_HOST=1 switches
 * it off (QC_ROPE_PROBE answers 1). */
#include <cuda_runtime.h>
#include <math.h>

#include "backend/cuda/cuda_priv.h"

#define RP_THREADS 256

/* formats.h qc_round_bf16 of (float)x, widened back: RNE on the bits. */
__device__ static double rp_bfr(double x) {
  const float f = (float)x;
  unsigned u = __float_as_uint(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) return (double)f;
  u += 0x7fffu + ((u >> 16) & 1u);
  return (double)__uint_as_float(u & 0xffff0000u);
}

/* rope_rows: element i of v [T, H, D]. */
__global__ static void __launch_bounds__(RP_THREADS) rp_rows(qc_rope_rows j) {
  const int64_t D = j.D, R = j.R, n = j.T * j.H * D;
  for (int64_t i = (int64_t)blockIdx.x * RP_THREADS + threadIdx.x; i < n; i += (int64_t)gridDim.x * RP_THREADS) {
    const int64_t c = i % D, t = i / D / j.H;
    const double *g = j.v + (i - c);
    if (c >= R) {
      j.out[i] = j.ab ? fabs(g[c]) : g[c];
      continue;
    }
    const int64_t p = j.inter ? c / 2 : (c < R / 2 ? c : c - R / 2), is_b = j.inter ? c & 1 : c >= R / 2;
    const int64_t a = j.inter ? 2 * p : p, b = j.inter ? 2 * p + 1 : p + R / 2;
    const double fr = j.f ? j.f[p] : exp(__dmul_rn(__ddiv_rn(-2.0 * (double)p, (double)R), log(j.theta)));
    const double phi = __dmul_rn(__dmul_rn(j.s, __dadd_rn((double)j.p[t], j.off)), fr);
    double co = __dmul_rn(j.k, cos(phi)), si = __dmul_rn(j.k, sin(phi));
    if (j.rnd) {
      co = rp_bfr(co);
      si = rp_bfr(si);
    }
    if (j.fwd) si = -si; /* Q(phi) = Q(-phi)^T */
    const double ga = g[a], gb = g[b];
    double r;
    if (j.ab) {
      r = is_b ? __dadd_rn(__dadd_rn(fabs(__dmul_rn(si, ga)), fabs(__dmul_rn(co, gb))),
                           __dmul_rn(fabs(phi), __dadd_rn(fabs(__dmul_rn(co, ga)), fabs(__dmul_rn(si, gb)))))
               : __dadd_rn(__dadd_rn(fabs(__dmul_rn(co, ga)), fabs(__dmul_rn(si, gb))),
                           __dmul_rn(fabs(phi), __dadd_rn(fabs(__dmul_rn(si, ga)), fabs(__dmul_rn(co, gb)))));
    } else if (j.rnd >= 2) { /* each product and the sum rounded to bf16 */
      r = is_b ? rp_bfr(__dadd_rn(rp_bfr(__dmul_rn(-si, ga)), rp_bfr(__dmul_rn(co, gb))))
               : rp_bfr(__dadd_rn(rp_bfr(__dmul_rn(co, ga)), rp_bfr(__dmul_rn(si, gb))));
    } else {
      r = is_b ? __dadd_rn(__dmul_rn(-si, ga), __dmul_rn(co, gb)) : __dadd_rn(__dmul_rn(co, ga), __dmul_rn(si, gb));
    }
    j.out[i] = r;
  }
}

/* backend.h rope_rows. */
int cu_rope_rows(const qc_backend *be, const qc_rope_rows *j) {
  cu *c = C(be);
  int rc = QC_OK;
  if (j->op == QC_ROPE_PROBE) return c->sw[CU_SW_ROPE_HOST] ? 1 : QC_OK; /* 1: switched off, no error set */
  if (j->op != QC_ROPE_ROWS) return qc_err("rope_rows: op %d: expected QC_ROPE_ROWS", j->op);
  if (j->T <= 0 || j->H <= 0 || j->D <= 0) return QC_OK;
  if (j->R < 2 || j->R % 2 || j->R > j->D)
    return qc_err("rope_rows: rotary dims %lld of %lld features: expected even, 2 .. the features", (long long)j->R,
                  (long long)j->D);
  const int64_t nb = (j->T * j->H * j->D + RP_THREADS - 1) / RP_THREADS;
  rp_rows<<<(unsigned)(nb < 65536 ? nb : 65536), RP_THREADS, 0, c->st>>>(*j);
  CK(cudaGetLastError(), "rope reference kernel");
done:
  return rc;
}
