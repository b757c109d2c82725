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
