/* test_gpu_backend.c: the CUDA backend's seam ops against the CPU backend:
 * metrics (same values, deterministic), float64 and bf16 GEMMs, device
 * errors, fences (each unit's queued metrics filled at its own fence while
 * the next unit reuses the buffers). Every test skips without a device. */
#include <string.h>

#include "gpu_common.h"
#include "core/memo.h"
#include "numerics/formats.h"

Test(gpu_backend, bad_index_is_input_error) {
  const qc_backend *be = gpu_or_skip();
  qc_backend_close(be);
  const qc_backend *bad = NULL;
  qc_err_clear();
  int rc = qc_backend_open("cuda:99", &bad);
  cr_expect_eq(rc, QC_EINPUT, "cuda:99 gave %d", rc);
  cr_expect_null(bad);
  cr_expect(strstr(qc_err_msg(), "out of range") != NULL, "message: %s", qc_err_msg());
}

Test(gpu_backend, metrics_match_cpu_and_repeat_bitwise) {
  const qc_backend *be = gpu_or_skip();
  const int64_t n = 1000003; /* not a multiple of the kernel's step */
  double *g = gpu_randn(n, 1, 1.0), *r = gpu_randn(n, 2, 1.0);
  for (int64_t i = 0; i < n; i++) g[i] = r[i] + 1e-3 * g[i];
  g[17] = NAN;
  g[999999] = INFINITY;
  /* a tie for the max: the lower index must win */
  g[5000] = r[5000] + 7.0;
  g[900000] = r[900000] + 7.0;
  qc_metrics c, a, b;
  qc_metrics_compute(g, r, n, &c);
  cr_assert_eq(be->metrics(be, g, r, n, &a), QC_OK, "%s", qc_err_msg());
  cr_assert_eq(be->metrics(be, g, r, n, &b), QC_OK, "%s", qc_err_msg());
  cr_expect_eq(memcmp(&a, &b, sizeof a), 0, "two GPU runs differ");
  cr_expect_eq(a.nonfinite, 2);
  cr_expect_eq(a.nonfinite, c.nonfinite);
  cr_expect_eq(a.worst, c.worst, "worst %lld vs cpu %lld", (long long)a.worst, (long long)c.worst);
  cr_expect_eq(a.worst, 5000);
  cr_expect_eq(a.max_abs, c.max_abs);
  cr_expect(fabs(a.norm_g - c.norm_g) <= 1e-12 * c.norm_g);
  cr_expect(fabs(a.norm_r - c.norm_r) <= 1e-12 * c.norm_r);
  cr_expect(fabs(a.rel_l2 - c.rel_l2) <= 1e-12 * c.rel_l2, "rel_l2 %.17g vs %.17g", a.rel_l2, c.rel_l2);
  cr_expect(fabs(a.cosine - c.cosine) <= 1e-12);
  free(g);
  free(r);
  qc_backend_close(be);
}

Test(gpu_backend, metrics_all_nonfinite_and_empty) {
  const qc_backend *be = gpu_or_skip();
  double g[3] = {NAN, INFINITY, -INFINITY}, r[3] = {1, 2, 3};
  qc_metrics a, c;
  qc_metrics_compute(g, r, 3, &c);
  cr_assert_eq(be->metrics(be, g, r, 3, &a), QC_OK, "%s", qc_err_msg());
  cr_expect_eq(a.nonfinite, 3);
  cr_expect_eq(a.worst, -1);
  cr_expect_eq(a.max_abs, c.max_abs);
  cr_assert_eq(be->metrics(be, g, r, 0, &a), QC_OK, "%s", qc_err_msg());
  cr_expect_eq(a.worst, -1);
  cr_expect_eq(a.nonfinite, 0);
  qc_backend_close(be);
}

/* op(A) [m,k] op(B) [k,n] on both backends, every transpose, odd sizes. */
Test(gpu_backend, gemm_f64_matches_cpu) {
  const qc_backend *be = gpu_or_skip(), *cpu = qc_backend_cpu();
  const int64_t m = 67, n = 45, k = 131;
  double *A = gpu_randn(m * k, 3, 1.0), *B = gpu_randn(k * n, 4, 1.0);
  double *c1 = calloc((size_t)(m * n), 8), *c2 = calloc((size_t)(m * n), 8);
  for (int ta = 0; ta < 2; ta++)
    for (int tb = 0; tb < 2; tb++) {
      int64_t lda = ta ? m : k, ldb = tb ? k : n;
      cr_assert_eq(cpu->gemm_f64(cpu, ta, tb, m, n, k, A, lda, B, ldb, c1, n), QC_OK);
      cr_assert_eq(be->gemm_f64(be, ta, tb, m, n, k, A, lda, B, ldb, c2, n), QC_OK, "%s", qc_err_msg());
      double rel = gpu_rel(c2, c1, m * n);
      cr_expect(rel <= 1e-14, "ta %d tb %d: rel %.3g", ta, tb, rel);
    }
  free(A); free(B); free(c1); free(c2);
  qc_backend_close(be);
}

