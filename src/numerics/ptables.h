/* ptables.h: the measured tables behind the host emulation of the GPU's
 * approximate arithmetic (parith.h), generated from an H200 measurement by
 * scripts/calibrate/gen_tables.py into rcpa_data.c and ceil2log_data.c:
 *
 *   rcp.approx.f32  for each of the 2^23 mantissas m, whether rcp.approx(1.m)
 *                   differs from the correctly rounded 1/1.m (by one ulp) and
 *                   in which direction: the differing mantissas as
 *                   Golomb-Rice coded gaps (parameter k), then one direction
 *                   bit each (1: larger magnitude), base64 text
 *   ceil(log2f(v))  the float32 inputs v > 0 (bits, sorted) where the GPU's
 *                   ceil(log2f(v)) is one below the exact ceiling
 *
 * Decoded once (qc_ptables_init); qc_ptables_check verifies the decode. */
#ifndef QC_PTABLES_H
#define QC_PTABLES_H

#include <stdint.h>

extern const char qc_rcpa_rice_b64[];
extern const uint32_t qc_rcpa_ndiff, qc_rcpa_rice_k, qc_rcpa_nup;
extern const uint32_t qc_ceil2log_exc[];
extern const uint32_t qc_ceil2log_nexc;
/* Provenance line of the measurement ("" for a placeholder table). */
extern const char qc_ptables_source[];

/* 1 when the rcp.approx table decoded to qc_rcpa_ndiff mantissas of which
 * qc_rcpa_nup round up, and the ceil2_log list is sorted; else 0. */
int qc_ptables_ok(void);
/* How rcp.approx(1.m) relates to RN(1/1.m): 0 equal, +1 one ulp larger
 * magnitude, -1 one ulp smaller. */
int qc_rcpa_delta(uint32_t mantissa);

#endif
