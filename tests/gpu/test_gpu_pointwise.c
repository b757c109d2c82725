/* test_gpu_pointwise.c: the elementwise references (gelu in both forms,
 * swiglu with and without its clamp) with their elements on the
 * device (reference/pointwise_dev.c, backend/cuda/pointwise.cu) against
 * their host loops on the CPU backend, the definition: the float64 VJP and
 * the terms' scale to 1e-12 relative (the device's exp, erf, tanh differ
 * from the host's by ulps), and every bf16 rounding variant (gelu's bf16
 * arithmetic, swiglu's round_ops 1 and 2) equal but for elements on a bf16
 * rounding boundary: at most 1 in 10^4, each one bf16 step apart. Inputs
 * stored in float32 and bfloat16; "special" values too (zeros, large
 * magnitudes, values at the clamp, its derivative there passed and
 * blocked). QC_CUDA_PW_HOST=1 turns the device
 * path down. */
#include "gpu_common.h"
#include "engine/fd.h"
#include "model/contract.h"
#include "model/module.h"
#include "numerics/formats.h"
#include "reference/ref_dev.h"

typedef struct {
  const char *cls, *key, *val, *values;
  int64_t T, F;
} pw_cfg;

/* Elements where a and b differ; *worst their largest difference relative
 * to |b| (zero where both are zero). */
static int64_t pw_diffs(const double *a, const double *b, int64_t n, double *worst) {
  int64_t k = 0;
  *worst = 0;
  for (int64_t i = 0; i < n; i++)
    if (isnan(a[i]) != isnan(b[i])) {
      k++;
      *worst = INFINITY;
    } else if (a[i] != b[i]) {
      k++;
      const double r = fabs(a[i] - b[i]) / (fabs(b[i]) > 0 ? fabs(b[i]) : 1e-300);
      if (r > *worst) *worst = r;
    }
  return k;
}

