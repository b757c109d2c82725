/* case.c: case files, cJSON to a validated qc_case (see case.h). */
#include "model/case.h"

#include <cJSON.h>
#include <errno.h>
#include <math.h>
#include <regex.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/file.h"
#include "core/qc.h"
#include "model/module.h"
#include "core/sha256.h"
#include "model/tol.h"

/* Refuse keys of obj not in the NULL-terminated list `allowed`. */
static int only_keys(const cJSON *obj, const char *const *allowed, const char *where) {
  for (const cJSON *it = obj->child; it; it = it->next) {
    for (const cJSON *p = obj->child; p != it; p = p->next)
      if (strcmp(p->string, it->string) == 0) return qc_err("%s: duplicate key '%s'", where, it->string);
    int ok = 0;
    for (const char *const *a = allowed; *a; a++)
      if (strcmp(it->string, *a) == 0) ok = 1;
    if (!ok) {
      char list[512] = "";
      for (const char *const *a = allowed; *a; a++) {
        strncat(list, a == allowed ? "" : ", ", sizeof list - strlen(list) - 1);
        strncat(list, *a, sizeof list - strlen(list) - 1);
      }
      qc_err("%s: unknown key '%s'", where, it->string);
      qc_hint("allowed here: %s", list);
      return QC_EINPUT;
    }
  }
  return QC_OK;
}

static int get_string(const cJSON *v, const char *where, const char *key, char *out, size_t n) {
  if (!cJSON_IsString(v)) return qc_err("%s: key '%s': expected a string", where, key);
  if (strlen(v->valuestring) >= n) return qc_err("%s: key '%s': longer than %zu characters", where, key, n - 1);
  snprintf(out, n, "%s", v->valuestring);
  return QC_OK;
}

static int get_number(const cJSON *v, const char *where, const char *key, double *out) {
  if (!cJSON_IsNumber(v) || !isfinite(v->valuedouble)) return qc_err("%s: key '%s': expected a finite number", where, key);
  *out = v->valuedouble;
  return QC_OK;
}

/* out = p, relative to dir; QC_EINPUT when it does not fit (never a
 * truncated path, which could name another file). */
static int resolve(const char *dir, const char *p, char *out, size_t n) {
  int k = (p[0] == '/' || !dir[0]) ? snprintf(out, n, "%s", p) : snprintf(out, n, "%s/%s", dir, p);
  if (k < 0 || (size_t)k >= n) return qc_err("path '%.60s...' is longer than %zu characters", p, n - 1);
  return QC_OK;
}

/* The largest magnitude a contract number may have: every contract number
 * (eps, theta, limits, dimensions, seeds) is far below it, and below it
 * every conversion to a 64-bit integer is defined. */
#define QC_CONTRACT_NUM_MAX 1e15
/* Seeds are integers a JSON number holds exactly: [0, 2^53]. */
#define QC_SEED_MAX 9007199254740992.0

/* A number from JSON for contract key `key` (inner: the nested key, or
 * NULL): finite, at most QC_CONTRACT_NUM_MAX in magnitude, and a whole
 * number in [0, 2^53] for a seed; refused by name before any conversion. */
static int contract_num(const cJSON *n, const char *where, const char *key, const char *inner, double *out) {
  double x = n->valuedouble;
  const char *name = inner ? inner : key;
  if (!isfinite(x) || fabs(x) > QC_CONTRACT_NUM_MAX)
    return qc_err("%s: contract key '%s'%s%s%s: %g is out of range: expected a finite number of magnitude at most 1e15",
                  where, key, inner ? " (" : "", inner ? inner : "", inner ? ")" : "", x);
  if (strcmp(name, "seed") == 0 && !(x >= 0 && x <= QC_SEED_MAX && x == floor(x)))
    return qc_err("%s: contract key '%s': seed %g: expected a whole number from 0 to 2^53", where, key, x);
  *out = x;
  return QC_OK;
}

/* One contract value: string, number, or {"word": N} / {"word": {"k": N}}. */
static int contract_value(const cJSON *v, const char *where, qc_contract *c) {
  const char *k = v->string;
  double x;
  int rc;
  if (cJSON_IsString(v)) return qc_contract_set(c, k, v->valuestring, 0, 0);
  if (cJSON_IsNumber(v)) return (rc = contract_num(v, where, k, NULL, &x)) ? rc : qc_contract_set(c, k, "", x, 1);
  if (cJSON_IsBool(v)) return qc_contract_set(c, k, cJSON_IsTrue(v) ? "true" : "false", 0, 0);
  if (cJSON_IsObject(v) && v->child && !v->child->next) {
    const cJSON *in = v->child;
    if (cJSON_IsNumber(in)) return (rc = contract_num(in, where, k, NULL, &x)) ? rc : qc_contract_set(c, k, in->string, x, 1);
    if (cJSON_IsObject(in) && in->child && !in->child->next && cJSON_IsNumber(in->child))
      return (rc = contract_num(in->child, where, k, in->child->string, &x)) ? rc : qc_contract_set(c, k, in->string, x, 1);
    if (cJSON_IsObject(in) && !in->child) return qc_contract_set(c, k, in->string, 0, 0);
  }
  return qc_err("%s: contract key '%s': expected a string, a number, or a one-key object like {\"clipped\": 3.0}", where, k);
}

