/* config.c: an arm's config, JSON or YAML (told by content: a JSON object
 * parses as JSON; everything else goes to libyaml), and the controlled
 * variables looked up in it (see l3log.h). A YAML document becomes the tree
 * JSON would give (plain scalars resolved as YAML 1.1 and PyYAML do: null,
 * ~ and empty are null; true/false/yes/no/on/off booleans; numbers,
 * .inf and .nan numbers; quoted scalars stay strings). Each value is kept
 * as canonical JSON text: objects with sorted keys, numbers in their
 * shortest round-trip form, so equal values have equal texts. */
#include <cJSON.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <yaml.h>

#include "core/qc.h"
#include "core/file.h"
#include "io/l3log.h"
#include "io/log_priv.h"

#define MAX_DEPTH 64                  /* nesting levels: real trainer configs use under 10 */
#define MAX_NODES 250000              /* values after alias expansion: real configs hold a few thousand */
#define MAX_CONFIG ((size_t)4 << 20)  /* bytes: real configs are under 100 KB */

/* ---- YAML to a cJSON tree ------------------------------------------------------------ */

static int in_list(const char *s, const char *const *l) {
  for (; *l; l++)
    if (strcmp(s, *l) == 0) return 1;
  return 0;
}

static cJSON *yaml_scalar(const yaml_node_t *n) {
  const char *s = (const char *)n->data.scalar.value;
  if (n->data.scalar.style != YAML_PLAIN_SCALAR_STYLE) return cJSON_CreateString(s);
  static const char *const nul[] = {"", "~", "null", "Null", "NULL", NULL};
  static const char *const yes[] = {"true", "True", "TRUE", "yes", "Yes", "YES", "on", "On", "ON", NULL};
  static const char *const no[] = {"false", "False", "FALSE", "no", "No", "NO", "off", "Off", "OFF", NULL};
  if (in_list(s, nul)) return cJSON_CreateNull();
  if (in_list(s, yes)) return cJSON_CreateTrue();
  if (in_list(s, no)) return cJSON_CreateFalse();
  if (strcasecmp(s, ".inf") == 0 || strcasecmp(s, "+.inf") == 0) return cJSON_CreateNumber(INFINITY);
  if (strcasecmp(s, "-.inf") == 0) return cJSON_CreateNumber(-INFINITY);
  if (strcasecmp(s, ".nan") == 0) return cJSON_CreateNumber(NAN);
  double v;
  const char *e = s + strlen(s), *p = s + (*s == '+');
  if (e > p && qc_num_parse(p, e, &v) == e) return cJSON_CreateNumber(v);
  return cJSON_CreateString(s);
}

/* The conversion's budget: nodes left to make (each alias expands again). */
typedef struct {
  long left;
  int deep, big; /* which limit stopped it */
} ybudget;

/* The cJSON tree of node n, or NULL: a non-scalar key, more than MAX_DEPTH
 * levels (b->deep) or more than MAX_NODES values once aliases are
 * expanded (b->big: a 478-byte alias bomb would otherwise grow without
 * bound), or out of memory. */
static cJSON *yaml_node(yaml_document_t *doc, yaml_node_t *n, int depth, ybudget *b) {
  if (!n) return NULL;
  if (depth > MAX_DEPTH) { b->deep = 1; return NULL; }
  if (--b->left < 0) { b->big = 1; return NULL; }
  switch (n->type) {
    case YAML_SCALAR_NODE: return yaml_scalar(n);
    case YAML_SEQUENCE_NODE: {
      cJSON *a = cJSON_CreateArray();
      for (yaml_node_item_t *it = n->data.sequence.items.start; a && it < n->data.sequence.items.top; it++) {
        cJSON *c = yaml_node(doc, yaml_document_get_node(doc, *it), depth + 1, b);
        if (!c) { cJSON_Delete(a); return NULL; }
        cJSON_AddItemToArray(a, c);
      }
      return a;
    }
    case YAML_MAPPING_NODE: {
      cJSON *o = cJSON_CreateObject();
      for (yaml_node_pair_t *pr = n->data.mapping.pairs.start; o && pr < n->data.mapping.pairs.top; pr++) {
        yaml_node_t *k = yaml_document_get_node(doc, pr->key);
        if (!k || k->type != YAML_SCALAR_NODE) { cJSON_Delete(o); return NULL; }
        cJSON *c = yaml_node(doc, yaml_document_get_node(doc, pr->value), depth + 1, b);
        if (!c) { cJSON_Delete(o); return NULL; }
        cJSON_DeleteItemFromObjectCaseSensitive(o, (const char *)k->data.scalar.value); /* a repeated key: the last wins */
        cJSON_AddItemToObject(o, (const char *)k->data.scalar.value, c);
      }
      return o;
    }
    default: return NULL;
  }
}

/* Walk the text's events before libyaml builds the document: QC_EINPUT
 * naming the line where nesting passes MAX_DEPTH or the values pass
 * MAX_NODES (a 100,000-deep document is refused at level 65, not after
 * minutes in the loader); QC_OK otherwise, syntax errors included (the
 * loader reports those). */
