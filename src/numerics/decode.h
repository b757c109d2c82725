/* decode.h: a tensor's stored elements as real numbers. The tensor type is
 * core's; what its bytes mean (bfloat16, float8, float4, e8m0) is an
 * encoding, so decoding lives here with the encodings. */
#ifndef QC_DECODE_H
#define QC_DECODE_H

#include "core/tensor.h"

/* Decode every element to float64 into out (qc_numel(t) elements; for
 * QC_E2M1X2, 2 * qc_numel(t)). Integers convert exactly where they can. */
int qc_tensor_to_f64(const qc_tensor *t, double *out);
/* Allocate a float64 tensor holding t decoded (same logical shape). */
int qc_tensor_decode_f64(const qc_tensor *t, qc_tensor *out);

#endif
