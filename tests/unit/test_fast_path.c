/* test_fast_path.c: the engine's use of a class's fast path (registry row
 * `fast`), on the CPU with a stub backend whose audit_linear op returns
 * known metrics: the gradients it covers are judged from those metrics, the
 * rest (d_bias) from the two VJPs told to skip what it covered, in the
 * reference's order; a contract or candidate the op cannot reproduce takes
 * the general path; the VJPs honour ctx->skip. */
#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend/backend.h"
#include "core/qc.h"
#include "engine/audit.h"
#include "engine/gen.h"
#include "model/case.h"
#include "model/check.h"
#include "model/module.h"
#include "report/report.h"

static int g_calls;
static int g_seen_slices;          /* the ref_slices the op was asked for */
static qc_linear_audit_out g_refs; /* the reference GEMMs the op says it used (ref_ran, ref_fast, ...) */

/* audit_linear that computes nothing: d_x gets a failing rel_l2 of 0.5, d_weight a passing 1e-9. */
static int stub_audit_linear(const qc_backend *be, const qc_linear_audit *a, qc_linear_audit_out *o) {
  (void)be;
  g_calls++;
  g_seen_slices = a->ref_slices;
  memset(&o->dx, 0, sizeof o->dx);
  memset(&o->dw, 0, sizeof o->dw);
  for (int i = 0; i < 2; i++) {
    o->ref_ran[i] = g_refs.ref_ran[i];
    o->ref_fast[i] = g_refs.ref_fast[i];
    o->ref_err[i] = g_refs.ref_err[i];
    o->ref_err_norm[i] = g_refs.ref_err_norm[i];
    o->ref_gate[i] = g_refs.ref_gate[i];
  }
  o->dx.rel_l2 = 0.5;
  o->dx.norm_ratio = o->dw.norm_ratio = 1.0;
  o->dx.cosine = o->dw.cosine = 1.0;
  o->dx.norm_r = o->dw.norm_r = o->dx.norm_g = o->dw.norm_g = 1.0;
  o->dx.noise_floor = o->dw.noise_floor = 1e-3;
  o->dw.rel_l2 = 1e-9;
  return QC_OK;
}

static qc_backend g_stub;

static const qc_backend *stub(void) {
  g_stub = *qc_backend_cpu();
  g_stub.name = "stub";
  g_stub.audit_linear = stub_audit_linear;
  return &g_stub;
}

static void tol(qc_case *cs) {
  const char *names[] = {"d_x", "d_weight", "d_bias"};
  cs->ntol = 3;
  for (int i = 0; i < 3; i++) {
    snprintf(cs->tol[i].tensor, sizeof cs->tol[i].tensor, "%s", names[i]);
    cs->tol[i].tol.has_rel_l2 = 1;
    cs->tol[i].tol.rel_l2 = 1e-2;
    snprintf(cs->tol[i].tol.reasoning, sizeof cs->tol[i].tol.reasoning, "test");
  }
}

/* A generated bf16 linear [M, K, N] with bias and one random dY, contract kv ("key=value" or NULL). */
static void make(qc_module *m, const char *kv) {
  static const char kinds[1][QC_NAMELEN] = {"random"};
  const qc_registry_row *row = qc_registry_find("linear");
  cr_assert(row && row->fast, "the linear row declares a fast path");
  memset(m, 0, sizeof *m);
  m->cls = row->cls;
  snprintf(m->path, sizeof m->path, "linear");
  if (kv) {
    char k[48], v[64];
    cr_assert_eq(sscanf(kv, "%47[^=]=%63s", k, v), 2);
    char *colon = strchr(v, ':');
    if (colon) { *colon = 0; qc_contract_set(&m->contract, k, v, 3.0, 1); }
    else qc_contract_set(&m->contract, k, v, 0, 0);
  }
  cr_assert_eq(qc_contract_validate(&m->contract, m->cls->keys, "test"), QC_OK, "%s", qc_err_msg());
  int64_t shape[3] = {6, 32, 10};
  cr_assert_eq(qc_gen_module(row, 3, shape, 7, 0, "normal", kinds, 1, m), QC_OK, "%s", qc_err_msg());
}

