/* test_contract.c: the layer-2 sweep's naming (class, layer, expert), the
 * generated-data seed, and the class summary with the outlier rule, on
 * hand-built rows. */
#include <criterion/criterion.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "sweep/sweep.h"
#include "core/qc.h"

static void classify(const char *path, const char *cls, int layer, int expert) {
  char c[QC_PATHLEN];
  int l, e;
  qc_contract_classify(path, c, sizeof c, &l, &e);
  cr_expect_str_eq(c, cls, "%s", path);
  cr_expect_eq(l, layer, "%s: layer %d", path, l);
  cr_expect_eq(e, expert, "%s: expert %d", path, e);
}

Test(contract, classify) {
  classify("/model.layers.3.self_attn.q_proj", "/model.layers.*.self_attn.q_proj", 3, -1);
  classify("/model.layers.17.mlp.experts.5.down_proj", "/model.layers.*.mlp.experts.*.down_proj", 17, 5);
  classify("/model/layers/2/mlp/experts/0/w1", "/model/layers/*/mlp/experts/*/w1", 2, 0);
  classify("/lm_head", "/lm_head", -1, -1);
  /* digits inside a name are not an index; only the first index is the layer */
  classify("/model.layers.4.mlp.fc2.shard.1", "/model.layers.*.mlp.fc2.shard.1", 4, -1);
  classify("/h.0.attn.c_attn", "/h.*.attn.c_attn", 0, -1);
  classify("/experts.7.w2", "/experts.*.w2", -1, 7);
}

Test(contract, expert_name) {
  char out[QC_PATHLEN];
  cr_assert_eq(qc_contract_expert_name("/model.layers.1.mlp.experts.down_proj", 3, out, sizeof out), QC_OK);
  cr_expect_str_eq(out, "/model.layers.1.mlp.experts.3.down_proj");
  cr_assert_eq(qc_contract_expert_name("/model.layers.1.mlp.experts", 0, out, sizeof out), QC_OK);
  cr_expect_str_eq(out, "/model.layers.1.mlp.experts.0");
  /* "experts" must be a whole component */
  qc_err_clear();
  cr_expect_eq(qc_contract_expert_name("/model.layers.1.mlp.num_experts_proj", 0, out, sizeof out), QC_EINPUT);
  cr_expect(strstr(qc_err_msg(), "no 'experts' component") != NULL, "%s", qc_err_msg());
  qc_err_clear();
}

Test(contract, seed_depends_on_module_and_role) {
  uint64_t a = qc_contract_seed(0, "/m.layers.0.q", "dy"), b = qc_contract_seed(0, "/m.layers.1.q", "dy");
  uint64_t c = qc_contract_seed(0, "/m.layers.0.q", "x"), d = qc_contract_seed(1, "/m.layers.0.q", "dy");
  cr_expect_neq(a, b);
  cr_expect_neq(a, c);
  cr_expect_eq(a ^ d, 1u);
  /* empty module and role: FNV-1a 64 of "#" alone */
  cr_expect_eq(qc_contract_seed(0, "", ""), (0xcbf29ce484222325ull ^ (uint64_t)0x23) * 0x100000001b3ull);
}

/* A sweep of n rows of one class with the given rel_l2 and norm ratios. */
static void rows(qc_sweep *s, int n, const double *rel, const double *nr) {
  memset(s, 0, sizeof *s);
  s->rows = calloc((size_t)n, sizeof *s->rows);
  s->n = s->cap = n;
  for (int i = 0; i < n; i++) {
    qc_crow *r = &s->rows[i];
    snprintf(r->module, sizeof r->module, "/model.layers.%d.mlp.down_proj", i);
    snprintf(r->cls, sizeof r->cls, "/model.layers.*.mlp.down_proj");
    r->layer = i;
    r->expert = -1;
    snprintf(r->wfmt, sizeof r->wfmt, "nvfp4");
    snprintf(r->afmt, sizeof r->afmt, "none");
    r->tensor = "d_x";
    r->m.rel_l2 = rel[i];
    r->m.norm_ratio = nr[i];
    r->m.cosine = 1 - rel[i] * rel[i] / 2;
  }
}

