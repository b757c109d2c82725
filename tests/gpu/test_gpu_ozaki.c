/* test_gpu_ozaki.c: the fast reference (--reference fast: the Ozaki scheme
 * on int8 tensor cores, src/backend/cuda/ozaki.cu) against DGEMM on the
 * device: every element within the a-priori bound of docs/gpu.md on odd
 * shapes (k not a multiple of 16, odd m and n, a contraction longer than
 * one int32-safe chunk, every transpose), zero rows and columns exact,
 * huge dynamic range, non-finite operands flagged; and the fused audit
 * with the fast reference: the same metrics and verdicts as with DGEMM, a
 * too-coarse reference (2 slices) caught by the self-check and recomputed
 * in float64, bit-identical reruns; --reference auto: the fast reference
 * at the prefill shape, DGEMM at decode, float64's verdicts. Skips
 * without a device. */
#include <stdio.h>
#include <string.h>

#include "backend/cuda/cuda.h"
#include "gpu_common.h"
#include "model/check.h"
#include "numerics/formats.h"

typedef int (*ref_gemm_fn)(const qc_backend *, int, qc_op, qc_op, int64_t, int64_t, int64_t, const double *, int64_t,
                           const double *, int64_t, double *, int64_t, double[4], unsigned *);

static ref_gemm_fn ref_gemm_hook(void) {
  ref_gemm_fn f;
  void *sym = qc_backend_cuda_sym("qc_cuda_ref_gemm");
  cr_assert(sym, "the CUDA backend has no qc_cuda_ref_gemm");
  memcpy(&f, &sym, sizeof f);
  return f;
}

/* n values rounded to bf16 (the audit's operands are bf16 or dequantized). */
static double *bf16_randn(int64_t n, uint64_t seed, double scale) {
  double *a = gpu_randn(n, seed, scale);
  for (int64_t i = 0; i < n; i++) a[i] = qc_bf16_to_f32(qc_f32_to_bf16((float)a[i]));
  return a;
}

static void *dev_copy(const qc_backend *be, const void *h, size_t bytes) {
  void *d = NULL;
  cr_assert_eq(be->buf_alloc(be, bytes ? bytes : 8, "test buffer", &d), QC_OK, "%s", qc_err_msg());
  if (bytes && h) cr_assert_eq(be->upload(be, d, h, bytes), QC_OK, "%s", qc_err_msg()); /* h NULL: an output buffer */
  return d;
}

/* The smallest e with |v| < 2^e over a row of op(A) (i) or a column of op(B) (j). */
static int row_exp(const double *p, int64_t k, int64_t s_elem) {
  int e = -100000, x;
  for (int64_t l = 0; l < k; l++)
    if (p[l * s_elem] != 0) {
      frexp(p[l * s_elem], &x);
      if (x > e) e = x;
    }
  return e;
}

typedef struct {
  double rel;      /* ||fast - dgemm|| / ||dgemm|| */
  double worst;    /* max over elements of |fast - dgemm| / its bound */
  double check[4]; /* the self-check */
  unsigned nonfinite;
} cmp_out;

/* fast (S slices) against DGEMM for C[m, n] = op(A) op(B), row-major
 * operands as gemm_f64 takes them; every element against the bound
 * (S + 2) 2^(-7S) k 2^(e_i + f_j) + 4 k 2^-53 sum |a||b| (docs/gpu.md). */
