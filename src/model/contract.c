/* contract.c: the flat contract map (see contract.h). */
#include "model/contract.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/qc.h"

const qc_kv *qc_contract_get(const qc_contract *c, const char *key) {
  for (int i = 0; i < c->n; i++)
    if (strcmp(c->kv[i].key, key) == 0) return &c->kv[i];
  return NULL;
}

int qc_contract_has(const qc_contract *c, const char *key) { return qc_contract_get(c, key) != NULL; }

const char *qc_contract_str(const qc_contract *c, const char *key, const char *dflt) {
  const qc_kv *kv = qc_contract_get(c, key);
  return kv && kv->str[0] ? kv->str : dflt;
}

double qc_contract_num(const qc_contract *c, const char *key, double dflt) {
  const qc_kv *kv = qc_contract_get(c, key);
  return kv && kv->has_num ? kv->num : dflt;
}

int qc_contract_set(qc_contract *c, const char *key, const char *str, double num, int has_num) {
  qc_kv *kv = (qc_kv *)qc_contract_get(c, key);
  if (str && strlen(str) >= sizeof kv->str)
    return qc_err("contract key '%s': value '%.40s...' is longer than %d characters", key, str, (int)sizeof kv->str - 1);
  if (!kv) {
    if (c->n == QC_MAX_KV) return qc_err("contract: more than %d keys", QC_MAX_KV);
    kv = &c->kv[c->n++];
    snprintf(kv->key, sizeof kv->key, "%s", key);
  }
  snprintf(kv->str, sizeof kv->str, "%s", str ? str : "");
  kv->num = num;
  kv->has_num = has_num;
  return QC_OK;
}

int qc_contract_merge(qc_contract *c, const qc_contract *over) {
  for (int i = 0; i < over->n; i++) {
    const qc_kv *kv = &over->kv[i];
    int rc = qc_contract_set(c, kv->key, kv->str, kv->num, kv->has_num);
    if (rc) return rc;
  }
  return QC_OK;
}

/* 1 if s is one of the '|'-separated words of list; *takes_num set when the
 * matching word is written "{word}". */
static int in_list(const char *list, const char *s, int *takes_num) {
  const char *p = list;
  size_t sl = strlen(s);
  while (*p) {
    const char *e = strchr(p, '|');
    size_t wl = e ? (size_t)(e - p) : strlen(p);
    int braced = wl >= 2 && p[0] == '{' && p[wl - 1] == '}';
    const char *w = braced ? p + 1 : p;
    size_t l = braced ? wl - 2 : wl;
    if (l == sl && strncmp(w, s, l) == 0) { *takes_num = braced; return 1; }
    if (!e) break;
    p = e + 1;
  }
  return 0;
}

const qc_key_spec qc_common_keys[] = {
    {"compute_dtype", "float32|bfloat16", "float32",
     "the dtype the module's own arithmetic rounds its intermediate results to: bfloat16 in a pure-bf16 model "
     "(every elementwise op and matmul rounds its result), float32 where it computes in float32"},
    {NULL, NULL, NULL, NULL}};

int qc_contract_bf16_compute(const qc_contract *c) {
  return strcmp(qc_contract_str(c, "compute_dtype", "float32"), "bfloat16") == 0;
}

