/* test_rope.c: the builtin RoPE VJP against the float64 reference (both
 * layouts, partial rotary_dim, offset, inverse), planted defects (wrong
 * layout, the forward rotation instead of its transpose, offset ignored),
 * bad input. */
#include <criterion/criterion.h>
#include <string.h>

#include "backend/backend.h"
#include "class_harness.h"
#include "fd.h"
#include "qc.h"

#define ROPE_TOL 1e-4 /* cases/rope.json: fp32 angles for positions < 5000 */

Test(rope, builtin_matches_reference) {
  const char *shapes[] = {"1,8,128", "127,32,128", "1024,8,64", "3,1,6"};
  const char *half[] = {"layout=half", NULL};
  const char *inter[] = {"layout=interleaved", "inverse=yes", "position_offset=517", NULL};
  const char *part[] = {"rotary_dim=4", "theta=1000000", NULL};
  const char *const *sets[] = {half, inter, part};
  for (int s = 0; s < 4; s++)
    for (int c = 0; c < 3; c++)
      for (int v = 0; v < 2; v++) {
        h_inst in;
        h_make(&in, "rope", shapes[s], 31 + s, v ? "special" : "normal", sets[c]);
        h_expect_pass(&in, ROPE_TOL);
        h_free(&in);
      }
}

static int rope_wrong_layout(const qc_ctx *ctx, const qc_module *m, const qc_tensor *dy, qc_tset *grads) {
  return h_prod_with(ctx, m, dy, grads, "layout=interleaved");
}

/* the forward's rotation applied to dY (R dy instead of R^T dy) */
static int rope_not_transposed(const qc_ctx *ctx, const qc_module *m, const qc_tensor *dy, qc_tset *grads) {
  return h_prod_with(ctx, m, dy, grads, strcmp(qc_contract_str(&m->contract, "inverse", "no"), "yes") ? "inverse=yes" : "inverse=no");
}

static int rope_offset_ignored(const qc_ctx *ctx, const qc_module *m, const qc_tensor *dy, qc_tset *grads) {
  return h_prod_with(ctx, m, dy, grads, "position_offset=0");
}

Test(rope, planted_defects_fail_naming_tensor) {
  const char *sets[] = {"position_offset=1", NULL};
  h_inst in;
  h_make(&in, "rope", "127,4,64", 7, "normal", sets);
  h_expect_fail(&in, rope_wrong_layout, ROPE_TOL, "d_x");
  h_expect_fail(&in, rope_not_transposed, ROPE_TOL, "d_x");
  h_expect_fail(&in, rope_offset_ignored, ROPE_TOL, "d_x");
  h_free(&in);
}

Test(rope, bad_input_is_refused) {
  qc_ctx ctx = {qc_backend_cpu(), "vllm"};
  qc_tset g = {0};
  const char *odd[] = {"rotary_dim=5", NULL};
  h_inst in;
  h_make(&in, "rope", "4,2,8", 1, "normal", NULL);
  cr_assert_eq(qc_fd_parse_set(&in.m.contract, odd[0]), QC_OK);
  qc_err_clear();
  cr_expect_eq(in.row->reference(&ctx, &in.m, &in.dy, &g), QC_EINPUT);
  cr_expect(strstr(qc_err_msg(), "rotary_dim") != NULL, "%s", qc_err_msg());
  qc_err_clear();
  cr_expect_eq(in.row->cls->production(&ctx, &in.m, &in.dy, &g), QC_EINPUT);
  cr_assert_eq(qc_fd_parse_set(&in.m.contract, "rotary_dim=0"), QC_OK);
  qc_tensor *p = qc_tset_get_mut(&in.m.inputs, "positions");
  p->shape[0] = 3;
  qc_err_clear();
  cr_expect_eq(in.row->reference(&ctx, &in.m, &in.dy, &g), QC_EINPUT);
  cr_expect(strstr(qc_err_msg(), "positions") != NULL, "%s", qc_err_msg());
  p->shape[0] = 4;
  qc_tset_free(&g);
  h_free(&in);
}
