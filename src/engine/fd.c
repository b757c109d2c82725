/* fd.c: finite differences against the float64 references (see fd.h). */
#include "engine/fd.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/qc.h"
#include "core/rng.h"
#include "numerics/decode.h"

void qc_fd_defaults(qc_fd_opts *o) {
  o->seed = 0;
  o->directions = 3;
  o->h = 1e-3;
  o->tol = 1e-6;
}

/* Deep copy of a tensor set; real-valued tensors become float64 when to_f64. */
static int tset_copy(qc_tset *dst, const qc_tset *src, int to_f64) {
  for (int i = 0; i < src->n; i++) {
    const qc_tensor *t = &src->t[i];
    qc_tensor c = {0};
    int real = t->dtype == QC_F32 || t->dtype == QC_F16 || t->dtype == QC_BF16 || t->dtype == QC_F64;
    int rc = to_f64 && real ? qc_tensor_decode_f64(t, &c) : qc_tensor_copy(&c, t);
    if (rc || (rc = qc_tset_add(dst, &c))) {
      qc_tensor_free(&c);
      return rc;
    }
  }
  return QC_OK;
}

/* A float64 copy of m (inputs and params decoded; saved copied as is). */
static int module_f64(const qc_module *m, qc_module *out) {
  memset(out, 0, sizeof *out);
  memcpy(out->path, m->path, sizeof out->path);
  out->cls = m->cls;
  out->contract = m->contract;
  int rc;
  if ((rc = tset_copy(&out->inputs, &m->inputs, 1)) || (rc = tset_copy(&out->params, &m->params, 1)) ||
      (rc = tset_copy(&out->saved, &m->saved, 0)))
    qc_module_free(out);
  return rc;
}

/* <y, v> and sum |y v| over n elements. */
static double dot(const double *y, const double *v, int64_t n, double *abs_sum) {
  double s = 0, a = 0;
  for (int64_t i = 0; i < n; i++) {
    s += y[i] * v[i];
    a += fabs(y[i] * v[i]);
  }
  if (abs_sum) *abs_sum = a;
  return s;
}

/* <f(work), v> with work's tensor t set to base + c h u. */
static int probe(const qc_module *work, const qc_module *base, qc_fwd_fn fwd, double *t, const double *t0,
                 const double *u, int64_t n, double ch, const qc_tensor *v, double *out) {
  qc_tensor y = {0};
  for (int64_t i = 0; i < n; i++) t[i] = t0[i] + ch * u[i];
  int rc = fwd(work, base, &y);
  if (!rc && qc_numel(&y) != qc_numel(v)) rc = qc_err("%s: fd: the forward's output changed size", work->path);
  if (!rc) *out = dot(y.data, v->data, qc_numel(v), NULL);
  qc_tensor_free(&y);
  memcpy(t, t0, (size_t)n * sizeof *t);
  return rc;
}

