/* dump_read.c: datasets of a dump (see dump.h), from the sandbox's map of
 * the file (dump_priv.h): element types, shapes, and their storage checked
 * against the file before any byte is read; then whole and sliced reads,
 * by pread where the bytes as stored are the bytes wanted, through the
 * sandbox's child otherwise; existence, listing, attributes. */
#include "io/dump.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <pthread.h>

#include "core/file.h"
#include "core/par.h"
#include "core/qc.h"
#include "io/dump_priv.h"

/* HDF5 filters whose output size is bounded here: deflate (gzip), shuffle,
 * fletcher32. Others (szip, nbit, scale-offset, plugins such as lzf or
 * blosc) are refused by name. */
enum { F_DEFLATE = 1, F_SHUFFLE = 2, F_FLETCHER32 = 3 };
/* deflate's best ratio is about 1032:1; anything beyond cannot be data */
#define DEFLATE_MAX_RATIO 1100

/* A dataset checked for reading. */
typedef struct dplan {
  const qc_h5obj *o;
  qc_dtype dt;
  int mt;              /* QC_MT_*: the memory type of a read through the child */
  int ndim;
  int64_t shape[QC_MAXDIM];
  uint64_t bytes;      /* the whole dataset, as read */
  int64_t offset;      /* file offset of its bytes for pread, -1: read through the child */
} dplan;

static const char *filter_name(int id) {
  switch (id) {
    case 1: return "deflate";
    case 2: return "shuffle";
    case 3: return "fletcher32";
    case 4: return "szip";
    case 5: return "nbit";
    case 6: return "scaleoffset";
    case 32000: return "lzf";
    case 32001: return "blosc";
    case 32004: return "lz4";
    case 32008: return "bitshuffle";
    case 32015: return "zstd";
    default: return "a plugin filter";
  }
}

/* Map a dataset's type and its `dtype` attribute to a qc_dtype and the
 * memory type to read it with. */
