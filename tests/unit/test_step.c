/* test_step.c: the float64 recomputation of one optimizer step against
 * hand-computed AdamW and SGD (momentum, weight decay) steps, the global
 * norm and clip coefficient, the fit of a gradient factor, and the step
 * case's refusals. The recomputation against torch's own AdamW is tested
 * end to end on scripts/proxy_sft.py's dumps (tests/e2e/sft_proxy.sh). */
#include <criterion/criterion.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/qc.h"
#include "engine/step.h"
#include "model/l3case.h"

static double g_before[3] = {0.5, -1.0, 2.0}, g_grad[3] = {0.1, -0.2, 0.05}, g_m[3] = {0.01, -0.02, 0.0}, g_v[3] = {1e-4, 2e-4, 5e-5};

static void arm(qc_step_arm *a, qc_step_param *p, double *after) {
  memset(a, 0, sizeof *a);
  memset(p, 0, sizeof *p);
  snprintf(p->name, sizeof p->name, "w");
  p->n = 3;
  p->before = g_before;
  p->grad = g_grad;
  p->exp_avg = g_m;
  p->exp_avg_sq = g_v;
  p->after = after;
  a->nparam = 1;
  a->params = p;
  a->opt = QC_OPT_ADAMW;
  a->lr = 1e-3;
  a->beta1 = 0.9;
  a->beta2 = 0.95;
  a->eps = 1e-8;
  a->weight_decay = 0.1;
  a->step = 3;
  a->grad_scale = 2;
}

Test(step, adamw_by_hand) {
  qc_step_arm a;
  qc_step_param p;
  double after[3], u[3];
  arm(&a, &p, after);
  qc_step_update(&a, &p, 1, QC_STEP_ASIS, u);
  for (int i = 0; i < 3; i++) {
    double g = g_grad[i] / 2, t = 4;
    double m = 0.9 * g_m[i] + 0.1 * g, v = 0.95 * g_v[i] + 0.05 * g * g;
    double want = g_before[i] * (1 - 1e-4) - 1e-3 / (1 - pow(0.9, t)) * m / (sqrt(v) / sqrt(1 - pow(0.95, t)) + 1e-8) - g_before[i];
    cr_expect(fabs(u[i] - want) <= 1e-15 * fabs(want) + 1e-18, "element %d: %.17g vs %.17g", i, u[i], want);
  }
  /* the L2 variant adds wd p to the gradient and does not decay */
  qc_step_update(&a, &p, 1, QC_STEP_L2, u);
  double g = g_grad[0] / 2 + 0.1 * g_before[0], m = 0.9 * g_m[0] + 0.1 * g, v = 0.95 * g_v[0] + 0.05 * g * g;
  double want = -1e-3 / (1 - pow(0.9, 4)) * m / (sqrt(v) / sqrt(1 - pow(0.95, 4)) + 1e-8);
  cr_expect(fabs(u[0] - want) <= 1e-15 * fabs(want));
}

Test(step, sgd_momentum_and_decay) {
  qc_step_arm a;
  qc_step_param p;
  double after[3], u[3], buf[3] = {0.3, 0.1, -0.2};
  arm(&a, &p, after);
  a.opt = QC_OPT_SGD;
  a.momentum = 0.9;
  p.momentum = buf;
  qc_step_update(&a, &p, 0.5, QC_STEP_ASIS, u);
  for (int i = 0; i < 3; i++) {
    double d = g_grad[i] / 2 * 0.5 + 0.1 * g_before[i];
    cr_expect(fabs(u[i] + 1e-3 * (0.9 * buf[i] + d)) < 1e-18);
  }
  a.step = 0; /* the first step: the buffer is the gradient itself */
  qc_step_update(&a, &p, 1, QC_STEP_ASIS, u);
  cr_expect(fabs(u[1] + 1e-3 * (g_grad[1] / 2 + 0.1 * g_before[1])) < 1e-18);
}

Test(step, norm_clip_and_fit) {
  qc_step_arm a;
  qc_step_param p;
  double after[3], u[3];
  arm(&a, &p, after);
  uint8_t tr[1] = {1};
  double norm, coef;
  qc_step_norm(&a, tr, &norm, &coef);
  double want = sqrt(0.05 * 0.05 + 0.1 * 0.1 + 0.025 * 0.025);
  cr_expect(fabs(norm - want) < 1e-15);
  cr_expect_eq(coef, 1, "no clipping declared");
  a.max_grad_norm = 0.05;
  qc_step_norm(&a, tr, &norm, &coef);
  cr_expect(fabs(coef - 0.05 / (want + 1e-6)) < 1e-15);
  /* a trainer that applied half the gradient: the fit finds 0.5 */
  qc_step_update(&a, &p, 0.5, QC_STEP_ASIS, u);
  for (int i = 0; i < 3; i++) after[i] = g_before[i] + u[i];
  double c, rel;
  int ident;
  cr_assert_eq(qc_step_fit(&a, tr, QC_STEP_ASIS, &c, &rel, &ident), QC_OK);
  cr_expect(ident);
  cr_expect(fabs(c - 0.5) < 1e-4, "fitted %g", c);
  cr_expect(rel < 1e-6);
  /* AdamW's first step does not depend on the gradient's scale */
  a.step = 0;
  p.exp_avg = p.exp_avg_sq = NULL;
  a.weight_decay = 0;
  qc_step_update(&a, &p, 1, QC_STEP_ASIS, u);
  for (int i = 0; i < 3; i++) after[i] = g_before[i] + u[i];
  cr_assert_eq(qc_step_fit(&a, tr, QC_STEP_ASIS, &c, &rel, &ident), QC_OK);
  cr_expect_not(ident, "the first step is invariant to the gradient's scale");
}

