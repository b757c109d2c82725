/* diagnose.c: see diagnose.h. The generic hypotheses (QC_HYP_GENERIC)
 * predict from the reference alone (a factor, a transpose, moved rows, a
 * zero tensor or slice), from the reference run on a rounded dY, or trace a
 * non-finite value; the class's own come from its registry row. No class
 * is named here. */
#include "engine/diagnose.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/qc.h"
#include "numerics/decode.h"
#include "numerics/formats.h"
#include "numerics/metrics.h"

/* One diagnosis in progress: the candidate and reference as float64, their
 * view as [R, C] rows, and the noise level a prediction must reach. */
typedef struct dg {
  const qc_ctx *ctx;
  const qc_module *m;
  const qc_tensor *dy, *r, *cand;
  const qc_tset *ref_names;
  qc_check *k;
  double *g, *rd, *p;   /* candidate, reference, scratch prediction [n] */
  int64_t n, R, C;
  double e0;            /* rel_l2 of the candidate to the reference */
  double level, floor;  /* noise level of a correct candidate; the effective noise floor */
  char fitted[16];      /* per recorded hypothesis: fitted to the candidate (reported last) */
} dg;

static double rel(const double *a, const double *b, int64_t n) {
  double d = 0, s = 0;
  for (int64_t i = 0; i < n; i++) {
    d += (a[i] - b[i]) * (a[i] - b[i]);
    s += b[i] * b[i];
  }
  return sqrt(d) / fmax(sqrt(s), QC_EPS_NORM);
}

static int has_word(const char *list, const char *w) {
  size_t n = strlen(w);
  for (const char *p = list ? strstr(list, w) : NULL; p; p = strstr(p + 1, w))
    if ((p == list || p[-1] == ' ' || p[-1] == '/') && (p[n] == 0 || p[n] == ' ' || p[n] == '/')) return 1;
  return 0;
}

/* Record hypothesis `name` tested with prediction error e (NAN: none) at
 * level lv; consistent when the prediction is closer than the reference
 * and within the level, and (distinct) tells it apart from the reference. */
static void record(dg *d, const char *name, const char *says, double e, double lv, int distinct) {
  qc_check *k = d->k;
  if (k->nhyp >= (int)(sizeof k->hyp / sizeof k->hyp[0])) return;
  struct qc_hyp_result *h = &k->hyp[k->nhyp++];
  snprintf(h->name, sizeof h->name, "%s", name);
  snprintf(h->says, sizeof h->says, "%s", says);
  h->rel_l2 = e;
  h->level = lv;
  h->consistent = distinct && e <= lv && e < d->e0;
}

/* A prediction's error against the candidate, recorded; distinct when the
 * prediction differs from the reference by more than the level. */
static void judge_pred(dg *d, const char *name, const char *says, double lv) {
  double e = rel(d->g, d->p, d->n), dist = rel(d->p, d->rd, d->n);
  record(d, name, says, e, lv, dist > lv);
}

/* ---- a constant factor, a sign flip ------------------------------------- */

