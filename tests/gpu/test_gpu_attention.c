/* test_gpu_attention.c: the attention reference with its rows on the device
 * (reference/attention_dev.c, backend/cuda/attrows.cu) against the host
 * path on the CPU backend (reference/attention_gemm.c), whose loops define
 * the rows: d_q, d_k, d_v, the terms' scale (ab), O and the LSE with its
 * terms, over GQA, MLA's head dims, two blocks of rows, a window over three
 * blocks, a window with a
 * softcap, a causal offset that leaves rows without a key, and no mask.
 * The row sums differ only in order (a tree on the device): agreement to
 * 1e-12 relative. QC_CUDA_ATT_HOST=1 turns the device path down. */
#include "gpu_common.h"
#include "reference/ref_attention.h"
#include "../unit/att_cfgs.h"

/* rel of a against b where both may hold -inf at the same places (the LSE
 * of a row without a key), those compared for equality. */
static double rel_inf(const double *a, const double *b, int64_t n) {
  double d = 0, s = 0;
  for (int64_t i = 0; i < n; i++) {
    if (isinf(b[i]) || isinf(a[i])) {
      cr_expect(a[i] == b[i], "element %lld: %g against %g", (long long)i, a[i], b[i]);
      continue;
    }
    d += (a[i] - b[i]) * (a[i] - b[i]);
    s += b[i] * b[i];
  }
  return sqrt(d) / (s > 0 ? sqrt(s) : 1);
}

Test(gpu_attention, device_rows_match_host, .timeout = 300) {
  const qc_backend *be = gpu_or_skip(), *cpu = qc_backend_cpu();
  for (int c = 0; c < ATT_NCFGS; c++) {
    const att_cfg *f = &g_att_cfgs[c];
    const int64_t nQ = f->B * f->Hq * f->S * f->D, nK = f->B * f->Hkv * f->S * f->D, nV = f->B * f->Hkv * f->S * f->Dv;
    const int64_t nG = f->B * f->Hq * f->S * f->Dv, nL = f->B * f->Hq * f->S;
    double *Q = gpu_randn(nQ, 11 + c, 1.0), *K = gpu_randn(nK, 21 + c, 1.0), *V = gpu_randn(nV, 31 + c, 1.0);
    double *G = gpu_randn(nG, 41 + c, 1.0);
    qc_ref_att a = {.Q = Q, .K = K, .V = V, .G = G, .B = f->B, .Hq = f->Hq, .Hkv = f->Hkv, .S = f->S, .D = f->D, .Dv = f->Dv,
                    .W = f->W, .off = f->off, .sc = 1.0 / sqrt((double)f->D), .cap = f->cap, .causal = f->causal};
    for (int ab = 0; ab < 2; ab++) {
      double *h[3] = {calloc((size_t)nQ, 8), calloc((size_t)nK, 8), calloc((size_t)nV, 8)};
      double *d[3] = {calloc((size_t)nQ, 8), calloc((size_t)nK, 8), calloc((size_t)nV, 8)};
      a.ab = ab;
      a.be = cpu;
      cr_assert_eq(qc_ref_att_vjp(&a, h[0], h[1], h[2]), QC_OK, "%s", qc_err_msg());
      a.be = be;
      cr_assert_eq(qc_ref_att_vjp_dev(&a, d[0], d[1], d[2]), QC_OK, "config %d ab %d: the device path was not taken: %s", c, ab,
                   qc_err_msg());
      const int64_t n[3] = {nQ, nK, nV};
      for (int t = 0; t < 3; t++) {
        const double r = gpu_rel(d[t], h[t], n[t]);
        cr_expect(r < 1e-12, "config %d ab %d %s: device against host %.3g", c, ab, t == 0 ? "d_q" : t == 1 ? "d_k" : "d_v", r);
        free(h[t]);
        free(d[t]);
      }
    }
    a.ab = 0;
    for (int lse = 0; lse < 2; lse++) {
      const int64_t no = lse ? nL : nG;
      double *ho = calloc((size_t)no, 8), *dout = calloc((size_t)no, 8), *ht = calloc((size_t)nL, 8), *dt = calloc((size_t)nL, 8);
      a.be = cpu;
      cr_assert_eq(qc_ref_att_fwd(&a, lse, ho, ht), QC_OK, "%s", qc_err_msg());
      a.be = be;
      cr_assert_eq(qc_ref_att_fwd_dev(&a, lse, dout, dt), QC_OK, "config %d lse %d: the device path was not taken", c, lse);
      const double r = rel_inf(dout, ho, no);
      cr_expect(r < 1e-12, "config %d %s: device against host %.3g", c, lse ? "LSE" : "O", r);
      if (lse) cr_expect(gpu_rel(dt, ht, nL) < 1e-12, "config %d: the LSE's terms differ", c);
      free(ho); free(dout); free(ht); free(dt);
    }
    free(Q); free(K); free(V); free(G);
  }
}

/* The switch sends the reference back to the host path; a read O (the
 * rounded-O Delta) never takes the device path. */
Test(gpu_attention, host_path_when_switched_off_or_o_read) {
  const qc_backend *be = gpu_or_skip();
  const int64_t S = 40, D = 8, n = 2 * S * D;
  double *Q = gpu_randn(n, 1, 1.0), *K = gpu_randn(n, 2, 1.0), *V = gpu_randn(n, 3, 1.0), *G = gpu_randn(n, 4, 1.0);
  double *dq = calloc((size_t)n, 8), *dk = calloc((size_t)n, 8), *dv = calloc((size_t)n, 8);
  qc_ref_att a = {.be = be, .Q = Q, .K = K, .V = V, .G = G, .B = 1, .Hq = 2, .Hkv = 2, .S = S, .D = D, .Dv = D,
                  .sc = 0.35, .causal = 1, .odt = QC_BF16};
  gpu_switch(be, "QC_CUDA_ATT_HOST", 1);
  cr_expect_eq(qc_ref_att_vjp_dev(&a, dq, dk, dv), QC_NA);
  cr_expect_eq(qc_ref_att_fwd_dev(&a, 0, dq, NULL), QC_NA);
  gpu_switch(be, "QC_CUDA_ATT_HOST", 0);
  a.O = V; /* Delta from the saved O in bf16 */
  cr_expect_eq(qc_ref_att_vjp_dev(&a, dq, dk, dv), QC_NA);
  a.O = NULL;
  cr_expect_eq(qc_ref_att_vjp_dev(&a, dq, dk, dv), QC_OK, "%s", qc_err_msg());
  free(Q); free(K); free(V); free(G); free(dq); free(dk); free(dv);
}
