/* module.c: module instances (see module.h). */
#include "model/module.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/qc.h"

void qc_module_free(qc_module *m) {
  if (!m) return;
  qc_tset_free(&m->inputs);
  qc_tset_free(&m->params);
  qc_tset_free(&m->saved);
  qc_tset_free(&m->outputs);
  if (m->cand) {
    for (int i = 0; i < m->grad_out.n; i++) qc_tset_free(&m->cand[i]);
    free(m->cand);
  }
  qc_tset_free(&m->grad_out);
  memset(m, 0, sizeof *m);
}

int qc_tset_clone(qc_tset *dst, const qc_tset *src) {
  memset(dst, 0, sizeof *dst);
  for (int i = 0; i < src->n; i++) {
    qc_tensor t;
    int rc = qc_tensor_copy(&t, &src->t[i]);
    if (!rc && (rc = qc_tset_add(dst, &t))) qc_tensor_free(&t);
    if (rc) {
      qc_tset_free(dst);
      return rc;
    }
  }
  return QC_OK;
}

void qc_module_variant_free(qc_module *alt, const qc_module *m) {
  if (alt->inputs.t != m->inputs.t) qc_tset_free(&alt->inputs);
  if (alt->params.t != m->params.t) qc_tset_free(&alt->params);
  if (alt->saved.t != m->saved.t) qc_tset_free(&alt->saved);
  if (alt->outputs.t != m->outputs.t) qc_tset_free(&alt->outputs);
}

int qc_module_input_grad(const qc_module *m, const char *name) {
  const char *g = m->cls ? m->cls->grads : NULL;
  const size_t n = strlen(name);
  int k = 0;
  for (const char *p = g; p && *p;) {
    p += strspn(p, " ");
    const size_t w = strcspn(p, " ");
    if (w == 0) break;
    k++;
    if (w == n + 2 && p[0] == 'd' && p[1] == '_' && strncmp(p + 2, name, n) == 0) return k;
    p += w;
  }
  return 0;
}

int qc_class_has_grad(const qc_class *cls, const char *grad) {
  const size_t n = strlen(grad);
  for (const char *p = cls ? cls->grads : NULL; p && *p;) {
    const size_t l = strcspn(p, " ");
    if (l == n && strncmp(p, grad, n) == 0) return 1;
    p += l;
    p += strspn(p, " ");
  }
  return 0;
}

int qc_module_need(const qc_module *m, const char *role, const char *name, int min_ndim, int max_ndim,
                   const qc_tensor **out) {
  const qc_tset *s = strcmp(role, "inputs") == 0    ? &m->inputs
                     : strcmp(role, "params") == 0  ? &m->params
                     : strcmp(role, "saved") == 0   ? &m->saved
                     : strcmp(role, "outputs") == 0 ? &m->outputs
                                                    : NULL;
  const qc_tensor *t = s ? qc_tset_get(s, name) : NULL;
  if (!t) return qc_err("%s: missing dataset '%s/%s'", m->path, role, name);
  if (t->ndim < min_ndim || t->ndim > max_ndim) {
    if (min_ndim == max_ndim)
      return qc_err("%s: dataset '%s/%s' has rank %d: expected %d", m->path, role, name, t->ndim, min_ndim);
    return qc_err("%s: dataset '%s/%s' has rank %d: expected %d to %d", m->path, role, name, t->ndim, min_ndim, max_ndim);
  }
  if (qc_numel(t) == 0) return qc_err("%s: dataset '%s/%s' is empty: expected at least one element", m->path, role, name);
  if (t->dtype == QC_E2M1X2 && strcmp(role, "saved") != 0)
    return qc_err("%s: dataset '%s/%s' is packed float4 (two elements a byte): expected a tensor of one element per value",
                  m->path, role, name);
  *out = t;
  return QC_OK;
}

/* 1 when `word` is a space-separated word of `list` (NULL: an empty list). */
static int has_word(const char *list, const char *word) {
  size_t n = strlen(word);
  for (const char *p = list; p && *p;) {
    while (*p == ' ') p++;
    const char *e = p;
    while (*e && *e != ' ') e++;
    if ((size_t)(e - p) == n && n && strncmp(p, word, n) == 0) return 1;
    p = e;
  }
  return 0;
}

const qc_tensor *qc_module_saved_copy(const qc_module *m, const char *name) {
  char word[QC_NAMELEN + 16];
  snprintf(word, sizeof word, "saved/%s", name);
  if (!m->cls || has_word(m->cls->tensors, word)) return NULL; /* the class's own saved tensor */
  for (int j = 0; j < m->inputs.n; j++) {
    const char *x = m->inputs.t[j].name;
    const size_t n = strlen(x);
    if (strcmp(name, x) == 0 || (strncmp(name, x, n) == 0 && strcmp(name + n, "_saved") == 0)) return &m->inputs.t[j];
  }
  return NULL;
}

/* The class's declared tensors as "inputs/x, params/weight" into buf[n]. */
static void takes_list(const qc_class *c, char *buf, size_t n) {
  size_t l = 0;
  buf[0] = 0;
  for (const char *p = c->tensors; p && *p && l + 1 < n;) {
    while (*p == ' ') p++;
    const char *e = p;
    while (*e && *e != ' ') e++;
    if (e > p) l += (size_t)snprintf(buf + l, n - l, "%s%.*s", l ? ", " : "", (int)(e - p), p);
    p = e;
  }
  if (!buf[0]) snprintf(buf, n, "nothing (the class declares no tensors)");
}

