/* test_l3log.c: layer 3's readers on buffers: CRC-32C, the number parser
 * against strtod, JSONL (verl's form, non-finite values, duplicates,
 * unordered steps, no step), CSV, TensorBoard events built here (simple
 * values and one-element tensors; a bad CRC, a truncated record), Megatron
 * golden values, trainer_state.json, the format told by content, and
 * configs in JSON and YAML with key paths and canonical values. The files
 * of the real writers (json, csv, tensorboard, PyYAML) are read in
 * tests/e2e/sft_formats.sh. */
#include <criterion/criterion.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/crc32c.h"
#include "core/qc.h"
#include "core/rng.h"
#include "io/l3log.h"
#include "io/log_priv.h"

static double val(const qc_l3_log *l, const char *m, int64_t step, int *has) {
  int c = qc_l3_log_col(l, m);
  *has = 0;
  if (c < 0) return NAN;
  for (int64_t i = 0; i < l->n; i++)
    if (l->step[i] == step) {
      *has = l->col[c].has[i];
      return l->col[c].v[i];
    }
  return NAN;
}

static void parse_ok(const char *text, qc_l3_log *l) {
  qc_err_clear();
  int rc = qc_log_parse(text, strlen(text), "t", l);
  cr_assert_eq(rc, QC_OK, "parse failed: %s", qc_err_msg());
}

static void parse_bad(const char *text, const char *needle) {
  qc_l3_log l;
  qc_err_clear();
  int rc = qc_log_parse(text, strlen(text), "t", &l);
  cr_expect_eq(rc, QC_EINPUT, "expected a refusal for %s", text);
  cr_expect(strstr(qc_err_msg(), needle) != NULL, "message '%s' lacks '%s'", qc_err_msg(), needle);
}

Test(l3log, crc32c_known_values) {
  cr_expect_eq(qc_crc32c("123456789", 9), 0xE3069283u);
  cr_expect_eq(qc_crc32c_sw("123456789", 9), 0xE3069283u);
  cr_expect_eq(qc_crc32c("", 0), 0u);
  unsigned char buf[1000];
  for (int i = 0; i < 1000; i++) buf[i] = (unsigned char)(i * 7 + 3);
  for (int n = 0; n < 1000; n += 37) cr_expect_eq(qc_crc32c(buf, (size_t)n), qc_crc32c_sw(buf, (size_t)n), "length %d", n);
}

Test(l3log, numbers_round_as_strtod) {
  qc_rng g;
  qc_rng_seed(&g, 5);
  char s[64];
  const char *fmts[] = {"%.17g", "%.9g", "%.6g", "%.3e", "%.15g", "%.20e"};
  for (int i = 0; i < 300000; i++) {
    uint64_t bits = qc_rng_u64(&g);
    double x;
    if (i % 3 == 0) { memcpy(&x, &bits, 8); if (!isfinite(x)) continue; }
    else x = (qc_rng_uniform(&g) - 0.5) * pow(10, (int)(qc_rng_u64(&g) % 40) - 20);
    snprintf(s, sizeof s, fmts[i % 6], x);
    double a, b = strtod(s, NULL);
    const char *e = qc_num_parse(s, s + strlen(s), &a);
    cr_assert(e == s + strlen(s), "did not consume '%s'", s);
    cr_assert(memcmp(&a, &b, 8) == 0, "'%s': %.17g vs strtod %.17g", s, a, b);
  }
  double v;
  cr_expect_null(qc_num_parse("1.", "1." + 2, &v));
  cr_expect_null(qc_num_parse("-", "-" + 1, &v));
  cr_expect_null(qc_num_parse("1e", "1e" + 2, &v));
  cr_expect_not_null(qc_num_parse("0.000", "0.000" + 5, &v));
  cr_expect(v == 0);
}

