/* test_gpu_conv1d.c: the conv1d reference with its sums on the device
 * (reference/conv1d_dev.c, backend/cuda/convrows.cu) against its host
 * loop on the CPU backend (reference/conv1d.c, the definition): d_x,
 * d_weight and d_bias, and their terms' scale, equal byte for byte (each
 * sum in the host's order, nothing fused), with and without a bias, K from
 * 1 to 4 and 16 (float32 weights: d_x's terms round, so a sum in another
 * order shows), a sequence shorter than the kernel, dY stored in float32
 * and bfloat16, "special" values (+-3e4, 1e-30). QC_CUDA_CONV_HOST=1 turns
 * the device path down. */
#include "gpu_common.h"
#include "engine/fd.h"
#include "model/contract.h"
#include "model/module.h"
#include "numerics/formats.h"
#include "reference/ref_dev.h"

Test(gpu_conv1d, device_sums_are_the_host_s, .timeout = 120) {
  const qc_backend *be = gpu_or_skip(), *cpu = qc_backend_cpu();
  static const struct { int64_t B, L, C, K, bias, f32; const char *values; } cfg[] = {
      {2, 512, 256, 4, 1, 0, "normal"}, {1, 1000, 96, 1, 0, 0, "normal"}, {3, 3, 64, 4, 1, 0, "normal"},
      {2, 300, 130, 2, 0, 0, "special"}, {2, 256, 128, 3, 1, 0, "special"}, {2, 400, 64, 16, 1, 1, "normal"}};
  const qc_registry_row *row = qc_registry_find("conv1d");
  cr_assert(row);
  for (size_t c = 0; c < sizeof cfg / sizeof cfg[0]; c++) {
    qc_gen g = {0};
    g.seed = 51 + c;
    g.values = cfg[c].values;
    g.shape[g.nshape++] = cfg[c].B;
    g.shape[g.nshape++] = cfg[c].L;
    g.shape[g.nshape++] = cfg[c].C;
    g.shape[g.nshape++] = cfg[c].K;
    if (!cfg[c].bias) g.shape[g.nshape++] = 0;
    qc_contract k = {0};
    qc_module m = {0};
    qc_err_clear();
    cr_assert_eq(qc_fd_instance(row->cls, &g, &k, &m), QC_OK, "%s", qc_err_msg());
    const qc_tensor *x = qc_tset_get(&m.inputs, "x");
    for (int i = 0; cfg[c].f32 && i < m.params.n; i++) /* float32 weights: d_x's 16 terms each round, so their order shows */
      if (strcmp(m.params.t[i].name, "weight") == 0) {
        const int64_t ws[2] = {cfg[c].C, cfg[c].K};
        double *wv = gpu_randn(cfg[c].C * cfg[c].K, 77, 0.25);
        qc_tensor_free(&m.params.t[i]);
        cr_assert_eq(qc_tensor_alloc(&m.params.t[i], "weight", QC_F32, 2, ws), QC_OK);
        for (int64_t e = 0; e < cfg[c].C * cfg[c].K; e++) ((float *)m.params.t[i].data)[e] = (float)wv[e];
        free(wv);
      }
    qc_tensor dy = {0};
    cr_assert_eq(qc_tensor_alloc(&dy, "dy", c % 2 ? QC_BF16 : QC_F32, x->ndim, x->shape), QC_OK);
    double *gv = gpu_randn(qc_numel(x), 13 + c, 1.0);
    for (int64_t i = 0; i < qc_numel(x); i++) {
      if (dy.dtype == QC_F32) ((float *)dy.data)[i] = (float)gv[i];
      else ((uint16_t *)dy.data)[i] = qc_f32_to_bf16((float)gv[i]);
    }
    free(gv);
    for (int ab = 0; ab < 2; ab++) {
      qc_ctx hc = {.be = cpu, .terms = ab}, dc = {.be = be, .terms = ab};
      qc_tset h = {0}, d = {0};
      cr_assert_eq(row->reference(&hc, &m, &dy, &h), QC_OK, "%s", qc_err_msg());
      cr_assert_eq(row->reference(&dc, &m, &dy, &d), QC_OK, "%s", qc_err_msg());
      cr_assert_eq(h.n, d.n);
      cr_assert_eq(h.n, cfg[c].bias ? 3 : 2);
      for (int t = 0; t < h.n; t++) {
        const qc_tensor *a = &d.t[t], *b = qc_tset_get(&h, a->name);
        cr_assert(b, "%s only on the device", a->name);
        cr_expect(memcmp(a->data, b->data, (size_t)qc_numel(b) * 8) == 0, "config %zu ab %d %s: not the host's bytes (rel %.3g)",
                  c, ab, a->name, gpu_rel(a->data, b->data, qc_numel(b)));
      }
      qc_tset_free(&h);
      qc_tset_free(&d);
    }
    { /* the device path itself is taken on this instance (not host against host) */
      const qc_tensor *w = qc_tset_get(&m.params, "weight");
      const int64_t n = qc_numel(x);
      double *dx = malloc((size_t)n * 8), *dw = malloc((size_t)qc_numel(w) * 8), db[1024];
      const qc_conv_rows j = {.B = cfg[c].B, .L = cfg[c].L, .C = cfg[c].C, .K = cfg[c].K};
      cr_assert_eq(qc_ref_conv_dev(be, j, x, w, &dy, dx, dw, cfg[c].bias ? db : NULL), QC_OK,
                   "config %zu: the device path was not taken: %s", c, qc_err_msg());
      free(dx); free(dw);
    }
    qc_tensor_free(&dy);
    qc_module_free(&m);
  }
}