static unsigned g_variants_off; /* the case's "variants": the parts it does not allow */

static int g_ref_slices; /* the context's --reference */

static int audit(qc_module *m, qc_cand_kind kind, qc_results *res) {
  static qc_case cs;
  memset(&cs, 0, sizeof cs);
  tol(&cs);
  cs.cand = kind;
  cs.variants_off = g_variants_off;
  qc_ctx ctx = {.be = stub(), .profile = "vllm", .ref_slices = g_ref_slices};
  qc_audit a = {.ctx = &ctx, .cs = &cs, .res = res};
  return qc_audit_module(&a, m);
}

Test(fast_path, covered_gradients_judged_from_its_metrics_bias_from_the_vjps) {
  qc_module m;
  qc_results res = {0};
  make(&m, NULL);
  g_calls = 0;
  cr_assert_eq(audit(&m, QC_CAND_BUILTIN, &res), QC_OK, "%s", qc_err_msg());
  cr_expect_eq(g_calls, 1, "the fast path ran once per dY");
  cr_assert_eq(res.n, 3);
  cr_expect_str_eq(res.v[0].tensor, "d_x");
  cr_expect_str_eq(res.v[1].tensor, "d_weight");
  cr_expect_str_eq(res.v[2].tensor, "d_bias");
  /* the stub fails d_x (rel_l2 0.5): as on the host path, the legal
   * reference variants are tried on the host, and the real production's
   * d_x fits one, so the check passes naming it (the fast path's metrics
   * are what made it try) */
  cr_expect_eq(res.v[0].verdict, QC_V_PASS, "d_x: %s", res.v[0].why);
  cr_expect(res.v[0].variant[0] != 0, "d_x passes on a named reference variant");
  cr_expect(res.v[0].variant_id[0] != 0 && strcmp(res.v[0].variant_id, "none") != 0, "and names its parts: %s", res.v[0].variant_id);
  cr_expect_str_eq(res.v[1].variant_id, "", "d_weight is judged against the contract's reference");
  cr_expect_eq(res.v[1].verdict, QC_V_PASS);
  cr_expect_eq(res.v[2].verdict, QC_V_PASS, "d_bias from the production and reference VJPs: %s", res.v[2].why);
  cr_expect(res.v[2].m.rel_l2 < 1e-2 && res.v[2].m.norm_r > 0, "d_bias was really compared");
  cr_expect_str_eq(res.v[0].cand_dtype, "bfloat16");
  cr_expect_eq(res.v[1].shape[0], 10);
  cr_expect_eq(res.v[1].shape[1], 32);
  qc_results_free(&res);
  qc_module_free(&m);
}

/* The case's "variants": "none" holds on the fast path as on the host:
 * the failed d_x is judged against the contract's reference alone. */
Test(fast_path, variants_none_keeps_its_failure) {
  qc_module m;
  qc_results res = {0};
  make(&m, NULL);
  g_variants_off = QC_VAR_ALL;
  int rc = audit(&m, QC_CAND_BUILTIN, &res);
  g_variants_off = 0;
  cr_assert_eq(rc, QC_OK, "%s", qc_err_msg());
  cr_assert_eq(res.n, 3);
  cr_expect_eq(res.v[0].verdict, QC_V_FAIL, "d_x passed on %s", res.v[0].variant);
  cr_expect_str_eq(res.v[0].variant_id, "");
  qc_results_free(&res);
  qc_module_free(&m);
}

Test(fast_path, a_contract_it_cannot_run_takes_the_general_path) {
  const char *kvs[] = {"ste=clipped:3", "dw_input=quantized", "rounding=sr:3"};
  for (size_t i = 0; i < sizeof kvs / sizeof kvs[0]; i++) {
    qc_module m;
    qc_results res = {0};
    make(&m, kvs[i]);
    g_calls = 0;
    cr_assert_eq(audit(&m, QC_CAND_BUILTIN, &res), QC_OK, "%s: %s", kvs[i], qc_err_msg());
    cr_expect_eq(g_calls, 0, "%s: no fast path", kvs[i]);
    cr_assert_eq(res.n, 3);
    for (int j = 0; j < 3; j++) cr_expect_eq(res.v[j].verdict, QC_V_PASS, "%s %s: %s", kvs[i], res.v[j].tensor, res.v[j].why);
    qc_results_free(&res);
    qc_module_free(&m);
  }
}

