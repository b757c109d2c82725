/* test_gpu_rope.c: the RoPE reference with its rotation on the device
 * (reference/rope_dev.c, backend/cuda/roperows.cu) against its host rows
 * on the CPU backend (reference/rope.c, the definition): the VJP and the
 * forward in float64 and the terms' scale to 1e-13 relative (the device's
 * cos, sin, exp and log differ from the host's by ulps), the bf16 rounding
 * variants (round_ops 1 and 2) equal but for elements on a bf16 rounding
 * boundary: at most 1 in 10^4, each one bf16 step apart. Both layouts, a
 * partial rotary_dim, the inverse rotation, a scale, a position offset, a
 * dumped frequency table (inputs/inv_freq), x and dY stored in float32 and
 * bfloat16. QC_CUDA_ROPE_HOST=1 turns the device path down. */
#include "gpu_common.h"
#include "engine/fd.h"
#include "model/contract.h"
#include "model/module.h"
#include "numerics/decode.h"
#include "numerics/formats.h"
#include "reference/ref_dev.h"

typedef struct {
  int64_t T, H, D, R;
  const char *layout, *inverse;
  double offset, scale;
  int table; /* 1: inputs/inv_freq, a YaRN-like table */
} rope_cfg;

/* Elements where a and b differ; *worst their largest difference relative to |b|. */
static int64_t rope_diffs(const double *a, const double *b, int64_t n, double *worst) {
  int64_t k = 0;
  *worst = 0;
  for (int64_t i = 0; i < n; i++)
    if (a[i] != b[i]) {
      k++;
      const double r = fabs(a[i] - b[i]) / (fabs(b[i]) > 0 ? fabs(b[i]) : 1e-300);
      if (r > *worst) *worst = r;
    }
  return k;
}

/* Device against host: t (the device's) and its host twin u, n values. */
static void rope_expect(const double *t, const double *u, int64_t n, int rounded, size_t c, const char *what) {
  if (!rounded) {
    const double r = gpu_rel(t, u, n);
    cr_expect(r < 1e-13, "config %zu %s: device against host %.3g", c, what, r);
    return;
  }
  double worst;
  const int64_t k = rope_diffs(t, u, n, &worst);
  cr_expect(k * 10000 <= n && worst <= 1.0 / 128, "config %zu %s: %lld of %lld elements differ, by %.3g at most", c, what,
            (long long)k, (long long)n, worst);
}

