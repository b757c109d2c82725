/* bench.cu: the hooks bench/, the conformance driver and the GPU test use
 * (cuda.h): the parts of a linear audit timed alone, the FP8 conversion
 * sweep, the device's name, the fast reference against DGEMM. */
#include <cublasLt.h>
#include <cublas_v2.h>
#include <cuda_runtime.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend/cuda/cuda_priv.h"

extern "C" int qc_cuda_bench_parts(const qc_backend *be, const qc_linear_audit *a, int reps, qc_cuda_bench *r) {
  cu *c = C(be);
  int rc = QC_OK;
  const int64_t M = a->M, K = a->K, N = a->N;
  const size_t mk = (size_t)(M * K), nk = (size_t)(N * K);
  void *dst = NULL;
  lin_bufs bu;
  double *wq64, *x64, *dy64, *rx, *rw;
  uint16_t *cx, *cw;
  float *t = NULL;
  if (!c->arena || c->arena_bytes < qc_linear_audit_bytes(M, K, N)) return qc_err("bench: run the audit first");
  cu_lin_layout(c, M, K, N, &bu);
  wq64 = bu.wq64; x64 = bu.x64; dy64 = bu.dy64; rx = bu.rx; rw = bu.rw;
  cx = bu.cx; cw = bu.cw;
  if (!(t = (float *)calloc((size_t)reps * 4, sizeof *t))) return qc_err_sys("bench: out of memory");
  /* copy bandwidth on 1 GiB (several times the L2 at any shape); the
   * metrics pass on the larger of the two gradients */
  if ((rc = cu_dalloc(c, (size_t)2 << 30, "copy-bandwidth buffers", &dst))) goto done;
  for (int i = 0; i < reps; i++) {
    CK(cudaEventRecord(c->ev[0], c->st), "event");
    if ((rc = cu_dgemm_dev(c, QC_OP_N, QC_OP_N, M, K, N, dy64, N, wq64, K, rx, K)) ||
        (rc = cu_dgemm_dev(c, QC_OP_T, QC_OP_N, N, K, M, dy64, N, x64, K, rw, K)))
      goto done;
    CK(cudaEventRecord(c->ev[1], c->st), "event");
    if ((rc = cu_lt_gemm(c, QC_OP_N, QC_OP_N, M, K, N, a->dy, N, a->w, K, cx, K, CUDA_R_16BF)) ||
        (rc = cu_lt_gemm(c, QC_OP_T, QC_OP_N, N, K, M, a->dy, N, a->x, K, cw, K, CUDA_R_16BF)))
      goto done;
    CK(cudaEventRecord(c->ev[2], c->st), "event");
    CK(cudaMemcpyAsync((char *)dst + ((size_t)1 << 30), dst, (size_t)1 << 30, cudaMemcpyDeviceToDevice, c->st), "device copy");
    CK(cudaEventRecord(c->ev[3], c->st), "event");
    if ((rc = mk >= nk ? cu_metrics_dev(c, cx, 1, rx, (int64_t)mk, 0, NULL) : cu_metrics_dev(c, cw, 1, rw, (int64_t)nk, 0, NULL)))
      goto done;
    CK(cudaEventRecord(c->ev[4], c->st), "event");
    CK(cudaEventSynchronize(c->ev[4]), "bench");
    for (int f = 0; f < 4; f++) {
      double ms;
      if ((rc = cu_ev_ms(c, c->ev[f], c->ev[f + 1], &ms))) goto done;
      t[4 * i + f] = (float)ms;
    }
  }
  /* medians */
  for (int f = 0; f < 4; f++) {
    float v[64] = {0};
    int n = reps < 64 ? reps : 64;
    for (int i = 0; i < n; i++) v[i] = t[4 * i + f];
    for (int i = 1; i < n; i++)
      for (int j = i; j > 0 && v[j] < v[j - 1]; j--) { float x = v[j]; v[j] = v[j - 1]; v[j - 1] = x; }
    double med = n ? v[n / 2] : 0;
    if (f == 0) r->ms_dgemm2 = med;
    if (f == 1) r->ms_bf16x2 = med;
    if (f == 2) r->copy_gbs = 2.0 * (double)((size_t)1 << 30) / (med * 1e6);
    if (f == 3) { r->ms_metrics = med; r->metrics_gbs = (double)(mk >= nk ? mk : nk) * 10 / (med * 1e6); }
  }
  r->dgemm_tflops = 2.0 * 2.0 * (double)M * (double)N * (double)K / (r->ms_dgemm2 * 1e9);
  r->bf16_tflops = 2.0 * 2.0 * (double)M * (double)N * (double)K / (r->ms_bf16x2 * 1e9);
done:
  rc = cu_keep(c, rc, cudaFree(dst), "cudaFree");
  free(t);
  return rc;
}

