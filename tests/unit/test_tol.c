/* test_tol.c: `qatcheck tol`'s formulas on worked examples, and the
 * statistical test that the derived bf16 rel-L2 bound admits correct
 * candidates and rejects a 0.5% scale error. */
#include <criterion/criterion.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "engine/audit.h"
#include "model/check.h"
#include "numerics/formats.h"
#include "core/qc.h"
#include "core/rng.h"
#include "model/tol.h"

#define NEAR(a, b, rel) (fabs((a) - (b)) <= (rel) * fabs(b))

/* docs/tolerances.md's worked example: bf16 d_x of a K=7168 linear. */
Test(tol, worked_example_bf16_k7168) {
  qc_tol_spec s = {.out_dtype = "bfloat16", .acc_dtype = "float32", .k = 7168};
  qc_tol_terms t;
  cr_assert_eq(qc_tol_derive(&s, &t), QC_OK);
  cr_expect(NEAR(t.e_out, 0.00390625 / sqrt(3.0), 1e-12));            /* 2.2552e-3 */
  cr_expect(NEAR(t.e_acc, sqrt(7168.0) * ldexp(1, -24), 1e-12));       /* 5.046e-6 */
  cr_expect_eq(t.e_op, 0);
  /* sqrt(3) sqrt(e_out^2 + e_acc^2) = sqrt(u^2 + 3 e_acc^2) = 3.90626e-3, up to 3 digits */
  cr_expect_eq(t.rel_l2, 0.00391);
  cr_expect_eq(t.cosine_min, 0.99999235);  /* 1 - sqrt(1 - e^2) = 7.644e-6 -> 7.65e-6 */
  cr_expect_eq(t.norm_lo, 0.99609);
  cr_expect_eq(t.norm_hi, 1.00391);
  /* sqrt(1 + (2 sqrt(3) 5.046e-6 / 2.2552e-3)^2) = 1.00003, up to 3 digits */
  cr_expect_eq(t.noise_multiple, 1.01);
  cr_expect_eq(t.has_max_abs, 0);
}

/* A half-precision accumulator dominates: fp16 acc over K=1024 with both
 * operands rounded to fp16, margin 1, lambda 2, and max_abs from a scale. */
Test(tol, worked_example_fp16_accumulation) {
  qc_tol_spec s = {.out_dtype = "fp16", .operand_dtype = "fp16", .acc_dtype = "float16", .k = 1024,
                   .rounded_operands = 2, .lambda = 2, .margin = 1, .scale = 4};
  qc_tol_terms t;
  cr_assert_eq(qc_tol_derive(&s, &t), QC_OK);
  double u = ldexp(1, -11);
  double e_out = u / sqrt(3.0), e_acc = 2 * 32 * u, e_op = sqrt(2.0) * u / sqrt(3.0);
  double e = sqrt(e_out * e_out + e_acc * e_acc + e_op * e_op); /* 0.031260 */
  cr_expect(NEAR(t.e_acc, e_acc, 1e-12));
  cr_expect(NEAR(t.e_op, e_op, 1e-12));
  cr_expect(t.rel_l2 >= e && t.rel_l2 <= e * 1.01, "rel_l2 %g vs %g", t.rel_l2, e);
  cr_expect_eq(t.rel_l2, 0.0313);
  cr_expect(t.cosine_min <= sqrt(1 - t.rel_l2 * t.rel_l2));
  cr_expect(t.cosine_min >= sqrt(1 - t.rel_l2 * t.rel_l2) - 1e-6);
  double nm = sqrt(1 + pow(2 * sqrt(e_acc * e_acc + e_op * e_op) / e_out, 2)); /* 222 */
  cr_expect(t.noise_multiple >= nm && t.noise_multiple <= nm * 1.01, "noise_multiple %g vs %g", t.noise_multiple, nm);
  cr_expect(t.has_max_abs);
  double ma = 4 * (u + 2 * 32 * u + 2 * u);  /* 0.13086 -> 0.131 */
  cr_expect(t.max_abs >= ma && t.max_abs <= ma * 1.01, "max_abs %g vs %g", t.max_abs, ma);
}

/* A format on one operand: nvfp4's e2m1 element, u = 1/4. */
Test(tol, format_term) {
  qc_tol_spec s = {.out_dtype = "bf16", .k = 4096, .format = "nvfp4", .margin = 1};
  qc_tol_terms t;
  cr_assert_eq(qc_tol_derive(&s, &t), QC_OK);
  cr_expect(NEAR(t.e_fmt, 0.25 / sqrt(3.0), 1e-12));
  s.format = "fp8_block128";
  cr_assert_eq(qc_tol_derive(&s, &t), QC_OK);
  cr_expect(NEAR(t.u_fmt, 1.0 / 16, 1e-15));
  s.format = "none";
  cr_assert_eq(qc_tol_derive(&s, &t), QC_OK);
  cr_expect_eq(t.e_fmt, 0);
}

