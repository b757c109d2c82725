/* quant.cu: quantizers on the device (kernels/quant.cu, every producer
 * path), widening to float64, fake-quant to float64, and the conformance
 * of the GPU's approximate arithmetic with the host's emulation. */
#include <cublasLt.h>
#include <cublas_v2.h>
#include <cuda_runtime.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend/cuda/cuda_priv.h"

/* Format name -> kernel format, and the producer path's recipes into *a
 * (profile NULL: vllm), with the backend's QC_CUDA_QK_SCALAR switch;
 * QC_EINPUT for an unknown format or profile. */
int cu_qfmt(const cu *c, const char *fmt, const char *profile, qk_qargs *a) {
  static const struct { const char *n; qk_fmt f; } t[] = {
      {"none", QK_NONE}, {"fp8_tensor", QK_FP8_TENSOR}, {"fp8_token", QK_FP8_ROW}, {"fp8_channel", QK_FP8_ROW},
      {"fp8_group128", QK_FP8_GROUP128}, {"fp8_group128_ue8m0", QK_FP8_GROUP128_UE8M0},
      {"fp8_block128", QK_FP8_BLOCK128}, {"fp8_block128_ue8m0", QK_FP8_BLOCK128_UE8M0}, {"nvfp4", QK_NVFP4},
      {"mxfp8", QK_MXFP8}, {"mxfp4", QK_MXFP4}};
  qc_qfmt f;
  qc_qprof p = QC_QP_VLLM;
  if (profile && qc_qprof_parse(profile, &p)) return QC_EINPUT;
  a->scalar = c->sw[CU_SW_QK_SCALAR];
  for (size_t i = 0; i < sizeof t / sizeof t[0]; i++)
    if (strcmp(fmt, t[i].n) == 0) {
      a->fmt = t[i].f;
      if (a->fmt != QK_NONE && qc_qfmt_parse(fmt, &f) == QC_OK) a->two_stage = qc_qrecipe(f, p, &a->rc, &a->rc2);
      return QC_OK;
    }
  return qc_err("%s: quantizer format '%s' is not known", c->name, fmt);
}

/* backend.h quantize: a host float32 matrix through kernels/quant.cu; every
 * non-NULL output of q filled; non-finite input refused. */
int cu_quantize(const qc_backend *be, const char *fmt, const char *profile, int64_t rows, int64_t cols,
                       const float *in, qc_qout *q) {
  cu *c = C(be);
  int rc, packed = 0;
  int64_t gr, gc, sr, sc;
  qk_qargs a;
  void *din = NULL, *ddeq = NULL, *dq = NULL, *ds = NULL, *dsb = NULL;
  size_t n = (size_t)(rows * cols), nq = 0, ns = 0;
  uint32_t s[4];
  memset(&a, 0, sizeof a);
  if ((rc = cu_qfmt(c, fmt, profile, &a))) return rc;
  if (a.fmt == QK_NONE) return qc_err("%s: quantize needs a format, not 'none'", c->name);
  if ((rc = qc_qlayout(fmt, rows, cols, &gr, &gc, &sr, &sc, &packed))) return rc;
  nq = packed ? (size_t)(rows * ((cols + 1) / 2)) : n;
  ns = (size_t)(sr * sc);
  if ((rc = cu_dalloc(c, n * 4, "quantizer input", &din)) || (q->deq && (rc = cu_dalloc(c, n * 4, "dequantized", &ddeq))) ||
      (q->q && (rc = cu_dalloc(c, nq, "payload", &dq))) || (q->scale && (rc = cu_dalloc(c, ns * 4, "scales", &ds))) ||
      (q->scale_b && (rc = cu_dalloc(c, ns, "scale bytes", &dsb))))
    goto done;
  CK(cudaMemcpyAsync(din, in, n * 4, cudaMemcpyHostToDevice, c->st), "upload quantizer input");
  a.rows = rows;
  a.cols = cols;
  a.in = din;
  a.deq = (float *)ddeq;
  a.q = (uint8_t *)dq;
  a.scale = (float *)ds;
  a.scale_b = (uint8_t *)dsb;
  a.scratch = c->qscratch;
  CK((cudaError_t)qk_quantize(&a, c->st), "quantizer kernel");
  if (q->deq) CK(cudaMemcpyAsync(q->deq, ddeq, n * 4, cudaMemcpyDeviceToHost, c->st), "download dequantized");
  if (q->q) CK(cudaMemcpyAsync(q->q, dq, nq, cudaMemcpyDeviceToHost, c->st), "download payload");
  if (q->scale) CK(cudaMemcpyAsync(q->scale, ds, ns * 4, cudaMemcpyDeviceToHost, c->st), "download scales");
  if (q->scale_b) CK(cudaMemcpyAsync(q->scale_b, dsb, ns, cudaMemcpyDeviceToHost, c->st), "download scale bytes");
  CK(cudaMemcpyAsync(s, c->qscratch, sizeof s, cudaMemcpyDeviceToHost, c->st), "download global scale");
  CK(cudaStreamSynchronize(c->st), "quantizer");
  if (s[1]) { /* the kernel counted non-finite input: read at the one sync */
    rc = qc_err("quantizer input: %u non-finite value(s): a quantizer never maps NaN or Inf silently", s[1]);
    goto done;
  }
  {
    float g;
    memcpy(&g, &s[2], 4);
    q->gscale = a.fmt == QK_NVFP4 ? g : 0.0f;
  }
done:
  rc = cu_keep(c, rc, cudaFree(din), "cudaFree");
  rc = cu_keep(c, rc, cudaFree(ddeq), "cudaFree");
  rc = cu_keep(c, rc, cudaFree(dq), "cudaFree");
  rc = cu_keep(c, rc, cudaFree(ds), "cudaFree");
  rc = cu_keep(c, rc, cudaFree(dsb), "cudaFree");
  return rc;
}


int cu_to_f64(const qc_backend *be, qc_dtype dt, const void *src, int64_t n, double *dst) {
  cu *c = C(be);
  int rc = QC_OK, k = cu_tkind(dt);
  if (k < 0) return qc_err("%s: cannot convert element type %s to a float", c->name, qc_dtype_name(dt));
  CK((cudaError_t)qk_to_f64(k, src, dst, n, c->st), "convert to float64");
done:
  return rc;
}

int cu_fake_quant_f64(const qc_backend *be, const char *fmt, const char *profile, int64_t rows, int64_t cols,
                             qc_dtype dt, const void *src, float *scratch, double *dst, const char *what) {
  cu *c = C(be);
  int rc = QC_OK, k = cu_tkind(dt);
  qk_qargs q;
  memset(&q, 0, sizeof q);
  if (k < 0) return qc_err("%s: cannot quantize element type %s", c->name, qc_dtype_name(dt));
  (void)what;
  if ((rc = cu_qfmt(c, fmt, profile, &q))) return rc;
  if (q.fmt == QK_NONE) return qc_err("%s: fake_quant_f64 needs a format, not 'none'", c->name);
  q.rows = rows;
  q.cols = cols;
  q.in = src;
  q.in_bf16 = dt == QC_BF16;
  if (dt == QC_F64 || dt == QC_F16) {
    CK((cudaError_t)qk_to_f32(k, src, scratch, rows * cols, c->st), "convert to float32");
    q.in = scratch;
  }
  q.deq_f64 = dst;
  q.scratch = c->qscratch;
  CK((cudaError_t)qk_quantize(&q, c->st), "quantizer kernel");
done:
  return rc;
}
