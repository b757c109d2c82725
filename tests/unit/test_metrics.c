/* test_metrics.c: metrics on hand-computed vectors and the verdict rules;
 * the one rel_l2 (qc_rel_l2) and the one unit roundoff table
 * (qc_dtype_unit) that every caller shares. */
#include <criterion/criterion.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "core/qc.h"
#include "numerics/decode.h"
#include "numerics/formats.h"
#include "numerics/metrics.h"
#include "model/check.h"
#include "modules/mod_util.h"

Test(metrics, hand_vectors) {
  double g[4] = {1, 2, 3, 4}, r[4] = {1, 2, 3, 5};
  qc_metrics m;
  qc_metrics_compute(g, r, 4, &m);
  cr_expect_float_eq(m.max_abs, 1.0, 1e-15);
  cr_expect_eq(m.worst, 3);
  cr_expect_float_eq(m.rel_l2, 1.0 / sqrt(39.0), 1e-15);
  cr_expect_float_eq(m.norm_ratio, sqrt(30.0) / sqrt(39.0), 1e-15);
  cr_expect_float_eq(m.cosine, 34.0 / (sqrt(30.0) * sqrt(39.0)), 1e-15);
  cr_expect_float_eq(m.sqnr_db, 10 * log10(39.0), 1e-12);
  cr_expect_eq(m.nonfinite, 0);
}

/* qc_rel_l2 is the metrics pass's rel_l2, bit for bit, and holds its floor
 * QC_EPS_NORM for a zero reference. */
Test(metrics, rel_l2_is_the_metrics_pass_one) {
  double g[5] = {1, 2, 3, 4, -1e-3}, r[5] = {1, 2, 3, 5, 7e-4};
  qc_metrics m;
  qc_metrics_compute(g, r, 5, &m);
  cr_expect_eq(qc_rel_l2(g, r, 5), m.rel_l2);
  cr_expect_eq(qc_rel_l2_sums(1.0, 39.0), 1.0 / sqrt(39.0));
  double z[2] = {0, 0}, e[2] = {3e-31, 4e-31};
  cr_expect_float_eq(qc_rel_l2(e, z, 2), 5e-31 / QC_EPS_NORM, 1e-15);
  cr_expect_eq(qc_rel_l2(z, z, 2), 0.0);
}

/* The unit roundoff of every element type: 2^-(significand bits), 0
 * where there is no significand. */
Test(metrics, dtype_unit_roundoff) {
  cr_expect_eq(qc_dtype_unit(QC_F64), 0x1p-53);
  cr_expect_eq(qc_dtype_unit(QC_F32), 0x1p-24);
  cr_expect_eq(qc_dtype_unit(QC_F16), 0x1p-11);
  cr_expect_eq(qc_dtype_unit(QC_BF16), 0x1p-8);
  cr_expect_eq(qc_dtype_unit(QC_E4M3), 0x1p-4);
  cr_expect_eq(qc_dtype_unit(QC_E5M2), 0x1p-3);
  cr_expect_eq(qc_dtype_unit(QC_E2M1X2), 0x1p-2);
  const qc_dtype none[] = {QC_I32, QC_I64, QC_U8, QC_I8, QC_E8M0, QC_DTYPE_COUNT};
  for (size_t i = 0; i < sizeof none / sizeof none[0]; i++) cr_expect_eq(qc_dtype_unit(none[i]), 0.0, "dtype %d", (int)none[i]);
}

