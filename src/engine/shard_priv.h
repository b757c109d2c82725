/* engine/shard_priv.h: what shard.c and shard_diag.c share (layer 1 over a
 * sharded dump; docs/interfaces.md, "Sharded dumps"). */
#ifndef QC_ENGINE_SHARD_PRIV_H
#define QC_ENGINE_SHARD_PRIV_H

#include <stdint.h>

#include "model/check.h"
#include "core/tensor.h"

/* Piece [off, off + len) of float64 tensor t along dimension d, as out
 * (allocated; the caller frees it). */
int qc_shard_slice(const qc_tensor *t, int d, int64_t off, int64_t len, qc_tensor *out);

/* What a rank's share would be with the reduction over the ranks missing,
 * as a prediction of its piece (n elements, the expected piece's) and what
 * it would mean; pred NULL: not computed. */
typedef struct qc_shard_own {
  const double *pred;
  const char *says;
} qc_shard_own;

/* Record on failed per-rank check k what it looks like (its diagnosis and
 * hypotheses): this rank's own partial gradient or share (the reduction
 * missing), a multiple of the expected piece (reduced twice, averaged,
 * mis-scaled), another rank's piece (shards in the wrong order), or a share
 * of the ranks' sum. g: the candidate as float64, the expected piece's
 * elements; ref: the reference the pieces are cut from, split along d (-1:
 * whole) at off[s], len[s] for every rank s of W; partial: the reference
 * on rank r's own pieces (NULL: none); sum: every rank's candidate summed
 * (NULL: none); own[nown]: further predictions of rank r's share. */
void qc_shard_diagnose(qc_check *k, const double *g, const qc_tensor *ref, int d, const int64_t *off, const int64_t *len,
                       int r, int W, const qc_tensor *partial, const double *sum, const qc_shard_own *own, int nown);

#endif
