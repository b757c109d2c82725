/* l3case.c: the sft case file (see l3case.h and docs/layer3.md). */
#include "model/l3case.h"

#include <cJSON.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/qc.h"
#include "model/l3json.h"

/* {"canonical": "name in the log"} into tags. */
static int parse_tags(const cJSON *v, const char *where, qc_l3_tag *tags, int *n) {
  if (!cJSON_IsObject(v)) return qc_err("%s: 'tags' must be an object {\"metric\": \"tag in the log\"}", where);
  for (const cJSON *t = v->child; t; t = t->next) {
    if (*n == QC_L3_MAXTAGS) return qc_err("%s: more than %d tags", where, QC_L3_MAXTAGS);
    if (!cJSON_IsString(t) || !t->valuestring[0]) return qc_err("%s: tags.%s: expected a non-empty string", where, t->string);
    if (strlen(t->string) >= QC_L3_NAME || strlen(t->valuestring) >= QC_L3_NAME)
      return qc_err("%s: tags.%.40s: a name longer than %d characters", where, t->string, QC_L3_NAME - 1);
    for (int i = 0; i < *n; i++)
      if (strcmp(tags[i].tag, t->valuestring) == 0) return qc_err("%s: tag '%s' is mapped twice", where, t->valuestring);
    snprintf(tags[*n].metric, QC_L3_NAME, "%s", t->string);
    snprintf(tags[*n].tag, QC_L3_NAME, "%s", t->valuestring);
    (*n)++;
  }
  return QC_OK;
}

static int parse_arm(const cJSON *v, const char *where, const char *dir, qc_sft_arm *a) {
  static const char *const keys[] = {"log", "config", "step_key", "tags", "keys", "description", NULL};
  char w[400], rel[QC_L3_PATH];
  int rc, found;
  snprintf(w, sizeof w, "%s: arms.%s", where, v->string);
  if (!cJSON_IsObject(v)) return qc_err("%s: expected an object {\"log\": ..., \"config\": ...}", w);
  if ((rc = qc_lj_keys(v, keys, w))) return rc;
  if (strlen(v->string) >= sizeof a->key || !v->string[0] || strchr(v->string, '~'))
    return qc_err("%s: an arm name must be 1 to %zu characters without '~'", w, sizeof a->key - 1);
  snprintf(a->key, sizeof a->key, "%s", v->string);
  if ((rc = qc_lj_str(v, "log", w, rel, sizeof rel, &found))) return rc;
  if (!found) return qc_err("%s: key 'log' is missing: every arm needs its per-step log", w);
  if ((rc = qc_lj_resolve(dir, rel, a->log, sizeof a->log))) return rc;
  if ((rc = qc_lj_str(v, "config", w, rel, sizeof rel, &found))) return rc;
  if (found && (rc = qc_lj_resolve(dir, rel, a->config, sizeof a->config))) return rc;
  const cJSON *sk = cJSON_GetObjectItemCaseSensitive(v, "step_key");
  if (sk && (!cJSON_IsString(sk) || !sk->valuestring[0] || strlen(sk->valuestring) >= sizeof a->step_key))
    return qc_err("%s: 'step_key' must be the name of the log's step key or column (1 to %zu characters)", w, sizeof a->step_key - 1);
  if (sk) snprintf(a->step_key, sizeof a->step_key, "%s", sk->valuestring);
  const cJSON *t = cJSON_GetObjectItemCaseSensitive(v, "tags");
  if (t && (rc = parse_tags(t, w, a->tags, &a->ntags))) return rc;
  const cJSON *k = cJSON_GetObjectItemCaseSensitive(v, "keys");
  if (k) {
    if (!cJSON_IsObject(k)) return qc_err("%s: 'keys' must be an object {\"lr\": \"optimizer.lr\"}", w);
    for (const cJSON *e = k->child; e; e = e->next) {
      if (a->nkeys == QC_L3_MAXKEYS) return qc_err("%s: more than %d keys", w, QC_L3_MAXKEYS);
      if (!cJSON_IsString(e) || !e->valuestring[0] || strlen(e->valuestring) >= QC_L3_NAME || strlen(e->string) >= QC_L3_NAME)
        return qc_err("%s: keys.%.40s: expected a path like \"optimizer.lr\" (at most %d characters)", w, e->string, QC_L3_NAME - 1);
      snprintf(a->keys[a->nkeys].key, QC_L3_NAME, "%s", e->string);
      snprintf(a->keys[a->nkeys].path, QC_L3_NAME, "%s", e->valuestring);
      a->nkeys++;
    }
  }
  return QC_OK;
}