Test(metrics, zero_norm_cosine_is_null) {
  double g[3] = {0, 0, 0}, r[3] = {0, 0, 0};
  qc_metrics m;
  qc_metrics_compute(g, r, 3, &m);
  cr_expect(m.cosine_null);
  cr_expect_eq(m.max_abs, 0.0);
  qc_tol t = {.has_rel_l2 = 1, .rel_l2 = 1e-3, .has_cosine_min = 1, .cosine_min = 0.999};
  char why[128];
  cr_expect_eq(qc_judge(&m, &t, why, sizeof why), QC_V_PASS, "%s", why);
  /* candidate non-zero where the reference is zero: max_abs decides, and without a declared max_abs it fails */
  double g2[3] = {0, 1e-3, 0};
  qc_metrics_compute(g2, r, 3, &m);
  cr_expect(m.cosine_null);
  cr_expect_eq(qc_judge(&m, &t, why, sizeof why), QC_V_FAIL);
  qc_tol t2 = t;
  t2.has_max_abs = 1;
  t2.max_abs = 1e-2;
  t2.has_rel_l2 = 0;
  cr_expect_eq(qc_judge(&m, &t2, why, sizeof why), QC_V_PASS, "%s", why);
}

Test(metrics, nan_never_passes) {
  double g[3] = {1, NAN, 3}, r[3] = {1, 2, 3};
  qc_metrics m;
  qc_metrics_compute(g, r, 3, &m);
  cr_expect_eq(m.nonfinite, 1);
  qc_tol t = {.has_max_abs = 1, .max_abs = 1e9};
  char why[128];
  cr_expect_eq(qc_judge(&m, &t, why, sizeof why), QC_V_FAIL);
  cr_expect(strstr(why, "non-finite") != NULL);
  double g3[2] = {INFINITY, 0}, r3[2] = {1, 0};
  qc_metrics_compute(g3, r3, 2, &m);
  cr_expect_eq(qc_judge(&m, &t, why, sizeof why), QC_V_FAIL);
}

Test(metrics, an_overflowing_terms_scale_widens_nothing) {
  double g[2] = {1.01, 0}, r[2] = {1, 0};
  qc_metrics m;
  qc_metrics_compute(g, r, 2, &m);
  m.norm_r = 4.9e-324; /* term_floor / norm_r overflows to inf */
  m.term_floor = 1e300;
  m.rel_l2 = INFINITY;
  qc_tol t = {.has_rel_l2 = 1, .rel_l2 = 1e-3};
  char why[128];
  cr_expect_eq(qc_judge(&m, &t, why, sizeof why), QC_V_FAIL);
  cr_expect(strstr(why, "rel_l2") != NULL);
}

Test(metrics, each_bound_fails_alone) {
  double g[2] = {1.01, 0}, r[2] = {1, 0};
  qc_metrics m;
  qc_metrics_compute(g, r, 2, &m);
  char why[128];
  qc_tol a = {.has_rel_l2 = 1, .rel_l2 = 1e-3};
  cr_expect_eq(qc_judge(&m, &a, why, sizeof why), QC_V_FAIL);
  cr_expect(strstr(why, "rel_l2") != NULL);
  qc_tol b = {.has_norm_ratio = 1, .norm_lo = 0.999, .norm_hi = 1.001};
  cr_expect_eq(qc_judge(&m, &b, why, sizeof why), QC_V_FAIL);
  qc_tol c = {.has_max_abs = 1, .max_abs = 1e-3};
  cr_expect_eq(qc_judge(&m, &c, why, sizeof why), QC_V_FAIL);
  qc_tol d = {.has_rel_l2 = 1, .rel_l2 = 0.02, .has_norm_ratio = 1, .norm_lo = 0.98, .norm_hi = 1.02};
  cr_expect_eq(qc_judge(&m, &d, why, sizeof why), QC_V_PASS, "%s", why);
  m.noise_multiple = NAN;
  qc_tol e = {.has_noise_multiple = 1, .noise_multiple = 2};
  cr_expect_eq(qc_judge(&m, &e, why, sizeof why), QC_V_FAIL); /* NaN is never within a bound */
}

