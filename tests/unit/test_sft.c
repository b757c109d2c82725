/* test_sft.c: layer 3's comparison on logs built here: each bound fails at
 * the right x (pointwise at once, the cumulative mean from the 10th point),
 * a missing metric, a gap and too few points are inconclusive, a NaN fails,
 * equivalence passes / deviates / is inconclusive, the noise band, the
 * bootstrap is reproducible, and a pair's verdict and localization follow
 * the rules (forward, backward, late; fail + inconclusive = deviates;
 * config differences and x axes). */
#include <criterion/criterion.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "core/qc.h"
#include "core/rng.h"
#include "engine/sft.h"
#include "model/l3case.h"

/* A log with metric m at steps from..to (every `every`), value f(step). */
static void mklog(qc_l3_log *l, const char *m, int from, int to, int every, double (*f)(int, void *), void *ctx) {
  memset(l, 0, sizeof *l);
  snprintf(l->path, sizeof l->path, "log");
  for (int s = from; s <= to; s += every) {
    cr_assert_eq(qc_l3_log_row(l, s), QC_OK);
    cr_assert_eq(qc_l3_log_set(l, m, strlen(m), f(s, ctx)), QC_OK);
    double tok = 100.0 * s;
    cr_assert_eq(qc_l3_log_set(l, "tokens", 6, tok), QC_OK);
  }
  cr_assert_eq(qc_l3_log_finish(l), QC_OK);
}

static double base(int s, void *ctx) { (void)ctx; return 2.0 + 1.0 / s; }
/* base, times (1 + eps) from step `at` on */
typedef struct { int at; double eps; } bump;
static double bumped(int s, void *ctx) { bump *b = ctx; return base(s, NULL) * (s >= b->at ? 1 + b->eps : 1); }
static double noisy(int s, void *ctx) { return base(s, NULL) + *(double *)ctx * ((s * 7919 % 13) - 6) / 6.0; }

static qc_sft_case *mkcase(double w0, double w1) {
  qc_sft_case *c = calloc(1, sizeof *c);
  c->w0 = w0;
  c->w1 = w1;
  c->narm = 2;
  snprintf(c->arms[0].key, QC_L3_NAME, "under_test");
  snprintf(c->arms[1].key, QC_L3_NAME, "gradient_reference");
  return c;
}

static qc_sft_check pw(const char *m, double rel) {
  qc_sft_check k;
  memset(&k, 0, sizeof k);
  snprintf(k.metric, sizeof k.metric, "%s", m);
  k.b.has_pw_rel = 1;
  k.b.pw_rel = rel;
  snprintf(k.b.reasoning, sizeof k.b.reasoning, "test");
  return k;
}

static void judge(qc_sft_case *c, qc_sft_check *k, qc_l3_log *a, qc_l3_log *b, qc_l3_log *noise, qc_sft_check_res *r) {
  qc_err_clear();
  cr_assert_eq(qc_sft_judge_check(c, k, a, b, noise, 1, r), QC_OK, "%s", qc_err_msg());
}

static void res_free(qc_sft_check_res *r) {
  qc_sft_pair_res p = {.ncheck = 1, .checks = malloc(sizeof *r)};
  p.checks[0] = *r;
  qc_sft_pair_res_free(&p);
}

Test(sft, pointwise_fails_where_it_crosses) {
  qc_sft_case *c = mkcase(1, 50);
  qc_l3_log a, b;
  bump bp = {20, 0.01};
  mklog(&a, "loss", 1, 50, 1, bumped, &bp);
  mklog(&b, "loss", 1, 50, 1, base, NULL);
  qc_sft_check k = pw("loss", 0.005);
  qc_sft_check_res r;
  judge(c, &k, &a, &b, NULL, &r);
  cr_expect_eq(r.verdict, QC_L3_FAIL);
  cr_expect_eq(r.fail_step, 20);
  cr_expect_str_eq(r.bound, "pointwise_rel");
  cr_expect_eq(r.npoints, 50);
  res_free(&r);
  k.b.pw_rel = 0.02;
  judge(c, &k, &a, &b, NULL, &r);
  cr_expect_eq(r.verdict, QC_L3_PASS, "%s", r.why);
  res_free(&r);
  qc_l3_log_free(&a);
  qc_l3_log_free(&b);
  free(c);
}