int qc_module_check_known(const qc_module *m, const char *where) {
  static const char *roles[] = {"inputs", "params", "saved", "outputs"};
  const qc_tset *sets[] = {&m->inputs, &m->params, &m->saved, &m->outputs};
  const qc_class *c = m->cls;
  char word[QC_NAMELEN + 16], takes[1024];
  for (int r = 0; r < 4; r++)
    for (int i = 0; i < sets[r]->n; i++) {
      snprintf(word, sizeof word, "%s/%s", roles[r], sets[r]->t[i].name);
      if (has_word(c->tensors, word) || (r == 2 && qc_module_saved_copy(m, sets[r]->t[i].name))) continue;
      takes_list(c, takes, sizeof takes);
      qc_hint("model it in class '%s' (src/modules/%s.c and its reference), or leave it out of the dump (a saved tensor: None "
              "in the module's qatcheck_saved, docs/qatdump.md)", c->name, c->name);
      return qc_err("%s: dataset '%s' is not modelled by class '%s' (judging without it could pass a wrong gradient): "
                    "the class takes %s, any name under grad_out/, and saved copies of its inputs (saved/<input> or "
                    "saved/<input>_saved)",
                    where, word, c->name, takes);
    }
  for (int i = 0; i < m->outputs.n; i++) { /* the forward check reads outputs/ as floats: anything else would go unjudged */
    const qc_tensor *y = &m->outputs.t[i];
    if (qc_dtype_is_float(y->dtype) && y->dtype != QC_E2M1X2) continue;
    const qc_tensor *x = NULL;
    for (int j = 0; j < m->inputs.n && !x; j++)
      if (qc_dtype_is_float(m->inputs.t[j].dtype) && m->inputs.t[j].dtype != QC_E2M1X2) x = &m->inputs.t[j];
    char like[QC_NAMELEN + 48] = "";
    if (x) snprintf(like, sizeof like, ", e.g. inputs/%s's %s", x->name, qc_dtype_name(x->dtype));
    qc_hint("outputs/%s is the module's output as its forward returned it; store it in that dtype, or leave it out of the dump",
            y->name);
    return qc_err("%s: dataset 'outputs/%s' has dtype %s: expected a float dtype (float32, bfloat16, float16, float64 or "
                  "float8)%s; it cannot be judged", where, y->name, qc_dtype_name(y->dtype), like);
  }
  for (int k = 0; m->cand && k < m->grad_out.n; k++)
    for (int i = 0; i < m->cand[k].n; i++) {
      const char *g = m->cand[k].t[i].name;
      int checked = strncmp(g, "d_", 2) == 0 && has_word(c->grads, g);
      if (checked && (qc_tset_get(&m->inputs, g + 2) || qc_tset_get(&m->params, g + 2))) continue;
      if (checked) { /* the gradient of a tensor the module lacks */
        char in[QC_NAMELEN + 16];
        snprintf(in, sizeof in, "inputs/%s", g + 2);
        snprintf(word, sizeof word, "params/%s", g + 2);
        return qc_err("%s: dataset 'grads/%s/%s' is the gradient of a tensor the module lacks: missing dataset '%s'",
                      where, m->grad_out.t[k].name, g, has_word(c->tensors, in) ? in : word);
      }
      qc_hint("the candidate's gradients are d_<input or param> of what the module holds");
      return qc_err("%s: dataset 'grads/%s/%s' is not a gradient class '%s' checks on this module: "
                    "it checks %s (each when its input or param is in the dump)",
                    where, m->grad_out.t[k].name, g, c->name, c->grads && c->grads[0] ? c->grads : "none");
    }
  return QC_OK;
}

int qc_module_validate(const qc_module *m, const char *where) {
  int rc = qc_module_check_known(m, where);
  for (int i = 0; !rc && m->cls->validate && i < m->grad_out.n; i++) rc = m->cls->validate(m, &m->grad_out.t[i]);
  return rc;
}

int qc_module_check_dy(const qc_module *m, const qc_tensor *dy, int64_t numel, int64_t last, const char *want) {
  char s[96];
  if (qc_numel(dy) != numel)
    return qc_err("%s: dY '%s' is %s (%lld elements): expected %s, %lld elements", m->path, dy->name,
                  qc_shape_str(dy->ndim, dy->shape, s, sizeof s), (long long)qc_numel(dy), want, (long long)numel);
  /* the same count in another layout (a transposed dY) would be read as if it were this one */
  if (last > 0 && (dy->ndim < 1 || dy->shape[dy->ndim - 1] != last))
    return qc_err("%s: dY '%s' is %s: expected %s (last dimension %lld)", m->path, dy->name,
                  qc_shape_str(dy->ndim, dy->shape, s, sizeof s), want, (long long)last);
  if (!qc_dtype_is_float(dy->dtype)) return qc_err("%s: dY '%s' has dtype %s: expected a float type", m->path, dy->name, qc_dtype_name(dy->dtype));
  return QC_OK;
}

int qc_ctx_wants(const qc_ctx *ctx, const char *grad) {
  if (!ctx || !ctx->skip) return 1;
  size_t n = strlen(grad);
  for (const char *p = strstr(ctx->skip, grad); p; p = strstr(p + 1, grad))
    if (p > ctx->skip && p[-1] == '/' && p[n] == '/') return 0;
  return 1;
}