Test(step, case_refusals) {
  qc_step_case c;
  const char *bad[][2] = {
      {"{\"dump\": \"s.h5\", \"tolerances\": {\"update\": {\"rel_l2\": 1e-3}}}", "reasoning"},
      {"{\"tolerances\": {\"update\": {\"rel_l2\": 1e-3, \"reasoning\": \"r\"}}}", "'dump'"},
      {"{\"dump\": \"s.h5\", \"tolerances\": [1]}", "'tolerances' must be an object"},
      {"{\"dump\": \"s.h5\", \"tolerances\": {\"updates\": {\"rel_l2\": 1e-3, \"reasoning\": \"r\"}}}", "unknown key 'updates'"},
      {"{\"dump\": \"s.h5\", \"tolerances\": {\"update\": {\"reasoning\": \"r\"}}}", "no bound"},
      {"{\"dump\": \"s.h5\", \"tolerances\": {\"update\": {\"rel_l2\": 1, \"reasoning\": \"r\", \"by_param\": [{\"params\": \"(\", \"rel_l2\": 1, \"reasoning\": \"r\"}]}}}",
       "regex"},
      {"{\"dump\": \"s.h5\", \"tolerances\": {\"update\": {\"rel_l2\": 1, \"reasoning\": \"r\", \"by_param\": [{\"rel_l2\": 1, \"reasoning\": \"r\"}]}}}",
       "'params'"},
      {"{\"dump\": [\"a.h5\", \"a.h5\"], \"tolerances\": {\"update\": {\"rel_l2\": 1, \"reasoning\": \"r\"}}}", "twice"},
  };
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
    qc_err_clear();
    cr_expect_eq(qc_step_case_parse(bad[i][0], "c.json", ".", &c), QC_EINPUT, "case %zu", i);
    cr_expect(strstr(qc_err_msg(), bad[i][1]) != NULL, "case %zu: '%s' lacks '%s'", i, qc_err_msg(), bad[i][1]);
  }
  qc_err_clear();
  cr_assert_eq(qc_step_case_parse("{\"dump\": \"s.h5\", \"tolerances\": {\"update\": {\"rel_l2\": 1e-3, \"reasoning\": \"r\", "
                                  "\"by_param\": [{\"params\": \"emb\", \"rel_l2\": 0.1, \"reasoning\": \"e\"}]}}}",
                                  "c.json", ".", &c),
               QC_OK, "%s", qc_err_msg());
  cr_expect_eq(qc_step_tol_for(&c.update, "tok_emb")->rel_l2, 0.1);
  cr_expect_eq(qc_step_tol_for(&c.update, "lm_head")->rel_l2, 1e-3);
  cr_expect_null(qc_step_tol_for(&c.grad_pair, "lm_head"));
  qc_step_case_free(&c);
  /* no tolerances: every update is judged at derived bounds (engine/step.c) */
  cr_assert_eq(qc_step_case_parse("{\"dump\": \"s.h5\"}", "c.json", ".", &c), QC_OK, "%s", qc_err_msg());
  cr_expect_null(qc_step_tol_for(&c.update, "lm_head"));
  qc_step_case_free(&c);
}

/* The derived error bound: zero arithmetic error gives zero; it grows with
 * the unit roundoff, and a moment that cancels is bounded by its terms. */
Test(step, update_err) {
  double before[2] = {0.5, -0.25}, grad[2] = {0.1, 1e-3}, m[2] = {-0.0111, 0.2}, v[2] = {0.01, 0.04}, after[2] = {0.5, -0.25};
  qc_step_param p = {.n = 2, .before = before, .grad = grad, .exp_avg = m, .exp_avg_sq = v, .after = after};
  qc_step_arm a = {.opt = QC_OPT_ADAMW, .lr = 1e-3, .beta1 = 0.9, .beta2 = 0.95, .eps = 1e-8, .weight_decay = 0.1, .grad_scale = 1, .step = 3};
  double e0[2], e1[2], e2[2];
  qc_step_update_err(&a, &p, 1, 0, 0, e0);
  qc_step_update_err(&a, &p, 1, 0x1p-24, 0, e1);
  qc_step_update_err(&a, &p, 1, 0x1p-23, 0, e2);
  for (int i = 0; i < 2; i++) {
    cr_expect_eq(e0[i], 0);
    cr_expect_gt(e1[i], 0);
    cr_expect(fabs(e2[i] - 2 * e1[i]) <= 1e-6 * e2[i], "first order in u");
  }
  /* element 0: b1 m + (1 - b1) g = -0.00999 + 0.01 cancels to 1e-5; its error is bounded by the terms (~0.02 u), not by 1e-5 u */
  double u0 = 1e-3 / (1 - pow(0.9, 4)) * 0.02 * 0x1p-24 / (sqrt(0.95 * 0.01 + 0.05 * 0.01) / sqrt(1 - pow(0.95, 4)));
  cr_expect_gt(e1[0], u0, "the cancelling moment's terms bound its error: %g > %g", e1[0], u0);
}
