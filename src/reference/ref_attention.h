/* ref_attention.h: the products of the attention reference
 * (reference/attention.c) as float64 GEMMs on the audit's backend
 * (reference/attention_gemm.c). The math is attention.c's file comment. */
#ifndef QC_REF_ATTENTION_H
#define QC_REF_ATTENTION_H

#include <stdint.h>

#include "backend/backend.h"
#include "core/tensor.h"

/* One attention call, its operands decoded to float64: Q [B, Hq, S, D],
 * K [B, Hkv, S, D], V [B, Hkv, S, Dv], G = dO [B, Hq, S, Dv]; O the saved
 * out [B, Hq, S, Dv] for the Delta held in odt, or NULL (Delta from the
 * reference's own P and dP). Query i sees the keys j < S with j <= i + off
 * when causal and i - j < W when W > 0. */
typedef struct {
  const qc_backend *be;
  const double *Q, *K, *V, *G, *O;
  int64_t B, Hq, Hkv, S, D, Dv, W, off;
  double sc, cap;
  int causal, ab; /* ab: the terms' scale, not the gradient */
  qc_dtype odt;
} qc_ref_att;

/* d_q, d_k, d_v (zeroed, the shapes of Q, K, V) of a; QC_OK, or the
 * backend's or the allocator's error. The result does not depend on the
 * thread count. */
int qc_ref_att_vjp(const qc_ref_att *a, double *dq, double *dk, double *dv);

/* The forward of a (G, O unused): lse 0, out [B, Hq, S, Dv] = O; lse 1,
 * out [B, Hq, S] = LSE (natural log; -inf for a query without a visible
 * key) and t [B, Hq, S] its terms |max| + c max_j sum_d |q||k| + 1 (0 for
 * such a query). */
int qc_ref_att_fwd(const qc_ref_att *a, int lse, double *out, double *t);

/* The rows of a block: as many as nmat [rows, S] float64 matrices hold in
 * the blocks' scratch budget, at most 256 and S, at least 1. */
int64_t qc_ref_att_block_rows(int64_t S, int nmat);
/* The block of rows from i0: *m rows (at most rows, to S), the keys
 * [*lo, *hi) some row of it sees (none when *hi <= *lo). */
void qc_ref_att_block(const qc_ref_att *a, int64_t i0, int64_t rows, int64_t *m, int64_t *lo, int64_t *hi);

/* qc_ref_att_vjp and qc_ref_att_fwd with the operands in the backend's
 * device buffers and the rows on the device (reference/attention_dev.c);
 * QC_NA where that path is not taken (the caller runs the host path). */
int qc_ref_att_vjp_dev(const qc_ref_att *a, double *dq, double *dk, double *dv);
int qc_ref_att_fwd_dev(const qc_ref_att *a, int lse, double *out, double *t);

#endif
