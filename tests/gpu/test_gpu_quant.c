/* test_gpu_quant.c: the GPU quantizers against the CPU quantizers of
 * src/numerics for every producer path (profile) and format (payload bytes,
 * negative zero included, scales, the global scale and dequantized values:
 * identical; the GPU runs rcp.approx and log2f themselves, the CPU their
 * measured tables), against the vllm scale formulas evaluated here in C
 * float32, and for self-consistency (deq = decode(q) * s, scale bytes,
 * error bounded by the format's step); and the tables themselves against
 * the hardware over every float32 input. Skips without a device. */
#include <string.h>

#include "backend/cuda/cuda.h"
#include "gpu_common.h"
#include "numerics/formats.h"
#include "numerics/ptables.h"
#include "numerics/quant.h"

static uint32_t fb(float x) { uint32_t u; memcpy(&u, &x, 4); return u; }
static float bf(uint32_t u) { float x; memcpy(&x, &u, 4); return x; }
static float ceil2f(float s) { uint32_t u = fb(s); if (u & 0x7fffffu) u = (u & 0xff800000u) + 0x800000u; return bf(u); }

/* A [rows, cols] test matrix: normals over 2^-10..2^9 row scales, a zero
 * row, a zero 128x128 tile, tiny negatives (negative zeros), exact powers
 * of two, values that hit the floors. */
static float *qdata(int64_t rows, int64_t cols, uint64_t seed) {
  double *n = gpu_randn(rows * cols, seed, 1.0);
  float *x = malloc((size_t)(rows * cols) * 4);
  for (int64_t i = 0; i < rows; i++)
    for (int64_t j = 0; j < cols; j++) x[i * cols + j] = (float)(n[i * cols + j] * ldexp(1.0, (int)(i % 20) - 10));
  free(n);
  /* planted rows, only where the matrix has them */
  for (int64_t j = 0; rows > 3 && j < cols; j++) x[3 * cols + j] = 0.0f;                     /* zero row */
  for (int64_t i = 128; i < rows && i < 256; i++)
    for (int64_t j = 0; j < 128 && j < cols; j++) x[i * cols + j] = 0.0f;                     /* zero tile */
  for (int64_t j = 0; rows > 5 && j < cols; j++) x[5 * cols + j] = j % 2 ? -1e-30f : 1e-12f; /* floors, -0 */
  for (int64_t j = 0; rows > 7 && j < cols; j++) x[7 * cols + j] = ldexpf(1.0f, (int)(j % 40) - 20); /* powers of two */
  if (rows > 9 && cols > 2) {
    x[9 * cols + 1] = 448.0f;
    x[9 * cols + 2] = -448.0f * 1.0001f;
  }
  return x;
}

static const char *const g_fmts[] = {"fp8_tensor", "fp8_token", "fp8_channel", "fp8_group128", "fp8_group128_ue8m0",
                                     "fp8_block128", "fp8_block128_ue8m0", "nvfp4", "mxfp8", "mxfp4"};

/* vllm's scale for fmt from the group amax (NAN: not checked here). */
static float spec_scale(const char *f, float amax) {
  if (!strcmp(f, "fp8_tensor")) return amax / 448.f;
  if (!strcmp(f, "fp8_token") || !strcmp(f, "fp8_channel")) return fmaxf(amax / 448.f, 1.f / 229376.f);
  if (!strcmp(f, "fp8_group128")) return fmaxf(amax, 1e-10f) / 448.f;
  /* vllm is vLLM's CUDA path: the scale itself floored at 1e-10 before the
   * power of two, so no scale is under 2^-33 (qpass.c cites the kernel) */
  if (!strcmp(f, "fp8_group128_ue8m0")) return ceil2f(fmaxf(fmaxf(amax, 1e-10f) / 448.f, 1e-10f));
  if (!strcmp(f, "fp8_block128")) return fmaxf(amax, 1e-4f) * bf(0x3b124925u); /* * RN(1/448) */
  if (!strcmp(f, "mxfp4")) { /* the EVEN rule: exponent of amax rounded up at 1.75, minus 2 */
    int e = (int)(((fb(amax) + 0x200000u) >> 23) & 0xffu) - 2;
    return e <= 0 ? ldexpf(1.f, -127) : bf((uint32_t)e << 23);
  }
  return NAN;
}

