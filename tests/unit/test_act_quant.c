/* test_act_quant.c: the act_quant class (an activation composed with a
 * fake quantizer): the builtin against the float64 reference over shapes,
 * activations, both orders and the scale contracts; planted defects: the
 * wrong fusion order fails d_x (either way), a detached scale where the
 * contract says it flows fails d_x, the saturated region passing gradient
 * fails d_x, a trainable scale's gradient dropped fails d_scale, d_x
 * through another activation's derivative fails d_x; bad input refused. */
#include <criterion/criterion.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "class_harness.h"
#include "core/qc.h"
#include "engine/fd.h"

#define AQ_TOL 1e-4

static const char *gelu_flow[] = {"act=gelu", "scale_grad=flow", NULL};
static const char *relu_tr[] = {"act=relu", "scale_grad=trainable", NULL};
static const char *silu_qa[] = {"act=silu", "order=quant_act", "scale_grad=trainable", NULL};
static const char *tanh_fp8[] = {"act=gelu_tanh", "format=e4m3", "scale_grad=flow", "granularity=channel", NULL};
static const char *gelu_qa_flow[] = {"act=gelu", "order=quant_act", "scale_grad=flow", NULL};
static const char *silu_stop[] = {"act=silu", "scale_grad=stop_gradient", "granularity=channel", "axis=1", NULL};
static const char *relu_fixed[] = {"act=relu", "scale_grad=fixed", "format=int4", "saturation_grad=pass", NULL};

Test(act_quant, builtin_matches_reference) {
  const char *shapes[] = {"64,256", "7,33"};
  const char *const *sets[] = {gelu_flow, relu_tr, silu_qa, tanh_fp8, gelu_qa_flow, silu_stop, relu_fixed};
  h_sweep("act_quant", shapes, 2, sets, 7, 40, AQ_TOL, AQ_TOL);
}

static int wrong_order_qa(const qc_ctx *c, const qc_module *m, const qc_tensor *dy, qc_tset *g) {
  return h_prod_with(c, m, dy, g, "order=quant_act");
}
static int wrong_order_aq(const qc_ctx *c, const qc_module *m, const qc_tensor *dy, qc_tset *g) {
  return h_prod_with(c, m, dy, g, "order=act_quant");
}
static int detached(const qc_ctx *c, const qc_module *m, const qc_tensor *dy, qc_tset *g) {
  return h_prod_with(c, m, dy, g, "scale_grad=stop_gradient");
}
static int sat_pass(const qc_ctx *c, const qc_module *m, const qc_tensor *dy, qc_tset *g) {
  return h_prod_with(c, m, dy, g, "saturation_grad=pass");
}
static int dscale_dropped(const qc_ctx *c, const qc_module *m, const qc_tensor *dy, qc_tset *g) {
  int rc = h_prod(m->cls->name)(c, m, dy, g);
  if (rc) return rc;
  qc_tensor *t = qc_tset_get_mut(g, "d_scale");
  cr_assert(t);
  memset(t->data, 0, (size_t)qc_numel(t) * sizeof(float));
  return QC_OK;
}
/* a fused kernel that differentiates another activation (relu's 0/1
 * where the contract says gelu) */
static int other_act(const qc_ctx *c, const qc_module *m, const qc_tensor *dy, qc_tset *g) {
  return h_prod_with(c, m, dy, g, "act=relu");
}

Test(act_quant, planted_defects_fail_on_their_tensor) {
  h_inst in;
  h_make(&in, "act_quant", "64,256", 5, "normal", gelu_flow);
  h_expect_pass(&in, AQ_TOL);
  h_expect_fail(&in, wrong_order_qa, AQ_TOL, "d_x");
  h_expect_fail(&in, detached, AQ_TOL, "d_x");
  h_free(&in);
  h_make(&in, "act_quant", "64,256", 6, "normal", silu_qa);
  h_expect_pass(&in, AQ_TOL);
  h_expect_fail(&in, wrong_order_aq, AQ_TOL, "d_x");
  h_expect_fail(&in, sat_pass, AQ_TOL, "d_x");
  h_free(&in);
  h_make(&in, "act_quant", "64,256", 7, "normal", relu_tr);
  h_expect_pass(&in, AQ_TOL);
  h_expect_fail(&in, dscale_dropped, AQ_TOL, "d_scale");
  h_expect_fail(&in, sat_pass, AQ_TOL, "d_x");
  h_expect_fail(&in, wrong_order_qa, AQ_TOL, "d_x");
  h_free(&in);
  h_make(&in, "act_quant", "64,256", 8, "normal", (const char *[]){"act=gelu", "scale_grad=trainable", NULL});
  h_expect_pass(&in, AQ_TOL);
  h_expect_fail(&in, other_act, AQ_TOL, "d_x");
  h_free(&in);
}

Test(act_quant, bad_input_is_refused) {
  h_inst in;
  h_make(&in, "act_quant", "4,16", 1, "normal", (const char *[]){"scale_grad=stop_gradient", NULL});
  cr_assert_eq(qc_fd_parse_set(&in.m.contract, "scale_grad=fixed"), QC_OK);
  h_expect_refused(&in, "params/scale");
  cr_assert_eq(qc_fd_parse_set(&in.m.contract, "scale_grad=flow"), QC_OK);
  cr_assert_eq(qc_fd_parse_set(&in.m.contract, "amax_floor=0"), QC_OK);
  h_expect_refused(&in, "amax_floor");
  h_free(&in);
}
