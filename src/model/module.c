/* module.c: module instances (see module.h). */
#include "model/module.h"

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
