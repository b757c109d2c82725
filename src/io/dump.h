/* dump.h: the HDF5 dump file of docs/interfaces.md section 2, read and
 * written. Reading is sandboxed (docs/robustness.md): libhdf5 parses the
 * file in a child process with a deadline, and every dataset's type,
 * shape and storage is checked against the file before its data is read,
 * so a corrupt or hostile file is one error line (exit 2), never a crash
 * or a hang. Every failure is one qc_err line naming the file and the
 * dataset or attribute. */
#ifndef QC_DUMP_H
#define QC_DUMP_H

#include <stddef.h>

#include "model/module.h"
#include "core/tensor.h"

typedef struct qc_dump qc_dump;

/* Open an existing dump read-only: a regular file (a FIFO or device is
 * refused unopened), mapped by the sandbox's child, with the root
 * attribute qatcheck_dump == 1. It forks: call it while no other thread
 * is inside a BLAS call (the main thread before the work starts). */
int qc_dump_open(const char *path, qc_dump **out);
/* Create (truncate) a dump for writing; sets qatcheck_dump = 1. */
int qc_dump_create(const char *path, qc_dump **out);
void qc_dump_close(qc_dump *d);
const char *qc_dump_path(const qc_dump *d);

/* One module group found in a dump. */
typedef struct qc_dump_entry {
  char path[QC_PATHLEN];  /* "/model.layers.3.mlp.down_proj" */
  char cls[64];           /* its `class` attribute */
} qc_dump_entry;

/* Every group with a `class` attribute, at any depth, in path order, whose
 * path matches the POSIX extended regex (NULL or "" = all). *out is
 * malloc'd; free() it. */
int qc_dump_modules(qc_dump *d, const char *regex, qc_dump_entry **out, int *n);
/* The groups whose path matches regex (NULL or "" = all) that look like a
 * module group, holding an inputs/ group and a grad_out/ or grads/ group,
 * but carry no `class` attribute, so qc_dump_modules passes them over:
 * outside /qatcheck_mode (a mode's evidence, docs/interfaces.md 2d) and
 * outside any module group (whose loading refuses what it does not
 * model). In walk order; cls is "". *out is malloc'd (NULL when none);
 * free() it. */
int qc_dump_unclassed(qc_dump *d, const char *regex, qc_dump_entry **out, int *n);

/* Load module group `path` whole: inputs/, params/, saved/, outputs/,
 * grad_out/ and, when with_grads, grads/<dY>/ into m->cand (parallel to
 * m->grad_out). The group's `contract` attribute (JSON text), if any, is
 * copied into contract_json ("" if none). m->cls is left NULL. */
int qc_dump_load_module(qc_dump *d, const char *path, int with_grads, qc_module *m, char *contract_json,
                        size_t contract_len);

/* Read one dataset (its `dtype` attribute selects bfloat16 / float8 /
 * float4 / e8m0 storage). */
int qc_dump_read(qc_dump *d, const char *dset, qc_tensor *out);
/* Read slice i of the first dimension of a dataset (shape[1:]): one expert
 * of an [E, N, K] weight, without reading the rest. */
int qc_dump_read_slice(qc_dump *d, const char *dset, long long index, qc_tensor *out);
/* Read dataset `dset` (slice `index` of its first dimension when index >= 0)
 * into buf, elements as stored (qc_dump_info's dtype, raw bits for bfloat16,
 * float16 and the 8-bit types); nbytes must be exactly its size. */
int qc_dump_read_into(qc_dump *d, const char *dset, long long index, void *buf, size_t nbytes);

/* Where the bytes of a dataset (or its slice `index`, index >= 0) lie. */
typedef struct qc_dump_loc {
  qc_dtype dtype;       /* as qc_dump_info */
  size_t nbytes;        /* element count x element size */
  long long offset;     /* file offset for qc_dump_pread, or -1: read it with qc_dump_read_into */
} qc_dump_loc;

/* Locate a dataset (slice). offset >= 0 only when the bytes in the file
 * are exactly the bytes qc_dump_read_into would give: contiguous,
 * unfiltered, fully allocated storage in this machine's layout, in a file
 * without a userblock. */
int qc_dump_locate(qc_dump *d, const char *dset, long long index, qc_dump_loc *loc);

/* Read a located dataset with pread on the dump's own descriptor. It makes
 * no HDF5 call, so any number of threads may read at once (while one thread
 * uses HDF5). A short file is QC_EINPUT naming dset. */
int qc_dump_pread(const qc_dump *d, const char *dset, const qc_dump_loc *loc, void *buf);

/* Shape and dtype of a dataset without reading it. */
int qc_dump_info(qc_dump *d, const char *dset, qc_tensor *shape_only);

/* 1 when `path` (a group or dataset, any depth) exists in the dump. */
int qc_dump_exists(qc_dump *d, const char *path);
/* Names of the datasets directly in `group` (none when the group is
 * absent), in name order. *names is malloc'd; free() it. */
int qc_dump_list(qc_dump *d, const char *group, char (**names)[QC_NAMELEN], int *n);

/* Write a tensor as dataset `dset` (intermediate groups created), with the
 * `dtype` attribute where the spec requires one. */
int qc_dump_write(qc_dump *d, const char *dset, const qc_tensor *t);
/* Set a string attribute on a group (created if needed). */
int qc_dump_set_attr(qc_dump *d, const char *group, const char *name, const char *value);
/* Read a string attribute of an object into buf (n bytes): QC_EINPUT
 * without a message if absent, with one naming the attribute when it does
 * not fit (a value is never cut). */
int qc_dump_get_attr(qc_dump *d, const char *obj, const char *name, char *buf, size_t n);
/* A string attribute of an object whole, as the dump holds it (the
 * sandbox's map; up to its limit of 1 MiB an attribute), NULL if absent or
 * not a single string. Valid while d is open. */
const char *qc_dump_attr_text(qc_dump *d, const char *obj, const char *name);
/* Read a scalar integer attribute (or a string holding a decimal integer)
 * of an object: QC_OK, QC_EINPUT without a message when absent, with one
 * naming the object when it is neither. */
int qc_dump_get_int_attr(qc_dump *d, const char *obj, const char *name, long long *v);

/* The dump sandbox's child as a fresh process: a program that can run it
 * (qatcheck: its main() hands argv to qc_dump_sandbox_main when argv[1] is
 * QC_DUMP_SANDBOX_ARG) calls qc_dump_sandbox_exec once at start; the child
 * is then exec'd, not a forked copy of a process with threads (whose
 * copied locks can leave it waiting forever). Otherwise it is forked. */
#define QC_DUMP_SANDBOX_ARG "--qc-dump-sandbox"
void qc_dump_sandbox_exec(void);
/* The child's main (argv[0] is QC_DUMP_SANDBOX_ARG). Never returns. */
int qc_dump_sandbox_main(int argc, char **argv) __attribute__((noreturn));

#endif
