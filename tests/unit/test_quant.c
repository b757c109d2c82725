/* test_quant.c: element encoders, ceil2, Philox known answers, stochastic
 * rounding (unbiased, replayable, split-invariant), the profiles' documented
 * differences from vllm, padding, refusals, and the oracle's vector file. */
#include <criterion/criterion.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "numerics/formats.h"
#include "numerics/parith.h"
#include "numerics/ptables.h"
#include "numerics/quant.h"
#include "numerics/sr.h"
#include "core/qc.h"

static float bf(uint32_t u) { float f; memcpy(&f, &u, 4); return f; }
static uint32_t fbits_(float f) { uint32_t u; memcpy(&u, &f, 4); return u; }

Test(e4m3, satfinite_rne_negzero_nan) {
  cr_expect_eq(qc_f32_to_e4m3(448.0f), 0x7e);
  cr_expect_eq(qc_f32_to_e4m3(464.0f), 0x7e);          /* torch gives NaN above 464; SATFINITE saturates */
  cr_expect_eq(qc_f32_to_e4m3(1e9f), 0x7e);
  cr_expect_eq(qc_f32_to_e4m3(INFINITY), 0x7e);
  cr_expect_eq(qc_f32_to_e4m3(-INFINITY), 0xfe);
  cr_expect_eq(qc_f32_to_e4m3(NAN), 0x7f);
  cr_expect_eq(qc_f32_to_e4m3(-NAN), 0x7f);
  cr_expect_eq(qc_f32_to_e4m3(-1e-9f), 0x80);          /* a tiny negative keeps its sign */
  cr_expect_eq(qc_f32_to_e4m3(-0.0f), 0x80);
  cr_expect_eq(qc_f32_to_e4m3(ldexpf(1, -10)), 0x00);  /* half the smallest step: tie to even 0 */
  cr_expect_eq(qc_f32_to_e4m3(ldexpf(3, -10)), 0x02);  /* 1.5 steps: tie to even 2 */
  cr_expect_eq(qc_f32_to_e4m3(ldexpf(1, -9)), 0x01);
  cr_expect_eq(qc_f32_to_e4m3(1.0625f), 0x38);         /* 1 + 1/16: tie to even (1.0) */
  cr_expect_eq(qc_f32_to_e4m3(1.1875f), 0x3a);         /* 1 + 3/16: tie to even (1.25) */
  for (int b = 0; b < 256; b++) {
    if ((b & 0x7f) == 0x7f) continue;
    cr_assert_eq(qc_f32_to_e4m3(qc_e4m3_to_f32((uint8_t)b)), b, "byte 0x%02x", b);
  }
}

Test(e5m2, roundtrip_and_saturation) {
  for (int b = 0; b < 256; b++) {
    if ((b & 0x7c) == 0x7c) continue; /* Inf/NaN */
    cr_assert_eq(qc_f32_to_e5m2(qc_e5m2_to_f32((uint8_t)b)), b, "byte 0x%02x", b);
  }
  cr_expect_eq(qc_f32_to_e5m2(INFINITY), 0x7b);
  cr_expect_eq(qc_f32_to_e5m2(-1e30f), 0xfb);
  cr_expect_eq(qc_f32_to_e5m2(NAN), 0x7f);
  cr_expect_eq(qc_f32_to_e5m2(-1e-30f), 0x80);
}

Test(e2m1, spec_ties) {
  const float in[] = {0.25f, 0.75f, 1.25f, 1.75f, 2.5f, 3.5f, 5.0f, 7.0f, -0.1f, -6.5f};
  const uint8_t want[] = {0x0, 0x2, 0x2, 0x4, 0x4, 0x6, 0x6, 0x7, 0x8, 0xf};
  for (size_t i = 0; i < sizeof in / sizeof in[0]; i++) cr_expect_eq(qc_f32_to_e2m1(in[i]), want[i], "%g", (double)in[i]);
  for (int c = 0; c < 16; c++) cr_expect_eq(qc_f32_to_e2m1(qc_e2m1_to_f32((uint8_t)c)), c);
}

Test(ceil2, exponent_bit_rule) {
  cr_expect_eq(qc_ceil2(1.0f), 1.0f);
  cr_expect_eq(qc_ceil2(bf(0x3f800001u)), 2.0f);      /* just above a power of two */
  cr_expect_eq(qc_ceil2(0.75f), 1.0f);
  cr_expect_eq(qc_ceil2(3.0f), 4.0f);
  cr_expect_eq(qc_ceil2(0.0f), 0.0f);
  cr_expect_eq(qc_ceil2(bf(0x00000001u)), ldexpf(1, -126));
  cr_expect_eq(qc_e8m0_ceil(500.0f / 448.0f), 128);
  cr_expect_eq(qc_e8m0_ceil(0.0f), 0);
}

Test(philox, random123_known_answers) {
  struct { uint32_t c[4], k[2], want[4]; } kat[] = {
      {{0, 0, 0, 0}, {0, 0}, {0x6627e8d5, 0xe169c58d, 0xbc57ac4c, 0x9b00dbd8}},
      {{~0u, ~0u, ~0u, ~0u}, {~0u, ~0u}, {0x408f276d, 0x41c83b0e, 0xa20bc7c6, 0x6d5451fd}},
      {{0x243f6a88, 0x85a308d3, 0x13198a2e, 0x03707344}, {0xa4093822, 0x299f31d0}, {0xd16cfe09, 0x94fdcceb, 0x5001e420, 0x24126ea1}}};
  for (int i = 0; i < 3; i++) {
    uint32_t o[4];
    qc_philox4x32_10(kat[i].c, kat[i].k, o);
    for (int j = 0; j < 4; j++) cr_expect_eq(o[j], kat[i].want[j], "vector %d word %d: %08x", i, j, o[j]);
  }
  /* the draw is the first word's top 24 bits, counter (index lo, hi, salt, step), key = seed */
  qc_sr sr = {.on = 1, .salt = 0x13198a2e, .step = 0x03707344};
  sr.seed = ((uint64_t)0x299f31d0 << 32) | 0xa4093822;
  cr_expect_eq(qc_sr_bits(&sr, ((uint64_t)0x85a308d3 << 32) | 0x243f6a88), 0xd16cfe09u >> 8);
}

/* A [1, 32*nb] row whose blocks each hold 448 then 31 copies of v, so that
 * mxfp8's scale is exactly 1 and the payload is v's own rounding. */
static float *mx_row(int nb, float v) {
  float *x = malloc((size_t)nb * 32 * sizeof *x);
  for (int i = 0; i < nb * 32; i++) x[i] = i % 32 ? v : 448.0f;
  return x;
}

