/* qconfig.c: each linear's deployed weight format from a checkpoint's
 * quantization config (the `quantization_config` object of a Hugging Face
 * config.json; docs/contract.md, "Each layer's deployed format"). Two
 * producers' schemas are read, each as its own source defines it:
 *
 * - quant_method "fp8": transformers v5.23.0, utils/quantization_config.py
 *   FineGrainedFP8Config (weight_block_size, default (128, 128); scale_fmt
 *   "float" | "ue8m0"; modules_to_not_convert, alias ignored_layers;
 *   expert_dtype "fp8" | "fp4"), the modules left out matched as
 *   quantizers/quantizers_utils.py should_convert_module does: a pattern
 *   matches from the start of the name up to a module boundary, as a
 *   regex, or as a suffix of the name.
 * - quant_method "compressed-tensors": compressed-tensors
 *   (vllm-project/compressed-tensors at 7049147e),
 *   quantization/quant_config.py (config_groups: {name: {targets, weights,
 *   input_activations}}, ignore) and quantization/quant_args.py (num_bits,
 *   type, strategy, group_size, block_structure); targets and ignore
 *   matched as utils/match.py _match_name / _match_class do: "re:<regex>"
 *   with re.match (anchored at the start), else the exact module name, or
 *   the class name "Linear", which every module of the sweep is. Of the
 *   groups that target a module, the most specific wins (exact name, then
 *   regex, then class: the order of match_targets).
 *
 * Python regexes are compiled as POSIX extended ones: the common patterns
 * ("re:.*mlp.gate$", "layers.*") mean the same; one that does not compile is
 * refused naming it. */
#include <cJSON.h>
#include <regex.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/file.h"
#include "core/qc.h"
#include "sweep/plan.h"

#define MAX_CONFIG ((size_t)4 << 20)

void qc_sweep_qconfig_close(sw_qconfig *c) {
  cJSON_Delete(c->root);
  memset(c, 0, sizeof *c);
}

int qc_sweep_qconfig_open(const char *file, sw_qconfig *c) {
  char *buf = NULL;
  size_t len = 0;
  int rc;
  memset(c, 0, sizeof *c);
  if (!file) return QC_OK;
  snprintf(c->file, sizeof c->file, "%s", file);
  if ((rc = qc_read_file(file, "quantization config", MAX_CONFIG, &buf, &len))) return rc;
  c->root = cJSON_ParseWithLength(buf, len);
  free(buf);
  if (!c->root || !cJSON_IsObject(c->root))
    return qc_err("quantization config '%s': not a JSON object (expected a Hugging Face config.json)", file);
  const cJSON *q = cJSON_GetObjectItemCaseSensitive(c->root, "quantization_config");
  if (!q) q = c->root->child && cJSON_GetObjectItemCaseSensitive(c->root, "quant_method") ? c->root : NULL; /* the object alone */
  if (!q) return QC_OK; /* a master's config: no deployed formats */
  const cJSON *m = cJSON_GetObjectItemCaseSensitive(q, "quant_method");
  if (!cJSON_IsObject(q) || !cJSON_IsString(m))
    return qc_err("quantization config '%s': quantization_config has no string 'quant_method'", file);
  if (strcmp(m->valuestring, "fp8") != 0 && strcmp(m->valuestring, "compressed-tensors") != 0)
    return qc_err("quantization config '%s': quant_method '%s' is not read: expected 'fp8' (transformers "
                  "FineGrainedFP8Config) or 'compressed-tensors'", file, m->valuestring);
  snprintf(c->method, sizeof c->method, "%s", m->valuestring);
  c->q = q;
  return QC_OK;
}

/* Does POSIX ERE `re` match `name` from its start, its match ending where
 * `tail` allows (tail NULL: anywhere)? Compiles "^(re)tail". */
static int pat_match(const sw_qconfig *c, const char *re, const char *tail, const char *name, int *hit) {
  char pat[1024];
  regex_t r;
  if (snprintf(pat, sizeof pat, "^(%s)%s", re, tail ? tail : "") >= (int)sizeof pat)
    return qc_err("quantization config '%s': pattern '%s' is too long", c->file, re);
  int e = regcomp(&r, pat, REG_EXTENDED | REG_NOSUB);
  if (e) {
    char msg[128];
    regerror(e, &r, msg, sizeof msg);
    return qc_err("quantization config '%s': pattern '%s' is no POSIX extended regex: %s", c->file, re, msg);
  }
  *hit = regexec(&r, name, 0, NULL, 0) == 0;
  regfree(&r);
  return QC_OK;
}

