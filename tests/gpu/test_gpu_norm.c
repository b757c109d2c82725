/* test_gpu_norm.c: the RMSNorm / LayerNorm reference with its passes on the
 * device (reference/norm_dev.c, backend/cuda/normrows.cu) against its host
 * loops on the CPU backend (reference/rmsnorm.c, their definition): d_x,
 * d_weight and d_bias over a row of 4096, unaligned widths, Gemma's
 * zero-centered scale, a LayerNorm without bias, and x and dY stored in
 * float32, bfloat16, float16 and float64 (uploaded as stored, widened on
 * the device). The rows' sums differ only in order (a tree on the device):
 * agreement to 1e-12 relative. QC_CUDA_NORM_HOST=1 turns the device path
 * down. */
#include "gpu_common.h"
#include "engine/fd.h"
#include "model/contract.h"
#include "model/module.h"
#include "numerics/decode.h"
#include "numerics/formats.h"
#include "reference/ref_classes.h"

/* A generated instance of cls [shape] (seed; zero-centered for RMSNorm when
 * zc) with x and a N(0, 1) dY stored as dt. */
static void norm_instance(const char *cls, const int64_t *shape, int nshape, uint64_t seed, int zc, qc_dtype dt, qc_module *m,
                          qc_tensor *dy) {
  const qc_registry_row *row = qc_registry_find(cls);
  cr_assert(row, "class %s registered", cls);
  qc_gen g = {0};
  g.seed = seed;
  g.values = "normal";
  for (int i = 0; i < nshape; i++) g.shape[g.nshape++] = shape[i];
  qc_contract c = {0};
  if (zc) cr_assert_eq(qc_contract_set(&c, "zero_centered", "true", 0, 0), QC_OK);
  qc_err_clear();
  cr_assert_eq(qc_fd_instance(row->cls, &g, &c, m), QC_OK, "%s: %s", cls, qc_err_msg());
  qc_tensor *x = NULL;
  for (int i = 0; i < m->inputs.n; i++)
    if (strcmp(m->inputs.t[i].name, "x") == 0) x = &m->inputs.t[i];
  cr_assert(x, "%s: no inputs/x", cls);
  const int64_t n = qc_numel(x);
  double *xv = malloc((size_t)n * sizeof *xv), *gv = gpu_randn(n, seed + 7, 1.0);
  cr_assert_eq(qc_tensor_to_f64(x, xv), QC_OK);
  qc_tensor nx = {0};
  cr_assert_eq(qc_tensor_alloc(&nx, "x", dt, x->ndim, x->shape), QC_OK);
  cr_assert_eq(qc_tensor_alloc(dy, "dy", dt, x->ndim, x->shape), QC_OK);
  for (int64_t i = 0; i < n; i++) {
    if (dt == QC_F64) { ((double *)nx.data)[i] = xv[i]; ((double *)dy->data)[i] = gv[i]; }
    if (dt == QC_F32) { ((float *)nx.data)[i] = (float)xv[i]; ((float *)dy->data)[i] = (float)gv[i]; }
    if (dt == QC_BF16) { ((uint16_t *)nx.data)[i] = qc_f32_to_bf16((float)xv[i]); ((uint16_t *)dy->data)[i] = qc_f32_to_bf16((float)gv[i]); }
    if (dt == QC_F16) { ((uint16_t *)nx.data)[i] = qc_f32_to_f16((float)xv[i]); ((uint16_t *)dy->data)[i] = qc_f32_to_f16((float)gv[i]); }
  }
  qc_tensor_free(x);
  *x = nx;
  free(xv);
  free(gv);
}

