/* deployed.h: do deployed bytes (payload, block scales and, for nvfp4, the
 * global scale) equal qatcheck's quantization of the master weight under a
 * profile, byte for byte, and which profiles reproduce them? The checks
 * work on any (master, deployed bytes) pair (qc_deployed_input); the
 * module helpers read one from a dump's module group:
 *   params/weight                         the master [N, K]
 *   saved/weight_q                        the payload
 *   saved/weight_scale (or weight_scale_inv) the block scales
 *   saved/weight_global_scale             nvfp4: the profile's global scale
 *   saved/weight_scale_2                  nvfp4: a global multiplier (amax/2688)
 * A stored global scale is taken as stored to quantize the blocks and is
 * re-derived only to check it; the stored block scales also give a second
 * payload comparison (the elements' own rule under the stored scales), which
 * tells a wrong scale rule from a wrong element rule. */
#ifndef QC_DEPLOYED_H
#define QC_DEPLOYED_H

#include <stdint.h>

#include "model/deployed.h"
#include "model/module.h"
#include "numerics/quant.h"

/* Module forms: qc_deployed_read_module, then compare (or identify). With no
 * saved/weight_q, out->present = 0 (compare) / out->any = 0, n = 0 (identify). */
int qc_deployed_check(const qc_module *m, qc_qfmt fmt, qc_qprof prof, const qc_sr *sr, qc_deployed_result *out);
int qc_deployed_identify_module(const qc_module *m, qc_qfmt fmt, const qc_sr *sr, qc_identify *out);

/* The same for expert e of a stacked parameter (the moe class's routed
 * experts): params/<param> [E, N, K] the masters, saved/<param>_q the
 * payloads, saved/<param>_scale (or _scale_inv) the block scales, each with
 * the experts leading, and for nvfp4 saved/<param>_global_scale (or the
 * multiplier _scale_2), one per expert ([E] or [E, 1]); expert e's slices
 * are compared as one weight's (round to nearest). No saved/<param>_q:
 * out->present = 0 / out->n = 0. A missing scale, a part whose leading
 * dimension is not E: QC_EINPUT naming the dataset. */
int qc_deployed_check_expert(const qc_module *m, const char *param, int64_t e, qc_qfmt fmt, qc_qprof prof, qc_deployed_result *out);
int qc_deployed_identify_expert(const qc_module *m, const char *param, int64_t e, qc_qfmt fmt, qc_identify *out);

#endif