Test(sft, cumulative_mean_from_the_tenth_point) {
  qc_sft_case *c = mkcase(1, 50);
  qc_l3_log a, b;
  bump bp = {1, 0.01}; /* a 1% bias from the start */
  mklog(&a, "loss", 1, 50, 1, bumped, &bp);
  mklog(&b, "loss", 1, 50, 1, base, NULL);
  qc_sft_check k;
  memset(&k, 0, sizeof k);
  snprintf(k.metric, sizeof k.metric, "loss");
  k.b.has_mean_rel = 1;
  k.b.mean_rel = 0.005;
  qc_sft_check_res r;
  judge(c, &k, &a, &b, NULL, &r);
  cr_expect_eq(r.verdict, QC_L3_FAIL);
  cr_expect_eq(r.fail_step, 10, "judged once it covers 10 points");
  res_free(&r);
  /* a 1-step window: the mean cannot be judged */
  c->w1 = 5;
  judge(c, &k, &a, &b, NULL, &r);
  cr_expect_eq(r.verdict, QC_L3_INCONCLUSIVE, "%s", r.why);
  res_free(&r);
  qc_l3_log_free(&a);
  qc_l3_log_free(&b);
  free(c);
}

Test(sft, missing_metric_gap_and_nan) {
  qc_sft_case *c = mkcase(1, 50);
  qc_l3_log a, b, g;
  mklog(&a, "loss", 1, 50, 1, base, NULL);
  mklog(&b, "loss", 1, 50, 1, base, NULL);
  qc_sft_check k = pw("grad_norm", 0.01);
  qc_sft_check_res r;
  judge(c, &k, &a, &b, NULL, &r);
  cr_expect_eq(r.verdict, QC_L3_INCONCLUSIVE);
  cr_expect(strstr(r.why, "no metric 'grad_norm'") != NULL, "%s", r.why);
  res_free(&r);
  /* a log that stops at step 30 of a window to 50 */
  mklog(&g, "loss", 1, 30, 1, base, NULL);
  k = pw("loss", 0.01);
  judge(c, &k, &g, &b, NULL, &r);
  cr_expect_eq(r.verdict, QC_L3_INCONCLUSIVE);
  cr_expect(strstr(r.why, "gap") != NULL && strstr(r.why, "30") != NULL, "%s", r.why);
  res_free(&r);
  qc_l3_log_free(&g);
  /* a hole in the middle: steps 1..20 and 26..50 */
  memset(&g, 0, sizeof g);
  for (int s = 1; s <= 50; s++) {
    if (s > 20 && s < 26) continue;
    qc_l3_log_row(&g, s);
    qc_l3_log_set(&g, "loss", 4, base(s, NULL));
  }
  qc_l3_log_finish(&g);
  judge(c, &k, &g, &b, NULL, &r);
  cr_expect_eq(r.verdict, QC_L3_INCONCLUSIVE);
  cr_expect(strstr(r.why, "from step 20 to 26") != NULL, "%s", r.why);
  res_free(&r);
  /* a metric logged every 10 steps has no gap at that interval */
  qc_l3_log_free(&g);
  mklog(&g, "loss", 1, 50, 10, base, NULL);
  judge(c, &k, &g, &b, NULL, &r);
  cr_expect_eq(r.verdict, QC_L3_PASS, "%s", r.why);
  cr_expect_eq(r.npoints, 5);
  res_free(&r);
  qc_l3_log_free(&g);
  /* a NaN is data: it fails */
  memset(&g, 0, sizeof g);
  for (int s = 1; s <= 50; s++) {
    qc_l3_log_row(&g, s);
    qc_l3_log_set(&g, "loss", 4, s == 33 ? NAN : base(s, NULL));
  }
  qc_l3_log_finish(&g);
  k.b.pw_rel = 10;
  judge(c, &k, &g, &b, NULL, &r);
  cr_expect_eq(r.verdict, QC_L3_FAIL);
  cr_expect_eq(r.fail_step, 33);
  cr_expect_str_eq(r.bound, "nonfinite");
  res_free(&r);
  qc_l3_log_free(&g);
  qc_l3_log_free(&a);
  qc_l3_log_free(&b);
  free(c);
}