extern "C" int qc_cuda_fp8_conformance(const qc_backend *be, int kind, uint8_t *host_chunk, uint64_t start,
                                       uint64_t count, unsigned long long *mismatches) {
  cu *c = C(be);
  int rc = QC_OK;
  void *d = NULL;
  unsigned long long *dm = NULL;
  if (host_chunk && (rc = cu_dalloc(c, count, "conformance bytes", &d))) goto done;
  if ((rc = cu_dalloc(c, sizeof *dm, "conformance counter", (void **)&dm))) goto done;
  CK(cudaMemsetAsync(dm, 0, sizeof *dm, c->st), "memset");
  CK((cudaError_t)qk_fp8_conform(start, count, kind, (uint8_t *)d, dm, c->st), "conformance kernel");
  CK(cudaMemcpyAsync(mismatches, dm, sizeof *dm, cudaMemcpyDeviceToHost, c->st), "download");
  if (host_chunk) CK(cudaMemcpyAsync(host_chunk, d, count, cudaMemcpyDeviceToHost, c->st), "download bytes");
  CK(cudaStreamSynchronize(c->st), "conformance");
done:
  rc = cu_keep(c, rc, cudaFree(d), "cudaFree");
  rc = cu_keep(c, rc, cudaFree(dm), "cudaFree");
  return rc;
}

extern "C" int qc_cuda_parith_conformance(const qc_backend *be, unsigned long long mism[2], unsigned first[2]) {
  cu *c = C(be);
  int rc = QC_OK;
  uint32_t nexc = 0;
  const uint32_t *exc = qc_ceil2log_list(&nexc);
  void *tab = NULL, *dexc = NULL, *dm = NULL;
  const unsigned none[2] = {0xffffffffu, 0xffffffffu};
  if ((rc = cu_dalloc(c, (size_t)1 << 21, "rcp.approx table", &tab)) ||
      (rc = cu_dalloc(c, (size_t)(nexc + 1) * 4, "ceil2_log list", &dexc)) ||
      (rc = cu_dalloc(c, 2 * sizeof(unsigned long long) + 2 * sizeof(unsigned), "conformance counters", &dm)))
    goto done;
  CK(cudaMemcpyAsync(tab, qc_rcpa_table2(), (size_t)1 << 21, cudaMemcpyHostToDevice, c->st), "upload rcp.approx table");
  CK(cudaMemcpyAsync(dexc, exc, (size_t)nexc * 4, cudaMemcpyHostToDevice, c->st), "upload ceil2_log list");
  CK(cudaMemsetAsync(dm, 0, 2 * sizeof(unsigned long long), c->st), "memset");
  CK(cudaMemcpyAsync((char *)dm + 16, none, sizeof none, cudaMemcpyHostToDevice, c->st), "upload");
  for (uint64_t s = 0; s < (1ull << 32); s += 1ull << 30)
    CK((cudaError_t)qk_parith_conform(s, 1ull << 30, (const uint8_t *)tab, (const uint32_t *)dexc, nexc,
                                      (unsigned long long *)dm, (unsigned *)((char *)dm + 16), c->st), "conformance kernel");
  CK(cudaMemcpyAsync(mism, dm, 16, cudaMemcpyDeviceToHost, c->st), "download");
  CK(cudaMemcpyAsync(first, (char *)dm + 16, 8, cudaMemcpyDeviceToHost, c->st), "download");
  CK(cudaStreamSynchronize(c->st), "conformance");
done:
  rc = cu_keep(c, rc, cudaFree(tab), "cudaFree");
  rc = cu_keep(c, rc, cudaFree(dexc), "cudaFree");
  rc = cu_keep(c, rc, cudaFree(dm), "cudaFree");
  return rc;
}

