/* sft.c: layer 3's run (see sft.h): logs and configs loaded, the
 * config-diff table, each pair judged, its verdict, first deviation and
 * localization. The rules (docs/layer3.md):
 *  - a pair is inconclusive when the case lacks one of the method's three
 *    arms (under_test, gradient_reference, native_baseline: the comparison
 *    needs all three in one controlled run), when a controlled variable
 *    differs between its arms and is not an expected difference, when an
 *    arm has no config or its config records a controlled variable not at
 *    all (null records one that does not apply: an unrecorded one cannot be
 *    shown to be controlled), when the x axes disagree (tokens differ at
 *    equal steps), or when a check is inconclusive; never a pass;
 *  - it deviates when any check fails (even if others are inconclusive);
 *    its first deviation is the smallest x at which a check fails (ties:
 *    the check listed first), its onset the earliest onset of a failed
 *    check (a change point of a - b up to its failure, sft_check.c);
 *  - with x0 the first step both logs hold: forward when a loss or val_nll
 *    check fails at x0; else backward when any check fails at x0 or at the
 *    next common step; else late. */
#include "engine/sft.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/qc.h"
#include "io/l3log.h"
#include "numerics/decode.h"

/* Read one log (its steps from step_key, "" for the known keys) and map
 * its tags to canonical metric names. */
static int load_log(const char *path, const char *step_key, const qc_l3_tag *tags, int ntags, qc_l3_log *l) {
  int rc = qc_log_read_as(path, step_key, l), found;
  for (int t = 0; !rc && t < ntags; t++) rc = qc_l3_log_rename(l, tags[t].tag, tags[t].metric, &found);
  return rc;
}

/* Add key to the list of config keys (once). */
static int add_key(qc_l3_keypath *keys, int *n, int max, const char *key, const char *path) {
  for (int i = 0; i < *n; i++)
    if (strcmp(keys[i].key, key) == 0) {
      if (path) snprintf(keys[i].path, sizeof keys[i].path, "%s", path);
      return QC_OK;
    }
  if (*n == max) return qc_err("more than %d config keys", max);
  snprintf(keys[*n].key, sizeof keys[*n].key, "%s", key);
  snprintf(keys[*n].path, sizeof keys[*n].path, "%s", path ? path : key);
  (*n)++;
  return QC_OK;
}

#define MAXKEYS (QC_L3_NCONTROLLED + QC_L3_MAXKEYS + QC_L3_MAXEXPECTED)

/* Every relative bound of the case against the resolution of the values it
 * compares: where a log stores a metric rounded (TensorBoard's float32),
 * |a - b| of two correct arms reaches the sum of the two roundings
 * (u_a |a| + u_b |b|), so a pointwise_rel or mean_rel bound below u_a + u_b
 * without an absolute part fails correct arms. QC_OK, or QC_EINPUT naming
 * the check, the arm and its stored type. */
static int check_resolution(const qc_sft_run *r, const qc_sft_case *cs) {
  for (int i = 0; i < cs->npair; i++) {
    const qc_sft_pair *p = &cs->pairs[i];
    for (int k = 0; k < p->ncheck; k++) {
      const qc_sft_check *c = &p->checks[k];
      const qc_sft_bounds *b = &c->b;
      double ro[2] = {0, 0};
      int arm[2] = {p->a, p->b};
      for (int s = 0; s < 2; s++) {
        int col = qc_l3_log_col(&r->logs[arm[s]], c->metric);
        if (col >= 0) ro[s] = r->logs[arm[s]].col[col].roundoff;
      }
      double res = ro[0] + ro[1];
      const char *name = b->has_pw_rel && !(b->has_pw_abs && b->pw_abs > 0) && b->pw_rel < res ? "pointwise_rel"
                         : b->has_mean_rel && !(b->has_mean_abs && b->mean_abs > 0) && b->mean_rel < res ? "mean_rel" : NULL;
      if (!name) continue;
      double bound = strcmp(name, "pointwise_rel") == 0 ? b->pw_rel : b->mean_rel;
      int s = ro[0] >= ro[1] ? 0 : 1;
      const qc_l3_log *l = &r->logs[arm[s]];
      const char *type = "a rounded type";
      for (qc_dtype t = QC_F32; t <= QC_BF16; t++) /* float32, float16, bfloat16: the types a log stores rounded */
        if (ro[s] == qc_dtype_unit(t)) type = qc_dtype_name(t);
      qc_err("case '%s': pair '%s~%s', metric '%s': %s %g is below the logs' resolution %.3g: arm '%s' stores '%s' as %s (%s log '%s')",
             cs->path, cs->arms[p->a].key, cs->arms[p->b].key, c->metric, name, bound, res, cs->arms[arm[s]].key, c->metric, type, l->format,
             l->path);
      qc_hint("two correct arms differ by the rounding of the stored values (up to %.3g relative here): give a bound of at least %.3g, "
              "or log the metric at full precision (JSONL, or a TensorBoard tensor of double)", res, 2 * res);
      return QC_EINPUT;
    }
  }
  return QC_OK;
}

