/* diagnose.c: see diagnose.h. The driver: which hypotheses apply (the
 * class's generic names and its own), the predictions from another VJP run
 * (a rounded dY, the class's module variants), and the summary; the
 * predictions from the reference alone are in diagnose_ref.c. No class is
 * named here. */
#include "engine/diagnose.h"
#include "engine/diagnose_priv.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/qc.h"
#include "numerics/decode.h"
#include "numerics/formats.h"
#include "numerics/metrics.h"

/* 1 when w is a word of list (space- or slash-separated). */
static int has_word(const char *list, const char *w) {
  size_t n = strlen(w);
  for (const char *p = list ? strstr(list, w) : NULL; p; p = strstr(p + 1, w))
    if ((p == list || p[-1] == ' ' || p[-1] == '/') && (p[n] == 0 || p[n] == ' ' || p[n] == '/')) return 1;
  return 0;
}

/* What a quantization format's scale is, in words (for its hypothesis). */
static const char *qc_dg_format_words(const char *v) {
  static const struct { const char *f, *w; } t[] = {
      {"none", "no quantization"},
      {"fp8_tensor", "one per-tensor scale"},
      {"fp8_channel", "a scale per output channel"},
      {"fp8_token", "a scale per token"},
      {"fp8_block128", "a scale per 128 x 128 block"},
      {"fp8_block128_ue8m0", "a power-of-two scale per 128 x 128 block"},
      {"fp8_group128", "a scale per 1 x 128 group"},
      {"fp8_group128_ue8m0", "a power-of-two scale per 1 x 128 group"},
      {"mxfp8", "a power-of-two scale per 32 elements"},
      {"mxfp4", "FP4 with a power-of-two scale per 32 elements"},
      {"nvfp4", "FP4 with an FP8 scale per 16 elements and a per-tensor scale"}};
  for (size_t i = 0; i < sizeof t / sizeof t[0]; i++)
    if (strcmp(t[i].f, v) == 0) return t[i].w;
  return NULL;
}

/* ---- predictions from another VJP run ----------------------------------- */


/* dY rounded to a narrower type than it has (per-tensor scale for FP8). */
static int hyp_dy_precision(dg *d) {
  static const struct { qc_dtype dt; const char *name; double fmax; } v[] = {
      {QC_BF16, "bfloat16", 0}, {QC_F16, "float16", 0}, {QC_E4M3, "float8_e4m3fn", 448.0}, {QC_E5M2, "float8_e5m2", 57344.0}};
  const qc_registry_row *row = qc_registry_find(d->m->cls->name);
  int64_t n = qc_numel(d->dy);
  int width = d->dy->dtype == QC_F64 ? 4 : d->dy->dtype == QC_F32 ? 3 : d->dy->dtype == QC_F16 ? 2 : 1;
  double *y = malloc((size_t)(n + 1) * sizeof *y);
  qc_tensor rd = {0};
  int rc = QC_OK;
  if (!y) return qc_err_sys("out of memory diagnosing dY");
  qc_err_state es0; /* a dY that cannot be read: no prediction, no error */
  qc_err_save(&es0);
  const int unread = !row || qc_tensor_to_f64(d->dy, y) != QC_OK;
  qc_err_restore(&es0);
  if (unread) goto done;
  double amax = 0;
  for (int64_t i = 0; i < n; i++) amax = fmax(amax, fabs(y[i]));
  for (size_t j = 0; j < sizeof v / sizeof v[0] && amax > 0; j++) {
    int w = v[j].dt == QC_BF16 ? 1 : v[j].dt == QC_F16 ? 2 : 0;
    if (w && w >= width) continue;       /* not narrower than dY itself */
    if (w == 2 && d->dy->dtype == QC_BF16) continue;
    if ((rc = qc_tensor_alloc(&rd, d->dy->name, QC_F32, d->dy->ndim, d->dy->shape))) goto done;
    float *f = rd.data;
    double s = v[j].fmax > 0 ? amax / v[j].fmax : 1;
    for (int64_t i = 0; i < n; i++) {
      float x = (float)(y[i] / s);
      f[i] = v[j].dt == QC_E4M3 ? qc_e4m3_to_f32(qc_f32_to_e4m3(x)) : v[j].dt == QC_E5M2 ? qc_e5m2_to_f32(qc_f32_to_e5m2(x))
                                                                     : (float)qc_round_to(x, v[j].dt);
      f[i] = (float)(f[i] * s);
    }
    qc_err_state es; /* a prediction that cannot be made is skipped */
    qc_err_save(&es);
    int r2 = qc_dg_run_for(d, row->reference, d->m, &rd);
    qc_err_restore(&es);
    qc_tensor_free(&rd);
    if (r2) continue;
    char says[256];
    snprintf(says, sizeof says, "dY rounded to %s%s before the backward: the candidate saw another dY than the reference (a "
             "false difference if production really receives it: compare with the same dY)", v[j].name,
             v[j].fmax > 0 ? " (per-tensor scale)" : "");
    qc_dg_judge(d, "dy_precision", says, d->level);
  }
done:
  free(y);
  return rc;
}