static int plan_dtype(qc_dump *d, const char *name, const qc_h5dset *h, const qc_h5obj *o, qc_dtype *dt, int *mt) {
  qc_dtype native;
  if (h->tclass == QC_H5T_FLOAT && h->tsize == 8) { native = QC_F64; *mt = QC_MT_F64; }
  else if (h->tclass == QC_H5T_FLOAT && h->tsize == 4) { native = QC_F32; *mt = QC_MT_F32; }
  else if (h->tclass == QC_H5T_FLOAT && h->tsize == 2) {
    /* read raw (HDF5 1.10 has no half-precision memory type): only the
     * little-endian IEEE binary16 layout may be taken bit for bit */
    if (!(h->tle && h->f_spos == 15 && h->f_epos == 10 && h->f_esize == 5 && h->f_mpos == 0 && h->f_msize == 10 &&
          h->f_ebias == 15)) {
      qc_err("dump '%s': dataset '%s': a 16-bit float that is not little-endian IEEE binary16", d->path, name);
      qc_hint("store float16 as numpy '<f2', or bfloat16 as uint16 with dtype='bfloat16'");
      return QC_EINPUT;
    }
    native = QC_F16;
    *mt = QC_MT_RAW;
  }
  else if (h->tclass == QC_H5T_INT && h->tsize == 4 && h->tsigned) { native = QC_I32; *mt = QC_MT_I32; }
  else if (h->tclass == QC_H5T_INT && h->tsize == 8 && h->tsigned) { native = QC_I64; *mt = QC_MT_I64; }
  else if (h->tclass == QC_H5T_INT && h->tsize == 1 && !h->tsigned) { native = QC_U8; *mt = QC_MT_U8; }
  else if (h->tclass == QC_H5T_INT && h->tsize == 2 && !h->tsigned) { native = QC_BF16; *mt = QC_MT_U16; }
  else {
    static const char *cls[] = {"?", "integer", "float", "string", "other"};
    qc_err("dump '%s': dataset '%s': element type (%s%s, %llu bytes) is not supported", d->path, name,
           h->tclass == QC_H5T_INT && h->tsigned ? "signed " : h->tclass == QC_H5T_INT ? "unsigned " : "",
           cls[h->tclass >= 0 && h->tclass <= 4 ? h->tclass : 0], (unsigned long long)h->tsize);
    qc_hint("use float64/32/16, int32/64, uint8, or bfloat16 as uint16 with attribute dtype='bfloat16'");
    return QC_EINPUT;
  }
  const qc_h5attr *a = qc_h5obj_attr(o, "dtype");
  if (!a) {
    if (native == QC_BF16) {
      qc_err("dump '%s': dataset '%s' is uint16 without a 'dtype' attribute: expected dtype='bfloat16'", d->path, name);
      return QC_EINPUT;
    }
    *dt = native;
    return QC_OK;
  }
  qc_dtype want;
  if (a->kind != QC_H5A_STR || qc_dtype_from_name(a->str, &want) != QC_OK) {
    qc_err("dump '%s': dataset '%s': attribute dtype='%.40s' is not a known element type", d->path, name,
           a->kind == QC_H5A_STR ? a->str : "(not a single string)");
    qc_hint("expected one of float64, float32, float16, bfloat16, int32, int64, uint8, float8_e4m3fn, float8_e5m2, "
            "float8_e8m0fnu, float4_e2m1fn_x2");
    return QC_EINPUT;
  }
  int storage_ok;
  switch (want) {
    case QC_BF16: storage_ok = native == QC_BF16; break;
    case QC_E4M3: case QC_E5M2: case QC_E8M0: case QC_E2M1X2: storage_ok = native == QC_U8; break;
    default: storage_ok = native == want; break;
  }
  if (!storage_ok) {
    qc_err("dump '%s': dataset '%s': attribute dtype='%s' does not match its storage (%s)", d->path, name, a->str,
           native == QC_BF16 ? "uint16" : qc_dtype_name(native));
    qc_hint("bfloat16 is stored as uint16, float8/float4/e8m0 as uint8");
    return QC_EINPUT;
  }
  *dt = want;
  return QC_OK;
}

/* The dataset's storage against its claimed size and the file's size:
 * every byte a read would touch is inside the file, allocated, and in a
 * format with a bounded expansion. *offset >= 0 when pread may take the
 * bytes as stored (raw: they are the bytes wanted, in this machine's
 * layout). */