Test(contract, outlier_rule_flags_the_far_row_only) {
  double rel[8] = {0.094, 0.093, 0.095, 0.094, 0.0061, 0.092, 0.096, 0.094};
  double nr[8] = {1.001, 0.999, 1.000, 1.002, 1.000, 0.998, 1.001, 1.000};
  qc_sweep s;
  rows(&s, 8, rel, nr);
  cr_assert_eq(qc_contract_summarize(&s), QC_OK);
  cr_assert_eq(s.ncls, 1);
  for (int i = 0; i < 8; i++) cr_expect_eq(s.rows[i].outlier, i == 4, "row %d", i);
  cr_expect_eq(s.cls[0].outliers, 1);
  cr_expect_eq(s.cls[0].layers, 8);
  cr_expect_float_eq(s.cls[0].nr_med, 1.000, 1e-12);
  cr_expect_float_eq(s.cls[0].nr_min, 0.998, 1e-12);
  cr_expect_float_eq(s.cls[0].nr_max, 1.002, 1e-12);
  qc_sweep_free(&s);
}

Test(contract, outlier_rule_norm_ratio_side) {
  /* same error size everywhere, one row 4% too large in norm */
  double rel[6] = {0.027, 0.026, 0.027, 0.028, 0.026, 0.027};
  double nr[6] = {1.000, 0.999, 1.037, 1.001, 1.000, 0.999};
  qc_sweep s;
  rows(&s, 6, rel, nr);
  cr_assert_eq(qc_contract_summarize(&s), QC_OK);
  for (int i = 0; i < 6; i++) cr_expect_eq(s.rows[i].outlier, i == 2, "row %d", i);
  cr_expect(strstr(s.rows[2].outlier_why, "norm ratio") != NULL);
  qc_sweep_free(&s);
}

Test(contract, outlier_rule_quiet_on_identical_and_small_classes) {
  double rel[4] = {0, 0, 0, 0}, nr[4] = {1, 1, 1, 1};
  qc_sweep s;
  rows(&s, 4, rel, nr);
  cr_assert_eq(qc_contract_summarize(&s), QC_OK);
  for (int i = 0; i < 4; i++) cr_expect_eq(s.rows[i].outlier, 0);
  qc_sweep_free(&s);
  /* spread within the 0.05-decade floor: nothing flagged */
  double rel2[5] = {0.010, 0.011, 0.0105, 0.0102, 0.0123}, nr2[5] = {1, 1, 1, 1, 1};
  rows(&s, 5, rel2, nr2);
  cr_assert_eq(qc_contract_summarize(&s), QC_OK);
  for (int i = 0; i < 5; i++) cr_expect_eq(s.rows[i].outlier, 0, "row %d", i);
  qc_sweep_free(&s);
  /* fewer than QC_OUTLIER_MIN_ROWS rows: no judgement, however far */
  double rel3[3] = {0.01, 0.01, 0.5}, nr3[3] = {1, 1, 2};
  rows(&s, 3, rel3, nr3);
  cr_assert_eq(qc_contract_summarize(&s), QC_OK);
  for (int i = 0; i < 3; i++) cr_expect_eq(s.rows[i].outlier, 0);
  qc_sweep_free(&s);
}

Test(contract, classes_split_by_format_and_tensor) {
  double rel[6] = {0.1, 0.1, 0.1, 0.02, 0.02, 0.02}, nr[6] = {1, 1, 1, 1, 1, 1};
  qc_sweep s;
  rows(&s, 6, rel, nr);
  snprintf(s.rows[3].wfmt, sizeof s.rows[3].wfmt, "fp8_block128");
  snprintf(s.rows[4].wfmt, sizeof s.rows[4].wfmt, "fp8_block128");
  s.rows[5].tensor = "d_weight";
  snprintf(s.rows[5].wfmt, sizeof s.rows[5].wfmt, "none");
  snprintf(s.rows[5].afmt, sizeof s.rows[5].afmt, "fp8_token");
  cr_assert_eq(qc_contract_summarize(&s), QC_OK);
  cr_assert_eq(s.ncls, 3);
  cr_expect_str_eq(s.cls[0].wfmt, "nvfp4");
  cr_expect_eq(s.cls[0].rows, 3);
  cr_expect_str_eq(s.cls[1].wfmt, "fp8_block128");
  cr_expect_eq(s.cls[1].rows, 2);
  cr_expect_str_eq(s.cls[2].tensor, "d_weight");
  cr_expect_str_eq(s.cls[2].afmt, "fp8_token");
  qc_sweep_free(&s);
}