int qc_fd_check(const qc_ctx *ctx, const qc_module *m, qc_fwd_fn fwd, qc_vjp_fn vjp, const qc_fd_opts *o,
                qc_fd_row **rows, int *nrows) {
  qc_module base = {0}, work = {0};
  qc_tensor y0 = {0}, v = {0};
  qc_tset grads = {0};
  qc_fd_row *r = NULL;
  double *u = NULL;
  int nr = 0, rc;
  qc_rng rng;
  qc_rng_seed(&rng, o->seed ^ 0x6664u);
  *rows = NULL;
  *nrows = 0;
  if (!fwd) return qc_err("%s: class '%s' has no float64 forward: fd cannot check it", m->path, m->cls ? m->cls->name : "?");
  if ((rc = module_f64(m, &base)) || (rc = module_f64(m, &work))) goto done;
  if ((rc = fwd(&base, &base, &y0))) goto done;
  if ((rc = qc_tensor_alloc(&v, "dy", QC_F64, y0.ndim, y0.shape))) goto done;
  for (int64_t i = 0; i < qc_numel(&v); i++) ((double *)v.data)[i] = qc_rng_normal(&rng);
  double fabs_sum;
  dot(y0.data, v.data, qc_numel(&v), &fabs_sum);
  if ((rc = vjp(ctx, &base, &v, &grads))) goto done;
  rc = QC_ESYS;
  if (!(r = qc_calloc((size_t)(grads.n * o->directions) + 1, sizeof *r, "fd rows"))) goto done;
  for (int gi = 0; gi < grads.n; gi++) {
    const qc_tensor *g = &grads.t[gi];
    const char *name = strncmp(g->name, "d_", 2) == 0 ? g->name + 2 : g->name;
    qc_tensor *t = qc_tset_get_mut(&work.inputs, name);
    const qc_tensor *t0 = qc_tset_get(&base.inputs, name);
    if (!t) {
      t = qc_tset_get_mut(&work.params, name);
      t0 = qc_tset_get(&base.params, name);
    }
    if (!t || t->dtype != QC_F64 || qc_numel(t) != qc_numel(g) || g->dtype != QC_F64) {
      rc = qc_err("%s: fd: the reference returned '%s' but the module has no float inputs/%s or params/%s of %lld elements",
                  m->path, g->name, name, name, (long long)qc_numel(g));
      goto done;
    }
    const int64_t n = qc_numel(t);
    free(u);
    if (!(u = qc_malloc((size_t)n * sizeof *u, "fd direction"))) { rc = QC_ESYS; goto done; }
    for (int d = 0; d < o->directions; d++) {
      double f[4], nu = 0, ng = 0;
      static const double c[4] = {-2, -1, 1, 2};
      for (int64_t i = 0; i < n; i++) {
        u[i] = qc_rng_normal(&rng);
        nu += u[i] * u[i];
      }
      for (int k = 0; k < 4; k++)
        if ((rc = probe(&work, &base, fwd, t->data, t0->data, u, n, c[k] * o->h, &v, &f[k]))) goto done;
      qc_fd_row *row = &r[nr++];
      snprintf(row->tensor, sizeof row->tensor, "%s", g->name);
      row->dir = d;
      row->vjp = dot(u, g->data, n, NULL);
      for (int64_t i = 0; i < n; i++) ng += ((double *)g->data)[i] * ((double *)g->data)[i];
      row->jvp = (f[0] - 8 * f[1] + 8 * f[2] - f[3]) / (12 * o->h);
      row->scale = sqrt(nu * ng);
      row->bound = o->tol * row->scale + 1e-12 * fabs_sum;
      row->pass = fabs(row->vjp - row->jvp) <= row->bound;
    }
  }
  if (nr == 0) {
    rc = qc_err("%s: fd: the reference returned no gradient: nothing to check", m->path);
    goto done;
  }
  *rows = r;
  *nrows = nr;
  r = NULL;
  rc = QC_OK;
done:
  free(r);
  free(u);
  qc_tset_free(&grads);
  qc_tensor_free(&y0);
  qc_tensor_free(&v);
  qc_module_free(&base);
  qc_module_free(&work);
  return rc;
}

int qc_fd_instance(const qc_class *cls, const qc_gen *g, const qc_contract *c, qc_module *m) {
  char sh[96], where[160];
  int nd = 0;
  int64_t os[QC_MAXDIM];
  qc_rng rng;
  memset(m, 0, sizeof *m);
  m->cls = cls;
  snprintf(m->path, sizeof m->path, "gen/%s%s", cls->name, qc_shape_str(g->nshape, g->shape, sh, sizeof sh));
  snprintf(where, sizeof where, "class '%s'", cls->name);
  if (c) m->contract = *c;
  int rc = qc_contract_validate(&m->contract, cls->keys, where);
  qc_rng_seed(&rng, g->seed);
  if (!rc) rc = cls->generate(g, &rng, m, &nd, os);
  if (rc) qc_module_free(m);
  return rc;
}

int qc_fd_parse_set(qc_contract *c, const char *kv) {
  const char *eq = strchr(kv, '=');
  char key[48], val[64];
  if (!eq || eq == kv || (size_t)(eq - kv) >= sizeof key || strlen(eq + 1) >= sizeof val || !eq[1])
    return qc_err("contract setting '%s': expected key=value", kv);
  snprintf(key, sizeof key, "%.*s", (int)(eq - kv), kv);
  snprintf(val, sizeof val, "%s", eq + 1);
  char *end;
  double num = strtod(val, &end);
  if (end != val && *end == 0) return qc_contract_set(c, key, "", num, 1);
  char *colon = strchr(val, ':');
  if (colon) {
    num = strtod(colon + 1, &end);
    if (end == colon + 1 || *end) return qc_err("contract setting '%s': expected word:number after '='", kv);
    *colon = 0;
    return qc_contract_set(c, key, val, num, 1);
  }
  return qc_contract_set(c, key, val, 0, 0);
}