static int plan_storage(qc_dump *d, const char *name, const qc_h5dset *h, uint64_t bytes, int raw, int64_t *offset) {
  uint64_t fsize = (uint64_t)d->size, end;
  *offset = -1;
  char claim[64];
  snprintf(claim, sizeof claim, "%llu bytes", (unsigned long long)bytes);
  if (bytes == 0) return QC_OK;
  switch (h->layout) {
    case QC_H5L_CONTIGUOUS:
      if (h->addr < 0 || h->storage == 0) {
        qc_err("dump '%s': dataset '%s': its shape needs %s but none are stored (created without data?)", d->path, name, claim);
        qc_hint("write the tensor's values (h5py: create_dataset(name, data=array))");
        return QC_EINPUT;
      }
      if (h->storage != bytes)
        return qc_err("dump '%s': dataset '%s': its shape and type need %s but it stores %llu (corrupt header?)", d->path,
                      name, claim, (unsigned long long)h->storage);
      /* H5Dget_offset is counted from the file's start, userblock included */
      if (__builtin_add_overflow((uint64_t)h->addr, bytes, &end) || end > fsize)
        return qc_err("dump '%s': dataset '%s': its %s lie past the end of the file (%llu bytes; truncated?)", d->path,
                      name, claim, (unsigned long long)fsize);
      if (d->direct && raw) *offset = h->addr;
      return QC_OK;
    case QC_H5L_COMPACT:
      if (h->storage != bytes)
        return qc_err("dump '%s': dataset '%s': its shape and type need %s but it stores %llu (corrupt header?)", d->path,
                      name, claim, (unsigned long long)h->storage);
      return QC_OK;
    case QC_H5L_CHUNKED: {
      int deflate = 0;
      if (h->nfilters > QC_H5_MAXFILTER)
        return qc_err("dump '%s': dataset '%s': its filter pipeline cannot be read (corrupt header?)", d->path, name);
      for (int i = 0; i < h->nfilters; i++) {
        int f = h->filter[i];
        if ((f != F_DEFLATE && f != F_SHUFFLE && f != F_FLETCHER32) || !h->filters_avail) {
          qc_err("dump '%s': dataset '%s' is stored with HDF5 filter %d (%s): qatcheck reads deflate (gzip), shuffle and "
                 "fletcher32 only", d->path, name, f, filter_name(f));
          qc_hint("write it uncompressed or with compression='gzip' (h5py)");
          return QC_EINPUT;
        }
        deflate |= f == F_DEFLATE;
      }
      switch (h->chunks) {
        case QC_CHUNKS_OK: break;
        case QC_CHUNKS_MISSING:
          qc_err("dump '%s': dataset '%s': not every chunk of its %s is stored (written in part?)", d->path, name, claim);
          qc_hint("write the whole tensor (h5py: create_dataset(name, data=array))");
          return QC_EINPUT;
        case QC_CHUNKS_PAST_EOF:
          return qc_err("dump '%s': dataset '%s': a chunk lies past the end of the file (%llu bytes; truncated?)", d->path,
                        name, (unsigned long long)fsize);
        case QC_CHUNKS_TOO_MANY:
          return qc_err("dump '%s': dataset '%s': more than 4194304 chunks: write it with larger chunks, or contiguous",
                        d->path, name);
        default:
          return qc_err("dump '%s': dataset '%s': its chunk index cannot be read (corrupt file?)", d->path, name);
      }
      uint64_t cap = h->storage;
      if (deflate && __builtin_mul_overflow(h->storage, (uint64_t)DEFLATE_MAX_RATIO, &cap)) cap = UINT64_MAX;
      if (h->storage > fsize || bytes > cap)
        return qc_err("dump '%s': dataset '%s': its shape and type need %s but it stores %llu%s (corrupt header?)", d->path,
                      name, claim, (unsigned long long)h->storage, deflate ? " compressed" : "");
      return QC_OK;
    }
    default:
      return qc_err("dump '%s': dataset '%s': unknown storage layout (corrupt header?)", d->path, name);
  }
}

/* Everything about dataset `name` that a read needs, checked. */
static int dset_plan(qc_dump *d, const char *name, dplan *p) {
  memset(p, 0, sizeof *p);
  p->offset = -1;
  const qc_h5obj *o = d->writable ? NULL : qc_h5map_find(&d->map, name);
  if (!o) return qc_err("dump '%s': dataset '%s' is missing", d->path, name);
  if (o->type != QC_H5O_DATASET) return qc_err("dump '%s': '%s' is not a readable dataset", d->path, name);
  const qc_h5dset *h = &o->ds;
  p->o = o;
  /* data kept in other files is not followed (as external links are not) */
  if (h->layout == QC_H5L_VIRTUAL || h->external) {
    qc_err("dump '%s': dataset '%s' is a virtual dataset or has external storage (data that may live in other files): not followed",
           d->path, name);
    qc_hint("write the tensor into the dump itself (h5py create_dataset with data=...)");
    return QC_EINPUT;
  }
  if (h->ndim < 0 || h->ndim > QC_MAXDIM)
    return qc_err("dump '%s': dataset '%s': rank %d is not supported: expected at most %d", d->path, name, h->ndim, QC_MAXDIM);
  int rc = plan_dtype(d, name, h, o, &p->dt, &p->mt);
  if (rc) return rc;
  uint64_t n = 1;
  for (int i = 0; i < h->ndim; i++) {
    if (h->dims[i] > ((uint64_t)1 << 40) || __builtin_mul_overflow(n, h->dims[i], &n) || n > ((uint64_t)1 << 40)) {
      qc_err("dump '%s': dataset '%s': more than 2^40 elements: not a tensor qatcheck reads (corrupt header?)", d->path, name);
      return QC_EINPUT;
    }
    p->shape[i] = (int64_t)h->dims[i];
  }
  p->ndim = h->ndim;
  p->bytes = n * qc_dtype_size(p->dt);
  return plan_storage(d, name, h, p->bytes, h->native || p->dt == QC_F16, &p->offset);
}

