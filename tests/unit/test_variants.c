/* test_variants.c: the reference variants' one list, order and rule
 * (engine/variants.c): which variants a module has for its gradients and
 * its forward, in what order, what the case and the dump's evidence leave
 * out, and which judgement replaces a check. */
#include <criterion/criterion.h>
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "core/qc.h"
#include "engine/variants.h"
#include "model/module.h"

/* A float32 tensor named `name` of n values: i / 3 + 0.1 (not bf16 values),
 * or (b16) exact bf16 values. */
static void put(qc_tset *s, const char *name, int64_t n, qc_dtype dt, int b16) {
  qc_tensor t;
  int64_t shape[1] = {n};
  cr_assert_eq(qc_tensor_alloc(&t, name, dt, 1, shape), QC_OK);
  for (int64_t i = 0; i < n; i++) {
    const float v = b16 ? (float)(i % 7) * 0.5f : (float)i / 3.0f + 0.1f;
    if (dt == QC_F32) ((float *)t.data)[i] = v;
    else ((uint16_t *)t.data)[i] = 0x3f80; /* bfloat16 1.0 */
  }
  cr_assert_eq(qc_tset_add(s, &t), QC_OK);
}

/* A relu2 module: float32 x, y (y_b16: bf16-valued) and dy. */
static void relu2(qc_module *m, int y_b16) {
  memset(m, 0, sizeof *m);
  m->cls = qc_registry_find("relu2")->cls;
  snprintf(m->path, sizeof m->path, "/act");
  put(&m->inputs, "x", 16, QC_F32, 0);
  put(&m->outputs, "y", 16, QC_F32, y_b16);
  put(&m->grad_out, "dy", 16, QC_F32, 0);
}

static void ids(const qc_variants *L, char *buf, size_t n) {
  size_t l = 0;
  buf[0] = 0;
  for (int i = 0; i < L->n; i++) {
    char id[48];
    qc_variant_id(&L->v[i], id, sizeof id);
    l += (size_t)snprintf(buf + l, n - l, "%s%s:%d", i ? " " : "", id, L->v[i].level);
  }
}

Test(variants, the_lists_and_their_order) {
  qc_module m;
  qc_variants L;
  char s[512];
  relu2(&m, 0);
  qc_variants_of(&m, &m.grad_out.t[0], QC_VARIANTS_GRADS, 0, NULL, &L);
  ids(&L, s, sizeof s);
  cr_expect_str_eq(s, "bf16_dy:0 bf16_inputs:0 bf16_dy+bf16_inputs:0", "relu2 has no rounding level");
  qc_variants_of(&m, NULL, QC_VARIANTS_FORWARD, 0, NULL, &L);
  ids(&L, s, sizeof s);
  cr_expect_str_eq(s, "bf16_inputs:0 bf16_inputs+bf16_params:0");
  qc_variants_of(&m, &m.grad_out.t[0], QC_VARIANTS_GRADS, QC_VAR_BF16_DY, NULL, &L);
  ids(&L, s, sizeof s);
  cr_expect_str_eq(s, "bf16_inputs:0", "the case leaves bf16_dy out");
  qc_variants_of(&m, &m.grad_out.t[0], QC_VARIANTS_GRADS, QC_VAR_ALL, NULL, &L);
  cr_expect_eq(L.n, 0, "\"variants\": \"none\"");
  qc_module_free(&m);

  /* swiglu: two rounding levels, each combined with dY and the inputs for the gradients, alone for the forward */
  memset(&m, 0, sizeof m);
  m.cls = qc_registry_find("swiglu")->cls;
  put(&m.inputs, "gate", 8, QC_F32, 0);
  put(&m.inputs, "up", 8, QC_F32, 0);
  put(&m.grad_out, "dy", 8, QC_F32, 1);
  qc_variants_of(&m, &m.grad_out.t[0], QC_VARIANTS_GRADS, 0, NULL, &L);
  ids(&L, s, sizeof s);
  cr_expect_str_eq(s, "bf16_inputs:0 round_ops:1 bf16_inputs+round_ops:1 round_ops:2 bf16_inputs+round_ops:2",
                   "a bf16-valued dY has no bf16_dy variant");
  qc_variants_of(&m, NULL, QC_VARIANTS_FORWARD, 0, NULL, &L);
  ids(&L, s, sizeof s);
  cr_expect_str_eq(s, "bf16_inputs:0 bf16_inputs+bf16_params:0 round_ops:1 round_ops:2");
  qc_module_free(&m);
}