Test(metrics, cosine_accurate_near_one) {
  /* g = r + a perturbation of relative size ~1e-6 over 2^20 elements:
   * 1 - cos ~ 1e-12, where <g,r>/(|g||r|) in double carries ~1e-13 of
   * rounding; the metric must match a long double evaluation to 1e-3 */
  enum { N = 1 << 20 };
  static double g[N], r[N];
  long double sgg = 0, srr = 0, sgr = 0;
  for (int i = 0; i < N; i++) {
    r[i] = 1.0 + (i % 7) * 0.25;
    g[i] = r[i] + ((i % 2) ? 1e-6 : -1e-6) * (1 + (i % 3));
    sgg += (long double)g[i] * g[i];
    srr += (long double)r[i] * r[i];
    sgr += (long double)g[i] * r[i];
  }
  long double exact = 1.0L - sgr / sqrtl(sgg * srr);
  qc_metrics m;
  qc_metrics_compute(g, r, N, &m);
  double got = 1.0 - m.cosine;
  cr_expect(exact > 1e-13L, "exact 1 - cos = %Lg", exact);
  cr_expect(fabsl((long double)got - exact) <= 1e-3L * exact + 2.3e-16L, "1 - cos = %g, exact %Lg", got, exact);
}

Test(metrics, zero_candidate_never_passes_on_cosine_alone) {
  double g[3] = {0, 0, 0}, r[3] = {1, 2, 3};
  qc_metrics m;
  qc_metrics_compute(g, r, 3, &m);
  cr_expect(m.cosine_null);
  char why[160];
  qc_tol c = {.has_cosine_min = 1, .cosine_min = 0.9};
  cr_expect_eq(qc_judge(&m, &c, why, sizeof why), QC_V_FAIL);
  qc_tol n = {.has_norm_ratio = 1, .norm_lo = 0.9, .norm_hi = 1.1};
  cr_expect_eq(qc_judge(&m, &n, why, sizeof why), QC_V_FAIL);
  qc_tol a = {.has_cosine_min = 1, .cosine_min = 0.9, .has_max_abs = 1, .max_abs = 1.0};
  cr_expect_eq(qc_judge(&m, &a, why, sizeof why), QC_V_FAIL); /* max_abs decides: 3 > 1 */
}

/* The chunked parallel pass: the serial pass's values within rounding, the
 * same worst index (ties: the lowest), the same non-finite counts, and
 * bit-identical for 1 and 4 threads. */
Test(metrics, parallel_pass_matches_serial) {
  int64_t n = 3 * 65536 + 17;
  double *g = malloc((size_t)n * 8), *r = malloc((size_t)n * 8);
  cr_assert(g && r);
  uint64_t s = 7;
  for (int64_t i = 0; i < n; i++) {
    s = s * 6364136223846793005ull + 1442695040888963407ull;
    r[i] = ((s >> 11) * 0x1p-53 - 0.5);
    g[i] = r[i] * (1 + 1e-3 * ((i % 13) - 6));
  }
  g[70000] = r[70000] + 5.0; /* the worst, twice: the lower index wins */
  g[140000] = r[140000] + 5.0;
  g[5] = NAN;
  r[190000] = INFINITY;
  qc_metrics a, b, c;
  qc_metrics_compute(g, r, n, &a);
  setenv("QATCHECK_THREADS", "1", 1);
  qc_metrics_compute_par(g, r, n, &b);
  setenv("QATCHECK_THREADS", "4", 1);
  qc_metrics_compute_par(g, r, n, &c);
  unsetenv("QATCHECK_THREADS");
  cr_expect(memcmp(&b, &c, sizeof b) == 0, "thread count changed the result");
  cr_expect_eq(b.worst, 70000);
  cr_expect_eq(a.worst, b.worst);
  cr_expect_eq(a.nonfinite, 1);
  cr_expect_eq(b.nonfinite, 1);
  cr_expect_eq(b.ref_nonfinite, 1);
  cr_expect(fabs(a.rel_l2 - b.rel_l2) <= 1e-13 * a.rel_l2, "rel_l2 %.17g vs %.17g", a.rel_l2, b.rel_l2);
  cr_expect(fabs(a.cosine - b.cosine) <= 1e-14, "cosine %.17g vs %.17g", a.cosine, b.cosine);
  cr_expect(fabs(a.norm_ratio - b.norm_ratio) <= 1e-14, "norm ratio %.17g vs %.17g", a.norm_ratio, b.norm_ratio);
  cr_expect_eq(a.max_abs, b.max_abs);
  free(g);
  free(r);
}