/* 1 when key names a quantizer setting: "profile" or "*_format". */
static int quant_key(const char *key) {
  size_t l = strlen(key);
  return strcmp(key, "profile") == 0 || (l > 7 && strcmp(key + l - 7, "_format") == 0);
}

int qc_dg_scan_keys(dg *d, int (*keep)(const char *key), qc_dg_run_fn run, void *arg, const char *subject, const char *what) {
  double *best = malloc((size_t)d->n * sizeof *best);
  if (!best) return qc_err_sys("out of memory diagnosing %s", subject);
  for (const qc_key_spec *ks = d->m->cls->keys; ks && ks->key; ks++) {
    if (!ks->values || strchr(ks->values, '{') || !strcmp(ks->values, QC_KEY_STRING) || (keep && !keep(ks->key)))
      continue; /* numbers, keys that take one, free strings */
    const char *cur = qc_contract_str(&d->m->contract, ks->key, ks->dflt);
    double be = INFINITY;
    char bv[64] = "";
    for (const char *p = ks->values; *p;) {
      size_t l = strcspn(p, "|");
      char v[64];
      snprintf(v, sizeof v, "%.*s", (int)(l < sizeof v ? l : sizeof v - 1), p);
      p += l + (p[l] == '|');
      if (strcmp(v, cur) == 0 || strcmp(v, "auto") == 0) continue;
      qc_module alt = *d->m;
      qc_err_state es; /* a value the class refuses here is skipped */
      qc_err_save(&es);
      const int bad = qc_contract_set(&alt.contract, ks->key, v, 0, 0) || run(d, &alt, arg);
      qc_err_restore(&es);
      if (bad) continue;
      if (qc_rel_l2(d->p, d->rd, d->n) <= 1e-12) continue; /* the same result on this data */
      double e = qc_rel_l2(d->g, d->p, d->n);
      if (e < be) {
        be = e;
        snprintf(bv, sizeof bv, "%s", v);
        memcpy(best, d->p, (size_t)d->n * sizeof *best);
      }
    }
    if (!bv[0]) continue;
    memcpy(d->p, best, (size_t)d->n * sizeof *best);
    char says[256];
    const char *fw = qc_dg_format_words(bv), *fc = qc_dg_format_words(cur);
    if (fw && fc)
      snprintf(says, sizeof says, "%s matches %s with %s '%s' (%s) rather than the declared '%s' (%s)", subject, what, ks->key,
               bv, fw, cur, fc);
    else
      snprintf(says, sizeof says, "%s matches %s with %s '%s' rather than the declared '%s'", subject, what, ks->key, bv, cur);
    qc_dg_judge(d, ks->key, says, d->level);
  }
  free(best);
  return QC_OK;
}

/* The class's reference under an altered contract, for qc_dg_scan_keys. */
static int run_ref(dg *d, const qc_module *alt, void *arg) {
  const qc_registry_row *row = arg;
  return qc_dg_run_for(d, row->reference, alt, d->dy);
}

/* Another quantizer than the contract's in the backward: for each
 * quantizer key (profile, formats), the reference under every other value;
 * the best value per key recorded (another profile; a per-tensor scale
 * where the contract has blocks; ...). */
static int hyp_quantizer(dg *d) {
  const qc_registry_row *row = qc_registry_find(d->m->cls->name);
  if (!row) return QC_OK;
  return qc_dg_scan_keys(d, quant_key, run_ref, (void *)row, d->k->tensor, "the reference");
}

