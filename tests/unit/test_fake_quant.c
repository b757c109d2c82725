/* test_fake_quant.c: the fake_quant class (a fake quantizer with a scale
 * contract): the builtin against the float64 reference over shapes and
 * contracts (int8/int4/e4m3/e5m2, per tensor and per channel, every
 * scale_grad, both clip rules, LSQ's g); planted defects: a trainable
 * scale's gradient dropped fails d_scale, a detached scale where the
 * contract says it flows fails d_x, the saturated elements passing dY where
 * the contract zeroes them fails d_x, LSQ's g missing fails d_scale; LSQ's
 * formula on hand-made values; bad input refused. */
#include <criterion/criterion.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "class_harness.h"
#include "core/qc.h"
#include "engine/fd.h"
#include "reference/ref_util.h"

#define FQ_TOL 1e-4 /* d_scale: float32 sums of cancelling terms over up to 4096 elements */

static const char *lsq[] = {"scale_grad=trainable", "grad_scale=lsq", NULL};
static const char *chan[] = {"scale_grad=trainable", "granularity=channel", "axis=1", NULL};
static const char *fp8[] = {"format=e4m3", "clip=clip_first", "granularity=channel", NULL};
static const char *e5[] = {"format=e5m2", "scale_grad=fixed", "saturation_grad=pass", NULL};
static const char *i4[] = {"format=int4", "scale_grad=trainable", "grad_factor=0.25", NULL};
static const char *stop[] = {"scale_grad=stop_gradient", "granularity=channel", NULL};
static const char *flow[] = {"scale_grad=flow", NULL};
static const char *flowc[] = {"scale_grad=flow", "granularity=channel", "axis=-1", "format=e4m3", NULL};

Test(fake_quant, builtin_matches_reference) {
  const char *shapes[] = {"64,256", "7,33", "3,4,16"};
  const char *const *sets[] = {lsq, chan, fp8, e5, i4, stop, flow, flowc};
  h_sweep("fake_quant", shapes, 3, sets, 8, 40, FQ_TOL, FQ_TOL);
}

static int zero_grad(const qc_ctx *ctx, const qc_module *m, const qc_tensor *dy, qc_tset *grads, const char *name) {
  int rc = h_prod(m->cls->name)(ctx, m, dy, grads);
  if (rc) return rc;
  qc_tensor *t = qc_tset_get_mut(grads, name);
  cr_assert(t, "the production returned no %s", name);
  memset(t->data, 0, (size_t)qc_numel(t) * sizeof(float));
  return QC_OK;
}
static int dscale_dropped(const qc_ctx *c, const qc_module *m, const qc_tensor *dy, qc_tset *g) {
  return zero_grad(c, m, dy, g, "d_scale");
}
/* a trainer whose scale was detached (or computed without the amax's path) */
static int detached(const qc_ctx *c, const qc_module *m, const qc_tensor *dy, qc_tset *g) {
  return h_prod_with(c, m, dy, g, "scale_grad=stop_gradient");
}
/* a trainer that passes dY through the saturated elements */
static int sat_pass(const qc_ctx *c, const qc_module *m, const qc_tensor *dy, qc_tset *g) {
  return h_prod_with(c, m, dy, g, "saturation_grad=pass");
}
/* a trainer without LSQ's gradient scale g */
static int no_g(const qc_ctx *c, const qc_module *m, const qc_tensor *dy, qc_tset *g) {
  return h_prod_with(c, m, dy, g, "grad_scale=none");
}

Test(fake_quant, planted_defects_fail_on_their_tensor) {
  h_inst in;
  h_make(&in, "fake_quant", "64,256", 5, "normal", lsq);
  h_expect_pass(&in, FQ_TOL);
  h_expect_fail(&in, dscale_dropped, FQ_TOL, "d_scale");
  h_expect_fail(&in, sat_pass, FQ_TOL, "d_x");
  h_expect_fail(&in, no_g, FQ_TOL, "d_scale");
  h_free(&in);
  h_make(&in, "fake_quant", "64,256", 6, "normal", flow);
  h_expect_pass(&in, FQ_TOL);
  h_expect_fail(&in, detached, FQ_TOL, "d_x");
  h_free(&in);
  h_make(&in, "fake_quant", "16,64", 7, "normal", flowc);
  h_expect_pass(&in, FQ_TOL);
  h_expect_fail(&in, detached, FQ_TOL, "d_x");
  h_free(&in);
}

