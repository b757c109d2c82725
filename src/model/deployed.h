/* deployed.h: what a deployed-bytes comparison found (engine/deployed.h
 * makes it): mismatch counts per part and the first mismatches, the
 * comparisons the `quant` verb reports, and the rows of a calibration
 * comparison (engine/calib.h). */
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
  int64_t n_payload_given;     /* payload mismatches when quantized with the stored scales (-1: not computed) */
  int scale_ulps;              /* largest distance of a float32 scale from the derived one, in ulps (0: none) */
  int g_kind_differs;          /* the stored global scale is a multiplier and the profile's a divisor, or the reverse */
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

/* Every profile against one set of deployed bytes (engine/deployed.c,
 * qc_deployed_identify): which reproduce them, which one to use, and in
 * words why (or, when none does, the closest and what differs). */
typedef struct qc_identify {
  qc_quant_cmp c[QC_QP_COUNT];
  int n;               /* = QC_QP_COUNT */
  int any;             /* some profile reproduces every byte */
  int chosen;          /* the reproducing profile used (the first in QC_QP order), else the closest */
  char why[1024];      /* "reproduced by torch, modelopt, compressed_tensors" or "none reproduces; closest ..." */
} qc_identify;

/* One producer path of a calibration comparison (`quant --calibration`):
 * how many values and records were compared and how many bytes differ. */
typedef struct qc_calib_row {
  char profile[25], format[25];
  int64_t values, records;
  int64_t bad_payload, bad_scale, bad_global; /* mismatching bytes */
  char first[400];                            /* the first mismatch, "" if none */
} qc_calib_row;

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