/* A stale per-tensor scale: the reference with ctx->wscale f (the class's
 * reference quantizes a per-tensor weight with f times its own scale; QC_NA
 * where it does not apply), f fitted over one octave, 1% then 0.05% steps. */
static void hyp_stale_scale(dg *d) {
  const qc_registry_row *row = qc_registry_find(d->m->cls->name);
  qc_ctx c = *d->ctx;
  const qc_ctx *c0 = d->ctx;
  double bf = 0, be = INFINITY;
  int ok = 0;
  qc_err_state es; /* a fit that cannot be made is no error */
  qc_err_save(&es);
  for (const qc_key_spec *ks = d->m->cls->keys; ks && ks->key; ks++) /* a per-tensor format in the contract */
    if (quant_key(ks->key) && strcmp(qc_contract_str(&d->m->contract, ks->key, ks->dflt), "fp8_tensor") == 0) ok = row != NULL;
  d->ctx = &c;
  for (int pass = 0; pass < 2 && ok; pass++) {
    double lo = pass ? bf * 0.99 : 0.7071, step = pass ? bf * 0.0005 : 0.01;
    for (int i = 0; i < (pass ? 41 : 71) && ok; i++) {
      c.wscale = pass ? lo + i * step : lo * pow(1.01, i);
      if (qc_dg_run_for(d, row->reference, d->m, d->dy)) { ok = 0; break; }
      if (!pass && !i && qc_rel_l2(d->p, d->rd, d->n) <= 1e-12) { ok = 0; break; } /* this gradient does not see the scale */
      double e = qc_rel_l2(d->g, d->p, d->n);
      if (e < be) { be = e; bf = c.wscale; }
    }
  }
  c.wscale = bf;
  if (ok && !qc_dg_run_for(d, row->reference, d->m, d->dy)) {
    char says[256];
    snprintf(says, sizeof says, "%s from a weight quantized with a stale per-tensor scale: %.4g x the current weight's amax / 448 "
             "(a scale from an earlier step's amax, as delayed scaling keeps it)", d->k->tensor, bf);
    d->ctx = c0;
    qc_dg_judge(d, "stale_scale", says, d->level);
  }
  d->ctx = c0;
  qc_err_restore(&es);
}

/* The float inputs rounded to a float8 type (per-tensor scale amax / max)
 * before the backward: an operand such as X saved in lower precision. */
static int hyp_input_precision(dg *d) {
  static const struct { qc_dtype dt; const char *name; double fmax; } v[] = {
      {QC_E4M3, "float8_e4m3fn", 448.0}, {QC_E5M2, "float8_e5m2", 57344.0}};
  const qc_registry_row *row = qc_registry_find(d->m->cls->name);
  int rc = QC_OK;
  for (size_t j = 0; row && j < sizeof v / sizeof v[0]; j++) {
    qc_module alt = *d->m;
    memset(&alt.inputs, 0, sizeof alt.inputs);
    if ((rc = qc_tset_clone(&alt.inputs, &d->m->inputs))) break; /* out of memory: the run's error */
    qc_err_state es; /* a prediction that cannot be made is skipped */
    qc_err_save(&es);
    int any = 0;
    for (int i = 0; i < alt.inputs.n; i++) {
      qc_tensor *t = &alt.inputs.t[i];
      if (t->dtype != QC_F32 && t->dtype != QC_F64) continue; /* bf16 inputs are what the trainer saved */
      if (!qc_module_input_grad(d->m, t->name)) continue;   /* a table the class reads (rope's inv_freq) */
      int64_t n = qc_numel(t);
      double amax = 0;
      for (int64_t e = 0; e < n; e++) {
        double x = t->dtype == QC_F32 ? ((float *)t->data)[e] : ((double *)t->data)[e];
        if (isfinite(x)) amax = fmax(amax, fabs(x));
      }
      if (!(amax > 0)) continue;
      double s = amax / v[j].fmax;
      for (int64_t e = 0; e < n; e++) {
        double x = t->dtype == QC_F32 ? ((float *)t->data)[e] : ((double *)t->data)[e];
        if (!isfinite(x)) continue;
        float q = (float)(x / s);
        double r = (v[j].dt == QC_E4M3 ? qc_e4m3_to_f32(qc_f32_to_e4m3(q)) : qc_e5m2_to_f32(qc_f32_to_e5m2(q))) * s;
        if (t->dtype == QC_F32) ((float *)t->data)[e] = (float)r;
        else ((double *)t->data)[e] = r;
      }
      any = 1;
    }
    if (any && !qc_dg_run_for(d, row->reference, &alt, d->dy)) {
      char says[256];
      snprintf(says, sizeof says, "the float inputs rounded to %s (per-tensor scale) before the backward: %s computed from a "
               "lower-precision saved input than the forward's", v[j].name, d->k->tensor);
      qc_dg_judge(d, "input_precision", says, d->level);
    }
    qc_err_restore(&es);
    qc_module_variant_free(&alt, d->m);
  }
  return rc;
}

