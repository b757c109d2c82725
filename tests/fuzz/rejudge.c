/* fuzz harness `rejudge`: a report read back is re-judged from its checks
 * (report/rejudge.c, qc_report_rejudge; docs/robustness.md, "Reports read
 * back"). Two kinds of input, told by the first byte:
 *  - '{': the bytes as a JSON report, parsed and re-judged (any verb, any
 *    words, any numbers): no crash, leak or undefined behaviour;
 *  - anything else: the bytes pick the metrics and bounds of one vjp check
 *    (zeros, NaN, infinities, values one ulp either side of a bound, any
 *    double), qc_judge judges it, qatcheck's own writer (qc_report_json)
 *    writes it with that verdict or its opposite, and the report is read
 *    back. Properties, each a finding (abort) when broken: the verdict the
 *    run gave is always accepted (the numbers read back are the numbers
 *    judged); a "pass" that qc_judge fails is always refused; a "fail" that
 *    qc_judge passes is read as one failed check. */
// fuzz-seeds: tests/fuzz/seeds/rejudge tests/fuzz/seeds/report
// fuzz-options: -max_len=65536 -timeout=10
#include <cjson/cJSON.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/qc.h"
#include "model/check.h"
#include "report/report.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

typedef struct bytes {
  const uint8_t *p;
  size_t n;
} bytes;

static unsigned take8(bytes *b) {
  if (!b->n) return 0;
  b->n--;
  return *b->p++;
}

/* A metric or bound from the input: a selector byte, then maybe a double.
 * near: the value a bound is often set against (one ulp either side). */
static double value(bytes *b, double near, int nonneg, int finite) {
  unsigned s = take8(b);
  double v;
  switch (s % 12) {
  case 0: v = 0.0; break;
  case 1: v = finite ? 1e-3 : NAN; break;
  case 2: v = finite ? 1.0 : INFINITY; break;
  case 3: v = near; break;
  case 4: v = nextafter(near, INFINITY); break;
  case 5: v = nextafter(near, -INFINITY); break;
  case 6: v = near * (1.0 + (double)(take8(b) % 8) * 0x1p-52); break;
  case 7: v = 4e-3; break;
  case 8: v = 0.99999; break;
  case 9: v = (double)take8(b) / 7.0; break;
  case 10: v = 1e-30 * (double)take8(b); break;
  default: {
    uint64_t u = 0;
    for (int i = 0; i < 8; i++) u = u << 8 | take8(b);
    memcpy(&v, &u, sizeof v);
  }
  }
  if (finite && !isfinite(v)) v = 1.0;
  if (nonneg && v < 0) v = -v;
  return v;
}

