/* class_harness.c: see class_harness.h. */
#include "class_harness.h"

#include <criterion/criterion.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend/backend.h"
#include "engine/fd.h"
#include "numerics/metrics.h"
#include "model/check.h"
#include "core/qc.h"
#include "core/rng.h"
#include "numerics/decode.h"

void h_make(h_inst *in, const char *cls, const char *shape, uint64_t seed, const char *values, const char *const *sets) {
  qc_contract c = {0};
  for (int i = 0; sets && sets[i]; i++) cr_assert_eq(qc_fd_parse_set(&c, sets[i]), QC_OK, "%s", qc_err_msg());
  h_make_with(in, cls, shape, seed, values, &c);
}

void h_make_with(h_inst *in, const char *cls, const char *shape, uint64_t seed, const char *values, const qc_contract *c) {
  memset(in, 0, sizeof *in);
  in->row = qc_registry_find(cls);
  cr_assert(in->row, "class %s registered", cls);
  qc_gen g = {0};
  g.seed = seed;
  g.values = values;
  for (const char *p = shape; *p;) {
    char *end;
    g.shape[g.nshape++] = strtoll(p, &end, 10);
    p = *end ? end + 1 : end;
  }
  qc_err_clear();
  int rc = qc_fd_instance(in->row->cls, &g, c, &in->m);
  cr_assert_eq(rc, QC_OK, "instance %s [%s]: %s", cls, shape, qc_err_msg());
  /* dY: the forward output's shape, from the class's own float64 forward,
   * or (a class without one, kv_quant) the generated outputs/y's */
  const qc_tensor *yo = qc_tset_get(&in->m.outputs, "y");
  cr_assert(in->row->cls->forward || yo, "class %s: no float64 forward and no generated outputs/y: dY's shape unknown", cls);
  if (!in->row->cls->forward && yo) {
    cr_assert_eq(qc_tensor_alloc(&in->dy, "dy", QC_F32, yo->ndim, yo->shape), QC_OK);
  } else {
    qc_tensor y = {0};
    cr_assert_eq(in->row->cls->forward(&in->m, &in->m, &y), QC_OK, "%s", qc_err_msg());
    cr_assert_eq(qc_tensor_alloc(&in->dy, "dy", QC_F32, y.ndim, y.shape), QC_OK);
    qc_tensor_free(&y);
  }
  qc_rng r;
  qc_rng_seed(&r, seed + 77);
  for (int64_t i = 0; i < qc_numel(&in->dy); i++) ((float *)in->dy.data)[i] = (float)qc_rng_normal(&r);
}

void h_free(h_inst *in) {
  qc_module_free(&in->m);
  qc_tensor_free(&in->dy);
}

qc_vjp_fn h_prod(const char *cls) { return qc_registry_find(cls)->cls->production; }

double *h_f64(const qc_tensor *t) {
  double *d = malloc((size_t)(qc_numel(t) + 1) * sizeof *d);
  cr_assert(d && qc_tensor_to_f64(t, d) == QC_OK);
  return d;
}

void h_set(qc_tset *grads, const char *name, const double *d, int64_t n) {
  qc_tensor *t = qc_tset_get_mut(grads, name);
  cr_assert(t && t->dtype == QC_F32 && qc_numel(t) == n, "candidate has float32 %s", name);
  for (int64_t i = 0; i < n; i++) ((float *)t->data)[i] = (float)d[i];
}

int h_compare(h_inst *in, qc_vjp_fn cand, double tol, char *fail, int failn, double *worst) {
  qc_ctx ctx = {.be = qc_backend_cpu(), .profile = "vllm"};
  qc_tset ref = {0}, got = {0};
  int ok = 1;
  fail[0] = 0;
  *worst = 0;
  qc_err_clear();
  cr_assert_eq(in->row->reference(&ctx, &in->m, &in->dy, &ref), QC_OK, "reference: %s", qc_err_msg());
  if (cand(&ctx, &in->m, &in->dy, &got) != QC_OK) {
    snprintf(fail, (size_t)failn, "candidate error: %s", qc_err_msg());
    qc_tset_free(&ref);
    return -1;
  }
  for (int i = 0; i < ref.n && ok; i++) {
    const qc_tensor *r = &ref.t[i], *g = qc_tset_get(&got, r->name);
    if (!g || qc_numel(g) != qc_numel(r)) {
      snprintf(fail, (size_t)failn, "missing %s", r->name);
      ok = 0;
      break;
    }
    double *gd = h_f64(g);
    qc_metrics mt;
    qc_metrics_compute(gd, r->data, qc_numel(r), &mt);
    free(gd);
    qc_tol t = {0};
    t.has_rel_l2 = 1;
    t.rel_l2 = tol;
    char why[256];
    if (mt.rel_l2 > *worst || mt.nonfinite) *worst = mt.nonfinite ? INFINITY : mt.rel_l2;
    if (qc_judge(&mt, &t, why, sizeof why) != QC_V_PASS) {
      snprintf(fail, (size_t)failn, "%s", r->name);
      ok = 0;
    }
  }
  qc_tset_free(&ref);
  qc_tset_free(&got);
  return ok;
}