static void check_format(const qc_backend *be, const char *f, const char *prof, int64_t rows, int64_t cols, const float *x) {
  int64_t gr, gc, sr, sc;
  int packed;
  cr_assert_eq(qc_qlayout(f, rows, cols, &gr, &gc, &sr, &sc, &packed), QC_OK);
  int64_t n = rows * cols, nq = packed ? rows * ((cols + 1) / 2) : n;
  qc_qout q = {.deq = malloc((size_t)n * 4), .q = malloc((size_t)nq), .scale = malloc((size_t)(sr * sc) * 4),
               .scale_b = malloc((size_t)(sr * sc))};
  qc_qout q2 = {.deq = malloc((size_t)n * 4), .q = malloc((size_t)nq)};
  const int vllm = !strcmp(prof, "vllm");
  cr_assert_eq(be->quantize(be, f, prof, rows, cols, x, &q), QC_OK, "%s/%s: %s", f, prof, qc_err_msg());
  cr_assert_eq(be->quantize(be, f, vllm ? NULL : prof, rows, cols, x, &q2), QC_OK, "%s: %s", f, qc_err_msg());
  cr_expect_eq(memcmp(q.deq, q2.deq, (size_t)n * 4), 0, "%s: two runs differ", f);
  cr_expect_eq(memcmp(q.q, q2.q, (size_t)nq), 0, "%s: two runs' bytes differ", f);
  int bad = 0;
  for (int64_t gi = 0; gi < sr; gi++)
    for (int64_t gj = 0; gj < sc; gj++) {
      float amax = 0;
      int64_t i1 = (gi + 1) * gr < rows ? (gi + 1) * gr : rows, j1 = (gj + 1) * gc < cols ? (gj + 1) * gc : cols;
      for (int64_t i = gi * gr; i < i1; i++)
        for (int64_t j = gj * gc; j < j1; j++) amax = fmaxf(amax, fabsf(x[i * cols + j]));
      float s = q.scale[gi * sc + gj], want = vllm ? spec_scale(f, amax) : NAN;
      if (!isnan(want) && fb(s) != fb(want) && bad++ < 5)
        cr_expect(0, "%s group (%lld, %lld): scale %a, spec %a (amax %a)", f, (long long)gi, (long long)gj, s, want, amax);
      uint8_t b = q.scale_b[gi * sc + gj];
      if ((strstr(f, "mx") || strstr(f, "ue8m0")) && !(fb(s) & 0x7fffffu)) /* a power of two (vllm_native's floor is not) */
        cr_expect(fb(qc_e8m0_to_f32(b)) == fb(s) || (b == 0 && s == ldexpf(1.f, -127)), "%s/%s: scale byte %u vs %a", f, prof, b, s);
      for (int64_t i = gi * gr; i < i1; i++)
        for (int64_t j = gj * gc; j < j1; j++) {
          int64_t k = i * cols + j;
          float dec = packed ? qc_e2m1_to_f32((uint8_t)((q.q[i * ((cols + 1) / 2) + j / 2] >> (4 * (j % 2))) & 15))
                             : qc_e4m3_to_f32(q.q[k]);
          float deq = dec * s;
          if (fb(deq) != fb(q.deq[k]) && bad++ < 5)
            cr_expect(0, "%s [%lld, %lld]: deq %a but decode(q) * s = %a", f, (long long)i, (long long)j, q.deq[k], deq);
          double err = fabs((double)q.deq[k] - x[k]), lim = packed ? 0.25 * fabs(x[k]) + 0.25 * s : 0.0625 * fabs(x[k]) + s / 512;
          if (!strcmp(f, "fp8_block128_ue8m0")) lim *= 2; /* two roundings */
          if (strstr(f, "mx")) lim += (packed ? 6.0 : 448.0) * s; /* a floor exponent (ocp, log2's rounding): the top saturates */
          /* nvfp4 with a subnormal or zero block scale (a block far below the
           * tensor's amax) underflows or saturates by design: no step bound */
          int nvsub = !strcmp(f, "nvfp4") && (b & 0x7f) < 0x08;
          if (!nvsub && strcmp(prof, "modelopt") && err > lim && bad++ < 5)
            cr_expect(0, "%s/%s [%lld, %lld]: x %a -> %a, error above one step", f, prof, (long long)i, (long long)j, x[k], q.deq[k]);
          if (x[k] == 0 && signbit(x[k]) == 0 && q.deq[k] != 0 && bad++ < 5) cr_expect(0, "%s: zero not kept", f);
        }
    }
  cr_expect_eq(bad, 0, "%s: %d mismatches", f, bad);
  /* tiny negatives keep their sign (negative zero bytes) */
  if (rows > 5 && cols > 1 && !packed && strcmp(f, "fp8_tensor"))
    cr_expect_eq(q.q[5 * cols + 1] & 0x80, 0x80, "%s: -1e-30 lost its sign", f);
  /* the CPU quantizer's deployed bytes: payload, scales, global scale */
  {
    qc_qfmt cf;
    qc_quantized z;
    memset(&z, 0, sizeof z);
    qc_qprof cp;
    cr_assert_eq(qc_qfmt_parse(f, &cf), QC_OK);
    cr_assert_eq(qc_qprof_parse(prof, &cp), QC_OK);
    cr_assert_eq(qc_quantize(cf, cp, rows, cols, x, NULL, &z, "x"), QC_OK, "%s: %s", f, qc_err_msg());
    cr_expect_eq((int64_t)z.q.nbytes, nq, "%s: payload sizes", f);
    int64_t first = -1, cnt = 0;
    for (int64_t k = 0; k < nq && k < (int64_t)z.q.nbytes; k++)
      if (((const uint8_t *)z.q.data)[k] != q.q[k]) { if (first < 0) first = k; cnt++; }
    cr_expect_eq(cnt, 0, "%s/%s [%lld x %lld]: %lld payload bytes differ, first at %lld: cpu 0x%02x gpu 0x%02x", f, prof,
                 (long long)rows, (long long)cols, (long long)cnt, (long long)first,
                 first >= 0 ? ((const uint8_t *)z.q.data)[first] : 0, first >= 0 ? q.q[first] : 0);
    int fscale = z.scale.dtype == QC_F32;
    cr_expect_eq(qc_numel(&z.scale), sr * sc, "%s: scale count", f);
    for (int64_t k = 0, bad_s = 0; k < sr * sc && k < qc_numel(&z.scale); k++) {
      uint32_t cpu = fscale ? fb(((const float *)z.scale.data)[k]) : ((const uint8_t *)z.scale.data)[k];
      uint32_t gpu = fscale ? fb(q.scale[k]) : q.scale_b[k];
      if (cpu != gpu && bad_s++ < 3) cr_expect(0, "%s/%s: scale %lld: cpu 0x%x gpu 0x%x", f, prof, (long long)k, cpu, gpu);
    }
    if (z.gscale.data) cr_expect_eq(fb(*(const float *)z.gscale.data), fb(q.gscale), "%s: global scale cpu %a gpu %a", f,
                                    *(const float *)z.gscale.data, q.gscale);
    qc_quantized_free(&z);
  }
  /* the CPU fake quantizer: bit-identical values */
  if (qc_quant_known(f)) {
    float *cpu = malloc((size_t)n * 4);
    cr_assert_eq(qc_fake_quant(f, prof, rows, cols, x, cpu, "x"), QC_OK, "%s", qc_err_msg());
    int64_t first = -1, cnt = 0;
    for (int64_t k = 0; k < n; k++)
      if (fb(cpu[k]) != fb(q.deq[k])) { if (first < 0) first = k; cnt++; }
    cr_expect_eq(cnt, 0, "%s/%s: %lld values differ from the CPU quantizer, first at %lld: x %a cpu %a gpu %a", f, prof,
                 (long long)cnt, (long long)first, first >= 0 ? x[first] : 0, first >= 0 ? cpu[first] : 0,
                 first >= 0 ? q.deq[first] : 0);
    free(cpu);
  }
  free(q.deq); free(q.q); free(q.scale); free(q.scale_b); free(q2.deq); free(q2.q);
}