Test(sr, unbiased) {
  const int nb = 4096, n = nb * 32;
  const float v = 1.3f; /* between e4m3 1.25 and 1.375: rounds up with p = 0.4 */
  float *x = mx_row(nb, v), *y = malloc((size_t)n * sizeof *y);
  qc_sr sr = {.on = 1, .seed = 42, .salt = 7, .step = 3};
  cr_assert_eq(qc_fake_quant_sr("mxfp8", "vllm", 1, n, x, y, &sr, "x"), QC_OK);
  double sum = 0;
  int cnt = 0, up = 0;
  for (int i = 0; i < n; i++)
    if (i % 32) {
      cr_assert(y[i] == 1.25f || y[i] == 1.375f, "y[%d] = %g", i, (double)y[i]);
      sum += y[i];
      up += y[i] == 1.375f;
      cnt++;
    }
  double mean = sum / cnt, sigma = 0.125 * sqrt(0.4 * 0.6 / cnt);
  cr_expect(fabs(mean - v) < 5 * sigma, "mean %.6f, want %.6f +- %.2e", mean, (double)v, 5 * sigma);
  cr_expect(up > 0 && up < cnt);
  /* round to nearest is biased here (all 1.25), which the test would see */
  cr_assert_eq(qc_fake_quant("mxfp8", "vllm", 1, n, x, y, "x"), QC_OK);
  cr_expect_eq(y[1], 1.25f);
  free(x); free(y);
}

Test(sr, boundary_u_equal_to_fraction_rounds_down) {
  /* The rule rounds up when u < (|v| - lo)/(hi - lo): at equality it rounds
   * down. Find an element whose draw r24 is a multiple of 16, so that
   * v = 1 + r24 * 2^-27 is a float32 with fraction exactly u = r24 * 2^-24
   * between e4m3 1.0 and 1.125 (mxfp8 with a 448 in each block: scale 1). */
  qc_sr sr = {.on = 1, .seed = 99, .salt = 5};
  int64_t idx = -1;
  uint32_t r24 = 0;
  for (int64_t i = 1; i < 4096 && idx < 0; i++) {
    r24 = qc_sr_bits(&sr, (uint64_t)i);
    if (i % 32 && r24 % 16 == 0 && r24) idx = i;
  }
  cr_assert_geq(idx, 0);
  float *x = mx_row(128, 1.0f);
  x[idx] = 1.0f + ldexpf((float)r24, -27);
  qc_quantized z;
  cr_assert_eq(qc_quantize(QC_QF_MXFP8, QC_QP_VLLM, 1, 128 * 32, x, &sr, &z, "x"), QC_OK);
  cr_expect_eq(((uint8_t *)z.q.data)[idx], 0x38, "u == fraction must round down to 1.0, got 0x%02x",
               ((uint8_t *)z.q.data)[idx]);
  /* one ulp more and the same draw rounds up */
  x[idx] = nextafterf(x[idx], 2.0f);
  qc_quantized_free(&z);
  cr_assert_eq(qc_quantize(QC_QF_MXFP8, QC_QP_VLLM, 1, 128 * 32, x, &sr, &z, "x"), QC_OK);
  cr_expect_eq(((uint8_t *)z.q.data)[idx], 0x39);
  qc_quantized_free(&z);
  free(x);
}

Test(sr, replay_and_split) {
  const int64_t R = 10, C = 48;
  float *x = malloc(R * C * sizeof *x);
  for (int64_t i = 0; i < R * C; i++) x[i] = sinf((float)i) * 3.0f;
  qc_sr sr = {.on = 1, .seed = 0xdeadbeefcafeull, .salt = qc_sr_salt_path("/model.layers.0.mlp.down_proj", "weight"), .step = 5};
  qc_quantized a, b, top, bot;
  cr_assert_eq(qc_quantize(QC_QF_FP8_CHANNEL, QC_QP_VLLM, R, C, x, &sr, &a, "x"), QC_OK);
  cr_assert_eq(qc_quantize(QC_QF_FP8_CHANNEL, QC_QP_VLLM, R, C, x, &sr, &b, "x"), QC_OK);
  cr_expect_eq(memcmp(a.q.data, b.q.data, a.q.nbytes), 0, "replay gives other bits");
  /* the same rows quantized as two shards with their global offsets */
  qc_sr s1 = sr, s2 = sr;
  s2.base = 4 * C;
  cr_assert_eq(qc_quantize(QC_QF_FP8_CHANNEL, QC_QP_VLLM, 4, C, x, &s1, &top, "x"), QC_OK);
  cr_assert_eq(qc_quantize(QC_QF_FP8_CHANNEL, QC_QP_VLLM, R - 4, C, x + 4 * C, &s2, &bot, "x"), QC_OK);
  cr_expect_eq(memcmp(a.q.data, top.q.data, top.q.nbytes), 0, "shard 0 differs");
  cr_expect_eq(memcmp((uint8_t *)a.q.data + 4 * C, bot.q.data, bot.q.nbytes), 0, "shard 1 differs");
  /* another step draws other bits */
  qc_quantized c;
  sr.step = 6;
  cr_assert_eq(qc_quantize(QC_QF_FP8_CHANNEL, QC_QP_VLLM, R, C, x, &sr, &c, "x"), QC_OK);
  cr_expect_neq(memcmp(a.q.data, c.q.data, a.q.nbytes), 0);
  qc_quantized_free(&a); qc_quantized_free(&b); qc_quantized_free(&c); qc_quantized_free(&top); qc_quantized_free(&bot);
  free(x);
}

/* Scale (float32) of block 0 under a profile. */
static float scale0(qc_qfmt f, qc_qprof p, int64_t rows, int64_t cols, const float *x) {
  qc_quantized z;
  cr_assert_eq(qc_quantize(f, p, rows, cols, x, NULL, &z, "x"), QC_OK);
  float s = z.scale.dtype == QC_F32 ? ((float *)z.scale.data)[0] : (float)((uint8_t *)z.scale.data)[0];
  qc_quantized_free(&z);
  return s;
}

Test(profile, vllm_native_group_floor_is_not_pow2) {
  float x[128] = {1e-3f};
  float v = scale0(QC_QF_FP8_GROUP128_UE8M0, QC_QP_VLLM, 1, 128, x);
  float n = scale0(QC_QF_FP8_GROUP128_UE8M0, QC_QP_VLLM_NATIVE, 1, 128, x);
  cr_expect_eq(v, ldexpf(1, -18));           /* ceil2(1e-3/448) */
  cr_expect_eq(n, 1.0f / 229376.0f);         /* max(2^-18, 1/229376): not a power of two */
}