static void compare(const qc_backend *be, int S, qc_op ta, qc_op tb, int64_t m, int64_t n, int64_t k, const double *A,
                    const double *B, cmp_out *r) {
  ref_gemm_fn f = ref_gemm_hook();
  const int64_t lda = ta == QC_OP_N ? k : m, ldb = tb == QC_OP_N ? n : k;
  const size_t na = (size_t)(m * k), nb = (size_t)(k * n), nc = (size_t)(m * n);
  void *dA = dev_copy(be, A, na * 8), *dB = dev_copy(be, B, nb * 8), *dC = dev_copy(be, NULL, nc * 8),
       *dR = dev_copy(be, NULL, nc * 8);
  double *C = malloc(nc * 8), *R = malloc(nc * 8), chk[4];
  unsigned nf = 0;
  cr_assert(C && R);
  cr_assert_eq(f(be, 0, ta, tb, m, n, k, dA, lda, dB, ldb, dR, n, chk, &nf), QC_OK, "%s", qc_err_msg());
  cr_assert_eq(f(be, S, ta, tb, m, n, k, dA, lda, dB, ldb, dC, n, r->check, &r->nonfinite), QC_OK, "%s", qc_err_msg());
  cr_assert_eq(be->download(be, C, dC, nc * 8), QC_OK);
  cr_assert_eq(be->download(be, R, dR, nc * 8), QC_OK);
  const int64_t sar = ta == QC_OP_N ? lda : 1, sal = ta == QC_OP_N ? 1 : lda;
  const int64_t sbl = tb == QC_OP_N ? ldb : 1, sbc = tb == QC_OP_N ? 1 : ldb;
  int *ea = malloc((size_t)m * sizeof *ea), *eb = malloc((size_t)n * sizeof *eb);
  for (int64_t i = 0; i < m; i++) ea[i] = row_exp(A + i * sar, k, sal);
  for (int64_t j = 0; j < n; j++) eb[j] = row_exp(B + j * sbc, k, sbl);
  r->worst = 0;
  for (int64_t i = 0; i < m; i++)
    for (int64_t j = 0; j < n; j++) {
      double sc = 0;
      for (int64_t l = 0; l < k; l++) sc += fabs(A[i * sar + l * sal] * B[l * sbl + j * sbc]);
      double d = fabs(C[i * n + j] - R[i * n + j]);
      if (sc == 0) {
        cr_expect_eq(C[i * n + j], 0.0, "[%lld %lld %lld] S %d: C[%lld, %lld] = %g of a zero row or column", (long long)m,
                     (long long)n, (long long)k, S, (long long)i, (long long)j, C[i * n + j]);
        continue;
      }
      double bound = (S + 2) * ldexp((double)k, ea[i] + eb[j] - 7 * S) + 4.0 * (double)k * ldexp(sc, -53) + 1e-300;
      if (d / bound > r->worst) r->worst = d / bound;
    }
  r->rel = gpu_rel(C, R, (int64_t)nc);
  cr_expect(r->worst <= 1.0, "[%lld %lld %lld] ta %d tb %d S %d: an element beyond the a-priori bound (%.3g of it)",
            (long long)m, (long long)n, (long long)k, ta, tb, S, r->worst);
  free(ea); free(eb); free(C); free(R);
  be->buf_free(be, dA); be->buf_free(be, dB); be->buf_free(be, dC); be->buf_free(be, dR);
}

/* The self-check's gate: both errors below 1e-3 of the sample's noise floor. */
static int gate_ok(const double c[4]) {
  double nrm = fmax(sqrt(c[2]), 1e-30), gate = 1e-3 * sqrt(c[3]) / nrm;
  return c[0] <= gate && sqrt(c[1]) / nrm <= gate;
}