static int parse_contract_obj(const cJSON *obj, const char *where, qc_contract *c) {
  if (!cJSON_IsObject(obj)) return qc_err("%s: 'contract' must be an object", where);
  memset(c, 0, sizeof *c);
  for (const cJSON *it = obj->child; it; it = it->next) {
    if (strlen(it->string) >= sizeof c->kv[0].key) return qc_err("%s: contract key '%.40s...' is too long", where, it->string);
    int rc = contract_value(it, where, c);
    if (rc) return rc;
  }
  return QC_OK;
}

int qc_contract_parse(const char *json, const char *where, qc_contract *out) {
  cJSON *root = cJSON_Parse(json);
  if (!root) return qc_err("%s: attribute 'contract' is not valid JSON", where);
  int rc = parse_contract_obj(root, where, out);
  cJSON_Delete(root);
  return rc;
}

/* The keys of a tolerance that only a derived one ({"derive": true}) takes,
 * and the judged-precision and bias keys any tolerance may take. */
static int parse_tol_extra(const cJSON *obj, const char *w, qc_tol *tl) {
  const cJSON *v;
  int rc;
  const cJSON *d = cJSON_GetObjectItemCaseSensitive(obj, "derive");
  tl->derive_rounded_operands = -1;
  if (d && !cJSON_IsBool(d)) return qc_err("%s: key 'derive': expected true or false", w);
  tl->derive = d && cJSON_IsTrue(d);
  static const char *const donly[] = {"margin", "rounded_operands", "format", NULL};
  static const char *const bounds[] = {"rel_l2", "max_abs", "cosine_min", "norm_ratio", "noise_multiple", NULL};
  for (const char *const *k = tl->derive ? bounds : donly; *k; k++)
    if (cJSON_GetObjectItemCaseSensitive(obj, *k)) {
      if (tl->derive) qc_err("%s: key '%s' with \"derive\": true: a derived tolerance's bounds come from its derivation", w, *k);
      else qc_err("%s: key '%s' is a derivation option: it needs \"derive\": true", w, *k);
      qc_hint("declare the bounds, or {\"derive\": true} with margin, rounded_operands, format");
      return QC_EINPUT;
    }
  if ((v = cJSON_GetObjectItemCaseSensitive(obj, "margin"))) {
    if ((rc = get_number(v, w, "margin", &tl->derive_margin))) return rc;
    if (tl->derive_margin < 1) return qc_err("%s: key 'margin' is %g: expected a safety factor of at least 1", w, tl->derive_margin);
  }
  if ((v = cJSON_GetObjectItemCaseSensitive(obj, "rounded_operands"))) {
    if (!cJSON_IsNumber(v) || (v->valuedouble != 0 && v->valuedouble != 1 && v->valuedouble != 2))
      return qc_err("%s: key 'rounded_operands': expected 0, 1 or 2", w);
    tl->derive_rounded_operands = (int)v->valuedouble;
  }
  if ((v = cJSON_GetObjectItemCaseSensitive(obj, "format"))) {
    double u;
    if ((rc = get_string(v, w, "format", tl->derive_format, sizeof tl->derive_format))) return rc;
    if ((rc = qc_tol_unit_roundoff(tl->derive_format, "format", 1, &u))) return rc;
  }
  if ((v = cJSON_GetObjectItemCaseSensitive(obj, "bias_z"))) {
    if ((rc = get_number(v, w, "bias_z", &tl->bias_z))) return rc;
    if (tl->bias_z < 0) return qc_err("%s: key 'bias_z' is %g: expected a bound >= 0 (0 turns the bias test off)", w, tl->bias_z);
    tl->has_bias_z = 1;
  }
  if ((v = cJSON_GetObjectItemCaseSensitive(obj, "bias_allowance"))) {
    if ((rc = get_number(v, w, "bias_allowance", &tl->bias_allow))) return rc;
    if (!(tl->bias_allow >= 0))
      return qc_err("%s: key 'bias_allowance' is %g: expected a relative error >= 0 (0: no allowance, z = z_raw)", w,
                    tl->bias_allow);
    tl->has_bias_allow = 1;
  }
  if ((v = cJSON_GetObjectItemCaseSensitive(obj, "dtype"))) {
    if ((rc = get_string(v, w, "dtype", tl->dtype, sizeof tl->dtype))) return rc;
    if (strcmp(tl->dtype, "bfloat16") && strcmp(tl->dtype, "float16") && strcmp(tl->dtype, "float32") && strcmp(tl->dtype, "float64"))
      return qc_err("%s: key 'dtype' is '%s': expected the precision to judge the gradient at: bfloat16, float16, float32 or "
                    "float64", w, tl->dtype);
  }
  return QC_OK;
}