Test(profile, te_all_zero_group_scale_one) {
  float x[128] = {0};
  cr_expect_eq(scale0(QC_QF_FP8_GROUP128, QC_QP_VLLM, 1, 128, x), 1e-10f / 448.0f);
  cr_expect_eq(scale0(QC_QF_FP8_GROUP128, QC_QP_VLLM_TRITON, 1, 128, x), 1e-10f * bf(QA_R448_BITS));
  cr_expect_eq(scale0(QC_QF_FP8_GROUP128, QC_QP_TE, 1, 128, x), 1.0f);
}

Test(profile, ocp_mx_floor_exponent_saturates) {
  float x[32] = {500.0f, 1.0f};
  cr_expect_eq(scale0(QC_QF_MXFP8, QC_QP_VLLM, 1, 32, x), 128.0f); /* ceil2(500/448) = 2 */
  cr_expect_eq(scale0(QC_QF_MXFP8, QC_QP_OCP, 1, 32, x), 127.0f);  /* 2^(8-8) = 1: 500 saturates to 448 */
  qc_quantized z;
  cr_assert_eq(qc_quantize(QC_QF_MXFP8, QC_QP_OCP, 1, 32, x, NULL, &z, "x"), QC_OK);
  cr_expect_eq(((uint8_t *)z.q.data)[0], 0x7e);
  qc_quantized_free(&z);
}

Test(profile, modelopt_nvfp4_zero_block_scale_one) {
  /* an all-zero 16-block: vllm stores sf = e4m3(0) = 0x00, modelopt replaces
   * the zero block scale by 1.0 (0x38); the global scales are reciprocal */
  float x[32] = {0};
  for (int i = 16; i < 32; i++) x[i] = (float)(i - 20);
  qc_quantized a, b;
  cr_assert_eq(qc_quantize(QC_QF_NVFP4, QC_QP_VLLM, 1, 32, x, NULL, &a, "x"), QC_OK);
  cr_assert_eq(qc_quantize(QC_QF_NVFP4, QC_QP_MODELOPT, 1, 32, x, NULL, &b, "x"), QC_OK);
  cr_expect_eq(((uint8_t *)a.scale.data)[0], 0x00);
  cr_expect_eq(((uint8_t *)b.scale.data)[0], 0x38);
  /* eager PyTorch: 2688 / t is RN(1/t) * 2688; modelopt's amax / (6 * 448) is amax * RN(1/2688) */
  volatile float r11 = 1.0f / 11.0f, r2688 = 1.0f / 2688.0f;
  float ga = *(float *)a.gscale.data, gb = *(float *)b.gscale.data;
  cr_expect_eq(ga, r11 * 2688.0f);
  cr_expect_eq(gb, 11.0f * r2688);
  qc_quantized_free(&a); qc_quantized_free(&b);
}

Test(profile, te_fp8_tensor_scale_association) {
  /* te stores rcp(448/amax); vllm stores amax/448: they differ in the last bit for some amax */
  int differ = 0;
  for (int i = 1; i < 2000 && !differ; i++) {
    float x[2] = {1.0f + (float)i * 0.001f, 0.5f};
    differ = scale0(QC_QF_FP8_TENSOR, QC_QP_VLLM, 1, 2, x) != scale0(QC_QF_FP8_TENSOR, QC_QP_TE, 1, 2, x);
  }
  cr_expect(differ);
}

Test(profile, te_block_ue8m0_is_one_stage_vllm_two) {
  const int64_t R = 128, C = 128;
  float *x = malloc(R * C * sizeof *x);
  for (int64_t i = 0; i < R * C; i++) x[i] = cosf((float)i) * 3.3f;
  qc_quantized a, b;
  cr_assert_eq(qc_quantize(QC_QF_FP8_BLOCK128_UE8M0, QC_QP_VLLM, R, C, x, NULL, &a, "x"), QC_OK);
  cr_assert_eq(qc_quantize(QC_QF_FP8_BLOCK128_UE8M0, QC_QP_TE, R, C, x, NULL, &b, "x"), QC_OK);
  cr_expect_neq(memcmp(a.q.data, b.q.data, a.q.nbytes), 0);
  qc_quantized_free(&a); qc_quantized_free(&b);
  free(x);
}

Test(quant, padding_and_layout) {
  float x[3 * 17];
  for (int i = 0; i < 51; i++) x[i] = (float)(i - 25) * 0.1f;
  qc_quantized z;
  cr_assert_eq(qc_quantize(QC_QF_NVFP4, QC_QP_VLLM, 3, 17, x, NULL, &z, "x"), QC_OK);
  cr_expect_eq(z.q.dtype, QC_E2M1X2);
  cr_expect_eq(z.q.shape[1], 9);
  cr_expect_eq(z.scale.dtype, QC_E4M3);
  cr_expect_eq(z.scale.shape[1], 2);       /* K = 17 pads to two 16-blocks */
  cr_expect_eq(((uint8_t *)z.q.data)[8] >> 4, 0); /* the odd column's high nibble */
  float y[51], w[51];
  cr_assert_eq(qc_dequantize(QC_QF_NVFP4, QC_QP_VLLM, 3, 17, &z, y, "z"), QC_OK);
  cr_assert_eq(qc_fake_quant("nvfp4", "vllm", 3, 17, x, w, "x"), QC_OK);
  cr_expect_eq(memcmp(y, w, sizeof y), 0);
  /* a scale of the wrong dtype is refused */
  z.scale.dtype = QC_F32;
  cr_expect_eq(qc_dequantize(QC_QF_NVFP4, QC_QP_VLLM, 3, 17, &z, y, "z"), QC_EINPUT);
  cr_expect(strstr(qc_err_msg(), "dtype") != NULL, "%s", qc_err_msg());
  qc_err_clear();
  qc_quantized_free(&z);
}

Test(quant, refusals) {
  float x[4] = {1.0f, NAN, 2.0f, 3.0f}, y[4];
  cr_expect_eq(qc_fake_quant("fp8_token", "vllm", 1, 4, x, y, "inputs/x"), QC_EINPUT);
  cr_expect(strstr(qc_err_msg(), "non-finite") && strstr(qc_err_msg(), "inputs/x"), "%s", qc_err_msg());
  qc_err_clear();
  x[1] = INFINITY;
  cr_expect_eq(qc_fake_quant("none", "vllm", 1, 4, x, y, "x"), QC_EINPUT);
  qc_err_clear();
  x[1] = 0;
  cr_expect_eq(qc_fake_quant("fp9", "vllm", 1, 4, x, y, "x"), QC_EINPUT);
  qc_err_clear();
  cr_expect_eq(qc_fake_quant("mxfp8", "vllm_rocm", 1, 4, x, y, "x"), QC_EINPUT);
  cr_expect(strstr(qc_err_msg(), "vllm_rocm") != NULL && strstr(qc_err_hint(), "vllm_cuda_nvfp4") != NULL, "%s", qc_err_msg());
  qc_err_clear();
  cr_expect(qc_quant_known("fp8_block128_ue8m0"));
  cr_expect(!qc_quant_known("fp8_block64"));
}