Test(variants, the_dump_rules_out_autocast_only_where_nothing_was_16_bits) {
  qc_module m;
  relu2(&m, 0);
  cr_expect_eq(qc_variants_evidence(&m, NULL), 0u, "no attribute: nothing ruled out");
  cr_expect_eq(qc_variants_evidence(&m, "bfloat16"), 0u, "autocast on");
  cr_expect_eq(qc_variants_evidence(&m, "mixed"), 0u);
  cr_expect_eq(qc_variants_evidence(&m, "off"), (unsigned)(QC_VAR_BF16_INPUTS | QC_VAR_BF16_PARAMS));
  qc_variants L;
  qc_variants_of(&m, &m.grad_out.t[0], QC_VARIANTS_GRADS, 0, "off", &L);
  cr_expect(L.n == 1 && L.v[0].parts == QC_VAR_BF16_DY, "bf16_dy is never ruled out");
  qc_contract_set(&m.contract, "compute_dtype", "bfloat16", 0, 0);
  cr_expect_eq(qc_variants_evidence(&m, "off"), 0u, "a bf16 model's contract");
  qc_module_free(&m);
  relu2(&m, 1);
  cr_expect_eq(qc_variants_evidence(&m, "off"), 0u, "an output of bf16 values passed through bf16");
  qc_module_free(&m);
  relu2(&m, 0);
  put(&m.params, "w", 4, QC_BF16, 0);
  cr_expect_eq(qc_variants_evidence(&m, "off"), 0u, "a bf16 parameter");
  qc_module_free(&m);
  relu2(&m, 0);
  qc_tset_free(&m.outputs);
  cr_expect_eq(qc_variants_evidence(&m, "off"), 0u, "no output to tell by");
  qc_module_free(&m);
}

/* A check with these metrics and verdict (bias z 0: the test made, no bias). */
static qc_check chk(double rel, double nm, double z, int verdict) {
  qc_check k;
  memset(&k, 0, sizeof k);
  k.m.rel_l2 = rel;
  k.m.noise_multiple = nm;
  k.m.bias_z = z;
  k.verdict = verdict;
  return k;
}

Test(variants, the_rule) {
  qc_check failed = chk(1e-2, 10, 0, QC_V_FAIL), pass_z = chk(1e-3, 1, 4, QC_V_PASS), pass = chk(1e-3, 1, 1, QC_V_PASS);
  cr_expect(qc_variants_wanted(&failed) && qc_variants_wanted(&pass_z) && !qc_variants_wanted(&pass), "failed, or |z| > 2.5");
  qc_check a = chk(2e-3, 2, 0, QC_V_PASS), b = chk(1e-3, 1, 0, QC_V_PASS), worse = chk(2e-2, 20, 0, QC_V_PASS);
  cr_expect(qc_variant_better(&failed, NULL, &a), "a pass that fits better");
  cr_expect(!qc_variant_better(&failed, NULL, &worse), "a pass that fits worse explains nothing");
  cr_expect(!qc_variant_better(&failed, NULL, &(qc_check){.verdict = QC_V_FAIL}), "a failure never replaces");
  cr_expect(qc_variant_better(&failed, &a, &b) && !qc_variant_better(&failed, &b, &a), "the smallest rel_l2");
  qc_check z1 = chk(9e-4, 1, 1, QC_V_PASS), z3 = chk(9e-4, 1, 3, QC_V_PASS);
  cr_expect(qc_variant_better(&pass_z, NULL, &z3) && qc_variant_better(&pass_z, &z3, &z1) && !qc_variant_better(&pass_z, &z1, &z3),
            "a pass: the smallest |z| below its own");
  qc_check z5 = chk(9e-4, 1, 5, QC_V_PASS);
  cr_expect(!qc_variant_better(&pass_z, NULL, &z5), "never a larger |z|");
}

/* qc_variants_judge: the best replaces k, named; a variant that cannot be judged is skipped, its message dropped. */
static int fake_judge(void *arg, int i, const qc_variant *v, qc_check *kv) {
  (void)arg;
  (void)v;
  if (i == 0) return qc_err("variant 0 cannot be computed");
  *kv = chk(i == 1 ? 5e-3 : 2e-3, 1, 0, QC_V_PASS);
  return QC_OK;
}

Test(variants, judge_takes_the_best_and_names_it) {
  qc_variants L = {.n = 3, .levels = 2};
  L.v[0] = (qc_variant){QC_VAR_BF16_DY, 0};
  L.v[1] = (qc_variant){QC_VAR_BF16_INPUTS, 0};
  L.v[2] = (qc_variant){QC_VAR_BF16_DY | QC_VAR_ROUND_OPS, 2};
  qc_check k = chk(1e-2, 10, 0, QC_V_FAIL);
  qc_err_clear();
  cr_assert_eq(qc_variants_judge(&L, fake_judge, NULL, &k), QC_OK);
  cr_expect_eq(k.verdict, QC_V_PASS);
  cr_expect_str_eq(k.variant_id, "bf16_dy+round_ops");
  cr_expect_str_eq(k.variant, "bf16-rounded dY and operands and ops (the class's rounding variant 2 of 2, docs/classes.md)");
  cr_expect_str_eq(qc_err_msg(), "", "the failed variant's message is dropped");
}

