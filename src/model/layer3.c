/* layer3.c: the log table builder, config values, result lists and names
 * of layer 3 (see layer3.h). */
#include "model/layer3.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/qc.h"

const char *const qc_l3_controlled[QC_L3_NCONTROLLED] = {
    "init_weights", "optimizer_state", "data", "data_order", "labels_mask", "packing", "loss_normalization", "global_batch",
    "grad_accumulation", "lr", "lr_schedule", "clipping", "precision", "loss_scaling", "seed", "recompute"};

/* ---- the log builder ------------------------------------------------------------ */

/* Grow every row array to hold at least `want` rows. */
static int grow_rows(qc_l3_log *l, int64_t want) {
  if (want <= l->cap) return QC_OK;
  int64_t cap = l->cap ? l->cap : 256;
  while (cap < want) cap *= 2;
  int64_t *st = realloc(l->step, (size_t)cap * sizeof *st);
  if (!st) return qc_err_sys("out of memory reading log '%s'", l->path);
  l->step = st;
  for (int c = 0; c < l->ncol; c++) {
    double *v = realloc(l->col[c].v, (size_t)cap * sizeof *v);
    if (v) l->col[c].v = v;
    uint8_t *h = v ? realloc(l->col[c].has, (size_t)cap) : NULL;
    if (!h) return qc_err_sys("out of memory reading log '%s'", l->path);
    l->col[c].has = h;
    memset(h + l->cap, 0, (size_t)(cap - l->cap));
  }
  l->cap = cap;
  return QC_OK;
}

/* Remember that `step` was re-logged (a list sorted and made distinct by
 * finish). QC_OK or QC_ESYS. */
static int note_dup_step(qc_l3_log *l, int64_t step) {
  if (l->ndup_steps && l->dup_steps[l->ndup_steps - 1] == step) return QC_OK;
  if (l->ndup_steps == l->capdup) {
    int64_t cap = l->capdup ? 2 * l->capdup : 16;
    int64_t *nv = realloc(l->dup_steps, (size_t)cap * sizeof *nv);
    if (!nv) return qc_err_sys("out of memory reading log '%s'", l->path);
    l->dup_steps = nv;
    l->capdup = cap;
  }
  l->dup_steps[l->ndup_steps++] = step;
  return QC_OK;
}

/* A record that overwrote a value is counted once, at its end (the next
 * row or finish). QC_OK or QC_ESYS. */
static int close_record(qc_l3_log *l) {
  if (!l->rec_dup) return QC_OK;
  if (l->dup_records == 0 || l->step[l->n - 1] < l->first_dup_step) l->first_dup_step = l->step[l->n - 1];
  l->dup_records++;
  l->rec_dup = 0;
  return note_dup_step(l, l->step[l->n - 1]);
}

static int cmp_i64(const void *a, const void *b) {
  int64_t x = *(const int64_t *)a, y = *(const int64_t *)b;
  return (x > y) - (x < y);
}

/* Sort the re-logged steps and drop repeats. */
static void sort_dup_steps(qc_l3_log *l) {
  if (l->ndup_steps < 2) return;
  qsort(l->dup_steps, (size_t)l->ndup_steps, sizeof *l->dup_steps, cmp_i64);
  int64_t m = 1;
  for (int64_t i = 1; i < l->ndup_steps; i++)
    if (l->dup_steps[i] != l->dup_steps[m - 1]) l->dup_steps[m++] = l->dup_steps[i];
  l->ndup_steps = m;
}

int qc_l3_log_is_dup(const qc_l3_log *l, int64_t step) {
  int64_t lo = 0, hi = l->ndup_steps;
  while (lo < hi) {
    int64_t mid = lo + (hi - lo) / 2;
    if (l->dup_steps[mid] < step) lo = mid + 1;
    else hi = mid;
  }
  return lo < l->ndup_steps && l->dup_steps[lo] == step;
}

int qc_l3_log_row(qc_l3_log *l, int64_t step) {
  if (l->n > 0 && close_record(l)) return QC_ESYS;
  if (l->n > 0 && l->step[l->n - 1] == step) return QC_OK; /* the same step: add to its row */
  if (l->n > 0 && step < l->step[l->n - 1]) l->unsorted = 1;
  int rc = grow_rows(l, l->n + 1);
  if (rc) return rc;
  for (int c = 0; c < l->ncol; c++) l->col[c].has[l->n] = 0;
  l->step[l->n++] = step;
  return QC_OK;
}

static int find_col(const qc_l3_log *l, const char *name, size_t len) {
  for (int c = 0; c < l->ncol; c++)
    if (strncmp(l->col[c].name, name, len) == 0 && l->col[c].name[len] == 0) return c;
  return -1;
}

