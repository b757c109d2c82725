/* quant.h: quantizers of docs/numerics.md, bulk, on row-major 2-D views.
 * A 1-D tensor is one row; an N-D tensor is [prod(leading), last]. A
 * profile is a producer path (vLLM on Hopper, its Triton and native
 * fallbacks, eager PyTorch, DeepGEMM, ModelOpt, compressed-tensors,
 * Transformer Engine, OCP, the exact paper rule): for every format it fixes
 * the float32 operation sequence that producer runs (numerics/recipe.h),
 * and the quantizers reproduce it bit for bit, the GPU's approximate
 * reciprocal and log2 included (numerics/parith.h). See docs/numerics.md. */
#ifndef QC_QUANT_H
#define QC_QUANT_H

#include <stdint.h>

#include "core/tensor.h"
#include "numerics/recipe.h"
#include "numerics/sr.h"

/* Formats a contract may name. "none" is the identity. */
#define QC_WEIGHT_FORMATS "none|fp8_tensor|fp8_channel|fp8_block128|fp8_block128_ue8m0|nvfp4|mxfp8|mxfp4"
#define QC_ACT_FORMATS "none|fp8_token|fp8_group128|fp8_group128_ue8m0"
#define QC_PROFILES \
  "vllm|vllm_native|vllm_triton|vllm_cuda|vllm_cuda_nvfp4|torch|deepgemm|modelopt|compressed_tensors|te|ocp|exact"
/* What a contract's `profile` (or --profile) may say: a profile, or auto
 * (the first profile that reproduces the module's deployed bytes; vllm
 * when it has none). */
#define QC_PROFILE_CHOICES QC_PROFILES "|auto"

typedef enum {
  QC_QF_NONE = 0,
  QC_QF_FP8_TENSOR,          /* one float32 scale */
  QC_QF_FP8_TOKEN,           /* one float32 scale per row: [rows, 1] */
  QC_QF_FP8_CHANNEL,         /* same rule, for a weight's output channels */
  QC_QF_FP8_GROUP128,        /* [rows, ceil(cols/128)] float32 */
  QC_QF_FP8_GROUP128_UE8M0,  /* same, power-of-two scales (float32 values) */
  QC_QF_FP8_BLOCK128,        /* [ceil(rows/128), ceil(cols/128)] float32 */
  QC_QF_FP8_BLOCK128_UE8M0,  /* same, power-of-two, two stages */
  QC_QF_NVFP4,               /* e2m1 x2, [rows, ceil(cols/16)] e4m3 scales, float32 global [1] */
  QC_QF_MXFP8,               /* e4m3, [rows, ceil(cols/32)] e8m0 */
  QC_QF_MXFP4,               /* e2m1 x2, [rows, ceil(cols/32)] e8m0 */
  QC_QF_COUNT
} qc_qfmt;

typedef enum {
  QC_QP_VLLM = 0,           /* vLLM on Hopper: weights through Inductor, activations through its CUDA kernels */
  QC_QP_VLLM_NATIVE,        /* vLLM's torch-native activation quantizer, compiled by Inductor */
  QC_QP_VLLM_TRITON,        /* vLLM's Triton per-token-group kernel (floors the amax: UE8M0 minimum 2^-42) */
  QC_QP_VLLM_CUDA,          /* vLLM's CUDA activation kernels (vllm's own rows; the group UE8M0 scale floored: 2^-33) */
  QC_QP_VLLM_CUDA_NVFP4,    /* vLLM's CUDA nvfp4 kernel (sm_100+) */
  QC_QP_TORCH,              /* eager PyTorch on CUDA (QAT code, DeepGEMM's Python reference) */
  QC_QP_DEEPGEMM,           /* DeepGEMM upstream: power-of-two scales by the exponent bit rule */
  QC_QP_MODELOPT,           /* NVIDIA ModelOpt export */
  QC_QP_COMPRESSED_TENSORS, /* compressed-tensors / llm-compressor */
  QC_QP_TE,                 /* Transformer Engine current scaling */
  QC_QP_OCP,                /* the OCP MX specification */
  QC_QP_EXACT,              /* correctly rounded division everywhere (the paper rule) */
  QC_QP_COUNT
} qc_qprof;

/* Names <-> enums. Parsing an unknown name is QC_EINPUT with a message
 * naming it and the known ones. */
int qc_qfmt_parse(const char *name, qc_qfmt *out);
int qc_qprof_parse(const char *name, qc_qprof *out);
const char *qc_qfmt_name(qc_qfmt f);
const char *qc_qprof_name(qc_qprof p);

/* Is `fmt` a known format name (weight or activation)? */
int qc_quant_known(const char *fmt);

/* The producer path of (fmt, prof): stage 1's recipe, and stage 2's for the
 * two-stage fp8_block128_ue8m0 (returns 1 then, else 0 and r2 zeroed). */
int qc_qrecipe(qc_qfmt fmt, qc_qprof prof, qc_recipe *r1, qc_recipe *r2);
/* Does the producer of prof make fmt at all (ocp: the mx formats only; te:
 * all but mx)? A profile still quantizes every format (its base profile's
 * path), but --identify names only producers of the format. */