static const char *base_name(const char *p) {
  const char *s = strrchr(p, '/');
  return s ? s + 1 : p;
}

int qc_dump_info(qc_dump *d, const char *dset, qc_tensor *t) {
  dplan p;
  memset(t, 0, sizeof *t);
  int rc = dset_plan(d, dset, &p);
  if (rc) return rc;
  snprintf(t->name, sizeof t->name, "%s", base_name(dset));
  t->dtype = p.dt;
  t->ndim = p.ndim;
  memcpy(t->shape, p.shape, sizeof t->shape);
  return QC_OK;
}

/* The extent read for (dset, index): shape; checks the slice index. */
static int read_extent(qc_dump *d, const char *dset, long long index, const dplan *p, int *ond, int64_t *shape) {
  if (index >= 0) {
    if (p->ndim < 1 || index >= p->shape[0])
      return qc_err("dump '%s': dataset '%s': slice %lld is out of range", d->path, dset, index);
    *ond = p->ndim - 1;
    for (int i = 1; i < p->ndim; i++) shape[i - 1] = p->shape[i];
  } else {
    *ond = p->ndim;
    for (int i = 0; i < p->ndim; i++) shape[i] = p->shape[i];
  }
  return QC_OK;
}

/* Read (dset, index) as planned into buf of exactly `want` bytes. */
static int read_bytes(qc_dump *d, const char *dset, long long index, const dplan *p, void *buf, size_t want) {
  if (want == 0) return QC_OK;
  if (p->offset >= 0) {
    qc_dump_loc loc = {p->dt, want, p->offset + (index >= 0 ? index * (long long)want : 0)};
    return qc_dump_pread(d, dset, &loc, buf);
  }
  return qc_box_read(d->box, dset, index, p->mt, buf, want);
}

/* Read dataset `dset` (whole, or slice `index` of dim 0 when index >= 0)
 * into a new tensor (buf NULL), or into buf of cap bytes (the element count
 * and size must fill it exactly). */
static int read_impl(qc_dump *d, const char *dset, long long index, qc_tensor *out, void *buf, size_t cap) {
  dplan p;
  int ond;
  int64_t shape[QC_MAXDIM];
  if (out) memset(out, 0, sizeof *out);
  int rc = dset_plan(d, dset, &p);
  if (!rc) rc = read_extent(d, dset, index, &p, &ond, shape);
  if (rc) return rc;
  size_t want = (size_t)qc_shape_numel(ond, shape) * qc_dtype_size(p.dt);
  if (buf) {
    if (want != cap) return qc_err("dump '%s': dataset '%s' holds %zu bytes: expected %zu", d->path, dset, want, cap);
    return read_bytes(d, dset, index, &p, buf, want);
  }
  if ((rc = qc_tensor_alloc(out, base_name(dset), p.dt, ond, shape))) {
    if (rc == QC_EINPUT) qc_hint("dataset '%s' of dump '%s'", dset, d->path);
    return rc;
  }
  if ((rc = read_bytes(d, dset, index, &p, out->data, out->nbytes))) qc_tensor_free(out);
  return rc;
}

int qc_dump_read(qc_dump *d, const char *dset, qc_tensor *out) { return read_impl(d, dset, -1, out, NULL, 0); }

