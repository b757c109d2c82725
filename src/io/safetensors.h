/* safetensors.h: Hugging Face safetensors checkpoints, read by qatcheck's
 * own reader (docs/interfaces.md section 2b): one file, a folder, or the
 * shards named by a model.safetensors.index.json.
 *
 * A file is an 8-byte little-endian header length n, n bytes of JSON
 * ({"name": {"dtype": "BF16", "shape": [..], "data_offsets": [begin, end]},
 * "__metadata__": {...}}), then the data; offsets count from the data's
 * start. Every header is validated when the checkpoint is opened (a header
 * over 100 MB, offsets past the end or overlapping, a byte count that is not
 * dtype x shape, an unknown dtype, a shard named in the index but missing:
 * QC_EINPUT with one message naming the file and the tensor); tensor bytes
 * are read later, from any thread, by pread (or, QATCHECK_ST_READ=mmap, by
 * mmap of the tensor's range). */
#ifndef QC_SAFETENSORS_H
#define QC_SAFETENSORS_H

#include <stddef.h>
#include <stdint.h>

#include "core/tensor.h"

#define QC_ST_MAX_HEADER 100000000ull  /* bytes: the safetensors package's own limit */
#define QC_ST_NAMELEN 1024             /* longest tensor name accepted */

/* One tensor of a checkpoint. */
typedef struct qc_st_tensor {
  char *name;                 /* as in the header */
  char st_dtype[16];          /* as stored: "BF16", "F8_E4M3", "F4", ... */
  int dtype;                  /* its qc_dtype, or -1: a dtype qatcheck holds no tensor of
                                 (BOOL, I16, U16, U32, U64, C64, F6_*, F8_*FNUZ): listed and
                                 validated, refused only when read */
  int ndim;
  int64_t shape[QC_MAXDIM];   /* in qatcheck's convention: for F4 (two elements a byte,
                                 element 2i in the low nibble) the last dimension counts
                                 bytes, as a float4_e2m1fn_x2 tensor's does */
  int64_t st_last;            /* the header's last dimension (elements), for messages */
  int part;                   /* which file */
  uint64_t offset;            /* absolute offset of its first byte in that file */
  uint64_t nbytes;
} qc_st_tensor;

typedef struct qc_st qc_st;

/* Open a checkpoint: a .safetensors file, an index JSON
 * (model.safetensors.index.json: {"weight_map": {tensor: shard file}}), or a
 * folder holding either (an index when there is one, else every
 * *.safetensors file in it). Every header is read and validated; no tensor
 * data is read. */
int qc_st_open(const char *path, qc_st **out);

/* Parse a whole file image already in memory (the fuzz harness's entry):
 * the same validation as qc_st_open; reads then copy out of `data`, which
 * must outlive the handle. `where` names it in messages. */
int qc_st_parse(const void *data, size_t len, const char *where, qc_st **out);

void qc_st_close(qc_st *st);
const char *qc_st_path(const qc_st *st);

/* The tensors, sorted by name (qc_st_find uses binary search). */
int qc_st_count(const qc_st *st);
const qc_st_tensor *qc_st_at(const qc_st *st, int i);
const qc_st_tensor *qc_st_find(const qc_st *st, const char *name);

/* Read tensor t (slice `index` of its first dimension when index >= 0)
 * into buf, bytes as stored; nbytes must be exactly that size. Safe from
 * any number of threads at once. A shard that shrank since it was opened
 * is QC_EINPUT naming it. */
int qc_st_read(const qc_st *st, const qc_st_tensor *t, long long index, void *buf, size_t nbytes);

/* Read bytes [offset, offset + nbytes) of file `part` into buf (a
 * located tensor's bytes; `name` names it in messages). Any thread. */
int qc_st_pread(const qc_st *st, int part, uint64_t offset, void *buf, size_t nbytes, const char *name);

/* Read tensor `name` whole into a new tensor (named `as`, or its own name
 * when as is NULL). Absent, or a dtype qatcheck holds no tensor of:
 * QC_EINPUT naming it. */
int qc_st_load(const qc_st *st, const char *name, const char *as, qc_tensor *out);

/* The config.json of checkpoint ckpt (a folder: inside it; a file: beside
 * it) written into buf, returned when readable, else NULL. */
const char *qc_st_config_of(const char *ckpt, char *buf, size_t n);

#endif
