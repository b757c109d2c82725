/* test_derive.c: the tolerance keys of issue 16 in a case (bias_z, dtype,
 * {"derive": true} with its options), each refusal on its own, and the
 * derived tolerance of one check from a class's error model, a zero
 * reference included; the model kept for a (module, dY)'s other checks. */
#include <criterion/criterion.h>
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "class_harness.h"
#include "core/qc.h"
#include "engine/audit.h"
#include "model/case.h"
#include "model/tol.h"

#define GEN "\"module\": \"linear\", \"data\": {\"generate\": {\"shapes\": [[2, 3, 4]]}}"

static int parse_tol(const char *member, qc_case *c) {
  char text[1024];
  snprintf(text, sizeof text, "{" GEN ", \"tolerances\": {\"d_x\": %s}}", member);
  qc_err_clear();
  return qc_case_parse(text, "t.json", "/cases", c);
}

Test(derive, case_keys) {
  qc_case c;
  cr_assert_eq(parse_tol("{\"derive\": true}", &c), QC_OK, "%s", qc_err_msg());
  const qc_tol *t = qc_case_tol_for(&c, NULL, "d_x");
  cr_expect(t->derive && t->derive_rounded_operands == -1 && t->derive_margin == 0 && !t->derive_format[0]);
  cr_expect(!t->has_rel_l2 && !t->has_bias_z);
  cr_assert_eq(parse_tol("{\"derive\": true, \"margin\": 3, \"rounded_operands\": 1, \"format\": \"nvfp4\", \"bias_z\": 0, "
                         "\"dtype\": \"bfloat16\", \"reasoning\": \"dequantized weight cast to bf16\"}", &c),
               QC_OK, "%s", qc_err_msg());
  t = qc_case_tol_for(&c, NULL, "d_x");
  cr_expect(t->derive_margin == 3 && t->derive_rounded_operands == 1 && strcmp(t->derive_format, "nvfp4") == 0);
  cr_expect(t->has_bias_z && t->bias_z == 0 && strcmp(t->dtype, "bfloat16") == 0);
  cr_assert_eq(parse_tol("{\"rel_l2\": 4e-3, \"bias_z\": 3, \"dtype\": \"float32\", \"reasoning\": \"r\"}", &c), QC_OK, "%s",
               qc_err_msg());
  t = qc_case_tol_for(&c, NULL, "d_x");
  cr_expect(!t->derive && t->has_bias_z && t->bias_z == 3 && strcmp(t->dtype, "float32") == 0);
  /* bias_z alone is a bound */
  cr_expect_eq(parse_tol("{\"bias_z\": 5, \"reasoning\": \"r\"}", &c), QC_OK, "%s", qc_err_msg());
}

Test(derive, each_refusal_names_the_key) {
  static const struct { const char *member, *needle; } bad[] = {
      {"{\"derive\": true, \"rel_l2\": 1e-3}", "'rel_l2'"},
      {"{\"derive\": 1}", "'derive'"},
      {"{\"margin\": 2, \"rel_l2\": 1e-3, \"reasoning\": \"r\"}", "'margin'"},
      {"{\"derive\": true, \"margin\": 0.5}", "'margin'"},
      {"{\"derive\": true, \"rounded_operands\": 3}", "'rounded_operands'"},
      {"{\"derive\": true, \"format\": \"fp9\"}", "fp9"},
      {"{\"derive\": true, \"bias_z\": -1}", "'bias_z'"},
      {"{\"rel_l2\": 1e-3, \"dtype\": \"int8\", \"reasoning\": \"r\"}", "'dtype'"},
      {"{\"bias_z\": 0, \"reasoning\": \"r\"}", "no bound"},
  };
  qc_case c;
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
    cr_expect_eq(parse_tol(bad[i].member, &c), QC_EINPUT, "%s accepted", bad[i].member);
    cr_expect(strstr(qc_err_msg(), bad[i].needle) != NULL, "%s: message '%s' does not name %s", bad[i].member, qc_err_msg(),
              bad[i].needle);
  }
}

