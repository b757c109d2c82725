/* test_kv_quant.c: the kv_quant class (FP8 KV-cache fake quantization):
 * the builtin identity STE against the float64 reference over shapes and
 * contracts (DeepSeek V4's 448 fp8 + 64 bf16 split, compressed, indexer,
 * per-tensor and float scales, e5m2); the reference forward against the
 * generator's outputs/y (the producer's float32 arithmetic) element for
 * element; planted defects: d_x through the quantizer's derivative (zero)
 * fails d_x, and the forward under a split one channel off, without the
 * floor, or returning the cache bytes differs; bad input refused. */
#include <criterion/criterion.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "class_harness.h"
#include "core/qc.h"
#include "engine/fd.h"

#define KVQ_TOL 1e-7 /* d_x = dY copied: exact */

static const char *dsv4[] = {"fp8_channels=448", "block=64", NULL};
static const char *comp[] = {"fp8_channels=448", "kv_kind=compressed", NULL};
static const char *idx[] = {"kv_kind=indexer", "block=128", NULL};
static const char *tens[] = {"scale=tensor", "tensor_scale=0.0123", NULL};
static const char *flt[] = {"scale_fmt=float", "block=0", "format=e5m2", NULL};

Test(kv_quant, builtin_matches_reference) {
  const char *shapes[] = {"7,512", "3,2,512", "1,512"};
  const char *const *sets[] = {dsv4, comp, idx, tens, flt};
  h_sweep("kv_quant", shapes, 3, sets, 5, 39, KVQ_TOL, KVQ_TOL);
}

/* d_x through the quantizer's own derivative: zero almost everywhere. */
static int kvq_dx_zero(const qc_ctx *ctx, const qc_module *m, const qc_tensor *dy, qc_tset *grads) {
  int rc = h_prod(m->cls->name)(ctx, m, dy, grads);
  if (rc) return rc;
  qc_tensor *t = qc_tset_get_mut(grads, "d_x");
  memset(t->data, 0, (size_t)qc_numel(t) * sizeof(float));
  return QC_OK;
}

Test(kv_quant, planted_backward_defect_fails_on_d_x) {
  h_inst in;
  h_make(&in, "kv_quant", "7,512", 5, "normal", dsv4);
  h_expect_pass(&in, KVQ_TOL);
  h_expect_fail(&in, kvq_dx_zero, KVQ_TOL, "d_x");
  h_free(&in);
}

/* The reference forward of in's module under the extra setting kv (NULL:
 * none), against the generated outputs/y: the count of elements that
 * differ (NaN differs). */
static int64_t fwd_diff(h_inst *in, const char *kv) {
  qc_module alt = in->m;
  qc_contract c = in->m.contract;
  alt.contract = c;
  if (kv) cr_assert_eq(qc_fd_parse_set(&alt.contract, kv), QC_OK);
  qc_ctx ctx;
  memset(&ctx, 0, sizeof ctx);
  qc_tensor r = {0};
  qc_tol_model tm;
  cr_assert_eq(in->row->forward(&ctx, &alt, &r, &tm), QC_OK, "%s", qc_err_msg());
  const qc_tensor *y = qc_tset_get(&in->m.outputs, "y");
  cr_assert(y && y->dtype == QC_F32 && qc_numel(y) == qc_numel(&r));
  cr_assert(tm.exact, "a float32 y holds the decoded values: judged bit for bit");
  int64_t d = 0;
  for (int64_t i = 0; i < qc_numel(y); i++) {
    double a = ((const float *)y->data)[i], b = ((const double *)r.data)[i];
    if (!(a == b) || signbit(a) != signbit(b)) d++;
  }
  qc_tensor_free(&r);
  return d;
}

Test(kv_quant, reference_forward_is_the_producers_bit_for_bit) {
  const char *const *sets[] = {dsv4, comp, idx, tens, flt};
  const char *shapes[] = {"7,512", "6,512", "5,3,512"};
  for (int s = 0; s < 5; s++)
    for (int k = 0; k < 3; k++) {
      h_inst in;
      h_make(&in, "kv_quant", shapes[k], 11 + (uint64_t)k, k == 2 ? "special" : "normal", sets[s]);
      cr_assert_eq(fwd_diff(&in, NULL), 0, "set %d shape %s", s, shapes[k]);
      h_free(&in);
    }
}

Test(kv_quant, planted_forward_defects_differ) {
  h_inst in;
  h_make(&in, "kv_quant", "7,512", 3, "normal", dsv4);
  cr_assert_gt(fwd_diff(&in, "fp8_channels=449"), 0, "the split one channel off");
  cr_assert_gt(fwd_diff(&in, "fp8_channels=447"), 0, "the split one channel off");
  cr_assert_gt(fwd_diff(&in, "scale_fmt=float"), 0, "UE8M0 missing");
  cr_assert_gt(fwd_diff(&in, "swa_amax_floor=1e-9"), 0, "the floor too low (row 2 is under 1e-4)");
  cr_assert_gt(fwd_diff(&in, "scale=tensor"), 0, "a per-tensor scale for the per-block ones");
  /* a power-of-two scale twice as large moves only subnormal fp8 values:
   * not a defect this data can show (docs/classes.md, kv_quant) */
  h_free(&in);
}

Test(kv_quant, bad_input_is_refused) {
  h_inst in;
  h_make(&in, "kv_quant", "4,16", 1, "normal", NULL);
  cr_assert_eq(qc_fd_parse_set(&in.m.contract, "fp8_channels=17"), QC_OK);
  h_expect_refused(&in, "fp8_channels");
  cr_assert_eq(qc_fd_parse_set(&in.m.contract, "fp8_channels=3.5"), QC_OK);
  h_expect_refused(&in, "fp8_channels");
  cr_assert_eq(qc_fd_parse_set(&in.m.contract, "fp8_channels=8"), QC_OK);
  cr_assert_eq(qc_fd_parse_set(&in.m.contract, "swa_amax_floor=0"), QC_OK);
  h_expect_refused(&in, "floor");
  h_free(&in);
}
