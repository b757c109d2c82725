/* test_float16.c: bfloat16 and binary16 conversions on hand cases. */
#include <criterion/criterion.h>
#include <math.h>
#include <string.h>

#include "numerics/formats.h"

static float bf(uint32_t u) { float f; memcpy(&f, &u, 4); return f; }

Test(bf16, exact_values_roundtrip) {
  float v[] = {0.0f, 1.0f, -2.0f, 0.5f, 65280.0f, 1.0f / 128};
  for (size_t i = 0; i < sizeof v / sizeof v[0]; i++) cr_expect_eq(qc_round_bf16(v[i]), v[i]);
  cr_expect_eq(qc_f32_to_bf16(-0.0f), 0x8000);
}

Test(bf16, ties_to_even) {
  /* 1 + 2^-8 is halfway between 1 and 1 + 2^-7: ties to even (1.0) */
  cr_expect_eq(qc_f32_to_bf16(bf(0x3f808000u)), 0x3f80);
  /* 1 + 3*2^-8 is halfway between 1+2^-7 (odd) and 1+2^-6: rounds up to even */
  cr_expect_eq(qc_f32_to_bf16(bf(0x3f818000u)), 0x3f82);
  /* just above the tie rounds up */
  cr_expect_eq(qc_f32_to_bf16(bf(0x3f808001u)), 0x3f81);
}

Test(bf16, subnormals_inf_nan) {
  cr_expect_eq(qc_f32_to_bf16(bf(0x00010000u)), 0x0001);      /* smallest bf16 subnormal */
  cr_expect_eq(qc_f32_to_bf16(bf(0x00008000u)), 0x0000);      /* tie to even: 0 */
  cr_expect_eq(qc_f32_to_bf16(bf(0x00018000u)), 0x0002);      /* tie to even: 2 */
  cr_expect_eq(qc_f32_to_bf16(INFINITY), 0x7f80);
  cr_expect_eq(qc_f32_to_bf16(-INFINITY), 0xff80);
  cr_expect_eq(qc_f32_to_bf16(bf(0x7f7fffffu)), 0x7f80);      /* FLT_MAX rounds to Inf */
  cr_expect(isnan(qc_bf16_to_f32(qc_f32_to_bf16(NAN))));
  cr_expect(isnan(qc_bf16_to_f32(qc_f32_to_bf16(bf(0x7f800001u))))); /* signalling NaN stays NaN */
}

Test(f16, hand_cases) {
  cr_expect_eq(qc_f32_to_f16(1.0f), 0x3c00);
  cr_expect_eq(qc_f32_to_f16(65504.0f), 0x7bff);
  cr_expect_eq(qc_f32_to_f16(65520.0f), 0x7c00);              /* rounds to Inf */
  cr_expect_eq(qc_f32_to_f16(65519.0f), 0x7bff);
  cr_expect_eq(qc_f32_to_f16(ldexpf(1.0f, -24)), 0x0001);     /* smallest subnormal */
  cr_expect_eq(qc_f32_to_f16(ldexpf(1.0f, -25)), 0x0000);     /* tie to even */
  cr_expect_eq(qc_f32_to_f16(ldexpf(3.0f, -25)), 0x0002);     /* 1.5 ulp: tie to even 2 */
  cr_expect_eq(qc_f32_to_f16(-ldexpf(1.0f, -14)), 0x8400);    /* smallest normal */
  for (uint32_t h = 0; h < 0x7c00; h++) cr_assert_eq(qc_f32_to_f16(qc_f16_to_f32((uint16_t)h)), h);
}

Test(decode, fp8_fp4_e8m0) {
  cr_expect_eq(qc_e4m3_to_f32(0x7e), 448.0f);
  cr_expect_eq(qc_e4m3_to_f32(0x01), ldexpf(1.0f, -9));
  cr_expect(signbit(qc_e4m3_to_f32(0x80)));
  cr_expect(isnan(qc_e4m3_to_f32(0x7f)));
  cr_expect_eq(qc_e5m2_to_f32(0x7b), 57344.0f);
  cr_expect(isinf(qc_e5m2_to_f32(0x7c)));
  cr_expect_eq(qc_e2m1_to_f32(0x7), 6.0f);
  cr_expect_eq(qc_e2m1_to_f32(0xb), -1.5f);
  cr_expect_eq(qc_e8m0_to_f32(127), 1.0f);
  cr_expect_eq(qc_e8m0_to_f32(0), ldexpf(1.0f, -127));
}