/* A reference r [n] of uniform values scaled 1 to `period` by index, and a
 * candidate g within rel of it (g = r (1 + rel (u - off)), u uniform in
 * [0, 1)), from an LCG seeded with seed: the tests' data. */
static void near_pair(int n, unsigned seed, int period, double rel, double off, double *r, double *g) {
  unsigned s = seed;
  for (int i = 0; i < n; i++) {
    s = s * 1103515245u + 12345u;
    r[i] = ((double)(s >> 8) / 16777216.0 - 0.5) * (1 + i % period);
    g[i] = r[i] * (1 + rel * ((double)(s & 255) / 256.0 - off));
  }
}

/* The host passes run on qc_par_for's threads in pieces fixed by the shape
 * (docs/architecture.md, "compare"): the metrics, the bias test's sums, the
 * values' precision, a tensor's largest magnitude, the terms' scale and the
 * one-pass compare (qc_compare_host) are the same bits on 1, 2 and 5
 * threads. */
Test(metrics, host_passes_same_on_any_thread_count) {
  enum { ROWS = 1500, COLS = 2000, N = ROWS * COLS };
  double *g = malloc(N * sizeof *g), *r = malloc(N * sizeof *r);
  float *f = malloc(N * sizeof *f);
  cr_assert(g && r && f);
  near_pair(N, 12345, 7, 1e-3, 0.5, r, g);
  for (int i = 0; i < N; i++) f[i] = (float)g[i];
  qc_tensor ft = {.dtype = QC_F32, .ndim = 2, .shape = {ROWS, COLS}, .data = f};
  qc_tensor gt = {.dtype = QC_F64, .ndim = 2, .shape = {ROWS, COLS}, .data = g};
  double want[16] = {0}, got[16];
  const char *threads[3] = {"1", "2", "5"};
  for (int t = 0; t < 3; t++) {
    setenv("QATCHECK_THREADS", threads[t], 1);
    qc_metrics m;
    qc_metrics_compute_par(g, r, N, &m);
    cr_assert_eq(qc_bias_pass(g, r, ROWS, COLS, QC_BF16, &m), 0);
    double *fg = malloc(N * sizeof *fg);
    cr_assert_eq(qc_tensor_to_f64(&ft, fg), 0);
    double v[12] = {m.rel_l2, m.norm_g, m.norm_r, m.max_abs, (double)m.worst, m.cosine, m.noise_floor, m.e_par,
                    m.bias_sd, (double)qc_values_dtype(fg, N, QC_F32), qc_mod_maxabs(&ft),
                    qc_mod_terms_tensor(&gt, COLS, 1, &ft, COLS, 1, ROWS, COLS, COLS < ROWS ? COLS : ROWS)};
    qc_metrics mc, mf; /* the one-pass compare of the float32 candidate, against the passes apart */
    cr_assert_eq(qc_compare_host(&ft, r, ROWS, COLS, QC_F32, 1, &mc), 0);
    qc_metrics_compute_par(fg, r, N, &mf);
    cr_assert_eq(qc_bias_pass(fg, r, ROWS, COLS, QC_F32, &mf), 0);
    free(fg);
    cr_expect(fabs(mc.rel_l2 - mf.rel_l2) <= 1e-12 * mf.rel_l2 && fabs(mc.bias_sd - mf.bias_sd) <= 1e-9 * mf.bias_sd &&
                  mc.worst == mf.worst && mc.max_abs == mf.max_abs,
              "the one pass (%a, %a) is the passes apart (%a, %a)", mc.rel_l2, mc.bias_sd, mf.rel_l2, mf.bias_sd);
    double v2[16];
    memcpy(v2, v, sizeof v);
    v2[12] = mc.rel_l2, v2[13] = mc.bias_sd, v2[14] = mc.e_par, v2[15] = (double)qc_values_dtype_of(&ft);
    if (t == 0) memcpy(want, v2, sizeof v2);
    else
      for (int k = 0; k < 16; k++) cr_expect_eq(memcmp(&v2[k], &want[k], sizeof v2[k]), 0, "value %d on %s threads: %a against %a", k, threads[t], v2[k], want[k]);
    memcpy(got, v2, sizeof v2);
  }
  cr_expect(got[9] == (double)QC_F32 && got[15] == (double)QC_F32, "float32 values judged as float32");
  free(g), free(r), free(f);
}