/* transformers' should_convert_module: does `key` leave module `name` out?
 * A match from the start ending at a module boundary (the end, before a
 * '.', or after one), or a suffix of the name. */
static int fp8_left_out(const sw_qconfig *c, const char *key, const char *name, int *hit) {
  size_t kl = strlen(key), nl = strlen(name);
  int rc;
  *hit = nl >= kl && strcmp(name + nl - kl, key) == 0;
  if (*hit) return QC_OK;
  if ((rc = pat_match(c, key, "($|\\.)", name, hit)) || *hit) return rc;
  if (kl && key[kl - 1] == '.') return pat_match(c, key, NULL, name, hit);
  return QC_OK;
}

/* compressed-tensors' _match_name / _match_class for one target: 3 exact
 * name, 2 regex, 1 the class "Linear", 0 no match. */
static int ct_match(const sw_qconfig *c, const char *t, const char *name, int *how) {
  int hit = 0, rc;
  *how = 0;
  if (strncmp(t, "re:", 3) == 0) {
    if ((rc = pat_match(c, t + 3, NULL, name, &hit))) return rc;
    *how = hit ? 2 : 0;
  } else if (strcmp(t, name) == 0) {
    *how = 3;
  } else if (strcmp(t, "Linear") == 0) {
    *how = 1;
  }
  return QC_OK;
}

/* Best match of `name` in a JSON list of targets (0: none); *which the target. */
static int ct_best(const sw_qconfig *c, const cJSON *list, const char *what, const char *name, int *best,
                   const char **which) {
  const cJSON *t;
  int rc, how;
  *best = 0;
  if (!list) return QC_OK;
  if (!cJSON_IsArray(list)) return qc_err("quantization config '%s': '%s' is not a list of strings", c->file, what);
  cJSON_ArrayForEach(t, list) {
    if (!cJSON_IsString(t)) return qc_err("quantization config '%s': '%s' holds a non-string", c->file, what);
    if ((rc = ct_match(c, t->valuestring, name, &how))) return rc;
    if (how > *best) { *best = how; *which = t->valuestring; }
  }
  return QC_OK;
}

static int num(const cJSON *o, const char *k, double dflt) {
  const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, k);
  return cJSON_IsNumber(v) ? v->valueint : (int)dflt;
}

static const char *str(const cJSON *o, const char *k, const char *dflt) {
  const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, k);
  return cJSON_IsString(v) ? v->valuestring : dflt;
}

/* The qatcheck format of a compressed-tensors QuantizationArgs (weights). */
static const char *ct_format(const cJSON *w) {
  const char *type = str(w, "type", "int"), *strat = str(w, "strategy", "");
  const int bits = num(w, "num_bits", 8), gs = num(w, "group_size", 0);
  const cJSON *bs = cJSON_GetObjectItemCaseSensitive(w, "block_structure");
  if (strcmp(type, "float") != 0) return NULL;
  if (bits == 8) {
    if (!strcmp(strat, "tensor")) return "fp8_tensor";
    if (!strcmp(strat, "channel")) return "fp8_channel";
    if (!strcmp(strat, "block") && cJSON_GetArraySize(bs) == 2 && cJSON_GetArrayItem(bs, 0)->valueint == 128 &&
        cJSON_GetArrayItem(bs, 1)->valueint == 128)
      return "fp8_block128";
    if (!strcmp(strat, "group") && gs == 32) return "mxfp8";
  } else if (bits == 4) {
    if (!strcmp(strat, "tensor_group") && gs == 16) return "nvfp4";
    if (!strcmp(strat, "group") && gs == 32) return "mxfp4";
  }
  return NULL;
}

