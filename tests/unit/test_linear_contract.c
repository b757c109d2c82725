/* test_linear_contract.c: the linear contract keys, production (bf16 GEMMs)
 * against reference (float64), and the reference's definitions directly:
 * clipped STE masks (1 at |v| == T), dx_weight, dw_input, SR rounding. */
#include <criterion/criterion.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend/backend.h"
#include "model/module.h"
#include "numerics/formats.h"
#include "numerics/quant.h"
#include "core/qc.h"
#include "numerics/decode.h"

enum { M = 4, K = 64, N = 8 };

/* A linear module with f32 x [M,K], weight [N,K], and contract keys kv
 * ("key=value" or "key=str:num"), validated against the class's keys. */
static void make(qc_module *m, const char *const *kv, int nkv) {
  memset(m, 0, sizeof *m);
  const qc_registry_row *row = qc_registry_find("linear");
  cr_assert(row);
  m->cls = row->cls;
  snprintf(m->path, sizeof m->path, "/model.layers.0.mlp.down_proj");
  qc_tensor x = {0}, w = {0};
  int64_t xs[2] = {M, K}, ws[2] = {N, K};
  cr_assert_eq(qc_tensor_alloc(&x, "x", QC_F32, 2, xs), QC_OK);
  cr_assert_eq(qc_tensor_alloc(&w, "weight", QC_F32, 2, ws), QC_OK);
  for (int i = 0; i < M * K; i++) ((float *)x.data)[i] = qc_round_bf16(sinf((float)i * 0.7f) * 2.0f);
  for (int i = 0; i < N * K; i++) ((float *)w.data)[i] = qc_round_bf16(cosf((float)i * 0.3f) * 0.5f);
  ((float *)w.data)[3] = 0.25f;   /* exactly at the clip threshold used below */
  ((float *)w.data)[5] = 0.375f;  /* beyond it */
  ((float *)x.data)[7] = 0.25f;
  ((float *)x.data)[9] = -1.5f;
  cr_assert_eq(qc_tset_add(&m->inputs, &x), QC_OK);
  cr_assert_eq(qc_tset_add(&m->params, &w), QC_OK);
  for (int i = 0; i < nkv; i++) {
    char k[48], v[64];
    cr_assert_eq(sscanf(kv[i], "%47[^=]=%63s", k, v), 2);
    char *colon = strchr(v, ':');
    if (colon) { *colon = 0; qc_contract_set(&m->contract, k, v, atof(colon + 1), 1); }
    else qc_contract_set(&m->contract, k, v, 0, 0);
  }
  cr_assert_eq(qc_contract_validate(&m->contract, m->cls->keys, "test"), QC_OK, "%s", qc_err_msg());
}

static void dy_ones(qc_tensor *dy) {
  int64_t s[2] = {M, N};
  cr_assert_eq(qc_tensor_alloc(dy, "dy", QC_F32, 2, s), QC_OK);
  for (int i = 0; i < M * N; i++) ((float *)dy->data)[i] = qc_round_bf16(1.0f + 0.01f * (float)i);
}

/* Reference and production gradients for m; rel-L2 of each pair must be
 * within bf16 rounding (4e-3), i.e. both follow the same contract. */
static void both(const qc_module *m, qc_tset *ref, qc_tset *prod) {
  qc_ctx ctx = {.be = qc_backend_cpu(), .profile = "vllm"};
  const qc_registry_row *row = qc_registry_find("linear");
  qc_tensor dy = {0};
  dy_ones(&dy);
  memset(ref, 0, sizeof *ref);
  memset(prod, 0, sizeof *prod);
  cr_assert_eq(row->reference(&ctx, m, &dy, ref), QC_OK, "%s", qc_err_msg());
  cr_assert_eq(row->cls->production(&ctx, m, &dy, prod), QC_OK, "%s", qc_err_msg());
  for (int t = 0; t < ref->n; t++) {
    const qc_tensor *r = &ref->t[t], *g = qc_tset_get(prod, r->name);
    cr_assert(g, "production lacks %s", r->name);
    int64_t n = qc_numel(r);
    double *gd = malloc((size_t)n * 8), num = 0, den = 0;
    qc_tensor_to_f64(g, gd);
    for (int64_t i = 0; i < n; i++) {
      double d = gd[i] - ((double *)r->data)[i];
      num += d * d;
      den += ((double *)r->data)[i] * ((double *)r->data)[i];
    }
    cr_expect(sqrt(num) <= 4e-3 * sqrt(den) + 1e-30, "%s: rel_l2 %g", r->name, sqrt(num / (den > 0 ? den : 1)));
    free(gd);
  }
  qc_tensor_free(&dy);
}