static int parse_tol(const cJSON *obj, const char *where, qc_case_tol *t) {
  static const char *const keys[] = {"rel_l2", "max_abs", "cosine_min", "norm_ratio", "noise_multiple", "reasoning", "bias_z",
                                     "bias_allowance", "dtype", "derive", "margin", "rounded_operands", "format", NULL};
  char w[256];
  snprintf(w, sizeof w, "%s: tolerances.%s", where, obj->string);
  if (!cJSON_IsObject(obj)) return qc_err("%s: expected an object", w);
  if (strlen(obj->string) >= sizeof t->tensor) return qc_err("%s: tensor name too long", w);
  snprintf(t->tensor, sizeof t->tensor, "%s", obj->string);
  int rc = only_keys(obj, keys, w);
  if (rc) return rc;
  qc_tol *tl = &t->tol;
  memset(tl, 0, sizeof *tl);
  if ((rc = parse_tol_extra(obj, w, tl))) return rc;
  const cJSON *v;
  if ((v = cJSON_GetObjectItemCaseSensitive(obj, "rel_l2"))) {
    if ((rc = get_number(v, w, "rel_l2", &tl->rel_l2))) return rc;
    tl->has_rel_l2 = 1;
  }
  if ((v = cJSON_GetObjectItemCaseSensitive(obj, "max_abs"))) {
    if ((rc = get_number(v, w, "max_abs", &tl->max_abs))) return rc;
    tl->has_max_abs = 1;
  }
  if ((v = cJSON_GetObjectItemCaseSensitive(obj, "cosine_min"))) {
    if ((rc = get_number(v, w, "cosine_min", &tl->cosine_min))) return rc;
    tl->has_cosine_min = 1;
  }
  if ((v = cJSON_GetObjectItemCaseSensitive(obj, "noise_multiple"))) {
    if ((rc = get_number(v, w, "noise_multiple", &tl->noise_multiple))) return rc;
    tl->has_noise_multiple = 1;
  }
  if ((v = cJSON_GetObjectItemCaseSensitive(obj, "norm_ratio"))) {
    if (!cJSON_IsArray(v) || cJSON_GetArraySize(v) != 2 || !cJSON_IsNumber(v->child) || !cJSON_IsNumber(v->child->next))
      return qc_err("%s: key 'norm_ratio': expected [low, high]", w);
    tl->norm_lo = v->child->valuedouble;
    tl->norm_hi = v->child->next->valuedouble;
    if (!isfinite(tl->norm_lo) || !isfinite(tl->norm_hi))
      return qc_err("%s: key 'norm_ratio': [%g, %g]: expected finite bounds", w, tl->norm_lo, tl->norm_hi);
    if (!(tl->norm_lo <= tl->norm_hi)) return qc_err("%s: key 'norm_ratio': low %g is above high %g", w, tl->norm_lo, tl->norm_hi);
    tl->has_norm_ratio = 1;
  }
  if (tl->has_rel_l2 && tl->rel_l2 < 0) return qc_err("%s: key 'rel_l2': expected a bound >= 0", w);
  if (tl->has_max_abs && tl->max_abs < 0) return qc_err("%s: key 'max_abs': expected a bound >= 0", w);
  if (tl->has_noise_multiple && tl->noise_multiple < 0) return qc_err("%s: key 'noise_multiple': expected a bound >= 0", w);
  if (tl->has_cosine_min && (tl->cosine_min < -1 || tl->cosine_min > 1))
    return qc_err("%s: key 'cosine_min': expected a value in [-1, 1]", w);
  if (!tl->derive && !(tl->has_rel_l2 || tl->has_max_abs || tl->has_cosine_min || tl->has_norm_ratio ||
                       tl->has_noise_multiple || (tl->has_bias_z && tl->bias_z > 0))) {
    qc_err("%s: declares no bound", w);
    qc_hint("give at least one of rel_l2, max_abs, cosine_min, norm_ratio, noise_multiple, bias_z, or {\"derive\": true}");
    return QC_EINPUT;
  }
  v = cJSON_GetObjectItemCaseSensitive(obj, "reasoning");
  if (!v && tl->derive) return QC_OK; /* the derivation is the reasoning */
  if (!v) {
    qc_err("%s: key 'reasoning' is missing: tolerances are declared with their reasoning", w);
    qc_hint("say where the bound comes from, e.g. from 'qatcheck tol'");
    return QC_EINPUT;
  }
  if (cJSON_IsString(v) && strlen(v->valuestring) >= sizeof tl->reasoning) {
    qc_err("%s: key 'reasoning' has %zu characters: at most %zu are kept with a check", w, strlen(v->valuestring),
           sizeof tl->reasoning - 1);
    qc_hint("keep the derivation short (the formula and its inputs) and cite a file or 'qatcheck tol' for the rest");
    return QC_EINPUT;
  }
  if ((rc = get_string(v, w, "reasoning", tl->reasoning, sizeof tl->reasoning))) return rc;
  if (!tl->reasoning[0]) return qc_err("%s: key 'reasoning' is empty", w);
  return QC_OK;
}

