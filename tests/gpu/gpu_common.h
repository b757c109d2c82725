/* gpu_common.h: helpers shared by the GPU tests: open the device or skip,
 * deterministic random data, norm-wise comparison. */
#ifndef QC_GPU_COMMON_H
#define QC_GPU_COMMON_H

#include <criterion/criterion.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "backend/backend.h"
#include "core/qc.h"
#include "core/rng.h"
#include "model/check.h"

/* The CUDA backend, or skip the test (no device, or a build without CUDA). */
static inline const qc_backend *gpu_or_skip(void) {
  const qc_backend *be = NULL;
  qc_err_clear();
  if (qc_backend_open("cuda:0", &be) != QC_OK) cr_skip_test("no CUDA device: %s", qc_err_msg());
  return be;
}

/* Set a side-by-side switch of the open CUDA backend (qc_cuda_switch of
 * backend/cuda/cuda.h: QC_CUDA_UNFUSED, QC_CUDA_QK_SCALAR, ...; the backend
 * reads the environment once, when it opens). */
static inline void gpu_switch(const qc_backend *be, const char *name, int on) {
  int (*f)(const qc_backend *, const char *, int);
  void *sym = qc_backend_cuda_sym("qc_cuda_switch");
  cr_assert(sym, "the CUDA backend has no qc_cuda_switch");
  memcpy(&f, &sym, sizeof f);
  cr_assert_eq(f(be, name, on), QC_OK, "%s", qc_err_msg());
}

/* n doubles, N(0, 1) * scale, from seed. */
static inline double *gpu_randn(int64_t n, uint64_t seed, double scale) {
  qc_rng r;
  qc_rng_seed(&r, seed);
  double *a = malloc((size_t)n * sizeof *a);
  cr_assert_not_null(a);
  for (int64_t i = 0; i < n; i++) a[i] = qc_rng_normal(&r) * scale;
  return a;
}

/* ||a - b|| / ||b|| over n doubles. */
static inline double gpu_rel(const double *a, const double *b, int64_t n) {
  double d = 0, s = 0;
  for (int64_t i = 0; i < n; i++) {
    d += (a[i] - b[i]) * (a[i] - b[i]);
    s += b[i] * b[i];
  }
  return sqrt(d) / (sqrt(s) > 0 ? sqrt(s) : 1);
}

/* The verdict of metrics m under a rel_l2 bound alone (the bias test off:
 * the tests compare it on its own, with the engine's allowance). */
static inline int gpu_verdict(const qc_metrics *m, double rel) {
  qc_tol t;
  char why[256];
  memset(&t, 0, sizeof t);
  t.has_rel_l2 = 1;
  t.rel_l2 = rel;
  t.has_bias_z = 1;
  return qc_judge(m, &t, why, sizeof why);
}

#endif