/* The repeats of L for a gradient that reads `reads`, "0 -1 0 3 ..." (qc_variant_repeats). */
static void repeats(const qc_variants *L, unsigned reads, unsigned same, char *buf, size_t n) {
  size_t l = 0;
  buf[0] = 0;
  for (int i = 0; i < L->n; i++) l += (size_t)snprintf(buf + l, n - l, "%s%d", i ? " " : "", qc_variant_repeats(L, i, reads, same));
}

/* repeats() of gradient g of m, its class's declaration. */
static void repeats_of(const qc_variants *L, const qc_module *m, const char *g, char *buf, size_t n) {
  repeats(L, qc_grad_reads_of(m, g), qc_grad_same_of(m, g), buf, n);
}

/* qc_grad_reads_of maps a class's grad_reads to the parts each gradient
 * reads (the row that holds under the contract), and qc_variant_repeats
 * finds the variants whose reference of that gradient repeats the
 * contract's or an earlier one's. */
Test(variants, a_gradient_repeats_what_it_does_not_read) {
  qc_module m;
  memset(&m, 0, sizeof m);
  m.cls = qc_registry_find("linear")->cls;
  put(&m.inputs, "x", 12, QC_F32, 0);
  put(&m.params, "weight", 12, QC_F32, 0);
  put(&m.grad_out, "dy", 12, QC_F32, 0);
  const unsigned dy = QC_VAR_BF16_DY, in = QC_VAR_BF16_INPUTS, par = QC_VAR_BF16_PARAMS, ops = QC_VAR_ROUND_OPS;
  cr_expect_eq(qc_grad_reads_of(&m, "d_x"), dy | par | ops, "d_x = dY W_ref reads no x");
  cr_expect_eq(qc_grad_reads_of(&m, "d_weight"), dy | in | ops, "d_weight = dY^T X_ref reads no W");
  cr_expect_eq(qc_grad_reads_of(&m, "d_bias"), dy, "d_bias: dY's column sums, no rounding level");
  cr_expect_eq(qc_grad_reads_of(&m, "d_x@rank2"), (unsigned)QC_VAR_ALL, "a name without a row reads everything");
  qc_variants L;
  char s[256];
  qc_variants_of(&m, &m.grad_out.t[0], QC_VARIANTS_GRADS, 0, NULL, &L);
  ids(&L, s, sizeof s);
  cr_assert_str_eq(s, "bf16_dy:0 bf16_inputs:0 bf16_dy+bf16_inputs:0 round_ops:1 bf16_dy+round_ops:1 bf16_inputs+round_ops:1 "
                      "bf16_dy+bf16_inputs+round_ops:1");
  repeats_of(&L, &m, "d_x", s, sizeof s);
  cr_expect_str_eq(s, "0 -1 0 3 4 3 4", "d_x: bf16_inputs changes nothing it reads");
  cr_expect_eq(qc_grad_same_of(&m, "d_x"), 0u);
  cr_expect_eq(qc_grad_same_of(&m, "d_weight"), in | ops, "X_ref is x: bf16_inputs and round_ops round it alike");
  repeats_of(&L, &m, "d_weight", s, sizeof s);
  cr_expect_str_eq(s, "0 1 2 1 2 1 2", "d_weight: round_ops as bf16_inputs, either or both");
  repeats_of(&L, &m, "d_bias", s, sizeof s);
  cr_expect_str_eq(s, "0 -1 0 -1 0 -1 0", "d_bias: bf16_dy alone");
  repeats(&L, QC_VAR_ALL, 0, s, sizeof s);
  cr_expect_str_eq(s, "0 1 2 3 4 5 6", "a gradient that reads everything repeats nothing");
  repeats(&L, QC_VAR_ALL, dy | ops, s, sizeof s);
  cr_expect_str_eq(s, "0 1 2 0 0 2 2", "a group of dy and ops: either or both as dy, at level 0");
  { /* a class of two rounding levels: ops at level 2 is no member of the group */
    qc_variants L2 = {.n = 4, .levels = 2};
    L2.v[0] = (qc_variant){in, 0}, L2.v[1] = (qc_variant){ops, 1}, L2.v[2] = (qc_variant){ops, 2}, L2.v[3] = (qc_variant){in | ops, 2};
    repeats(&L2, in | ops, in | ops, s, sizeof s);
    cr_expect_str_eq(s, "0 0 2 3", "inputs=ops: level 1 repeats bf16_inputs, level 2 does not");
  }

  /* a clipped STE masks d_x by |x| <= T where the activation is quantized:
   * then d_x reads x (bf16_inputs can move an element across T) */
  qc_contract_set(&m.contract, "ste", "clipped", 2.0, 1);
  cr_expect_eq(qc_grad_reads_of(&m, "d_x"), dy | par | ops, "a clipped STE, the activation not quantized");
  cr_expect_eq(qc_grad_reads_of(&m, "d_weight"), dy | in | ops);
  qc_contract_set(&m.contract, "activation_format", "fp8_token", 0, 0);
  cr_expect_eq(qc_grad_reads_of(&m, "d_x"), dy | in | par | ops, "the mask on d_x reads x");
  repeats_of(&L, &m, "d_x", s, sizeof s);
  cr_expect_str_eq(s, "0 1 2 3 4 5 6");
  qc_contract_set(&m.contract, "weight_format", "fp8_block128", 0, 0);
  cr_expect_eq(qc_grad_reads_of(&m, "d_weight"), dy | in | par | ops, "the mask on d_weight reads W");
  cr_expect_eq(qc_grad_same_of(&m, "d_weight"), in | ops, "X_ref is still x");
  qc_contract_set(&m.contract, "dw_input", "quantized", 0, 0);
  cr_expect_eq(qc_grad_same_of(&m, "d_weight"), 0u, "X_ref = dequant(quant(x)): bf16_inputs rounds before the quantizer");
  repeats_of(&L, &m, "d_weight", s, sizeof s);
  cr_expect_str_eq(s, "0 1 2 3 4 5 6");
  qc_module_free(&m);

  relu2(&m, 0);
  cr_expect_eq(qc_grad_reads_of(&m, "d_x"), (unsigned)QC_VAR_ALL, "a class without grad_reads: everything");
  qc_module_free(&m);
}

