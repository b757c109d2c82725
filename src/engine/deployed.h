/* deployed.h: do a module's deployed bytes (saved/weight_q, saved/weight_scale
 * and, for nvfp4, saved/weight_global_scale) equal qatcheck's quantization of
 * its master params/weight, byte for byte? */
#ifndef QC_DEPLOYED_H
#define QC_DEPLOYED_H

#include <stdint.h>

#include "model/module.h"
#include "numerics/quant.h"

#define QC_DEPLOYED_FIRST 8

/* One mismatch. part: "payload" (index = flat element index, bytes are
 * element codes: e4m3 bytes or e2m1 nibbles), "scale" (index = flat scale
 * index, master = the block's amax), "global" or "decoded" (bf16 bits of the
 * dequantized element). */
typedef struct qc_qmismatch {
  const char *part;
  int64_t index;
  double master;
  uint32_t expected, found;
} qc_qmismatch;

typedef struct qc_deployed_result {
  int present;                 /* saved/weight_q exists */
  int64_t n_payload, n_scale, n_global, n_decoded;
  int64_t total_payload;       /* elements compared */
  int nfirst;
  qc_qmismatch first[QC_DEPLOYED_FIRST];
} qc_deployed_result;

/* Re-quantize m's params/weight [N, K] under fmt/profile (round to nearest,
 * or sr when given) and compare with m's saved/ tensors. Wrong dtypes or
 * shapes, a missing scale, a non-finite master or an unknown format are
 * QC_EINPUT with a message; mismatching bytes are a result (counts and the
 * first QC_DEPLOYED_FIRST mismatches). Absent saved/weight_q: present = 0. */
int qc_deployed_check(const qc_module *m, qc_qfmt fmt, qc_qprof prof, const qc_sr *sr, qc_deployed_result *out);

/* One line: "N payload, N scale, N global, N decoded-bf16 mismatches of N
 * elements; first: payload[i] master v: expected 0x.. found 0x..; ...". */
void qc_deployed_summary(const qc_deployed_result *r, char *buf, int n);

#endif