Test(l3log, jsonl_verl_form_nonfinite_and_null) {
  qc_l3_log l;
  parse_ok("{\"step\": 1, \"data\": {\"loss\": 2.5, \"grad_norm\": NaN, \"x\": null, \"tag\": \"a\"}}\n"
           "\n"
           "{\"step\": 2, \"loss\": Infinity, \"grad_norm\": \"nan\", \"deep\": {\"a\": 1}, \"v\": [1, 2]}\r\n"
           "{\"data\": {\"loss\": -1e-3}, \"step\": 3.0}",
           &l);
  int h;
  cr_expect_str_eq(l.format, "jsonl");
  cr_expect_eq(l.n, 3);
  cr_expect_eq(val(&l, "loss", 1, &h), 2.5);
  cr_expect(isnan(val(&l, "grad_norm", 1, &h)) && h, "NaN is a value");
  cr_expect(isinf(val(&l, "loss", 2, &h)) && h);
  cr_expect(isnan(val(&l, "grad_norm", 2, &h)) && h);
  val(&l, "x", 1, &h);
  cr_expect_not(h, "null is absent");
  cr_expect_eq(qc_l3_log_col(&l, "tag"), -1, "strings are not metrics");
  cr_expect_eq(qc_l3_log_col(&l, "deep"), -1);
  cr_expect_eq(val(&l, "loss", 3, &h), -1e-3, "step after the data, a float step");
  qc_l3_log_free(&l);
}

Test(l3log, jsonl_duplicates_and_unordered_steps) {
  qc_l3_log l;
  parse_ok("{\"step\": 3, \"loss\": 3}\n{\"step\": 1, \"loss\": 1}\n{\"step\": 2, \"loss\": 2}\n"
           "{\"step\": 2, \"loss\": 22}\n{\"step\": 1, \"acc\": 0.5}\n",
           &l);
  int h;
  cr_expect_eq(l.n, 3);
  cr_expect(l.step[0] == 1 && l.step[1] == 2 && l.step[2] == 3);
  cr_expect_eq(val(&l, "loss", 2, &h), 22, "the last value wins");
  cr_expect_eq(val(&l, "loss", 3, &h), 3);
  cr_expect_eq(val(&l, "acc", 1, &h), 0.5, "another metric at a step is no duplicate");
  cr_expect_eq(l.dup_values, 1);
  cr_expect_eq(l.dup_records, 1);
  cr_expect_eq(l.first_dup_step, 2);
  qc_l3_log_free(&l);
}

Test(l3log, jsonl_refusals) {
  parse_bad("{\"loss\": 1}\n", "has no step: none of step");
  parse_bad("{\"step\": 1, \"loss\": 1}\n{\"loss\": 2}\n", "line 2 has no step");
  parse_bad("{\"step\": 1.5, \"loss\": 1}\n{\"step\": 2}\n", "expected an integer");
  parse_bad("{\"step\": 1, \"loss\": 1}\n{\"step\": 2, \"loss\": }\n", "line 2");
  parse_bad("{\"step\": 1, \"loss\": 1} {\"step\": 2}\n{\"step\": 3}\n", "text after the object");
  parse_bad("", "empty");
  parse_bad("[1, 2]", "JSON array");
}

Test(l3log, csv_quotes_text_columns_and_short_rows) {
  qc_l3_log l;
  parse_ok("\xEF\xBB\xBFstep,\"lm loss\",phase,grad_norm\r\n1,2.5,train,1\r\n2,,train,nan\n3,2.25,\"eval, x\"\n", &l);
  int h;
  cr_expect_str_eq(l.format, "csv");
  cr_expect_eq(l.n, 3);
  cr_expect_eq(val(&l, "lm loss", 1, &h), 2.5);
  val(&l, "lm loss", 2, &h);
  cr_expect_not(h, "an empty cell is absent");
  cr_expect(isnan(val(&l, "grad_norm", 2, &h)) && h);
  val(&l, "grad_norm", 3, &h);
  cr_expect_not(h, "a short row's missing cells are empty");
  cr_expect_eq(qc_l3_log_col(&l, "phase"), -1, "a text column is not read");
  qc_l3_log_free(&l);
  parse_bad("loss,acc\n1,2\n", "no step column: none of step");
  parse_bad("step,loss\n1,2\n2,abc\n", "not a number");
  parse_bad("step,loss\n1,2\n,3\n", "line 3 has no step");
  parse_bad("step,loss\n1,2,3\n", "more fields");
}