/* bf16 master weights, the tie-heavy case: every 7th column holds +-1.75
 * 2^k (block maxima whose quotients by 448 are exact), the rest N(0, 1)
 * scaled per row, all rounded to bf16. */
static float *bf16_weights(int64_t rows, int64_t cols, uint64_t seed) {
  double *n = gpu_randn(rows * cols, seed, 1.0);
  float *x = malloc((size_t)(rows * cols) * 4);
  for (int64_t i = 0; i < rows; i++)
    for (int64_t j = 0; j < cols; j++) {
      float v = (float)(n[i * cols + j] * ldexp(1.0, (int)(i % 13) - 8));
      if (j % 7 == 3) v = copysignf(1.75f * ldexpf(1.0f, (int)lrint(log2(fabs(v) + 1e-30))), v);
      x[i * cols + j] = qc_bf16_to_f32(qc_f32_to_bf16(v));
    }
  free(n);
  return x;
}

static const char *const g_profs[] = {"vllm", "vllm_native", "vllm_triton", "vllm_cuda", "vllm_cuda_nvfp4", "torch", "deepgemm",
                                      "modelopt", "compressed_tensors", "te", "ocp", "exact"};

Test(gpu_quant, every_format_spec_and_cpu, .timeout = 600) {
  const qc_backend *be = gpu_or_skip();
  const int64_t shapes[4][2] = {{300, 456}, {1, 16}, {129, 130}, {256, 384}};
  for (int s = 0; s < 4; s++) {
    float *x = s == 3 ? bf16_weights(shapes[s][0], shapes[s][1], 5) : qdata(shapes[s][0], shapes[s][1], 11 + (uint64_t)s);
    for (size_t f = 0; f < sizeof g_fmts / sizeof g_fmts[0]; f++)
      for (size_t p = 0; p < sizeof g_profs / sizeof g_profs[0]; p++) check_format(be, g_fmts[f], g_profs[p], shapes[s][0], shapes[s][1], x);
    free(x);
  }
  qc_backend_close(be);
}

