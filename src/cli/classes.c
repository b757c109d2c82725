/* classes.c: `qatcheck classes [--json]`: every module class, printed from
 * its row in the class table (src/classes/registry.c): its summary, the
 * tensors it models by role, the gradients its reference returns, its
 * contract keys with their defaults, the meaning of a generate shape, what
 * it leaves unchecked, the coverage items only some classes can show, and
 * its diagnosis hypotheses. Text for people; --json for scripts (the
 * gradient lists of scripts/qatdump_hf.py and the class tests come from
 * it: the class row is their one source). */
#include <cjson/cJSON.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli/cli.h"
#include "core/qc.h"
#include "model/modinfo.h"
#include "model/module.h"

static const char *const g_roles[] = {"inputs", "params", "saved", "outputs"};
#define NROLES 4

/* The verb's --help: what it prints and its options (p's table). */
static void help(const qc_opts *p) {
  printf("usage: qatcheck classes [--json]\n\n"
         "Lists every module class from its row in the class table: its summary, the tensors\n"
         "it models (inputs, params, saved, outputs), the gradients its reference returns,\n"
         "its contract keys with their defaults, what a generate shape row means, the shape\n"
         "`qatcheck fd` uses, what it deliberately leaves unchecked, the coverage items only\n"
         "some classes can show, and the diagnosis hypotheses that apply. --json prints the\n"
         "same as one JSON document for scripts (docs/interfaces.md, \"qatcheck classes\").\n\n");
  qc_opts_help(p->opt, 21);
  printf("exit status: 0 listed, 2 bad options\n");
}

/* Word k (0-based) of the space-separated list s into w (n bytes); 0 when
 * there are not that many words. */
static int word(const char *s, int k, char *w, size_t n) {
  for (int i = 0; s && *s; i++) {
    while (*s == ' ') s++;
    size_t len = strcspn(s, " ");
    if (!len) break;
    if (i == k) {
      snprintf(w, n, "%.*s", (int)len, s);
      return 1;
    }
    s += len;
  }
  return 0;
}

/* The names of role `role`'s tensors in a class's `tensors` ("inputs/x
 * params/weight"), ", "-separated into b (n bytes), or as JSON strings into
 * arr (when not NULL). */
static void role_names(const char *tensors, const char *role, char *b, size_t n, cJSON *arr) {
  char w[128];
  size_t k = 0, rl = strlen(role);
  if (b) b[0] = 0;
  for (int i = 0; word(tensors, i, w, sizeof w); i++) {
    if (strncmp(w, role, rl) != 0 || w[rl] != '/') continue;
    if (arr) cJSON_AddItemToArray(arr, cJSON_CreateString(w + rl + 1));
    if (b && k < n) k += (size_t)snprintf(b + k, n - k, "%s%s", k ? ", " : "", w + rl + 1);
  }
}

/* A contract key as JSON: key, its values ("a|b|{c}" as a list, {c} a
 * one-key object taking a number; null: a number), default, help. */
static cJSON *key_json(const qc_key_spec *k) {
  const int str = k->values && strcmp(k->values, QC_KEY_STRING) == 0; /* any string: "string" */
  cJSON *o = cJSON_CreateObject(), *v = str ? cJSON_CreateString("string") : k->values ? cJSON_CreateArray() : cJSON_CreateNull();
  for (const char *s = str ? NULL : k->values; s && *s;) {
    size_t len = strcspn(s, "|");
    char w[64];
    snprintf(w, sizeof w, "%.*s", (int)len, s);
    cJSON_AddItemToArray(v, cJSON_CreateString(w));
    s += len + (s[len] == '|');
  }
  cJSON_AddStringToObject(o, "key", k->key);
  cJSON_AddItemToObject(o, "values", v);
  cJSON_AddStringToObject(o, "default", k->dflt ? k->dflt : "");
  cJSON_AddStringToObject(o, "help", k->help ? k->help : "");
  return o;
}

/* The keys of a NULL-key-terminated spec list as a JSON array. */
static cJSON *keys_json(const qc_key_spec *k) {
  cJSON *a = cJSON_CreateArray();
  for (; k && k->key; k++) cJSON_AddItemToArray(a, key_json(k));
  return a;
}

