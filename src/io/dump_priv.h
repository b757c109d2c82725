/* dump_priv.h: inside io/'s HDF5 dump reader and writer.
 *
 * Reading is sandboxed (docs/robustness.md): libhdf5 parses a user's file
 * only in a child process (dump_walk.c), forked when the dump is opened.
 * The child walks every link, reads the attributes and dataset headers,
 * and sends what it found (the map, below) over a socket; it then stays to
 * serve the reads that cannot be done with pread (chunked, compressed,
 * converted). The parent (dump_box.c) enforces a deadline on it and turns
 * a crash or a hang into one error line. The parent answers every question
 * about the file's structure from the map, and reads contiguous data with
 * pread after checking it lies inside the file: it never calls libhdf5 on
 * a file it reads. Writing (dump_write.c) is in-process: it parses nothing.
 */
#ifndef QC_DUMP_PRIV_H
#define QC_DUMP_PRIV_H

#include <hdf5.h>
#include <stddef.h>
#include <stdint.h>

#include "io/dump.h"

/* ---- the map of a file, as the sandbox read it -------------------------- */

enum { QC_H5A_STR = 1, QC_H5A_INT, QC_H5A_OTHER, QC_H5A_BAD, QC_H5A_FLOAT, QC_H5A_STRS };
enum { QC_H5O_GROUP = 1, QC_H5O_DATASET, QC_H5O_OTHER, QC_H5O_SOFT, QC_H5O_EXTERNAL };
/* type classes, as the parent needs them (libhdf5's own enum stays in the child) */
enum { QC_H5T_INT = 1, QC_H5T_FLOAT, QC_H5T_STRING, QC_H5T_OTHER };
/* storage layouts */
enum { QC_H5L_CONTIGUOUS = 1, QC_H5L_CHUNKED, QC_H5L_COMPACT, QC_H5L_VIRTUAL, QC_H5L_OTHER };
/* the chunk index of a chunked dataset, checked by the child */
enum { QC_CHUNKS_OK = 1, QC_CHUNKS_MISSING, QC_CHUNKS_PAST_EOF, QC_CHUNKS_TOO_MANY, QC_CHUNKS_UNREADABLE };
/* memory types of a read request */
enum { QC_MT_F64 = 1, QC_MT_F32, QC_MT_I32, QC_MT_I64, QC_MT_U8, QC_MT_U16, QC_MT_RAW };

#define QC_H5_MAXFILTER 8

/* One attribute: a single string, integer or float is read (kind STR /
 * INT / FLOAT); an array of variable-length strings, or an empty array of
 * any type, is read as a list (STRS: a step dump's `frozen`); anything
 * else is only named (OTHER), and one libhdf5 could not read is BAD. */
typedef struct qc_h5attr {
  char *name;
  int kind;
  char *str;          /* kind STR, NUL-terminated */
  long long ival;     /* kind INT */
  double dval;        /* kind FLOAT */
  int nstr;           /* kind STRS: strs[nstr], each NUL-terminated */
  char **strs;
} qc_h5attr;

/* A dataset's header: type, shape and storage. */
typedef struct qc_h5dset {
  int tclass;                 /* QC_H5T_* */
  uint64_t tsize;             /* bytes per element in the file */
  int tsigned;                /* integers: two's complement */
  int tle;                    /* little-endian */
  uint64_t f_spos, f_epos, f_esize, f_mpos, f_msize, f_ebias; /* floats: the bit fields */
  int native;                 /* the file type equals this machine's memory type of its kind */
  int ndim;                   /* -1: not a simple or scalar dataspace */
  uint64_t dims[QC_MAXDIM];
  int layout;                 /* QC_H5L_* */
  int nfilters;
  int filter[QC_H5_MAXFILTER];
  int filters_avail;          /* every filter can be decoded here */
  int external;               /* external files (data kept outside the dump) */
  int64_t addr;               /* contiguous: file address of the data, -1 when not allocated */
  uint64_t storage;           /* bytes allocated in the file */
  int chunks;                 /* chunked: QC_CHUNKS_* */
} qc_h5dset;

/* One object reached by a link (hard, soft or external). */
typedef struct qc_h5obj {
  char *path;                 /* "/a/b/c"; "/" for the root group */
  int type;                   /* QC_H5O_* */
  int nattr;
  qc_h5attr *attr;
  qc_h5dset ds;               /* type QC_H5O_DATASET */
} qc_h5obj;