static int ct_format_of(const sw_qconfig *c, const char *name, char *fmt, size_t fn, char *why, size_t wn) {
  const char *which = NULL, *gname = NULL;
  int best, rc, gbest = 0;
  const cJSON *g, *groups = cJSON_GetObjectItemCaseSensitive(c->q, "config_groups"), *gw = NULL;
  if ((rc = ct_best(c, cJSON_GetObjectItemCaseSensitive(c->q, "ignore"), "ignore", name, &best, &which))) return rc;
  if (best) {
    snprintf(fmt, fn, "none");
    snprintf(why, wn, "%s: compressed-tensors ignore '%s'", c->file, which);
    return QC_OK;
  }
  if (!cJSON_IsObject(groups)) return qc_err("quantization config '%s': compressed-tensors without an object 'config_groups'", c->file);
  cJSON_ArrayForEach(g, groups) {
    if ((rc = ct_best(c, cJSON_GetObjectItemCaseSensitive(g, "targets"), "targets", name, &best, &which))) return rc;
    if (best > gbest) { gbest = best; gname = g->string; gw = cJSON_GetObjectItemCaseSensitive(g, "weights"); }
  }
  if (!gbest) {
    snprintf(fmt, fn, "none");
    snprintf(why, wn, "%s: no compressed-tensors config group targets it", c->file);
    return QC_OK;
  }
  if (!gw || cJSON_IsNull(gw)) {
    snprintf(fmt, fn, "none");
    snprintf(why, wn, "%s: config group '%s' quantizes no weights", c->file, gname);
    return QC_OK;
  }
  const char *f = ct_format(gw);
  if (!f) {
    char *s = cJSON_PrintUnformatted(gw);
    qc_err("quantization config '%s': config group '%s' (module '%s') weights %s fit no qatcheck format: expected "
           "float 8-bit tensor|channel|block [128, 128]|group 32, or float 4-bit tensor_group 16|group 32",
           c->file, gname, name, s ? s : "?");
    free(s);
    return QC_EINPUT;
  }
  snprintf(fmt, fn, "%s", f);
  snprintf(why, wn, "%s: compressed-tensors config group '%s'", c->file, gname);
  return QC_OK;
}

static int fp8_format_of(const sw_qconfig *c, const char *name, char *fmt, size_t fn, char *why, size_t wn) {
  const cJSON *l = cJSON_GetObjectItemCaseSensitive(c->q, "modules_to_not_convert"), *k;
  int rc, hit;
  if (!l || cJSON_IsNull(l)) l = cJSON_GetObjectItemCaseSensitive(c->q, "ignored_layers");
  if (l && !cJSON_IsNull(l) && !cJSON_IsArray(l))
    return qc_err("quantization config '%s': modules_to_not_convert is not a list of strings", c->file);
  cJSON_ArrayForEach(k, l) {
    if (!cJSON_IsString(k)) return qc_err("quantization config '%s': modules_to_not_convert holds a non-string", c->file);
    if ((rc = fp8_left_out(c, k->valuestring, name, &hit))) return rc;
    if (hit) {
      snprintf(fmt, fn, "none");
      snprintf(why, wn, "%s: fp8 modules_to_not_convert '%s'", c->file, k->valuestring);
      return QC_OK;
    }
  }
  const cJSON *bs = cJSON_GetObjectItemCaseSensitive(c->q, "weight_block_size");
  const char *ed = str(c->q, "expert_dtype", "fp8"), *sf = str(c->q, "scale_fmt", "float");
  if (strcmp(ed, "fp8") != 0 && strstr(name, "experts"))
    return qc_err("quantization config '%s': expert_dtype '%s' (module '%s') is not read: expected 'fp8'", c->file, ed, name);
  if (cJSON_IsNull(bs)) {
    snprintf(fmt, fn, "fp8_tensor");
  } else if (!bs || (cJSON_GetArraySize(bs) == 2 && cJSON_GetArrayItem(bs, 0)->valueint == 128 &&
                     cJSON_GetArrayItem(bs, 1)->valueint == 128)) {
    snprintf(fmt, fn, "%s", strcmp(sf, "ue8m0") == 0 ? "fp8_block128_ue8m0" : "fp8_block128");
  } else {
    char *s = cJSON_PrintUnformatted(bs);
    qc_err("quantization config '%s': weight_block_size %s fits no qatcheck format: expected [128, 128] or null", c->file,
           s ? s : "?");
    free(s);
    return QC_EINPUT;
  }
  snprintf(why, wn, "%s: fp8 weight_block_size %s%s", c->file, cJSON_IsNull(bs) ? "null" : "[128, 128]",
           strcmp(sf, "ue8m0") == 0 ? ", scale_fmt ue8m0" : "");
  return QC_OK;
}

int qc_sweep_qconfig_format(const sw_qconfig *c, const char *path, char *fmt, size_t fn, char *why, size_t wn) {
  const char *name = path[0] == '/' ? path + 1 : path;
  if (!c->q) return qc_err("internal: no quantization config");
  if (!strcmp(c->method, "fp8")) return fp8_format_of(c, name, fmt, fn, why, wn);
  return ct_format_of(c, name, fmt, fn, why, wn);
}