static int parse_window(const cJSON *v, const char *where, double *w0, double *w1) {
  if (!cJSON_IsArray(v) || cJSON_GetArraySize(v) != 2 || !cJSON_IsNumber(v->child) || !cJSON_IsNumber(v->child->next) ||
      !isfinite(v->child->valuedouble) || !isfinite(v->child->next->valuedouble))
    return qc_err("%s: 'window' must be [first, last] (two numbers on the x axis)", where);
  *w0 = v->child->valuedouble;
  *w1 = v->child->next->valuedouble;
  if (*w0 > *w1) return qc_err("%s: 'window' [%g, %g] ends before it begins", where, *w0, *w1);
  return QC_OK;
}

static int parse_noise(const cJSON *v, const char *w, const char *dir, qc_sft_bounds *b) {
  if (!cJSON_IsArray(v) || cJSON_GetArraySize(v) < 1 || cJSON_GetArraySize(v) > 64)
    return qc_err("%s: 'noise_arms' must be a list of 1 to 64 logs of other seeds", w);
  b->nnoise = cJSON_GetArraySize(v);
  if (!(b->noise = qc_calloc((size_t)b->nnoise, sizeof *b->noise, "noise logs"))) return QC_ESYS;
  int i = 0, rc;
  for (const cJSON *e = v->child; e; e = e->next, i++) {
    char rel[QC_L3_PATH];
    if (cJSON_IsString(e)) snprintf(rel, sizeof rel, "%s", e->valuestring);
    else if (cJSON_IsObject(e)) {
      static const char *const nk[] = {"log", "tags", NULL};
      int found;
      if ((rc = qc_lj_keys(e, nk, w)) || (rc = qc_lj_str(e, "log", w, rel, sizeof rel, &found))) return rc;
      if (!found) return qc_err("%s: noise_arms[%d] has no 'log'", w, i);
      const cJSON *t = cJSON_GetObjectItemCaseSensitive(e, "tags");
      if (t && (rc = parse_tags(t, w, b->noise[i].tags, &b->noise[i].ntags))) return rc;
    } else return qc_err("%s: noise_arms[%d]: expected a path or {\"log\": ..., \"tags\": ...}", w, i);
    if ((rc = qc_lj_resolve(dir, rel, b->noise[i].log, sizeof b->noise[i].log))) return rc;
  }
  return QC_OK;
}

static int parse_equiv(const cJSON *v, const char *w, qc_sft_bounds *b) {
  static const char *const ek[] = {"delta", "alpha", "seed", "resamples", "block", NULL};
  char ew[520];
  snprintf(ew, sizeof ew, "%s: equivalence", w);
  if (!cJSON_IsObject(v)) return qc_err("%s: expected {\"delta\": D, \"alpha\": 0.05}", ew);
  int rc, found;
  double x;
  if ((rc = qc_lj_keys(v, ek, ew)) || (rc = qc_lj_num(v, "delta", ew, 0, &b->eq_delta, &found))) return rc;
  if (!found) return qc_err("%s: key 'delta' is missing: the equivalence margin", ew);
  b->eq_alpha = 0.05;
  if ((rc = qc_lj_num(v, "alpha", ew, 0, &b->eq_alpha, &found))) return rc;
  if (!(b->eq_alpha > 0 && b->eq_alpha < 0.5)) return qc_err("%s: 'alpha' %g is not in (0, 0.5)", ew, b->eq_alpha);
  if ((rc = qc_lj_num(v, "seed", ew, 0, &x, &found))) return rc;
  if (found && (x != floor(x) || x > 9007199254740992.0)) return qc_err("%s: 'seed' must be an integer below 2^53", ew);
  b->eq_seed = found ? (uint64_t)x : 0;
  b->eq_resamples = 2000;
  if ((rc = qc_lj_num(v, "resamples", ew, 100, &x, &found))) return rc;
  if (found && (x != floor(x) || x > 1e6)) return qc_err("%s: 'resamples' must be an integer from 100 to 1000000", ew);
  if (found) b->eq_resamples = (int)x;
  if ((rc = qc_lj_num(v, "block", ew, 1, &x, &found))) return rc;
  if (found && (x != floor(x) || x > 1e9)) return qc_err("%s: 'block' must be a whole number of points", ew);
  b->eq_block = found ? (int)x : 0;
  b->has_equiv = 1;
  return QC_OK;
}