extern "C" const char *qc_cuda_device_name(const qc_backend *be, char *buf, size_t n) {
  cudaDeviceProp pr;
  if (cudaGetDeviceProperties(&pr, C(be)->dev) != cudaSuccess) snprintf(buf, n, "?");
  else snprintf(buf, n, "%s (sm_%d%d, %d SMs, %.1f GiB)", pr.name, pr.major, pr.minor, pr.multiProcessorCount, pr.totalGlobalMem / GiB);
  return buf;
}

/* ---- the benchmark hook (cuda.h) -------------------------------------------- */

/* The fast reference of the audit `a` against DGEMM, after audit_linear of
 * the same shape ran with the float64 reference (its X, dY, W_ref in float64
 * and its references are still in the arena). */
extern "C" int qc_cuda_bench_ref(const qc_backend *be, const qc_linear_audit *a, int slices, int reps,
                                 qc_cuda_ref_bench *r) {
  cu *c = C(be);
  int rc = QC_OK;
  const int64_t M = a->M, K = a->K, N = a->N;
  const size_t mk = (size_t)(M * K), nk = (size_t)(N * K);
  lin_bufs bu;
  double *fx = NULL, *fw = NULL;
  float *t = NULL;
  qk_msum ms[2];
  memset(r, 0, sizeof *r);
  if (!c->arena || c->arena_bytes < qc_linear_audit_bytes(M, K, N)) return qc_err("bench: run the audit first");
  if (reps < 1 || reps > 64) return qc_err("bench: reps in 1..64");
  cu_lin_layout(c, M, K, N, &bu);
  if ((rc = cu_oz_small(c)) || (rc = cu_dalloc(c, mk * 8, "fast d_x reference", (void **)&fx)) ||
      (rc = cu_dalloc(c, nk * 8, "fast d_weight reference", (void **)&fw)))
    goto done;
  if (!(t = (float *)calloc((size_t)reps * 3, sizeof *t))) {
    rc = qc_err_sys("bench: out of memory");
    goto done;
  }
  for (int i = 0; i < reps; i++) {
    CK(cudaEventRecord(c->ev[0], c->st), "event");
    if ((rc = cu_dgemm_dev(c, QC_OP_N, QC_OP_N, M, K, N, bu.dy64, N, bu.wq64, K, bu.rx, K)) ||
        (rc = cu_dgemm_dev(c, QC_OP_T, QC_OP_N, N, K, M, bu.dy64, N, bu.x64, K, bu.rw, K)))
      goto done;
    CK(cudaEventRecord(c->ev[1], c->st), "event");
    if ((rc = cu_ozaki_gemm(c, 0, c->st, QC_OP_N, QC_OP_N, M, K, N, bu.dy64, N, bu.wq64, K, fx, K, slices, NULL, cu_oz_flag(c, 0))) ||
        (rc = cu_ozaki_gemm(c, 1, c->st, QC_OP_T, QC_OP_N, N, K, M, bu.dy64, N, bu.x64, K, fw, K, slices, NULL, cu_oz_flag(c, 1))))
      goto done;
    CK(cudaEventRecord(c->ev[2], c->st), "event");
    CK((cudaError_t)qk_oz_check(bu.dy64, N, 1, bu.wq64, K, 1, fx, K, M, K, N, CU_OZ_NS, cu_oz_scratch(c, 0), cu_oz_res(c, 0), c->st),
       "self-check");
    CK((cudaError_t)qk_oz_check(bu.dy64, 1, N, bu.x64, K, 1, fw, K, N, K, M, CU_OZ_NS, cu_oz_scratch(c, 1), cu_oz_res(c, 1), c->st),
       "self-check");
    CK(cudaEventRecord(c->ev[3], c->st), "event");
    CK(cudaEventSynchronize(c->ev[3]), "bench");
    for (int f = 0; f < 3; f++) {
      double ms;
      if ((rc = cu_ev_ms(c, c->ev[f], c->ev[f + 1], &ms))) goto done;
      t[3 * i + f] = (float)ms;
    }
  }
  for (int f = 0; f < 3; f++) {
    float v[64] = {0};
    for (int i = 0; i < reps; i++) v[i] = t[3 * i + f];
    for (int i = 1; i < reps; i++)
      for (int j = i; j > 0 && v[j] < v[j - 1]; j--) { float x = v[j]; v[j] = v[j - 1]; v[j - 1] = x; }
    (f == 0 ? r->ms_dgemm2 : f == 1 ? r->ms_fast2 : r->ms_check2) = v[reps / 2];
  }
  /* the fast references against DGEMM's: the metrics pass with g = fast (float64) */
  CK((cudaError_t)qk_metrics(fx, 0, bu.rx, (int64_t)mk, c->mscratch, c->mres, c->st), "compare d_x references");
  CK((cudaError_t)qk_metrics(fw, 0, bu.rw, (int64_t)nk, c->mscratch, c->mres + 1, c->st), "compare d_weight references");
  CK(cudaMemcpyAsync(ms, c->mres, sizeof ms, cudaMemcpyDeviceToHost, c->st), "download");
  CK(cudaMemcpyAsync(c->oz.host, c->oz.dev, 8 * sizeof(double) + 2 * sizeof(unsigned), cudaMemcpyDeviceToHost, c->st), "download");
  CK(cudaStreamSynchronize(c->st), "bench");
  for (int s = 0; s < 2; s++) {
    const double *h = c->oz.host + 4 * s;
    const double nrm = fmax(sqrt(h[2]), QC_EPS_NORM);
    r->max_abs[s] = ms[s].mx < 0 ? 0 : ms[s].mx;
    r->rel_l2[s] = qc_rel_l2_sums(ms[s].sd, ms[s].sr);
    r->norm_ref[s] = sqrt(ms[s].sr);
    r->check_err[s] = h[0];
    r->check_err_norm[s] = sqrt(h[1]) / nrm;
    r->check_noise_floor[s] = sqrt(h[3]) / nrm;
    r->nonfinite[s] = ((const unsigned *)(c->oz.host + 8))[s];
  }
  r->fast_tops = 2.0 * 2.0 * (double)M * (double)N * (double)K / (r->ms_fast2 * 1e9);
done:
  rc = cu_keep(c, rc, cudaFree(fx), "cudaFree");
  rc = cu_keep(c, rc, cudaFree(fw), "cudaFree");
  free(t);
  return rc;
}