/* The one-pass compare sums most rows four lanes at a time (compare.c,
 * row_lanes) and the rest in its scalar loop: a bf16 candidate against the
 * passes apart (qc_metrics_compute_par and qc_bias_pass, element by
 * element), on a width that is not a multiple of 4, with rows that hold a
 * non-finite candidate or reference value (the scalar loop's rows), a
 * largest difference that occurs twice (the first one is the worst), and
 * the column clusters on. */
Test(metrics, compare_lanes_match_the_passes_apart) {
  enum { ROWS = 300, COLS = 2003, N = ROWS * COLS };
  double *r = malloc(N * sizeof *r), *fg = malloc(N * sizeof *fg);
  uint16_t *b = malloc(N * sizeof *b);
  cr_assert(r && fg && b);
  near_pair(N, 777, 5, 2e-3, 0.4, r, fg); /* fg is the candidate's widened copy below */
  for (int i = 0; i < N; i++) b[i] = qc_f32_to_bf16((float)fg[i]);
  b[7 * COLS + 11] = 0x7fc0;  /* a NaN candidate value */
  b[20 * COLS + 2002] = 0x7f80; /* +Inf in the tail */
  r[41 * COLS + 5] = INFINITY; /* a reference value not finite */
  r[100 * COLS + 9] = 50.0, b[100 * COLS + 9] = qc_f32_to_bf16(40.0f); /* the largest difference, twice */
  r[100 * COLS + 1999] = -50.0, b[100 * COLS + 1999] = qc_f32_to_bf16(-40.0f);
  qc_tensor bt = {.dtype = QC_BF16, .ndim = 2, .shape = {ROWS, COLS}, .data = b};
  cr_assert_eq(qc_tensor_to_f64(&bt, fg), 0);
  qc_metrics mc, mf;
  cr_assert_eq(qc_compare_host(&bt, r, ROWS, COLS, QC_BF16, 1, &mc), 0);
  qc_metrics_compute_par(fg, r, N, &mf);
  cr_assert_eq(qc_bias_pass(fg, r, ROWS, COLS, QC_BF16, &mf), 0);
  cr_expect_eq(mc.nonfinite, mf.nonfinite, "non-finite candidate values: %lld against %lld", (long long)mc.nonfinite, (long long)mf.nonfinite);
  cr_expect_eq(mc.ref_nonfinite, 1);
  cr_expect_eq(mc.worst, 100 * COLS + 9, "worst %lld", (long long)mc.worst);
  cr_expect_eq(mc.worst, mf.worst);
  cr_expect_eq(mc.max_abs, mf.max_abs);
  const double got[5] = {mc.rel_l2, mc.cosine, mc.noise_floor, mc.e_par, mc.bias_sd};
  const double want[5] = {mf.rel_l2, mf.cosine, mf.noise_floor, mf.e_par, mf.bias_sd};
  for (int k = 0; k < 5; k++)
    cr_expect(fabs(got[k] - want[k]) <= 1e-11 * fabs(want[k]) && isfinite(got[k]), "value %d: %a against %a", k, got[k], want[k]);
  free(r), free(fg), free(b);
}

