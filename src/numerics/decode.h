/* decode.h: a tensor's stored elements as real numbers. The tensor type is
 * core's; what its bytes mean (bfloat16, float8, float4, e8m0) is an
 * encoding, so decoding lives here with the encodings. */
#ifndef QC_DECODE_H
#define QC_DECODE_H

#include "core/tensor.h"

/* Decode every element to float64 into out (qc_numel(t) elements; for
 * QC_E2M1X2, 2 * qc_numel(t)). Integers convert exactly where they can. */
int qc_tensor_to_f64(const qc_tensor *t, double *out);
/* dst[0, n) = the n elements of float dtype dt (float64, float32, float16,
 * bfloat16) at src, exactly, on qc_par_for's threads; QC_EINPUT for another
 * dtype. */
int qc_float_to_f64(qc_dtype dt, const void *src, int64_t n, double *dst);
/* dst[0, n) = the n elements of float dtype dt (float32, float16,
 * bfloat16) at src, exactly, on qc_par_for's threads; QC_EINPUT for
 * another dtype (float64 does not widen to float32 exactly). */
int qc_float_to_f32(qc_dtype dt, const void *src, int64_t n, float *dst);
/* dst[0, n) = src[0, n) rounded to float32 (a C cast each), on
 * qc_par_for's threads. */
void qc_f64_to_f32s(const double *src, int64_t n, float *dst);
/* Allocate a float64 tensor holding t decoded (same logical shape). */
int qc_tensor_decode_f64(const qc_tensor *t, qc_tensor *out);

/* The unit roundoff 2^-p of element type d, p its significand bits (the
 * implicit one included): float64 2^-53, float32 2^-24, float16 2^-11,
 * bfloat16 2^-8, float8_e4m3fn 2^-4, float8_e5m2 2^-3, float4_e2m1fn_x2
 * 2^-2; 0 for a type without a significand (integers, the e8m0 scale).
 * The one table of these; callers that accept only some types say which. */
double qc_dtype_unit(qc_dtype d);

#endif