static double at(const qc_tset *s, const char *name, int i) {
  const qc_tensor *t = qc_tset_get(s, name);
  double v[M * K > N * K ? M * K : N * K];
  qc_tensor_to_f64(t, v);
  return v[i];
}

Test(linear_contract, clipped_ste_masks_weight_and_input) {
  const char *kv[] = {"weight_format=fp8_channel", "activation_format=fp8_token", "ste=clipped:0.25"};
  qc_module m;
  qc_tset ref, prod;
  make(&m, kv, 3);
  both(&m, &ref, &prod);
  cr_expect_neq(at(&ref, "d_weight", 3), 0.0, "|W| == T must pass (derivative 1)");
  cr_expect_eq(at(&ref, "d_weight", 5), 0.0, "|W| > T must be masked");
  cr_expect_neq(at(&ref, "d_x", 7), 0.0, "|X| == T must pass");
  cr_expect_eq(at(&ref, "d_x", 9), 0.0, "|X| > T must be masked");
  cr_expect_eq(at(&prod, "d_weight", 5), 0.0);
  cr_expect_eq(at(&prod, "d_x", 9), 0.0);
  qc_tset_free(&ref); qc_tset_free(&prod); qc_module_free(&m);
}

Test(linear_contract, clipped_ste_needs_a_quantizer) {
  const char *kv[] = {"weight_format=none", "ste=clipped:0.25"};
  qc_module m;
  qc_tset ref, prod;
  make(&m, kv, 2);
  both(&m, &ref, &prod);
  cr_expect_neq(at(&ref, "d_weight", 5), 0.0, "no quantizer, no STE mask");
  qc_tset_free(&ref); qc_tset_free(&prod); qc_module_free(&m);
}

/* Two contracts a and b, each checked production against reference; the
 * sum of |reference a - reference b| over the first n elements of tensor,
 * and (when same_tensor) whether `same_tensor` is identical under both. */
static double contract_diff(const char *const *a, int na, const char *const *b, int nb, const char *tensor, int n,
                            const char *same_tensor) {
  qc_module ma, mb;
  qc_tset ra, pa, rb, pb;
  make(&ma, a, na);
  make(&mb, b, nb);
  both(&ma, &ra, &pa);
  both(&mb, &rb, &pb);
  double diff = 0;
  for (int i = 0; i < n; i++) diff += fabs(at(&ra, tensor, i) - at(&rb, tensor, i));
  if (same_tensor)
    for (int i = 0; i < 16; i++) cr_expect_eq(at(&ra, same_tensor, i), at(&rb, same_tensor, i), "%s[%d] differs", same_tensor, i);
  qc_tset_free(&ra); qc_tset_free(&pa); qc_tset_free(&rb); qc_tset_free(&pb);
  qc_module_free(&ma); qc_module_free(&mb);
  return diff;
}

Test(linear_contract, dx_weight_master_vs_dequant) {
  const char *a[] = {"weight_format=nvfp4", "dx_weight=dequant"}, *b[] = {"weight_format=nvfp4", "dx_weight=master"};
  cr_expect_gt(contract_diff(a, 2, b, 2, "d_x", M * K, "d_weight"), 1e-3, "nvfp4 dequant and master d_x should differ");
}