int h_prod_with(const qc_ctx *ctx, const qc_module *m, const qc_tensor *dy, qc_tset *grads, const char *kv) {
  qc_module tmp = *m; /* shallow: shares the tensor sets, never freed */
  cr_assert_eq(qc_fd_parse_set(&tmp.contract, kv), QC_OK);
  return m->cls->production(ctx, &tmp, dy, grads);
}

void h_expect_pass(h_inst *in, double tol) {
  char fail[256];
  double w;
  int ok = h_compare(in, in->row->cls->production, tol, fail, sizeof fail, &w);
  cr_expect_eq(ok, 1, "%s: builtin fails on %s (worst rel_l2 %.3g > %.3g)", in->m.path, fail, w, tol);
}

void h_expect_fail(h_inst *in, qc_vjp_fn cand, double tol, const char *tensor) {
  char fail[256];
  double w;
  int ok = h_compare(in, cand, tol, fail, sizeof fail, &w);
  cr_expect_eq(ok, 0, "%s: planted defect passed (worst rel_l2 %.3g)", in->m.path, w);
  cr_expect_str_eq(fail, tensor, "%s: the failure names '%s', expected '%s'", in->m.path, fail, tensor);
}

void h_sweep(const char *cls, const char *const *shapes, int nshapes, const char *const *const *sets, int nsets,
             uint64_t seed, double tol, double tol_special) {
  for (int s = 0; s < nshapes; s++)
    for (int c = 0; c < nsets; c++)
      for (int v = 0; v < 3; v++) {
        static const char *const values[] = {"normal", "heavy_tail", "special"};
        h_inst in;
        h_make(&in, cls, shapes[s], seed++, values[v], sets[c]);
        h_expect_pass(&in, v == 2 ? tol_special : tol);
        h_free(&in);
      }
}

void h_expect_refused(h_inst *in, const char *needle) {
  qc_ctx ctx = {.be = qc_backend_cpu(), .profile = "vllm"};
  qc_tset g = {0};
  qc_vjp_fn fn[2] = {in->row->reference, in->row->cls->production};
  for (int i = 0; i < 2; i++) {
    qc_err_clear();
    cr_expect_eq(fn[i](&ctx, &in->m, &in->dy, &g), QC_EINPUT, "%s VJP accepted bad input", i ? "production" : "reference");
    cr_expect(strstr(qc_err_msg(), needle) != NULL, "message '%s' does not name '%s'", qc_err_msg(), needle);
    qc_tset_free(&g);
  }
  qc_err_clear();
}

void h_fd_agrees(const char *cls, const char *const *shapes, int ns, const char *const (*sets)[3], int nc, uint64_t seed0) {
  for (int s = 0; s < ns; s++)
    for (int c = 0; c < nc; c++) {
      h_inst in;
      h_make(&in, cls, shapes[s], seed0 + (uint64_t)s, "normal", sets[c]);
      qc_ctx ctx = {.be = qc_backend_cpu(), .profile = "vllm"};
      qc_fd_opts o;
      qc_fd_defaults(&o);
      qc_fd_row *rows;
      int nr;
      cr_assert_eq(qc_fd_check(&ctx, &in.m, in.row->cls->forward, in.row->reference, &o, &rows, &nr), QC_OK, "%s",
                   qc_err_msg());
      for (int i = 0; i < nr; i++)
        cr_expect(rows[i].pass, "%s %s %s dir %d: %g vs %g", cls, shapes[s], rows[i].tensor, rows[i].dir, rows[i].vjp,
                  rows[i].jvp);
      free(rows);
      h_free(&in);
    }
}
