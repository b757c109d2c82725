/* qpass.h: inside numerics, the quantizers' machinery (quant.c's API and
 * fakequant.c both run on it): the plan of a (format, profile), the scale
 * rule of a block, the element encoders and the generic pass over the
 * scale grid. Not for use outside src/numerics/. */
#ifndef QC_QPASS_H
#define QC_QPASS_H

#include <stdint.h>
#include <string.h>

#include "numerics/quant.h"
#include "numerics/recipe.h"

typedef struct {
  int br, bc;        /* block rows, cols; 0 = the whole extent */
  int fp4;           /* element E2M1 (else E4M3) */
  qc_dtype sdt;      /* stored scale dtype */
  int two_stage;     /* fp8_block128_ue8m0 requantized (vllm family, torch, deepgemm, exact) */
  qc_recipe rc, rc2; /* stage 1's (the only) recipe, stage 2's */
} plan_t;

typedef qc_bscale bscale;

static inline uint32_t fbits(float x) { uint32_t u; memcpy(&u, &x, 4); return u; }
static inline float bitsf(uint32_t u) { float x; memcpy(&x, &u, 4); return x; }

/* Largest |x[i]| as float32 bits (for non-negative floats the integer order
 * is the float order; >= 0x7f800000 means an Inf or NaN is present). Four
 * accumulators, so the compiler can keep them in vector lanes. */
uint32_t qq_abs_max_bits(const float *x, int64_t n);

/* Refuse non-finite input, naming the first offender. */
int qq_check_finite(const float *in, int64_t n, const char *what);

/* Dequantize codes with per-block multipliers deq into out. */
void qq_dequant_pass(const plan_t *pl, int64_t rows, int64_t cols, const uint8_t *codes, const float *deq, float *out);

void qq_enc_run(const float *x, uint8_t *q, int64_t n, float k, int div, int fp4);

/* Stochastic rounding of v (finite) to the element format (E2M1 when
 * fp4, else E4M3) with the 24 random bits r24 (qpass.c, beside the
 * magnitude tables it reads; qq_tables_init first). */
uint8_t qq_enc_sr(float v, int fp4, uint32_t r24);

void qq_grid(const plan_t *pl, int64_t rows, int64_t cols, int64_t *gr, int64_t *gc);

plan_t qq_make_plan(qc_qfmt f, qc_qprof p);

/* The nvfp4 global scale of the plan from the tensor's amax (see quant.h). */
float qq_nvfp4_g(const plan_t *pl, float amax);

/* Core: codes, per-block deq multipliers, scale bytes and the global scale.
 * Buffers: codes [rows*cols], deq and sb [qq_grid]. */
int qq_quant_core(qc_qfmt f, qc_qprof p, int64_t rows, int64_t cols, const float *in, const qc_sr *sr,
                  const qc_qstored *st, uint8_t *codes, float *deq, uint8_t *sb, float *gout, const char *what);

/* Decode tables of the element magnitudes, filled once (thread safe). */
void qq_tables_init(void);

/* Every element code's value (filled by qq_tables_init). */
extern float qq_e4m3_val[256], qq_e2m1_val[16];

#endif
