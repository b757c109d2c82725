/* test_logprob.c: the builtin selected-token log-prob VJP against the
 * float64 reference (normalizations, temperature, vocab shards, masks and
 * padding, special logits), planted defects, bad input. */
#include <criterion/criterion.h>
#include <stdlib.h>
#include <string.h>

#include "backend/backend.h"
#include "class_harness.h"
#include "engine/fd.h"
#include "core/qc.h"

#define LP_TOL 5e-5          /* cases/logprob.json */
#define LP_TOL_SPECIAL 5e-4  /* cases/logprob_special.json: |logits| up to 1e4 */

Test(logprob, builtin_matches_reference) {
  const char *shapes[] = {"1,1,50000", "3,127,1000", "8,64,4000", "4,5,24"};
  const char *sum[] = {"normalization=sum", NULL};
  const char *tok[] = {"normalization=mean_tokens", "temperature=0.6", NULL};
  const char *seq[] = {"normalization=mean_sequences", "vocab_shards=8", "temperature=1.3", NULL};
  const char *const *sets[] = {sum, tok, seq};
  h_sweep("logprob", shapes, 1, sets, 2, 71, LP_TOL, LP_TOL_SPECIAL); /* V = 50000 is not a multiple of 8 */
  h_sweep("logprob", shapes + 1, 3, sets, 3, 72, LP_TOL, LP_TOL_SPECIAL);
}

/* Scale d_logits of the production VJP by f (a wrong constant factor). */
static int scaled(const qc_ctx *ctx, const qc_module *m, const qc_tensor *dy, qc_tset *grads, double f) {
  int rc = m->cls->production(ctx, m, dy, grads);
  if (rc) return rc;
  qc_tensor *t = qc_tset_get_mut(grads, "d_logits");
  for (int64_t i = 0; i < qc_numel(t); i++) ((float *)t->data)[i] *= (float)f;
  return QC_OK;
}

/* mean_tokens normalized over every position (padding and prompt included)
 * instead of the counted tokens */
static int lp_wrong_count(const qc_ctx *ctx, const qc_module *m, const qc_tensor *dy, qc_tset *grads) {
  const qc_tensor *mask = qc_tset_get(&m->saved, "loss_mask");
  double *mk = h_f64(mask), n = 0;
  for (int64_t i = 0; i < qc_numel(mask); i++) n += mk[i] != 0;
  free(mk);
  return scaled(ctx, m, dy, grads, n / (double)qc_numel(mask));
}

/* the 1/temperature of d z / d logits dropped */
static int lp_missing_temperature(const qc_ctx *ctx, const qc_module *m, const qc_tensor *dy, qc_tset *grads) {
  return scaled(ctx, m, dy, grads, qc_contract_num(&m->contract, "temperature", 1));
}

/* mean_sequences computed as mean_tokens */
static int lp_wrong_normalization(const qc_ctx *ctx, const qc_module *m, const qc_tensor *dy, qc_tset *grads) {
  return h_prod_with(ctx, m, dy, grads, "normalization=mean_tokens");
}

Test(logprob, planted_defects_fail_naming_tensor) {
  const char *tok[] = {"normalization=mean_tokens", "temperature=0.7", NULL};
  const char *seq[] = {"normalization=mean_sequences", NULL};
  h_inst in;
  h_make(&in, "logprob", "4,64,1000", 13, "normal", tok);
  h_expect_fail(&in, lp_wrong_count, LP_TOL, "d_logits");
  h_expect_fail(&in, lp_missing_temperature, LP_TOL, "d_logits");
  h_free(&in);
  h_make(&in, "logprob", "4,64,1000", 14, "normal", seq);
  h_expect_fail(&in, lp_wrong_normalization, LP_TOL, "d_logits");
  h_free(&in);
}

Test(logprob, bad_input_is_refused) {
  h_inst in;
  h_make(&in, "logprob", "2,6,10", 1, "normal", NULL);
  int64_t *id = qc_tset_get_mut(&in.m.saved, "token_ids")->data, keep = id[3];
  id[3] = 10; /* a counted token id outside the vocab */
  h_expect_refused(&in, "token_ids");
  id[3] = keep;
  cr_assert_eq(qc_fd_parse_set(&in.m.contract, "vocab_shards=3"), QC_OK);
  h_expect_refused(&in, "vocab_shards");
  h_free(&in);
}

/* Masked positions carry id -100 and get exactly zero gradient. */
Test(logprob, masked_positions_get_zero_gradient) {
  qc_ctx ctx = {.be = qc_backend_cpu(), .profile = "vllm"};
  qc_tset g = {0};
  h_inst in;
  h_make(&in, "logprob", "3,8,16", 2, "normal", NULL);
  const qc_tensor *mask = qc_tset_get(&in.m.saved, "loss_mask");
  cr_assert_eq(in.row->cls->production(&ctx, &in.m, &in.dy, &g), QC_OK);
  const float *d = qc_tset_get(&g, "d_logits")->data;
  int masked = 0;
  for (int64_t i = 0; i < 24; i++)
    if (((const uint8_t *)mask->data)[i] == 0) {
      masked++;
      for (int v = 0; v < 16; v++) cr_expect_eq(d[i * 16 + v], 0.0f);
    }
  cr_expect(masked >= 8 + 2, "prompt, padding and a fully masked sequence are generated");
  qc_tset_free(&g);
  h_free(&in);
}