Test(fast_path, dump_candidate_needs_every_covered_gradient_in_bf16) {
  qc_module m;
  qc_results res = {0};
  make(&m, NULL);
  const qc_registry_row *row = qc_registry_find("linear");
  qc_ctx ctx = {.be = qc_backend_cpu(), .profile = "vllm"};
  m.cand = calloc(1, sizeof *m.cand);
  cr_assert_eq(m.cls->production(&ctx, &m, &m.grad_out.t[0], &m.cand[0]), QC_OK);
  (void)row;
  g_calls = 0;
  cr_assert_eq(audit(&m, QC_CAND_DUMP, &res), QC_OK, "%s", qc_err_msg());
  cr_expect_eq(g_calls, 1, "a complete bf16 dump candidate takes the fast path");
  cr_expect_eq(res.v[2].verdict, QC_V_PASS, "the dump's own d_bias is compared: %s", res.v[2].why);
  qc_results_free(&res);
  /* without d_bias: the general path reports it missing */
  qc_tset *cs = &m.cand[0];
  for (int j = 0; j < cs->n; j++) /* removed (a stray grads/ name would be refused as unjudged) */
    if (strcmp(cs->t[j].name, "d_bias") == 0) {
      qc_tensor_free(&cs->t[j]);
      cs->t[j] = cs->t[--cs->n];
      break;
    }
  g_calls = 0;
  cr_assert_eq(audit(&m, QC_CAND_DUMP, &res), QC_OK, "%s", qc_err_msg());
  cr_expect_eq(g_calls, 0);
  cr_assert_eq(res.n, 3);
  cr_expect_eq(res.v[0].verdict, QC_V_PASS, "d_x on the general path: %s", res.v[0].why);
  cr_expect_str_eq(res.v[2].why, "missing");
  qc_results_free(&res);
  qc_module_free(&m);
}

Test(fast_path, vjps_leave_out_what_ctx_skip_names) {
  qc_module m;
  make(&m, NULL);
  const qc_registry_row *row = qc_registry_find("linear");
  qc_ctx ctx = {.be = qc_backend_cpu(), .profile = "vllm", .skip = "/d_x/d_weight/"};
  qc_tset r = {0}, p = {0};
  cr_assert_eq(row->reference(&ctx, &m, &m.grad_out.t[0], &r), QC_OK, "%s", qc_err_msg());
  cr_assert_eq(row->cls->production(&ctx, &m, &m.grad_out.t[0], &p), QC_OK, "%s", qc_err_msg());
  cr_expect_eq(r.n, 1);
  cr_expect_eq(p.n, 1);
  cr_expect(qc_tset_get(&r, "d_bias") && qc_tset_get(&p, "d_bias"));
  qc_tset_free(&r);
  qc_tset_free(&p);
  ctx.skip = "/d_weight/";
  cr_assert_eq(row->reference(&ctx, &m, &m.grad_out.t[0], &r), QC_OK);
  cr_expect(qc_tset_get(&r, "d_x") && !qc_tset_get(&r, "d_weight") && qc_tset_get(&r, "d_bias"));
  qc_tset_free(&r);
  cr_expect(qc_ctx_wants(&ctx, "d_x"));
  cr_expect(!qc_ctx_wants(&ctx, "d_weight"));
  cr_expect(qc_ctx_wants(&ctx, "weight"), "a name is matched whole, not as a substring");
  qc_module_free(&m);
}

/* A check the fast path failed is diagnosed from the general path's
 * candidate and reference: a dump d_x doubled is named a factor 2; the
 * checks that passed carry no diagnosis; no check is added. */