Test(gpu_ozaki, against_dgemm_odd_shapes, .timeout = 600) {
  const qc_backend *be = gpu_or_skip();
  static const int64_t shapes[][3] = {{37, 130, 200}, {1, 64, 256}, {33, 17, 15}, {300, 257, 384}, {16, 7, 1},
                                      {5, 3, 50000}, {64, 48, 4096}, {3, 5, 140000}};
  for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++)
    for (int tr = 0; tr < 4; tr++) {
      const int64_t m = shapes[s][0], n = shapes[s][1], k = shapes[s][2];
      qc_op ta = tr & 1 ? QC_OP_T : QC_OP_N, tb = tr & 2 ? QC_OP_T : QC_OP_N;
      double *A = bf16_randn(m * k, 11 + s, 1.0), *B = bf16_randn(k * n, 97 + s, 0.05);
      for (int S = 3; S <= 4; S++) {
        cmp_out r;
        compare(be, S, ta, tb, m, n, k, A, B, &r);
        cr_expect_eq(r.nonfinite, 0u);
        cr_expect(r.rel <= (S == 3 ? 1e-4 : 1e-6), "[%lld %lld %lld] S %d: rel diff %.3g", (long long)m, (long long)n,
                  (long long)k, S, r.rel);
        if (S == 4 && k >= 64)
          cr_expect(gate_ok(r.check), "[%lld %lld %lld] S 4: the self-check fails on plain bf16 data (%.3g, %.3g, %.3g)",
                    (long long)m, (long long)n, (long long)k, r.check[0], sqrt(r.check[1] / r.check[2]),
                    1e-3 * sqrt(r.check[3] / r.check[2]));
        if (tr == 0) printf("ozaki [%lld %lld %lld] S %d: rel %.3g, worst %.3g of the bound, check max %.3g norm %.3g gate %.3g\n",
                            (long long)m, (long long)n, (long long)k, S, r.rel, r.worst, r.check[0],
                            sqrt(r.check[1] / fmax(r.check[2], 1e-300)), 1e-3 * sqrt(r.check[3] / fmax(r.check[2], 1e-300)));
      }
      free(A);
      free(B);
    }
  qc_backend_close(be);
}

Test(gpu_ozaki, zero_rows_and_huge_range, .timeout = 300) {
  const qc_backend *be = gpu_or_skip();
  const int64_t m = 45, n = 29, k = 333;
  double *A = bf16_randn(m * k, 5, 1.0), *B = bf16_randn(k * n, 6, 1.0);
  /* zero rows of A, zero columns of B */
  for (int64_t l = 0; l < k; l++) A[3 * k + l] = A[44 * k + l] = 0, B[l * n + 0] = B[l * n + 17] = 0;
  /* rows and columns 2^-300 .. 2^300 apart, elements 2^-40 .. 2^40 within some rows */
  for (int64_t i = 0; i < m; i++)
    for (int64_t l = 0; l < k; l++) A[i * k + l] = ldexp(A[i * k + l], (int)(i % 7) * 100 - 300 + (i % 5 == 1 ? (int)(l % 81) - 40 : 0));
  for (int64_t l = 0; l < k; l++)
    for (int64_t j = 0; j < n; j++) B[l * n + j] = ldexp(B[l * n + j], (int)(j % 3) * 150 - 150);
  for (int S = 3; S <= 5; S++) {
    cmp_out r;
    compare(be, S, QC_OP_N, QC_OP_N, m, n, k, A, B, &r);
    cr_expect_eq(r.nonfinite, 0u);
    cr_expect(r.check[0] == r.check[0] && r.check[2] > 0, "S %d: the self-check is a number (%g)", S, r.check[0]);
  }
  /* the sample covers every element here (m n <= 2048): its max error is the whole matrix's */
  free(A);
  free(B);
  qc_backend_close(be);
}

Test(gpu_ozaki, nonfinite_operand_flagged) {
  const qc_backend *be = gpu_or_skip();
  ref_gemm_fn f = ref_gemm_hook();
  const int64_t m = 8, n = 8, k = 40;
  double *A = bf16_randn(m * k, 1, 1.0), *B = bf16_randn(k * n, 2, 1.0), chk[4];
  A[77] = INFINITY;
  void *dA = dev_copy(be, A, (size_t)(m * k) * 8), *dB = dev_copy(be, B, (size_t)(k * n) * 8), *dC = dev_copy(be, NULL, (size_t)(m * n) * 8);
  unsigned nf = 0;
  cr_assert_eq(f(be, 4, QC_OP_N, QC_OP_N, m, n, k, dA, k, dB, n, dC, n, chk, &nf), QC_OK, "%s", qc_err_msg());
  cr_expect(nf != 0, "a non-finite operand is flagged");
  cr_expect(!gate_ok(chk) || nf, "the audit would not keep this result");
  be->buf_free(be, dA); be->buf_free(be, dB); be->buf_free(be, dC);
  free(A); free(B);
  qc_backend_close(be);
}