/* Values to x [1, 4] and scale [1] (float32 tensors, written in place). */
static void set_f32(qc_tset *set, const char *name, const float *v, int64_t n) {
  qc_tensor *t = qc_tset_get_mut(set, name);
  cr_assert(t && qc_numel(t) == n);
  if (t->dtype == QC_F32) {
    memcpy(t->data, v, (size_t)n * sizeof *v);
    return;
  }
  cr_assert_eq(t->dtype, QC_BF16);
  for (int64_t i = 0; i < n; i++) ((uint16_t *)t->data)[i] = (uint16_t)(*(const uint32_t *)&v[i] >> 16);
}

/* LSQ by hand: s = 0.5, x = 0.25 (v 0.5: rounds to 0, ties to even), 1.25
 * (v 2.5: 2), 100 (v 200: saturated at 127), -70 (v -140: at -128);
 * dY = 1, 2, 3, 4: d_scale = 1 (0 - 0.5) + 2 (2 - 2.5) + 3 127 + 4 (-128)
 * = -1.5 + 381 - 512 = -132.5; d_x = 1, 2, 0, 0. */
Test(fake_quant, lsq_formula_by_hand) {
  h_inst in;
  h_make(&in, "fake_quant", "1,4", 1, "normal", (const char *[]){"scale_grad=trainable", NULL});
  const float x[] = {0.25f, 1.25f, 100.0f, -70.0f}, s[] = {0.5f}, g[] = {1, 2, 3, 4};
  set_f32(&in.m.inputs, "x", x, 4);
  set_f32(&in.m.params, "scale", s, 1);
  cr_assert_eq(in.dy.dtype, QC_F32);
  memcpy(in.dy.data, g, sizeof g);
  qc_ctx ctx = {0};
  for (int k = 0; k < 2; k++) {
    qc_tset out = {0};
    cr_assert_eq((k ? in.row->reference : in.row->cls->production)(&ctx, &in.m, &in.dy, &out), QC_OK, "%s", qc_err_msg());
    double *dx = h_f64(qc_tset_get(&out, "d_x")), *ds = h_f64(qc_tset_get(&out, "d_scale"));
    cr_expect_eq(ds[0], -132.5, "%s d_scale %g", k ? "reference" : "production", ds[0]);
    cr_expect(dx[0] == 1 && dx[1] == 2 && dx[2] == 0 && dx[3] == 0);
    free(dx); free(ds);
    qc_tset_free(&out);
  }
  h_free(&in);
}

Test(fake_quant, bad_input_is_refused) {
  h_inst in;
  h_make(&in, "fake_quant", "4,16", 1, "normal", NULL);
  const float neg[] = {-0.5f};
  set_f32(&in.m.params, "scale", neg, 1);
  h_expect_refused(&in, "scale");
  h_free(&in);
  h_make(&in, "fake_quant", "4,16", 1, "normal", (const char *[]){"scale_grad=flow", NULL});
  cr_assert_eq(qc_fd_parse_set(&in.m.contract, "scale_grad=trainable"), QC_OK);
  h_expect_refused(&in, "params/scale");
  h_free(&in);
  h_make(&in, "fake_quant", "4,16", 1, "normal", NULL);
  cr_assert_eq(qc_fd_parse_set(&in.m.contract, "granularity=channel"), QC_OK);
  h_expect_refused(&in, "scale");
  cr_assert_eq(qc_fd_parse_set(&in.m.contract, "axis=2"), QC_OK);
  h_expect_refused(&in, "axis");
  h_free(&in);
}

/* The references' loader decodes a packed float4 tensor's two values a
 * byte into an array sized for them (sized a value a byte before, the
 * decode overran it: `make asan` fails this test on that). */
Test(fake_quant, refu_load_packed_float4) {
  qc_tensor t = {0};
  const int64_t shape[] = {3, 2}; /* 3 rows of 2 bytes: 4 values a row */
  cr_assert_eq(qc_tensor_alloc(&t, "w", QC_E2M1X2, 2, shape), QC_OK);
  const uint8_t b[6] = {0x21, 0x7f, 0x00, 0x9a, 0x44, 0xf8};
  memcpy(t.data, b, sizeof b);
  double *d = qc_refu_load(&t, "packed");
  cr_assert_not_null(d);
  /* e2m1 codes 0..7: 0, 0.5, 1, 1.5, 2, 3, 4, 6; bit 3 the sign; low nibble first */
  static const double v[16] = {0, 0.5, 1, 1.5, 2, 3, 4, 6, -0.0, -0.5, -1, -1.5, -2, -3, -4, -6};
  for (int i = 0; i < 6; i++) {
    cr_expect_eq(d[2 * i], v[b[i] & 0xf], "byte %d low", i);
    cr_expect_eq(d[2 * i + 1], v[b[i] >> 4], "byte %d high", i);
  }
  free(d);
  qc_tensor_free(&t);
}
