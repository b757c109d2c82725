/* test_gpu_logprob.c: the logprob reference with its rows on the device
 * (reference/logprob_dev.c, backend/cuda/lprows.cu) against its host rows
 * on the CPU backend (reference/logprob.c, their definition): d_logits and
 * its terms' scale over masked and padded rows (ids -100), a fully masked
 * sequence, temperature, vocab shards, the three normalizations and
 * "special" values (a spiked row, +-1e4). The shards' sums differ only in
 * order (a tree on the device): agreement to 1e-12 relative.
 * QC_CUDA_LP_HOST=1 turns the device path down. */
#include "gpu_common.h"
#include "engine/fd.h"
#include "model/contract.h"
#include "model/module.h"
#include "numerics/decode.h"
#include "reference/ref_classes.h"

Test(gpu_logprob, device_rows_match_host, .timeout = 120) {
  const qc_backend *be = gpu_or_skip(), *cpu = qc_backend_cpu();
  static const struct { int64_t B, S, V; const char *values, *norm; double T, shards; } cfg[] = {
      {3, 127, 1000, "normal", "sum", 1, 1},      {4, 64, 4000, "normal", "mean_tokens", 0.7, 4},
      {2, 33, 2048, "special", "mean_sequences", 1, 2}, {1, 1, 32000, "normal", "sum", 1.3, 1}};
  const qc_registry_row *row = qc_registry_find("logprob");
  cr_assert(row);
  for (size_t c = 0; c < sizeof cfg / sizeof cfg[0]; c++) {
    qc_gen g = {0};
    g.seed = 3 + c;
    g.values = cfg[c].values;
    g.shape[g.nshape++] = cfg[c].B;
    g.shape[g.nshape++] = cfg[c].S;
    g.shape[g.nshape++] = cfg[c].V;
    qc_contract k = {0};
    cr_assert_eq(qc_contract_set(&k, "normalization", cfg[c].norm, 0, 0), QC_OK);
    cr_assert_eq(qc_contract_set(&k, "temperature", NULL, cfg[c].T, 1), QC_OK);
    cr_assert_eq(qc_contract_set(&k, "vocab_shards", NULL, cfg[c].shards, 1), QC_OK);
    qc_module m = {0};
    qc_err_clear();
    cr_assert_eq(qc_fd_instance(row->cls, &g, &k, &m), QC_OK, "%s", qc_err_msg());
    qc_tensor dy = {0};
    const int64_t bs[2] = {cfg[c].B, cfg[c].S};
    cr_assert_eq(qc_tensor_alloc(&dy, "dy", QC_F32, 2, bs), QC_OK);
    double *gv = gpu_randn(cfg[c].B * cfg[c].S, 9 + c, 1.0);
    for (int64_t i = 0; i < cfg[c].B * cfg[c].S; i++) ((float *)dy.data)[i] = (float)gv[i];
    free(gv);
    for (int ab = 0; ab < 2; ab++) {
      qc_ctx hc = {.be = cpu, .terms = ab}, dc = {.be = be, .terms = ab};
      qc_tset h = {0}, d = {0};
      cr_assert_eq(row->reference(&hc, &m, &dy, &h), QC_OK, "%s", qc_err_msg());
      cr_assert_eq(row->reference(&dc, &m, &dy, &d), QC_OK, "%s", qc_err_msg());
      const qc_tensor *a = qc_tset_get(&d, "d_logits"), *b = qc_tset_get(&h, "d_logits");
      cr_assert(a && b, "d_logits from both");
      const double r = gpu_rel(a->data, b->data, qc_numel(b));
      cr_expect(r < 1e-12, "config %zu ab %d: device against host %.3g", c, ab, r);
      qc_tset_free(&h);
      qc_tset_free(&d);
    }
    { /* the device path itself, called directly (not host against host): every row counted with the
       * unit weight and dY 1 except every third, not counted (id -1, a zero row), against the rows
       * written out here from the definition */
      const qc_tensor *lt = qc_tset_get(&m.inputs, "logits");
      const int64_t rows = cfg[c].B * cfg[c].S, V = cfg[c].V, K = (int64_t)cfg[c].shards, P = V / K;
      const double T = cfg[c].T;
      double *gw = malloc((size_t)rows * 8), *dl = malloc((size_t)qc_numel(lt) * 8), *z = malloc((size_t)qc_numel(lt) * 8);
      int64_t *id = malloc((size_t)rows * 8);
      cr_assert_eq(qc_tensor_to_f64(lt, z), QC_OK);
      for (int64_t i = 0; i < rows; i++) {
        gw[i] = 1;
        id[i] = i % 3 == 2 ? -1 : (i * 7919) % V;
      }
      cr_assert_eq(qc_ref_lp_dev(be, lt, gw, id, K, T, 0, dl), QC_OK, "config %zu: the device path was not taken: %s", c,
                   qc_err_msg());
      double d2 = 0, r2 = 0;
      for (int64_t i = 0; i < rows; i++) {
        double lse = -INFINITY;
        for (int64_t k = 0; k < K; k++) {
          double mk = -INFINITY, sk = 0;
          for (int64_t v = k * P; v < (k + 1) * P; v++) mk = fmax(mk, z[i * V + v] / T);
          for (int64_t v = k * P; v < (k + 1) * P; v++) sk += exp(z[i * V + v] / T - mk);
          const double lk = mk + log(sk), hi = fmax(lse, lk);
          lse = hi + log(exp(lse - hi) + exp(lk - hi));
        }
        for (int64_t v = 0; v < V; v++) {
          const double e = id[i] < 0 ? 0.0 : ((v == id[i]) - exp(z[i * V + v] / T - lse)) / T;
          if (id[i] < 0) cr_assert_eq(dl[i * V + v], 0.0, "row %lld is not counted: it stays zero", (long long)i);
          d2 += (dl[i * V + v] - e) * (dl[i * V + v] - e);
          r2 += e * e;
        }
      }
      cr_expect(sqrt(d2) <= 1e-12 * sqrt(r2), "config %zu: the direct call against the definition %.3g", c, sqrt(d2 / r2));
      free(gw); free(dl); free(id); free(z);
    }
    qc_tensor_free(&dy);
    qc_module_free(&m);
  }
}

