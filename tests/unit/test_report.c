/* test_report.c: the report machinery on its own: the regression rule on
 * every verb's row (vjp, contract, sft's nested pairs, step), repeated
 * identities matched by occurrence; JUnit names made unique and a suite
 * appended with the counts updated; the verdict naming every crossed
 * bound; the progress line; the audit writer's two documents (a '|' or a
 * markup character in a cell stays text, every row as wide as its header). */
#include <cjson/cJSON.h>
#include <criterion/criterion.h>
#include <math.h>
#include <string.h>

#include "core/progress.h"
#include "core/qc.h"
#include "model/check.h"
#include "report/audit.h"
#include "report/baseline.h"
#include "report/tlist.h"
#include "model/modinfo.h"
#include "class_harness.h"

static int count(const char *s, const char *needle) {
  int n = 0;
  for (const char *p = strstr(s, needle); p; p = strstr(p + 1, needle)) n++;
  return n;
}

static qc_regress_list compare(const char *old, const char *cur) {
  cJSON *a = cJSON_Parse(old), *b = cJSON_Parse(cur);
  cr_assert(a && b, "test JSON");
  qc_regress_list l;
  cr_assert_eq(qc_baseline_compare(a, b, 1.1, &l), QC_OK, "%s", qc_err_msg());
  cJSON_Delete(a);
  cJSON_Delete(b);
  return l;
}

#define VJP(checks) "{\"verb\": \"vjp\", \"checks\": [" checks "]}"
#define CHK(mod, dy, t, nm, v) \
  "{\"module\": \"" mod "\", \"dy\": \"" dy "\", \"tensor\": \"" t "\", \"metrics\": {\"noise_multiple\": " #nm \
  ", \"rel_l2\": 0.002}, \"verdict\": \"" v "\"}"

Test(baseline, vjp_rise_vanish_fail_new) {
  qc_regress_list l = compare(VJP(CHK("/a", "dy", "d_x", 1.0, "pass") "," CHK("/a", "dy", "d_weight", 1.0, "pass") ","
                                  CHK("/b", "dy", "d_x", 1.0, "pass") "," CHK("/c", "dy", "d_x", 1.0, "pass")),
                              VJP(CHK("/a", "dy", "d_x", 1.14, "pass") "," CHK("/a", "dy", "d_weight", 1.16, "pass") ","
                                  CHK("/c", "dy", "d_x", 1.0, "fail") "," CHK("/d", "dy", "d_x", 1.0, "pass")));
  cr_expect_eq(l.matched, 3);
  cr_expect_eq(l.added, 1, "/d is new and passes: listed as new, not a regression");
  cr_expect_eq(l.vanished, 1);
  cr_assert_eq(l.n, 3, "1.14 <= 1.1 x 1 + 0.05 is jitter; 1.16 is a rise; /c fails now; /b vanished");
  cr_expect_eq(l.v[0].kind, QC_REG_RISE);
  cr_expect(strstr(l.v[0].id, "module=/a dy=dy tensor=d_weight") != NULL, "%s", l.v[0].id);
  cr_expect_eq(l.v[1].kind, QC_REG_FAILURE);
  cr_expect_eq(l.v[2].kind, QC_REG_VANISHED);
  cr_expect(strstr(l.v[2].id, "module=/b") != NULL);
  qc_regress_free(&l);
}

Test(baseline, repeated_identities_match_in_order) {
  /* two generated instances of one name: the second compares with the second */
  qc_regress_list l = compare(VJP(CHK("g", "random", "d_x", 1.0, "pass") "," CHK("g", "random", "d_x", 2.0, "pass")),
                              VJP(CHK("g", "random", "d_x", 1.0, "pass") "," CHK("g", "random", "d_x", 2.1, "pass")));
  cr_expect_eq(l.matched, 2);
  cr_expect_eq(l.n, 0, "2.1 <= 1.1 x 2 + 0.05: no rise when each meets its own");
  qc_regress_free(&l);
}