static int parse_data(const cJSON *data, const char *where, qc_case *c) {
  char w[256];
  snprintf(w, sizeof w, "%s: data", where);
  if (!cJSON_IsObject(data)) return qc_err("%s: expected {\"generate\": {...}} or {\"dump\": \"FILE.h5\", ...}", w);
  const cJSON *gen = cJSON_GetObjectItemCaseSensitive(data, "generate");
  const cJSON *dump = cJSON_GetObjectItemCaseSensitive(data, "dump");
  int rc;
  if (gen && dump) return qc_err("%s: give either 'generate' or 'dump', not both", w);
  if (gen) {
    static const char *const dk[] = {"generate", NULL};
    if ((rc = only_keys(data, dk, w))) return rc;
    static const char *const gk[] = {"shapes", "seed", "values", NULL};
    snprintf(w, sizeof w, "%s: data.generate", where);
    if (!cJSON_IsObject(gen)) return qc_err("%s: expected an object", w);
    if ((rc = only_keys(gen, gk, w))) return rc;
    c->data = QC_DATA_GENERATE;
    const cJSON *sh = cJSON_GetObjectItemCaseSensitive(gen, "shapes");
    if (!cJSON_IsArray(sh) || cJSON_GetArraySize(sh) == 0) return qc_err("%s: key 'shapes': expected a non-empty array of shapes", w);
    if (cJSON_GetArraySize(sh) > QC_MAX_SHAPES) return qc_err("%s: key 'shapes': at most %d shapes", w, QC_MAX_SHAPES);
    int i = 0;
    for (const cJSON *s = sh->child; s; s = s->next, i++) {
      if (!cJSON_IsArray(s) || cJSON_GetArraySize(s) < 1 || cJSON_GetArraySize(s) > QC_MAXDIM)
        return qc_err("%s: shapes[%d]: expected an array of 1 to %d integers", w, i, QC_MAXDIM);
      int j = 0;
      for (const cJSON *d = s->child; d; d = d->next, j++) {
        if (!cJSON_IsNumber(d) || d->valuedouble != floor(d->valuedouble) || d->valuedouble < 0 || d->valuedouble > 1e12)
          return qc_err("%s: shapes[%d][%d]: expected a non-negative integer", w, i, j);
        c->shapes[i][j] = (int64_t)d->valuedouble;
      }
      c->shape_n[i] = j;
    }
    c->nshapes = i;
    const cJSON *seed = cJSON_GetObjectItemCaseSensitive(gen, "seed");
    if (seed) {
      /* range-checked before the conversion: 1e300 or 1e999 is refused, not run as seed 0 */
      if (!cJSON_IsNumber(seed) || !(seed->valuedouble >= 0 && seed->valuedouble <= QC_SEED_MAX) ||
          seed->valuedouble != floor(seed->valuedouble))
        return qc_err("%s: key 'seed': %s: expected a whole number from 0 to 2^53 (9007199254740992)", w,
                      cJSON_IsNumber(seed) ? (isfinite(seed->valuedouble) ? "out of range or not whole" : "not finite")
                                           : "not a number");
      c->seed = (uint64_t)seed->valuedouble;
    }
    snprintf(c->values, sizeof c->values, "normal");
    const cJSON *vals = cJSON_GetObjectItemCaseSensitive(gen, "values");
    if (vals) {
      if ((rc = get_string(vals, w, "values", c->values, sizeof c->values))) return rc;
      if (strcmp(c->values, "normal") && strcmp(c->values, "special") && strcmp(c->values, "heavy_tail"))
        return qc_err("%s: key 'values': '%s' is not one of normal, special, heavy_tail", w, c->values);
    }
    return QC_OK;
  }
  if (dump) {
    static const char *const dk[] = {"dump", "modules", "checkpoint", "checkpoint_prefix", NULL};
    if ((rc = only_keys(data, dk, w))) return rc;
    char rel[1024];
    if ((rc = get_string(dump, w, "dump", rel, sizeof rel))) return rc;
    if ((rc = resolve(c->dir, rel, c->dump, sizeof c->dump))) return rc;
    const cJSON *m = cJSON_GetObjectItemCaseSensitive(data, "modules");
    if (m && (rc = get_string(m, w, "modules", c->modules_re, sizeof c->modules_re))) return rc;
    /* params/ from a safetensors checkpoint, by name */
    const cJSON *ck = cJSON_GetObjectItemCaseSensitive(data, "checkpoint");
    const cJSON *cp = cJSON_GetObjectItemCaseSensitive(data, "checkpoint_prefix");
    if (ck) {
      if ((rc = get_string(ck, w, "checkpoint", rel, sizeof rel))) return rc;
      if ((rc = resolve(c->dir, rel, c->checkpoint, sizeof c->checkpoint))) return rc;
    }
    if (cp && !ck) return qc_err("%s: key 'checkpoint_prefix' needs 'checkpoint'", w);
    if (cp && (rc = get_string(cp, w, "checkpoint_prefix", c->ckpt_prefix, sizeof c->ckpt_prefix))) return rc;
    c->data = QC_DATA_DUMP;
    return QC_OK;
  }
  return qc_err("%s: expected {\"generate\": {...}} or {\"dump\": \"FILE.h5\", \"modules\": \"REGEX\", \"checkpoint\": \"MODEL.safetensors\"}", w);
}