/* ---- the fused audit with the fast reference ---------------------------- */


typedef struct { void *x, *w, *dy, *dxc; } dev_lin;

static void audit(const qc_backend *be, const qc_linear_audit *a, qc_linear_audit_out *o, int64_t M, int64_t K, int64_t N) {
  memset(o, 0, sizeof *o);
  o->dx_ref = malloc((size_t)(M * K) * 8);
  o->dw_ref = malloc((size_t)(N * K) * 8);
  cr_assert_eq(be->audit_linear(be, a, o), QC_OK, "%s", qc_err_msg());
}

static void audit_fast_vs_f64(const qc_backend *be, int64_t M, int64_t K, int64_t N, const char *fmt, int planted) {
  uint16_t *x = malloc((size_t)(M * K) * 2), *w = malloc((size_t)(N * K) * 2), *dy = malloc((size_t)(M * N) * 2);
  qc_rng r;
  qc_rng_seed(&r, (uint64_t)(M * 7 + K * 3 + N));
  for (int64_t i = 0; i < M * K; i++) x[i] = qc_f32_to_bf16((float)qc_rng_normal(&r));
  for (int64_t i = 0; i < N * K; i++) w[i] = qc_f32_to_bf16((float)(qc_rng_normal(&r) / sqrt((double)K)));
  for (int64_t i = 0; i < M * N; i++) dy[i] = qc_f32_to_bf16((float)qc_rng_normal(&r));
  dev_lin d = {dev_copy(be, x, (size_t)(M * K) * 2), dev_copy(be, w, (size_t)(N * K) * 2), dev_copy(be, dy, (size_t)(M * N) * 2), NULL};
  qc_linear_audit a = {.M = M, .K = K, .N = N, .x = d.x, .w = d.w, .dy = d.dy, .weight_format = fmt, .profile = "vllm"};
  if (planted) { /* a candidate d_x 3% off: both references must fail it */
    uint16_t *bad = malloc((size_t)(M * K) * 2);
    qc_linear_audit_out t = {0};
    t.dx_out = bad;
    cr_assert_eq(be->audit_linear(be, &a, &t), QC_OK, "%s", qc_err_msg());
    for (int64_t i = 0; i < M * K; i++) bad[i] = qc_f32_to_bf16(1.03f * qc_bf16_to_f32(bad[i]));
    d.dxc = dev_copy(be, bad, (size_t)(M * K) * 2);
    a.dx_cand = d.dxc;
    free(bad);
  }
  qc_linear_audit_out of, oq, oq2, o2;
  audit(be, &a, &of, M, K, N);
  a.ref_slices = 4;
  audit(be, &a, &oq, M, K, N);
  audit(be, &a, &oq2, M, K, N);
  a.ref_slices = 2;
  audit(be, &a, &o2, M, K, N);
  const char *tag = planted ? "planted" : "builtin";
  cr_expect(oq.ref_fast[0] && oq.ref_fast[1], "%s %s [%lld %lld %lld]: S 4 kept for d_x %d d_weight %d (errors %.3g %.3g, gates %.3g %.3g)",
            fmt, tag, (long long)M, (long long)K, (long long)N, oq.ref_fast[0], oq.ref_fast[1], oq.ref_err[0], oq.ref_err[1],
            oq.ref_gate[0], oq.ref_gate[1]);
  cr_expect(!of.ref_fast[0] && !of.ref_fast[1], "the float64 audit reports no fast reference");
  /* the pairs the plan chose from the sample (backend/ozplan.h): at most the full 10, and the
   * self-check, on the same sample, within the quarter of the gate the device's evidence predicted
   * (the full plan, the fallback when no shorter one fits the quarter, within the gate) */
  for (int g = 0; g < 2; g++) {
    cr_expect(oq.ref_pairs[g] >= 1 && oq.ref_pairs[g] <= 10, "%s %s: %s ran %d pairs", fmt, tag, g ? "d_weight" : "d_x", oq.ref_pairs[g]);
    const double lim = (oq.ref_pairs[g] < 10 ? 0.25 : 1.0) * oq.ref_gate[g] * (1 + 1e-6);
    cr_expect(oq.ref_err[g] <= lim && oq.ref_err_norm[g] <= lim, "%s %s: %s's self-check %.3g %.3g beyond %.3g (%d pairs, gate %.3g)",
              fmt, tag, g ? "d_weight" : "d_x", oq.ref_err[g], oq.ref_err_norm[g], lim, oq.ref_pairs[g], oq.ref_gate[g]);
    cr_expect_eq(oq.ref_pairs[g], oq2.ref_pairs[g], "the same plan on a rerun");
  }
  /* the references: normwise far below the noise floor */
  double ex = gpu_rel(oq.dx_ref, of.dx_ref, M * K), ew = gpu_rel(oq.dw_ref, of.dw_ref, N * K);
  cr_expect(ex <= 1e-3 * of.dx.noise_floor && ew <= 1e-3 * of.dw.noise_floor,
            "%s [%lld %lld %lld]: fast vs float64 reference %.3g %.3g, noise floors %.3g %.3g", fmt, (long long)M,
            (long long)K, (long long)N, ex, ew, of.dx.noise_floor, of.dw.noise_floor);
  /* the metrics and the verdicts */
  cr_expect(fabs(oq.dx.rel_l2 - of.dx.rel_l2) <= 1e-3 * of.dx.rel_l2 + 1e-12, "d_x rel_l2 fast %.9g float64 %.9g", oq.dx.rel_l2, of.dx.rel_l2);
  cr_expect(fabs(oq.dw.rel_l2 - of.dw.rel_l2) <= 1e-3 * of.dw.rel_l2 + 1e-12, "d_weight rel_l2 fast %.9g float64 %.9g", oq.dw.rel_l2, of.dw.rel_l2);
  cr_expect(fabs(oq.dx.noise_floor - of.dx.noise_floor) <= 1e-2 * of.dx.noise_floor, "d_x noise floor %.6g %.6g", oq.dx.noise_floor, of.dx.noise_floor);
  for (int i = 0; i < 3; i++) {
    double tol = i == 0 ? 1e-5 : i == 1 ? 1e-2 : 1.5 * of.dx.rel_l2;
    cr_expect_eq(gpu_verdict(&oq.dx, tol), gpu_verdict(&of.dx, tol), "%s %s d_x verdict at %g", fmt, tag, tol);
    cr_expect_eq(gpu_verdict(&oq.dw, tol), gpu_verdict(&of.dw, tol), "%s %s d_weight verdict at %g", fmt, tag, tol);
  }
  cr_expect(fabs(oq.dx.bias_z - of.dx.bias_z) <= 0.05 * fabs(of.dx.bias_z) + 0.05, "d_x bias z fast %.4g float64 %.4g", oq.dx.bias_z, of.dx.bias_z);
  if (planted) cr_expect_eq(gpu_verdict(&oq.dx, 1e-2), QC_V_FAIL, "a 3%% d_x defect passes with the fast reference");
  /* determinism */
  cr_expect_eq(memcmp(&oq.dx, &oq2.dx, sizeof oq.dx), 0, "fast d_x metrics differ between runs");
  cr_expect_eq(memcmp(oq.dw_ref, oq2.dw_ref, (size_t)(N * K) * 8), 0, "fast d_weight references differ between runs");
  /* 2 slices are too coarse: the self-check refuses them and the float64 result is used, bit for bit */
  cr_expect(!o2.ref_fast[0] && !o2.ref_fast[1], "S 2 kept (errors %.3g %.3g, gates %.3g %.3g)", o2.ref_err[0], o2.ref_err[1],
            o2.ref_gate[0], o2.ref_gate[1]);
  cr_expect(o2.ref_err[0] > o2.ref_gate[0], "S 2's self-check error %.3g is above its gate %.3g", o2.ref_err[0], o2.ref_gate[0]);
  cr_expect_eq(memcmp(o2.dx_ref, of.dx_ref, (size_t)(M * K) * 8), 0, "the fallback d_x reference is DGEMM's");
  cr_expect_eq(memcmp(&o2.dx, &of.dx, sizeof o2.dx), 0, "the fallback's d_x metrics are the float64 audit's");
  printf("ozaki audit %s %s [%lld %lld %lld]: rel_l2 d_x %.9g / %.9g, d_weight %.9g / %.9g; ref diff %.3g %.3g; check %.3g %.3g gate %.3g %.3g; pairs %d %d\n",
         fmt, tag, (long long)M, (long long)K, (long long)N, oq.dx.rel_l2, of.dx.rel_l2, oq.dw.rel_l2, of.dw.rel_l2, ex, ew,
         oq.ref_err[0], oq.ref_err[1], oq.ref_gate[0], oq.ref_gate[1], oq.ref_pairs[0], oq.ref_pairs[1]);
  qc_linear_audit_out *all[4] = {&of, &oq, &oq2, &o2};
  for (int i = 0; i < 4; i++) free(all[i]->dx_ref), free(all[i]->dw_ref);
  be->buf_free(be, d.x); be->buf_free(be, d.w); be->buf_free(be, d.dy); be->buf_free(be, d.dxc);
  free(x); free(w); free(dy);
}

