/* engine/shard_priv.h: what shard.c and shard_diag.c share (layer 1 over a
 * sharded dump; docs/interfaces.md, "Sharded dumps"). */
#ifndef QC_ENGINE_SHARD_PRIV_H
#define QC_ENGINE_SHARD_PRIV_H

#include <stdint.h>

#include "core/tensor.h"
#include "io/dump.h"
#include "model/check.h"
#include "model/module.h"

/* One rank's file of a sharded dump and its pieces of the module audited. */
typedef struct qc_rankfile {
  qc_dump *d;
  qc_module m;      /* this rank's pieces of the module being audited */
  int loaded;
} qc_rankfile;

/* Open the files of pattern, ordered by their root attribute `rank`: one
 * per rank 0 .. *world - 1 (*out: allocated; each file closed by the
 * caller). */
int qc_shard_open(const char *pattern, qc_rankfile **out, int *world);
/* The tensor set of role `role` ("inputs", "params", "saved", "grad_out") of m. */
qc_tset *qc_shard_role(qc_module *m, const char *role);
/* Assemble role `role` of whole module w (group `path`) from the W ranks'
 * loaded pieces: split tensors concatenated along their shard_dim in rank
 * order, flat pieces joined and unpadded, whole ones checked equal. */
int qc_shard_assemble(qc_rankfile *rf, int W, const char *path, const char *role, qc_module *w);
/* How tensor `name` of role `role` of module `mpath` is split over the W
 * ranks: *d the dimension (-1: whole) and off[s], len[s] (s < W <= 256)
 * rank s's piece along it; a flat piece: *flat = 1, *d = 0, off/len its
 * real elements in the flattened whole, *L the pieces' stored length. */
int qc_shard_split(qc_rankfile *rf, int W, const char *mpath, const char *role, const char *name, int *d, int *flat,
                   int64_t *L, int64_t *off, int64_t *len);
/* The trainer's reduction of parameter gradients over the ranks (group
 * attribute grad_reduce, the same on every rank): *mean = 1 for "mean", 0
 * for "sum" (the default). */
int qc_shard_grad_reduce(qc_rankfile *rf, int W, const char *path, int *mean);

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
 * whole) at off[s], len[s] for every rank s of W; mean: the expected piece
 * is the reference's averaged over the ranks (grad_reduce); partial: the reference
 * on rank r's own pieces (NULL: none); sum: every rank's candidate summed
 * (NULL: none); own[nown]: further predictions of rank r's share. */
void qc_shard_diagnose(qc_check *k, const double *g, const qc_tensor *ref, int d, const int64_t *off, const int64_t *len,
                       int r, int W, int mean, const qc_tensor *partial, const double *sum, const qc_shard_own *own,
                       int nown);

#endif