/* A 1-D gradient that is dY summed over its rows (a bias's), reduced over
 * dY's columns instead (a square dY keeps the size). */
static void hyp_axis(dg *d) {
  const qc_tensor *dy = d->dy;
  if (d->r->ndim != 1 || !dy || dy->ndim < 2) return;
  int64_t C = dy->shape[dy->ndim - 1], R = C ? qc_numel(dy) / C : 0;
  if (C != d->n || R != C) return;
  double *y = malloc((size_t)(R * C + 1) * sizeof *y), *col = calloc((size_t)C + 1, sizeof *col);
  qc_err_state es; /* a dY that cannot be read: no prediction, no error */
  qc_err_save(&es);
  if (y && col && !qc_tensor_to_f64(dy, y)) {
    for (int64_t i = 0; i < R; i++)
      for (int64_t c = 0; c < C; c++) col[c] += y[i * C + c];
    if (qc_rel_l2(col, d->rd, C) <= 1e-9) { /* the reference is dY's column sums */
      for (int64_t i = 0; i < R; i++) {
        double s = 0;
        for (int64_t c = 0; c < C; c++) s += y[i * C + c];
        d->p[i] = s;
      }
      char says[256];
      snprintf(says, sizeof says, "%s reduced over the wrong axis: dY summed over its features (last dimension) instead of its "
               "%lld tokens", d->k->tensor, (long long)R);
      qc_dg_judge(d, "axis", says, d->level);
    }
  }
  qc_err_restore(&es);
  free(y);
  free(col);
}

/* The class's own hypotheses for this gradient. */
static void hyp_class(dg *d) {
  const qc_registry_row *row = qc_registry_find(d->m->cls->name);
  char w[QC_NAMELEN + 2];
  snprintf(w, sizeof w, "/%s/", d->k->tensor);
  for (const qc_hypothesis *h = d->m->cls->hyps; row && h && h->name; h++) {
    if (!strstr(h->grads, w)) continue;
    char detail[160] = "", says[256];
    int rc = QC_NA;
    double lv = d->level;
    qc_err_state es; /* a hypothesis that cannot be tested is skipped */
    qc_err_save(&es);
    if (h->alter) {
      qc_module alt = *d->m;
      rc = h->alter(d->m, &alt, detail, sizeof detail);
      if (!rc) rc = qc_dg_run_for(d, h->via_production ? d->m->cls->production : row->reference, &alt, d->dy);
      qc_module_variant_free(&alt, d->m);
      if (h->via_production) lv *= 2; /* two computations that each carry the noise */
    } else if (h->predict) {
      qc_tensor pt = {0};
      rc = h->predict(d->ctx, d->m, d->dy, d->k->tensor, d->cand, &pt, detail, sizeof detail);
      if (!rc) rc = qc_numel(&pt) == d->n ? qc_tensor_to_f64(&pt, d->p) : QC_NA;
      qc_tensor_free(&pt);
      lv *= 2; /* a production-style prediction may carry the noise too */
    }
    qc_err_restore(&es);
    if (rc) continue;
    snprintf(says, sizeof says, "%s%s%s", h->says, detail[0] ? "; " : "", detail);
    qc_dg_judge(d, h->name, says, lv);
    if (h->fitted) d->fitted[d->k->nhyp - 1] = 1;
  }
}

/* ---- the summary -------------------------------------------------------- */

