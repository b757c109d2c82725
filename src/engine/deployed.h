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

/* A master weight and the deployed bytes found for it. */
typedef struct qc_deployed_input {
  int64_t N, K;
  float *W;            /* [N, K] float32 (bf16 / f16 / f32 masters exactly; float64 rounded) */
  qc_quantized got;    /* payload, scales and (nvfp4) global scale as found; gscale empty if none */
  int g_mult;          /* the global scale is a multiplier (saved/weight_scale_2) */
  const char *where;   /* names the source in messages ("/model.layers.0.mlp.down_proj: saved") */
} qc_deployed_input;

void qc_deployed_input_free(qc_deployed_input *in);

/* Read m's master and deployed bytes into *in (copies; free with
 * qc_deployed_input_free). Absent saved/weight_q: QC_OK with in->got.q
 * empty. A missing scale (or global scale for nvfp4), a master that is not
 * 2-D: QC_EINPUT naming the dataset. */
int qc_deployed_read_module(const qc_module *m, qc_qfmt fmt, qc_deployed_input *in);

/* Compare in's bytes with qatcheck's quantization of in->W under fmt/prof
 * (round to nearest, or sr). Wrong dtypes or shapes, a non-finite master:
 * QC_EINPUT with a message; mismatching bytes are a result (counts, the
 * first QC_DEPLOYED_FIRST mismatches, the payload under the stored scales). */
int qc_deployed_compare(qc_qfmt fmt, qc_qprof prof, const qc_deployed_input *in, const qc_sr *sr, qc_deployed_result *out);

/* Every profile against in's bytes (*out: which reproduce them, the chosen
 * one, the reason in words). */
int qc_deployed_identify(qc_qfmt fmt, const qc_deployed_input *in, const qc_sr *sr, qc_identify *out);

/* Module forms: qc_deployed_read_module, then compare (or identify). With no
 * saved/weight_q, out->present = 0 (compare) / out->any = 0, n = 0 (identify). */
int qc_deployed_check(const qc_module *m, qc_qfmt fmt, qc_qprof prof, const qc_sr *sr, qc_deployed_result *out);
int qc_deployed_identify_module(const qc_module *m, qc_qfmt fmt, const qc_sr *sr, qc_identify *out);

#endif