static void named_factor(dg *d, double kf, double tol, char *says, size_t n) {
  double kr[8];
  char ks[8][160];
  int nr = d->m->cls->ratios ? d->m->cls->ratios(d->m, d->k->tensor, kr, ks, 8) : 0;
  for (int i = 0; i < nr; i++)
    if (fabs(kf / kr[i] - 1) <= tol) {
      snprintf(says, n, "a constant factor k = %.5g (%s)", kf, ks[i]);
      return;
    }
  int expert = strstr(d->m->path, "expert") != NULL; /* expert weights: scaled in the optimizer step */
  const char *timing = expert ? "or an expert gradient dumped before the optimizer step applies its expert-DP / DP scaling"
                              : "or a gradient dumped before the optimizer step applies its data-parallel scaling";
  for (int j = 2; j <= 1024; j++) {
    if (fabs(kf / j - 1) <= tol) {
      if (j == 2) snprintf(says, n, "a constant factor k = %.5f (= 2: a doubled gradient, an all-reduce summed twice or a "
                           "term added twice, %s)", kf, timing);
      else snprintf(says, n, "a constant factor k = %.5f (= %d: a parallelism ratio, summed over %d ranks where it should be "
                    "averaged, %s)", kf, j, j, timing);
      return;
    }
    if (fabs(kf * j - 1) <= tol) {
      if (j == 2) snprintf(says, n, "a constant factor k = %.5f (= 1/2: half the gradient, averaged over 2 ranks where it "
                           "should be summed, a missing all-reduce or one of two terms lost, %s)", kf, timing);
      else snprintf(says, n, "a constant factor k = %.5f (= 1/%d: a parallelism ratio, averaged over %d ranks where it should "
                    "be summed or a missing all-reduce, %s)", kf, j, j, timing);
      return;
    }
  }
  snprintf(says, n, "a constant factor k = %.6g (a scale applied or lost inside the backward)", kf);
}

static void hyp_factor(dg *d, int want_factor, int want_sign) {
  double sgr = 0, srr = 0, sgg = 0;
  for (int64_t i = 0; i < d->n; i++) {
    sgr += d->g[i] * d->rd[i];
    srr += d->rd[i] * d->rd[i];
    sgg += d->g[i] * d->g[i];
  }
  if (!(srr > 0) || !(sgg > 0)) return; /* a zero candidate is the `zero` hypothesis's */
  double kf = sgr / srr, sd = d->k->m.bias_sd;
  for (int64_t i = 0; i < d->n; i++) d->p[i] = kf * d->rd[i];
  double e = rel(d->g, d->p, d->n);
  /* near 1 the factor is told from the reference by the bias test's standard error */
  int distinct = fabs(kf - 1) > d->level || (sd > 0 && isfinite(sd) && fabs(kf - 1) > 5 * sd + d->k->m.bias_allow);
  double tol = fmax(d->level, isfinite(sd) ? 5 * sd : 0);
  char says[256];
  if (kf < 0 && fabs(kf + 1) <= tol) {
    if (want_sign) record(d, "sign", "a sign flip (the gradient negated)", e, d->level, 1);
    return;
  }
  if (!want_factor) return;
  named_factor(d, kf, tol, says, sizeof says);
  /* the factor explains the data when the residual is at the level, even if
   * the reference's own error is only a little larger (a small factor) */
  record(d, "factor", says, e, d->level, distinct);
  if (distinct && e <= d->level && !(e < d->e0)) d->k->hyp[d->k->nhyp - 1].consistent = 1;
}

/* ---- a transposed gradient, moved rows ---------------------------------- */

static void hyp_transpose(dg *d) {
  const qc_tensor *r = d->r;
  if (r->ndim < 2 || r->shape[r->ndim - 1] != r->shape[r->ndim - 2] || r->shape[r->ndim - 1] < 2) return;
  int64_t a = r->shape[r->ndim - 1], blocks = d->n / (a * a);
  for (int64_t b = 0; b < blocks; b++)
    for (int64_t i = 0; i < a; i++)
      for (int64_t j = 0; j < a; j++) d->p[b * a * a + i * a + j] = d->rd[b * a * a + j * a + i];
  judge_pred(d, "transpose", "the gradient transposed (rows and columns swapped)", d->level);
}

/* Rows shifted by s (wrap: rolled; else zero-filled), rows = leading dims. */
static void shifted(dg *d, int64_t s, int wrap) {
  for (int64_t i = 0; i < d->R; i++) {
    int64_t src = i - s;
    if (wrap) src = ((src % d->R) + d->R) % d->R;
    if (src < 0 || src >= d->R) memset(d->p + i * d->C, 0, (size_t)d->C * sizeof *d->p);
    else memcpy(d->p + i * d->C, d->rd + src * d->C, (size_t)d->C * sizeof *d->p);
  }
}

