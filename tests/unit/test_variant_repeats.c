/* test_variant_repeats.c: the variants the engine skips as repeats of
 * another for one gradient (qc_variant_repeats over the class's grad_reads,
 * engine/variants.c) give that other's reference bit for bit: linear under
 * each form of its contract the declaration tells apart (plain; quantized
 * weight and activation; a clipped STE on them, whose masks read x for d_x
 * and W for d_weight; dw_input quantized; dx_weight master; stochastic
 * rounding), every gradient, every variant. A declaration that names less
 * than a gradient reads fails here. */
#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend/backend.h"
#include "class_harness.h"
#include "core/qc.h"
#include "core/rng.h"
#include "engine/fd.h"
#include "engine/variants.h"
#include "numerics/decode.h"
#include "numerics/formats.h"
#include "numerics/metrics.h"

/* A generated linear [M, K, N] under the contract settings `sets` (NULL-
 * terminated "key=value"), with a float32 N(0, 1) dY [M, N] (the class has
 * no float64 forward for h_make to shape it from). */
static void make_linear(h_inst *in, int64_t M, int64_t K, int64_t N, uint64_t seed, const char *const *sets) {
  memset(in, 0, sizeof *in);
  in->row = qc_registry_find("linear");
  cr_assert(in->row);
  qc_contract c = {0};
  for (int i = 0; sets && sets[i]; i++) cr_assert_eq(qc_fd_parse_set(&c, sets[i]), QC_OK, "%s", qc_err_msg());
  qc_gen g = {0};
  g.seed = seed;
  g.values = "normal";
  g.shape[0] = M, g.shape[1] = K, g.shape[2] = N, g.nshape = 3;
  cr_assert_eq(qc_fd_instance(in->row->cls, &g, &c, &in->m), QC_OK, "%s", qc_err_msg());
  /* x off the bf16 grid (the generator's values are bf16 values: no bf16_inputs variant), and some
   * entries a bf16 step above 0.5, the clip below, so that rounding x moves the STE's mask */
  qc_tensor *x = (qc_tensor *)qc_tset_get(&in->m.inputs, "x"), x32;
  cr_assert(x);
  const int64_t nx = qc_numel(x);
  double *xd = malloc((size_t)nx * sizeof *xd);
  cr_assert(xd && qc_tensor_to_f64(x, xd) == QC_OK);
  cr_assert_eq(qc_tensor_alloc(&x32, "x", QC_F32, x->ndim, x->shape), QC_OK);
  for (int64_t i = 0; i < nx; i++) ((float *)x32.data)[i] = (float)xd[i] * (1.0f + 1.0f / 2048.0f);
  for (int64_t i = 0; i < nx; i += 97) ((float *)x32.data)[i] = (i & 1 ? -1.0f : 1.0f) * 0.5007f;
  free(xd);
  qc_tensor_free(x);
  *x = x32;
  const int64_t ds[2] = {M, N};
  cr_assert_eq(qc_tensor_alloc(&in->dy, "dy", QC_F32, 2, ds), QC_OK);
  qc_rng r;
  qc_rng_seed(&r, seed + 77);
  for (int64_t i = 0; i < M * N; i++) ((float *)in->dy.data)[i] = (float)qc_rng_normal(&r);
}

/* For gradient `grad` of in: every variant that repeats another holds the
 * same bits as that other's (the contract's for -1). Returns the repeats. */
static int same_bits(h_inst *in, const char *grad, const char *what) {
  qc_variants L;
  qc_variants_of(&in->m, &in->dy, QC_VARIANTS_GRADS, 0, NULL, &L);
  const unsigned reads = qc_grad_reads_of(&in->m, grad), same = qc_grad_same_of(&in->m, grad);
  qc_ctx ctx;
  memset(&ctx, 0, sizeof ctx);
  ctx.be = qc_backend_cpu();
  qc_tset base = {0}, refs[QC_VARIANTS_MAX];
  memset(refs, 0, sizeof refs);
  cr_assert_eq(in->row->reference(&ctx, &in->m, &in->dy, &base), QC_OK, "%s: %s", what, qc_err_msg());
  int repeats = 0;
  for (int i = 0; i < L.n; i++) {
    qc_ctx c;
    qc_module alt;
    qc_tensor dv;
    int rc = qc_variant_apply(&L.v[i], &ctx, &in->m, &in->dy, &c, &alt, &dv);
    if (!rc) rc = in->row->reference(&c, &alt, &dv, &refs[i]);
    qc_variant_release(&L.v[i], &in->m, &alt, &dv);
    cr_assert_eq(rc, QC_OK, "%s: variant %d: %s", what, i, qc_err_msg());
    const int j = qc_variant_repeats(&L, i, reads, same);
    if (j == i) continue;
    repeats++;
    const qc_tensor *a = qc_tset_get(&refs[i], grad), *b = qc_tset_get(j < 0 ? &base : &refs[j], grad);
    cr_assert_eq(!a, !b, "%s %s: variant %d and what it repeats disagree on having the gradient", what, grad, i);
    if (!a) continue;
    char vi[48], vj[48] = "the contract";
    qc_variant_id(&L.v[i], vi, sizeof vi);
    if (j >= 0) qc_variant_id(&L.v[j], vj, sizeof vj);
    cr_expect(a->dtype == b->dtype && qc_numel(a) == qc_numel(b) &&
                  memcmp(a->data, b->data, (size_t)qc_numel(a) * qc_dtype_size(a->dtype)) == 0,
              "%s: %s under %s is declared a repeat of %s's but differs", what, grad, vi, vj);
  }
  qc_tset_free(&base);
  for (int i = 0; i < QC_VARIANTS_MAX; i++) qc_tset_free(&refs[i]);
  return repeats;
}