/* Which of three planted errors a tolerance's bounds all pass: the
 * gradient doubled, halved, or negated (relative to a non-zero reference:
 * rel_l2 1, 0.5, 2; norm ratio 2, 0.5, 1; cosine 1, 1, -1). max_abs and
 * noise_multiple are taken to see all three (their scale is the data's:
 * a sensible bound is far below the error). Returns a mask: 1 doubled,
 * 2 halved, 4 negated. */
static int blind_to(const qc_tol *t) {
  static const double rel[3] = {1, 0.5, 2}, nr[3] = {2, 0.5, 1}, cs[3] = {1, 1, -1};
  int mask = 0;
  if (t->has_max_abs || t->has_noise_multiple) return 0;
  for (int e = 0; e < 3; e++) {
    int seen = (t->has_rel_l2 && rel[e] > t->rel_l2) || (t->has_norm_ratio && (nr[e] < t->norm_lo || nr[e] > t->norm_hi)) ||
               (t->has_cosine_min && cs[e] < t->cosine_min);
    if (!seen) mask |= 1 << e;
  }
  return mask;
}

/* The tensor members of tolerances object v into c->tol, for class cls
 * ("": the default for every class): a member naming a class (a group,
 * parsed by the caller) is skipped at the top level; at a class's level
 * every member is a tensor. Duplicates refused. QC_OK or QC_EINPUT. */
static int parse_tols(const cJSON *v, const char *w, const char *cls, qc_case *c) {
  int rc;
  for (const cJSON *t = v->child; t; t = t->next) {
    for (const cJSON *p = v->child; p != t; p = p->next)
      if (strcmp(p->string, t->string) == 0) return qc_err("%s: tolerances: duplicate key '%s'", w, t->string);
    if (!cls[0] && qc_registry_find(t->string)) continue;
    if (!cls[0] && cJSON_IsObject(t) && t->child && cJSON_IsObject(t->child)) {
      int n;
      const qc_registry_row *rows = qc_registry_rows(&n);
      char names[512] = "";
      for (int i = 0; i < n; i++) {
        size_t l = strlen(names);
        snprintf(names + l, sizeof names - l, "%s%s", i ? ", " : "", rows[i].cls->name);
      }
      qc_err("%s: tolerances.%s: '%s' is not a class: a member holding tensors' tolerances names a class", w, t->string,
             t->string);
      qc_hint("the classes are %s", names);
      return QC_EINPUT;
    }
    if (c->ntol == QC_MAX_TOL) return qc_err("%s: more than %d tolerances", w, QC_MAX_TOL);
    if ((rc = parse_tol(t, w, &c->tol[c->ntol]))) return rc;
    snprintf(c->tol[c->ntol].cls, sizeof c->tol[c->ntol].cls, "%s", cls);
    c->ntol++;
  }
  return QC_OK;
}