int qc_qprof_makes(qc_qfmt fmt, qc_qprof prof);
/* Do two profiles run the same operation sequence for fmt (the same bytes
 * for every input)? */
int qc_qprof_same(qc_qfmt fmt, qc_qprof a, qc_qprof b);
/* One line naming the producer path of (fmt, prof), e.g. "eager PyTorch:
 * s = max(amax, 1e-4) * RN(1/448), x * rcp(s)". */
void qc_qpath_desc(qc_qfmt fmt, qc_qprof prof, char *buf, int n);

/* The deployed form of a quantized [rows, cols] matrix:
 *   q       payload: QC_E4M3 [rows, cols], or QC_E2M1X2 [rows, ceil(cols/2)]
 *           (element 2i in the low nibble; an odd last column leaves the
 *           high nibble 0)
 *   scale   dequantization scales, dtype and shape per format (quant.h enum)
 *   gscale  nvfp4 only: QC_F32 [1], the profile's global scale (vllm, te:
 *           g = 2688/amax, dequant divides by it; modelopt: amax/2688,
 *           dequant multiplies); otherwise empty (ndim 0, no data). */
typedef struct qc_quantized {
  qc_tensor q, scale, gscale;
} qc_quantized;

void qc_quantized_free(qc_quantized *z);

/* What a checkpoint stored, taken as stored (NULL members: derive):
 *   gscale   nvfp4's global scale (the profile's meaning: a divisor g, or
 *            modelopt's multiplier amax/2688)
 *   scale    the block scales of a float32-scale format (the dequantization
 *            multipliers; for fp8_block128_ue8m0 stage 2's), in scale-grid order
 *   scale_b  the block scale bytes of nvfp4 (e4m3) or mx (e8m0)
 * The payload is then quantized with these scales: the elements' own rule,
 * whatever derived the scales. */
typedef struct qc_qstored {
  const float *gscale;
  const float *scale;
  const uint8_t *scale_b;
} qc_qstored;

/* Quantize in[rows, cols] (float32, finite) under fmt/profile. sr NULL or
 * sr->on == 0: round to nearest even; else the payload elements round
 * stochastically by the sr contract with counter index
 * qc_sr_index(sr, rows*cols, r*cols + c)
 * (scales always round to nearest). Blocks that run past the matrix edge are
 * padded with zeros (they change no amax). Non-finite input is QC_EINPUT naming
 * `what` and the flat index. Fills *out (caller frees). */
int qc_quantize(qc_qfmt fmt, qc_qprof prof, int64_t rows, int64_t cols, const float *in, const qc_sr *sr,
                qc_quantized *out, const char *what);
/* The same with stored scales taken as stored (st NULL: qc_quantize); the
 * global scale written to out->gscale is then the stored one. */
int qc_quantize_st(qc_qfmt fmt, qc_qprof prof, int64_t rows, int64_t cols, const float *in, const qc_sr *sr,
                   const qc_qstored *st, qc_quantized *out, const char *what);

/* out[rows, cols] = dequant(z) in float32. z's dtypes and shapes are checked
 * against the format (QC_EINPUT naming `what` on a mismatch). */
int qc_dequantize(qc_qfmt fmt, qc_qprof prof, int64_t rows, int64_t cols, const qc_quantized *z, float *out,
                  const char *what);

/* The expected dtype and shape of each part for a [rows, cols] matrix
 * (gscale_ndim 0 when there is none). */
void qc_quant_layout(qc_qfmt fmt, qc_qprof prof, int64_t rows, int64_t cols, qc_dtype *q_dt, int64_t q_shape[2],
                     qc_dtype *s_dt, int *s_ndim, int64_t s_shape[2], int *g_ndim);

/* out = dequant(quant(in)) for a [rows, cols] float32 matrix under format
 * fmt and profile (NULL = "vllm"), round to nearest. Non-finite input is
 * refused (QC_EINPUT naming `what`). in and out may alias. */
int qc_fake_quant(const char *fmt, const char *profile, int64_t rows, int64_t cols, const float *in, float *out,
                  const char *what);
/* The same with stochastic rounding of the payload (sr NULL: nearest). */
int qc_fake_quant_sr(const char *fmt, const char *profile, int64_t rows, int64_t cols, const float *in, float *out,
                     const qc_sr *sr, const char *what);

/* out[r * ldo + c] = dequant(quant(in))[r, c] widened to float64: exactly
 * qc_fake_quant's float32 values, computed block by block on qc_par_for's
 * threads without a full-size temporary. Round to nearest; non-finite input
 * is QC_EINPUT naming `what`. ldo >= cols. */
int qc_fake_quant_f64(const char *fmt, const char *profile, int64_t rows, int64_t cols, const float *in, double *out,
                      int64_t ldo, const char *what);
/* The same on input of element type dt (float32, float64 narrowed to
 * float32 by rounding to nearest, float16 or bfloat16 bits widened exactly),
 * converted a block row at a time. */
int qc_fake_quant_f64_dt(const char *fmt, const char *profile, int64_t rows, int64_t cols, qc_dtype dt, const void *in,
                         double *out, int64_t ldo, const char *what);

#endif