static int yaml_prescan(const char *buf, size_t n, const char *name) {
  yaml_parser_t ps;
  yaml_event_t ev;
  if (!yaml_parser_initialize(&ps)) return qc_err_sys("out of memory starting the YAML parser");
  yaml_parser_set_input_string(&ps, (const unsigned char *)buf, n);
  int rc = QC_OK, depth = 0;
  long nodes = 0;
  for (;;) {
    if (!yaml_parser_parse(&ps, &ev)) break; /* a syntax error: the loader names it */
    yaml_event_type_t t = ev.type;
    unsigned long line = (unsigned long)ev.start_mark.line + 1;
    yaml_event_delete(&ev);
    if (t == YAML_STREAM_END_EVENT) break;
    if (t == YAML_SEQUENCE_START_EVENT || t == YAML_MAPPING_START_EVENT) depth++;
    if (t == YAML_SEQUENCE_END_EVENT || t == YAML_MAPPING_END_EVENT) depth--;
    if (t == YAML_SEQUENCE_START_EVENT || t == YAML_MAPPING_START_EVENT || t == YAML_SCALAR_EVENT || t == YAML_ALIAS_EVENT) nodes++;
    if (depth > MAX_DEPTH) {
      rc = qc_err("config '%s': YAML nested deeper than %d levels at line %lu: refused", name, MAX_DEPTH, line);
      break;
    }
    if (nodes > MAX_NODES) {
      rc = qc_err("config '%s': YAML with more than %d values (line %lu): refused", name, MAX_NODES, line);
      break;
    }
  }
  yaml_parser_delete(&ps);
  return rc;
}

static int parse_yaml(const char *buf, size_t n, const char *name, cJSON **out) {
  yaml_parser_t ps;
  yaml_document_t doc;
  *out = NULL;
  int rc = yaml_prescan(buf, n, name);
  if (rc) return rc;
  if (!yaml_parser_initialize(&ps)) return qc_err_sys("out of memory starting the YAML parser");
  yaml_parser_set_input_string(&ps, (const unsigned char *)buf, n);
  if (!yaml_parser_load(&ps, &doc)) {
    rc = qc_err("config '%s': not JSON, and not YAML: %s at line %lu", name, ps.problem ? ps.problem : "a syntax error",
                (unsigned long)ps.problem_mark.line + 1);
    yaml_parser_delete(&ps);
    return rc;
  }
  ybudget b = {.left = MAX_NODES};
  yaml_node_t *root = yaml_document_get_root_node(&doc);
  if (!root) rc = qc_err("config '%s': an empty document", name);
  else if (root->type != YAML_MAPPING_NODE) rc = qc_err("config '%s': expected a mapping (key: value) at the top", name);
  else if (!(*out = yaml_node(&doc, root, 0, &b))) {
    if (b.big)
      rc = qc_err("config '%s': YAML whose aliases expand to more than %d values: refused (an alias bomb?)", name, MAX_NODES);
    else if (b.deep)
      rc = qc_err("config '%s': YAML nested deeper than %d levels once aliases are expanded: refused", name, MAX_DEPTH);
    else
      rc = qc_err("config '%s': a YAML structure qatcheck cannot read (a key that is not a scalar)", name);
  }
  yaml_document_delete(&doc);
  yaml_parser_delete(&ps);
  return rc;
}

/* ---- canonical text ------------------------------------------------------------------------ */

/* A growable string (io/ does not use report/'s). */
typedef struct {
  char *s;
  size_t n, cap;
  int oom;
} tbuf;

static void tput(tbuf *b, const char *s, size_t k) {
  if (b->oom) return;
  if (b->n + k + 1 > b->cap) {
    size_t cap = b->cap ? b->cap : 64;
    while (cap < b->n + k + 1) cap *= 2;
    char *ns = realloc(b->s, cap);
    if (!ns) { b->oom = 1; return; }
    b->s = ns;
    b->cap = cap;
  }
  memcpy(b->s + b->n, s, k);
  b->n += k;
  b->s[b->n] = 0;
}

static void tputs(tbuf *b, const char *s) { tput(b, s, strlen(s)); }

static void put_num(tbuf *b, double v) {
  if (isnan(v)) { tputs(b, "NaN"); return; }
  if (isinf(v)) { tputs(b, v > 0 ? "Infinity" : "-Infinity"); return; }
  char t[40];
  snprintf(t, sizeof t, "%.15g", v);
  if (strtod(t, NULL) != v) snprintf(t, sizeof t, "%.17g", v);
  tputs(b, t);
}

static void put_str(tbuf *b, const char *s) {
  char t[8];
  tputs(b, "\"");
  for (const unsigned char *p = (const unsigned char *)s; *p; p++) {
    if (*p == '"' || *p == '\\') { t[0] = '\\'; t[1] = (char)*p; tput(b, t, 2); }
    else if (*p < 0x20) { snprintf(t, sizeof t, "\\u%04x", *p); tputs(b, t); }
    else tput(b, (const char *)p, 1);
  }
  tputs(b, "\"");
}

static int cmp_items(const void *a, const void *b) {
  return strcmp((*(const cJSON *const *)a)->string, (*(const cJSON *const *)b)->string);
}