/* The oracle's vector file: every format x profile, RN and SR, byte for byte. */
Test(quant, oracle_vectors) {
  FILE *f = fopen("tests/data/quant_vectors.bin", "rb");
  cr_assert(f, "tests/data/quant_vectors.bin not found (run from the repository root)");
  char magic[8];
  uint32_t count;
  cr_assert(fread(magic, 1, 8, f) == 8 && memcmp(magic, "QCQV0002", 8) == 0 && fread(&count, 4, 1, f) == 1);
  cr_assert_eq(count, 2 * (QC_QF_COUNT - 1) * QC_QP_COUNT);
  int seen[QC_QF_COUNT][QC_QP_COUNT] = {{0}};
  for (uint32_t r = 0; r < count; r++) {
    struct __attribute__((packed)) { char fmt[24], prof[24]; uint32_t rows, cols, sr_on, salt; uint64_t seed; uint32_t step, nexp; } h;
    cr_assert(fread(&h, sizeof h, 1, f) == 1);
    float *x = malloc((size_t)h.rows * h.cols * 4);
    uint8_t *exp = malloc(h.nexp), *got = malloc(h.nexp + 64);
    cr_assert(fread(x, 4, (size_t)h.rows * h.cols, f) == (size_t)h.rows * h.cols && fread(exp, 1, h.nexp, f) == h.nexp);
    qc_qfmt fm;
    qc_qprof pr;
    cr_assert_eq(qc_qfmt_parse(h.fmt, &fm), QC_OK);
    cr_assert_eq(qc_qprof_parse(h.prof, &pr), QC_OK);
    qc_sr sr = {.on = (int)h.sr_on, .seed = h.seed, .salt = h.salt, .step = h.step};
    qc_quantized z;
    cr_assert_eq(qc_quantize(fm, pr, h.rows, h.cols, x, &sr, &z, "vector"), QC_OK, "%s", qc_err_msg());
    size_t n = 0;
    memcpy(got + n, z.q.data, z.q.nbytes); n += z.q.nbytes;
    memcpy(got + n, z.scale.data, z.scale.nbytes); n += z.scale.nbytes;
    if (z.gscale.data) { memcpy(got + n, z.gscale.data, z.gscale.nbytes); n += z.gscale.nbytes; }
    cr_expect_eq(n, h.nexp, "%s/%s sr=%u: %zu bytes, oracle %u", h.fmt, h.prof, h.sr_on, n, h.nexp);
    size_t bad = 0, first = 0;
    for (size_t i = 0; i < n && i < h.nexp; i++)
      if (got[i] != exp[i] && bad++ == 0) first = i;
    cr_expect_eq(bad, 0, "%s/%s sr=%u: %zu mismatching bytes, first at %zu: 0x%02x vs oracle 0x%02x", h.fmt, h.prof,
                 h.sr_on, bad, first, got[first], exp[first]);
    seen[fm][pr]++;
    qc_quantized_free(&z);
    free(x); free(exp); free(got);
  }
  fclose(f);
  for (int a = 1; a < QC_QF_COUNT; a++)
    for (int b = 0; b < QC_QP_COUNT; b++) cr_expect_eq(seen[a][b], 2, "%s/%s", qc_qfmt_name((qc_qfmt)a), qc_qprof_name((qc_qprof)b));
}

/* qc_fake_quant_f64 (fused, parallel, float64 out with a leading dimension)
 * gives qc_fake_quant's float32 values widened, bit for bit, for every
 * format and profile, on shapes with partial blocks, one row, zeros and a
 * heavy tail; the columns beyond cols are left alone; non-finite input is
 * refused like the float32 path. Run with 1 and 3 threads. */
static void fq64_compare(const char *fmt, const char *prof, int64_t rows, int64_t cols, const float *in) {
  float *ref = malloc((size_t)(rows * cols) * sizeof *ref);
  int64_t ldo = cols + 3;
  double *out = malloc((size_t)(rows * ldo) * sizeof *out);
  cr_assert(ref && out);
  for (int64_t i = 0; i < rows * ldo; i++) out[i] = -7.5;
  int r1 = qc_fake_quant(fmt, prof, rows, cols, in, ref, "t");
  int r2 = qc_fake_quant_f64(fmt, prof, rows, cols, in, out, ldo, "t");
  cr_assert_eq(r1, r2, "%s/%s [%lld, %lld]: status %d vs %d", fmt, prof, (long long)rows, (long long)cols, r1, r2);
  for (int64_t r = 0; r1 == QC_OK && r < rows; r++)
    for (int64_t c = 0; c < ldo; c++) {
      double want = c < cols ? (double)ref[r * cols + c] : -7.5;
      double got = out[r * ldo + c];
      cr_assert(memcmp(&want, &got, 8) == 0, "%s/%s [%lld, %lld] at [%lld, %lld]: %a vs %a", fmt, prof, (long long)rows,
                (long long)cols, (long long)r, (long long)c, got, want);
    }
  free(ref);
  free(out);
}

Test(fake_quant_f64, equals_float32_path_widened) {
  static const char *fmts[] = {"none", "fp8_tensor", "fp8_token", "fp8_channel", "fp8_group128", "fp8_group128_ue8m0",
                               "fp8_block128", "fp8_block128_ue8m0", "nvfp4", "mxfp8", "mxfp4"};
  static const char *profs[] = {"vllm", "vllm_native", "vllm_triton", "vllm_cuda", "vllm_cuda_nvfp4", "torch", "deepgemm",
                                "modelopt", "compressed_tensors", "te", "ocp", "exact"};
  static const int64_t shapes[][2] = {{1, 1}, {1, 200}, {3, 17}, {130, 260}, {257, 129}, {64, 64}};
  uint64_t s = 12345;
  for (int th = 0; th < 2; th++) {
    setenv("QATCHECK_THREADS", th ? "3" : "1", 1);
    for (size_t k = 0; k < sizeof shapes / sizeof shapes[0]; k++) {
      int64_t rows = shapes[k][0], cols = shapes[k][1];
      float *in = malloc((size_t)(rows * cols) * sizeof *in);
      cr_assert(in);
      for (int64_t i = 0; i < rows * cols; i++) {
        s = s * 6364136223846793005ull + 1442695040888963407ull;
        double u = ((s >> 11) + 0.5) * 0x1p-53;
        in[i] = (float)((u - 0.5) * (i % 97 == 0 ? 3e3 : 1.0));   /* a heavy tail every 97th element */
        if (i % 31 == 5) in[i] = 0.0f;
      }
      for (size_t f = 0; f < sizeof fmts / sizeof fmts[0]; f++)
        for (size_t p = 0; p < sizeof profs / sizeof profs[0]; p++) fq64_compare(fmts[f], profs[p], rows, cols, in);
      memset(in, 0, (size_t)(rows * cols) * sizeof *in); /* all zeros */
      for (size_t f = 0; f < sizeof fmts / sizeof fmts[0]; f++) fq64_compare(fmts[f], "vllm", rows, cols, in);
      free(in);
    }
  }
  unsetenv("QATCHECK_THREADS");
}