/* The measured tables behind the CPU's emulation of rcp.approx.f32 and of
 * exp2f(ceilf(log2f(v))), re-measured against the hardware: every float32
 * input. */
Test(gpu_quant, approximate_arithmetic_tables_match_the_hardware, .timeout = 300) {
  const qc_backend *be = gpu_or_skip();
  int (*conf)(const qc_backend *, unsigned long long *, unsigned *);
  void *sym = qc_backend_cuda_sym("qc_cuda_parith_conformance");
  cr_assert(sym, "the CUDA backend has no qc_cuda_parith_conformance");
  memcpy(&conf, &sym, sizeof conf);
  unsigned long long mism[2] = {9, 9};
  unsigned first[2];
  cr_assert(qc_ptables_ok(), "the embedded tables did not decode");
  cr_assert_eq(conf(be, mism, first), QC_OK, "%s", qc_err_msg());
  cr_expect_eq(mism[0], 0, "rcp.approx.f32: %llu of 2^32 inputs differ from the table, first 0x%08x", mism[0], first[0]);
  cr_expect_eq(mism[1], 0, "exp2f(ceilf(log2f(v))): %llu positive normal inputs differ from the list, first 0x%08x", mism[1],
               first[1]);
  qc_backend_close(be);
}

Test(gpu_quant, nonfinite_and_unknown_refused) {
  const qc_backend *be = gpu_or_skip();
  float x[256];
  for (int i = 0; i < 256; i++) x[i] = (float)i;
  x[200] = INFINITY;
  float out[256];
  qc_qout q = {.deq = out};
  qc_err_clear();
  cr_expect_eq(be->quantize(be, "fp8_block128", "vllm", 2, 128, x, &q), QC_EINPUT);
  cr_expect(strstr(qc_err_msg(), "non-finite") != NULL, "message: %s", qc_err_msg());
  qc_err_clear();
  x[200] = 1;
  cr_expect_eq(be->quantize(be, "fp8_block128", "tensorrt", 2, 128, x, &q), QC_EINPUT);
  cr_expect(strstr(qc_err_msg(), "profile") != NULL, "message: %s", qc_err_msg());
  qc_err_clear();
  cr_expect_eq(be->quantize(be, "fp9", "vllm", 2, 128, x, &q), QC_EINPUT);
  qc_backend_close(be);
}

