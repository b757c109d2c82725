/* qcal.h: the calibration files written by scripts/calibrate/ (qcal.py
 * there is the writer; docs/conformance.md the description): inputs, and
 * the bytes each producer path made of them, in qatcheck's deployed layout.
 *
 * File: magic "QCAL0001", then chunks (little endian): u32 tag, u32 0, u64
 * body length, body.
 *   tag 1 input   u32 id, u32 dtype (0 float32, 1 bfloat16), i64 rows,
 *                 i64 cols, char name[32], the elements
 *   tag 2 output  char profile[24], char format[24], u32 input id, u32
 *                 flags (bit 0: a float32 global scale follows), i64 payload
 *                 bytes, i64 scale bytes, payload, scales, global scale */
#ifndef QC_QCAL_H
#define QC_QCAL_H

#include <stddef.h>
#include <stdint.h>

#include "core/tensor.h"

typedef struct qc_qcal_input {
  uint32_t id;
  qc_dtype dtype;           /* QC_F32 or QC_BF16 */
  int64_t rows, cols;
  char name[33];
  const void *data;         /* rows * cols elements, inside the file buffer, unaligned: read with memcpy */
} qc_qcal_input;

typedef struct qc_qcal_output {
  char profile[25], format[25];
  const qc_qcal_input *in;
  int has_g;
  float g;
  int64_t nq, ns;
  const uint8_t *payload, *scale;
} qc_qcal_output;

typedef struct qc_qcal {
  uint8_t *buf;
  qc_qcal_input *in;
  int nin;
  qc_qcal_output *out;
  int nout;
} qc_qcal;

/* Read a whole calibration file; every chunk's bounds, the dtypes and the
 * input references are checked (QC_EINPUT naming the file and the chunk's
 * offset). */
int qc_qcal_read(const char *path, qc_qcal *q);
void qc_qcal_free(qc_qcal *q);

#endif