Test(tol, refuses_bad_input) {
  qc_tol_terms t;
  qc_tol_spec s = {.out_dtype = "bfloat17", .k = 8};
  qc_err_clear();
  cr_expect_eq(qc_tol_derive(&s, &t), QC_EINPUT);
  cr_expect(strstr(qc_err_msg(), "bfloat17") != NULL, "%s", qc_err_msg());
  s = (qc_tol_spec){.out_dtype = "nvfp4", .k = 8};   /* a format is not a dtype */
  cr_expect_eq(qc_tol_derive(&s, &t), QC_EINPUT);
  s = (qc_tol_spec){.out_dtype = "bf16", .k = 0};
  cr_expect_eq(qc_tol_derive(&s, &t), QC_EINPUT);
  s = (qc_tol_spec){.out_dtype = "bf16", .k = 8, .rounded_operands = 6}; /* 2 a GEMM's + 3 a bf16 module's, at most */
  cr_expect_eq(qc_tol_derive(&s, &t), QC_EINPUT);
  s = (qc_tol_spec){.out_dtype = "bf16", .acc_dtype = "bf16", .k = 100000};  /* no digits left */
  qc_err_clear();
  cr_expect_eq(qc_tol_derive(&s, &t), QC_EINPUT);
  cr_expect(strstr(qc_err_msg(), "rel_l2") != NULL, "%s", qc_err_msg());
  qc_err_clear();
}

Test(tol, reasoning_names_every_term_and_the_command) {
  qc_tol_spec s = {.out_dtype = "bf16", .k = 512, .rounded_operands = 1, .format = "mxfp8"};
  qc_tol_terms t;
  char why[1024];
  cr_assert_eq(qc_tol_derive(&s, &t), QC_OK);
  qc_tol_reasoning(&s, &t, "qatcheck tol --out-dtype bf16 --k 512", why, sizeof why);
  cr_expect(strstr(why, "u/sqrt(3)") && strstr(why, "Higham-Mary") && strstr(why, "margin sqrt(3)") && strstr(why, "lambda=1") &&
                strstr(why, "K=512") && strstr(why, "1 operand(s) rounded") && strstr(why, "mxfp8") &&
                strstr(why, "derived by: qatcheck tol --out-dtype bf16 --k 512"),
            "%s", why);
  qc_tol tol;
  qc_tol_fill(&t, why, &tol);
  cr_expect(tol.has_rel_l2 && tol.has_cosine_min && tol.has_norm_ratio && tol.has_noise_multiple);
  cr_expect_eq(tol.rel_l2, t.rel_l2);
}

Test(tol, rounding_is_outward_and_short) {
  cr_expect_eq(qc_tol_round(0.0033828, 3, +1), 0.00339);
  cr_expect_eq(qc_tol_round(0.0033828, 3, -1), 0.00338);
  cr_expect_eq(qc_tol_round(0.00339, 3, +1), 0.00339);   /* already short: unchanged */
  cr_expect_eq(qc_tol_round(123456.0, 2, +1), 130000.0);
}

/* The noise floor (src/engine/audit.c) of a bf16 output: exact values have none;
 * a generic value's floor is its own relative rounding error, and for
 * random normals it sits under tol's u/sqrt(3) estimate. */
Test(tol, noise_floor) {
  double exact[] = {1.0, -2.0, 0.5, 0.0};
  cr_expect_eq(qc_noise_floor(exact, 4, QC_BF16), 0.0);
  double one[] = {1.0 + 1.0 / 512};            /* halfway: RNE to 1.0 */
  cr_expect(NEAR(qc_noise_floor(one, 1, QC_BF16), (1.0 / 512) / (1.0 + 1.0 / 512), 1e-12));
  cr_expect_eq(qc_noise_floor(one, 1, QC_F64), 0.0);
  cr_expect(qc_noise_floor(one, 1, QC_F32) == 0.0);
  /* random normals: the floor sits below the u/sqrt(3) estimate */
  qc_rng rng;
  qc_rng_seed(&rng, 7);
  double r[4096];
  for (int i = 0; i < 4096; i++) r[i] = qc_rng_normal(&rng);
  double f = qc_noise_floor(r, 4096, QC_BF16);
  cr_expect(f > 0.5 * ldexp(1, -8) / sqrt(3.0) && f < ldexp(1, -8) / sqrt(3.0), "floor %g", f);
}