/* One check: obj holds the bounds (and, in the list form, metric and window). */
static int parse_check(const cJSON *obj, const char *w, const char *dir, int list_form, qc_sft_check *k) {
  static const char *const keys_map[] = {"pointwise_abs", "pointwise_rel", "mean_abs", "mean_rel", "equivalence",
                                         "noise_arms", "noise_multiple", "reasoning", "window", NULL};
  static const char *const keys_list[] = {"metric", "pointwise_abs", "pointwise_rel", "mean_abs", "mean_rel", "equivalence",
                                          "noise_arms", "noise_multiple", "reasoning", "window", NULL};
  int rc, f;
  qc_sft_bounds *b = &k->b;
  if (!cJSON_IsObject(obj)) return qc_err("%s: expected an object of bounds", w);
  if ((rc = qc_lj_keys(obj, list_form ? keys_list : keys_map, w))) return rc;
  if (list_form) {
    if ((rc = qc_lj_str(obj, "metric", w, k->metric, sizeof k->metric, &f))) return rc;
    if (!f || !k->metric[0]) return qc_err("%s: key 'metric' is missing", w);
  }
  const cJSON *v;
  if ((v = cJSON_GetObjectItemCaseSensitive(obj, "window"))) {
    if ((rc = parse_window(v, w, &k->w0, &k->w1))) return rc;
    k->has_window = 1;
  }
  if ((rc = qc_lj_num(obj, "pointwise_abs", w, 0, &b->pw_abs, &b->has_pw_abs)) ||
      (rc = qc_lj_num(obj, "pointwise_rel", w, 0, &b->pw_rel, &b->has_pw_rel)) ||
      (rc = qc_lj_num(obj, "mean_abs", w, 0, &b->mean_abs, &b->has_mean_abs)) ||
      (rc = qc_lj_num(obj, "mean_rel", w, 0, &b->mean_rel, &b->has_mean_rel)) ||
      (rc = qc_lj_num(obj, "noise_multiple", w, 0, &b->noise_multiple, &b->has_noise)))
    return rc;
  if ((v = cJSON_GetObjectItemCaseSensitive(obj, "equivalence")) && (rc = parse_equiv(v, w, b))) return rc;
  v = cJSON_GetObjectItemCaseSensitive(obj, "noise_arms");
  if (v && !b->has_noise) return qc_err("%s: 'noise_arms' without 'noise_multiple': how many noise bands is the bound?", w);
  if (b->has_noise && !v) return qc_err("%s: 'noise_multiple' without 'noise_arms': the logs of other seeds the band comes from", w);
  if (v && (rc = parse_noise(v, w, dir, b))) return rc;
  if (!(b->has_pw_abs || b->has_pw_rel || b->has_mean_abs || b->has_mean_rel || b->has_equiv || b->has_noise)) {
    qc_err("%s: declares no bound", w);
    qc_hint("give at least one of pointwise_abs, pointwise_rel, mean_abs, mean_rel, equivalence, noise_multiple");
    return QC_EINPUT;
  }
  if ((rc = qc_lj_str(obj, "reasoning", w, b->reasoning, sizeof b->reasoning, &f))) return rc;
  if (!f || !b->reasoning[0]) {
    qc_err("%s: key 'reasoning' is missing: bounds are declared before the run, with their reasoning", w);
    qc_hint("say where each bound comes from (noise measured on other seeds, the bf16 rounding of the gradient, ...)");
    return QC_EINPUT;
  }
  return QC_OK;
}