typedef struct qc_h5map {
  int n, cap;
  qc_h5obj *o;                /* in walk order: each group's links in name order, depth first */
  int *sorted;                /* indices of o by strcmp of path (lookups, listings) */
  uint64_t userblock;         /* bytes before the HDF5 data: file addresses are offset by it */
} qc_h5map;

void qc_h5map_free(qc_h5map *m);
/* The object at `path` ("/" or "/a/b"; a trailing '/' ignored), or NULL. */
const qc_h5obj *qc_h5map_find(const qc_h5map *m, const char *path);
/* An attribute of o, or NULL. */
const qc_h5attr *qc_h5obj_attr(const qc_h5obj *o, const char *name);
/* The objects directly under group `path`, in name order: calls fn for each
 * until it returns non-zero (that value is returned). */
int qc_h5map_children(const qc_h5map *m, const char *path, int (*fn)(void *ctx, const qc_h5obj *o), void *ctx);

/* ---- the sandbox --------------------------------------------------------- */

typedef struct qc_box qc_box;

/* Fork the child on the open file `fd` (`size` bytes; `path` names it in
 * messages), wait for its map. Every failure is one qc_err line naming the
 * dump; a child that crashes or stalls is killed and reported as
 * "corrupt or unreadable HDF5 (libhdf5 crashed|hung ... <what it was
 * reading>)". Call from a thread while no other thread is inside a BLAS
 * call (fork runs the libraries' fork handlers). */
int qc_box_start(const char *path, int fd, int64_t size, qc_box **box, qc_h5map *map);
/* Read dataset `dset` (slice `index` of its first dimension when >= 0)
 * through the child, converted to memory type `mt` (QC_MT_*), into buf of
 * exactly nbytes. Serialized by the box's own lock. */
int qc_box_read(qc_box *b, const char *dset, long long index, int mt, void *buf, size_t nbytes);
/* Stop the child (it is killed and reaped) and free the box. */
void qc_box_stop(qc_box *b);

/* The child's side (dump_walk.c): opens the file (as /proc/self/fd/<fd>,
 * the very file the parent checked; `path` without /proc), sends its map
 * on socket `sock`, then serves reads until the parent hangs up. Before
 * each libhdf5 step it bumps sh->ticks and writes what it reads into
 * sh->where (a shared page). Never returns. */
#define QC_BOX_WHERE 480
typedef struct qc_box_shared {
  volatile uint64_t ticks;
  char where[QC_BOX_WHERE];
} qc_box_shared;
void qc_box_child(int sock, const char *path, int fd, int64_t size, qc_box_shared *sh) __attribute__((noreturn));
/* FAIL codes */
enum { QC_BOX_NOT_HDF5 = 1, QC_BOX_OPEN, QC_BOX_WALK, QC_BOX_READ };

/* Wire format, child to parent: records of one tag byte, then fields;
 * u8/u32/u64 little-endian, strings as u32 length + bytes. */
enum {
  QC_REC_OBJ = 'O',     /* path, type; for a dataset its header fields */
  QC_REC_ATTR = 'A',    /* name, kind, value: an attribute of the last object */
  QC_REC_USERBLOCK = 'U',
  QC_REC_END = 'Z',     /* the map is complete */
  QC_REC_FAIL = 'F',    /* a message (libhdf5 refused, without crashing) */
  QC_REC_PIECE = 'P',   /* u64 length + bytes of a read */
  QC_REC_DONE = 'K'     /* the read is complete */
};

/* ---- the dump handle ------------------------------------------------------ */

struct qc_dump {
  char path[1024];
  int writable;
  hid_t file;         /* writer: the HDF5 file (-1 for a reader) */
  int fd;             /* reader: the file, for pread and the child; -1 for a writer */
  int64_t size;       /* reader: its size when opened */
  int direct;         /* reader: file addresses are file offsets (no userblock) */
  qc_h5map map;       /* reader */
  qc_box *box;        /* reader */
};

/* Open a file for reading through the sandbox (qc_dump_open without the
 * root attribute's check: the step dump has its own). */
int qc_dump_open_map(const char *path, qc_dump **out);

/* Turn off HDF5's automatic error printing (once; writer and child;
 * dump_walk.c). */
void qc_dump_silence(void);

#endif