/* The quantizer's pass runs block rows (fp8_tensor: rows) on qc_par_for's
 * threads once a tensor has more than 2^16 elements: its codes, scales,
 * global scale and dequantized values are the same bytes on 1 and on 3
 * threads, for every format under round to nearest and stochastic
 * rounding, with stored scales given, and a non-finite value in the last
 * piece is still refused naming its index. */
static void quant_bytes(qc_qfmt f, const qc_sr *sr, const qc_qstored *st, int64_t rows, int64_t cols, const float *in,
                        qc_quantized *z, float **deq) {
  cr_assert_eq(qc_quantize_st(f, QC_QP_VLLM, rows, cols, in, sr, st, z, "t"), QC_OK, "%s: %s", qc_qfmt_name(f), qc_err_msg());
  *deq = malloc((size_t)(rows * cols) * sizeof **deq);
  cr_assert(*deq);
  cr_assert_eq(qc_dequantize(f, QC_QP_VLLM, rows, cols, z, *deq, "t"), QC_OK, "%s", qc_err_msg());
}

Test(quant, threads_give_the_same_bytes) {
  const int64_t rows = 600, cols = 264; /* 158,400 elements: several pieces; partial blocks of 128 */
  float *in = malloc((size_t)(rows * cols) * sizeof *in);
  cr_assert(in);
  uint64_t s = 777;
  for (int64_t i = 0; i < rows * cols; i++) {
    s = s * 6364136223846793005ull + 1442695040888963407ull;
    in[i] = (float)((((s >> 11) + 0.5) * 0x1p-53 - 0.5) * (i % 89 == 0 ? 2e3 : 1.0));
  }
  qc_sr sr = {.on = 1, .seed = 0x5eedull, .salt = 17, .step = 2};
  for (int f = 1; f < QC_QF_COUNT; f++)
    for (int k = 0; k < 3; k++) {
      qc_quantized z[2], zs;
      float *d[2];
      const qc_sr *use = k == 1 ? &sr : NULL;
      for (int th = 0; th < 2; th++) {
        setenv("QATCHECK_THREADS", th ? "3" : "1", 1);
        if (k < 2) {
          quant_bytes((qc_qfmt)f, use, NULL, rows, cols, in, &z[th], &d[th]);
        } else { /* the stored scales of a first quantization, taken as stored */
          cr_assert_eq(qc_quantize((qc_qfmt)f, QC_QP_VLLM, rows, cols, in, NULL, &zs, "t"), QC_OK);
          qc_qstored st = {zs.gscale.data, zs.scale.dtype == QC_F32 ? zs.scale.data : NULL,
                           zs.scale.dtype != QC_F32 ? zs.scale.data : NULL};
          quant_bytes((qc_qfmt)f, NULL, &st, rows, cols, in, &z[th], &d[th]);
          qc_quantized_free(&zs);
        }
      }
      const char *fn = qc_qfmt_name((qc_qfmt)f);
      cr_expect_eq(memcmp(z[0].q.data, z[1].q.data, z[0].q.nbytes), 0, "%s case %d: payload", fn, k);
      cr_expect_eq(memcmp(z[0].scale.data, z[1].scale.data, z[0].scale.nbytes), 0, "%s case %d: scales", fn, k);
      cr_expect_eq(z[0].gscale.nbytes, z[1].gscale.nbytes);
      if (z[0].gscale.data) cr_expect_eq(memcmp(z[0].gscale.data, z[1].gscale.data, z[0].gscale.nbytes), 0, "%s", fn);
      cr_expect_eq(memcmp(d[0], d[1], (size_t)(rows * cols) * sizeof *d[0]), 0, "%s case %d: dequantized", fn, k);
      for (int th = 0; th < 2; th++) {
        qc_quantized_free(&z[th]);
        free(d[th]);
      }
    }
  /* the fused float64 path (its own block loop) agrees at this size too */
  for (int f = 1; f < QC_QF_COUNT; f++) {
    setenv("QATCHECK_THREADS", "3", 1);
    fq64_compare(qc_qfmt_name((qc_qfmt)f), "vllm", rows, cols, in);
  }
  in[rows * cols - 5] = NAN; /* in the last piece */
  for (int f = 1; f < QC_QF_COUNT; f++) {
    qc_quantized z;
    cr_expect_eq(qc_quantize((qc_qfmt)f, QC_QP_VLLM, rows, cols, in, NULL, &z, "w"), QC_EINPUT, "%s", qc_qfmt_name((qc_qfmt)f));
    cr_expect(strstr(qc_err_msg(), "flat index 158395") != NULL, "%s: %s", qc_qfmt_name((qc_qfmt)f), qc_err_msg());
  }
  unsetenv("QATCHECK_THREADS");
  free(in);
}

Test(fake_quant_f64, refuses_non_finite) {
  float in[4 * 40];
  double out[4 * 40];
  for (int i = 0; i < 160; i++) in[i] = 0.25f * (float)(i % 7);
  in[77] = NAN;
  static const char *fmts[] = {"none", "fp8_tensor", "fp8_block128", "fp8_block128_ue8m0", "nvfp4", "mxfp4"};
  for (size_t f = 0; f < sizeof fmts / sizeof fmts[0]; f++) {
    cr_expect_eq(qc_fake_quant_f64(fmts[f], "vllm", 4, 40, in, out, 40, "w"), QC_EINPUT, "%s", fmts[f]);
    cr_expect(strstr(qc_err_msg(), "flat index 77") != NULL || strstr(qc_err_msg(), "non-finite") != NULL, "%s: %s", fmts[f],
              qc_err_msg());
  }
}

/* qc_fake_quant_f64_dt on bfloat16, float16 and float64 input equals
 * qc_fake_quant_f64 on the same values as float32 (float64 narrowed by
 * rounding), bit for bit, for every format (vllm and te), two thread counts. */