int qc_dump_read_slice(qc_dump *d, const char *dset, long long index, qc_tensor *out) {
  if (index < 0) return qc_err("dump '%s': dataset '%s': negative slice index", d->path, dset);
  return read_impl(d, dset, index, out, NULL, 0);
}

int qc_dump_read_into(qc_dump *d, const char *dset, long long index, void *buf, size_t nbytes) {
  if (!buf && nbytes) return qc_err("dump '%s': dataset '%s': no buffer", d->path, dset);
  return read_impl(d, dset, index, NULL, buf ? buf : (void *)"", nbytes);
}

int qc_dump_locate(qc_dump *d, const char *dset, long long index, qc_dump_loc *loc) {
  dplan p;
  int ond;
  int64_t shape[QC_MAXDIM];
  memset(loc, 0, sizeof *loc);
  loc->offset = -1;
  int rc = dset_plan(d, dset, &p);
  if (!rc) rc = read_extent(d, dset, index, &p, &ond, shape);
  if (rc) return rc;
  loc->dtype = p.dt;
  loc->nbytes = (size_t)qc_shape_numel(ond, shape) * qc_dtype_size(p.dt);
  if (p.offset >= 0 && loc->nbytes) loc->offset = p.offset + (index >= 0 ? index * (long long)loc->nbytes : 0);
  return QC_OK;
}

/* A read split over threads: each piece's bytes and how its pread loop
 * ended (0 read, an errno value, or -1: the file ended early). */
#define PREAD_PIECE ((size_t)16 << 20)
#define PREAD_PIECES 8
typedef struct pread_job {
  int fd;
  char *buf;
  long long offset;
  size_t n, per;
  int status[PREAD_PIECES];
} pread_job;

/* One piece k of job j (its own thread's start routine takes a slot). */
typedef struct pread_slot {
  pread_job *j;
  int k;
} pread_slot;

static void pread_one(pread_job *j, int k) {
  const size_t a = (size_t)k * j->per, b = a + j->per < j->n ? a + j->per : j->n;
  j->status[k] = a < b ? qc_pread_full(j->fd, j->buf + a, b - a, j->offset + (long long)a) : 0;
}

static void *pread_thread(void *arg) {
  pread_slot *s = arg;
  pread_one(s->j, s->k);
  return NULL;
}

/* A large read is split into up to PREAD_PIECES pieces of at least
 * PREAD_PIECE bytes (no more than qc_par_threads), each on a thread of
 * its own (not qc_par_for's pool:
 * the read-ahead would hold it for the read's whole length, and every
 * host pass of the audit in the meantime would start threads afresh):
 * one thread copying from the page cache (and faulting in the fresh
 * buffer) reads a few GB/s, and an MoE layer's experts (a GB at GPU size)
 * were read behind the audit of the module before them. The bytes are the
 * same either way; the first failing piece in file order names the error;
 * a piece no thread could take is read by the caller. */
int qc_dump_pread(const qc_dump *d, const char *dset, const qc_dump_loc *loc, void *buf) {
  if (loc->offset < 0 || d->fd < 0) return qc_err("dump '%s': dataset '%s': no direct read", d->path, dset);
  pread_job j = {.fd = d->fd, .buf = buf, .offset = loc->offset, .n = loc->nbytes};
  int64_t pieces = (int64_t)(loc->nbytes / PREAD_PIECE);
  const int64_t most = qc_par_threads() < PREAD_PIECES ? qc_par_threads() : PREAD_PIECES; /* QATCHECK_THREADS */
  pieces = pieces < 1 ? 1 : pieces > most ? most : pieces;
  j.per = (loc->nbytes + (size_t)pieces - 1) / (size_t)pieces;
  pthread_t th[PREAD_PIECES];
  pread_slot sl[PREAD_PIECES];
  int started[PREAD_PIECES] = {0};
  for (int k = 1; k < pieces; k++) {
    sl[k] = (pread_slot){&j, k};
    started[k] = pthread_create(&th[k], NULL, pread_thread, &sl[k]) == 0;
  }
  pread_one(&j, 0);
  for (int k = 1; k < pieces; k++) {
    if (started[k]) pthread_join(th[k], NULL);
    else pread_one(&j, k);
  }
  for (int64_t k = 0; k < pieces; k++) {
    if (j.status[k] > 0)
      return qc_err_sys("dump '%s': dataset '%s': read failed: %s", d->path, dset, strerror(j.status[k]));
    if (j.status[k] < 0) return qc_err("dump '%s': dataset '%s': the file ends early (truncated?)", d->path, dset);
  }
  return QC_OK;
}

