/* deployed.h: what a deployed-bytes comparison found (engine/deployed.h
 * makes it): mismatch counts per part and the first mismatches, and the
 * comparisons the `quant` verb reports. */
#ifndef QC_MODEL_DEPLOYED_H
#define QC_MODEL_DEPLOYED_H

#include <stdint.h>

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

/* One line: "N payload, N scale, N global, N decoded-bf16 mismatches of N
 * elements; first: payload[i] master v: expected 0x.. found 0x..; ...". */
void qc_deployed_summary(const qc_deployed_result *r, char *buf, int n);

/* One comparison of the `quant` verb: a profile and what it gave. */
typedef struct qc_quant_cmp {
  qc_qprof prof;
  qc_deployed_result r;
  int ok;              /* every byte reproduced */
  char line[2048];     /* qc_deployed_summary */
} qc_quant_cmp;

/* One module of a many-module `quant` run (a checkpoint pair, or every
 * module of a dump with deployed bytes): where its bytes came from and the
 * comparison. */
#define QC_QROW_NAMELEN 320
typedef struct qc_quant_row {
  char module[QC_QROW_NAMELEN];     /* "/model.layers.0.mlp.down_proj" */
  char format[32];                  /* "fp8_block128" */
  char convention[48];              /* naming it was found by: "deepseek_fp8", "modelopt", "compressed_tensors", "dump" */
  char tensors[256];                /* the deployed tensors compared ("weight F8_E4M3, weight_scale_inv F32") */
  qc_quant_cmp c;
} qc_quant_row;

/* A module seen but not compared, and why (unquantized, int8, ...). */
typedef struct qc_quant_skip {
  char module[QC_QROW_NAMELEN];
  char why[160];
} qc_quant_skip;

/* The rows and skips of a many-module run. */
typedef struct qc_quant_rows {
  qc_quant_row *row;
  int n, cap;
  qc_quant_skip *skip;
  int nskip, capskip;
} qc_quant_rows;

/* A new row (zeroed) / skip appended; QC_ESYS out of memory. */
int qc_quant_rows_add(qc_quant_rows *r, qc_quant_row **out);
int qc_quant_rows_skip(qc_quant_rows *r, const char *module, const char *why);
void qc_quant_rows_free(qc_quant_rows *r);

#endif