/* ---- TensorBoard events built by hand ------------------------------------------------- */

static size_t put_varint(unsigned char *p, uint64_t v) {
  size_t n = 0;
  do { p[n++] = (unsigned char)((v & 0x7f) | (v >= 0x80 ? 0x80 : 0)); v >>= 7; } while (v);
  return n;
}

static size_t put_tag(unsigned char *p, int field, int wt) { return put_varint(p, (uint64_t)(field << 3 | wt)); }

static size_t put_bytes(unsigned char *p, int field, const void *d, size_t n) {
  size_t k = put_tag(p, field, 2);
  k += put_varint(p + k, n);
  memcpy(p + k, d, n);
  return k + n;
}

/* An Event {wall_time, step, summary {value {tag, simple_value | tensor}}}:
 * kind 0 simple_value, 1 tensor float_val, 2 tensor double_val (with an
 * empty shape), 3 tensor_content double. */
/* One TFRecord into out: length, its masked CRC-32C, the event's ne bytes,
 * their masked CRC-32C; returns the bytes written (16 + ne). */
static size_t record(unsigned char *out, const unsigned char *ev, size_t ne) {
  uint64_t len = ne;
  memcpy(out, &len, 8);
  uint32_t c = qc_crc32c_mask(qc_crc32c(out, 8));
  memcpy(out + 8, &c, 4);
  memcpy(out + 12, ev, ne);
  c = qc_crc32c_mask(qc_crc32c(ev, ne));
  memcpy(out + 12 + ne, &c, 4);
  return 16 + ne;
}

static size_t event(unsigned char *out, int64_t step, const char *tag, double v, int kind) {
  unsigned char val[256], sum[300], tens[64];
  size_t nv = put_bytes(val, 1, tag, strlen(tag));
  if (kind == 0) {
    float f = (float)v;
    nv += put_tag(val + nv, 2, 5);
    memcpy(val + nv, &f, 4);
    nv += 4;
  } else {
    size_t nt = put_tag(tens, 1, 0);
    nt += put_varint(tens + nt, kind == 1 ? 1 : 2);
    nt += put_bytes(tens + nt, 2, "", 0); /* a scalar: no dims */
    if (kind == 1) { float f = (float)v; nt += put_bytes(tens + nt, 5, &f, 4); }
    else if (kind == 2) nt += put_bytes(tens + nt, 6, &v, 8);
    else nt += put_bytes(tens + nt, 4, &v, 8);
    nv += put_bytes(val + nv, 8, tens, nt);
  }
  size_t ns = put_bytes(sum, 1, val, nv);
  unsigned char ev[400];
  size_t ne = put_tag(ev, 1, 1);
  double wt = 1.7e9;
  memcpy(ev + ne, &wt, 8);
  ne += 8;
  ne += put_tag(ev + ne, 2, 0);
  ne += put_varint(ev + ne, (uint64_t)step);
  ne += put_bytes(ev + ne, 5, sum, ns);
  return record(out, ev, ne);
}

static size_t file_version(unsigned char *out) {
  unsigned char ev[64];
  size_t ne = put_bytes(ev, 3, "brain.Event:2", 13);
  return record(out, ev, ne);
}