/* Case lint: every tolerance whose bounds cannot see a scale error or a
 * sign flip is described in c->weak (one line each); qc_case_weak decides
 * whether that refuses the case. (A member whose bounds are derived at run
 * time is not judged here.) */
static void lint(qc_case *c, const char *where) {
  for (int i = 0; i < c->ntol; i++) {
    if (c->tol[i].tol.derive) continue; /* its bounds come from the class's error model at run time */
    int m = blind_to(&c->tol[i].tol);
    if (!m) continue;
    char what[160] = "";
    if (m & 3)
      snprintf(what, sizeof what, "a scale error (it passes %s): add rel_l2, norm_ratio, max_abs or noise_multiple",
               (m & 3) == 3 ? "2 g and g / 2" : (m & 1) ? "2 g" : "g / 2");
    if (m & 4)
      snprintf(what + strlen(what), sizeof what - strlen(what), "%sa sign flip (it passes -g): add rel_l2, cosine_min, max_abs or noise_multiple",
               what[0] ? "; nor " : "");
    size_t l = strlen(c->weak);
    snprintf(c->weak + l, sizeof c->weak - l, "%s: tolerances.%s%s%s cannot see %s\n", where, c->tol[i].cls,
             c->tol[i].cls[0] ? "." : "", c->tol[i].tensor, what);
    c->nweak++;
  }
}

int qc_case_weak(const qc_case *c, int allow) {
  if (!c->nweak) return QC_OK;
  if (!allow) {
    const char *nl = strchr(c->weak, '\n');
    qc_err("%.*s", (int)(nl ? nl - c->weak : (long)strlen(c->weak)), c->weak);
    qc_hint("%s'qatcheck tol' derives a complete set; --allow-weak-tolerances runs the case anyway, with a warning in "
            "every report", c->nweak > 1 ? "more tolerances are weak too; " : "");
    return QC_EINPUT;
  }
  for (const char *p = c->weak; *p;) {
    const char *nl = strchr(p, '\n');
    int len = (int)(nl ? nl - p : (long)strlen(p));
    fprintf(stderr, "qatcheck: warning: %.*s\n", len, p);
    p += len + (nl ? 1 : 0);
  }
  return QC_OK;
}

/* The case's "variants": "none" (the contract's reference alone) or a list
 * of the parts allowed ("bf16_inputs", ...); *off gets the parts it does
 * not allow. An unknown name is refused by name. */
static int parse_variants(const cJSON *v, const char *w, unsigned *off) {
  if (cJSON_IsString(v) && strcmp(v->valuestring, "none") == 0) {
    *off = QC_VAR_ALL;
    return QC_OK;
  }
  if (!cJSON_IsArray(v))
    return qc_err("%s: key 'variants': expected \"none\" or a list of the parts allowed (%s)", w, qc_variant_part_names());
  unsigned on = 0;
  for (const cJSON *d = v->child; d; d = d->next) {
    unsigned b = cJSON_IsString(d) ? qc_variant_part(d->valuestring) : 0;
    if (!b) {
      char *s = cJSON_PrintUnformatted(d);
      qc_err("%s: key 'variants': unknown variant %.60s: expected %s", w, s ? s : "?", qc_variant_part_names());
      free(s);
      return QC_EINPUT;
    }
    on |= b;
  }
  *off = QC_VAR_ALL & ~on;
  return QC_OK;
}