int qc_sft_load(qc_sft_run *r, const qc_sft_case *cs) {
  memset(r, 0, sizeof *r);
  r->cs = cs;
  double t0 = qc_now_s();
  int rc;
  for (int a = 0; a < cs->narm; a++)
    if ((rc = load_log(cs->arms[a].log, cs->arms[a].step_key, cs->arms[a].tags, cs->arms[a].ntags, &r->logs[a]))) return rc;
  if ((rc = check_resolution(r, cs))) return rc; /* every bound against what the logs can resolve, before any is judged */
  /* the keys of the table: the controlled variables, then any key an arm
   * maps or the case expects to differ */
  qc_l3_keypath all[MAXKEYS];
  int nall = 0;
  for (int i = 0; i < QC_L3_NCONTROLLED; i++)
    if ((rc = add_key(all, &nall, MAXKEYS, qc_l3_controlled[i], NULL))) return rc;
  for (int a = 0; a < cs->narm; a++)
    for (int i = 0; i < cs->arms[a].nkeys; i++)
      if ((rc = add_key(all, &nall, MAXKEYS, cs->arms[a].keys[i].key, NULL))) return rc;
  for (int i = 0; i < cs->nexpected; i++)
    if ((rc = add_key(all, &nall, MAXKEYS, cs->expected[i].key, NULL))) return rc;
  for (int a = 0; a < cs->narm; a++) {
    if (!cs->arms[a].config[0]) continue;
    qc_l3_keypath keys[MAXKEYS];
    memcpy(keys, all, sizeof keys);
    for (int i = 0; i < cs->arms[a].nkeys; i++)
      if ((rc = add_key(keys, &nall, MAXKEYS, cs->arms[a].keys[i].key, cs->arms[a].keys[i].path))) return rc;
    if ((rc = qc_config_read(cs->arms[a].config, keys, nall, &r->cfg[a]))) return rc;
    r->has_cfg[a] = 1;
  }
  if (!(r->rows = qc_calloc((size_t)nall, sizeof *r->rows, "config rows"))) return QC_ESYS;
  r->nrow = nall;
  for (int k = 0; k < nall; k++) {
    qc_sft_cfgrow *row = &r->rows[k];
    snprintf(row->key, sizeof row->key, "%s", all[k].key);
    row->controlled = k < QC_L3_NCONTROLLED;
    row->expected = qc_sft_case_expected(cs, row->key, &row->reason);
    if (!row->expected) row->reason = NULL;
    for (int a = 0; a < cs->narm; a++) {
      const qc_l3_cfgval *v = r->has_cfg[a] ? qc_l3_config_get(&r->cfg[a], row->key) : NULL;
      row->val[a] = v && v->present ? v->json : NULL;
    }
    for (int a = 1; a < cs->narm; a++) {
      const char *x = row->val[0], *y = row->val[a];
      if ((x == NULL) != (y == NULL) || (x && strcmp(x, y) != 0)) row->differs = 1;
    }
  }
  r->t_read = qc_now_s() - t0;
  return QC_OK;
}

static void add_reason(char *buf, size_t n, const char *fmt, const char *a, const char *b, const char *c) {
  size_t k = strlen(buf);
  if (k + 4 >= n) return;
  if (k) k += (size_t)snprintf(buf + k, n - k, "; ");
  int w = snprintf(buf + k, n - k, fmt, a, b, c);
  if (w >= 0 && (size_t)w >= n - k) qc_sft_clip_words(buf, n); /* never cut mid-word */
}

/* The method's arms the case lacks, ", "-separated, into r->missing_arms. */
static void missing_arms(qc_sft_run *r) {
  static const char *const role[] = {"under_test", "gradient_reference", "native_baseline"};
  r->missing_arms[0] = 0;
  for (int k = 0; k < 3; k++) {
    int have = 0;
    for (int a = 0; a < r->cs->narm; a++) have |= strcmp(r->cs->arms[a].key, role[k]) == 0;
    if (have) continue;
    size_t u = strlen(r->missing_arms);
    snprintf(r->missing_arms + u, sizeof r->missing_arms - u, "%s%s", u ? ", " : "", role[k]);
  }
}

/* The controlled variables arm a's config does not record, ", "-separated into buf; their number. */
static int unrecorded(const qc_sft_run *r, int a, char *buf, size_t n) {
  int k = 0;
  buf[0] = 0;
  for (int i = 0; i < r->nrow; i++) {
    if (!r->rows[i].controlled || r->rows[i].val[a]) continue;
    size_t u = strlen(buf);
    snprintf(buf + u, n - u, "%s%s", u ? ", " : "", r->rows[i].key);
    k++;
  }
  return k;
}