static int cmp_norm(const void *a, const void *b) {
  const double *x = a, *y = b;
  return (x[0] > y[0]) - (x[0] < y[0]);
}

static int hyp_rows(dg *d) {
  if (d->R < 2 || d->r->ndim < 2) return QC_OK;
  double best = INFINITY;
  int64_t bs = 0;
  int bw = 0;
  for (int64_t s = -4; s <= 4; s++)
    for (int wrap = 0; wrap < 2 && s != 0 && llabs(s) < d->R; wrap++) {
      shifted(d, s, wrap);
      double e = rel(d->g, d->p, d->n);
      if (e < best) { best = e; bs = s; bw = wrap; }
    }
  char says[256];
  if (bs) {
    shifted(d, bs, bw);
    snprintf(says, sizeof says, "rows (tokens) shifted by %+lld%s: row i holds the reference's row i %s %lld", (long long)bs,
             bw ? " (rolled)" : "", bs > 0 ? "-" : "+", (long long)llabs(bs));
    judge_pred(d, "rows", says, d->level);
    if (d->k->hyp[d->k->nhyp - 1].consistent) return QC_OK;
    d->k->nhyp--; /* a shift does not explain it: try a permutation */
  }
  /* a permutation: each candidate row matched to the nearest reference row
   * among those of similar norm (sorted norms, 8 neighbours each side) */
  double *nr = malloc((size_t)d->R * 2 * sizeof *nr);
  if (!nr) return qc_err_sys("out of memory diagnosing rows");
  for (int64_t i = 0; i < d->R; i++) {
    double s = 0;
    for (int64_t c = 0; c < d->C; c++) s += d->rd[i * d->C + c] * d->rd[i * d->C + c];
    nr[2 * i] = sqrt(s);
    nr[2 * i + 1] = (double)i;
  }
  qsort(nr, (size_t)d->R, 2 * sizeof *nr, cmp_norm);
  int64_t moved = 0, ex = -1, ey = -1;
  char *used = calloc((size_t)d->R, 1);
  if (!used) { free(nr); return qc_err_sys("out of memory diagnosing rows"); }
  for (int64_t i = 0; i < d->R; i++) {
    const double *gi = d->g + i * d->C;
    double s = 0;
    for (int64_t c = 0; c < d->C; c++) s += gi[c] * gi[c];
    s = sqrt(s);
    int64_t lo = 0, hi = d->R;
    while (lo < hi) { int64_t mid = (lo + hi) / 2; if (nr[2 * mid] < s) lo = mid + 1; else hi = mid; }
    double bd = INFINITY;
    int64_t bj = i;
    for (int64_t q = lo - 8; q <= lo + 8; q++) {
      if (q < 0 || q >= d->R) continue;
      int64_t j = (int64_t)nr[2 * q + 1];
      double dd = 0;
      for (int64_t c = 0; c < d->C; c++) dd += (gi[c] - d->rd[j * d->C + c]) * (gi[c] - d->rd[j * d->C + c]);
      if (!used[j] && (dd < bd || (dd == bd && j == i))) { bd = dd; bj = j; }
    }
    used[bj] = 1; /* a permutation uses each reference row once */
    memcpy(d->p + i * d->C, d->rd + bj * d->C, (size_t)d->C * sizeof *d->p);
    if (bj != i && rel(gi, d->rd + i * d->C, d->C) > d->level) {
      if (!moved++) { ex = i; ey = bj; }
    }
  }
  free(nr);
  free(used);
  if (!moved) {
    if (bs) { /* the best shift, recorded as tested */
      shifted(d, bs, bw);
      judge_pred(d, "rows", "rows (tokens) shifted or permuted", d->level);
    }
    return QC_OK;
  }
  snprintf(says, sizeof says, "rows (tokens) permuted: %lld of %lld rows hold another position's gradient (row %lld holds "
           "the reference's row %lld)", (long long)moved, (long long)d->R, (long long)ex, (long long)ey);
  judge_pred(d, "rows", says, d->level);
  return QC_OK;
}