Test(sft, bootstrap_reproducible_and_covering) {
  double d[500];
  for (int i = 0; i < 500; i++) d[i] = 0.01 + 0.1 * sin(i * 0.7) + 0.05 * cos(i * 2.3);
  double lo, hi, lo2, hi2, lo3, hi3;
  cr_assert_eq(qc_sft_bootstrap(d, 500, 8, 2000, 42, 0.05, &lo, &hi), QC_OK);
  cr_assert_eq(qc_sft_bootstrap(d, 500, 8, 2000, 42, 0.05, &lo2, &hi2), QC_OK);
  cr_assert_eq(qc_sft_bootstrap(d, 500, 8, 2000, 43, 0.05, &lo3, &hi3), QC_OK);
  cr_expect(lo == lo2 && hi == hi2, "the same seed, the same interval");
  cr_expect(lo != lo3 || hi != hi3, "another seed, another draw");
  double m = 0;
  for (int i = 0; i < 500; i++) m += d[i];
  m /= 500;
  cr_expect(lo < m && m < hi && hi - lo < 0.05, "[%g, %g] around %g", lo, hi, m);
  cr_expect_eq(qc_sft_bootstrap(d, 1, 1, 100, 0, 0.05, &lo, &hi), QC_EINPUT);
}

Test(sft, equivalence_three_ways) {
  qc_sft_case *c = mkcase(1, 200);
  qc_l3_log a, b;
  double amp = 0.01;
  mklog(&a, "loss", 1, 200, 1, noisy, &amp);
  mklog(&b, "loss", 1, 200, 1, base, NULL);
  qc_sft_check k;
  memset(&k, 0, sizeof k);
  snprintf(k.metric, sizeof k.metric, "loss");
  k.b.has_equiv = 1;
  k.b.eq_alpha = 0.05;
  k.b.eq_resamples = 1000;
  k.b.eq_delta = 0.01;
  qc_sft_check_res r;
  judge(c, &k, &a, &b, NULL, &r);
  cr_expect_eq(r.verdict, QC_L3_PASS, "%s [%g, %g]", r.why, r.eq_lo, r.eq_hi);
  res_free(&r);
  k.b.eq_delta = 1e-5;
  judge(c, &k, &a, &b, NULL, &r);
  cr_expect_eq(r.verdict, QC_L3_INCONCLUSIVE, "an interval across the tiny margin: %s", r.why);
  res_free(&r);
  qc_l3_log_free(&a);
  bump bp = {1, 0.05};
  mklog(&a, "loss", 1, 200, 1, bumped, &bp);
  k.b.eq_delta = 0.01;
  judge(c, &k, &a, &b, NULL, &r);
  cr_expect_eq(r.verdict, QC_L3_FAIL, "%s", r.why);
  cr_expect_eq(r.fail_step, 200, "judged at the window's end");
  res_free(&r);
  qc_l3_log_free(&a);
  qc_l3_log_free(&b);
  free(c);
}

Test(sft, noise_band) {
  qc_sft_case *c = mkcase(1, 100);
  qc_l3_log a, b, n[2];
  double a1 = 0.02, a2 = -0.02;
  mklog(&b, "loss", 1, 100, 1, base, NULL);
  mklog(&n[0], "loss", 1, 100, 1, noisy, &a1);
  mklog(&n[1], "loss", 1, 100, 1, noisy, &a2);
  bump bp = {60, 0.2};
  mklog(&a, "loss", 1, 100, 1, bumped, &bp);
  qc_sft_check k;
  memset(&k, 0, sizeof k);
  snprintf(k.metric, sizeof k.metric, "loss");
  k.b.has_noise = 1;
  k.b.noise_multiple = 3;
  k.b.nnoise = 2;
  qc_sft_check_res r;
  judge(c, &k, &a, &b, n, &r);
  cr_expect_eq(r.verdict, QC_L3_FAIL, "%s", r.why);
  cr_expect_eq(r.fail_step, 60);
  cr_expect_str_eq(r.bound, "noise_multiple");
  res_free(&r);
  qc_l3_log_free(&n[1]);
  mklog(&n[1], "loss", 1, 50, 1, noisy, &a2); /* a noise log that stops early */
  judge(c, &k, &b, &b, n, &r);
  cr_expect_eq(r.verdict, QC_L3_INCONCLUSIVE, "%s", r.why);
  res_free(&r);
  for (int i = 0; i < 2; i++) qc_l3_log_free(&n[i]);
  qc_l3_log_free(&a);
  qc_l3_log_free(&b);
  free(c);
}

