/* stepcase.c: the step case file (see l3case.h and docs/layer3.md):
 *   {"name": ..., "dump": "step.h5" | ["ut.h5", "ref.h5"], "arms": [...],
 *    "frozen": [...], "tolerances": {"update": {...}, "grad_pair": {...},
 *    "update_pair": {...}}}
 * Each tolerance set holds rel_l2, max_abs, cosine_min, norm_ratio
 * [low, high] and its reasoning, and optionally by_param: a list of
 * {"params": REGEX, ...bounds, "reasoning"} overrides. */
#include "model/l3case.h"

#include <cJSON.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/qc.h"
#include "model/l3json.h"

/* The bounds of obj into t (the keys were checked by the caller). */
static int parse_bounds(const cJSON *obj, const char *w, qc_tol *t) {
  int rc, f;
  memset(t, 0, sizeof *t);
  if ((rc = qc_lj_num(obj, "rel_l2", w, 0, &t->rel_l2, &t->has_rel_l2)) ||
      (rc = qc_lj_num(obj, "max_abs", w, 0, &t->max_abs, &t->has_max_abs)) ||
      (rc = qc_lj_num(obj, "cosine_min", w, -1, &t->cosine_min, &t->has_cosine_min)))
    return rc;
  if (t->has_cosine_min && t->cosine_min > 1) return qc_err("%s: 'cosine_min' %g is above 1", w, t->cosine_min);
  const cJSON *nr = cJSON_GetObjectItemCaseSensitive(obj, "norm_ratio");
  if (nr) {
    if (!cJSON_IsArray(nr) || cJSON_GetArraySize(nr) != 2 || !cJSON_IsNumber(nr->child) || !cJSON_IsNumber(nr->child->next) ||
        !isfinite(nr->child->valuedouble) || !isfinite(nr->child->next->valuedouble) ||
        nr->child->valuedouble > nr->child->next->valuedouble)
      return qc_err("%s: 'norm_ratio' must be [low, high], two finite numbers, low <= high", w);
    t->norm_lo = nr->child->valuedouble;
    t->norm_hi = nr->child->next->valuedouble;
    t->has_norm_ratio = 1;
  }
  if (!(t->has_rel_l2 || t->has_max_abs || t->has_cosine_min || t->has_norm_ratio)) {
    qc_err("%s: declares no bound", w);
    qc_hint("give at least one of rel_l2, max_abs, cosine_min, norm_ratio");
    return QC_EINPUT;
  }
  if ((rc = qc_lj_str(obj, "reasoning", w, t->reasoning, sizeof t->reasoning, &f))) return rc;
  if (!f || !t->reasoning[0]) {
    qc_err("%s: key 'reasoning' is missing: tolerances are declared with their reasoning", w);
    qc_hint("say where the bound comes from: the float32 rounding of the update, the bf16 gradient, ...");
    return QC_EINPUT;
  }
  return QC_OK;
}

static int parse_set(const cJSON *obj, const char *where, qc_step_tolset *s) {
  static const char *const keys[] = {"rel_l2", "max_abs", "cosine_min", "norm_ratio", "reasoning", "by_param", NULL};
  static const char *const okeys[] = {"params", "rel_l2", "max_abs", "cosine_min", "norm_ratio", "reasoning", NULL};
  char w[1200];
  snprintf(w, sizeof w, "%s: tolerances.%s", where, obj->string);
  if (!cJSON_IsObject(obj)) return qc_err("%s: expected an object of bounds", w);
  int rc = qc_lj_keys(obj, keys, w);
  if (rc || (rc = parse_bounds(obj, w, &s->tol))) return rc;
  s->declared = 1;
  const cJSON *bp = cJSON_GetObjectItemCaseSensitive(obj, "by_param");
  if (!bp) return QC_OK;
  if (!cJSON_IsArray(bp)) return qc_err("%s: 'by_param' must be a list of {\"params\": REGEX, bounds, \"reasoning\"}", w);
  if (cJSON_GetArraySize(bp) > QC_STEP_MAXOVER) return qc_err("%s: more than %d by_param overrides", w, QC_STEP_MAXOVER);
  int i = 0, f;
  for (const cJSON *o = bp->child; o; o = o->next, i++) {
    char ow[1300];
    snprintf(ow, sizeof ow, "%s.by_param[%d]", w, i);
    if (!cJSON_IsObject(o)) return qc_err("%s: expected an object", ow);
    if ((rc = qc_lj_keys(o, okeys, ow)) || (rc = qc_lj_str(o, "params", ow, s->over[i].re, sizeof s->over[i].re, &f))) return rc;
    if (!f) return qc_err("%s: key 'params' is missing: the regex of the parameter names it applies to", ow);
    if ((rc = parse_bounds(o, ow, &s->over[i].tol))) return rc;
    int e = regcomp(&s->rx[i], s->over[i].re, REG_EXTENDED | REG_NOSUB);
    if (e) {
      char eb[128];
      regerror(e, &s->rx[i], eb, sizeof eb);
      return qc_err("%s: 'params' regex '%s': %s", ow, s->over[i].re, eb);
    }
    s->nover = i + 1;
  }
  return QC_OK;
}

