/* test_bias.c: the bias test (numerics/metrics.c qc_bias_pass) and the
 * precision a gradient's values carry: hand vectors, its distribution on
 * correct bf16 candidates (calibrated, never over the default bound), its
 * power on a 0.2% scale error, its clustered variance on correlated
 * operand-rounding errors, and the verdict rules (default on, 0 off). */
#include <criterion/criterion.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "core/rng.h"
#include "model/check.h"
#include "numerics/formats.h"
#include "numerics/metrics.h"

static void pass(const double *g, const double *r, int64_t rows, int64_t cols, qc_dtype dt, qc_metrics *m) {
  qc_metrics_compute(g, r, rows * cols, m);
  cr_assert_eq(qc_bias_pass(g, r, rows, cols, dt, m), 0);
}

Test(bias, hand_vectors) {
  enum { N = 64 };
  double r[N], g[N];
  qc_metrics m;
  for (int i = 0; i < N; i++) r[i] = (i % 2 ? -1 : 1) * (1.0 + i / 64.0 + 1.0 / 1024);
  for (int i = 0; i < N; i++) g[i] = qc_round_bf16((float)r[i]);
  pass(g, r, 1, N, QC_BF16, &m);
  /* the rounded reference itself: no error beyond it, z 0, and the noise floor is its own */
  cr_expect_eq(m.e_par, 0.0);
  cr_expect_eq(m.bias_z, 0.0);
  cr_expect(m.noise_floor > 0 && fabs(m.noise_floor - m.rel_l2) < 1e-15);
  /* an exact scale of a float64 candidate: no noise at all, an infinite z */
  for (int i = 0; i < N; i++) g[i] = 1.5 * r[i];
  pass(g, r, 1, N, QC_F64, &m);
  cr_expect(fabs(m.e_par - 0.5) < 1e-15, "e_par %g", m.e_par);
  cr_expect(isinf(m.bias_z) && m.bias_z > 0);
  /* a zero reference: nothing to project on */
  double z[N] = {0};
  pass(g, z, 1, N, QC_F64, &m);
  cr_expect_eq(m.bias_z, 0.0);
  /* too few elements carry the reference (4; or one dominating 64): no
   * standard error can be estimated, the test is not made */
  pass(g, r, 1, 4, QC_F64, &m);
  cr_expect(m.bias_z == 0.0 && isnan(m.bias_sd) && isnan(m.bias_z_raw), "z %g sd %g", m.bias_z, m.bias_sd);
  r[7] = 1e6;
  for (int i = 0; i < N; i++) g[i] = 1.5 * r[i];
  pass(g, r, 1, N, QC_F64, &m);
  cr_expect(m.bias_z == 0.0 && isnan(m.bias_sd), "one dominating element: z %g", m.bias_z);
}

/* A bf16 GEMM as a trainer runs it: bf16 A [M, K] and B [K, N], float32
 * accumulation, bf16 output g; r in float64. scale multiplies the float32
 * result before its rounding (a planted scale error). */
static void bf16_gemm(qc_rng *rng, int M, int K, int N, double scale, double *g, double *r) {
  float *a = malloc(sizeof(float) * (size_t)(M * K)), *b = malloc(sizeof(float) * (size_t)(K * N));
  cr_assert(a && b);
  for (int i = 0; i < M * K; i++) a[i] = qc_round_bf16((float)qc_rng_normal(rng));
  for (int i = 0; i < K * N; i++) b[i] = qc_round_bf16((float)(qc_rng_normal(rng) / sqrt(K)));
  for (int i = 0; i < M; i++)
    for (int j = 0; j < N; j++) {
      float acc = 0;
      double ex = 0;
      for (int k = 0; k < K; k++) {
        acc += a[i * K + k] * b[k * N + j];
        ex += (double)a[i * K + k] * b[k * N + j];
      }
      r[i * N + j] = ex;
      g[i * N + j] = qc_round_bf16((float)(acc * scale));
    }
  free(a);
  free(b);
}

Test(bias, correct_bf16_candidates_stay_in_bounds_and_a_0p2_percent_scale_fails) {
  enum { M = 48, K = 256, N = 64, TRIALS = 150 };
  static double g[M * N], r[M * N];
  qc_rng rng;
  qc_rng_seed(&rng, 11);
  int over = 0, caught = 0;
  double sum = 0, sum2 = 0, worst = 0;
  for (int t = 0; t < TRIALS; t++) {
    qc_metrics m;
    bf16_gemm(&rng, M, K, N, 1.0, g, r);
    pass(g, r, M, N, QC_BF16, &m);
    over += fabs(m.bias_z) > QC_BIAS_Z_DEFAULT;
    sum += m.bias_z_raw;
    sum2 += m.bias_z_raw * m.bias_z_raw;
    worst = fmax(worst, fabs(m.bias_z_raw));
    bf16_gemm(&rng, M, K, N, 1.002, g, r);
    pass(g, r, M, N, QC_BF16, &m);
    caught += fabs(m.bias_z) > QC_BIAS_Z_DEFAULT;
  }
  double mean = sum / TRIALS, sd = sqrt(sum2 / TRIALS - mean * mean);
  cr_log_info("correct bf16 GEMMs: raw z mean %.3f sd %.3f max %.3f; 0.2%% scale caught %d/%d", mean, sd, worst, caught, TRIALS);
  cr_expect_eq(over, 0, "%d of %d correct candidates over the bound (max raw |z| %.3g)", over, TRIALS, worst);
  cr_expect(fabs(mean) < 0.5 && sd < 1.5, "raw z mean %.3f sd %.3f: not calibrated", mean, sd);
  cr_expect(caught * 100 >= 99 * TRIALS, "0.2%% scale caught in only %d of %d", caught, TRIALS);
}

