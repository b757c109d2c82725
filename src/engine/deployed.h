/* deployed.h: do a module's deployed bytes (saved/weight_q, saved/weight_scale
 * and, for nvfp4, saved/weight_global_scale) equal qatcheck's quantization of
 * its master params/weight, byte for byte? */
#ifndef QC_DEPLOYED_H
#define QC_DEPLOYED_H

#include <stdint.h>

#include "model/deployed.h"
#include "model/module.h"
#include "numerics/quant.h"

/* Re-quantize m's params/weight [N, K] under fmt/profile (round to nearest,
 * or sr when given) and compare with m's saved/ tensors. Wrong dtypes or
 * shapes, a missing scale, a non-finite master or an unknown format are
 * QC_EINPUT with a message; mismatching bytes are a result (counts and the
 * first QC_DEPLOYED_FIRST mismatches). Absent saved/weight_q: present = 0. */
int qc_deployed_check(const qc_module *m, qc_qfmt fmt, qc_qprof prof, const qc_sr *sr, qc_deployed_result *out);

#endif
