/* test_linear_ref.c: the float64 reference linear VJP on small exact
 * cases, and the production VJP against it. */
#include <criterion/criterion.h>
#include <string.h>

#include "backend/backend.h"
#include "model/module.h"
#include "numerics/formats.h"
#include "core/qc.h"

static void put_bf16(qc_tset *s, const char *name, int ndim, const int64_t *shape, const float *v) {
  qc_tensor t;
  cr_assert_eq(qc_tensor_alloc(&t, name, QC_BF16, ndim, shape), QC_OK);
  for (int64_t i = 0; i < qc_numel(&t); i++) ((uint16_t *)t.data)[i] = qc_f32_to_bf16(v[i]);
  cr_assert_eq(qc_tset_add(s, &t), QC_OK);
}

Test(linear, reference_exact_small_case) {
  const qc_registry_row *row = qc_registry_find("linear");
  cr_assert_not_null(row);
  qc_module m;
  memset(&m, 0, sizeof m);
  m.cls = row->cls;
  cr_assert_eq(qc_contract_validate(&m.contract, row->cls->keys, "test"), QC_OK);
  /* X [2,3], W [2,3] (N=2, K=3), b [2], dY [2,2] */
  float x[6] = {1, 2, 3, 4, 5, 6}, w[6] = {1, 0, -1, 2, 1, 0}, b[2] = {0.5f, -0.5f}, dy[4] = {1, 2, 3, 4};
  int64_t xs[2] = {2, 3}, bs[1] = {2}, ds[2] = {2, 2};
  put_bf16(&m.inputs, "x", 2, xs, x);
  put_bf16(&m.params, "weight", 2, xs, w);
  put_bf16(&m.params, "bias", 1, bs, b);
  qc_tensor g;
  cr_assert_eq(qc_tensor_alloc(&g, "dy", QC_BF16, 2, ds), QC_OK);
  for (int i = 0; i < 4; i++) ((uint16_t *)g.data)[i] = qc_f32_to_bf16(dy[i]);
  qc_ctx ctx = {.be = qc_backend_cpu(), .profile = "vllm"};
  qc_tset ref = {0};
  cr_assert_eq(row->reference(&ctx, &m, &g, &ref), QC_OK, "%s", qc_err_msg());
  /* d_x = dY W: row0 = 1*[1,0,-1] + 2*[2,1,0] = [5,2,-1]; row1 = 3*[1,0,-1] + 4*[2,1,0] = [11,4,-3] */
  const double want_dx[6] = {5, 2, -1, 11, 4, -3};
  /* d_weight = dY^T X: row0 = 1*[1,2,3] + 3*[4,5,6] = [13,17,21]; row1 = 2*[1,2,3] + 4*[4,5,6] = [18,24,30] */
  const double want_dw[6] = {13, 17, 21, 18, 24, 30};
  const double want_db[2] = {4, 6};
  const qc_tensor *dx = qc_tset_get(&ref, "d_x"), *dw = qc_tset_get(&ref, "d_weight"), *db = qc_tset_get(&ref, "d_bias");
  cr_assert(dx && dw && db);
  for (int i = 0; i < 6; i++) cr_expect_eq(((double *)dx->data)[i], want_dx[i]);
  for (int i = 0; i < 6; i++) cr_expect_eq(((double *)dw->data)[i], want_dw[i]);
  for (int i = 0; i < 2; i++) cr_expect_eq(((double *)db->data)[i], want_db[i]);
  /* the production VJP gives the same (all values exact in bf16) */
  qc_tset cand = {0};
  cr_assert_eq(row->cls->production(&ctx, &m, &g, &cand), QC_OK, "%s", qc_err_msg());
  const qc_tensor *cx = qc_tset_get(&cand, "d_x");
  cr_assert_not_null(cx);
  cr_expect_eq(cx->dtype, QC_BF16);
  for (int i = 0; i < 6; i++) cr_expect_eq(qc_bf16_to_f32(((uint16_t *)cx->data)[i]), (float)want_dx[i]);
  qc_tset_free(&cand);
  qc_tset_free(&ref);
  qc_tensor_free(&g);
  qc_module_free(&m);
}
