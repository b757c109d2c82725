/* test_rope.c: the builtin RoPE VJP against the float64 reference (both
 * layouts, partial rotary_dim, offset, inverse), planted defects (wrong
 * layout, the forward rotation instead of its transpose, offset ignored),
 * bad input. */
#include <criterion/criterion.h>
#include <string.h>

#include "backend/backend.h"
#include "class_harness.h"
#include "engine/fd.h"
#include "core/qc.h"

#define ROPE_TOL 1e-4 /* cases/rope.json: fp32 angles for positions < 5000 */

Test(rope, builtin_matches_reference) {
  const char *shapes[] = {"1,8,128", "127,32,128", "1024,8,64", "3,1,6"};
  const char *half[] = {"layout=half", NULL};
  const char *inter[] = {"layout=interleaved", "inverse=yes", "position_offset=517", NULL};
  const char *part[] = {"rotary_dim=4", "theta=1000000", NULL};
  const char *const *sets[] = {half, inter, part};
  h_sweep("rope", shapes, 4, sets, 3, 31, ROPE_TOL, ROPE_TOL);
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
  h_inst in;
  h_make(&in, "rope", "4,2,8", 1, "normal", NULL);
  cr_assert_eq(qc_fd_parse_set(&in.m.contract, "rotary_dim=5"), QC_OK);
  h_expect_refused(&in, "rotary_dim");
  cr_assert_eq(qc_fd_parse_set(&in.m.contract, "rotary_dim=0"), QC_OK);
  qc_tensor *p = qc_tset_get_mut(&in.m.inputs, "positions");
  p->shape[0] = 3;
  h_expect_refused(&in, "positions");
  p->shape[0] = 4;
  h_free(&in);
}