static int arm_index(const qc_sft_case *c, const char *name, size_t len) {
  for (int i = 0; i < c->narm; i++)
    if (strlen(c->arms[i].key) == len && strncmp(c->arms[i].key, name, len) == 0) return i;
  return -1;
}

static int parse_pair(const cJSON *v, const char *where, const char *dir, qc_sft_case *c, qc_sft_pair *p) {
  char w[600];
  snprintf(w, sizeof w, "%s: pairs.%s", where, v->string);
  const char *t = strchr(v->string, '~');
  if (!t || (p->a = arm_index(c, v->string, (size_t)(t - v->string))) < 0 || (p->b = arm_index(c, t + 1, strlen(t + 1))) < 0) {
    qc_err("%s: a pair is \"ARM~ARM\" of two arms declared in 'arms'", w);
    qc_hint("e.g. \"under_test~gradient_reference\"");
    return QC_EINPUT;
  }
  if (p->a == p->b) return qc_err("%s: an arm compared with itself", w);
  int n = cJSON_IsObject(v) || cJSON_IsArray(v) ? cJSON_GetArraySize(v) : -1;
  if (n < 1) return qc_err("%s: expected {\"metric\": {bounds}} or a list of checks, not empty", w);
  if (!(p->checks = qc_calloc((size_t)n, sizeof *p->checks, "checks"))) return QC_ESYS;
  int i = 0, rc;
  for (const cJSON *e = v->child; e; e = e->next, i++) {
    char cw[800];
    if (cJSON_IsArray(v)) snprintf(cw, sizeof cw, "%s[%d]", w, i);
    else {
      snprintf(cw, sizeof cw, "%s.%s", w, e->string);
      for (const cJSON *q = v->child; q != e; q = q->next)
        if (strcmp(q->string, e->string) == 0) return qc_err("%s: metric '%s' appears twice", w, e->string);
      if (strlen(e->string) >= QC_L3_NAME || !e->string[0]) return qc_err("%s: a metric name of 1 to %d characters", cw, QC_L3_NAME - 1);
      snprintf(p->checks[i].metric, QC_L3_NAME, "%s", e->string);
    }
    p->ncheck = i + 1;
    if ((rc = parse_check(e, cw, dir, cJSON_IsArray(v), &p->checks[i]))) return rc;
  }
  return QC_OK;
}