/* ---- zero tensor, zero slices ------------------------------------------- */

static void hyp_zero(dg *d, const char *frozen) {
  double sg = 0;
  for (int64_t i = 0; i < d->n; i++) sg += d->g[i] * d->g[i];
  if (sg != 0 || d->k->m.norm_r == 0) return;
  const char *t = d->k->tensor;
  int param = strncmp(t, "d_", 2) == 0 && qc_tset_get(&d->m->params, t + 2) != NULL;
  char says[256], w[QC_NAMELEN + 2];
  snprintf(w, sizeof w, "/%s/", t);
  if (param && frozen && strstr(frozen, w))
    snprintf(says, sizeof says, "params/%s is marked frozen yet its gradient is present and zero: zeroing is not freezing "
             "(AdamW's weight decay still moves it); a frozen parameter has no gradient", t + 2);
  else if (param)
    snprintf(says, sizeof says, "a frozen parameter whose gradient was zeroed but kept (zeroing is not freezing: AdamW's weight "
             "decay still moves it), or a gradient that never reached params/%s", t + 2);
  else
    snprintf(says, sizeof says, "the gradient never reached this input (a detached graph or a discarded term)");
  record(d, "zero", says, NAN, d->level, 1);
  d->k->hyp[d->k->nhyp - 1].consistent = 1;
}

static void hyp_slice(dg *d) {
  const qc_tensor *r = d->r;
  double best = INFINITY;
  int bd = -1;
  int64_t bcount = 0, bfirst = 0;
  for (int dim = 0; dim < r->ndim; dim++) {
    int64_t S = r->shape[dim], inner = 1, outer = 1, count = 0, first = -1;
    if (S < 2) continue;
    for (int e = dim + 1; e < r->ndim; e++) inner *= r->shape[e];
    outer = d->n / (S * inner);
    memcpy(d->p, d->rd, (size_t)d->n * sizeof *d->p);
    for (int64_t s = 0; s < S; s++) {
      int gz = 1, rz = 1;
      for (int64_t o = 0; o < outer && gz; o++)
        for (int64_t i = 0; i < inner; i++) {
          int64_t at = (o * S + s) * inner + i;
          if (d->g[at] != 0) { gz = 0; break; }
          if (d->rd[at] != 0) rz = 0;
        }
      if (!gz || rz) continue;
      count++;
      if (first < 0) first = s;
      for (int64_t o = 0; o < outer; o++) memset(d->p + (o * S + s) * inner, 0, (size_t)inner * sizeof *d->p);
    }
    if (!count || count == S) continue;
    double e = rel(d->g, d->p, d->n);
    if (e < best) { best = e; bd = dim; bcount = count; bfirst = first; }
  }
  if (bd < 0) return;
  /* rebuild the best prediction */
  int64_t S = r->shape[bd], inner = 1;
  for (int e = bd + 1; e < r->ndim; e++) inner *= r->shape[e];
  int64_t outer = d->n / (S * inner);
  memcpy(d->p, d->rd, (size_t)d->n * sizeof *d->p);
  for (int64_t s = 0; s < S; s++) {
    int gz = 1;
    for (int64_t o = 0; o < outer && gz; o++)
      for (int64_t i = 0; i < inner && gz; i++) gz = d->g[(o * S + s) * inner + i] == 0;
    if (gz)
      for (int64_t o = 0; o < outer; o++) memset(d->p + (o * S + s) * inner, 0, (size_t)inner * sizeof *d->p);
  }
  char says[256];
  snprintf(says, sizeof says, "a missing term: %lld slice(s) of dimension %d zero (from index %lld: one expert's, head's or "
           "shard's contribution lost)", (long long)bcount, bd, (long long)bfirst);
  judge_pred(d, "slice", says, d->level);
}