Test(derive, fill_from_model) {
  qc_tol_model tm;
  memset(&tm, 0, sizeof tm);
  tm.k = 1024;
  tm.lambda = 1;
  tm.scale = 40;
  snprintf(tm.why, sizeof tm.why, "d_x = dY W sums over the N = 1024 output features");
  qc_tol decl;
  memset(&decl, 0, sizeof decl);
  decl.derive = 1;
  decl.derive_rounded_operands = -1;
  qc_tol_spec spec;
  qc_tol_terms terms;
  double pre;
  cr_assert_eq(qc_tol_from_model(&tm, &decl, "bfloat16", &spec, &terms, &pre), QC_OK, "%s", qc_err_msg());
  qc_tol out;
  qc_tol_fill_derived(&tm, &spec, &terms, &decl, 0, &out);
  /* the qatcheck tol worked example's bounds (K = 1024, bf16 out) */
  cr_expect(out.has_rel_l2 && out.rel_l2 == 0.00391, "rel_l2 %g", out.rel_l2);
  cr_expect(out.has_noise_multiple && out.noise_multiple == 1.01);
  cr_expect(!out.has_max_abs);
  cr_expect(strstr(out.reasoning, "derived: d_x = dY W") != NULL, "%s", out.reasoning);
  cr_expect(pre > 0 && pre < 1e-5, "pre-rounding error %g", pre);
  /* a rounded operand, from the case, widens it */
  decl.derive_rounded_operands = 1;
  cr_assert_eq(qc_tol_from_model(&tm, &decl, "bfloat16", &spec, &terms, &pre), QC_OK);
  qc_tol_fill_derived(&tm, &spec, &terms, &decl, 0, &out);
  cr_expect(out.rel_l2 == 0.00553 && out.noise_multiple == 3.61, "rel_l2 %g nm %g", out.rel_l2, out.noise_multiple);
  /* a float32 gradient: cosine_min floored at 1 - 1e-10 */
  decl.derive_rounded_operands = -1;
  cr_assert_eq(qc_tol_from_model(&tm, &decl, "float32", &spec, &terms, &pre), QC_OK);
  qc_tol_fill_derived(&tm, &spec, &terms, &decl, 0, &out);
  cr_expect(out.cosine_min == 0.9999999999, "cosine_min %.13g", out.cosine_min);
  /* a zero reference: max_abs from the magnitude bound, no relative bound, the reason said */
  qc_tol_fill_derived(&tm, &spec, &terms, &decl, 1, &out);
  cr_expect(out.has_max_abs && out.max_abs > 0 && out.max_abs < 40 * 1e-4, "max_abs %g", out.max_abs);
  cr_expect(!out.has_rel_l2 && !out.has_cosine_min && !out.has_norm_ratio && !out.has_noise_multiple);
  cr_expect(strstr(out.reasoning, "exactly zero") && strstr(out.reasoning, "skipped"), "%s", out.reasoning);
  tm.scale = 0; /* no magnitude bound: exact zero required, said so */
  qc_tol_fill_derived(&tm, &spec, &terms, &decl, 1, &out);
  cr_expect(out.has_max_abs && out.max_abs == 0 && strstr(out.reasoning, "exactly zero"), "%s", out.reasoning);
}

/* Within a (module, dY)'s scope the class's model of each gradient is made
 * once and kept (its variants' checks ask again): asked in any order and
 * again, each gradient gets its own model, the same as outside a scope,
 * and a module or dY other than the scope's is not served from it. */
Test(derive, scope_keeps_each_gradients_model) {
  h_inst a, b;
  h_make(&a, "moe", "9,16,8,5,3", 3, "normal", NULL);
  h_make(&b, "moe", "5,16,8,5,3", 4, "normal", NULL);
  static const char *const g[] = {"d_x", "d_w1", "d_x", "d_w1", "d_x"};
  qc_tol decl;
  memset(&decl, 0, sizeof decl);
  decl.derive = 1;
  qc_audit_model want[2], got;
  for (int i = 0; i < 2; i++)
    cr_assert_eq(qc_audit_derive(&a.m, &a.dy, g[i], QC_BF16, &decl, 0, &want[i], NULL), QC_OK, "%s", qc_err_msg());
  cr_assert(want[0].tm.k != want[1].tm.k || want[0].tm.terms != want[1].tm.terms, "the two gradients' models differ");
  qc_audit_terms_scope(&a.m, &a.dy, NULL);
  for (int i = 0; i < 5; i++) {
    cr_assert_eq(qc_audit_derive(&a.m, &a.dy, g[i], QC_BF16, &decl, 0, &got, NULL), QC_OK, "%s", qc_err_msg());
    cr_expect(memcmp(&got.tm, &want[i % 2].tm, sizeof got.tm) == 0, "%s, asked %d: its own model", g[i], i);
  }
  qc_audit_model other, plain;
  cr_assert_eq(qc_audit_derive(&b.m, &b.dy, "d_x", QC_BF16, &decl, 0, &other, NULL), QC_OK, "%s", qc_err_msg());
  qc_audit_terms_scope(NULL, NULL, NULL);
  cr_assert_eq(qc_audit_derive(&b.m, &b.dy, "d_x", QC_BF16, &decl, 0, &plain, NULL), QC_OK, "%s", qc_err_msg());
  cr_expect(memcmp(&other.tm, &plain.tm, sizeof plain.tm) == 0 && other.tm.terms != want[0].tm.terms,
            "another module in the scope gets its own model");
  h_free(&a);
  h_free(&b);
}