/* The switch turns the device path down (QC_NA, no error set), and back
 * on; the sums against ones written out here. */
Test(gpu_conv1d, host_path_when_switched_off) {
  const qc_backend *be = gpu_or_skip();
  qc_tensor x = {0}, w = {0}, dy = {0};
  const int64_t xs[] = {1, 5, 2}, ws[] = {2, 3};
  cr_assert_eq(qc_tensor_alloc(&x, "x", QC_F32, 3, xs), QC_OK);
  cr_assert_eq(qc_tensor_alloc(&dy, "dy", QC_F32, 3, xs), QC_OK);
  cr_assert_eq(qc_tensor_alloc(&w, "weight", QC_F32, 2, ws), QC_OK);
  for (int i = 0; i < 10; i++) ((float *)x.data)[i] = (float)(i + 1), ((float *)dy.data)[i] = 1.0f;
  for (int i = 0; i < 6; i++) ((float *)w.data)[i] = (float)(i + 1);
  double dx[10], dw[6], db[2];
  const qc_conv_rows j = {.B = 1, .L = 5, .C = 2, .K = 3};
  gpu_switch(be, "QC_CUDA_CONV_HOST", 1);
  qc_err_clear();
  cr_expect_eq(qc_ref_conv_dev(be, j, &x, &w, &dy, dx, dw, db), QC_NA);
  cr_expect_eq(qc_err_msg()[0], 0, "no error set: %s", qc_err_msg());
  gpu_switch(be, "QC_CUDA_CONV_HOST", 0);
  cr_expect_eq(qc_ref_conv_dev(be, j, &x, &w, &dy, dx, dw, db), QC_OK, "%s", qc_err_msg());
  for (int c = 0; c < 2; c++) {
    cr_expect_eq(db[c], 5.0, "d_bias[%d] sums the five outputs' dY", c);
    for (int s = 0; s < 5; s++) { /* dY 1: d_x[s] sums the taps k with t = s + K - 1 - k < L */
      double e = 0;
      for (int k = 0; k < 3; k++)
        if (s + 2 - k < 5) e += ((float *)w.data)[c * 3 + k];
      cr_expect_eq(dx[s * 2 + c], e, "d_x[%d, %d]", s, c);
    }
    for (int k = 0; k < 3; k++) { /* d_weight[c, k] sums x[s] over s = t - 2 + k >= 0, t < 5 */
      double e = 0;
      for (int t = 2 - k; t < 5; t++) e += ((float *)x.data)[(t - 2 + k) * 2 + c];
      cr_expect_eq(dw[c * 3 + k], e, "d_weight[%d, %d]", c, k);
    }
  }
  cr_expect_eq(qc_ref_conv_dev(qc_backend_cpu(), j, &x, &w, &dy, dx, dw, db), QC_NA, "the CPU backend has no device");
  qc_tensor_free(&x);
  qc_tensor_free(&w);
  qc_tensor_free(&dy);
}
