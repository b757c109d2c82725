/* vjp_empty.c: a module group that received no token (scripts/qatdump.py's
 * empty call: an expert nobody was routed to, or not in one micro-batch of
 * a grad_accum step; docs/qatdump.md, "Empty and late experts"). No token
 * in, none out: its VJP is zero for every parameter and empty for every
 * input, which is what its gradients are checked against (exactly: there
 * is no arithmetic to round). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/qc.h"
#include "engine/vjp.h"
#include "numerics/decode.h"

int qc_vjp_is_empty(const qc_module *m) {
  if (m->grad_out.n == 0 || m->inputs.n == 0) return 0;
  for (int i = 0; i < m->grad_out.n; i++)
    if (qc_numel(&m->grad_out.t[i]) != 0) return 0;
  for (int i = 0; i < m->inputs.n; i++)
    if (qc_numel(&m->inputs.t[i]) != 0) return 0;
  return 1;
}

/* 1 when gradient `name` ("d_weight") is in a->frozen ("/d_weight/d_bias/"). */
static int is_frozen(const qc_audit *a, const char *name) {
  char w[QC_NAMELEN + 4];
  snprintf(w, sizeof w, "/%s/", name);
  return a->frozen && strstr(a->frozen, w) != NULL;
}

/* One check of empty module m: candidate g (NULL: missing) of tensor
 * `name` against the zero reference of shape `like` (a parameter: every
 * element 0) or no element at all (an input). */
static int empty_check(qc_audit *a, const qc_module *m, const char *dy, const char *name, const qc_tensor *like,
                       int is_param, const qc_tensor *g) {
  qc_tol t;
  memset(&t, 0, sizeof t);
  t.has_max_abs = 1; /* exactly zero: no token, nothing added */
  snprintf(t.reasoning, sizeof t.reasoning, "the module received no token (empty inputs and dY): %s",
           is_param ? "its parameter gradient is exactly zero" : "its input gradient has no element");
  qc_check k;
  qc_check_init(&k, m, dy, name, like->ndim, like->shape, &t);
  if (!is_param) k.shape[0] = 0;
  k.verdict = QC_V_PASS;
  char s1[96], s2[96];
  if (!g) {
    k.verdict = QC_V_FAIL;
    snprintf(k.why, sizeof k.why, "missing");
    return qc_results_add(a->res, &k);
  }
  snprintf(k.cand_dtype, sizeof k.cand_dtype, "%s", qc_dtype_name(g->dtype));
  int64_t n = qc_numel(g) * (g->dtype == QC_E2M1X2 ? 2 : 1);
  int shape_ok = is_param ? qc_shape_eq(g, like) : n == 0;
  if (!qc_dtype_is_float(g->dtype) || g->dtype == QC_E2M1X2) {
    k.verdict = QC_V_FAIL;
    snprintf(k.why, sizeof k.why, "candidate has element type %s: expected a float gradient", qc_dtype_name(g->dtype));
  } else if (!shape_ok) {
    k.verdict = QC_V_FAIL;
    if (is_param)
      snprintf(k.why, sizeof k.why, "shape mismatch: candidate %s, parameter %s", qc_shape_str(g->ndim, g->shape, s1, sizeof s1),
               qc_shape_str(like->ndim, like->shape, s2, sizeof s2));
    else
      snprintf(k.why, sizeof k.why, "the module received no token, but its input gradient %s has %lld element(s): "
               "expected none", qc_shape_str(g->ndim, g->shape, s1, sizeof s1), (long long)n);
  } else if (n > 0) {
    double *v = qc_malloc((size_t)n * sizeof *v, "empty module gradient"), *z = qc_calloc((size_t)n, sizeof *z, "zeros");
    int rc = v && z ? qc_tensor_to_f64(g, v) : QC_ESYS;
    if (rc) {
      free(v);
      free(z);
      return rc;
    }
    int64_t nz = 0;
    double mx = 0;
    for (int64_t i = 0; i < n; i++) {
      if (v[i] != 0) nz++;
      if (fabs(v[i]) > mx || isnan(v[i])) mx = fabs(v[i]);
    }
    qc_metrics_compute(v, z, n, &k.m);
    k.has_metrics = 1;
    if (nz) {
      k.verdict = QC_V_FAIL;
      snprintf(k.why, sizeof k.why, "the module received no token (empty inputs and dY), but %lld of %lld elements of %s "
               "are non-zero (up to |%.3g|): expected a zero gradient", (long long)nz, (long long)n, name, mx);
    }
    free(v);
    free(z);
  }
  return qc_results_add(a->res, &k);
}

int qc_vjp_empty_audit(qc_audit *a, const qc_module *m) {
  int rc = QC_OK;
  if (!m->cand) return qc_err("%s: the module received no token (empty inputs/ and grad_out/): only a dump's own "
                              "gradients (candidate dump) can be judged there", m->path);
  for (int i = 0; i < m->grad_out.n && !rc; i++) {
    const char *dy = m->grad_out.t[i].name;
    const qc_tset *c = &m->cand[i];
    for (int j = 0; j < m->params.n && !rc; j++) {
      const qc_tensor *p = &m->params.t[j];
      char dn[QC_NAMELEN + 2];
      snprintf(dn, sizeof dn, "d_%s", p->name);
      if (!qc_module_input_grad(m, p->name) && !qc_tset_get(c, dn)) continue; /* the class gives it no gradient */
      const qc_tensor *g = qc_tset_get(c, dn);
      if (!g && is_frozen(a, dn)) continue;
      rc = empty_check(a, m, dy, dn, p, 1, g);
    }
    for (int j = 0; j < m->inputs.n && !rc; j++) {
      const qc_tensor *x = &m->inputs.t[j];
      char dn[QC_NAMELEN + 2];
      snprintf(dn, sizeof dn, "d_%s", x->name);
      const qc_tensor *g = qc_tset_get(c, dn);
      if (!g && (!qc_module_input_grad(m, x->name) || !qc_dtype_is_float(x->dtype))) continue;
      rc = empty_check(a, m, dy, dn, x, 0, g);
    }
  }
  return rc;
}