/* One vjp check from the input, judged, written by qatcheck and read back. */
static void round_trip(bytes *b) {
  qc_check k;
  memset(&k, 0, sizeof k);
  snprintf(k.module, sizeof k.module, "/m");
  snprintf(k.cls, sizeof k.cls, "linear");
  snprintf(k.dy, sizeof k.dy, "dy");
  snprintf(k.tensor, sizeof k.tensor, "d_x");
  snprintf(k.cand_dtype, sizeof k.cand_dtype, "bfloat16");
  k.ndim = 1;
  k.shape[0] = 4;
  k.has_metrics = k.has_tol = 1;
  qc_metrics *m = &k.m;
  qc_tol *t = &k.tol;
  unsigned flags = take8(b) | take8(b) << 8;
  /* the metrics as metrics.c makes them: norms, and the ratio and cosine from them */
  m->norm_g = value(b, 1.0, 1, 0);
  m->norm_r = value(b, m->norm_g, 1, 0);
  if (isnan(m->norm_g)) m->norm_g = 0;
  if (isnan(m->norm_r)) m->norm_r = 1;
  m->norm_ratio = m->norm_r > 0 ? m->norm_g / m->norm_r : (m->norm_g > 0 ? INFINITY : NAN);
  m->cosine_null = !(m->norm_g > 0 && m->norm_r > 0);
  m->cosine = m->cosine_null ? NAN : fmax(fmin(value(b, 0.99999, 0, 0), 1.5), -1.5); /* NaN stays NaN */
  m->rel_l2 = value(b, 4e-3, 1, 0);
  m->max_abs = value(b, 1e-3, 1, 0);
  m->sqnr_db = value(b, 50.0, 0, 0);
  m->noise_floor = value(b, 4e-3, 1, 0);
  m->noise_multiple = value(b, 1.0, 1, 0);
  m->nonfinite = flags & 1 ? (int64_t)(take8(b) % 3) : 0;
  m->worst = -1;
  /* the terms' scale widens the bounds by te = term_floor / ||r||, finite for every check qatcheck makes
   * (the terms' scale follows the reference's); an infinite te would make an infinite metric (written
   * null, as NaN is) pass its bound, which no real check reaches */
  m->term_floor = flags & 2 ? value(b, 1e-6, 1, 1) : 0;
  if (!(m->norm_r > 0 && isfinite(m->term_floor / m->norm_r))) m->term_floor = 0;
  m->bias_z = flags & 4 ? value(b, 5.0, 0, 0) : NAN;
  m->e_par = value(b, 1e-3, 0, 1);
  m->bias_sd = m->bias_allow = m->bias_z_raw = 0;
  /* the bounds: finite, as the lint and the derivation make them */
  if ((t->has_rel_l2 = flags >> 3 & 1)) t->rel_l2 = value(b, m->rel_l2, 1, 1);
  if ((t->has_max_abs = flags >> 4 & 1)) t->max_abs = value(b, m->max_abs, 1, 1);
  if ((t->has_cosine_min = flags >> 5 & 1)) t->cosine_min = value(b, isfinite(m->cosine) ? m->cosine : 0.99999, 0, 1);
  if ((t->has_noise_multiple = flags >> 6 & 1)) t->noise_multiple = value(b, m->noise_multiple, 1, 1);
  if ((t->has_bias_z = flags >> 7 & 1)) t->bias_z = value(b, isfinite(m->bias_z) ? fabs(m->bias_z) : 5.0, 1, 1);
  if ((t->has_norm_ratio = flags >> 8 & 1)) {
    double r = isfinite(m->norm_ratio) ? m->norm_ratio : 1.0;
    t->norm_lo = value(b, r, 1, 1);
    t->norm_hi = value(b, r, 1, 1);
  }
  snprintf(t->reasoning, sizeof t->reasoning, "fuzz");
  int judged = qc_judge(m, t, k.why, sizeof k.why);
  int written = flags >> 9 & 1 ? !judged : judged;
  k.verdict = written;
  qc_results res = {1, 1, &k};
  qc_report_info info = {.verb = "vjp"};
  qc_sbuf text = {0};
  if (qc_report_json(&text, NULL, &info, &res)) { /* out of memory: nothing to judge */
    qc_sbuf_free(&text);
    qc_err_clear();
    return;
  }
  cJSON *r = cJSON_Parse(text.s);
  if (!r) {
    fprintf(stderr, "rejudge: qatcheck's own report does not parse:\n%s\n", text.s);
    abort();
  }
  qc_report_counts c;
  int rc = qc_report_rejudge(r, "report", "fuzz", &c);
  int ok = written == judged ? rc == QC_OK && c.failed == (written != QC_V_PASS)
         : written == QC_V_PASS ? rc == QC_EINPUT
                                : rc == QC_OK && c.failed == 1;
  if (!ok) {
    fprintf(stderr, "rejudge: qc_judge says %s, the report says %s, read back: rc %d (%s), %d failed\n%s\n",
            judged == QC_V_PASS ? "pass" : "fail", written == QC_V_PASS ? "pass" : "fail", rc, qc_err_msg(), c.failed,
            text.s);
    abort();
  }
  cJSON_Delete(r);
  qc_sbuf_free(&text);
  qc_err_clear();
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  if (size && data[0] == '{') {
    cJSON *r = cJSON_ParseWithLength((const char *)data, size);
    qc_report_counts c;
    if (r) (void)qc_report_rejudge(r, "report", "fuzz", &c);
    cJSON_Delete(r);
    qc_err_clear();
    return 0;
  }
  bytes b = {data, size};
  round_trip(&b);
  return 0;
}
