/* class_harness.h: helpers for the class tests: build a generated instance
 * with a random dY, and compare a candidate VJP with the class's reference
 * through qc_metrics_compute + qc_judge, tensor by tensor. */
#ifndef QC_CLASS_HARNESS_H
#define QC_CLASS_HARNESS_H

#include <stdint.h>

#include "model/module.h"

typedef struct h_inst {
  qc_module m;
  qc_tensor dy;      /* float32 N(0,1), shaped like the forward output */
  const qc_registry_row *row;
} h_inst;

/* Generated instance of class `cls` with shape "a,b,c", seed, values
 * ("normal"/"special") and contract settings "key=value" (NULL-terminated
 * list, or NULL). Aborts the test on failure. */
void h_make(h_inst *in, const char *cls, const char *shape, uint64_t seed, const char *values, const char *const *sets);
/* The same with a contract built by the caller (values that "key=value"
 * parsing would read as numbers, e.g. lse_base "2"). */
void h_make_with(h_inst *in, const char *cls, const char *shape, uint64_t seed, const char *values, const qc_contract *c);
void h_free(h_inst *in);

/* Run cand and the reference on in with dY; judge every reference tensor
 * with rel_l2 <= tol. Returns 1 if all pass; otherwise 0 with the first
 * failing tensor's name (or "missing d_x") in fail. *worst gets the largest
 * rel_l2 seen. A candidate error returns -1. */
int h_compare(h_inst *in, qc_vjp_fn cand, double tol, char *fail, int failn, double *worst);

/* The class's production VJP. */
qc_vjp_fn h_prod(const char *cls);

/* Read t into a new float64 array (test helper for planted defects). */
double *h_f64(const qc_tensor *t);
/* Replace grads' tensor `name` with float32 data from d (n elements). */
void h_set(qc_tset *grads, const char *name, const double *d, int64_t n);



/* Run the production VJP of m's class on a shallow copy of m whose contract
 * has `kv` ("key=value") set: a trainer that used the wrong setting. */
int h_prod_with(const qc_ctx *ctx, const qc_module *m, const qc_tensor *dy, qc_tset *grads, const char *kv);

/* Assert that the builtin candidate passes (rel_l2 <= tol) on in. */
void h_expect_pass(h_inst *in, double tol);
/* Assert that candidate `cand` fails on in, naming tensor `tensor`. */
void h_expect_fail(h_inst *in, qc_vjp_fn cand, double tol, const char *tensor);


/* qatcheck fd on the class's forward and reference: every direction agrees,
 * over shapes[ns] x sets[nc] (each a NULL-terminated "key=value" list, or
 * {NULL} for the defaults), seeds seed0 + shape index. */
void h_fd_agrees(const char *cls, const char *const *shapes, int ns, const char *const (*sets)[3], int nc, uint64_t seed0);

/* Builtin vs reference over every shape x contract set x {normal,
 * heavy_tail, special} (sets may hold NULL for the class defaults) with
 * rel_l2 bounds tol (normal, heavy_tail) and tol_special; seeds count up
 * from seed. */
void h_sweep(const char *cls, const char *const *shapes, int nshapes, const char *const *const *sets, int nsets,
             uint64_t seed, double tol, double tol_special);
/* Both the reference and the production VJP refuse in (QC_EINPUT), and
 * the message names `needle`. */
void h_expect_refused(h_inst *in, const char *needle);
#endif