/* The summary: the consistent hypothesis closest to the candidate first
 * (ranked by its residual), then the other specific ones (a constant factor
 * only when it fits best), the fitted ones only when nothing specific holds. */
/* Order key of hypothesis i: consistent before not, specific before
 * fitted, then by residual (none: first); the tested order otherwise. */
static double rank_key(const dg *d, int i, int *cls) {
  const struct qc_hyp_result *h = &d->k->hyp[i];
  *cls = !h->consistent ? 2 : d->fitted[i] ? 1 : 0;
  return *cls == 2 ? (double)i : isnan(h->rel_l2) ? -1.0 : h->rel_l2;
}


int qc_dg_setup(dg *d, const char *what) {
  d->n = qc_numel(d->r);
  d->C = d->r->ndim ? d->r->shape[d->r->ndim - 1] : 1;
  d->R = d->n / (d->C ? d->C : 1);
  d->g = malloc((size_t)(d->n + 1) * sizeof *d->g);
  d->p = malloc((size_t)(d->n + 1) * sizeof *d->p);
  d->rd = (double *)d->r->data;
  if (!d->g || !d->p) return qc_err_sys("out of memory diagnosing %s", what);
  int rc = qc_tensor_to_f64(d->cand, d->g);
  if (rc) return rc;
  qc_dtype jd = QC_F32;
  if (qc_dtype_from_name(d->k->judged_dtype, &jd)) jd = d->cand->dtype;
  const double u = qc_dtype_unit(jd == QC_BF16 || jd == QC_F16 || jd == QC_F32 ? jd : QC_F64); /* as qc_audit_verdict's */
  d->floor = fmax(isnan(d->k->m.noise_floor) ? 0 : d->k->m.noise_floor, 0.1 * u / sqrt(3.0));
  d->e0 = d->k->m.rel_l2;
  return QC_OK;
}
/* Sort the recorded hypotheses by rank_key (stable), fitted marks with them,
 * so a report's first consistent hypothesis is the best one. */
static void rank_hyps(dg *d) {
  qc_check *k = d->k;
  for (int i = 1; i < k->nhyp; i++)
    for (int j = i; j > 0; j--) {
      int ca, cb;
      double ka = rank_key(d, j - 1, &ca), kb = rank_key(d, j, &cb);
      if (ca < cb || (ca == cb && ka <= kb)) break;
      struct qc_hyp_result t = k->hyp[j];
      k->hyp[j] = k->hyp[j - 1];
      k->hyp[j - 1] = t;
      char f = d->fitted[j];
      d->fitted[j] = d->fitted[j - 1];
      d->fitted[j - 1] = f;
    }
}

void qc_dg_summarize(dg *d) {
  qc_check *k = d->k;
  rank_hyps(d);
  size_t o = 0;
  char *s = k->diagnosis;
  size_t n = sizeof k->diagnosis;
  int nc = 0;
  for (int pass = 0; pass < 3; pass++) /* the closest specific one, the other specific ones, the fitted ones */
    for (int i = 0; i < k->nhyp; i++) {
      struct qc_hyp_result *h = &k->hyp[i];
      if (!h->consistent) continue;
      int best = !d->fitted[i];
      for (int j = 0; j < k->nhyp; j++)
        if (j != i && k->hyp[j].consistent && !d->fitted[j] && k->hyp[j].rel_l2 < h->rel_l2) best = 0;
      if (pass != (d->fitted[i] ? 2 : best ? 0 : 1) || (pass == 2 && nc)) continue; /* fitted: only when nothing specific holds */
      if (pass == 1 && strcmp(h->name, "factor") == 0) continue; /* a factor only when it explains the error best */
      const char *lead = nc ? "; also: " : strcmp(h->name, "nonfinite") == 0 ? "traced: " : "consistent with: ";
      nc++;
      if (o < n) o += (size_t)snprintf(s + o, n - o, "%s%s", lead, h->says);
      if (o < n && !isnan(h->rel_l2))
        o += (size_t)snprintf(s + o, n - o, " (rel_l2 to that prediction %.2g, %s)", h->rel_l2,
                              h->rel_l2 <= 1.5 * d->floor ? "at the noise floor" : "within the noise level");
    }
  if (!nc) {
    o = (size_t)snprintf(s, n, "no known signature (tested:");
    for (int i = 0; i < k->nhyp && o < n; i++) {
      int dup = 0;
      for (int j = 0; j < i; j++) dup |= strcmp(k->hyp[j].name, k->hyp[i].name) == 0;
      if (!dup) o += (size_t)snprintf(s + o, n - o, " %s", k->hyp[i].name);
    }
    if (o < n) snprintf(s + o, n - o, "%s)", k->nhyp ? "" : " nothing applied");
  }
}

