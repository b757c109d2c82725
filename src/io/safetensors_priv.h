/* safetensors_priv.h: inside io/'s safetensors reader (safetensors.c: a
 * file's header and reads; safetensors_files.c: folders and indexes). */
#ifndef QC_SAFETENSORS_PRIV_H
#define QC_SAFETENSORS_PRIV_H

#include <stddef.h>
#include <stdint.h>

#include "io/safetensors.h"

typedef struct st_part {
  char path[1024];
  int fd;                     /* -1 for an in-memory image */
  uint64_t size;
  const unsigned char *mem;   /* the image (qc_st_parse), else NULL */
} st_part;

struct qc_st {
  char path[1024];
  int use_mmap;               /* QATCHECK_ST_READ=mmap */
  st_part *part;
  int npart;
  qc_st_tensor *t;
  int n, cap;
};

/* A new, empty checkpoint named path (QATCHECK_ST_READ read here). */
qc_st *qc_st_new(const char *path);
/* Open file `path` as a new part and parse and validate its header. */
int qc_st_open_part(qc_st *st, const char *path);
/* Sort the tensors by name; a name in two parts is refused. */
int qc_st_finish(qc_st *st);
/* pread all of [off, off + n) of fd or fail naming path. */
int qc_st_read_full(int fd, const char *path, uint64_t off, void *buf, size_t n);
/* Open a regular file read-only (a FIFO or device refused before it is
 * opened); its size into *size. `what` names it in messages. */
int qc_st_open_regular(const char *path, const char *what, int *fd, uint64_t *size);

#endif