/* A reference that streams (model/sink.h) hands its rows over in blocks:
 * the compare in blocks of any sizes (one row, blocks that start and end
 * inside a row piece, the rest at once) is the one-block compare bit for
 * bit, non-finite values, the worst element and the column clusters
 * included; rows out of order, past the end, or missing at the finish are
 * refused with a message. */
Test(metrics, compare_in_blocks_is_the_whole_bit_for_bit) {
  enum { ROWS = 700, COLS = 1500, N = ROWS * COLS };
  double *r = malloc(N * sizeof *r), *fg = malloc(N * sizeof *fg);
  uint16_t *b = malloc(N * sizeof *b);
  cr_assert(r && fg && b);
  near_pair(N, 4242, 5, 2e-3, 0.4, r, fg);
  for (int i = 0; i < N; i++) b[i] = qc_f32_to_bf16((float)fg[i]);
  b[3 * COLS + 11] = 0x7fc0;   /* a NaN candidate value */
  r[650 * COLS + 5] = INFINITY; /* a reference value not finite */
  qc_tensor bt = {.name = "d_w1", .dtype = QC_BF16, .ndim = 2, .shape = {ROWS, COLS}, .data = b};
  const int64_t blocks[][6] = {{1, 6, 57, 200, 136, 300}, {ROWS, 0, 0, 0, 0, 0}, {350, 350, 0, 0, 0, 0}};
  const qc_dtype dts[2] = {QC_BF16, QC_F32};
  for (int d = 0; d < 2; d++) {
    qc_metrics whole;
    memset(&whole, 0, sizeof whole);
    cr_assert_eq(qc_compare_host(&bt, r, ROWS, COLS, dts[d], 1, &whole), 0);
    for (size_t c = 0; c < sizeof blocks / sizeof blocks[0]; c++) {
      qc_cmp_stream *s;
      qc_metrics m;
      memset(&m, 0, sizeof m);
      cr_assert_eq(qc_cmp_open(&bt, ROWS, COLS, dts[d], 1, &s), 0);
      int64_t at = 0;
      for (int k = 0; k < 6 && blocks[c][k]; k++) {
        cr_assert_eq(qc_cmp_rows(s, r + at * COLS, at, at + blocks[c][k]), 0, "%s", qc_err_msg());
        at += blocks[c][k];
      }
      cr_assert_eq(at, ROWS);
      cr_assert_eq(qc_cmp_finish(s, &m), 0);
      cr_expect_eq(memcmp(&m, &whole, sizeof m), 0, "blocks %zu at %s: rel_l2 %a against %a, bias_sd %a against %a", c,
                   qc_dtype_name(dts[d]), m.rel_l2, whole.rel_l2, m.bias_sd, whole.bias_sd);
    }
  }
  qc_cmp_stream *s;
  qc_metrics m;
  cr_assert_eq(qc_cmp_open(&bt, ROWS, COLS, QC_BF16, 1, &s), 0);
  cr_assert_eq(qc_cmp_rows(s, r, 0, 10), 0);
  qc_err_clear();
  cr_expect_eq(qc_cmp_rows(s, r, 20, 30), QC_EINPUT, "a gap in the rows");
  cr_expect(strstr(qc_err_msg(), "'d_w1'") && strstr(qc_err_msg(), "[20, 30)"), "%s", qc_err_msg());
  qc_err_clear();
  cr_expect_eq(qc_cmp_rows(s, r, 10, ROWS + 1), QC_EINPUT, "past the end");
  qc_err_clear();
  cr_expect_eq(qc_cmp_finish(s, &m), QC_EINPUT, "rows missing at the finish");
  cr_expect(strstr(qc_err_msg(), "10 of 700 rows"), "%s", qc_err_msg());
  qc_err_clear();
  free(r), free(fg), free(b);
}