Test(linear_contract, dw_input_quantized_group128) {
  const char *a[] = {"activation_format=fp8_group128", "dw_input=quantized"}, *b[] = {"activation_format=fp8_group128"};
  cr_expect_gt(contract_diff(a, 2, b, 1, "d_weight", N * K, "d_x"), 1e-3, "quantized and original X give the same d_weight");
}

Test(linear_contract, sr_rounding_both_sides_seeded) {
  /* production and reference draw the same bits (both() checks them against each other) */
  const char *a[] = {"weight_format=mxfp4", "rounding=sr:7"}, *b[] = {"weight_format=mxfp4", "rounding=sr:8"};
  cr_expect_gt(contract_diff(a, 2, b, 2, "d_x", M * K, "d_weight"), 1e-3, "another seed gives the same d_x");
}

Test(linear_contract, sr_contract_keys_reach_both_sides) {
  /* each key of the SR contract changes the draws of production and
   * reference alike (both() holds them to each other) */
  const char *base[] = {"weight_format=mxfp4", "rounding=sr:7"};
  const char *step[] = {"weight_format=mxfp4", "rounding=sr:7", "sr_step=:5"};
  const char *expert[] = {"weight_format=mxfp4", "rounding=sr:7", "sr_expert=:3"};
  const char *other[] = {"weight_format=mxfp4", "rounding=sr:7", "sr_salt=model.embed_tokens.weight"};
  cr_expect_gt(contract_diff(step, 3, base, 2, "d_x", M * K, "d_weight"), 1e-3, "sr_step 5 draws step 0's masks");
  cr_expect_gt(contract_diff(expert, 3, base, 2, "d_x", M * K, "d_weight"), 1e-3, "sr_expert 3 draws expert 0's masks");
  cr_expect_gt(contract_diff(other, 3, base, 2, "d_x", M * K, "d_weight"), 1e-3, "another identity draws the same masks");
  /* the identity the legacy derivation gives this untied module's weight (its
   * path + ".weight") is the same contract as no sr_salt */
  const char *named[] = {"weight_format=mxfp4", "rounding=sr:7", "sr_salt=model.layers.0.mlp.down_proj.weight"};
  cr_expect_eq(contract_diff(named, 3, base, 2, "d_x", M * K, "d_weight"), 0.0, "the legacy identity is not the default");
}

Test(linear_contract, sr_keys_refused_without_sr) {
  const char *bad[][2] = {{"weight_format=mxfp4", "sr_step=:5"}, {"rounding=rn", "sr_salt=w"}};
  for (int i = 0; i < 2; i++) {
    qc_module m;
    qc_tensor dy = {0};
    qc_tset g;
    make(&m, bad[i], 2);
    dy_ones(&dy);
    cr_expect_eq(m.cls->validate(&m, &dy), QC_EINPUT, "case %d accepted", i);
    cr_expect(strstr(qc_err_msg(), "belongs to stochastic rounding") != NULL, "%s", qc_err_msg());
    qc_ctx ctx = {.be = qc_backend_cpu(), .profile = "vllm"};
    memset(&g, 0, sizeof g);
    cr_expect_eq(m.cls->production(&ctx, &m, &dy, &g), QC_EINPUT);
    qc_tset_free(&g); qc_tensor_free(&dy); qc_module_free(&m);
  }
}

Test(linear_contract, every_weight_and_activation_format) {
  const char *wf[] = {"fp8_tensor", "fp8_channel", "fp8_block128", "fp8_block128_ue8m0", "nvfp4", "mxfp8", "mxfp4"};
  const char *af[] = {"fp8_token", "fp8_group128", "fp8_group128_ue8m0"};
  for (int i = 0; i < 7; i++)
    for (int j = 0; j < 3; j++) {
      char w[64], a[64];
      snprintf(w, sizeof w, "weight_format=%s", wf[i]);
      snprintf(a, sizeof a, "activation_format=%s", af[j]);
      const char *kv[] = {w, a, "dw_input=quantized"};
      qc_module m;
      qc_tset r, p;
      make(&m, kv, 3);
      both(&m, &r, &p);
      qc_tset_free(&r); qc_tset_free(&p); qc_module_free(&m);
    }
}