Test(gpu_pointwise, device_elements_match_host, .timeout = 120) {
  const qc_backend *be = gpu_or_skip(), *cpu = qc_backend_cpu();
  static const pw_cfg cfg[] = {
      {"gelu", NULL, NULL, "normal", 512, 1000},        {"gelu", "approximate", "tanh", "normal", 512, 1000},
      {"gelu", "approximate", "tanh", "special", 64, 300}, {"gelu", NULL, NULL, "special", 64, 300},
      {"gelu", NULL, NULL, "normal", 256, 777},         {"swiglu", NULL, NULL, "normal", 512, 1000},
      {"swiglu", "limit", "7", "normal", 512, 1000},     {"swiglu", "limit", "7", "special", 64, 300},
      {"swiglu", "at_limit", "block", "special", 64, 300}};
  const int variants[][2] = {{0, 0}, {0, 1}, {1, 0}, {2, 0}}; /* {round_ops, terms} */
  for (size_t c = 0; c < sizeof cfg / sizeof cfg[0]; c++) {
    const qc_registry_row *row = qc_registry_find(cfg[c].cls);
    cr_assert(row, "class %s", cfg[c].cls);
    qc_gen g = {0};
    g.seed = 31 + c;
    g.values = cfg[c].values;
    g.shape[g.nshape++] = cfg[c].T;
    g.shape[g.nshape++] = cfg[c].F;
    qc_contract k = {0};
    if (cfg[c].key) {
      char *end;
      const double v = strtod(cfg[c].val, &end);
      cr_assert_eq(qc_contract_set(&k, cfg[c].key, *end == 0 ? NULL : cfg[c].val, v, *end == 0), QC_OK);
      if (strcmp(cfg[c].key, "at_limit") == 0) cr_assert_eq(qc_contract_set(&k, "limit", NULL, 7, 1), QC_OK); /* the clamp it applies to */
    }
    qc_module m = {0};
    qc_err_clear();
    cr_assert_eq(qc_fd_instance(row->cls, &g, &k, &m), QC_OK, "%s: %s", cfg[c].cls, qc_err_msg());
    qc_tensor y = {0}, dy = {0};
    cr_assert_eq(row->cls->forward(&m, &m, &y), QC_OK, "%s", qc_err_msg());
    cr_assert_eq(qc_tensor_alloc(&dy, "dy", c % 2 ? QC_BF16 : QC_F32, y.ndim, y.shape), QC_OK);
    double *gv = gpu_randn(qc_numel(&y), 5 + c, 1.0);
    for (int64_t i = 0; i < qc_numel(&y); i++) {
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
      if (v == 0) { /* the device path itself is taken on this instance (not host against host) */
        const int sw = strcmp(cfg[c].cls, "swiglu") == 0;
        const qc_tensor *x = qc_tset_get(&m.inputs, sw ? "gate" : "x"), *u = sw ? qc_tset_get(&m.inputs, "up") : NULL;
        double *o1 = malloc((size_t)(qc_numel(x) + 1) * 8), *o2 = malloc((size_t)(qc_numel(x) + 1) * 8);
        const qc_pw j = {.op = sw ? QC_PW_SWIGLU : QC_PW_GELU};
        cr_assert_eq(qc_ref_pw_dev(be, j, x, u, &dy, o1, sw ? o2 : NULL), QC_OK, "config %zu: the device path was not taken: %s", c,
                     qc_err_msg());
        free(o1); free(o2);
      }
      cr_assert_eq(h.n, d.n);
      const int rounded = variants[v][0] && !variants[v][1];
      for (int t = 0; t < h.n; t++) {
        const qc_tensor *a = &d.t[t], *b = qc_tset_get(&h, a->name);
        cr_assert(b, "%s only on the device", a->name);
        const int64_t n = qc_numel(b);
        if (!rounded) {
          const double r = gpu_rel(a->data, b->data, n);
          cr_expect(r < 1e-12, "%s %s=%s %s variant %d %s: device against host %.3g", cfg[c].cls, cfg[c].key ? cfg[c].key : "",
                    cfg[c].val ? cfg[c].val : "", cfg[c].values, v, a->name, r);
        } else {
          double worst;
          const int64_t k = pw_diffs(a->data, b->data, n, &worst);
          cr_expect(k * 10000 <= n && worst <= 1.0 / 128, "%s %s variant %d %s: %lld of %lld elements differ, by %.3g at most",
                    cfg[c].cls, cfg[c].values, v, a->name, (long long)k, (long long)n, worst);
        }
      }
      qc_tset_free(&h);
      qc_tset_free(&d);
    }
    qc_tensor_free(&y);
    qc_tensor_free(&dy);
    qc_module_free(&m);
  }
}

/* The switch turns the device path down (QC_NA, no error set), and back on. */
Test(gpu_pointwise, host_path_when_switched_off) {
  const qc_backend *be = gpu_or_skip();
  qc_tensor x = {0};
  const int64_t shape[] = {4, 8};
  cr_assert_eq(qc_tensor_alloc(&x, "x", QC_F32, 2, shape), QC_OK);
  for (int i = 0; i < 32; i++) ((float *)x.data)[i] = (float)(i - 16) / 8.0f;
  double dx[32];
  const qc_pw j = {.op = QC_PW_GELU}; /* erf form, float64 */
  gpu_switch(be, "QC_CUDA_PW_HOST", 1);
  qc_err_clear();
  cr_expect_eq(qc_ref_pw_dev(be, j, &x, NULL, &x, dx, NULL), QC_NA);
  cr_expect_eq(qc_err_msg()[0], 0, "no error set: %s", qc_err_msg());
  gpu_switch(be, "QC_CUDA_PW_HOST", 0);
  cr_expect_eq(qc_ref_pw_dev(be, j, &x, NULL, &x, dx, NULL), QC_OK, "%s", qc_err_msg());
  for (int i = 0; i < 32; i++) { /* dy = x: x (Phi(x) + x phi(x)) */
    const double v = (double)(i - 16) / 8.0, d = v * (0.5 * erfc(-v / M_SQRT2) + v * exp(-0.5 * v * v) / sqrt(2.0 * M_PI));
    cr_expect(fabs(dx[i] - d) <= 1e-14 * (1 + fabs(d)), "element %d: %.17g against %.17g", i, dx[i], d);
  }
  cr_expect_eq(qc_ref_pw_dev(qc_backend_cpu(), j, &x, NULL, &x, dx, NULL), QC_NA, "the CPU backend has no device");
  qc_tensor_free(&x);
}
