/* test_memo.c: the audit's memo (core/memo.h) keeps values only for the
 * tensors of its scope's sets, finds them by (tensor, tag, length), gives
 * nothing for a copy of such a tensor (a variant's own) or outside a
 * scope, and frees what it kept when the scope changes. */
#include <criterion/criterion.h>
#include <stdlib.h>

#include "core/memo.h"
#include "core/qc.h"
#include "model/module.h"

static float *vals(int64_t n, float v) {
  float *f = malloc((size_t)n * sizeof *f);
  for (int64_t i = 0; i < n; i++) f[i] = v + (float)i;
  return f;
}

Test(memo, own_tensors_only_and_scoped) {
  int64_t shape[2] = {4, 8};
  qc_tset params = {0}, inputs = {0}, copy = {0};
  qc_tensor w, x;
  cr_assert_eq(qc_tensor_alloc(&w, "weight", QC_BF16, 2, shape), QC_OK);
  cr_assert_eq(qc_tensor_alloc(&x, "x", QC_BF16, 2, shape), QC_OK);
  cr_assert_eq(qc_tset_add(&params, &w), QC_OK);
  cr_assert_eq(qc_tset_add(&inputs, &x), QC_OK);
  cr_assert_eq(qc_tset_clone(&copy, &params), QC_OK);
  const qc_tensor *pw = qc_tset_get(&params, "weight"), *px = qc_tset_get(&inputs, "x"), *cw = qc_tset_get(&copy, "weight");

  float *a = vals(32, 1.0f);
  cr_expect_eq(qc_memo_take(pw, "fq fp8", a, 32), 0, "no scope: nothing is kept");
  free(a);

  const qc_tset *sets[2] = {&params, &inputs};
  qc_memo_scope(sets, 2);
  cr_expect_null(qc_memo_get(pw, "fq fp8", 32));
  float *b = vals(32, 2.0f), *c = vals(32, 3.0f);
  cr_assert_eq(qc_memo_take(pw, "fq fp8", b, 32), 1);
  cr_assert_eq(qc_memo_take(px, "fq fp8", c, 32), 1);
  const float *g = qc_memo_get(pw, "fq fp8", 32);
  cr_assert_not_null(g);
  cr_expect_eq(g[5], 7.0f);
  cr_expect_eq(qc_memo_get(px, "fq fp8", 32)[0], 3.0f);
  cr_expect_null(qc_memo_get(pw, "fq nvfp4", 32), "another tag");
  cr_expect_null(qc_memo_get(pw, "fq fp8", 16), "another length");
  cr_expect_null(qc_memo_get(cw, "fq fp8", 32), "a copy of the tensor is not the tensor");
  float *d = vals(32, 4.0f);
  cr_expect_eq(qc_memo_take(cw, "fq fp8", d, 32), 0, "a copy's values are not kept");
  cr_expect_eq(qc_memo_take(pw, "fq fp8", d, 32), 0, "one value a key");
  free(d);
  cr_expect_eq(qc_memo_take(pw, "huge", (float *)&c, qc_memo_budget()), 0, "over the budget");

  qc_memo_scope(NULL, 0); /* frees b and c (ASan would see a leak or a double free) */
  cr_expect_null(qc_memo_get(pw, "fq fp8", 32), "nothing after the scope closes");

  setenv("QATCHECK_MEMO", "0", 1); /* the benchmarks' side by side: a scope that keeps nothing */
  qc_memo_scope(sets, 2);
  float *e = vals(32, 5.0f);
  cr_expect_eq(qc_memo_take(pw, "fq fp8", e, 32), 0, "QATCHECK_MEMO=0 keeps nothing");
  free(e);
  qc_memo_scope(NULL, 0);
  unsetenv("QATCHECK_MEMO");
  qc_tset_free(&params), qc_tset_free(&inputs), qc_tset_free(&copy);
}
