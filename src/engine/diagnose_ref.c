/* diagnose_ref.c: the diagnosis's predictions from the reference alone (a
 * factor, a sign flip, a transpose, moved rows, a zero tensor or slice) and
 * the trace of a non-finite value; see diagnose_priv.h. No class is named. */
#include "engine/diagnose_priv.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/qc.h"
#include "numerics/decode.h"
#include "numerics/metrics.h"

/* Record hypothesis `name` tested with prediction error e (NAN: none) at
 * level lv; consistent when the prediction is closer than the reference
 * and within the level, and (distinct) tells it apart from the reference. */
static void qc_dg_record(dg *d, const char *name, const char *says, double e, double lv, int distinct) {
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
void qc_dg_judge(dg *d, const char *name, const char *says, double lv) {
  double e = qc_rel_l2(d->g, d->p, d->n), dist = qc_rel_l2(d->p, d->rd, d->n);
  qc_dg_record(d, name, says, e, lv, dist > lv);
}

/* Another VJP run (diagnose_priv.h): the predictions of diagnose.c and diagnose_block.c. */
int qc_dg_run_for(dg *d, qc_vjp_fn fn, const qc_module *mm, const qc_tensor *dyv) {
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
  /* ranks, all-reduces and the optimizer's DP scaling explain a factor only
   * in a dump of several processes (root attribute world_size > 1) */
  int dist = d->ctx->world_size > 1 || (d->ctx->group && d->ctx->group->size > 1);
  int expert = strstr(d->m->path, "expert") != NULL; /* expert weights: scaled in the optimizer step */
  const char *timing = expert ? "or an expert gradient dumped before the optimizer step applies its expert-DP / DP scaling"
                              : "or a gradient dumped before the optimizer step applies its data-parallel scaling";
  for (int j = 2; j <= 1024; j++) {
    if (fabs(kf / j - 1) <= tol) {
      if (!dist) snprintf(says, n, "a constant factor k = %.5f (= %d%s)", kf, j, j == 2 ? ": a doubled value, a term added twice"
                          : ": a scale applied twice, or a sum where a mean is meant");
      else if (j == 2) snprintf(says, n, "a constant factor k = %.5f (= 2: a doubled gradient, an all-reduce summed twice or a "
                                "term added twice, %s)", kf, timing);
      else snprintf(says, n, "a constant factor k = %.5f (= %d: a parallelism ratio, summed over %d ranks where it should be "
                    "averaged, %s)", kf, j, j, timing);
      return;
    }
    if (fabs(kf * j - 1) <= tol) {
      if (!dist) snprintf(says, n, "a constant factor k = %.5f (= 1/%d%s)", kf, j, j == 2 ? ": half the value, one of two terms "
                          "lost" : ": a mean where a sum is meant, or a scale divided out twice");
      else if (j == 2) snprintf(says, n, "a constant factor k = %.5f (= 1/2: half the gradient, averaged over 2 ranks where it "
                                "should be summed, a missing all-reduce or one of two terms lost, %s)", kf, timing);
      else snprintf(says, n, "a constant factor k = %.5f (= 1/%d: a parallelism ratio, averaged over %d ranks where it should "
                    "be summed or a missing all-reduce, %s)", kf, j, j, timing);
      return;
    }
  }
  snprintf(says, n, "a constant factor k = %.6g (a scale applied or lost inside the %s)", kf,
           strcmp(d->k->tensor, "y") == 0 && strcmp(d->k->dy, "forward") == 0 ? "forward" : "backward");
}

void qc_dg_factor(dg *d, int want_factor, int want_sign) {
  double sgr = 0, srr = 0, sgg = 0;
  for (int64_t i = 0; i < d->n; i++) {
    sgr += d->g[i] * d->rd[i];
    srr += d->rd[i] * d->rd[i];
    sgg += d->g[i] * d->g[i];
  }
  if (!(srr > 0) || !(sgg > 0)) return; /* a zero candidate is the `zero` hypothesis's */
  double kf = sgr / srr, sd = d->k->m.bias_sd;
  for (int64_t i = 0; i < d->n; i++) d->p[i] = kf * d->rd[i];
  double e = qc_rel_l2(d->g, d->p, d->n);
  /* near 1 the factor is told from the reference by the bias test's
   * standard error: three of them, not the test's five, since the check
   * has failed already and the factor must explain the data to the level
   * (a 0.2% factor on 80 elements sits at 3.7 standard errors) */
  int distinct = fabs(kf - 1) > d->level || (sd > 0 && isfinite(sd) && fabs(kf - 1) > 3 * sd + d->k->m.bias_allow);
  double tol = fmax(d->level, isfinite(sd) ? 5 * sd : 0);
  char says[256];
  if (kf < 0 && fabs(kf + 1) <= tol) {
    if (want_sign) qc_dg_record(d, "sign", "a sign flip (the gradient negated)", e, d->level, 1);
    return;
  }
  if (!want_factor) return;
  named_factor(d, kf, tol, says, sizeof says);
  /* the factor explains the data when the residual is at the level, even if
   * the reference's own error is only a little larger (a small factor) */
  qc_dg_record(d, "factor", says, e, d->level, distinct);
  if (distinct && e <= d->level && !(e < d->e0)) d->k->hyp[d->k->nhyp - 1].consistent = 1;
}

/* ---- a transposed gradient, moved rows ---------------------------------- */

void qc_dg_transpose(dg *d) {
  const qc_tensor *r = d->r;
  if (r->ndim < 2 || r->shape[r->ndim - 1] != r->shape[r->ndim - 2] || r->shape[r->ndim - 1] < 2) return;
  int64_t a = r->shape[r->ndim - 1], blocks = d->n / (a * a);
  for (int64_t b = 0; b < blocks; b++)
    for (int64_t i = 0; i < a; i++)
      for (int64_t j = 0; j < a; j++) d->p[b * a * a + i * a + j] = d->rd[b * a * a + j * a + i];
  qc_dg_judge(d, "transpose", "the gradient transposed (rows and columns swapped)", d->level);
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

int qc_dg_rows(dg *d) {
  if (d->R < 2 || d->r->ndim < 2) return QC_OK;
  double best = INFINITY;
  int64_t bs = 0;
  int bw = 0;
  for (int64_t s = -4; s <= 4; s++)
    for (int wrap = 0; wrap < 2 && s != 0 && llabs(s) < d->R; wrap++) {
      shifted(d, s, wrap);
      double e = qc_rel_l2(d->g, d->p, d->n);
      if (e < best) { best = e; bs = s; bw = wrap; }
    }
  char says[256];
  if (bs) {
    shifted(d, bs, bw);
    snprintf(says, sizeof says, "rows (tokens) shifted by %+lld%s: row i holds the reference's row i %s %lld", (long long)bs,
             bw ? " (rolled)" : "", bs > 0 ? "-" : "+", (long long)llabs(bs));
    qc_dg_judge(d, "rows", says, d->level);
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
    if (bj != i && qc_rel_l2(gi, d->rd + i * d->C, d->C) > d->level) {
      if (!moved++) { ex = i; ey = bj; }
    }
  }
  free(nr);
  free(used);
  if (!moved) {
    if (bs) { /* the best shift, recorded as tested */
      shifted(d, bs, bw);
      qc_dg_judge(d, "rows", "rows (tokens) shifted or permuted", d->level);
    }
    return QC_OK;
  }
  snprintf(says, sizeof says, "rows (tokens) permuted: %lld of %lld rows hold another position's gradient (row %lld holds "
           "the reference's row %lld)", (long long)moved, (long long)d->R, (long long)ex, (long long)ey);
  qc_dg_judge(d, "rows", says, d->level);
  return QC_OK;
}

/* ---- zero tensor, zero slices ------------------------------------------- */

void qc_dg_zero(dg *d, const char *frozen) {
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
  qc_dg_record(d, "zero", says, NAN, d->level, 1);
  d->k->hyp[d->k->nhyp - 1].consistent = 1;
}

void qc_dg_slice(dg *d) {
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
    double e = qc_rel_l2(d->g, d->p, d->n);
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
  qc_dg_judge(d, "slice", says, d->level);
}

/* ---- the error confined to one slice of the leading dimension ------------ */

/* The candidate's error against the reference, sliced along dimension 0
 * (an expert of a stacked [E, ...] gradient, a head, a layer): when one
 * slice holds nearly all of it (90 % of the squared error), the prediction
 * "the reference, with that slice as the candidate has it" is judged, so
 * the report names where the defect sits ("expert 2") even when no
 * specific hypothesis explains it. Fitted to the candidate: reported after
 * every specific hypothesis that holds. The slices are named by the class
 * (qc_class.zero_slices' word: "expert") or as "index". */
void qc_dg_one_slice(dg *d) {
  const qc_tensor *r = d->r;
  if (r->ndim < 2 || r->shape[0] < 2 || d->n % r->shape[0]) return;
  const int64_t S = r->shape[0], in = d->n / S;
  double tot = 0, best = -1, bref = 0, bg = 0;
  int64_t bs = -1;
  for (int64_t s = 0; s < S; s++) {
    double e = 0, rr = 0;
    const double *g = d->g + s * in, *rd = d->rd + s * in;
    for (int64_t i = 0; i < in; i++) {
      const double df = g[i] - rd[i];
      e += df * df;
      rr += rd[i] * rd[i];
    }
    tot += e;
    if (e > best) { best = e; bs = s; bref = rr; bg = e; }
  }
  if (bs < 0 || !(tot > 0) || best < 0.9 * tot) return;
  memcpy(d->p, d->rd, (size_t)d->n * sizeof *d->p);
  memcpy(d->p + bs * in, d->g + bs * in, (size_t)in * sizeof *d->p);
  const char *what = "index";
  unsigned char *z = d->m->cls->zero_slices ? malloc((size_t)S) : NULL;
  if (z) {
    const char *w = NULL;
    qc_err_state es; /* a speculative call: its message does not stay */
    qc_err_save(&es);
    if (d->m->cls->zero_slices(d->m, d->k->tensor, S, z, &w) == QC_OK && w) what = w;
    qc_err_restore(&es);
    free(z);
  }
  char says[256];
  snprintf(says, sizeof says, "the error sits in %s %lld of %lld alone (%.1f%% of it; rel_l2 %.3g there): that %s's gradient, "
           "the others agree with the reference", what, (long long)bs, (long long)S, 100.0 * best / tot,
           bref > 0 ? sqrt(bg / bref) : INFINITY, what);
  const int nh = d->k->nhyp;
  qc_dg_judge(d, "one_slice", says, d->level);
  if (d->k->nhyp > nh) d->fitted[d->k->nhyp - 1] = 1;
}

/* ---- a non-finite value, traced ----------------------------------------- */

void qc_dg_nonfinite(dg *d) {
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
      qc_err_state es; /* a tensor that cannot be read is left out of the trace */
      qc_err_save(&es);
      const int bad = !v || qc_tensor_to_f64(t, v) != QC_OK;
      qc_err_restore(&es);
      if (bad) { free(v); continue; }
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
  qc_dg_record(d, "nonfinite", says, NAN, d->level, 1);
  d->k->hyp[d->k->nhyp - 1].consistent = 1;
}