/* One trial: bf16 operands A [M, K], B [K, N]; the candidate accumulates
 * in float32 and stores bf16, times `scale`. Returns its rel-L2 against the
 * float64 reference and puts its noise multiple (rel-L2 over the floor,
 * the reference rounded to bf16) in *multiple. */
static double bf16_gemm_trial(qc_rng *rng, int M, int K, int N, float scale, double *multiple) {
  float *a = malloc(sizeof(float) * (size_t)(M * K)), *b = malloc(sizeof(float) * (size_t)(K * N));
  cr_assert(a && b);
  for (int i = 0; i < M * K; i++) a[i] = qc_round_bf16((float)qc_rng_normal(rng));
  for (int i = 0; i < K * N; i++) b[i] = qc_round_bf16((float)qc_rng_normal(rng));
  double ss_r = 0, ss_d = 0, ss_f = 0;
  for (int i = 0; i < M; i++)
    for (int j = 0; j < N; j++) {
      float acc = 0;
      double ref = 0;
      for (int k = 0; k < K; k++) {
        acc += a[i * K + k] * b[k * N + j];  /* bf16 x bf16 is exact in float32 */
        ref += (double)a[i * K + k] * b[k * N + j];
      }
      double g = qc_round_bf16(acc * scale), f = qc_round_bf16((float)ref);
      ss_r += ref * ref;
      ss_d += (g - ref) * (g - ref);
      ss_f += (f - ref) * (f - ref);
    }
  free(a);
  free(b);
  *multiple = sqrt(ss_d / ss_f);
  return sqrt(ss_d / ss_r);
}

/* Correct bf16 candidates land under the derived rel-L2 and noise-multiple
 * bounds in >= 99% of trials at every K; a 0.5% scale error lands over
 * both in >= 99%, and a 0.1% one over the noise multiple. */
Test(tol, bf16_bound_admits_correct_rejects_scale_error, .timeout = 120) {
  const int Ks[] = {16, 256, 2048, 8192};
  const int trials[] = {200, 200, 100, 40};
  qc_rng rng;
  qc_rng_seed(&rng, 2026);
  for (int c = 0; c < 4; c++) {
    qc_tol_spec s = {.out_dtype = "bfloat16", .operand_dtype = "bfloat16", .acc_dtype = "float32", .k = Ks[c]};
    qc_tol_terms t;
    cr_assert_eq(qc_tol_derive(&s, &t), QC_OK);
    int under = 0, under_nm = 0, over = 0, over_nm = 0, over_small = 0;
    double worst = 0, worst_nm = 0, nm;
    for (int i = 0; i < trials[c]; i++) {
      double e = bf16_gemm_trial(&rng, 8, Ks[c], 8, 1.0f, &nm);
      under += e <= t.rel_l2;
      under_nm += nm <= t.noise_multiple;
      worst = fmax(worst, e);
      worst_nm = fmax(worst_nm, nm);
      over += bf16_gemm_trial(&rng, 8, Ks[c], 8, 1.005f, &nm) > t.rel_l2;
      over_nm += nm > t.noise_multiple;
      bf16_gemm_trial(&rng, 8, Ks[c], 8, 1.001f, &nm);
      over_small += nm > t.noise_multiple;
    }
    cr_expect(under * 100 >= 99 * trials[c], "K=%d: %d of %d correct candidates under rel_l2 %g (worst %g)", Ks[c],
              under, trials[c], t.rel_l2, worst);
    cr_expect(under_nm * 100 >= 99 * trials[c], "K=%d: %d of %d correct candidates under noise_multiple %g (worst %g)",
              Ks[c], under_nm, trials[c], t.noise_multiple, worst_nm);
    cr_expect(over * 100 >= 99 * trials[c], "K=%d: only %d of %d scaled candidates over rel_l2 %g", Ks[c], over,
              trials[c], t.rel_l2);
    cr_expect(over_nm * 100 >= 99 * trials[c], "K=%d: only %d of %d scaled candidates over noise_multiple %g", Ks[c],
              over_nm, trials[c], t.noise_multiple);
    cr_expect(over_small * 100 >= 99 * trials[c], "K=%d: only %d of %d 0.1%%-scaled candidates over noise_multiple %g",
              Ks[c], over_small, trials[c], t.noise_multiple);
  }
}