/* Every class's grad_reads names its own gradients and only the words
 * qc_grad_reads_of knows (an unknown one would silently read everything). */
Test(variants, every_declaration_is_well_formed) {
  int n;
  const qc_registry_row *rows = qc_registry_rows(&n);
  cr_assert(n > 0);
  for (int c = 0; c < n; c++)
    for (const qc_grad_reads *r = rows[c].cls->grad_reads; r && r->grad; r++) {
      cr_expect(qc_class_has_grad(rows[c].cls, r->grad), "%s: grad_reads names '%s', not one of its grads", rows[c].cls->name, r->grad);
      char w[64];
      int groups = 0;
      for (const char *p = r->reads; p && *p; p += strspn(p, " ")) {
        const size_t l = strcspn(p, " ");
        groups += memchr(p, '=', l) != NULL;
        for (const char *q = p; q < p + l; q += strspn(q, "=")) { /* each part of a word "a=b" */
          const size_t lw = strcspn(q, " =");
          snprintf(w, sizeof w, "%.*s", (int)lw, q);
          cr_expect(strcmp(w, "dy") == 0 || strcmp(w, "inputs") == 0 || strcmp(w, "params") == 0 || strcmp(w, "ops") == 0,
                    "%s: %s reads '%s'", rows[c].cls->name, r->grad, w);
          q += lw;
        }
        p += l;
      }
      cr_expect(groups <= 1, "%s: %s: one '=' word a row", rows[c].cls->name, r->grad);
    }
}

/* Whether the inputs move under bf16 rounding is read on the thread pool:
 * a large bf16-valued input with one value that is not, anywhere (first
 * piece, middle, last element), still offers bf16_inputs; none, not. */
Test(variants, one_input_value_off_bf16_anywhere_offers_bf16_inputs) {
  const int64_t n = (int64_t)5 << 18;
  const int64_t at[] = {-1, 3, n / 2 + 17, n - 1};
  for (size_t a = 0; a < sizeof at / sizeof at[0]; a++) {
    qc_module m;
    memset(&m, 0, sizeof m);
    m.cls = qc_registry_find("swiglu")->cls;
    put(&m.inputs, "gate", n, QC_F32, 1);
    put(&m.inputs, "up", n, QC_F32, 1);
    put(&m.grad_out, "dy", n, QC_F32, 1);
    if (at[a] >= 0) ((float *)m.inputs.t[1].data)[at[a]] = 1.0f + 0x1p-12f; /* not a bf16 value */
    qc_variants L;
    qc_variants_of(&m, &m.grad_out.t[0], QC_VARIANTS_GRADS, 0, NULL, &L);
    int bf16_inputs = 0;
    for (int i = 0; i < L.n; i++) bf16_inputs |= L.v[i].parts == QC_VAR_BF16_INPUTS;
    cr_expect_eq(bf16_inputs, at[a] >= 0, "the off value at %lld: bf16_inputs %s", (long long)at[a],
                 bf16_inputs ? "offered" : "not offered");
    qc_module_free(&m);
  }
}