Test(gpu_norm, device_passes_match_host, .timeout = 120) {
  const qc_backend *be = gpu_or_skip(), *cpu = qc_backend_cpu();
  static const struct { const char *cls; int64_t shape[3]; int nshape, zc; } cfg[] = {
      {"rmsnorm", {64, 4096}, 2, 0}, {"rmsnorm", {127, 1000}, 2, 1}, {"rmsnorm", {3, 7}, 2, 0},
      {"layernorm", {64, 4096}, 2, 0}, {"layernorm", {33, 65, 0}, 3, 0}, {"layernorm", {1, 300}, 2, 0}};
  const qc_dtype dts[] = {QC_F32, QC_BF16, QC_F16, QC_F64};
  for (size_t c = 0; c < sizeof cfg / sizeof cfg[0]; c++)
    for (int d = 0; d < 4; d++) {
      qc_module m = {0};
      qc_tensor dy = {0};
      norm_instance(cfg[c].cls, cfg[c].shape, cfg[c].nshape, 11 + c, cfg[c].zc, dts[d], &m, &dy);
      const qc_registry_row *row = qc_registry_find(cfg[c].cls);
      qc_ctx hc = {.be = cpu}, dc = {.be = be};
      qc_tset h = {0}, g = {0};
      cr_assert_eq(row->reference(&hc, &m, &dy, &h), QC_OK, "%s", qc_err_msg());
      cr_assert_eq(row->reference(&dc, &m, &dy, &g), QC_OK, "%s", qc_err_msg());
      { /* the device path itself is taken on this instance (not host against host) */
        const qc_tensor *x = qc_tset_get(&m.inputs, "x");
        const int64_t n = x->shape[x->ndim - 1], rows = qc_numel(x) / n;
        double *W = calloc((size_t)n, 8), *dx = malloc((size_t)(rows * n + 1) * 8), *dw = calloc((size_t)n, 8);
        for (int64_t i = 0; i < n; i++) W[i] = 1.0;
        cr_assert_eq(qc_ref_norm_dev(be, x, &dy, W, 0, 1e-6, dx, dw, NULL), QC_OK, "config %zu: the device path was not taken: %s", c,
                     qc_err_msg());
        free(W); free(dx); free(dw);
      }
      cr_assert_eq(h.n, g.n, "config %zu: %d host gradients, %d device", c, h.n, g.n);
      cr_assert(h.n >= 2, "config %zu: d_x and d_weight", c);
      for (int t = 0; t < h.n; t++) {
        const qc_tensor *a = &g.t[t], *b = qc_tset_get(&h, a->name);
        cr_assert(b, "config %zu: %s only on the device", c, a->name);
        const double r = gpu_rel(a->data, b->data, qc_numel(b));
        cr_expect(r < 1e-12, "config %zu (%s) dtype %s %s: device against host %.3g", c, cfg[c].cls, qc_dtype_name(dts[d]), a->name, r);
      }
      qc_tset_free(&h);
      qc_tset_free(&g);
      qc_tensor_free(&dy);
      qc_module_free(&m);
    }
}

/* The switch turns the device path down (QC_NA, no error set), and back on. */
Test(gpu_norm, host_path_when_switched_off) {
  const qc_backend *be = gpu_or_skip();
  qc_module m = {0};
  qc_tensor dy = {0};
  const int64_t shape[] = {8, 64};
  norm_instance("rmsnorm", shape, 2, 5, 0, QC_F32, &m, &dy);
  double W[64], dx[512], dw[64];
  for (int i = 0; i < 64; i++) W[i] = 1.0 + i / 64.0;
  const qc_tensor *x = qc_tset_get(&m.inputs, "x");
  gpu_switch(be, "QC_CUDA_NORM_HOST", 1);
  qc_err_clear();
  cr_expect_eq(qc_ref_norm_dev(be, x, &dy, W, 0, 1e-6, dx, dw, NULL), QC_NA);
  cr_expect_eq(qc_err_msg()[0], 0, "no error set: %s", qc_err_msg());
  gpu_switch(be, "QC_CUDA_NORM_HOST", 0);
  cr_expect_eq(qc_ref_norm_dev(be, x, &dy, W, 0, 1e-6, dx, dw, NULL), QC_OK, "%s", qc_err_msg());
  cr_expect_eq(qc_ref_norm_dev(qc_backend_cpu(), x, &dy, W, 0, 1e-6, dx, dw, NULL), QC_NA, "the CPU backend has no device");
  qc_tensor_free(&dy);
  qc_module_free(&m);
}