/* A rank-one product with one operand rounded to bf16 (a decode-time
 * d_weight = dY^T X from a dequantized X): every column shares the rounding
 * error of its X value, so elementwise the errors are correlated; the
 * column-clustered variance keeps z calibrated where the elementwise one
 * would read ~sqrt(rows) too large. */
Test(bias, correlated_operand_rounding_uses_clusters) {
  enum { R = 64, C = 512, TRIALS = 60 };
  static double g[R * C], r[R * C];
  qc_rng rng;
  qc_rng_seed(&rng, 5);
  double worst = 0, worst_elem = 0;
  for (int t = 0; t < TRIALS; t++) {
    double dy[R], x[C];
    for (int i = 0; i < R; i++) dy[i] = qc_round_bf16((float)qc_rng_normal(&rng));
    for (int j = 0; j < C; j++) x[j] = qc_rng_normal(&rng) * (1 + 0.03 * qc_rng_normal(&rng)); /* not bf16 values */
    for (int i = 0; i < R; i++)
      for (int j = 0; j < C; j++) {
        r[i * C + j] = dy[i] * x[j];
        g[i * C + j] = (float)(dy[i] * qc_round_bf16((float)x[j])); /* float32 output */
      }
    qc_metrics m;
    pass(g, r, R, C, QC_F32, &m);
    worst = fmax(worst, fabs(m.bias_z_raw));
    pass(g, r, 1, R * C, QC_F32, &m); /* one row: the elementwise variance alone */
    worst_elem = fmax(worst_elem, fabs(m.bias_z_raw));
  }
  cr_expect(worst < 5, "correlated rounding errors: max raw |z| %.3g (clusters not used?)", worst);
  cr_expect(worst_elem > 5, "the elementwise variance alone should understate it (max raw |z| %.3g)", worst_elem);
}

Test(bias, values_dtype) {
  double bf[3] = {1.5, -0.0078125, 0}, f16[2] = {1.0009765625, 3}, f32[2] = {1.0 + 1.0 / (1 << 20), 2}, f64[1] = {0.1};
  cr_expect_eq(qc_values_dtype(bf, 3, QC_F32), QC_BF16);
  cr_expect_eq(qc_values_dtype(bf, 3, QC_F64), QC_BF16);
  cr_expect_eq(qc_values_dtype(f16, 2, QC_F32), QC_F16);
  cr_expect_eq(qc_values_dtype(f32, 2, QC_F32), QC_F32);
  cr_expect_eq(qc_values_dtype(f32, 2, QC_F64), QC_F32);
  cr_expect_eq(qc_values_dtype(f64, 1, QC_F64), QC_F64);
  cr_expect_eq(qc_values_dtype(bf, 3, QC_BF16), QC_BF16); /* never wider than the container */
  double nan_bf[2] = {NAN, 2.0};                            /* non-finite values do not decide */
  cr_expect_eq(qc_values_dtype(nan_bf, 2, QC_F32), QC_BF16);
}

Test(bias, verdict_default_on_declared_off_nan_skipped) {
  qc_metrics m;
  memset(&m, 0, sizeof m);
  m.norm_r = m.norm_g = 1;
  m.cosine = 1;
  m.noise_multiple = 1;
  m.bias_z = 7;
  m.e_par = 2e-3;
  char why[256];
  qc_tol t = {.has_rel_l2 = 1, .rel_l2 = 1};
  cr_expect_eq(qc_judge(&m, &t, why, sizeof why), QC_V_FAIL, "the default bound 5 applies");
  cr_expect(strstr(why, "bias_z") != NULL, "%s", why);
  t.has_bias_z = 1;
  t.bias_z = 0;
  cr_expect_eq(qc_judge(&m, &t, why, sizeof why), QC_V_PASS, "bias_z 0 turns the test off: %s", why);
  t.bias_z = 10;
  cr_expect_eq(qc_judge(&m, &t, why, sizeof why), QC_V_PASS, "%s", why);
  m.bias_z = -11;
  cr_expect_eq(qc_judge(&m, &t, why, sizeof why), QC_V_FAIL, "a negative z past the bound fails");
  m.bias_z = NAN; /* not computed (a layer-2 row): skipped by default, failed when declared */
  qc_tol d = {.has_rel_l2 = 1, .rel_l2 = 1};
  cr_expect_eq(qc_judge(&m, &d, why, sizeof why), QC_V_PASS, "%s", why);
  cr_expect_eq(qc_judge(&m, &t, why, sizeof why), QC_V_FAIL);
}

Test(bias, allowance_raises_and_recomputes) {
  qc_metrics m;
  memset(&m, 0, sizeof m);
  m.e_par = 1e-5;
  m.bias_sd = 1e-7;
  m.bias_allow = 0;
  m.bias_z = 100;
  qc_bias_allow(&m, 2e-5);
  cr_expect_eq(m.bias_z, 0.0, "within the model's allowance: z 0");
  m.e_par = -5e-5;
  m.bias_allow = 0;
  qc_bias_allow(&m, 2e-5);
  cr_expect(fabs(m.bias_z + 300) < 1e-6, "z %g: (|e_par| - allowance) / sd with its sign", m.bias_z);
}