int qc_diagnose(const qc_ctx *ctx, const qc_module *m, const qc_tensor *dy, const qc_tensor *g, const qc_tensor *r,
                const qc_tset *ref_names, const char *frozen, qc_check *k) {
  const char *gen = m->cls->hypotheses;
  k->nhyp = 0;
  if (!g) {
    snprintf(k->diagnosis, sizeof k->diagnosis, "the candidate has no %s: a gradient never produced (a missing term%s)",
             k->tensor, strncmp(k->tensor, "d_", 2) == 0 && qc_tset_get(&m->params, k->tensor + 2) ? ": its parameter's gradient "
             "was not emitted" : "");
    return QC_OK;
  }
  if (!qc_dtype_is_float(g->dtype) || g->dtype == QC_E2M1X2 || qc_numel(g) != qc_numel(r) || qc_numel(r) == 0) {
    int64_t dc = dy && dy->ndim ? dy->shape[dy->ndim - 1] : 0;
    if (qc_numel(g) == qc_numel(r) && g->ndim == 2 && r->ndim == 2 && g->shape[0] == r->shape[1] && g->shape[1] == r->shape[0])
      snprintf(k->diagnosis, sizeof k->diagnosis, "the candidate's shape is the reference's transposed: a transposed gradient");
    else if (r->ndim == 1 && dc == qc_numel(r) && dc > 0 && qc_numel(g) == qc_numel(dy) / dc && qc_numel(g) != dc)
      snprintf(k->diagnosis, sizeof k->diagnosis, "%s reduced over the wrong axis: the candidate has one value per token (%lld, "
               "dY's rows) where the reference has one per feature (%lld): dY summed over its features instead of its tokens",
               k->tensor, (long long)qc_numel(g), (long long)dc);
    else
      snprintf(k->diagnosis, sizeof k->diagnosis, "no known signature");
    return QC_OK;
  }
  dg d = {.ctx = ctx, .m = m, .dy = dy, .r = r, .cand = g, .ref_names = ref_names, .k = k};
  int rc = qc_dg_setup(&d, k->tensor);
  if (rc) goto done;
  d.level = k->level > 0 ? k->level : (k->tol.has_rel_l2 ? k->tol.rel_l2 : 3 * d.floor);
  if (k->m.nonfinite) {
    if (has_word(gen, "nonfinite")) qc_dg_nonfinite(&d);
  } else {
    if (has_word(gen, "zero")) qc_dg_zero(&d, frozen);
    if (has_word(gen, "factor") || has_word(gen, "sign")) qc_dg_factor(&d, has_word(gen, "factor"), has_word(gen, "sign"));
    if (has_word(gen, "transpose")) qc_dg_transpose(&d);
    if (has_word(gen, "rows") && (rc = qc_dg_rows(&d))) goto done;
    if (has_word(gen, "slice")) {
      qc_dg_slice(&d);
      qc_dg_one_slice(&d);
    }
    hyp_class(&d);
    if (has_word(gen, "dy_precision") && (rc = hyp_dy_precision(&d))) goto done;
    if (has_word(gen, "dy_precision") && (rc = hyp_input_precision(&d))) goto done; /* the operands' precision */
    hyp_axis(&d);
    double work = (double)d.n;
    for (int i = 0; i < m->params.n; i++) work = fmax(work, (double)qc_numel(&m->params.t[i]) * (double)d.R);
    if (work <= 4e8 && (rc = hyp_quantizer(&d))) goto done;
    if (work <= 4e8 && has_word(gen, "dy_precision")) hyp_stale_scale(&d);
    if (work <= 4e8 && (rc = qc_dg_block_scale(&d, work))) goto done;
  }
  qc_dg_summarize(&d);
done:
  free(d.g);
  free(d.p);
  return rc;
}