int qc_contract_validate(qc_contract *c, const qc_key_spec *spec, const char *where) {
  for (int i = 0; i < c->n; i++) {
    const qc_kv *kv = &c->kv[i];
    const qc_key_spec *s = spec;
    while (s && s->key && strcmp(s->key, kv->key) != 0) s++;
    if (!s || !s->key) /* not the class's own: one of every class's */
      for (s = qc_common_keys; s->key && strcmp(s->key, kv->key) != 0; s++) {}
    if (!s || !s->key) {
      qc_err("%s: unknown contract key '%s'", where, kv->key);
      char keys[512] = "";
      for (const qc_key_spec *k = spec; k && k->key; k++) {
        strncat(keys, k == spec ? "" : ", ", sizeof keys - strlen(keys) - 1);
        strncat(keys, k->key, sizeof keys - strlen(keys) - 1);
      }
      for (const qc_key_spec *k = qc_common_keys; k->key; k++) {
        strncat(keys, keys[0] ? ", " : "", sizeof keys - strlen(keys) - 1);
        strncat(keys, k->key, sizeof keys - strlen(keys) - 1);
      }
      qc_hint("this class takes: %s", keys);
      return QC_EINPUT;
    }
    if (!s->values) {
      if (!kv->has_num || kv->str[0])
        return qc_err("%s: contract key '%s': expected a number", where, kv->key);
      continue;
    }
    if (strcmp(s->values, QC_KEY_STRING) == 0) {
      if (!kv->str[0] || kv->has_num)
        return qc_err("%s: contract key '%s': expected a non-empty string", where, kv->key);
      continue;
    }
    int takes_num = 0;
    if (!kv->str[0] || !in_list(s->values, kv->str, &takes_num)) {
      qc_err("%s: contract key '%s': value '%s' is not allowed", where, kv->key,
             kv->str[0] ? kv->str : "(number)");
      qc_hint("'%s' takes one of: %s", kv->key, s->values);
      return QC_EINPUT;
    }
    if (takes_num && !kv->has_num)
      return qc_err("%s: contract key '%s': '%s' needs a number, as {\"%s\": N}", where, kv->key, kv->str, kv->str);
  }
  for (const qc_key_spec *s = spec; s && s->key; s++) {
    if (qc_contract_has(c, s->key) || !s->dflt) continue;
    if (!s->values) {
      int rc = qc_contract_set(c, s->key, "", strtod(s->dflt, NULL), 1);
      if (rc) return rc;
    } else {
      int rc = qc_contract_set(c, s->key, s->dflt, 0, 0);
      if (rc) return rc;
    }
  }
  return QC_OK;
}

char *qc_contract_json(const qc_contract *c, char *buf, int n) {
  int o = snprintf(buf, (size_t)n, "{");
  for (int i = 0; i < c->n && o < n; i++) {
    const qc_kv *kv = &c->kv[i];
    const char *sep = i ? ", " : "";
    if (kv->str[0] && kv->has_num)
      o += snprintf(buf + o, (size_t)(n - o), "%s\"%s\": {\"%s\": %.17g}", sep, kv->key, kv->str, kv->num);
    else if (kv->str[0])
      o += snprintf(buf + o, (size_t)(n - o), "%s\"%s\": \"%s\"", sep, kv->key, kv->str);
    else
      o += snprintf(buf + o, (size_t)(n - o), "%s\"%s\": %.17g", sep, kv->key, kv->num);
  }
  if (o < n) snprintf(buf + o, (size_t)(n - o), "}");
  return buf;
}

/* A whole number in [0, 2^32) from SR key `key` into *out (absent: 0). */
static int sr_u32(const qc_contract *c, const char *path, const char *key, uint32_t *out) {
  const qc_kv *kv = qc_contract_get(c, key);
  *out = 0;
  if (!kv) return QC_OK;
  if (!kv->has_num || kv->str[0] || !(kv->num >= 0 && kv->num <= 4294967295.0 && kv->num == floor(kv->num)))
    return qc_err("module '%s': contract key '%s': expected a whole number from 0 to 2^32-1", path, key);
  *out = (uint32_t)kv->num;
  return QC_OK;
}

int qc_sr_from_contract(const qc_contract *c, const char *module_path, qc_sr *out) {
  static const char *keys[] = {"sr_salt", "sr_step", "sr_expert"};
  const qc_kv *rd = qc_contract_get(c, "rounding");
  const int sr = rd && strcmp(rd->str, "sr") == 0;
  memset(out, 0, sizeof *out);
  for (int i = 0; i < 3 && !sr; i++)
    if (qc_contract_has(c, keys[i]))
      return qc_err("module '%s': contract key '%s' belongs to stochastic rounding, but the contract's rounding is '%s': "
                    "expected \"rounding\": {\"sr\": {\"seed\": S}} beside it, or no %s",
                    module_path, keys[i], rd && rd->str[0] ? rd->str : "rn", keys[i]);
  if (!sr) return QC_OK;
  const qc_kv *salt = qc_contract_get(c, "sr_salt");
  uint32_t step, expert;
  int rc;
  if (salt && (!salt->str[0] || salt->has_num))
    return qc_err("module '%s': contract key 'sr_salt': expected the parameter's identity as a non-empty string "
                  "(its name, e.g. \"model.embed_tokens.weight\")", module_path);
  if ((rc = sr_u32(c, module_path, "sr_step", &step)) || (rc = sr_u32(c, module_path, "sr_expert", &expert))) return rc;
  out->on = 1;
  out->seed = (uint64_t)rd->num;
  out->salt = salt ? qc_sr_salt_id(salt->str) : qc_sr_salt_path(module_path, "weight");
  out->step = step;
  out->expert = expert;
  return QC_OK;
}