int qc_case_parse(const char *text, const char *where, const char *dir, qc_case *c) {
  static const char *const top[] = {"name",  "description", "module", "contract", "data", "candidate",
                                    "dy",    "tolerances",  "split",  "variants", NULL};
  memset(c, 0, sizeof *c);
  if (strlen(dir ? dir : "") >= sizeof c->dir || strlen(where) >= sizeof c->path)
    return qc_err("case '%.60s...': path longer than %zu characters", where, sizeof c->path - 1);
  snprintf(c->dir, sizeof c->dir, "%s", dir ? dir : "");
  snprintf(c->path, sizeof c->path, "%s", where);
  const char *endp = NULL;
  cJSON *root = cJSON_ParseWithOpts(text, &endp, 1);
  int rc = QC_OK;
  if (!root) {
    long line = 1;
    for (const char *p = text; endp && p < endp; p++) line += *p == '\n';
    qc_err("case '%s': malformed JSON near line %ld", where, line);
    return QC_EINPUT;
  }
  char w[1100];
  snprintf(w, sizeof w, "case '%s'", where);
  if (!cJSON_IsObject(root)) { rc = qc_err("%s: expected a JSON object", w); goto done; }
  if ((rc = only_keys(root, top, w))) goto done;
  const cJSON *v;
  if ((v = cJSON_GetObjectItemCaseSensitive(root, "name"))) {
    if ((rc = get_string(v, w, "name", c->name, sizeof c->name))) goto done;
  } else {
    const char *b = strrchr(where, '/');
    snprintf(c->name, sizeof c->name, "%s", b ? b + 1 : where);
    char *dot = strrchr(c->name, '.');
    if (dot) *dot = 0;
  }
  if ((v = cJSON_GetObjectItemCaseSensitive(root, "description")) && !cJSON_IsString(v)) {
    rc = qc_err("%s: key 'description': expected a string", w);
    goto done;
  }
  if ((v = cJSON_GetObjectItemCaseSensitive(root, "module")) && (rc = get_string(v, w, "module", c->module, sizeof c->module)))
    goto done;
  if (c->module[0]) { /* an unknown class is named here, with the classes, before anything is read */
    char wm[1120];
    snprintf(wm, sizeof wm, "%s: key 'module'", w);
    if (!qc_registry_need(c->module, wm)) { rc = QC_EINPUT; goto done; }
  }
  if ((v = cJSON_GetObjectItemCaseSensitive(root, "contract"))) {
    if ((rc = parse_contract_obj(v, w, &c->contract))) goto done;
    c->has_contract = 1;
  }
  v = cJSON_GetObjectItemCaseSensitive(root, "data");
  if (!v) {
    rc = qc_err("%s: key 'data' is missing", w);
    qc_hint("{\"generate\": {\"shapes\": [[127, 2048, 512]], \"seed\": 0}} or {\"dump\": \"FILE.h5\"}");
    goto done;
  }
  if ((rc = parse_data(v, w, c))) goto done;
  if (c->data == QC_DATA_GENERATE && !c->module[0]) {
    rc = qc_err("%s: key 'module' is missing: generated data needs a module class", w);
    goto done;
  }
  v = cJSON_GetObjectItemCaseSensitive(root, "candidate");
  if (!v || (cJSON_IsString(v) && strcmp(v->valuestring, "builtin") == 0)) c->cand = QC_CAND_BUILTIN;
  else if (cJSON_IsString(v) && strcmp(v->valuestring, "dump") == 0) {
    c->cand = QC_CAND_DUMP;
    if (c->data != QC_DATA_DUMP) { rc = qc_err("%s: candidate 'dump' needs data from a dump", w); goto done; }
  } else if (cJSON_IsObject(v)) {
    static const char *const pk[] = {"plugin", "symbol", NULL};
    char pw[1200];
    snprintf(pw, sizeof pw, "%s: candidate", w);
    if ((rc = only_keys(v, pk, pw))) goto done;
    const cJSON *p = cJSON_GetObjectItemCaseSensitive(v, "plugin"), *s = cJSON_GetObjectItemCaseSensitive(v, "symbol");
    if (!p || !s) { rc = qc_err("%s: expected {\"plugin\": \"LIB.so\", \"symbol\": \"NAME\"}", pw); goto done; }
    char rel[1024];
    if ((rc = get_string(p, pw, "plugin", rel, sizeof rel)) || (rc = get_string(s, pw, "symbol", c->symbol, sizeof c->symbol)))
      goto done;
    if ((rc = resolve(c->dir, rel, c->plugin, sizeof c->plugin))) goto done;
    c->cand = QC_CAND_PLUGIN;
  } else {
    rc = qc_err("%s: key 'candidate': expected \"builtin\", \"dump\" or {\"plugin\": ..., \"symbol\": ...}", w);
    goto done;
  }
  if ((v = cJSON_GetObjectItemCaseSensitive(root, "split"))) { /* modules run by every rank, each on a slice */
    if ((rc = get_string(v, w, "split", c->split_re, sizeof c->split_re))) goto done;
    regex_t rx;
    int e = regcomp(&rx, c->split_re, REG_EXTENDED | REG_NOSUB);
    if (e) {
      char eb[128];
      regerror(e, &rx, eb, sizeof eb);
      rc = qc_err("%s: key 'split': regex '%s': %s", w, c->split_re, eb);
      qc_hint("a POSIX extended regex on the module path (a generated instance's path is its class name)");
      goto done;
    }
    regfree(&rx);
    if (c->cand == QC_CAND_PLUGIN) {
      rc = qc_err("%s: key 'split': a plugin candidate cannot be split across ranks", w);
      qc_hint("split modules run qatcheck's builtin candidate or the dump's gradients");
      goto done;
    }
    c->has_split = 1;
  }
  if ((v = cJSON_GetObjectItemCaseSensitive(root, "variants")) && (rc = parse_variants(v, w, &c->variants_off))) goto done;
  if ((v = cJSON_GetObjectItemCaseSensitive(root, "dy"))) {
    if (!cJSON_IsArray(v)) { rc = qc_err("%s: key 'dy': expected an array of names", w); goto done; }
    if (cJSON_GetArraySize(v) > QC_MAX_DY) { rc = qc_err("%s: key 'dy': at most %d entries", w, QC_MAX_DY); goto done; }
    for (const cJSON *d = v->child; d; d = d->next) {
      if ((rc = get_string(d, w, "dy", c->dy[c->ndy], sizeof c->dy[0]))) goto done;
      for (int i = 0; i < c->ndy; i++)
        if (strcmp(c->dy[i], c->dy[c->ndy]) == 0) { rc = qc_err("%s: key 'dy': '%s' is listed twice", w, c->dy[i]); goto done; }
      if (c->data == QC_DATA_GENERATE && strcmp(c->dy[c->ndy], "random") && strcmp(c->dy[c->ndy], "zero") &&
          strcmp(c->dy[c->ndy], "sparse") && strcmp(c->dy[c->ndy], "ones")) {
        rc = qc_err("%s: key 'dy': '%s' is not a generated kind", w, c->dy[c->ndy]);
        qc_hint("generated dY kinds: random, zero, sparse, ones");
        goto done;
      }
      c->ndy++;
    }
    if (c->ndy == 0) { rc = qc_err("%s: key 'dy': empty list: nothing to check", w); goto done; }
  }
  v = cJSON_GetObjectItemCaseSensitive(root, "tolerances");
  if (!v) {
    rc = qc_err("%s: key 'tolerances' is missing: every checked tensor needs a tolerance declared in advance", w);
    qc_hint("run 'qatcheck tol' to derive them with their reasoning");
    goto done;
  }
  if (!cJSON_IsObject(v) || !v->child) { rc = qc_err("%s: key 'tolerances': expected a non-empty object of tensors", w); goto done; }
  if ((rc = parse_tols(v, w, "", c))) goto done;
  for (const cJSON *t = v->child; t; t = t->next) {
    const qc_registry_row *row = qc_registry_find(t->string);
    if (!row) continue; /* a tensor, parsed above */
    char cw[320];
    snprintf(cw, sizeof cw, "%s: tolerances.%s", w, t->string);
    if (!cJSON_IsObject(t) || !t->child) {
      rc = qc_err("%s: expected an object of the class's tensors' tolerances ({\"d_x\": {...}})", cw);
      goto done;
    }
    for (const cJSON *g = t->child; g; g = g->next)
      if (!qc_class_has_grad(row->cls, g->string)) {
        rc = qc_err("%s: class '%s' has no gradient '%s'", cw, t->string, g->string);
        qc_hint("the gradients of class %s are %s (names are case-sensitive)", t->string, row->cls->grads);
        goto done;
      }
    if ((rc = parse_tols(t, cw, t->string, c))) goto done;
  }
  lint(c, w);
done:
  cJSON_Delete(root);
  return rc;
}