/* ---- pairs through the whole run: a case on files -------------------------------------- */

static char g_dir[256];

static void put_file(const char *name, const char *text) {
  char p[512];
  snprintf(p, sizeof p, "%s/%s", g_dir, name);
  FILE *f = fopen(p, "w");
  cr_assert_not_null(f);
  fputs(text, f);
  fclose(f);
}

/* The controlled variables the tests' configs record beside lr, seed and
 * precision (every one of the method's: an unrecorded one is inconclusive). */
#define OTHER_JSON "\"init_weights\": \"h\", \"optimizer_state\": null, \"data\": \"d\", \"data_order\": 1, \"labels_mask\": \"all\", \"packing\": false, \"loss_normalization\": \"mean\", \"global_batch\": 8, \"grad_accumulation\": 1, \"lr_schedule\": \"constant\", \"clipping\": null, \"loss_scaling\": null, \"recompute\": \"none\", "
#define OTHER_YAML "init_weights: h\noptimizer_state: null\ndata: d\ndata_order: 1\nlabels_mask: all\npacking: false\nloss_normalization: mean\nglobal_batch: 8\ngrad_accumulation: 1\nlr_schedule: constant\nclipping: null\nloss_scaling: null\nrecompute: none\n"

/* A JSONL log: loss and grad_norm for steps 1..30; `loss0` and `gn1` move
 * step 1's loss and step 2's grad_norm, `late` every loss from step 20. */
static void jlog(const char *name, double loss0, double gn1, double late, int tok) {
  char p[512];
  snprintf(p, sizeof p, "%s/%s", g_dir, name);
  FILE *f = fopen(p, "w");
  for (int s = 1; s <= 30; s++)
    fprintf(f, "{\"step\": %d, \"tokens\": %d, \"loss\": %.17g, \"grad_norm\": %.17g}\n", s, s * tok,
            (2 + 1.0 / s) * (s == 1 ? loss0 : 1) * (s >= 20 ? late : 1), 1.5 * (s == 2 ? gn1 : 1));
  fclose(f);
}

static int run(const char *pairs, qc_sft_pair_res *out) {
  char text[4096];
  snprintf(text, sizeof text,
           "{\"arms\": {\"under_test\": {\"log\": \"a.jsonl\", \"config\": \"a.json\"},"
           " \"gradient_reference\": {\"log\": \"b.jsonl\", \"config\": \"b.yaml\"},"
           " \"native_baseline\": {\"log\": \"b.jsonl\", \"config\": \"b.yaml\"}},"
           " \"window\": [1, 30], \"expected_differences\": {\"precision\": \"fp8\"}, \"pairs\": {\"under_test~gradient_reference\": %s}}",
           pairs);
  qc_sft_case *c = calloc(1, sizeof *c);
  qc_sft_run *r = calloc(1, sizeof *r);
  qc_err_clear();
  int rc = qc_sft_case_parse(text, "case.json", g_dir, c);
  cr_assert_eq(rc, QC_OK, "%s", qc_err_msg());
  rc = qc_sft_load(r, c);
  cr_assert_eq(rc, QC_OK, "%s", qc_err_msg());
  cr_assert_eq(qc_sft_judge(r), QC_OK, "%s", qc_err_msg());
  *out = r->pairs[0];
  memset(&r->pairs[0], 0, sizeof r->pairs[0]);
  qc_sft_run_free(r);
  qc_sft_case_free(c);
  free(r);
  free(c);
  return QC_OK;
}