static int add_col(qc_l3_log *l, const char *name, size_t len) {
  if (len >= QC_L3_NAME) return qc_err("log '%s': metric name '%.40s...' is longer than %d characters", l->path, name, QC_L3_NAME - 1);
  if (l->ncol == l->capcol) {
    int cap = l->capcol ? 2 * l->capcol : 16;
    qc_l3_col *nc = realloc(l->col, (size_t)cap * sizeof *nc);
    if (!nc) return qc_err_sys("out of memory reading log '%s'", l->path);
    l->col = nc;
    l->capcol = cap;
  }
  qc_l3_col *c = &l->col[l->ncol];
  memset(c, 0, sizeof *c);
  memcpy(c->name, name, len);
  c->name[len] = 0;
  int64_t cap = l->cap ? l->cap : 1;
  c->v = malloc((size_t)cap * sizeof *c->v);
  c->has = calloc((size_t)cap, 1);
  if (!c->v || !c->has) {
    free(c->v);
    free(c->has);
    return qc_err_sys("out of memory reading log '%s'", l->path);
  }
  return l->ncol++;
}

/* The same value (bit for bit, any NaN equal to any NaN): a repeat, not a duplicate. */
static int same(double a, double b) { return (a == b && signbit(a) == signbit(b)) || (isnan(a) && isnan(b)); }

int qc_l3_log_set(qc_l3_log *l, const char *name, size_t len, double v) {
  if (l->n == 0) return qc_err("log '%s': a value before any step", l->path);
  int c = l->hint;
  /* keys come in the same order record after record: try the next column first */
  if (!(c < l->ncol && strncmp(l->col[c].name, name, len) == 0 && l->col[c].name[len] == 0)) {
    c = find_col(l, name, len);
    if (c < 0 && (c = add_col(l, name, len)) < 0) return QC_EINPUT;
  }
  l->hint = c + 1;
  int64_t r = l->n - 1;
  if (l->col[c].has[r] && !same(l->col[c].v[r], v)) {
    l->dup_values++;
    l->rec_dup = 1;
  }
  l->col[c].v[r] = v;
  l->col[c].has[r] = 1;
  if (l->set_roundoff > l->col[c].roundoff) l->col[c].roundoff = l->set_roundoff;
  return QC_OK;
}

static int cmp_idx_step(const void *pa, const void *pb, void *ctx) {
  const int64_t *st = ctx, a = *(const int64_t *)pa, b = *(const int64_t *)pb;
  if (st[a] != st[b]) return st[a] < st[b] ? -1 : 1;
  return a < b ? -1 : a > b; /* stable: file order among equal steps */
}

int qc_l3_log_finish(qc_l3_log *l) {
  if (l->n > 0 && close_record(l)) return QC_ESYS;
  l->hint = 0;
  if (!l->unsorted) {
    sort_dup_steps(l);
    return QC_OK;
  }
  int64_t n = l->n, *idx = malloc((size_t)n * sizeof *idx), *nst = malloc((size_t)n * sizeof *nst);
  double *nv = malloc((size_t)n * sizeof *nv);
  uint8_t *nh = malloc((size_t)n), *seen = calloc((size_t)l->ncol + 1, 1);
  int rc = QC_OK;
  if (!idx || !nst || !nv || !nh || !seen) { rc = qc_err_sys("out of memory sorting log '%s'", l->path); goto done; }
  for (int64_t i = 0; i < n; i++) idx[i] = i;
  qsort_r(idx, (size_t)n, sizeof *idx, cmp_idx_step, l->step);
  /* the rows of one step merge; a row (record) that sets a value an
   * earlier one of its step set is a duplicate */
  int64_t m = 0;
  for (int64_t g0 = 0, g1; g0 < n; g0 = g1) {
    int64_t s = l->step[idx[g0]];
    for (g1 = g0; g1 < n && l->step[idx[g1]] == s; g1++) {
      int dup = 0;
      for (int c = 0; c < l->ncol; c++) {
        if (!l->col[c].has[idx[g1]]) continue;
        double v = l->col[c].v[idx[g1]];
        for (int64_t k = g0; seen[c] && k < g1; k++)
          if (l->col[c].has[idx[k]] && !same(l->col[c].v[idx[k]], v)) { dup = 1; l->dup_values++; break; }
        seen[c] = 1;
      }
      if (dup) {
        if (l->dup_records == 0 || s < l->first_dup_step) l->first_dup_step = s;
        l->dup_records++;
        if ((rc = note_dup_step(l, s))) goto done;
      }
    }
    memset(seen, 0, (size_t)l->ncol);
    nst[m++] = s;
  }
  for (int c = 0; c < l->ncol; c++) {
    int64_t r = -1;
    for (int64_t i = 0; i < n; i++) {
      int64_t src = idx[i];
      if (r < 0 || nst[r] != l->step[src]) { r++; nh[r] = 0; }
      if (l->col[c].has[src]) { nv[r] = l->col[c].v[src]; nh[r] = 1; }
    }
    memcpy(l->col[c].v, nv, (size_t)m * sizeof *nv);
    memcpy(l->col[c].has, nh, (size_t)m);
  }
  memcpy(l->step, nst, (size_t)m * sizeof *nst);
  l->n = m;
  l->unsorted = 0;
  sort_dup_steps(l);
done:
  free(idx);
  free(nst);
  free(nv);
  free(nh);
  free(seen);
  return rc;
}