Test(gpu_rope, device_rotation_matches_host, .timeout = 120) {
  const qc_backend *be = gpu_or_skip(), *cpu = qc_backend_cpu();
  static const rope_cfg cfg[] = {
      {512, 8, 128, 0, "half", "no", 0, 1, 0},          {512, 8, 64, 64, "interleaved", "no", 0, 1, 1},
      {300, 3, 192, 64, "interleaved", "no", 7, 1.2, 1}, {256, 4, 96, 32, "half", "yes", 0, 1, 0},
      {4096, 2, 64, 0, "half", "no", 100000, 1, 0}};
  const int variants[][2] = {{0, 0}, {0, 1}, {1, 0}, {2, 0}}; /* {round_ops, terms} */
  const qc_registry_row *row = qc_registry_find("rope");
  cr_assert(row && row->forward);
  for (size_t c = 0; c < sizeof cfg / sizeof cfg[0]; c++) {
    qc_gen g = {0};
    g.seed = 41 + c;
    g.values = "normal";
    g.shape[g.nshape++] = cfg[c].T;
    g.shape[g.nshape++] = cfg[c].H;
    g.shape[g.nshape++] = cfg[c].D;
    qc_contract k = {0};
    cr_assert_eq(qc_contract_set(&k, "layout", cfg[c].layout, 0, 0), QC_OK);
    cr_assert_eq(qc_contract_set(&k, "inverse", cfg[c].inverse, 0, 0), QC_OK);
    cr_assert_eq(qc_contract_set(&k, "rotary_dim", NULL, (double)cfg[c].R, 1), QC_OK);
    cr_assert_eq(qc_contract_set(&k, "position_offset", NULL, cfg[c].offset, 1), QC_OK);
    cr_assert_eq(qc_contract_set(&k, "scale", NULL, cfg[c].scale, 1), QC_OK);
    qc_module m = {0};
    qc_err_clear();
    cr_assert_eq(qc_fd_instance(row->cls, &g, &k, &m), QC_OK, "%s", qc_err_msg());
    const int64_t R = cfg[c].R ? cfg[c].R : cfg[c].D, half = R / 2;
    if (cfg[c].table) { /* a scaled RoPE's table: theta's frequencies, the low ones divided by 40 */
      qc_tensor f = {0};
      cr_assert_eq(qc_tensor_alloc(&f, "inv_freq", QC_F32, 1, &half), QC_OK);
      for (int64_t j = 0; j < half; j++)
        ((float *)f.data)[j] = (float)(pow(10000.0, -2.0 * (double)j / (double)R) / (j > half / 2 ? 40.0 : 1.0));
      cr_assert_eq(qc_tset_add(&m.inputs, &f), QC_OK);
    }
    qc_tensor dy = {0};
    const qc_tensor *x = qc_tset_get(&m.inputs, "x");
    cr_assert_eq(qc_tensor_alloc(&dy, "dy", c % 2 ? QC_BF16 : QC_F32, x->ndim, x->shape), QC_OK);
    double *gv = gpu_randn(qc_numel(x), 7 + c, 1.0);
    for (int64_t i = 0; i < qc_numel(x); i++) {
      if (dy.dtype == QC_F32) ((float *)dy.data)[i] = (float)gv[i];
      else ((uint16_t *)dy.data)[i] = qc_f32_to_bf16((float)gv[i]);
    }
    free(gv);
    for (int v = 0; v < 4; v++) {
      qc_ctx hc = {.be = cpu, .round_ops = variants[v][0], .terms = variants[v][1]};
      qc_ctx dc = hc;
      dc.be = be;
      qc_tset h = {0}, d = {0};
      cr_assert_eq(row->reference(&hc, &m, &dy, &h), QC_OK, "%s", qc_err_msg());
      cr_assert_eq(row->reference(&dc, &m, &dy, &d), QC_OK, "%s", qc_err_msg());
      const qc_tensor *a = qc_tset_get(&d, "d_x"), *b = qc_tset_get(&h, "d_x");
      cr_assert(a && b && h.n == 1 && d.n == 1, "d_x from both");
      rope_expect(a->data, b->data, qc_numel(b), variants[v][0] && !variants[v][1], c, "d_x");
      qc_tset_free(&h);
      qc_tset_free(&d);
      if (v == 1) continue; /* the forward has no terms' variant */
      qc_tensor yh = {0}, yd = {0};
      qc_tol_model th, td;
      cr_assert_eq(row->forward(&hc, &m, &yh, &th), QC_OK, "%s", qc_err_msg());
      cr_assert_eq(row->forward(&dc, &m, &yd, &td), QC_OK, "%s", qc_err_msg());
      rope_expect(yd.data, yh.data, qc_numel(&yh), variants[v][0] != 0, c, "y");
      qc_tensor_free(&yh);
      qc_tensor_free(&yd);
    }
    { /* the device path itself is taken on this instance (not host against host), and rotates: the
       * VJP of the forward's output is the input again */
      const int64_t n = qc_numel(x), T = cfg[c].T;
      const qc_tensor *pt = qc_tset_get(&m.inputs, "positions");
      int64_t *p = malloc((size_t)T * 8);
      double *y = malloc((size_t)n * 8), *back = malloc((size_t)n * 8), *xv = malloc((size_t)n * 8);
      for (int64_t t = 0; t < T; t++) p[t] = ((const int64_t *)pt->data)[t];
      cr_assert_eq(qc_tensor_to_f64(x, xv), QC_OK);
      const qc_rope_rows j = {.inter = strcmp(cfg[c].layout, "interleaved") == 0, .fwd = 1, .T = T, .H = cfg[c].H,
                              .D = cfg[c].D, .R = R, .s = 1, .off = cfg[c].offset, .k = 1, .theta = 10000};
      cr_assert_eq(qc_ref_rope_dev(be, j, x, p, NULL, y), QC_OK, "config %zu: the device path was not taken: %s", c,
                   qc_err_msg());
      qc_tensor yt = {0};
      cr_assert_eq(qc_tensor_alloc(&yt, "y", QC_F64, x->ndim, x->shape), QC_OK);
      memcpy(yt.data, y, (size_t)n * 8);
      qc_rope_rows jb = j;
      jb.fwd = 0;
      cr_assert_eq(qc_ref_rope_dev(be, jb, &yt, p, NULL, back), QC_OK, "%s", qc_err_msg());
      cr_expect(gpu_rel(back, xv, n) < 1e-13, "config %zu: Q(phi)^T Q(phi) x is x: %.3g", c, gpu_rel(back, xv, n));
      qc_tensor_free(&yt);
      free(p); free(y); free(back); free(xv);
    }
    qc_tensor_free(&dy);
    qc_module_free(&m);
  }
}

/* The switch turns the device path down (QC_NA, no error set), and back on. */
Test(gpu_rope, host_path_when_switched_off) {
  const qc_backend *be = gpu_or_skip();
  qc_tensor x = {0};
  const int64_t shape[] = {2, 1, 4};
  cr_assert_eq(qc_tensor_alloc(&x, "x", QC_F32, 3, shape), QC_OK);
  for (int i = 0; i < 8; i++) ((float *)x.data)[i] = (float)(i + 1);
  const int64_t p[2] = {0, 3};
  double out[8];
  const qc_rope_rows j = {.fwd = 1, .T = 2, .H = 1, .D = 4, .R = 4, .s = 1, .k = 1, .theta = 10000};
  gpu_switch(be, "QC_CUDA_ROPE_HOST", 1);
  qc_err_clear();
  cr_expect_eq(qc_ref_rope_dev(be, j, &x, p, NULL, out), QC_NA);
  cr_expect_eq(qc_err_msg()[0], 0, "no error set: %s", qc_err_msg());
  gpu_switch(be, "QC_CUDA_ROPE_HOST", 0);
  cr_expect_eq(qc_ref_rope_dev(be, j, &x, p, NULL, out), QC_OK, "%s", qc_err_msg());
  for (int t = 0; t < 2; t++)
    for (int q = 0; q < 2; q++) { /* half layout: (a, b) = (q, q + 2), phi = p theta^(-q/2) */
      const double phi = (double)p[t] * pow(10000.0, -(double)q / 2.0), a = t * 4 + q + 1, b = t * 4 + q + 3;
      const double ea = cos(phi) * a - sin(phi) * b, eb = sin(phi) * a + cos(phi) * b;
      cr_expect(fabs(out[t * 4 + q] - ea) <= 1e-13 && fabs(out[t * 4 + q + 2] - eb) <= 1e-13, "token %d pair %d", t, q);
    }
  cr_expect_eq(qc_ref_rope_dev(qc_backend_cpu(), j, &x, p, NULL, out), QC_NA, "the CPU backend has no device");
  qc_tensor_free(&x);
}