Test(baseline, contract_outlier_flag_and_sft_pairs_and_step) {
  qc_regress_list l = compare(
      "{\"verb\": \"contract\", \"rows\": [{\"module\": \"/m\", \"tensor\": \"d_x\", \"weight_format\": \"nvfp4\", "
      "\"activation_format\": \"none\", \"dy\": \"dy\", \"metrics\": {\"rel_l2\": 0.09}, \"outlier\": false, \"verdict\": \"pass\"}]}",
      "{\"verb\": \"contract\", \"rows\": [{\"module\": \"/m\", \"tensor\": \"d_x\", \"weight_format\": \"nvfp4\", "
      "\"activation_format\": \"none\", \"dy\": \"dy\", \"metrics\": {\"rel_l2\": 0.09}, \"outlier\": true, \"verdict\": \"pass\"}]}");
  cr_expect_eq(l.n, 1);
  cr_expect_eq(l.v[0].kind, QC_REG_FLAG);
  qc_regress_free(&l);
  /* sft: the checks are the metrics inside each pair, named by the pair */
  l = compare("{\"verb\": \"sft\", \"pairs\": [{\"a\": \"under_test\", \"b\": \"native_baseline\", \"metrics\": ["
              "{\"metric\": \"loss\", \"verdict\": \"pass\", \"max_rel\": 0.001}]}]}",
              "{\"verb\": \"sft\", \"pairs\": [{\"a\": \"under_test\", \"b\": \"native_baseline\", \"metrics\": ["
              "{\"metric\": \"loss\", \"verdict\": \"pass\", \"max_rel\": 0.004}]}]}");
  cr_assert_eq(l.n, 1);
  cr_expect(strstr(l.v[0].id, "a=under_test b=native_baseline metric=loss") != NULL, "%s", l.v[0].id);
  qc_regress_free(&l);
  l = compare("{\"verb\": \"step\", \"checks\": [{\"arm\": \"under_test\", \"param\": \"w\", \"kind\": \"frozen\", \"verdict\": \"pass\"}]}",
              "{\"verb\": \"step\", \"checks\": [{\"arm\": \"under_test\", \"param\": \"w\", \"kind\": \"frozen\", \"verdict\": \"fail\"}]}");
  cr_expect_eq(l.n, 1);
  cr_expect_eq(l.v[0].kind, QC_REG_FAILURE);
  qc_regress_free(&l);
}

Test(baseline, two_verbs_refused) {
  cJSON *a = cJSON_Parse("{\"verb\": \"vjp\", \"checks\": []}"), *b = cJSON_Parse("{\"verb\": \"contract\", \"rows\": []}");
  qc_regress_list l;
  qc_err_clear();
  cr_expect_eq(qc_baseline_compare(a, b, 1.1, &l), QC_EINPUT);
  cr_expect(strstr(qc_err_msg(), "cannot be compared") != NULL, "%s", qc_err_msg());
  qc_err_clear();
  cJSON_Delete(a);
  cJSON_Delete(b);
}

Test(junit, unique_names_times_and_append) {
  qc_tlist l = {0};
  cr_assert_eq(qc_tlist_add(&l, "m", "m", "random/d_x", NULL, "ok"), QC_OK);
  qc_tlist_time(&l, 0.25);
  cr_assert_eq(qc_tlist_add(&l, "m", "m", "random/d_x", "rel_l2 2 > 1", NULL), QC_OK);
  cr_assert_eq(qc_tlist_add_error(&l, "n", "n", "run", "cannot read"), QC_OK);
  qc_tlist_spread(&l, 1.0);
  qc_sbuf doc = {0};
  cr_assert_eq(qc_tlist_junit(&l, "vjp", &doc), QC_OK);
  cr_expect(strstr(doc.s, "name=\"random/d_x\" time=\"0.250000\"") != NULL, "%s", doc.s);
  cr_expect(strstr(doc.s, "name=\"random/d_x [2]\" time=\"0.500000\"") != NULL, "the repeat is numbered, the rest of the time shared");
  cr_expect(strstr(doc.s, "tests=\"3\" failures=\"1\" errors=\"1\"") != NULL, "%s", doc.s);
  qc_tlist b = {0};
  cr_assert_eq(qc_tlist_add(&b, "baseline", "baseline", "module=/x", "noise_multiple 1 -> 2", NULL), QC_OK);
  cr_assert_eq(qc_tlist_junit_append(&b, &doc), QC_OK);
  cr_expect(strstr(doc.s, "<testsuites name=\"qatcheck vjp\" tests=\"4\" failures=\"2\" errors=\"1\"") != NULL, "%s", doc.s);
  cr_expect_eq(count(doc.s, "<testsuite "), 3);
  cr_expect_eq(count(doc.s, "</testsuites>"), 1);
  qc_sbuf_free(&doc);
  qc_tlist_free(&l);
  qc_tlist_free(&b);
}