/* Host operands and results above 4 MiB pass through two pinned 64 MiB
 * chunks (gemm.cu, stage_up / stage_down): a 69 MB op(A) (two chunks, the
 * second partial) and then a 69 MB C, against the same DGEMM on device
 * buffers filled by plain copies (bit for bit) and against the CPU. */
Test(gpu_backend, gemm_f64_large_operands_through_pinned_chunks, .timeout = 300) {
  const qc_backend *be = gpu_or_skip(), *cpu = qc_backend_cpu();
  const int64_t shapes[2][3] = {{4100, 5, 2100}, {4100, 2100, 3}}; /* m, n, k */
  for (int s = 0; s < 2; s++) {
    const int64_t m = shapes[s][0], n = shapes[s][1], k = shapes[s][2];
    double *A = gpu_randn(m * k, 11 + s, 1.0), *B = gpu_randn(k * n, 13 + s, 1.0);
    double *c1 = calloc((size_t)(m * n), 8), *c2 = calloc((size_t)(m * n), 8), *c3 = calloc((size_t)(m * n), 8);
    void *dA = NULL, *dB = NULL, *dC = NULL;
    cr_assert(A && B && c1 && c2 && c3);
    cr_assert_eq(be->gemm_f64(be, QC_OP_N, QC_OP_N, m, n, k, A, k, B, n, c1, n), QC_OK, "%s", qc_err_msg());
    cr_assert_eq(be->buf_alloc(be, (size_t)(m * k) * 8, "A", &dA), QC_OK);
    cr_assert_eq(be->buf_alloc(be, (size_t)(k * n) * 8, "B", &dB), QC_OK);
    cr_assert_eq(be->buf_alloc(be, (size_t)(m * n) * 8, "C", &dC), QC_OK);
    cr_assert_eq(be->upload(be, dA, A, (size_t)(m * k) * 8), QC_OK);
    cr_assert_eq(be->upload(be, dB, B, (size_t)(k * n) * 8), QC_OK);
    cr_assert_eq(be->gemm_f64_buf(be, QC_OP_N, QC_OP_N, m, n, k, dA, k, dB, n, dC, n), QC_OK, "%s", qc_err_msg());
    cr_assert_eq(be->download(be, c2, dC, (size_t)(m * n) * 8), QC_OK);
    cr_expect_eq(memcmp(c1, c2, (size_t)(m * n) * 8), 0, "shape %d: the staged GEMM differs from the one on device buffers", s);
    cr_assert_eq(cpu->gemm_f64(cpu, QC_OP_N, QC_OP_N, m, n, k, A, k, B, n, c3, n), QC_OK);
    double rel = gpu_rel(c1, c3, m * n);
    cr_expect(rel <= 1e-14, "shape %d: rel %.3g against the CPU", s, rel);
    be->buf_free(be, dA), be->buf_free(be, dB), be->buf_free(be, dC);
    free(A), free(B), free(c1), free(c2), free(c3);
  }
  qc_backend_close(be);
}

Test(gpu_backend, gemm_bf16_matches_cpu) {
  const qc_backend *be = gpu_or_skip(), *cpu = qc_backend_cpu();
  const int64_t m = 64, n = 48, k = 272;
  double *a = gpu_randn(m * k, 5, 1.0), *b = gpu_randn(k * n, 6, 1.0);
  uint16_t *A = malloc((size_t)(m * k) * 2), *B = malloc((size_t)(k * n) * 2);
  float *c1 = calloc((size_t)(m * n), 4), *c2 = calloc((size_t)(m * n), 4);
  double *d1 = malloc((size_t)(m * n) * 8), *d2 = malloc((size_t)(m * n) * 8);
  for (int64_t i = 0; i < m * k; i++) A[i] = qc_f32_to_bf16((float)a[i]);
  for (int64_t i = 0; i < k * n; i++) B[i] = qc_f32_to_bf16((float)b[i]);
  for (int ta = 0; ta < 2; ta++)
    for (int tb = 0; tb < 2; tb++) {
      int64_t lda = ta ? m : k, ldb = tb ? k : n;
      cr_assert_eq(cpu->gemm_bf16(cpu, ta, tb, m, n, k, A, lda, B, ldb, c1, n), QC_OK);
      cr_assert_eq(be->gemm_bf16(be, ta, tb, m, n, k, A, lda, B, ldb, c2, n), QC_OK, "%s", qc_err_msg());
      for (int64_t i = 0; i < m * n; i++) { d1[i] = c1[i]; d2[i] = c2[i]; }
      double rel = gpu_rel(d2, d1, m * n);
      /* exact bf16 products, fp32 sums in another order: float32 rounding only */
      cr_expect(rel <= 1e-6, "ta %d tb %d: rel %.3g", ta, tb, rel);
    }
  free(a); free(b); free(A); free(B); free(c1); free(c2); free(d1); free(d2);
  qc_backend_close(be);
}