/* The pair-level reasons for inconclusive: the arms, configs, and the x axes. */
static void pair_reasons(const qc_sft_run *r, const qc_sft_pair *p, qc_sft_pair_res *pr) {
  const qc_sft_case *cs = r->cs;
  const char *an = cs->arms[p->a].key, *bn = cs->arms[p->b].key;
  if (r->missing_arms[0])
    add_reason(pr->reasons, sizeof pr->reasons, "the case has no %s arm: the method compares three arms (under_test, "
               "gradient_reference, native_baseline) in one controlled run, and a pair without the %s cannot be %s", r->missing_arms,
               strchr(r->missing_arms, ',') ? "others" : "third", "told apart from the comparison's other causes");
  for (int s = 0; s < 2; s++) {
    int a = s ? p->b : p->a;
    char keys[600];
    int k;
    if (!r->has_cfg[a])
      add_reason(pr->reasons, sizeof pr->reasons, "arm '%s' has no config: its controlled variables cannot be compared%s%s",
                 cs->arms[a].key, "", "");
    else if ((k = unrecorded(r, a, keys, sizeof keys)) == QC_L3_NCONTROLLED)
      add_reason(pr->reasons, sizeof pr->reasons, "arm '%s' records none of the controlled variables in its config%s%s: none of "
                 "them can be shown to be controlled (map each with 'keys'; null where it does not apply)", cs->arms[a].key, "", "");
    else if (k)
      add_reason(pr->reasons, sizeof pr->reasons, "arm '%s' records no value of controlled variable(s) %s in its config%s: they "
                 "cannot be shown to be controlled (map each with 'keys'; null where it does not apply)", cs->arms[a].key, keys, "");
  }
  if (r->has_cfg[p->a] && r->has_cfg[p->b])
    for (int k = 0; k < r->nrow; k++) {
      const qc_sft_cfgrow *row = &r->rows[k];
      const char *x = row->val[p->a], *y = row->val[p->b];
      int differ = (x == NULL) != (y == NULL) || (x && strcmp(x, y) != 0);
      if (!differ || row->expected || (row->controlled && (!x || !y))) continue; /* unrecorded: said above */
      char what[600];
      snprintf(what, sizeof what, "%.200s (%s) vs %.200s (%s)", x ? x : "absent", an, y ? y : "absent", bn);
      add_reason(pr->reasons, sizeof pr->reasons, "controlled variable '%s' differs: %s, not in expected_differences%s", row->key,
                 what, "");
      size_t u = strlen(pr->undeclared);
      snprintf(pr->undeclared + u, sizeof pr->undeclared - u, "%s%s", u ? ", " : "", row->key);
    }
  /* tokens at equal steps, over the pair's span */
  const qc_l3_log *la = &r->logs[p->a], *lb = &r->logs[p->b];
  int ta = qc_l3_log_col(la, "tokens"), tb = qc_l3_log_col(lb, "tokens");
  if (ta < 0 || tb < 0) return;
  double s0 = cs->w0, s1 = cs->w1;
  for (int i = 0; i < p->ncheck; i++)
    if (p->checks[i].has_window) { s0 = fmin(s0, p->checks[i].w0); s1 = fmax(s1, p->checks[i].w1); }
  for (int64_t i = 0, j = 0; i < la->n && j < lb->n;) {
    if (la->step[i] < lb->step[j]) { i++; continue; }
    if (la->step[i] > lb->step[j]) { j++; continue; }
    if (la->col[ta].has[i] && lb->col[tb].has[j]) {
      double x = cs->x_tokens ? lb->col[tb].v[j] : (double)lb->step[j], u = la->col[ta].v[i], v = lb->col[tb].v[j];
      if (x >= s0 && x <= s1 && !(fabs(u - v) <= 1e-9 * fmax(1, fabs(v)))) {
        char what[300];
        snprintf(what, sizeof what, "at step %lld tokens are %.17g (%s) and %.17g (%s)", (long long)la->step[i], u, an, v, bn);
        add_reason(pr->reasons, sizeof pr->reasons, "the x axes disagree: %s%s%s", what, "", "");
        return;
      }
    }
    i++;
    j++;
  }
}