/* The switch turns the device path down (QC_NA, no error set), and back on. */
Test(gpu_logprob, host_path_when_switched_off) {
  const qc_backend *be = gpu_or_skip();
  qc_tensor lt = {0};
  const int64_t shape[] = {2, 8};
  cr_assert_eq(qc_tensor_alloc(&lt, "logits", QC_F32, 2, shape), QC_OK);
  for (int i = 0; i < 16; i++) ((float *)lt.data)[i] = (float)(i % 8);
  double gw[2] = {1, 0.5}, dl[16];
  int64_t id[2] = {7, 0};
  gpu_switch(be, "QC_CUDA_LP_HOST", 1);
  qc_err_clear();
  cr_expect_eq(qc_ref_lp_dev(be, &lt, gw, id, 1, 1.0, 0, dl), QC_NA);
  cr_expect_eq(qc_err_msg()[0], 0, "no error set: %s", qc_err_msg());
  gpu_switch(be, "QC_CUDA_LP_HOST", 0);
  cr_expect_eq(qc_ref_lp_dev(be, &lt, gw, id, 1, 1.0, 0, dl), QC_OK, "%s", qc_err_msg());
  double z = 0;
  for (int v = 0; v < 8; v++) z += exp((double)v);
  for (int r = 0; r < 2; r++)
    for (int v = 0; v < 8; v++) { /* gw (1[v = id] - softmax_v) */
      const double e = gw[r] * ((v == id[r]) - exp((double)v) / z);
      cr_expect(fabs(dl[r * 8 + v] - e) <= 1e-14, "row %d vocab %d: %.17g against %.17g", r, v, dl[r * 8 + v], e);
    }
  cr_expect_eq(qc_ref_lp_dev(qc_backend_cpu(), &lt, gw, id, 1, 1.0, 0, dl), QC_NA, "the CPU backend has no device");
  qc_tensor_free(&lt);
}
