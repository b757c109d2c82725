/* tsource.h: a source of tensors by name, bytes as stored: an HDF5 dump
 * (names are dataset paths, "/m.layers.0.q_proj/params/weight") or a
 * safetensors checkpoint (names are tensor names,
 * "model.layers.0.self_attn.q_proj.weight"). The layer-2 sweep plans and
 * reads through it, so it works on either; a new kind of source is one
 * more table of operations.
 *
 * Reading a tensor is two steps: locate it (shape checked, byte count and
 * where its bytes lie), then read those bytes into a buffer. A located
 * tensor with offset >= 0 can be read from any thread at once
 * (qc_tsrc_pread); one with offset -1 only by one thread at a time
 * (qc_tsrc_read_into: HDF5's chunked or filtered datasets). */
#ifndef QC_TSOURCE_H
#define QC_TSOURCE_H

#include <stddef.h>

#include "core/tensor.h"

struct qc_dump;
struct qc_st;

/* Where the bytes of a tensor (or slice `index` of its first dimension)
 * lie. */
typedef struct qc_tloc {
  qc_dtype dtype;
  size_t nbytes;       /* element count x element size */
  long long offset;    /* >= 0: a position qc_tsrc_pread understands; -1: read with qc_tsrc_read_into */
  int part;            /* which file of the source (safetensors shards) */
} qc_tloc;

typedef struct qc_tsrc qc_tsrc;

typedef struct qc_tsrc_ops {
  const char *kind;    /* "hdf5 dump", "safetensors checkpoint" */
  int (*exists)(const qc_tsrc *s, const char *name);
  int (*info)(const qc_tsrc *s, const char *name, qc_tensor *shape_only);
  int (*locate)(const qc_tsrc *s, const char *name, long long index, qc_tloc *loc);
  int (*pread)(const qc_tsrc *s, const char *name, const qc_tloc *loc, void *buf);
  int (*read_into)(const qc_tsrc *s, const char *name, long long index, void *buf, size_t nbytes);
  /* names of the tensors directly under `group` ("<group>/<name>"), in
   * name order; none when the group is absent */
  int (*list)(const qc_tsrc *s, const char *group, char (**names)[QC_NAMELEN], int *n);
} qc_tsrc_ops;

struct qc_tsrc {
  const qc_tsrc_ops *ops;
  void *impl;          /* the qc_dump or qc_st, borrowed */
  const char *path;
};

/* A source over an open dump or checkpoint (borrowed: close it after the
 * source's last use). */
void qc_tsrc_dump(qc_tsrc *s, struct qc_dump *d);
void qc_tsrc_st(qc_tsrc *s, struct qc_st *st);

/* The operations, with the source's own messages (each names the file and
 * the tensor). */
int qc_tsrc_exists(const qc_tsrc *s, const char *name);
int qc_tsrc_info(const qc_tsrc *s, const char *name, qc_tensor *shape_only);
int qc_tsrc_locate(const qc_tsrc *s, const char *name, long long index, qc_tloc *loc);
int qc_tsrc_pread(const qc_tsrc *s, const char *name, const qc_tloc *loc, void *buf);
int qc_tsrc_read_into(const qc_tsrc *s, const char *name, long long index, void *buf, size_t nbytes);
int qc_tsrc_list(const qc_tsrc *s, const char *group, char (**names)[QC_NAMELEN], int *n);

#endif