Test(variant_repeats, linear_repeats_are_the_same_bits) {
  static const char *const sets[][4] = {
      {NULL},
      {"weight_format=fp8_channel", "activation_format=fp8_token", NULL},
      {"weight_format=fp8_channel", "activation_format=fp8_token", "ste=clipped:0.5", NULL}, /* |x| 0.5007 -> 0.5 */
      {"weight_format=fp8_channel", "ste=clipped:0.05", NULL},
      {"weight_format=fp8_tensor", "activation_format=fp8_token", "dw_input=quantized", NULL},
      {"weight_format=fp8_channel", "dx_weight=master", NULL},
      {"weight_format=fp8_channel", "rounding=sr:3", NULL},
  };
  int total = 0;
  for (size_t s = 0; s < sizeof sets / sizeof sets[0]; s++) {
    h_inst in;
    make_linear(&in, 64, 64, 16, 41 + s, sets[s][0] ? sets[s] : NULL);
    char what[160];
    snprintf(what, sizeof what, "linear contract set %zu (%s%s%s)", s, sets[s][0] ? sets[s][0] : "defaults",
             sets[s][0] && sets[s][1] ? ", " : "", sets[s][0] && sets[s][1] ? sets[s][1] : "");
    static const char *const grads[] = {"d_x", "d_weight", "d_bias"};
    for (int g = 0; g < 3; g++) total += same_bits(&in, grads[g], what);
    h_free(&in);
  }
  cr_expect(total > 0, "no variant was declared a repeat: the test judged nothing");
}

/* The forward variant bf16_params of a class whose reference rounds its
 * parameters as it reads them (linear: qc_reference.bf16_params) gives the
 * bits the rounded copies did: the flag path of qc_variant_apply against
 * the module with its float32 weight and bias rounded to bf16 by hand, y
 * and the error model's fields; a float16 weight stays as it is on both
 * paths (the copies round float32 and float64 storage only). */
Test(variant_repeats, linear_bf16_params_by_flag_is_the_rounded_copies) {
  for (int f16 = 0; f16 < 2; f16++) {
    h_inst in;
    make_linear(&in, 48, 64, 40, 97 + f16, NULL);
    qc_tensor *w = (qc_tensor *)qc_tset_get(&in.m.params, "weight"), b;
    cr_assert(w);
    const int64_t nw = qc_numel(w), N = w->shape[0];
    double *wd = malloc((size_t)nw * sizeof *wd);
    cr_assert(wd && qc_tensor_to_f64(w, wd) == QC_OK);
    qc_tensor w2;
    cr_assert_eq(qc_tensor_alloc(&w2, "weight", f16 ? QC_F16 : QC_F32, 2, w->shape), QC_OK);
    for (int64_t i = 0; i < nw; i++) { /* off the bf16 grid */
      const float v = (float)wd[i] * (1.0f + 3.0f / 4096.0f);
      if (f16) ((uint16_t *)w2.data)[i] = qc_f32_to_f16(v);
      else ((float *)w2.data)[i] = v;
    }
    free(wd);
    qc_tensor_free(w);
    *w = w2;
    cr_assert_eq(qc_tensor_alloc(&b, "bias", QC_F32, 1, &N), QC_OK);
    for (int64_t i = 0; i < N; i++) ((float *)b.data)[i] = 0.1f + 0.0137f * (float)i;
    cr_assert_eq(qc_tset_add(&in.m.params, &b), QC_OK);
    cr_assert(in.row->forward && qc_registry_find("linear")->bf16_params);
    qc_ctx ctx;
    memset(&ctx, 0, sizeof ctx);
    ctx.be = qc_backend_cpu();
    qc_variant v = {.parts = QC_VAR_BF16_PARAMS, .level = 0};
    qc_ctx c;
    qc_module alt;
    cr_assert_eq(qc_variant_apply(&v, &ctx, &in.m, NULL, &c, &alt, NULL), QC_OK, "%s", qc_err_msg());
    cr_assert(c.bf16_params && alt.params.t == in.m.params.t, "linear's variant must go by the flag, not copies");
    qc_tensor y1 = {0}, y2 = {0};
    qc_tol_model t1, t2;
    cr_assert_eq(in.row->forward(&c, &alt, &y1, &t1), QC_OK, "%s", qc_err_msg());
    qc_variant_release(&v, &in.m, &alt, NULL);
    /* the copies, by hand */
    qc_module hand = in.m;
    memset(&hand.params, 0, sizeof hand.params);
    cr_assert_eq(qc_tset_clone(&hand.params, &in.m.params), QC_OK);
    for (int j = 0; j < hand.params.n; j++) qc_round_all(hand.params.t[j].data, hand.params.t[j].dtype, qc_numel(&hand.params.t[j]), QC_BF16);
    cr_assert_eq(in.row->forward(&ctx, &hand, &y2, &t2), QC_OK, "%s", qc_err_msg());
    cr_expect_eq(memcmp(y1.data, y2.data, (size_t)qc_numel(&y1) * sizeof(double)), 0, "f16 %d: y differs", f16);
    cr_expect(t1.terms == t2.terms && t1.scale == t2.scale && t1.k == t2.k, "f16 %d: the error model differs", f16);
    /* and the rounding moved something (a test that cannot fail judges nothing) */
    qc_tensor y0 = {0};
    qc_tol_model t0;
    cr_assert_eq(in.row->forward(&ctx, &in.m, &y0, &t0), QC_OK);
    cr_expect_neq(memcmp(y0.data, y1.data, (size_t)qc_numel(&y0) * sizeof(double)), 0, "f16 %d: bf16_params changed nothing", f16);
    qc_tensor_free(&y0); qc_tensor_free(&y1); qc_tensor_free(&y2);
    qc_tset_free(&hand.params);
    h_free(&in);
  }
}