/* The GPU test's hook (cuda.h): C = op(A) op(B) on device buffers by the
 * fast reference with `slices` slices (0: DGEMM) and its self-check; waits. */
extern "C" int qc_cuda_ref_gemm(const qc_backend *be, int slices, qc_op ta, qc_op tb, int64_t m, int64_t n, int64_t k,
                                const double *A, int64_t lda, const double *B, int64_t ldb, double *Cm, int64_t ldc,
                                double check[4], unsigned *nonfinite) {
  cu *c = C(be);
  int rc = QC_OK;
  memset(check, 0, 4 * sizeof *check);
  *nonfinite = 0;
  if (slices <= 0) return (rc = cu_gemm_f64_buf(be, ta, tb, m, n, k, A, lda, B, ldb, Cm, ldc)) ? rc : cu_sync(be);
  if ((rc = cu_oz_small(c)) ||
      (rc = cu_ozaki_gemm(c, 0, c->st, ta, tb, m, n, k, A, lda, B, ldb, Cm, ldc, slices, cu_oz_res(c, 0), cu_oz_flag(c, 0))))
    return rc;
  CK(cudaMemcpyAsync(c->oz.host, c->oz.dev, 8 * sizeof(double) + 2 * sizeof(unsigned), cudaMemcpyDeviceToHost, c->st),
     "download the self-check");
  CK(cudaStreamSynchronize(c->st), "the fast reference");
  memcpy(check, c->oz.host, 4 * sizeof *check);
  *nonfinite = ((const unsigned *)(c->oz.host + 8))[0];
done:
  return rc;
}