/* rel_l2 of the queued metrics m against the host's for g (on r), n doubles. */
static void expect_metrics(const qc_metrics *m, const double *g, const double *r, int64_t n, const char *what, int i) {
  qc_metrics c;
  qc_metrics_compute(g, r, n, &c);
  cr_expect(fabs(m->rel_l2 - c.rel_l2) <= 1e-12 * c.rel_l2, "%s %d: rel_l2 %.17g vs cpu %.17g", what, i, m->rel_l2, c.rel_l2);
  cr_expect(fabs(m->norm_g - c.norm_g) <= 1e-12 * c.norm_g, "%s %d: norm_g %.17g vs cpu %.17g", what, i, m->norm_g, c.norm_g);
}

/* Two units as the contract sweep pipelines them: unit A's metrics queued
 * and fenced, then unit B uploads other data into the same buffers and
 * queues more metrics than the device keeps pending (a sync inside B while
 * A's fence is out), then A's fence is waited for: A's rows hold A's
 * values, B's rows B's. A fence set twice is refused; a sync fills a
 * fence's metrics and its wait then has nothing to do. */
Test(gpu_backend, fences_keep_each_units_metrics) {
  const qc_backend *be = gpu_or_skip();
  const int64_t n = 4099;
  enum { NA = 5, NB = 70 };
  double *r = gpu_randn(n, 11, 1.0), *ga = gpu_randn(n, 12, 1e-3), *gb = gpu_randn(n, 13, 1e-2);
  for (int64_t i = 0; i < n; i++) {
    ga[i] += r[i];
    gb[i] += r[i];
  }
  void *dr = NULL, *dg = NULL;
  qc_metrics ma[NA], mb[NB], mc;
  memset(ma, 0, sizeof ma);
  memset(mb, 0, sizeof mb);
  cr_assert_eq(be->buf_alloc(be, (size_t)n * 8, "r", &dr), QC_OK, "%s", qc_err_msg());
  cr_assert_eq(be->buf_alloc(be, (size_t)n * 8, "g", &dg), QC_OK, "%s", qc_err_msg());
  cr_assert_eq(be->upload(be, dr, r, (size_t)n * 8), QC_OK, "%s", qc_err_msg());
  cr_assert_eq(be->upload(be, dg, ga, (size_t)n * 8), QC_OK, "%s", qc_err_msg());
  for (int i = 0; i < NA; i++) /* g and r swapped on odd rows: two different values */
    cr_assert_eq(i % 2 ? be->metrics_buf(be, dr, dg, n, &ma[i]) : be->metrics_buf(be, dg, dr, n, &ma[i]), QC_OK, "%s", qc_err_msg());
  cr_assert_eq(be->fence(be, 0), QC_OK, "%s", qc_err_msg());
  qc_err_clear();
  cr_expect_eq(be->fence(be, 0), QC_ESYS, "fence 0 set again before its wait");
  qc_err_clear();
  cr_assert_eq(be->upload(be, dg, gb, (size_t)n * 8), QC_OK, "%s", qc_err_msg());
  for (int i = 0; i < NB; i++) cr_assert_eq(be->metrics_buf(be, dg, dr, n, &mb[i]), QC_OK, "%s", qc_err_msg());
  cr_assert_eq(be->fence(be, 1), QC_OK, "%s", qc_err_msg());
  cr_assert_eq(be->wait_fence(be, 0), QC_OK, "%s", qc_err_msg());
  for (int i = 0; i < NA; i++) expect_metrics(&ma[i], i % 2 ? r : ga, i % 2 ? ga : r, n, "unit A row", i);
  cr_assert_eq(be->wait_fence(be, 1), QC_OK, "%s", qc_err_msg());
  for (int i = 0; i < NB; i++) expect_metrics(&mb[i], gb, r, n, "unit B row", i);
  /* a sync drains an outstanding fence */
  memset(&mc, 0, sizeof mc);
  cr_assert_eq(be->metrics_buf(be, dg, dr, n, &mc), QC_OK, "%s", qc_err_msg());
  cr_assert_eq(be->fence(be, 0), QC_OK, "%s", qc_err_msg());
  cr_assert_eq(be->sync(be), QC_OK, "%s", qc_err_msg());
  expect_metrics(&mc, gb, r, n, "synced row", 0);
  cr_expect_eq(be->wait_fence(be, 0), QC_OK, "%s", qc_err_msg());
  qc_err_clear();
  cr_expect_eq(be->fence(be, QC_FENCES), QC_ESYS, "a fence out of range");
  qc_err_clear();
  be->buf_free(be, dr);
  be->buf_free(be, dg);
  free(r);
  free(ga);
  free(gb);
  qc_backend_close(be);
}

