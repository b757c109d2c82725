/* qlayout.h: where a quantizer's results go, and the scale-group grid of
 * each format: the layout facts every quantizer implementation (the CPU
 * library, the CUDA kernels) and every reader of deployed bytes share. */
#ifndef QC_QLAYOUT_H
#define QC_QLAYOUT_H

#include <stdint.h>

/* Where a quantizer's results go. Scale groups form a grid of srows x scols
 * (qc_qlayout). NULL fields are not produced. */
typedef struct qc_qout {
  float *deq;         /* [rows, cols] dequant(quant(x)) in float32 */
  uint8_t *q;         /* payload: [rows, cols] fp8 bytes, or [rows, (cols+1)/2] e2m1 pairs (low nibble first) */
  float *scale;       /* [srows, scols] the dequantization multiplier s (value = q * s) */
  uint8_t *scale_b;   /* [srows, scols] scale bytes: E8M0 (mx*, *_ue8m0) or E4M3 (nvfp4); 0 for float scales */
  float gscale;       /* nvfp4: the global encode scale g = 2688 / amax; else 0 */
} qc_qout;

/* The scale grid of fmt for a [rows, cols] matrix: groups of grows x gcols
 * elements (tails partial), srows x scols of them, packed = 1 for e2m1
 * payloads. QC_EINPUT (message naming fmt) for an unknown format. */
int qc_qlayout(const char *fmt, int64_t rows, int64_t cols, int64_t *grows, int64_t *gcols, int64_t *srows,
               int64_t *scols, int *packed);

#endif