int qc_l3_log_col(const qc_l3_log *l, const char *name) { return find_col(l, name, strlen(name)); }

int qc_l3_log_rename(qc_l3_log *l, const char *from, const char *to, int *found) {
  *found = 0;
  int c = qc_l3_log_col(l, from);
  if (c < 0) return QC_OK;
  *found = 1;
  if (strcmp(from, to) == 0) return QC_OK;
  if (qc_l3_log_col(l, to) >= 0)
    return qc_err("log '%s': tag '%s' maps to metric '%s', which the log also holds under that name", l->path, from, to);
  if (strlen(to) >= QC_L3_NAME) return qc_err("metric name '%.40s...' is too long", to);
  snprintf(l->col[c].name, sizeof l->col[c].name, "%s", to);
  return QC_OK;
}

void qc_l3_log_free(qc_l3_log *l) {
  for (int c = 0; c < l->ncol; c++) {
    free(l->col[c].v);
    free(l->col[c].has);
  }
  free(l->col);
  free(l->step);
  free(l->dup_steps);
  memset(l, 0, sizeof *l);
}

/* ---- configs ---------------------------------------------------------------------- */

void qc_l3_config_free(qc_l3_config *c) {
  for (int i = 0; i < c->n; i++) free(c->v[i].json);
  free(c->v);
  memset(c, 0, sizeof *c);
}

const qc_l3_cfgval *qc_l3_config_get(const qc_l3_config *c, const char *key) {
  for (int i = 0; i < c->n; i++)
    if (strcmp(c->v[i].key, key) == 0) return &c->v[i];
  return NULL;
}

/* ---- names ---------------------------------------------------------------------------- */

const char *qc_l3_verdict_name(int v) { return v == QC_L3_PASS ? "pass" : v == QC_L3_FAIL ? "fail" : "inconclusive"; }
const char *qc_l3_pair_verdict_name(int v) { return v == QC_L3_PASS ? "pass" : v == QC_L3_FAIL ? "deviates" : "inconclusive"; }

const char *qc_l3_loc_name(qc_l3_loc l) {
  switch (l) {
    case QC_LOC_FORWARD: return "forward";
    case QC_LOC_BACKWARD: return "backward";
    case QC_LOC_LATE: return "late";
    default: return NULL;
  }
}

const char *qc_l3_loc_advice(qc_l3_loc l) {
  switch (l) {
    case QC_LOC_FORWARD: return "the loss differs at the initial weights: check the forward, the data and the mask";
    case QC_LOC_BACKWARD:
      return "the initial loss agrees but the first update differs: check the backward, reduction, scale, clipping and optimizer";
    case QC_LOC_LATE:
      return "agreement for several steps, then divergence: keep the first abnormal checkpoint; check recompute, quantization "
             "refresh, learning rate and RNG, then replay at the same weights";
    default: return "";
  }
}

void qc_sft_pair_res_free(qc_sft_pair_res *p) {
  for (int i = 0; i < p->ncheck; i++) {
    qc_sft_check_res *c = &p->checks[i];
    free(c->x); free(c->a); free(c->b); free(c->lo); free(c->hi); free(c->cum); free(c->st);
  }
  free(p->checks);
  memset(p, 0, sizeof *p);
}

/* ---- step ------------------------------------------------------------------------------- */

void qc_step_arm_free(qc_step_arm *a) {
  for (int i = 0; i < a->nparam; i++) {
    qc_step_param *p = &a->params[i];
    free(p->before); free(p->grad); free(p->exp_avg); free(p->exp_avg_sq); free(p->momentum); free(p->after); free(p->after_master);
  }
  free(a->params);
  free(a->frozen);
  free(a->stray);
  memset(a, 0, sizeof *a);
}

int qc_step_arm_frozen(const qc_step_arm *a, const char *name) {
  for (int i = 0; i < a->nfrozen; i++)
    if (strcmp(a->frozen[i], name) == 0) return 1;
  return 0;
}

const char *qc_step_kind_name(qc_step_kind k) {
  static const char *const n[] = {"update", "grad_pair", "update_pair", "frozen", "missing", "master"};
  return (unsigned)k < sizeof n / sizeof n[0] ? n[k] : "?";
}

int qc_step_res_add(qc_step_res *r, const qc_step_check *c) {
  if (r->n == r->cap) {
    int cap = r->cap ? 2 * r->cap : 64;
    qc_step_check *nv = realloc(r->v, (size_t)cap * sizeof *nv);
    if (!nv) return qc_err_sys("out of memory recording step checks");
    r->v = nv;
    r->cap = cap;
  }
  r->v[r->n++] = *c;
  return QC_OK;
}

void qc_step_res_free(qc_step_res *r) {
  free(r->v);
  memset(r, 0, sizeof *r);
}

int qc_step_res_verdict(const qc_step_res *r) {
  int judged = 0;
  for (int i = 0; i < r->n; i++) {
    if (!r->v[i].judged) continue;
    judged++;
    if (r->v[i].verdict != QC_V_PASS) return 1;
  }
  return judged ? 0 : 2;
}