/* Words of s as a JSON array of strings. */
static cJSON *words_json(const char *s) {
  cJSON *a = cJSON_CreateArray();
  char w[128];
  for (int i = 0; word(s, i, w, sizeof w); i++) cJSON_AddItemToArray(a, cJSON_CreateString(w));
  return a;
}

/* How class k shows coverage item c, into b: the item's words, then the
 * class's own. */
static void cov_how(const qc_class *k, int c, char *b, size_t n) {
  const qc_class_cov *e = qc_cov_class_item(k, c);
  const char *item = qc_coverage[c].how, *own = e ? e->how : NULL;
  snprintf(b, n, "%s%s%s", item ? item : "", item && own ? ": " : "", own ? own : "");
}

/* The class-specific coverage items row r names: item id, the list's
 * label, and how the class shows it (with the item's own words). */
static cJSON *coverage_json(const qc_registry_row *r) {
  cJSON *a = cJSON_CreateArray();
  for (int c = 0; c < QC_COV_COUNT; c++) {
    if (!qc_coverage[c].per_class || !qc_cov_class_item(r->cls, c)) continue;
    char how[1024];
    cov_how(r->cls, c, how, sizeof how);
    cJSON *o = cJSON_CreateObject();
    cJSON_AddStringToObject(o, "item", qc_coverage[c].id);
    cJSON_AddStringToObject(o, "label", qc_coverage[c].label);
    cJSON_AddStringToObject(o, "how", how);
    cJSON_AddItemToArray(a, o);
  }
  return a;
}

/* Class row r as one JSON object (docs/interfaces.md lists its members). */
static cJSON *class_json(const qc_registry_row *r) {
  const qc_class *k = r->cls;
  cJSON *o = cJSON_CreateObject();
  cJSON_AddStringToObject(o, "name", k->name);
  cJSON_AddStringToObject(o, "summary", k->summary ? k->summary : "");
  for (int i = 0; i < NROLES; i++) {
    cJSON *a = cJSON_CreateArray();
    role_names(k->tensors, g_roles[i], NULL, 0, a);
    cJSON_AddItemToObject(o, g_roles[i], a);
  }
  cJSON_AddItemToObject(o, "grads", words_json(k->grads));
  cJSON_AddItemToObject(o, "keys", keys_json(k->keys));
  cJSON_AddStringToObject(o, "shape_help", k->shape_help ? k->shape_help : "");
  cJSON_AddBoolToObject(o, "fd", k->forward != NULL);
  if (k->fd_shape) cJSON_AddStringToObject(o, "fd_shape", k->fd_shape);
  else cJSON_AddNullToObject(o, "fd_shape");
  cJSON_AddStringToObject(o, "not_checked", k->not_checked ? k->not_checked : "");
  cJSON_AddItemToObject(o, "coverage", coverage_json(r));
  cJSON_AddItemToObject(o, "hypotheses", words_json(k->hypotheses));
  cJSON *own = cJSON_CreateArray();
  for (const qc_hypothesis *h = k->hyps; h && h->name; h++) {
    cJSON *e = cJSON_CreateObject();
    char g[256];
    snprintf(g, sizeof g, "%s", h->grads ? h->grads : "");
    for (char *p = g; *p; p++)
      if (*p == '/') *p = ' ';
    cJSON_AddStringToObject(e, "name", h->name);
    cJSON_AddItemToObject(e, "grads", words_json(g));
    cJSON_AddStringToObject(e, "says", h->says ? h->says : "");
    cJSON_AddItemToArray(own, e);
  }
  cJSON_AddItemToObject(o, "own_hypotheses", own);
  cJSON_AddBoolToObject(o, "ratios", k->ratios != NULL);
  if (k->split) cJSON_AddStringToObject(o, "split", k->split->dim);
  else cJSON_AddNullToObject(o, "split");
  cJSON_AddBoolToObject(o, "fast_path", r->fast != NULL);
  cJSON_AddBoolToObject(o, "reference_forward", r->forward != NULL);
  cJSON_AddBoolToObject(o, "reference_terms", r->terms != 0);
  cJSON_AddItemToObject(o, "selections", words_json(r->select ? r->selected : NULL));
  return o;
}