Test(fake_quant_f64, any_input_dtype) {
  static const char *fmts[] = {"none", "fp8_tensor", "fp8_channel", "fp8_group128", "fp8_block128", "fp8_block128_ue8m0",
                               "nvfp4", "mxfp8", "mxfp4"};
  const int64_t rows = 131, cols = 200, n = rows * cols;
  uint16_t *b = malloc((size_t)n * 2), *h = malloc((size_t)n * 2);
  double *d = malloc((size_t)n * 8), *o1 = malloc((size_t)n * 8), *o2 = malloc((size_t)n * 8);
  float *f = malloc((size_t)n * 4);
  cr_assert(b && h && d && o1 && o2 && f);
  uint64_t s = 99;
  for (int64_t i = 0; i < n; i++) {
    s = s * 6364136223846793005ull + 1442695040888963407ull;
    d[i] = (((s >> 11) + 0.5) * 0x1p-53 - 0.5) * (i % 53 == 0 ? 200.0 : 1.0) + 1e-9 * (double)(i % 7);
    b[i] = qc_f32_to_bf16((float)d[i]);
    h[i] = qc_f32_to_f16((float)d[i]);
  }
  for (int th = 0; th < 2; th++) {
    setenv("QATCHECK_THREADS", th ? "4" : "1", 1);
    for (size_t k = 0; k < sizeof fmts / sizeof fmts[0]; k++)
      for (int p = 0; p < 2; p++) {
        const char *prof = p ? "te" : "vllm";
        for (int t = 0; t < 3; t++) {
          qc_dtype dt = t == 0 ? QC_BF16 : t == 1 ? QC_F16 : QC_F64;
          const void *src = t == 0 ? (const void *)b : t == 1 ? (const void *)h : (const void *)d;
          for (int64_t i = 0; i < n; i++) f[i] = t == 0 ? qc_bf16_to_f32(b[i]) : t == 1 ? qc_f16_to_f32(h[i]) : (float)d[i];
          cr_assert_eq(qc_fake_quant_f64(fmts[k], prof, rows, cols, f, o1, cols, "t"), QC_OK, "%s", qc_err_msg());
          cr_assert_eq(qc_fake_quant_f64_dt(fmts[k], prof, rows, cols, dt, src, o2, cols, "t"), QC_OK, "%s", qc_err_msg());
          cr_assert(memcmp(o1, o2, (size_t)n * 8) == 0, "%s/%s dtype %s differs", fmts[k], prof, qc_dtype_name(dt));
        }
      }
  }
  unsetenv("QATCHECK_THREADS");
  b[77] = 0x7fc0; /* a bfloat16 NaN */
  cr_expect_eq(qc_fake_quant_f64_dt("nvfp4", "vllm", rows, cols, QC_BF16, b, o2, cols, "w"), QC_EINPUT);
  cr_expect(strstr(qc_err_msg(), "flat index 77") != NULL, "%s", qc_err_msg());
  free(b); free(h); free(d); free(o1); free(o2); free(f);
}

/* ---- the GPU's approximate arithmetic, emulated from the H200 tables ---- */

Test(parith, tables_decode_to_the_measurement) {
  cr_assert(qc_ptables_ok(), "the embedded tables did not decode");
  cr_expect_eq(qc_rcpa_ndiff, 1108522u);  /* 13.2% of the 2^23 mantissas (calibrate.py --measure) */
  cr_expect_eq(qc_rcpa_nup, 733799u);
  cr_expect_eq(qc_rcpa_delta(0), 0);       /* exact at powers of two */
  cr_expect_eq(qc_rcpa_delta(1448), 0);    /* the first differing mantissas, from the raw measurement */
  cr_expect_eq(qc_rcpa_delta(1449), -1);
  cr_expect_eq(qc_rcpa_delta(59441), 0);
  cr_expect_eq(qc_rcpa_delta(59442), 1);
  float x = bf(0x3f800000u | 1449u);
  cr_expect_eq(fbits_(qc_rcpa(x)), fbits_(1.0f / x) - 1);
  cr_expect_eq(qc_rcpa(ldexpf(x, 20)), ldexpf(qc_rcpa(x), -20)); /* the exponent exactly */
  cr_expect_eq(qc_rcpa(-x), -qc_rcpa(x));
  /* RN(1/6), RN(1/448), RN(1/2688) equal their rcp.approx values */
  cr_expect_eq(qc_rcpa(6.0f), 1.0f / 6.0f);
  cr_expect_eq(fbits_(qc_rcpa(448.0f)), QA_R448_BITS);
  cr_expect_eq(fbits_(qc_rcpa(2688.0f)), QA_R2688_BITS);
}

Test(parith, rcpa_edges) {
  cr_expect(isinf(qc_rcpa(0.0f)) && qc_rcpa(0.0f) > 0);
  cr_expect(isinf(qc_rcpa(-0.0f)) && qc_rcpa(-0.0f) < 0);
  cr_expect_eq(qc_rcpa(INFINITY), 0.0f);
  cr_expect(isnan(qc_rcpa(NAN)));
  /* a subnormal input in [2^-128, 2^-127): the result is finite (below 2^128) */
  float s = bf(0x00300000u);
  cr_expect(isfinite(qc_rcpa(s)) && qc_rcpa(s) > 1e38f, "%a", (double)qc_rcpa(s));
  cr_expect(isinf(qc_rcpa(bf(0x00100000u)))); /* below 2^-128: Inf */
  /* a result below the normal range rounds to nearest */
  cr_expect(qc_rcpa(bf(0x7f000001u)) > 0 && qc_rcpa(bf(0x7f000001u)) < 1.2e-38f);
}

Test(parith, ceil2_log_rounds_down_just_above_powers_of_two) {
  /* log2f(2^k (1 + j ulp)) rounds to k for small j once |k| is large: the
   * 1949 inputs in [2^-33, 2^127) of the measurement, 3676 normal ones and 11
   * in (2^-127, 2^-126) in all */
  cr_expect_eq(qc_ceil2log_nexc, 3687u);
  int n = 0;
  for (uint32_t i = 0; i < qc_ceil2log_nexc; i++) n += qc_ceil2log_exc[i] >= 0x2f000000u && qc_ceil2log_exc[i] < 0x7f000000u;
  cr_expect_eq(n, 1949);
  cr_expect_eq(qc_ceil_log2_gpu(bf(0x3f800001u)), 1);   /* k = 0: log2 of 1 + ulp is no integer */
  cr_expect_eq(qc_ceil_log2_gpu(bf(0x42800001u)), 6);   /* 64 (1 + ulp): log2 rounds to 6 */
  cr_expect_eq(qc_ceil_log2_gpu(bf(0x42800017u)), 7);   /* 64 (1 + 23 ulp): no longer */
  cr_expect_eq(qa_ceil2_log(bf(0x42800001u)), 64.0f);  /* the bit rule says 128 */
  cr_expect_eq(qc_ceil2(bf(0x42800001u)), 128.0f);
  cr_expect_eq(qc_ceil_log2_gpu(0.0f), -1000);
  cr_expect_eq(qc_ceil_log2_gpu(0.75f), 0);
}

