/* test_err.c: the error channel's save and restore (core/qc.h): a
 * speculative call neither loses an error set before it nor leaks its own;
 * and the tied mode's check that cannot be recorded is an error, not a read
 * past the results (engine/modes.c). */
#include <criterion/criterion.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "core/qc.h"
#include "engine/audit.h"
#include "engine/modes.h"
#include "io/dump.h"

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

/* A float32 [2, 2] dataset of value v. */
static void put(qc_dump *d, const char *path, float v) {
  qc_tensor t;
  int64_t shape[2] = {2, 2};
  cr_assert_eq(qc_tensor_alloc(&t, "t", QC_F32, 2, shape), QC_OK);
  for (int i = 0; i < 4; i++) ((float *)t.data)[i] = v;
  cr_assert_eq(qc_dump_write(d, path, &t), QC_OK, "%s", qc_err_msg());
  qc_tensor_free(&t);
}

/* The tie's check cannot be recorded (the result list cannot grow): the
 * mode's audit returns the error; it used to read the last check of a list
 * that holds none. */
Test(err, tied_check_not_recorded_is_an_error) {
  char path[64];
  snprintf(path, sizeof path, "/tmp/qc_test_err_%d.h5", (int)getpid());
  qc_dump *d;
  cr_assert_eq(qc_dump_create(path, &d), QC_OK, "%s", qc_err_msg());
  cr_assert_eq(qc_dump_set_attr(d, "/", "mode", "tied"), QC_OK);
  const char *mods[] = {"/a", "/b"};
  for (int i = 0; i < 2; i++) {
    char p[64];
    cr_assert_eq(qc_dump_set_attr(d, mods[i], "class", "linear"), QC_OK);
    snprintf(p, sizeof p, "%s/params/weight", mods[i]);
    put(d, p, 1.0f);
    snprintf(p, sizeof p, "%s/grad_out/dy", mods[i]);
    put(d, p, 1.0f);
    snprintf(p, sizeof p, "%s/grads/dy/d_weight", mods[i]);
    put(d, p, 0.5f);
  }
  put(d, "/qatcheck_mode/tied/a.weight/accumulated", 1.0f);
  cr_assert_eq(qc_dump_set_attr(d, "/qatcheck_mode/tied/a.weight", "sites", "[\"/a/weight\", \"/b/weight\"]"), QC_OK);
  qc_dump_close(d);

  qc_results ok = {0};
  qc_modinfos mi = {0};
  qc_err_clear();
  cr_assert_eq(qc_modes_audit(path, "", NULL, &ok, &mi), QC_OK, "%s", qc_err_msg());
  cr_assert_eq(ok.n, 1, "the tie is one check");
  cr_expect_eq(ok.v[0].verdict, QC_V_PASS, "%s", ok.v[0].why);
  qc_results_free(&ok);
#if defined(__SANITIZE_ADDRESS__)
  cr_skip_test("AddressSanitizer reserves what the full result list asks for instead of failing");
#endif
  /* a full list whose growth cannot be allocated (2^30 checks) */
  qc_results full = {.n = 1 << 29, .cap = 1 << 29, .v = NULL};
  cr_expect_eq(qc_modes_audit(path, "", NULL, &full, &mi), QC_ESYS);
  cr_expect(strstr(qc_err_msg(), "out of memory") != NULL, "%s", qc_err_msg());
  qc_err_clear();
  unlink(path);
}