Test(gpu_ozaki, audit_fast_reference_same_verdicts, .timeout = 600) {
  const qc_backend *be = gpu_or_skip();
  audit_fast_vs_f64(be, 37, 200, 130, "none", 0);
  audit_fast_vs_f64(be, 300, 384, 257, "fp8_block128", 0);
  audit_fast_vs_f64(be, 129, 512, 96, "nvfp4", 1);
  audit_fast_vs_f64(be, 16, 1024, 768, "mxfp8", 0);
  audit_fast_vs_f64(be, 1024, 768, 512, "fp8_block128", 1);
  /* d_weight's contraction of 270000 tokens: past one level GEMM's int32 range even at 2 pairs, so the
   * planned products take the per-pair, chunked path (k0 > 0, the combine accumulating) */
  audit_fast_vs_f64(be, 270000, 64, 48, "none", 0);
  qc_backend_close(be);
}

/* ---- --reference auto (refprobe.cu, backend/refcost.h) ------------------ */

/* The fused audit [M, K, N] (fp8_block128, builtin candidate) under
 * --reference auto against float64: the GEMMs auto ran (ref_ran) are
 * `want` slices for both gradients (4: the fast reference, 0: DGEMM), kept
 * when taken, and the verdicts are float64's at every bound tried (bit for
 * bit the same metrics where DGEMM ran). */