Test(l3log, tfevents_scalars_and_tensors) {
  unsigned char buf[4096];
  size_t n = file_version(buf);
  n += event(buf + n, 1, "train/loss", 2.5, 0);
  n += event(buf + n, 1, "lm loss", 1.25, 1);
  n += event(buf + n, 2, "train/loss", 2.0, 2);
  n += event(buf + n, 2, "lm loss", 0.1, 3);
  qc_l3_log l;
  qc_err_clear();
  cr_assert_eq(qc_log_parse((const char *)buf, n, "ev", &l), QC_OK, "%s", qc_err_msg());
  int h;
  cr_expect_str_eq(l.format, "tfevents");
  cr_expect_eq(l.n, 2, "the file_version event is no step");
  cr_expect_eq(val(&l, "train/loss", 1, &h), 2.5);
  cr_expect_eq(val(&l, "lm loss", 1, &h), 1.25);
  cr_expect_eq(val(&l, "train/loss", 2, &h), 2.0, "a double tensor");
  cr_expect_eq(val(&l, "lm loss", 2, &h), 0.1, "tensor_content");
  qc_l3_log_free(&l);
  /* a flipped data byte: the data CRC; a flipped length byte: the length CRC; a cut file */
  unsigned char bad[4096];
  memcpy(bad, buf, n);
  bad[n - 10] ^= 1;
  qc_err_clear();
  cr_expect_eq(qc_log_parse((const char *)bad, n, "ev", &l), QC_EINPUT);
  cr_expect(strstr(qc_err_msg(), "data's CRC") != NULL, "%s", qc_err_msg());
  memcpy(bad, buf, n);
  size_t second = file_version(bad);
  bad[second] ^= 4;
  qc_err_clear();
  cr_expect_eq(qc_log_parse((const char *)bad, n, "ev", &l), QC_EINPUT);
  cr_expect(strstr(qc_err_msg(), "length's CRC") != NULL, "%s", qc_err_msg());
  qc_err_clear();
  cr_expect_eq(qc_log_parse((const char *)buf, n - 3, "ev", &l), QC_EINPUT);
  cr_expect(strstr(qc_err_msg(), "truncated") != NULL, "%s", qc_err_msg());
}

Test(l3log, megatron_and_trainer_state) {
  qc_l3_log l;
  int h;
  parse_ok("{\"lm loss\": {\"start_step\": 1, \"end_step\": 11, \"step_interval\": 5, \"values\": {\"1\": 10.5, \"6\": 9.5, \"11\": 9}},\n"
           " \"num-zeros\": {\"start_step\": 0, \"end_step\": 11, \"step_interval\": 5, \"values\": [3, 4, 5]}}",
           &l);
  cr_expect_str_eq(l.format, "megatron");
  cr_expect_eq(l.n, 3);
  cr_expect_eq(val(&l, "lm loss", 6, &h), 9.5);
  cr_expect_eq(val(&l, "num-zeros", 11, &h), 5, "a list: position start + i * interval, iteration one more");
  cr_expect_eq(val(&l, "num-zeros", 1, &h), 3, "list index 0 at start_step 0 is iteration 1, as the dict's \"1\"");
  cr_expect_eq(l.dup_values, 0);
  qc_l3_log_free(&l);
  parse_ok("{\"best_metric\": null, \"log_history\": [\n"
           "  {\"epoch\": 0.1, \"grad_norm\": NaN, \"learning_rate\": 5e-05, \"loss\": 2.3, \"step\": 10},\n"
           "  {\"epoch\": 0.1, \"eval_loss\": 2.4, \"step\": 10},\n"
           "  {\"epoch\": 0.2, \"loss\": 2.1, \"step\": 20}], \"global_step\": 20}",
           &l);
  cr_expect_str_eq(l.format, "hf_trainer_state");
  cr_expect_eq(l.n, 2);
  cr_expect_eq(val(&l, "eval_loss", 10, &h), 2.4);
  cr_expect(isnan(val(&l, "grad_norm", 10, &h)) && h);
  cr_expect_eq(l.dup_values, 0, "the train and eval entries of a step are no duplicates");
  qc_l3_log_free(&l);
  parse_bad("{\"lm loss\": {\"start_step\": 1}}", "line 1 has no step: none of step, global_step");
  parse_bad("{\"log_history\": [{\"loss\": 1}]}", "log_history[0] has no step");
}

