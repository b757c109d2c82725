/* cpu_linear.c: the in-memory layer-1 audit of a generated linear (the
 * reference VJP, the builtin candidate VJP and the comparison: exactly what
 * `qatcheck vjp` runs per module and dY) against the bare BLAS calls it
 * needs (2 DGEMM + 2 SGEMM of the same shapes), interleaved, best of R.
 * Input generation is timed apart (it stands in for reading a dump).
 *   usage: cpu_linear M K N R [floor]
 * With "floor", only the BLAS calls are timed and their best seconds printed
 * (bench/cpu_linear.sh sets the whole command against it). */
#include <cblas.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "engine/audit.h"
#include "backend/backend.h"
#include "model/case.h"
#include "engine/gen.h"
#include "core/par.h"
#include "core/qc.h"
#include "numerics/decode.h"

static double now(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

int main(int argc, char **argv) {
  int floor_only = argc == 6 && strcmp(argv[5], "floor") == 0;
  if (argc != 5 && !floor_only) { fprintf(stderr, "usage: cpu_linear M K N REPEATS [floor]\n"); return 2; }
  qc_mem_tune();
  qc_blas_tune(); /* as qatcheck runs: the floor too */
  long M = atol(argv[1]), K = atol(argv[2]), N = atol(argv[3]), R = atol(argv[4]);
  char text[1024];
  snprintf(text, sizeof text,
           "{\"module\": \"linear\", \"data\": {\"generate\": {\"shapes\": [[%ld, %ld, %ld, 0]]}}, \"dy\": [\"random\"],"
           "\"tolerances\": {\"d_x\": {\"rel_l2\": 4e-3, \"reasoning\": \"bench\"}, \"d_weight\": {\"rel_l2\": 4e-3, "
           "\"reasoning\": \"bench\"}}}", M, K, N);
  static qc_case cs;
  if (qc_case_parse(text, "bench", ".", &cs)) { qc_err_print(); return 2; }
  const qc_registry_row *row = qc_registry_find("linear");
  qc_module m;
  memset(&m, 0, sizeof m);
  m.cls = row->cls;
  if (qc_contract_validate(&m.contract, row->cls->keys, "bench")) { qc_err_print(); return 2; }
  double t0 = now();
  if (qc_gen_module(row, cs.shape_n[0], cs.shapes[0], 0, 0, "normal", (const char (*)[QC_NAMELEN])cs.dy, 1, &m)) {
    qc_err_print();
    return 2;
  }
  double t_gen = now() - t0;
  /* the floor's operands: float64 and float32 copies of the same values */
  double *x = malloc(sizeof(double) * M * K), *w = malloc(sizeof(double) * N * K), *g = malloc(sizeof(double) * M * N);
  double *dx = malloc(sizeof(double) * M * K), *dw = malloc(sizeof(double) * N * K);
  float *xf = malloc(sizeof(float) * M * K), *wf = malloc(sizeof(float) * N * K), *gf = malloc(sizeof(float) * M * N);
  float *dxf = malloc(sizeof(float) * M * K), *dwf = malloc(sizeof(float) * N * K);
  if (!x || !w || !g || !dx || !dw || !xf || !wf || !gf || !dxf || !dwf) { fprintf(stderr, "out of memory\n"); return 2; }
  qc_tensor_to_f64(qc_tset_get(&m.inputs, "x"), x);
  qc_tensor_to_f64(qc_tset_get(&m.params, "weight"), w);
  qc_tensor_to_f64(&m.grad_out.t[0], g);
  for (long i = 0; i < M * K; i++) xf[i] = (float)x[i];
  for (long i = 0; i < N * K; i++) wf[i] = (float)w[i];
  for (long i = 0; i < M * N; i++) gf[i] = (float)g[i];
  qc_ctx ctx = {.be = qc_backend_cpu(), .profile = "vllm"};
  double best_a = 1e30, best_f = 1e30;
  for (long r = 0; r < R; r++) {
    double a = now();
    cblas_dgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, M, K, N, 1, g, N, w, K, 0, dx, K);
    cblas_dgemm(CblasRowMajor, CblasTrans, CblasNoTrans, N, K, M, 1, g, N, x, K, 0, dw, K);
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, M, K, N, 1, gf, N, wf, K, 0, dxf, K);
    cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, N, K, M, 1, gf, N, xf, K, 0, dwf, K);
    double f = now() - a;
    if (f < best_f) best_f = f;
    if (floor_only) continue;
    qc_results res = {0};
    qc_audit au = {.ctx = &ctx, .cs = &cs, .res = &res};
    a = now();
    int rc = qc_audit_module(&au, &m);
    double t = now() - a;
    if (rc || qc_results_verdict(&res) != 0) { qc_err_print(); fprintf(stderr, "audit did not pass\n"); return 1; }
    qc_results_free(&res);
    if (t < best_a) best_a = t;
  }
  if (floor_only) {
    printf("%.6f\n", best_f);
    qc_module_free(&m);
    return 0;
  }
  printf("linear %ldx%ldx%ld: audit %.3f s, BLAS floor %.3f s, ratio %.2f (target <= 1.2); input generation %.3f s apart\n",
         M, K, N, best_a, best_f, best_a / best_f, t_gen);
  qc_module_free(&m);
  return 0;
}