/* ---- producer paths differ where the engines do ---- */

/* A [128, 128] float32 block whose amax makes rcp.approx(s) != RN(1/s), and
 * an element x at [1, 2] that rounds to another e4m3 code under the two. */
static float *near_tie_block(float *xout, uint8_t *under_rcp, uint8_t *under_rcpa) {
  float *w = calloc(128 * 128, sizeof *w);
  for (int i = 0; i < 128 * 128; i++) w[i] = 0.01f * (float)((i * 37) % 101 - 50);
  for (uint32_t m = 1; m < (1u << 23); m++) {
    float amax = bf(0x3f800000u | m), s = amax * bf(QA_R448_BITS);
    if (qc_rcpa(s) == 1.0f / s || amax < 0.6f) continue;
    float r = 1.0f / s, ra = qc_rcpa(s);
    for (int d = -8; d <= 8; d++) {
      float x = bf(fbits_(100.0f / r) + (uint32_t)d);
      if (qc_f32_to_e4m3(x * r) != qc_f32_to_e4m3(x * ra)) {
        w[0] = amax;
        w[1 * 128 + 2] = x;
        *xout = x;
        *under_rcp = qc_f32_to_e4m3(x * r);
        *under_rcpa = qc_f32_to_e4m3(x * ra);
        return w;
      }
    }
  }
  return w;
}

Test(profile, block128_eager_rcp_compiled_rcpa_exact_division) {
  float x = 0;
  uint8_t br = 0, bra = 0;
  float *w = near_tie_block(&x, &br, &bra);
  cr_assert(x != 0, "no near-tie element found");
  qc_quantized t, v, e;
  cr_assert_eq(qc_quantize(QC_QF_FP8_BLOCK128, QC_QP_TORCH, 128, 128, w, NULL, &t, "w"), QC_OK);
  cr_assert_eq(qc_quantize(QC_QF_FP8_BLOCK128, QC_QP_VLLM, 128, 128, w, NULL, &v, "w"), QC_OK);
  cr_assert_eq(qc_quantize(QC_QF_FP8_BLOCK128, QC_QP_EXACT, 128, 128, w, NULL, &e, "w"), QC_OK);
  cr_expect_eq(((uint8_t *)t.q.data)[130], br, "torch: x * rcp(s)");
  cr_expect_eq(((uint8_t *)v.q.data)[130], bra, "vllm (Inductor): x * rcp.approx(s)");
  float st = *(float *)t.scale.data, se = *(float *)e.scale.data;
  cr_expect_eq(st, w[0] * bf(QA_R448_BITS));
  cr_expect_eq(se, w[0] / 448.0f);
  /* the same bytes from the stored scale: the element rule alone */
  qc_qstored stored = {NULL, &st, NULL};
  qc_quantized t2;
  cr_assert_eq(qc_quantize_st(QC_QF_FP8_BLOCK128, QC_QP_TORCH, 128, 128, w, NULL, &stored, &t2, "w"), QC_OK);
  cr_expect_eq(memcmp(t2.q.data, t.q.data, t.q.nbytes), 0);
  float half = st * 2.0f; /* a stored scale twice as large halves the payload values */
  stored.scale = &half;
  qc_quantized_free(&t2);
  cr_assert_eq(qc_quantize_st(QC_QF_FP8_BLOCK128, QC_QP_TORCH, 128, 128, w, NULL, &stored, &t2, "w"), QC_OK);
  cr_expect_eq(qc_e4m3_to_f32(((uint8_t *)t2.q.data)[0]), 224.0f);
  cr_expect_eq(*(float *)t2.scale.data, half);
  qc_quantized_free(&t); qc_quantized_free(&v); qc_quantized_free(&e); qc_quantized_free(&t2);
  free(w);
}

Test(profile, every_profile_names_a_path) {
  char buf[512];
  for (int p = 0; p < QC_QP_COUNT; p++)
    for (int f = 1; f < QC_QF_COUNT; f++) {
      qc_qpath_desc((qc_qfmt)f, (qc_qprof)p, buf, sizeof buf);
      cr_expect(strlen(buf) > 20, "%s/%s: '%s'", qc_qfmt_name((qc_qfmt)f), qc_qprof_name((qc_qprof)p), buf);
    }
  qc_qpath_desc(QC_QF_FP8_BLOCK128, QC_QP_VLLM, buf, sizeof buf);
  cr_expect(strstr(buf, "RN(1/448)") && strstr(buf, "rcp.approx"), "%s", buf);
  qc_qpath_desc(QC_QF_FP8_BLOCK128_UE8M0, QC_QP_DEEPGEMM, buf, sizeof buf);
  cr_expect(strstr(buf, "stage 2") && strstr(buf, "ceil2("), "%s", buf);
  cr_expect(qc_qprof_same(QC_QF_FP8_BLOCK128, QC_QP_TORCH, QC_QP_MODELOPT));
  cr_expect(!qc_qprof_same(QC_QF_FP8_BLOCK128, QC_QP_TORCH, QC_QP_VLLM));
  cr_expect(!qc_qprof_makes(QC_QF_FP8_BLOCK128, QC_QP_OCP) && qc_qprof_makes(QC_QF_MXFP4, QC_QP_OCP));
}