Test(fast_path, a_failed_fast_check_is_diagnosed_on_the_general_path) {
  qc_module m;
  qc_results res = {0};
  make(&m, NULL);
  qc_ctx ctx = {.be = qc_backend_cpu(), .profile = "vllm"};
  m.cand = calloc(1, sizeof *m.cand);
  cr_assert_eq(m.cls->production(&ctx, &m, &m.grad_out.t[0], &m.cand[0]), QC_OK);
  qc_tensor *dx = qc_tset_get_mut(&m.cand[0], "d_x");
  for (int64_t i = 0; i < qc_numel(dx); i++) {
    uint16_t *p = (uint16_t *)dx->data + i;
    *p = (uint16_t)(*p + (*p & 0x7f80 ? 0x80 : 0)); /* x 2: one more in the exponent */
  }
  g_calls = 0;
  cr_assert_eq(audit(&m, QC_CAND_DUMP, &res), QC_OK, "%s", qc_err_msg());
  cr_expect_eq(g_calls, 1);
  cr_assert_eq(res.n, 3, "diagnosis adds no check");
  cr_expect_eq(res.v[0].verdict, QC_V_FAIL);
  cr_expect(strstr(res.v[0].diagnosis, "k = 2.0") != NULL, "d_x diagnosis: %s", res.v[0].diagnosis);
  cr_expect(!res.v[1].diagnosis[0] && !res.v[2].diagnosis[0], "passing checks carry no diagnosis");
  qc_results_free(&res);
  qc_module_free(&m);
}

/* --reference auto reaches the op as QC_REF_AUTO, and each check the fast
 * path judged names the GEMM its reference came from, as the op said: d_x
 * the fast reference kept (4 slices, its self-check), d_weight the fast one
 * that fell back to DGEMM; d_bias (the VJPs') and a check a host variant
 * re-judged say float64. */
Test(fast_path, each_check_names_its_reference_gemm) {
  qc_module m;
  qc_results res = {0};
  make(&m, NULL);
  g_refs = (qc_linear_audit_out){.ref_ran = {4, 3}, .ref_fast = {1, 0}, .ref_err = {1e-9, 5e-3}, .ref_err_norm = {2e-10, 1e-3},
                                 .ref_gate = {1e-6, 2e-6}};
  g_ref_slices = QC_REF_AUTO;
  g_variants_off = QC_VAR_ALL; /* d_x's failure stays the fast path's judgement */
  int rc = audit(&m, QC_CAND_BUILTIN, &res);
  g_variants_off = 0;
  g_ref_slices = 0;
  memset(&g_refs, 0, sizeof g_refs);
  cr_assert_eq(rc, QC_OK, "%s", qc_err_msg());
  cr_expect_eq(g_seen_slices, QC_REF_AUTO, "the op is asked for auto");
  cr_assert_eq(res.n, 3);
  char b[64];
  cr_expect_eq(res.v[0].ref.slices, 4);
  cr_expect_eq(res.v[0].ref.kept, 1);
  cr_expect_eq(res.v[0].ref.err, 1e-9);
  cr_expect_eq(res.v[0].ref.gate, 1e-6);
  cr_expect_str_eq(qc_report_ref_name(&res.v[0], b, sizeof b), "ozaki_int8:4");
  cr_expect_eq(res.v[1].ref.slices, 3);
  cr_expect_eq(res.v[1].ref.kept, 0);
  cr_expect_str_eq(qc_report_ref_name(&res.v[1], b, sizeof b), "float64 (ozaki_int8:3 fell back)");
  cr_expect_eq(res.v[2].ref.slices, 0, "d_bias comes from the VJPs: float64");
  cr_expect_str_eq(qc_report_ref_name(&res.v[2], b, sizeof b), "float64");
  qc_results_free(&res);
  /* the same failed d_x re-judged on the host against a variant: that reference is float64 */
  g_refs = (qc_linear_audit_out){.ref_ran = {4, 4}, .ref_fast = {1, 1}};
  rc = audit(&m, QC_CAND_BUILTIN, &res);
  memset(&g_refs, 0, sizeof g_refs);
  cr_assert_eq(rc, QC_OK, "%s", qc_err_msg());
  cr_assert_eq(res.n, 3);
  cr_expect(res.v[0].variant_id[0] != 0, "d_x passes on a host variant");
  cr_expect_eq(res.v[0].ref.slices, 0, "a variant's reference is float64");
  cr_expect_eq(res.v[1].ref.slices, 4, "d_weight keeps the fast path's");
  qc_results_free(&res);
  qc_module_free(&m);
}