#define CHECKS "[{\"metric\": \"loss\", \"window\": [1, 2], \"pointwise_rel\": 0.001, \"reasoning\": \"r\"}," \
               " {\"metric\": \"grad_norm\", \"window\": [1, 2], \"pointwise_rel\": 0.001, \"reasoning\": \"r\"}," \
               " {\"metric\": \"loss\", \"pointwise_rel\": 0.01, \"reasoning\": \"r\"}]"

Test(sft, pair_verdicts_and_localization) {
  snprintf(g_dir, sizeof g_dir, "/tmp/qc_test_sft.%d", (int)getpid());
  char cmd[300];
  snprintf(cmd, sizeof cmd, "mkdir -p %s", g_dir);
  cr_assert_eq(system(cmd), 0);
  put_file("a.json", "{" OTHER_JSON "\"lr\": 1e-4, \"seed\": 1, \"precision\": \"fp8\"}");
  put_file("b.yaml", OTHER_YAML "lr: 0.0001\nseed: 1\nprecision: bf16\n");
  qc_sft_pair_res p;
  jlog("b.jsonl", 1, 1, 1, 100);
  jlog("a.jsonl", 1, 1, 1, 100);
  run(CHECKS, &p);
  cr_expect_eq(p.verdict, QC_L3_PASS, "%s", p.reasons);
  cr_expect_eq(p.loc, QC_LOC_NONE);
  qc_sft_pair_res_free(&p);
  jlog("a.jsonl", 1.05, 1, 1, 100);
  run(CHECKS, &p);
  cr_expect_eq(p.verdict, QC_L3_FAIL);
  cr_expect_eq(p.loc, QC_LOC_FORWARD, "the loss at the initial weights");
  cr_expect_eq(p.first_step, 1);
  cr_expect_eq(p.first_check, 0, "ties: the check listed first");
  qc_sft_pair_res_free(&p);
  jlog("a.jsonl", 1, 1.05, 1, 100);
  run(CHECKS, &p);
  cr_expect_eq(p.loc, QC_LOC_BACKWARD, "grad_norm at the step after x0");
  cr_expect_eq(p.first_step, 2);
  qc_sft_pair_res_free(&p);
  jlog("a.jsonl", 1, 1, 1.05, 100);
  run(CHECKS, &p);
  cr_expect_eq(p.loc, QC_LOC_LATE);
  cr_expect_eq(p.first_step, 20);
  qc_sft_pair_res_free(&p);
  /* a check that fails and one that is inconclusive: deviates */
  run("{\"loss\": {\"pointwise_rel\": 0.01, \"reasoning\": \"r\"}, \"val_nll\": {\"pointwise_rel\": 1, \"reasoning\": \"r\"}}", &p);
  cr_expect_eq(p.verdict, QC_L3_FAIL);
  qc_sft_pair_res_free(&p);
  /* tokens disagree at equal steps: inconclusive, never a pass */
  jlog("a.jsonl", 1, 1, 1, 101);
  run(CHECKS, &p);
  cr_expect_eq(p.verdict, QC_L3_INCONCLUSIVE);
  cr_expect(strstr(p.reasons, "x axes disagree") != NULL, "%s", p.reasons);
  qc_sft_pair_res_free(&p);
  /* a controlled variable that differs and is not expected */
  jlog("a.jsonl", 1, 1, 1, 100);
  put_file("b.yaml", OTHER_YAML "lr: 0.0002\nseed: 1\nprecision: bf16\n");
  run(CHECKS, &p);
  cr_expect_eq(p.verdict, QC_L3_INCONCLUSIVE);
  cr_expect(strstr(p.reasons, "'lr' differs") != NULL, "%s", p.reasons);
  cr_expect(strstr(p.reasons, "precision") == NULL, "an expected difference is no reason: %s", p.reasons);
  qc_sft_pair_res_free(&p);
  snprintf(cmd, sizeof cmd, "rm -rf %s", g_dir);
  cr_expect_eq(system(cmd), 0);
}