int qc_case_load(const char *path, qc_case *c) {
  char *buf = NULL;
  size_t n = 0;
  int rc = qc_read_file(path, "case", 64u << 20, &buf, &n); /* a FIFO or device is refused unopened */
  if (rc) return rc;
  char dir[1024];
  if (strlen(path) >= sizeof dir) {
    free(buf);
    return qc_err("case '%.60s...': path longer than %zu characters", path, sizeof dir - 1);
  }
  snprintf(dir, sizeof dir, "%s", path);
  char *s = strrchr(dir, '/');
  if (s) *s = 0; else snprintf(dir, sizeof dir, ".");
  rc = qc_case_parse(buf, path, dir, c);
  if (!rc) qc_sha256_hex(buf, n, c->sha256);
  free(buf);
  return rc;
}

const qc_tol *qc_case_tol_for(const qc_case *c, const char *cls, const char *tensor) {
  const qc_tol *dflt = NULL;
  for (int i = 0; i < c->ntol; i++)
    if (strcmp(c->tol[i].tensor, tensor) == 0) {
      if (cls && c->tol[i].cls[0] && strcmp(c->tol[i].cls, cls) == 0) return &c->tol[i].tol;
      if (!c->tol[i].cls[0]) dflt = &c->tol[i].tol;
    }
  return dflt;
}