int qc_sft_case_parse(const char *text, const char *where, const char *dir, qc_sft_case *c) {
  static const char *const top[] = {"name", "description", "arms", "x", "window", "max_gap", "expected_differences", "pairs", NULL};
  memset(c, 0, sizeof *c);
  snprintf(c->path, sizeof c->path, "%s", where);
  snprintf(c->dir, sizeof c->dir, "%s", dir ? dir : "");
  cJSON *root = NULL;
  char w[1100], x[16] = "step";
  int rc = qc_lj_case_begin(text, where, top, &root, w, sizeof w, c->name, sizeof c->name), found;
  const cJSON *v;
  if (rc) goto done;
  v = cJSON_GetObjectItemCaseSensitive(root, "arms");
  if (!cJSON_IsObject(v) || cJSON_GetArraySize(v) < 2) {
    rc = qc_err("%s: 'arms' must be an object of at least two arms", w);
    qc_hint("\"arms\": {\"under_test\": {\"log\": ..., \"config\": ...}, \"gradient_reference\": {...}, \"native_baseline\": {...}}");
    goto done;
  }
  if (cJSON_GetArraySize(v) > QC_L3_MAXARMS) { rc = qc_err("%s: more than %d arms", w, QC_L3_MAXARMS); goto done; }
  for (const cJSON *a = v->child; a; a = a->next) {
    for (const cJSON *q = v->child; q != a; q = q->next)
      if (strcmp(q->string, a->string) == 0) { rc = qc_err("%s: arm '%s' appears twice", w, a->string); goto done; }
    if ((rc = parse_arm(a, w, c->dir, &c->arms[c->narm]))) goto done;
    c->narm++;
  }
  if ((rc = qc_lj_str(root, "x", w, x, sizeof x, &found))) goto done;
  if (strcmp(x, "step") && strcmp(x, "tokens")) { rc = qc_err("%s: 'x' is '%s': expected \"step\" or \"tokens\"", w, x); goto done; }
  c->x_tokens = strcmp(x, "tokens") == 0;
  if (!(v = cJSON_GetObjectItemCaseSensitive(root, "window"))) {
    rc = qc_err("%s: key 'window' is missing: the comparison window is fixed before the run", w);
    qc_hint("\"window\": [1, 200] (steps, or tokens with \"x\": \"tokens\")");
    goto done;
  }
  if ((rc = parse_window(v, w, &c->w0, &c->w1))) goto done;
  if ((v = cJSON_GetObjectItemCaseSensitive(root, "max_gap"))) {
    if (!cJSON_IsNumber(v) || !(v->valuedouble > 0) || !isfinite(v->valuedouble)) {
      rc = qc_err("%s: 'max_gap' must be a positive number on the x axis (the longest stretch without a point accepted)", w);
      goto done;
    }
    c->has_max_gap = 1;
    c->max_gap = v->valuedouble;
  }
  if ((v = cJSON_GetObjectItemCaseSensitive(root, "expected_differences"))) {
    if (!cJSON_IsObject(v)) { rc = qc_err("%s: 'expected_differences' must be an object {\"key\": \"why it differs\"}", w); goto done; }
    for (const cJSON *e = v->child; e; e = e->next) {
      if (c->nexpected == QC_L3_MAXEXPECTED) { rc = qc_err("%s: more than %d expected differences", w, QC_L3_MAXEXPECTED); goto done; }
      if (!cJSON_IsString(e) || !e->valuestring[0] || strlen(e->string) >= QC_L3_NAME) {
        rc = qc_err("%s: expected_differences.%.40s: expected a non-empty string saying why it differs", w, e->string);
        goto done;
      }
      snprintf(c->expected[c->nexpected].key, QC_L3_NAME, "%s", e->string);
      snprintf(c->expected[c->nexpected].reason, sizeof c->expected[0].reason, "%s", e->valuestring);
      c->nexpected++;
    }
  }
  v = cJSON_GetObjectItemCaseSensitive(root, "pairs");
  if (!cJSON_IsObject(v) || !v->child) {
    rc = qc_err("%s: 'pairs' must be a non-empty object: the pairs of arms to compare, with their checks", w);
    goto done;
  }
  if (cJSON_GetArraySize(v) > QC_L3_MAXPAIRS) { rc = qc_err("%s: more than %d pairs", w, QC_L3_MAXPAIRS); goto done; }
  for (const cJSON *p = v->child; p; p = p->next) {
    for (const cJSON *q = v->child; q != p; q = q->next)
      if (strcmp(q->string, p->string) == 0) { rc = qc_err("%s: pair '%s' appears twice", w, p->string); goto done; }
    c->npair++;
    if ((rc = parse_pair(p, w, c->dir, c, &c->pairs[c->npair - 1]))) goto done;
  }
done:
  cJSON_Delete(root);
  if (rc) qc_sft_case_free(c);
  return rc;
}

static int parse_any(const char *text, const char *where, const char *dir, void *c) { return qc_sft_case_parse(text, where, dir, c); }

int qc_sft_case_load(const char *path, qc_sft_case *c) {
  char sha[65];
  memset(c, 0, sizeof *c);
  int rc = qc_lj_case_load(path, parse_any, c, sha);
  if (!rc) snprintf(c->sha256, sizeof c->sha256, "%s", sha);
  return rc;
}

void qc_sft_case_free(qc_sft_case *c) {
  for (int p = 0; p < c->npair; p++) {
    for (int k = 0; k < c->pairs[p].ncheck; k++) free(c->pairs[p].checks[k].b.noise);
    free(c->pairs[p].checks);
    c->pairs[p].checks = NULL;
    c->pairs[p].ncheck = 0;
  }
  c->npair = 0;
}

int qc_sft_case_expected(const qc_sft_case *c, const char *key, const char **reason) {
  for (int i = 0; i < c->nexpected; i++)
    if (strcmp(c->expected[i].key, key) == 0) {
      if (reason) *reason = c->expected[i].reason;
      return 1;
    }
  return 0;
}