/* ---- predictions from another VJP run ----------------------------------- */

/* Run fn on module mm with dY dyv, keeping only d->k->tensor, into d->p.
 * QC_NA when it gives no such tensor of the reference's size. */
static int run_for(dg *d, qc_vjp_fn fn, const qc_module *mm, const qc_tensor *dyv) {
  char skip[1024] = "/";
  for (int i = 0; i < d->ref_names->n; i++)
    if (strcmp(d->ref_names->t[i].name, d->k->tensor) != 0 && strlen(skip) + QC_NAMELEN + 2 < sizeof skip) {
      strcat(skip, d->ref_names->t[i].name);
      strcat(skip, "/");
    }
  qc_ctx c = *d->ctx;
  c.skip = skip[1] ? skip : NULL;
  qc_tset out = {0};
  int rc = fn(&c, mm, dyv, &out);
  const qc_tensor *t = rc ? NULL : qc_tset_get(&out, d->k->tensor);
  if (!rc) rc = t && qc_numel(t) == d->n && qc_dtype_is_float(t->dtype) ? qc_tensor_to_f64(t, d->p) : QC_NA;
  qc_tset_free(&out);
  return rc;
}

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
  if (!row || qc_tensor_to_f64(d->dy, y)) goto done;
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
    int r2 = run_for(d, row->reference, d->m, &rd);
    qc_tensor_free(&rd);
    if (r2) { qc_err_clear(); continue; }
    char says[256];
    snprintf(says, sizeof says, "dY rounded to %s%s before the backward: the candidate saw another dY than the reference (a "
             "false difference if production really receives it: compare with the same dY)", v[j].name,
             v[j].fmax > 0 ? " (per-tensor scale)" : "");
    judge_pred(d, "dy_precision", says, d->level);
  }
done:
  free(y);
  return rc;
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
    if (h->alter) {
      qc_module alt = *d->m;
      rc = h->alter(d->m, &alt, detail, sizeof detail);
      if (!rc) rc = run_for(d, h->via_production ? d->m->cls->production : row->reference, &alt, d->dy);
      qc_module_variant_free(&alt, d->m);
      if (h->via_production) lv *= 2; /* two computations that each carry the noise */
    } else if (h->predict) {
      qc_tensor pt = {0};
      rc = h->predict(d->ctx, d->m, d->dy, d->k->tensor, d->cand, &pt, detail, sizeof detail);
      if (!rc) rc = qc_numel(&pt) == d->n ? qc_tensor_to_f64(&pt, d->p) : QC_NA;
      qc_tensor_free(&pt);
      lv *= 2; /* a production-style prediction may carry the noise too */
    }
    if (rc) { qc_err_clear(); continue; }
    snprintf(says, sizeof says, "%s%s%s", h->says, detail[0] ? "; " : "", detail);
    judge_pred(d, h->name, says, lv);
    if (h->fitted) d->fitted[d->k->nhyp - 1] = 1;
  }
}

/* ---- a non-finite value, traced ----------------------------------------- */