Test(judge, every_crossed_bound_is_named) {
  qc_metrics m;
  memset(&m, 0, sizeof m);
  m.rel_l2 = 0.01;
  m.max_abs = 1;
  m.cosine = 0.99;
  m.norm_ratio = 1.02;
  m.norm_g = m.norm_r = 1;
  m.noise_multiple = 3;
  qc_tol t = {.has_rel_l2 = 1, .rel_l2 = 4e-3, .has_cosine_min = 1, .cosine_min = 0.9999, .has_norm_ratio = 1,
              .norm_lo = 0.999, .norm_hi = 1.001, .has_noise_multiple = 1, .noise_multiple = 1.1};
  char why[512];
  cr_expect_eq(qc_judge(&m, &t, why, sizeof why), QC_V_FAIL);
  cr_expect(strstr(why, "rel_l2 0.01 > 0.004") && strstr(why, "cosine 0.99 < 0.9999") && strstr(why, "norm_ratio 1.02") &&
                strstr(why, "noise_multiple 3 > 1.1"),
            "%s", why);
  cr_expect_eq(count(why, "; "), 3, "%s", why);
  m.rel_l2 = 1e-3;
  m.cosine = 0.99999;
  m.norm_ratio = 1;
  m.noise_multiple = 1;
  cr_expect_eq(qc_judge(&m, &t, why, sizeof why), QC_V_PASS);
  cr_expect_str_eq(why, "");
}

Test(progress, line_rate_and_eta) {
  qc_progress p = {.what = "contract", .unit = "units", .total = 100};
  char line[256];
  qc_progress_line(&p, 25, 10.0, "/model.layers.7.mlp.down_proj", line, sizeof line);
  cr_expect(strstr(line, "contract: 25/100 units (25%), 2.5 units/s, ETA 30 s: /model.layers.7.mlp.down_proj") != NULL, "%s", line);
  qc_progress_line(&p, 10, 100.0, NULL, line, sizeof line);
  cr_expect(strstr(line, "ETA 15:00") != NULL, "%s", line);
  qc_progress_line(&p, 0, 0.0, NULL, line, sizeof line);
  cr_expect(strstr(line, "ETA ?") != NULL, "%s", line);
}

Test(audit_doc, cells_escaped_and_rows_padded) {
  qc_doc d;
  qc_doc_begin(&d, "t <&>");
  qc_doc_table(&d, "l:module|r:value|l:note");
  qc_doc_tr(&d);
  qc_doc_td_code(&d, "/a|b`c");
  qc_doc_td(&d, "%d", 3);
  qc_doc_tr(&d); /* a short row is padded to the header's width */
  qc_doc_td(&d, "*not emphasis* <b>");
  qc_doc_table_end(&d);
  cr_assert_eq(qc_doc_end(&d), QC_OK);
  cr_expect(strstr(d.md.s, "| `/a\\|b'c` | 3 |  |\n") != NULL, "%s", d.md.s);
  cr_expect(strstr(d.md.s, "| \\*not emphasis\\* \\<b\\> |  |  |\n") != NULL, "%s", d.md.s);
  cr_expect(strstr(d.md.s, "| --- | ---: | --- |") != NULL);
  cr_expect(strstr(d.html.s, "<td><code>/a|b`c</code></td><td class=\"r\">3</td><td></td>") != NULL, "%s", d.html.s);
  cr_expect(strstr(d.html.s, "&lt;b&gt;") != NULL && strstr(d.html.s, "<title>t &lt;&amp;&gt;</title>") != NULL);
  qc_sbuf_free(&d.md);
  qc_sbuf_free(&d.html);
}