/* The bf16 tile quantizer (16-byte loads, one read of the tile: the audit's
 * weights) against the element-wise one (QC_CUDA_QK_SCALAR=1), against the
 * same input two bytes off alignment (which the element-wise one takes)
 * and against the CPU: identical float64 values for block128 and its
 * two-stage ue8m0 under every profile, on shapes with partial tiles. */
Test(gpu_quant, bf16_tile_paths_match_cpu, .timeout = 300) {
  const qc_backend *be = gpu_or_skip();
  const int64_t shapes[][2] = {{256, 384}, {300, 456}, {129, 136}, {1, 16}, {200, 1000}};
  const char *fmts[] = {"fp8_block128", "fp8_block128_ue8m0"};
  for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++) {
    const int64_t rows = shapes[s][0], cols = shapes[s][1], n = rows * cols;
    float *x = s % 2 ? bf16_weights(rows, cols, 7 + s) : qdata(rows, cols, 3 + s);
    uint16_t *xb = malloc((size_t)(n + 1) * 2);
    float *xf = malloc((size_t)n * 4);
    double *cpu = malloc((size_t)n * 8), *g[3];
    for (int64_t i = 0; i < n; i++) {
      xb[i + 1] = qc_f32_to_bf16(x[i]);
      xf[i] = qc_bf16_to_f32(xb[i + 1]);
    }
    void *din = NULL, *dout = NULL, *dscr = NULL;
    cr_assert_eq(be->buf_alloc(be, (size_t)(n + 8) * 2, "in", &din), QC_OK);
    cr_assert_eq(be->buf_alloc(be, (size_t)n * 8, "out", &dout), QC_OK);
    cr_assert_eq(be->buf_alloc(be, (size_t)n * 4, "scratch", &dscr), QC_OK);
    for (int k = 0; k < 3; k++) g[k] = malloc((size_t)n * 8);
    for (size_t f = 0; f < sizeof fmts / sizeof fmts[0]; f++)
      for (size_t p = 0; p < sizeof g_profs / sizeof g_profs[0]; p++) {
        cr_assert_eq(qc_fake_quant_f64(fmts[f], g_profs[p], rows, cols, xf, cpu, cols, "x"), QC_OK, "%s", qc_err_msg());
        for (int k = 0; k < 3; k++) { /* 0: the tile kernel, 1: element-wise, 2: misaligned input */
          const int off = k == 2 ? 1 : 0; /* in elements: 2 bytes */
          cr_assert_eq(be->upload(be, (uint16_t *)din + off, xb + 1, (size_t)n * 2), QC_OK);
          gpu_switch(be, "QC_CUDA_QK_SCALAR", k == 1);
          cr_assert_eq(be->fake_quant_f64(be, fmts[f], g_profs[p], rows, cols, QC_BF16, (uint16_t *)din + off, dscr, dout, "x"),
                       QC_OK, "%s", qc_err_msg());
          cr_assert_eq(be->sync(be), QC_OK, "%s", qc_err_msg());
          cr_assert_eq(be->download(be, g[k], dout, (size_t)n * 8), QC_OK);
        }
        gpu_switch(be, "QC_CUDA_QK_SCALAR", 0);
        for (int k = 0; k < 3; k++) {
          int64_t first = -1, cnt = 0;
          for (int64_t i = 0; i < n; i++)
            if (memcmp(&g[k][i], &cpu[i], 8)) { if (first < 0) first = i; cnt++; }
          cr_expect_eq(cnt, 0, "%s/%s [%lld x %lld] path %d: %lld values differ from the CPU, first at %lld: cpu %a gpu %a",
                       fmts[f], g_profs[p], (long long)rows, (long long)cols, k, (long long)cnt, (long long)first,
                       first >= 0 ? cpu[first] : 0, first >= 0 ? g[k][first] : 0);
        }
      }
    for (int k = 0; k < 3; k++) free(g[k]);
    be->buf_free(be, din);
    be->buf_free(be, dout);
    be->buf_free(be, dscr);
    free(x); free(xb); free(xf); free(cpu);
  }
  qc_backend_close(be);
}