static void audit_auto(const qc_backend *be, int64_t M, int64_t K, int64_t N, int want) {
  uint16_t *x = malloc((size_t)(M * K) * 2), *w = malloc((size_t)(N * K) * 2), *dy = malloc((size_t)(M * N) * 2);
  cr_assert(x && w && dy);
  qc_rng r;
  qc_rng_seed(&r, (uint64_t)(M * 5 + K * 3 + N));
  for (int64_t i = 0; i < M * K; i++) x[i] = qc_f32_to_bf16((float)qc_rng_normal(&r));
  for (int64_t i = 0; i < N * K; i++) w[i] = qc_f32_to_bf16((float)(qc_rng_normal(&r) / sqrt((double)K)));
  for (int64_t i = 0; i < M * N; i++) dy[i] = qc_f32_to_bf16((float)qc_rng_normal(&r));
  dev_lin d = {dev_copy(be, x, (size_t)(M * K) * 2), dev_copy(be, w, (size_t)(N * K) * 2), dev_copy(be, dy, (size_t)(M * N) * 2), NULL};
  qc_linear_audit a = {.M = M, .K = K, .N = N, .x = d.x, .w = d.w, .dy = d.dy, .weight_format = "fp8_block128", .profile = "vllm"};
  qc_linear_audit_out of, oa;
  audit(be, &a, &of, M, K, N);
  a.ref_slices = QC_REF_AUTO;
  audit(be, &a, &oa, M, K, N);
  printf("reference auto [%lld %lld %lld]: ran d_x %d d_weight %d, kept %d %d (errors %.3g %.3g, gates %.3g %.3g)\n", (long long)M,
         (long long)K, (long long)N, oa.ref_ran[0], oa.ref_ran[1], oa.ref_fast[0], oa.ref_fast[1], oa.ref_err[0], oa.ref_err[1],
         oa.ref_gate[0], oa.ref_gate[1]);
  for (int g = 0; g < 2; g++) {
    cr_expect_eq(oa.ref_ran[g], want, "[%lld %lld %lld] %s: auto ran %d slices, expected %d", (long long)M, (long long)K, (long long)N,
                 g ? "d_weight" : "d_x", oa.ref_ran[g], want);
    if (want) cr_expect(oa.ref_fast[g], "%s: the fast reference kept (error %.3g, gate %.3g)", g ? "d_weight" : "d_x", oa.ref_err[g], oa.ref_gate[g]);
    cr_expect(!of.ref_ran[g] && !of.ref_fast[g], "the float64 audit ran no fast reference");
  }
  for (int i = 0; i < 3; i++) {
    double tol = i == 0 ? 1e-5 : i == 1 ? 1e-2 : 1.5 * of.dx.rel_l2;
    cr_expect_eq(gpu_verdict(&oa.dx, tol), gpu_verdict(&of.dx, tol), "d_x verdict at %g", tol);
    cr_expect_eq(gpu_verdict(&oa.dw, tol), gpu_verdict(&of.dw, tol), "d_weight verdict at %g", tol);
  }
  cr_expect(fabs(oa.dx.rel_l2 - of.dx.rel_l2) <= 1e-3 * of.dx.rel_l2 + 1e-12, "d_x rel_l2 auto %.9g float64 %.9g", oa.dx.rel_l2, of.dx.rel_l2);
  cr_expect(fabs(oa.dw.rel_l2 - of.dw.rel_l2) <= 1e-3 * of.dw.rel_l2 + 1e-12, "d_weight rel_l2 auto %.9g float64 %.9g", oa.dw.rel_l2, of.dw.rel_l2);
  if (!want) {
    cr_expect_eq(memcmp(&oa.dx, &of.dx, sizeof oa.dx), 0, "DGEMM under auto: d_x's metrics are float64's, bit for bit");
    cr_expect_eq(memcmp(&oa.dw, &of.dw, sizeof oa.dw), 0, "DGEMM under auto: d_weight's metrics are float64's, bit for bit");
  }
  qc_linear_audit_out *all[2] = {&of, &oa};
  for (int i = 0; i < 2; i++) free(all[i]->dx_ref), free(all[i]->dw_ref);
  be->buf_free(be, d.x); be->buf_free(be, d.w); be->buf_free(be, d.dy);
  free(x); free(w); free(dy);
}

/* The issue-41 shapes (an H100: 4 slices 11.2 ms against DGEMM 16.9 ms at
 * prefill; DGEMM faster at decode): auto takes the fast reference at
 * prefill and DGEMM at decode, with float64's verdicts. */
Test(gpu_ozaki, reference_auto_fast_at_prefill_dgemm_at_decode, .timeout = 600) {
  const qc_backend *be = gpu_or_skip();
  audit_auto(be, 16, 7168, 4096, 0);
  audit_auto(be, 8192, 7168, 4096, QC_REF_FAST_SLICES);
  audit_auto(be, 64, 256, 128, 0); /* small: the fast one's fixed costs dominate */
  qc_backend_close(be);
}
