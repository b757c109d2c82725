/* quant.h: quantizers of spec/numerics.md, bulk, on row-major 2-D views.
 * A 1-D tensor is one row; an N-D tensor is [prod(leading), last]. */
#ifndef QC_QUANT_H
#define QC_QUANT_H

#include <stdint.h>

/* Formats a contract may name. "none" is the identity. */
#define QC_WEIGHT_FORMATS "none|fp8_tensor|fp8_channel|fp8_block128|fp8_block128_ue8m0|nvfp4|mxfp8|mxfp4"
#define QC_ACT_FORMATS "none|fp8_token|fp8_group128|fp8_group128_ue8m0"
#define QC_PROFILES "vllm|vllm_native|vllm_cuda_nvfp4|te|ocp|modelopt"

/* Is `fmt` a known format name (weight or activation)? */
int qc_quant_known(const char *fmt);

/* out = dequant(quant(in)) for a [rows, cols] float32 matrix under format
 * fmt and profile (NULL = "vllm"), round to nearest. Non-finite input is
 * refused (QC_EINPUT naming `what`). in and out may alias. */
int qc_fake_quant(const char *fmt, const char *profile, int64_t rows, int64_t cols, const float *in, float *out,
                  const char *what);

#endif
