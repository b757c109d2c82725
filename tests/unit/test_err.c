/* test_err.c: the error channel's save and restore (core/qc.h): a
 * speculative call neither loses an error set before it nor leaks its own. */
#include <criterion/criterion.h>
#include <stdio.h>
#include <string.h>

#include "core/qc.h"
#include "engine/audit.h"

Test(err, save_clears_and_restore_puts_back) {
  qc_err_clear();
  qc_err("first");
  qc_hint("its hint");
  qc_err_state s;
  qc_err_save(&s);
  cr_expect_str_eq(qc_err_msg(), "", "the speculative call starts with an empty channel");
  cr_expect_eq(qc_err("the call's own"), QC_EINPUT);
  cr_expect_str_eq(qc_err_msg(), "the call's own", "its own first error is readable");
  qc_err_restore(&s);
  cr_expect_str_eq(qc_err_msg(), "first");
  cr_expect_str_eq(qc_err_hint(), "its hint");
  qc_err_clear();
}

Test(err, keep_lets_the_earlier_error_win) {
  qc_err_clear();
  qc_err_state s;
  qc_err_save(&s); /* nothing before: the call's error is kept */
  qc_err("the probe's");
  qc_err_keep(&s);
  cr_expect_str_eq(qc_err_msg(), "the probe's");
  qc_err_save(&s); /* an earlier error stays first */
  qc_err("later");
  qc_err_keep(&s);
  cr_expect_str_eq(qc_err_msg(), "the probe's");
  qc_err_clear();
}

/* qc_audit_cand_dtype never fails; it used to clear the channel, losing an
 * error set before it. */
Test(err, a_speculative_engine_call_keeps_an_earlier_error) {
  qc_tensor g;
  int64_t shape[1] = {4};
  cr_assert_eq(qc_tensor_alloc(&g, "d_x", QC_F32, 1, shape), QC_OK);
  for (int i = 0; i < 4; i++) ((float *)g.data)[i] = 1.0f + (float)i / 3.0f;
  qc_tol t;
  memset(&t, 0, sizeof t);
  qc_err_clear();
  qc_err("an earlier error");
  cr_expect_eq(qc_audit_cand_dtype(&g, &t, NULL), QC_F32);
  cr_expect_str_eq(qc_err_msg(), "an earlier error");
  qc_err_clear();
  qc_tensor_free(&g);
}