const char *qc_dump_attr_text(qc_dump *d, const char *obj, const char *name) {
  const qc_h5obj *o = d->writable ? NULL : qc_h5map_find(&d->map, obj);
  const qc_h5attr *a = qc_h5obj_attr(o, name);
  return a && a->kind == QC_H5A_STR ? a->str : NULL;
}

int qc_dump_get_attr(qc_dump *d, const char *obj, const char *name, char *buf, size_t n) {
  const char *s = qc_dump_attr_text(d, obj, name);
  if (!s) return QC_EINPUT;
  size_t l = strlen(s);
  if (l >= n) /* never cut: a cut value reads as another (a prefix, or JSON that no longer parses) */
    return qc_err("dump '%s': '%s': attribute '%s' is %zu bytes, longer than the %zu this field takes", d->path, obj, name, l,
                  n ? n - 1 : 0);
  memcpy(buf, s, l + 1);
  return QC_OK;
}

int qc_dump_get_int_attr(qc_dump *d, const char *obj, const char *name, long long *v) {
  const qc_h5obj *o = d->writable ? NULL : qc_h5map_find(&d->map, obj);
  const qc_h5attr *a = qc_h5obj_attr(o, name);
  char *end;
  if (!a) return QC_EINPUT;
  if (a->kind == QC_H5A_INT) {
    *v = a->ival;
    return QC_OK;
  }
  if (a->kind == QC_H5A_STR && a->str[0]) {
    long long x = strtoll(a->str, &end, 10);
    if (!*end) {
      *v = x;
      return QC_OK;
    }
  }
  return qc_err("dump '%s': '%s': attribute '%s' is not an integer", d->path, obj, name);
}

int qc_dump_exists(qc_dump *d, const char *path) {
  return path[0] && !d->writable && qc_h5map_find(&d->map, path) != NULL;
}

typedef struct name_list {
  int n, cap, rc;
  char (*name)[QC_NAMELEN];
} name_list;

static int list_item(void *op, const qc_h5obj *o) {
  name_list *l = op;
  if (o->type != QC_H5O_DATASET) return 0;
  const char *name = base_name(o->path);
  if (strlen(name) >= QC_NAMELEN) { l->rc = qc_err("dataset name '%.40s...' is longer than %d characters", name, QC_NAMELEN - 1); return 1; }
  if (l->n == l->cap) {
    int nc = l->cap ? 2 * l->cap : 8;
    void *p = realloc(l->name, (size_t)nc * sizeof *l->name);
    if (!p) { l->rc = qc_err_sys("out of memory listing datasets"); return 1; }
    l->name = p;
    l->cap = nc;
  }
  snprintf(l->name[l->n++], QC_NAMELEN, "%s", name);
  return 0;
}

int qc_dump_list(qc_dump *d, const char *group, char (**names)[QC_NAMELEN], int *n) {
  name_list l = {0};
  *names = NULL;
  *n = 0;
  const qc_h5obj *g = d->writable ? NULL : qc_h5map_find(&d->map, group);
  if (!g) return QC_OK;
  if (g->type != QC_H5O_GROUP) return qc_err("dump '%s': '%s' is not a group", d->path, group);
  qc_h5map_children(&d->map, group, list_item, &l);
  if (l.rc) {
    free(l.name);
    return l.rc;
  }
  *names = l.name;
  *n = l.n;
  return QC_OK;
}