Test(sr, expert_draws_follow_the_global_id) {
  /* a stacked expert weight [E = 4, R, C] rounded as one [E*R, C] matrix
   * (per-row scales, so each expert's scales are its own): expert e alone,
   * with sr.expert = e, gives its rows' bytes; with its local id on an EP
   * rank (e - 2 on rank 1 of 2) other bytes */
  enum { E = 4, R = 6, C = 40 };
  float *x = malloc(E * R * C * sizeof *x);
  for (int i = 0; i < E * R * C; i++) x[i] = sinf((float)i * 0.37f) * 2.0f;
  qc_sr whole = {.on = 1, .seed = 11, .salt = qc_sr_salt_id("model.layers.0.mlp.experts.down_proj.weight"), .step = 9};
  qc_quantized all, one;
  cr_assert_eq(qc_quantize(QC_QF_FP8_CHANNEL, QC_QP_VLLM, E * R, C, x, &whole, &all, "x"), QC_OK);
  for (int e = 0; e < E; e++) {
    qc_sr s = whole;
    s.expert = (uint64_t)e;
    cr_assert_eq(qc_quantize(QC_QF_FP8_CHANNEL, QC_QP_VLLM, R, C, x + e * R * C, &s, &one, "x"), QC_OK);
    cr_expect_eq(memcmp((uint8_t *)all.q.data + e * R * C, one.q.data, R * C), 0, "expert %d differs from the stack", e);
    qc_quantized_free(&one);
    if (e >= 2) { /* rank 1's local id */
      s.expert = (uint64_t)(e - 2);
      cr_assert_eq(qc_quantize(QC_QF_FP8_CHANNEL, QC_QP_VLLM, R, C, x + e * R * C, &s, &one, "x"), QC_OK);
      cr_expect_neq(memcmp((uint8_t *)all.q.data + e * R * C, one.q.data, R * C), 0, "local id %d drew the global masks", e - 2);
      qc_quantized_free(&one);
    }
  }
  /* a shard of one expert: its rows' offset in base, the expert's size in numel */
  qc_sr s = whole;
  s.expert = 3; s.base = 2 * C; s.numel = R * C;
  cr_assert_eq(qc_quantize(QC_QF_FP8_CHANNEL, QC_QP_VLLM, R - 2, C, x + 3 * R * C + 2 * C, &s, &one, "x"), QC_OK);
  cr_expect_eq(memcmp((uint8_t *)all.q.data + 3 * R * C + 2 * C, one.q.data, (R - 2) * C), 0, "a shard of expert 3 differs");
  qc_quantized_free(&one); qc_quantized_free(&all);
  free(x);
  /* the identity's salt is the legacy path salt of the same name */
  cr_expect_eq(qc_sr_salt_id("model.layers.0.mlp.down_proj.weight"), qc_sr_salt_path("/model.layers.0.mlp.down_proj", "weight"));
}

/* Mean over n elements of |the mean over T steps of the decoded values - v|
 * (mxfp8 rows of mx_row: scale 1, v between two e4m3 values), the steps'
 * masks fresh (sr_step = t) or the same (the step held at 0). */
static double temporal_error(const float *x, int nb, float v, int T, int fresh) {
  const int n = nb * 32;
  float *y = malloc((size_t)n * sizeof *y);
  double *acc = calloc((size_t)n, sizeof *acc), err = 0;
  for (int t = 0; t < T; t++) {
    qc_sr sr = {.on = 1, .seed = 42, .salt = qc_sr_salt_id("w"), .step = fresh ? (uint32_t)t : 0};
    cr_assert_eq(qc_fake_quant_sr("mxfp8", "vllm", 1, n, x, y, &sr, "x"), QC_OK);
    for (int i = 0; i < n; i++) acc[i] += y[i];
  }
  int cnt = 0;
  for (int i = 0; i < n; i++)
    if (i % 32) { err += fabs(acc[i] / T - v); cnt++; }
  free(y); free(acc);
  return err / cnt;
}

Test(sr, requantization_bias) {
  /* (1) A weight held constant and re-rounded every step: with the step in
   * the counter the masks are fresh and the steps' mean converges to v
   * (error ~ 0.125 sqrt(p(1-p)/T) sqrt(2/pi)); with the same mask every
   * step (the step held at 0, as before sr_step) the mean is one draw and
   * keeps E|Q(v) - v| = 2 p (1-p) 0.125 = 0.06 (p = 0.4). */
  const int nb = 512, T = 64;
  const float v = 1.3f;
  float *x = mx_row(nb, v);
  double same = temporal_error(x, nb, v, T, 0), fresh = temporal_error(x, nb, v, T, 1);
  cr_log_info("sr requantization: mean |temporal mean - v| over %d steps: same mask %.5f, fresh masks %.5f (ratio %.1f)",
              T, same, fresh, same / fresh);
  cr_expect(fabs(same - 0.06) < 0.004, "same mask: %.5f, expected 0.06", same);
  cr_expect(fresh < 0.0085, "fresh masks: %.5f, expected ~0.0061", fresh);
  free(x);
  /* (2) Two stages (fp8_block128_ue8m0): SR at the first stage is unbiased,
   * the deterministic RN requantization to the power-of-two scale is not.
   * One 128 x 128 block, amax 672 (stage-1 scale 1.5), every other element
   * v = 1.95 (scaled 1.3: 1.25 or 1.375 with p = 0.4, decoded 1.875 or
   * 2.0625). Stage 2's scale is 2: 2.0625 / 2 = 1.03125 rounds to 1.0, so
   * the final values are 1.875 or 2.0: E = 1.925, a bias of -0.025
   * (-1.28 %) that no mask averages away. */
  enum { B = 128 };
  float *w = malloc(B * B * sizeof *w), *y1 = malloc(B * B * sizeof *y1), *y2 = malloc(B * B * sizeof *y2);
  for (int i = 0; i < B * B; i++) w[i] = i ? 1.95f : 672.0f;
  double m1 = 0, m2 = 0;
  const int S = 8;
  for (int t = 0; t < S; t++) {
    qc_sr sr = {.on = 1, .seed = 5, .salt = qc_sr_salt_id("w2"), .step = (uint32_t)t};
    cr_assert_eq(qc_fake_quant_sr("fp8_block128", "vllm", B, B, w, y1, &sr, "w"), QC_OK);
    cr_assert_eq(qc_fake_quant_sr("fp8_block128_ue8m0", "vllm", B, B, w, y2, &sr, "w"), QC_OK);
    for (int i = 1; i < B * B; i++) { m1 += y1[i]; m2 += y2[i]; }
  }
  m1 /= (double)S * (B * B - 1);
  m2 /= (double)S * (B * B - 1);
  const double sigma = 0.1875 * sqrt(0.24 / ((double)S * (B * B - 1)));
  cr_log_info("sr two-stage: stage-1 mean %.5f (bias %+.5f), after RN requantization %.5f (bias %+.5f, %+.2f%%), sigma %.1e",
              m1, m1 - 1.95, m2, m2 - 1.95, 100 * (m2 - 1.95) / 1.95, sigma);
  cr_expect(fabs(m1 - 1.95) < 5 * sigma, "stage 1 biased: %.6f", m1);
  cr_expect(fabs(m2 - 1.925) < 5 * 0.125 * sqrt(0.24 / ((double)S * (B * B - 1))), "two-stage mean %.6f, expected 1.925", m2);
  free(w); free(y1); free(y2);
}