/* Every class as one JSON document on stdout. QC_OK or QC_ESYS. */
static int print_json(const qc_registry_row *rows, int n) {
  cJSON *root = cJSON_CreateObject(), *a = cJSON_CreateArray();
  cJSON_AddStringToObject(root, "qatcheck", QC_VERSION);
  cJSON_AddItemToObject(root, "common_keys", keys_json(qc_common_keys));
  for (int i = 0; i < n; i++) cJSON_AddItemToArray(a, class_json(&rows[i]));
  cJSON_AddItemToObject(root, "classes", a);
  char *s = cJSON_Print(root);
  cJSON_Delete(root);
  if (!s) return qc_err_sys("classes: out of memory printing the class table");
  int rc = fputs(s, stdout) < 0 || fputc('\n', stdout) < 0 ? qc_err_sys("classes: cannot write to stdout") : QC_OK;
  free(s);
  return rc;
}

/* One "  label  text" line of the text listing (nothing for an empty text). */
static void line(const char *label, const char *text) {
  if (text && text[0]) printf("  %-12s %s\n", label, text);
}

/* Contract keys k as text lines "key = default (values): help". */
static void keys_text(const char *label, const qc_key_spec *k) {
  for (int first = 1; k && k->key; k++, first = 0)
    printf("  %-12s %s = %s (%s): %s\n", first ? label : "", k->key, k->dflt ? k->dflt : "",
           !k->values ? "a number" : strcmp(k->values, QC_KEY_STRING) == 0 ? "a string" : k->values, k->help ? k->help : "");
}

/* Class row r as text for people. */
static void class_text(const qc_registry_row *r) {
  const qc_class *k = r->cls;
  char b[2048];
  printf("%s: %s\n", k->name, k->summary ? k->summary : "");
  for (int i = 0; i < NROLES; i++) {
    role_names(k->tensors, g_roles[i], b, sizeof b, NULL);
    line(g_roles[i], b);
  }
  line("gradients", k->grads);
  keys_text("contract", k->keys);
  line("shape", k->shape_help);
  line("fd", k->forward ? (k->fd_shape ? k->fd_shape : "the class's default shape") : "none (no float64 forward)");
  line("not checked", k->not_checked);
  if (r->select && r->selected) {
    snprintf(b, sizeof b, "saved/%s: judged against the selection the contract defines", r->selected);
    line("selections", b);
  }
  int first = 1;
  for (int c = 0; c < QC_COV_COUNT; c++) {
    if (!qc_coverage[c].per_class || !qc_cov_class_item(k, c)) continue;
    cov_how(k, c, b, sizeof b);
    printf("  %-12s %s: %s\n", first ? "coverage" : "", qc_coverage[c].id, b);
    first = 0;
  }
  size_t n;
  n = (size_t)snprintf(b, sizeof b, "%s", k->hypotheses ? k->hypotheses : "");
  for (const qc_hypothesis *h = k->hyps; h && h->name && n < sizeof b; h++)
    n += (size_t)snprintf(b + n, sizeof b - n, "%s%s", n ? " " : "", h->name);
  line("hypotheses", b);
  printf("\n");
}

int qc_cmd_classes(struct qc_run *run, int argc, char **argv) {
  (void)run;
  int json = 0;
  qc_opt opts[] = {
      QC_OPT_BOOL("json", &json, "print one JSON document on stdout (for scripts) instead of text"),
      {.type = QC_OT_BOOL, .name = "help", .alias = 'h', .help = "this text"},
      QC_OPT_END(),
  };
  qc_opts p = {.verb = "classes", .opt = opts, .help = help};
  int rc = qc_opts_parse(&p, argc, argv);
  qc_opts_free(&p);
  if (rc || p.done) return rc;
  int n;
  const qc_registry_row *rows = qc_registry_rows(&n);
  if (json) return print_json(rows, n);
  for (int i = 0; i < n; i++) class_text(&rows[i]);
  printf("every class also takes:\n");
  keys_text("contract", qc_common_keys);
  return fflush(stdout) == 0 ? QC_OK : qc_err_sys("classes: cannot write to stdout");
}