Test(sft, case_refusals) {
  qc_sft_case c;
  const char *bad[][2] = {
      {"{\"arms\": {\"a\": {\"log\": \"x\"}, \"b\": {\"log\": \"y\"}}, \"window\": [1, 2], \"pairs\": {\"a~b\": {\"loss\": {\"pointwise_rel\": 0.1}}}}",
       "reasoning"},
      {"{\"arms\": {\"a\": {\"log\": \"x\"}, \"b\": {\"log\": \"y\"}}, \"pairs\": {\"a~b\": {\"loss\": {\"pointwise_rel\": 0.1, \"reasoning\": \"r\"}}}}",
       "window"},
      {"{\"arms\": {\"a\": {\"log\": \"x\"}, \"b\": {\"log\": \"y\"}}, \"window\": [1, 2], \"pairs\": {\"a~c\": {\"loss\": {\"pointwise_rel\": 0.1, \"reasoning\": \"r\"}}}}",
       "a~c"},
      {"{\"arms\": {\"a\": {\"log\": \"x\"}, \"b\": {\"log\": \"y\"}}, \"window\": [1, 2], \"pairs\": {\"a~b\": {\"loss\": {\"reasoning\": \"r\"}}}}",
       "no bound"},
      {"{\"arms\": {\"a\": {\"log\": \"x\"}, \"b\": {\"log\": \"y\"}}, \"window\": [1, 2], \"pairs\": {\"a~b\": {\"loss\": {\"pointwise_rel\": 0.1, \"reasoning\": \"r\", \"pointwise\": 1}}}}",
       "unknown key 'pointwise'"},
      {"{\"arms\": {\"a\": {\"log\": \"x\"}, \"b\": {\"log\": \"y\"}}, \"window\": [1, 2], \"pairs\": {\"a~b\": {\"loss\": {\"noise_multiple\": 3, \"reasoning\": \"r\"}}}}",
       "noise_arms"},
      {"{\"arms\": {\"a\": {\"log\": \"x\"}, \"b\": {\"log\": \"y\"}}, \"window\": [3, 2], \"pairs\": {\"a~b\": {\"loss\": {\"pointwise_rel\": 0.1, \"reasoning\": \"r\"}}}}",
       "ends before"},
  };
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
    qc_err_clear();
    cr_expect_eq(qc_sft_case_parse(bad[i][0], "c.json", ".", &c), QC_EINPUT, "case %zu", i);
    cr_expect(strstr(qc_err_msg(), bad[i][1]) != NULL, "case %zu: '%s' lacks '%s'", i, qc_err_msg(), bad[i][1]);
  }
}

/* The onset of a deviation: a drift from step 330 crosses a bound at 490;
 * the estimate finds 330 (within a few steps), a shift at 200 is a shift
 * at 200, and noise without a change is no onset. */
Test(sft, onset_drift_shift_none) {
  enum { M = 490 };
  double x[M], d[M];
  qc_rng g;
  qc_rng_seed(&g, 3);
  for (int i = 0; i < M; i++) {
    x[i] = i + 1;
    double noise = 1e-3 * (qc_rng_uniform(&g) - 0.5);
    d[i] = 0.002 + noise + (x[i] > 330 ? 2e-4 * (x[i] - 330) : 0);
  }
  int64_t k;
  char kind[8];
  cr_assert_eq(qc_sft_onset(x, d, M, &k, kind), QC_OK);
  cr_expect_str_eq(kind, "drift");
  cr_expect(fabs(x[k] - 330) <= 10, "onset at %g, expected ~330", x[k]);
  for (int i = 0; i < M; i++) d[i] = 1e-3 * (qc_rng_uniform(&g) - 0.5) + (x[i] >= 200 ? 0.01 : 0);
  cr_assert_eq(qc_sft_onset(x, d, M, &k, kind), QC_OK);
  cr_expect_str_eq(kind, "shift");
  cr_expect_eq(x[k], 200);
  for (int i = 0; i < M; i++) d[i] = 1e-3 * (qc_rng_uniform(&g) - 0.5);
  cr_assert_eq(qc_sft_onset(x, d, M, &k, kind), QC_OK);
  cr_expect_str_eq(kind, "none");
  cr_expect_eq(k, M - 1, "no change: the onset is the failure");
  cr_assert_eq(qc_sft_onset(x, d, 3, &k, kind), QC_OK);
  cr_expect_eq(k, 2, "too few points");
}