/* One gemm_f64_x operand of rows x cols (leading dimension ld) in dt, from
 * float64 values v (float32 / float16 / bfloat16: rounded there, so the
 * operand holds values of its dtype): its storage, the caller's to free. */
static void *x_store(const double *v, int64_t n, qc_dtype dt) {
  void *p = malloc((size_t)n * qc_dtype_size(dt) + 8);
  for (int64_t i = 0; i < n; i++) {
    if (dt == QC_F64) ((double *)p)[i] = v[i];
    else if (dt == QC_F32) ((float *)p)[i] = (float)v[i];
    else if (dt == QC_BF16) ((uint16_t *)p)[i] = qc_f32_to_bf16((float)v[i]);
    else ((uint16_t *)p)[i] = qc_f32_to_f16((float)v[i]);
  }
  return p;
}

/* gemm_f64_x on the device against gemm_f64 on the same backend fed the
 * operands as qc_gemm_x_widen reads them on the host: bit for bit, for
 * every dtype, flag and transpose, a leading dimension past the columns,
 * staged (not held by a memo scope) and kept (held: a second call finds
 * the device copy; new values at the same address after the scope changed
 * are read again). The CPU backend's gemm_f64_x is the same widening, then
 * dgemm: within 1e-14. */
Test(gpu_backend, gemm_f64_x_matches_widened_operands, .timeout = 300) {
  const qc_backend *be = gpu_or_skip(), *cpu = qc_backend_cpu();
  const int64_t m = 37, n = 29, k = 300; /* k x n large enough to pass the pinned chunks at 4 MiB: below; see the kept case */
  const qc_dtype dts[4] = {QC_F64, QC_F32, QC_BF16, QC_F16};
  double *va = gpu_randn(m * (k + 3), 21, 3.0), *vb = gpu_randn((k + 5) * (n + 5), 22, 0.25);
  va[5] = -0.0, va[6] = 1e-30, vb[7] = 65504.0; /* a signed zero, a float32 subnormal's neighbourhood, float16's largest */
  double *c1 = calloc((size_t)(m * n), 8), *c2 = calloc((size_t)(m * n), 8), *c3 = calloc((size_t)(m * n), 8);
  int cases = 0;
  for (int da = 0; da < 4; da++)
    for (int db = 0; db < 4; db++)
      for (unsigned fl = 0; fl < 4; fl++)
        for (int ta = 0; ta < 2; ta++) {
          const int tb = (da + db + (int)fl) & 1;
          const int64_t ar = ta ? k : m, ac = ta ? m : k, br = tb ? n : k, bc = tb ? k : n;
          const int64_t lda = ac + 3, ldb = bc + 5;
          void *pa = x_store(va, ar * lda, dts[da]), *pb = x_store(vb, br * ldb, dts[db]);
          const qc_gemm_x A = {pa, dts[da], lda, fl}, B = {pb, dts[db], ldb, fl ^ 3u};
          const double *wa, *wb;
          double *oa, *ob;
          cr_assert_eq(qc_gemm_x_widen(&A, ar, ac, &wa, &oa), QC_OK);
          cr_assert_eq(qc_gemm_x_widen(&B, br, bc, &wb, &ob), QC_OK);
          cr_assert_eq(be->gemm_f64(be, ta, tb, m, n, k, wa, lda, wb, ldb, c1, n), QC_OK, "%s", qc_err_msg());
          cr_assert_eq(be->gemm_f64_x(be, ta, tb, m, n, k, &A, &B, c2, n), QC_OK, "%s", qc_err_msg());
          cr_expect_eq(memcmp(c1, c2, (size_t)(m * n) * 8), 0, "dtypes %s %s flags %u ta %d tb %d: not bit for bit",
                       qc_dtype_name(dts[da]), qc_dtype_name(dts[db]), fl, ta, tb);
          cr_assert_eq(cpu->gemm_f64_x(cpu, ta, tb, m, n, k, &A, &B, c3, n), QC_OK);
          cr_expect(gpu_rel(c2, c3, m * n) <= 1e-14, "dtypes %d %d flags %u: the CPU's differs", da, db, fl);
          free(oa), free(ob), free(pa), free(pb);
          cases++;
        }
  cr_expect_eq(cases, 128);

  /* kept: a float32 weight of 2.2 MB and a bf16 one of 8.4 MB (the pinned
   * chunks' path) in a memo scope's tensor set */
  const int64_t kk = 2048, nn = 2048;
  qc_tset set = {0};
  qc_tensor w = {0};
  const int64_t ws[2] = {nn, kk};
  cr_assert_eq(qc_tensor_alloc(&w, "weight", QC_BF16, 2, ws), QC_OK);
  double *vw = gpu_randn(nn * kk, 23, 0.1), *vx = gpu_randn(m * kk, 24, 1.0);
  for (int64_t i = 0; i < nn * kk; i++) ((uint16_t *)w.data)[i] = qc_f32_to_bf16((float)vw[i]);
  cr_assert_eq(qc_tset_add(&set, &w), QC_OK);
  const qc_tset *sets[1] = {&set};
  double *y1 = calloc((size_t)(m * nn), 8), *y2 = calloc((size_t)(m * nn), 8), *y3 = calloc((size_t)(m * nn), 8);
  float *xf = x_store(vx, m * kk, QC_F32);
  const qc_gemm_x X = {xf, QC_F32, kk, 0};
  qc_gemm_x W = {set.t[0].data, QC_BF16, kk, 0};
  qc_memo_scope(sets, 1);
  cr_expect(qc_memo_holds(W.p, (size_t)(nn * kk) * 2), "the scope holds its tensor");
  cr_expect(!qc_memo_holds(xf, (size_t)(m * kk) * 4), "nor anything else");
  cr_assert_eq(be->gemm_f64_x(be, QC_OP_N, QC_OP_T, m, nn, kk, &X, &W, y1, nn), QC_OK, "%s", qc_err_msg());
  W.flags = QC_GX_ABS; /* the kept copy again, read another way */
  cr_assert_eq(be->gemm_f64_x(be, QC_OP_N, QC_OP_T, m, nn, kk, &X, &W, y2, nn), QC_OK, "%s", qc_err_msg());
  W.flags = 0;
  cr_assert_eq(cpu->gemm_f64_x(cpu, QC_OP_N, QC_OP_T, m, nn, kk, &X, &W, y3, nn), QC_OK);
  cr_expect(gpu_rel(y1, y3, m * nn) <= 1e-14, "kept: against the CPU");
  W.flags = QC_GX_ABS;
  cr_assert_eq(cpu->gemm_f64_x(cpu, QC_OP_N, QC_OP_T, m, nn, kk, &X, &W, y3, nn), QC_OK);
  cr_expect(gpu_rel(y2, y3, m * nn) <= 1e-14, "kept, |W|: against the CPU");
  /* the same address, new values, a new scope: read again, not the old copy */
  qc_memo_scope(NULL, 0);
  for (int64_t i = 0; i < nn * kk; i++) ((uint16_t *)set.t[0].data)[i] = qc_f32_to_bf16((float)(-2.0 * vw[i]));
  qc_memo_scope(sets, 1);
  W.flags = 0;
  cr_assert_eq(be->gemm_f64_x(be, QC_OP_N, QC_OP_T, m, nn, kk, &X, &W, y2, nn), QC_OK, "%s", qc_err_msg());
  double worst = 0;
  for (int64_t i = 0; i < m * nn; i++) worst = fmax(worst, fabs(y2[i] + 2.0 * y1[i]));
  cr_expect(worst == 0, "after the scope changed the old copy was used (|y2 + 2 y1| up to %g)", worst);
  qc_memo_scope(NULL, 0);
  qc_tset_free(&set);
  free(vw), free(vx), free(xf), free(y1), free(y2), free(y3);
  free(va), free(vb), free(c1), free(c2), free(c3);
  qc_backend_close(be);
}