static void trace_nonfinite(dg *d) {
  int64_t first = -1, count = 0, rows = 0, last_row = -1;
  for (int64_t i = 0; i < d->n; i++)
    if (!isfinite(d->g[i])) {
      if (first < 0) first = i;
      count++;
      if (i / d->C != last_row) { rows++; last_row = i / d->C; }
    }
  if (first < 0) return;
  int64_t row = first / d->C, col = first % d->C;
  char in[200] = "";
  size_t o = 0;
  const qc_tset *sets[2] = {&d->m->inputs, &d->m->params};
  for (int s = 0; s < 2 && o < sizeof in - 40; s++)
    for (int i = 0; i < sets[s]->n; i++) {
      const qc_tensor *t = &sets[s]->t[i];
      if (!qc_dtype_is_float(t->dtype) || t->ndim < 1 || qc_numel(t) / t->shape[t->ndim - 1] != d->R) continue;
      double *v = malloc((size_t)qc_numel(t) * sizeof *v), mx = 0;
      if (!v || qc_tensor_to_f64(t, v)) { free(v); qc_err_clear(); continue; }
      int64_t c = t->shape[t->ndim - 1];
      for (int64_t j = 0; j < c; j++) mx = fmax(mx, fabs(v[row * c + j]));
      free(v);
      o += (size_t)snprintf(in + o, sizeof in - o, "%s%s/%s row %lld max |v| %.3g", o ? ", " : "", s ? "params" : "inputs",
                            t->name, (long long)row, mx);
      if (o >= sizeof in) break;
    }
  char says[256];
  double rv = d->rd[first];
  snprintf(says, sizeof says, "first non-finite value at [%lld, %lld] (row, column; the reference is %.3g there), %lld in %lld "
           "row(s); %s%s: the backward produced it, not its inputs", (long long)row, (long long)col, rv, (long long)count,
           (long long)rows, in[0] ? in : "the inputs are finite", in[0] ? " (finite)" : "");
  record(d, "nonfinite", says, NAN, d->level, 1);
  d->k->hyp[d->k->nhyp - 1].consistent = 1;
}

/* ---- the summary -------------------------------------------------------- */

static void summarize(dg *d) {
  qc_check *k = d->k;
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
    if (qc_numel(g) == qc_numel(r) && g->ndim == 2 && r->ndim == 2 && g->shape[0] == r->shape[1] && g->shape[1] == r->shape[0])
      snprintf(k->diagnosis, sizeof k->diagnosis, "the candidate's shape is the reference's transposed: a transposed gradient");
    else
      snprintf(k->diagnosis, sizeof k->diagnosis, "no known signature");
    return QC_OK;
  }
  dg d = {.ctx = ctx, .m = m, .dy = dy, .r = r, .cand = g, .ref_names = ref_names, .k = k};
  d.n = qc_numel(r);
  d.C = r->ndim ? r->shape[r->ndim - 1] : 1;
  d.R = d.n / (d.C ? d.C : 1);
  d.g = malloc((size_t)d.n * sizeof *d.g);
  d.p = malloc((size_t)d.n * sizeof *d.p);
  d.rd = (double *)r->data;
  int rc = QC_OK;
  if (!d.g || !d.p) { rc = qc_err_sys("out of memory diagnosing %s", k->tensor); goto done; }
  if ((rc = qc_tensor_to_f64(g, d.g))) goto done;
  qc_dtype jd = QC_F32;
  if (qc_dtype_from_name(k->judged_dtype, &jd)) jd = g->dtype;
  double u = jd == QC_BF16 ? 0x1p-8 : jd == QC_F16 ? 0x1p-11 : jd == QC_F32 ? 0x1p-24 : 0x1p-53;
  d.floor = fmax(isnan(k->m.noise_floor) ? 0 : k->m.noise_floor, 0.1 * u / sqrt(3.0));
  d.level = k->level > 0 ? k->level : (k->tol.has_rel_l2 ? k->tol.rel_l2 : 3 * d.floor);
  d.e0 = k->m.rel_l2;
  if (k->m.nonfinite) {
    if (has_word(gen, "nonfinite")) trace_nonfinite(&d);
  } else {
    if (has_word(gen, "zero")) hyp_zero(&d, frozen);
    if (has_word(gen, "factor") || has_word(gen, "sign")) hyp_factor(&d, has_word(gen, "factor"), has_word(gen, "sign"));
    if (has_word(gen, "transpose")) hyp_transpose(&d);
    if (has_word(gen, "rows") && (rc = hyp_rows(&d))) goto done;
    if (has_word(gen, "slice")) hyp_slice(&d);
    hyp_class(&d);
    if (has_word(gen, "dy_precision") && (rc = hyp_dy_precision(&d))) goto done;
  }
  summarize(&d);
done:
  free(d.g);
  free(d.p);
  return rc;
}
