/* dump_priv.h: inside io/'s HDF5 dump reader and writer (dump.c, dump_read.c,
 * dump_write.c): the open file and the helpers they share. */
#ifndef QC_DUMP_PRIV_H
#define QC_DUMP_PRIV_H

#include <hdf5.h>
#include <stddef.h>

#include "io/dump.h"

struct qc_dump {
  hid_t file;
  char path[1024];
  int writable;
  int fd;          /* the same file for qc_dump_pread; -1 when direct reads are off (userblock, no descriptor) */
};

/* Turn off HDF5's automatic error printing (once). */
void qc_dump_silence(void);

/* Read a string attribute (fixed or variable length) into buf. */
int qc_dump_str_attr(hid_t obj, const char *name, char *buf, size_t n);

#endif