static void canon(tbuf *b, const cJSON *v) {
  if (cJSON_IsNull(v)) tputs(b, "null");
  else if (cJSON_IsTrue(v)) tputs(b, "true");
  else if (cJSON_IsFalse(v)) tputs(b, "false");
  else if (cJSON_IsNumber(v)) put_num(b, v->valuedouble);
  else if (cJSON_IsString(v)) put_str(b, v->valuestring);
  else if (cJSON_IsArray(v)) {
    tputs(b, "[");
    for (const cJSON *c = v->child; c; c = c->next) {
      canon(b, c);
      if (c->next) tputs(b, ",");
    }
    tputs(b, "]");
  } else if (cJSON_IsObject(v)) {
    int n = cJSON_GetArraySize(v), i = 0;
    const cJSON **it = malloc((size_t)(n ? n : 1) * sizeof *it);
    if (!it) { b->oom = 1; return; }
    for (const cJSON *c = v->child; c; c = c->next) it[i++] = c;
    qsort(it, (size_t)n, sizeof *it, cmp_items);
    tputs(b, "{");
    for (i = 0; i < n; i++) {
      put_str(b, it[i]->string);
      tputs(b, ":");
      canon(b, it[i]);
      if (i + 1 < n) tputs(b, ",");
    }
    tputs(b, "}");
    free(it);
  }
}

/* The value at `path` under obj: a key equal to the rest of the path first,
 * then every split at a dot (a key may itself hold dots); a number indexes
 * an array. NULL when absent. */
static const cJSON *lookup(const cJSON *obj, const char *path, int depth) {
  if (depth > MAX_DEPTH || !obj) return NULL;
  if (cJSON_IsObject(obj)) {
    const cJSON *hit = cJSON_GetObjectItemCaseSensitive(obj, path);
    if (hit) return hit;
  }
  for (const char *d = strchr(path, '.'); d; d = strchr(d + 1, '.')) {
    char head[QC_L3_NAME];
    size_t k = (size_t)(d - path);
    if (k >= sizeof head) break;
    memcpy(head, path, k);
    head[k] = 0;
    const cJSON *c = NULL;
    if (cJSON_IsObject(obj)) c = cJSON_GetObjectItemCaseSensitive(obj, head);
    else if (cJSON_IsArray(obj)) {
      char *end;
      long i = strtol(head, &end, 10);
      if (!*end && end != head && i >= 0) c = cJSON_GetArrayItem(obj, (int)i);
    }
    const cJSON *r = c ? lookup(c, d + 1, depth + 1) : NULL;
    if (r) return r;
  }
  return NULL;
}

int qc_config_parse(const char *buf, size_t n, const char *name, const qc_l3_keypath *keys, int nkeys, qc_l3_config *out) {
  memset(out, 0, sizeof *out);
  snprintf(out->path, sizeof out->path, "%s", name);
  cJSON *root = NULL;
  int rc = QC_OK;
  const char *p = qc_js_ws(buf, buf + n);
  if (p < buf + n && *p == '{') {
    const char *end = NULL;
    root = cJSON_ParseWithLengthOpts(buf, n, &end, 0); /* the buffer need not end in a NUL */
    if (!root) {
      rc = qc_err("config '%s': malformed JSON near line %ld", name, end ? qc_line_of(buf, end) : 1L);
      goto done;
    }
    if (qc_js_ws(end, buf + n) != buf + n) { rc = qc_err("config '%s': text after the JSON object", name); goto done; }
  } else if ((rc = parse_yaml(buf, n, name, &root))) goto done;
  if (!cJSON_IsObject(root)) { rc = qc_err("config '%s': expected an object at the top", name); goto done; }
  if (!(out->v = calloc((size_t)(nkeys ? nkeys : 1), sizeof *out->v))) { rc = qc_err_sys("out of memory reading config '%s'", name); goto done; }
  out->n = nkeys;
  for (int i = 0; i < nkeys; i++) {
    qc_l3_cfgval *v = &out->v[i];
    snprintf(v->key, sizeof v->key, "%s", keys[i].key);
    snprintf(v->path, sizeof v->path, "%s", keys[i].path[0] ? keys[i].path : keys[i].key);
    const cJSON *hit = lookup(root, v->path, 0);
    if (!hit) continue;
    tbuf b = {0};
    canon(&b, hit);
    if (b.oom) { free(b.s); rc = qc_err_sys("out of memory reading config '%s'", name); goto done; }
    v->json = b.s ? b.s : strdup("null");
    v->present = 1;
  }
done:
  cJSON_Delete(root);
  if (rc) qc_l3_config_free(out);
  return rc;
}

int qc_config_read(const char *path, const qc_l3_keypath *keys, int nkeys, qc_l3_config *out) {
  char *buf;
  size_t n;
  memset(out, 0, sizeof *out);
  int rc = qc_read_file(path, "config", MAX_CONFIG, &buf, &n);
  if (rc) return rc;
  rc = qc_config_parse(buf, n, path, keys, nkeys, out);
  free(buf);
  return rc;
}