/* A module's dY described for the report: its fraction of non-zero
 * elements, -0 counted as zero, counted on the thread pool at each element
 * width (2, 4, 8 bytes and 1 for float8) the same as one loop gives. */
Test(modinfo, dy_nonzero_at_every_width) {
  static const qc_dtype dts[] = {QC_BF16, QC_F32, QC_F64, QC_E4M3};
  const int64_t n = (int64_t)3 << 18; /* several pieces */
  for (size_t d = 0; d < sizeof dts / sizeof dts[0]; d++) {
    h_inst in;
    h_make(&in, "gelu", "64,256", 3, "normal", NULL);
    qc_tensor t;
    int64_t shape[2] = {n / 512, 512}, want = 0;
    cr_assert_eq(qc_tensor_alloc(&t, "dy", dts[d], 2, shape), QC_OK);
    unsigned char *p = t.data;
    const size_t es = qc_dtype_size(dts[d]);
    for (int64_t i = 0; i < n; i++) {
      const int kind = (int)(i * 2654435761u % 7); /* 0: +0, 1: -0, else non-zero */
      if (kind == 1) p[i * (int64_t)es + (int64_t)es - 1] = 0x80; /* the sign bit alone: -0 */
      if (kind >= 2) p[i * (int64_t)es] = (unsigned char)(1 + kind), want++;
    }
    cr_assert_eq(qc_tset_add(&in.m.grad_out, &t), QC_OK);
    qc_modinfo mi;
    cr_assert_eq(qc_modinfo_fill(&mi, &in.m, "dump", "dump", NULL), QC_OK);
    cr_expect_eq(mi.ndy, 1);
    cr_expect_float_eq(mi.dy[0].nonzero, (double)want / (double)n, 1e-15, "%s: nonzero %.17g, want %.17g",
                       qc_dtype_name(dts[d]), mi.dy[0].nonzero, (double)want / (double)n);
    h_free(&in);
  }
}

/* The inputs' value facts, their rows read in pieces on the thread pool:
 * a zero row with a value over 20 RMS is "extremes", rows whose RMS span
 * over 100x are "scales", wherever in a many-piece tensor they sit. */
Test(modinfo, input_extremes_and_scales_in_any_piece) {
  const int64_t rows = 1000, cols = 16;
  for (int want = 0; want < 3; want++) { /* 0: neither, 1: extremes, 2: scales */
    h_inst in;
    h_make(&in, "gelu", "64,256", 4, "normal", NULL);
    qc_tset_free(&in.m.inputs);
    qc_tensor x;
    int64_t shape[2] = {rows, cols};
    cr_assert_eq(qc_tensor_alloc(&x, "x", QC_F32, 2, shape), QC_OK);
    float *v = x.data;
    for (int64_t i = 0; i < rows * cols; i++) v[i] = (float)(1 + (i * 7919) % 13) / 8.0f;
    if (want == 1) {
      for (int64_t j = 0; j < cols; j++) v[777 * cols + j] = 0; /* a zero row, late */
      v[5 * cols + 3] = 40.0f; /* a value over 20 RMS (its row no scale apart), early */
    }
    if (want == 2)
      for (int64_t j = 0; j < cols; j++) v[901 * cols + j] *= 1e-3f; /* one row 1000x quieter */
    cr_assert_eq(qc_tset_add(&in.m.inputs, &x), QC_OK);
    qc_modinfo mi;
    cr_assert_eq(qc_modinfo_fill(&mi, &in.m, "dump", "dump", NULL), QC_OK);
    cr_expect_eq(mi.cover >> QC_COV_EXTREMES & 1, (unsigned)(want == 1), "case %d: extremes %s", want,
                 mi.cover >> QC_COV_EXTREMES & 1 ? "set" : "not set");
    cr_expect_eq(mi.cover >> QC_COV_SCALES & 1, (unsigned)(want == 2), "case %d: scales %s", want,
                 mi.cover >> QC_COV_SCALES & 1 ? "set" : "not set");
    h_free(&in);
  }
}