Test(l3log, megatron_placeholders_and_scalars) {
  qc_l3_log l;
  int h;
  /* a resumed run: "nan" placeholders for steps 1-5 in every metric; memory
   * logged only from step 10; a bare NaN is a logged value */
  parse_ok("{\"lm loss\": {\"start_step\": 1, \"end_step\": 15, \"step_interval\": 5,"
           " \"values\": {\"1\": \"nan\", \"5\": \"nan\", \"10\": 9.5, \"15\": NaN}},\n"
           " \"mem-allocated-bytes\": {\"start_step\": 1, \"end_step\": 15, \"step_interval\": 5,"
           " \"values\": {\"1\": \"nan\", \"5\": \"nan\", \"10\": \"nan\", \"15\": 1000}},\n"
           " \"iteration_timing_avg\": 0.3}",
           &l);
  cr_expect_str_eq(l.format, "megatron");
  cr_expect_eq(l.n, 2, "steps 1 and 5 are absent from every metric: no row");
  cr_expect_eq(l.step[0], 10);
  cr_expect_eq(l.placeholders, 5);
  cr_expect_eq(l.nskipped, 1, "iteration_timing_avg is skipped");
  val(&l, "mem-allocated-bytes", 10, &h);
  cr_expect_not(h, "a placeholder beside a logged metric is absent");
  cr_expect(isnan(val(&l, "lm loss", 15, &h)) && h, "a bare NaN is data");
  cr_expect_eq(qc_l3_log_col(&l, "iteration_timing_avg"), -1);
  qc_l3_log_free(&l);
  /* the older list form, with the scalar first */
  parse_ok("{\"iteration_timing_avg\": 0.3, \"lm loss\": {\"start_step\": 0, \"end_step\": 49, \"step_interval\": 5,"
           " \"values\": [10.5, 10.25, \"nan\"]}}", &l);
  cr_expect_str_eq(l.format, "megatron");
  cr_expect_eq(l.n, 2);
  cr_expect_eq(val(&l, "lm loss", 6, &h), 10.25);
  qc_l3_log_free(&l);
}

Test(l3log, step_keys) {
  qc_l3_log l;
  int h;
  /* LLaMA-Factory's trainer_log.jsonl: current_steps, text fields, a last line without loss */
  parse_ok("{\"current_steps\": 10, \"total_steps\": 20, \"loss\": 1.23, \"lr\": 1e-05, \"epoch\": 0.5, \"percentage\": 50.0,"
           " \"elapsed_time\": \"0:01:02\", \"remaining_time\": \"0:01:02\"}\n"
           "{\"current_steps\": 20, \"total_steps\": 20, \"epoch\": 1.0, \"percentage\": 100.0, \"elapsed_time\": \"0:02:04\","
           " \"remaining_time\": \"0:00:00\"}\n", &l);
  cr_expect_eq(l.n, 2);
  cr_expect_str_eq(l.step_key, "current_steps");
  cr_expect_eq(val(&l, "loss", 10, &h), 1.23);
  cr_expect_eq(qc_l3_log_col(&l, "current_steps"), -1, "the step key is no metric");
  qc_l3_log_free(&l);
  /* a W&B export: Step preferred to _step */
  parse_ok("Step,_step,_runtime,run-1 - loss\n1,3,0.5,2.5\n2,7,1.0,2.25\n", &l);
  cr_expect_str_eq(l.step_key, "Step");
  cr_expect_eq(val(&l, "run-1 - loss", 2, &h), 2.25);
  qc_l3_log_free(&l);
  parse_ok("_step,train/global_step,train/loss\n0,5,2.5\n1,10,2.25\n", &l);
  cr_expect_str_eq(l.step_key, "train/global_step");
  cr_expect_eq(val(&l, "train/loss", 10, &h), 2.25);
  qc_l3_log_free(&l);
  parse_ok("{\"global_step\": 3, \"loss\": 1}\n{\"iteration\": 4, \"loss\": 2}\n", &l);
  cr_expect_eq(l.n, 2);
  qc_l3_log_free(&l);
  /* a case's step_key: only that key */
  qc_err_clear();
  const char *own = "{\"it\": 7, \"step\": 1, \"loss\": 1}\n";
  cr_assert_eq(qc_log_parse_as(own, strlen(own), "t", "it", &l), QC_OK, "%s", qc_err_msg());
  cr_expect_eq(l.step[0], 7);
  cr_expect_eq(val(&l, "step", 7, &h), 1, "with a step_key, 'step' is a metric like any");
  qc_l3_log_free(&l);
  qc_err_clear();
  cr_expect_eq(qc_log_parse_as("a,b\n1,2\n", 8, "t", "it", &l), QC_EINPUT);
  cr_expect(strstr(qc_err_msg(), "no 'it' column (the case's step_key)") != NULL, "%s", qc_err_msg());
  parse_bad("{\"loss\": 1}\n", "current_steps");
}