int qc_step_case_parse(const char *text, const char *where, const char *dir, qc_step_case *c) {
  static const char *const top[] = {"name", "description", "dump", "arms", "frozen", "tolerances", NULL};
  static const char *const tk[] = {"update", "grad_pair", "update_pair", NULL};
  memset(c, 0, sizeof *c);
  snprintf(c->path, sizeof c->path, "%s", where);
  snprintf(c->dir, sizeof c->dir, "%s", dir ? dir : "");
  cJSON *root = NULL;
  char w[1100];
  int rc = qc_lj_case_begin(text, where, top, &root, w, sizeof w, c->name, sizeof c->name);
  const cJSON *v;
  if (rc) goto done;
  /* dump: one file or a list (arms written by separate runs) */
  v = cJSON_GetObjectItemCaseSensitive(root, "dump");
  if (!v) { rc = qc_err("%s: key 'dump' is missing: the step dump (HDF5), or a list of them", w); goto done; }
  if (cJSON_IsString(v)) {
    if ((rc = qc_lj_resolve(c->dir, v->valuestring, c->dump[0], sizeof c->dump[0]))) goto done;
    c->ndump = 1;
  } else if (cJSON_IsArray(v) && cJSON_GetArraySize(v) >= 1 && cJSON_GetArraySize(v) <= QC_STEP_MAXDUMPS) {
    for (const cJSON *d = v->child; d; d = d->next) {
      if (!cJSON_IsString(d)) { rc = qc_err("%s: 'dump' list: expected file names", w); goto done; }
      if ((rc = qc_lj_resolve(c->dir, d->valuestring, c->dump[c->ndump], sizeof c->dump[0]))) goto done;
      for (int i = 0; i < c->ndump; i++)
        if (strcmp(c->dump[i], c->dump[c->ndump]) == 0) { rc = qc_err("%s: dump '%s' is listed twice", w, d->valuestring); goto done; }
      c->ndump++;
    }
  } else { rc = qc_err("%s: 'dump' must be a file name or a list of 1 to %d", w, QC_STEP_MAXDUMPS); goto done; }
  /* arms and frozen: lists of names */
  if ((v = cJSON_GetObjectItemCaseSensitive(root, "arms"))) {
    if (!cJSON_IsArray(v) || cJSON_GetArraySize(v) < 1 || cJSON_GetArraySize(v) > QC_L3_MAXARMS) {
      rc = qc_err("%s: 'arms' must be a list of 1 to %d arm group names", w, QC_L3_MAXARMS);
      goto done;
    }
    for (const cJSON *a = v->child; a; a = a->next) {
      if (!cJSON_IsString(a) || !a->valuestring[0] || strlen(a->valuestring) >= QC_L3_NAME) { rc = qc_err("%s: 'arms': expected names", w); goto done; }
      for (int i = 0; i < c->narm; i++)
        if (strcmp(c->arms[i], a->valuestring) == 0) { rc = qc_err("%s: arm '%s' is listed twice", w, a->valuestring); goto done; }
      snprintf(c->arms[c->narm++], QC_L3_NAME, "%s", a->valuestring);
    }
  }
  if ((v = cJSON_GetObjectItemCaseSensitive(root, "frozen"))) {
    if (!cJSON_IsArray(v) || cJSON_GetArraySize(v) > QC_STEP_MAXFROZEN) { rc = qc_err("%s: 'frozen' must be a list of at most %d parameter names", w, QC_STEP_MAXFROZEN); goto done; }
    for (const cJSON *a = v->child; a; a = a->next) {
      if (!cJSON_IsString(a) || !a->valuestring[0] || strlen(a->valuestring) >= QC_PATHLEN) { rc = qc_err("%s: 'frozen': expected parameter names", w); goto done; }
      snprintf(c->frozen[c->nfrozen++], QC_PATHLEN, "%s", a->valuestring);
    }
  }
  /* tolerances: optional; an update without one is judged at derived bounds */
  v = cJSON_GetObjectItemCaseSensitive(root, "tolerances");
  if (!v) goto done;
  if (!cJSON_IsObject(v)) {
    rc = qc_err("%s: 'tolerances' must be an object of update, grad_pair, update_pair", w);
    qc_hint("\"tolerances\": {\"update\": {\"rel_l2\": 1e-3, \"reasoning\": \"...\"}}, or leave it out: updates are then judged at derived bounds");
    goto done;
  }
  if ((rc = qc_lj_keys(v, tk, w))) goto done;
  for (const cJSON *t = v->child; t; t = t->next) {
    qc_step_tolset *s = strcmp(t->string, "update") == 0 ? &c->update : strcmp(t->string, "grad_pair") == 0 ? &c->grad_pair : &c->update_pair;
    if ((rc = parse_set(t, w, s))) goto done;
  }
done:
  cJSON_Delete(root);
  if (rc) qc_step_case_free(c);
  return rc;
}

static int parse_any(const char *text, const char *where, const char *dir, void *c) { return qc_step_case_parse(text, where, dir, c); }

int qc_step_case_load(const char *path, qc_step_case *c) {
  char sha[65];
  memset(c, 0, sizeof *c);
  int rc = qc_lj_case_load(path, parse_any, c, sha);
  if (!rc) snprintf(c->sha256, sizeof c->sha256, "%s", sha);
  return rc;
}

void qc_step_case_free(qc_step_case *c) {
  qc_step_tolset *sets[] = {&c->update, &c->grad_pair, &c->update_pair};
  for (int k = 0; k < 3; k++) {
    for (int i = 0; i < sets[k]->nover; i++) regfree(&sets[k]->rx[i]);
    sets[k]->nover = 0;
  }
}

const qc_tol *qc_step_tol_for(const qc_step_tolset *s, const char *param) {
  if (!s->declared) return NULL;
  for (int i = 0; i < s->nover; i++)
    if (regexec(&s->rx[i], param, 0, NULL, 0) == 0) return &s->over[i].tol;
  return &s->tol;
}