/* Read the noise logs of a check (tags: the entry's, else arm b's). */
static int load_noise(const qc_sft_case *cs, const qc_sft_pair *p, const qc_sft_check *k, qc_l3_log **out) {
  *out = NULL;
  if (!k->b.nnoise) return QC_OK;
  qc_l3_log *n = qc_calloc((size_t)k->b.nnoise, sizeof *n, "noise logs");
  if (!n) return QC_ESYS;
  for (int q = 0; q < k->b.nnoise; q++) {
    const qc_sft_noise *e = &k->b.noise[q];
    const char *sk = cs->arms[p->b].step_key;
    int rc = e->ntags ? load_log(e->log, sk, e->tags, e->ntags, &n[q]) : load_log(e->log, sk, cs->arms[p->b].tags, cs->arms[p->b].ntags, &n[q]);
    if (rc) {
      for (int j = 0; j < q; j++) qc_l3_log_free(&n[j]);
      free(n);
      return rc;
    }
  }
  *out = n;
  return QC_OK;
}

static int judge_pair(qc_sft_run *r, const qc_sft_pair *p, qc_sft_pair_res *pr) {
  const qc_sft_case *cs = r->cs;
  const qc_l3_log *la = &r->logs[p->a], *lb = &r->logs[p->b];
  int rc;
  pair_reasons(r, p, pr);
  if (!(pr->checks = qc_calloc((size_t)p->ncheck, sizeof *pr->checks, "check results"))) return QC_ESYS;
  pr->ncheck = p->ncheck;
  int any_fail = 0, any_incon = pr->reasons[0] != 0;
  for (int i = 0; i < p->ncheck; i++) {
    qc_l3_log *noise;
    if ((rc = load_noise(cs, p, &p->checks[i], &noise))) return rc;
    rc = qc_sft_judge_check(cs, &p->checks[i], la, lb, noise, r->keep_series, &pr->checks[i]);
    for (int q = 0; noise && q < p->checks[i].b.nnoise; q++) qc_l3_log_free(&noise[q]);
    free(noise);
    if (rc) return rc;
    const qc_sft_check_res *c = &pr->checks[i];
    if (c->verdict == QC_L3_FAIL) {
      any_fail = 1;
      if (!pr->has_first || c->fail_x < pr->first_x) {
        pr->has_first = 1;
        pr->first_x = c->fail_x;
        pr->first_step = c->fail_step;
        pr->first_check = i;
      }
      if (c->has_onset && (!pr->has_onset || c->onset_x < pr->onset_x)) {
        pr->has_onset = 1;
        pr->onset_x = c->onset_x;
        pr->onset_step = c->onset_step;
        pr->onset_check = i;
      }
    }
    if (c->verdict == QC_L3_INCONCLUSIVE) any_incon = 1;
  }
  /* x0: the first step both logs have; x1 the next */
  pr->x0 = pr->x1 = -1;
  for (int64_t i = 0, j = 0; i < la->n && j < lb->n;) {
    if (la->step[i] < lb->step[j]) { i++; continue; }
    if (la->step[i] > lb->step[j]) { j++; continue; }
    if (!pr->has_x0) { pr->has_x0 = 1; pr->x0 = la->step[i]; }
    else { pr->x1 = la->step[i]; break; }
    i++;
    j++;
  }
  pr->verdict = any_fail ? QC_L3_FAIL : any_incon ? QC_L3_INCONCLUSIVE : QC_L3_PASS;
  pr->loc = QC_LOC_NONE;
  if (any_fail) {
    int fwd = 0, bwd = 0;
    for (int i = 0; i < p->ncheck; i++) {
      const qc_sft_check_res *c = &pr->checks[i];
      if (c->verdict != QC_L3_FAIL || !pr->has_x0) continue;
      int is_loss = strcmp(p->checks[i].metric, "loss") == 0 || strcmp(p->checks[i].metric, "val_nll") == 0;
      if (c->fail_step == pr->x0 && is_loss) fwd = 1;
      if (c->fail_step == pr->x0 || (pr->x1 >= 0 && c->fail_step == pr->x1)) bwd = 1;
    }
    pr->loc = fwd ? QC_LOC_FORWARD : bwd ? QC_LOC_BACKWARD : QC_LOC_LATE;
  }
  return QC_OK;
}

int qc_sft_judge(qc_sft_run *r) {
  double t0 = qc_now_s();
  int rc;
  r->verdict = 0;
  missing_arms(r);
  for (int p = 0; p < r->cs->npair; p++) {
    if ((rc = judge_pair(r, &r->cs->pairs[p], &r->pairs[p]))) return rc;
    if (r->pairs[p].verdict != QC_L3_PASS) r->verdict = 1;
  }
  r->t_judge = qc_now_s() - t0;
  return QC_OK;
}

void qc_sft_run_free(qc_sft_run *r) {
  for (int a = 0; a < QC_L3_MAXARMS; a++) {
    qc_l3_log_free(&r->logs[a]);
    qc_l3_config_free(&r->cfg[a]);
  }
  for (int p = 0; p < QC_L3_MAXPAIRS; p++) qc_sft_pair_res_free(&r->pairs[p]);
  free(r->rows);
  memset(r, 0, sizeof *r);
}