Test(l3log, builder_rename) {
  qc_l3_log l;
  parse_ok("{\"step\": 1, \"lm loss\": 2, \"loss\": 1}\n", &l);
  int found;
  qc_err_clear();
  cr_expect_eq(qc_l3_log_rename(&l, "lm loss", "loss", &found), QC_EINPUT, "a tag onto a metric the log has");
  cr_expect_eq(qc_l3_log_rename(&l, "absent", "x", &found), QC_OK);
  cr_expect_not(found);
  qc_l3_log_free(&l);
}

Test(l3log, configs_json_yaml_and_paths) {
  qc_l3_keypath keys[] = {{"lr", "optimizer.lr"}, {"seed", "seed"}, {"sched", "schedule"}, {"first", "layers.0.name"},
                          {"dotted", "a.b"}, {"absent", "nope.x"}};
  qc_l3_config a, b;
  qc_err_clear();
  const char *json = "{\"optimizer\": {\"lr\": 1e-4}, \"seed\": 3, \"schedule\": {\"warmup\": 5, \"name\": \"cos\"},"
                     " \"layers\": [{\"name\": \"x\"}], \"a.b\": true}";
  cr_assert_eq(qc_config_parse(json, strlen(json), "a.json", keys, 6, &a),
               QC_OK, "%s", qc_err_msg());
  const char *yaml = "# a comment\noptimizer:\n  lr: 0.0001\nseed: 3\nschedule: {name: cos, warmup: 5}\nlayers:\n  - name: x\n"
                     "a.b: yes\n";
  cr_assert_eq(qc_config_parse(yaml, strlen(yaml), "b.yaml", keys, 6, &b), QC_OK, "%s", qc_err_msg());
  for (int i = 0; i < 5; i++) {
    cr_expect(a.v[i].present && b.v[i].present, "key %s", keys[i].key);
    cr_expect_str_eq(a.v[i].json, b.v[i].json, "key %s: JSON and YAML give the same canonical text", keys[i].key);
  }
  cr_expect_str_eq(a.v[0].json, "0.0001");
  cr_expect_str_eq(a.v[2].json, "{\"name\":\"cos\",\"warmup\":5}", "sorted keys");
  cr_expect_not(a.v[5].present);
  qc_l3_config_free(&a);
  qc_l3_config_free(&b);
  qc_err_clear();
  cr_expect_eq(qc_config_parse("key: [unclosed\n", 15, "c.yaml", keys, 1, &a), QC_EINPUT);
  cr_expect(strstr(qc_err_msg(), "c.yaml") != NULL, "%s", qc_err_msg());
  qc_err_clear();
  cr_expect_eq(qc_config_parse("{\"a\": }", 7, "d.json", keys, 1, &a), QC_EINPUT);
}
