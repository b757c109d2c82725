/* dump_walk.c: the sandbox's child (see dump_priv.h): the only code that
 * lets libhdf5 parse a file qatcheck reads. It opens the file, walks every
 * link, reads the attributes and the dataset headers, checks the chunk
 * index of chunked datasets against the file's size, sends all of it to
 * the parent, then serves read requests until the parent hangs up. Before
 * each libhdf5 step it writes what it is about to read into the shared
 * page, so that the parent can name it if the step crashes or hangs. */
#include <hdf5.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "core/qc.h"
#include "io/dump_priv.h"

#define MAX_OBJECTS 2000000
#define MAX_DEPTH 64           /* groups nested in groups: deeper is a cycle of hard links */
#define MAX_LINK_PATH 8192
#define MAX_ATTRS 4096        /* per object */
#define MAX_ATTR_BYTES (1u << 20)
#define MAX_ATTR_STRS 100000  /* strings in a list attribute */
#define MAX_CHUNKS (1u << 22)
#define PIECE_BYTES ((size_t)32 << 20)

typedef struct walker {
  int sock;
  hid_t file;
  int64_t size;
  uint64_t userblock;
  qc_box_shared *sh;
  long nobj;
  unsigned char out[1 << 16];
  size_t nout;
} walker;

/* ---- to the parent -------------------------------------------------------- */

static void send_all(walker *w, const void *p, size_t n) {
  const char *c = p;
  while (n) {
    ssize_t r = send(w->sock, c, n, MSG_NOSIGNAL);
    if (r < 0) _exit(0); /* the parent is gone */
    c += r;
    n -= (size_t)r;
  }
}

static void flush_out(walker *w) {
  send_all(w, w->out, w->nout);
  w->nout = 0;
}

static void put(walker *w, const void *p, size_t n) {
  if (w->nout + n > sizeof w->out) flush_out(w);
  if (n > sizeof w->out) { send_all(w, p, n); return; }
  memcpy(w->out + w->nout, p, n);
  w->nout += n;
}

static void put_u8(walker *w, unsigned v) { unsigned char b = (unsigned char)v; put(w, &b, 1); }
static void put_u64(walker *w, uint64_t v) {
  unsigned char b[8];
  for (int i = 0; i < 8; i++) b[i] = (unsigned char)(v >> (8 * i));
  put(w, b, 8);
}
static void put_str(walker *w, const char *s, size_t n) {
  unsigned char b[4];
  for (int i = 0; i < 4; i++) b[i] = (unsigned char)(n >> (8 * i));
  put(w, b, 4);
  put(w, s, n);
}

/* A failure libhdf5 reported without crashing: code (QC_BOX_*) + message. */
static void fail(walker *w, int code, const char *fmt, ...) {
  char msg[600];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(msg, sizeof msg, fmt, ap);
  va_end(ap);
  put_u8(w, QC_REC_FAIL);
  put_u8(w, (unsigned)code);
  put_str(w, msg, strlen(msg));
  flush_out(w);
}

/* What is read next, for the parent's message if it never returns. */
static void step(walker *w, const char *fmt, ...) {
  char buf[QC_BOX_WHERE];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(buf, sizeof buf, fmt, ap);
  va_end(ap);
  memcpy(w->sh->where, buf, sizeof buf);
  w->sh->ticks++;
}

/* ---- the walk ------------------------------------------------------------- */

typedef struct attr_ctx {
  walker *w;
  const char *path;
  const char *kind;  /* "group", "dataset" */
  int n;
} attr_ctx;

/* Read one attribute: a single string (fixed or variable length), integer
 * or float, or a list of variable-length strings (or an empty list);
 * anything else is only named. */
static herr_t attr_cb(hid_t loc, const char *name, const H5A_info_t *info, void *op) {
  (void)info;
  attr_ctx *c = op;
  walker *w = c->w;
  if (++c->n > MAX_ATTRS) {
    fail(w, QC_BOX_WALK, "%s '%s' has more than %d attributes: not a dump qatcheck reads", c->kind, c->path, MAX_ATTRS);
    _exit(0);
  }
  step(w, "reading %s '%s' attribute '%s'", c->kind, c->path, name);
  int kind = QC_H5A_BAD;
  char *s = NULL;
  long long iv = 0;
  double dv = 0;
  char **sv = NULL;
  int nsv = 0;
  hid_t a = H5Aopen(loc, name, H5P_DEFAULT);
  hid_t t = a >= 0 ? H5Aget_type(a) : -1;
  hid_t sp = a >= 0 ? H5Aget_space(a) : -1;
  if (t >= 0 && sp >= 0) {
    H5T_class_t cl = H5Tget_class(t);
    hssize_t np = H5Sget_simple_extent_npoints(sp);
    kind = QC_H5A_OTHER;
    if (np == 1 && cl == H5T_STRING) {
      kind = QC_H5A_BAD;
      if (H5Tis_variable_str(t) > 0) {
        hid_t mt = H5Tcopy(H5T_C_S1);
        char *v = NULL;
        if (mt >= 0 && H5Tset_size(mt, H5T_VARIABLE) >= 0 && H5Tset_cset(mt, H5Tget_cset(t)) >= 0 && H5Aread(a, mt, &v) >= 0 &&
            v) {
          size_t l = strnlen(v, MAX_ATTR_BYTES + 1);
          if (l <= MAX_ATTR_BYTES && (s = malloc(l + 1))) {
            memcpy(s, v, l);
            s[l] = 0;
            kind = QC_H5A_STR;
          }
          H5Dvlen_reclaim(mt, sp, H5P_DEFAULT, &v);
        }
        if (mt >= 0) H5Tclose(mt);
      } else {
        size_t sz = H5Tget_size(t);
        hid_t mt = H5Tcopy(t);
        if (sz > 0 && sz <= MAX_ATTR_BYTES && mt >= 0 && (s = calloc(1, sz + 1)) && H5Aread(a, mt, s) >= 0) kind = QC_H5A_STR;
        if (mt >= 0) H5Tclose(mt);
      }
    } else if (np == 1 && cl == H5T_INTEGER) {
      kind = H5Aread(a, H5T_NATIVE_LLONG, &iv) >= 0 ? QC_H5A_INT : QC_H5A_BAD;
    } else if (np == 1 && cl == H5T_FLOAT) {
      kind = H5Aread(a, H5T_NATIVE_DOUBLE, &dv) >= 0 ? QC_H5A_FLOAT : QC_H5A_BAD;
    } else if (np == 0) {
      kind = QC_H5A_STRS; /* an empty list, of any type */
    } else if (np > 1 && np <= MAX_ATTR_STRS && cl == H5T_STRING && H5Tis_variable_str(t) > 0) {
      hid_t mt = H5Tcopy(H5T_C_S1);
      kind = QC_H5A_BAD;
      if (mt >= 0 && H5Tset_size(mt, H5T_VARIABLE) >= 0 && (sv = calloc((size_t)np, sizeof *sv)) && H5Aread(a, mt, sv) >= 0) {
        nsv = (int)np;
        kind = QC_H5A_STRS;
        for (int i = 0; i < nsv; i++)
          if (!sv[i] || strnlen(sv[i], MAX_ATTR_BYTES + 1) > MAX_ATTR_BYTES) kind = QC_H5A_BAD;
      }
      if (kind == QC_H5A_STRS) { /* sent here, the list being in hand */
        put_u8(w, QC_REC_ATTR);
        put_str(w, name, strlen(name));
        put_u8(w, QC_H5A_STRS);
        put_u64(w, (uint64_t)nsv);
        for (int i = 0; i < nsv; i++) put_str(w, sv[i], strlen(sv[i]));
        kind = 0;
      }
      if (nsv) H5Dvlen_reclaim(mt, sp, H5P_DEFAULT, sv);
      if (mt >= 0) H5Tclose(mt);
      free(sv);
    }
  }
  if (sp >= 0) H5Sclose(sp);
  if (t >= 0) H5Tclose(t);
  if (a >= 0) H5Aclose(a);
  if (kind) {
    put_u8(w, QC_REC_ATTR);
    put_str(w, name, strlen(name));
    put_u8(w, (unsigned)kind);
    if (kind == QC_H5A_STR) put_str(w, s, strlen(s));
    if (kind == QC_H5A_INT) put_u64(w, (uint64_t)iv);
    if (kind == QC_H5A_FLOAT) {
      uint64_t bits;
      memcpy(&bits, &dv, sizeof bits);
      put_u64(w, bits);
    }
    if (kind == QC_H5A_STRS) put_u64(w, 0);
  }
  free(s);
  return 0;
}

static void attributes(walker *w, hid_t obj, const char *path, const char *kind) {
  attr_ctx c = {w, path, kind, 0};
  step(w, "listing the attributes of %s '%s'", kind, path);
  H5Aiterate2(obj, H5_INDEX_NAME, H5_ITER_INC, NULL, attr_cb, &c);
}

/* Every chunk of a chunked dataset allocated and inside the file. */
static int check_chunks(walker *w, hid_t ds, hid_t dcpl, int nd, const hsize_t *dims, const char *path) {
  hsize_t cd[H5S_MAX_RANK], n[H5S_MAX_RANK], at[H5S_MAX_RANK];
  if (nd <= 0 || nd > H5S_MAX_RANK || H5Pget_chunk(dcpl, nd, cd) != nd) return QC_CHUNKS_UNREADABLE;
  uint64_t total = 1;
  for (int i = 0; i < nd; i++) {
    if (cd[i] == 0) return QC_CHUNKS_UNREADABLE;
    n[i] = (dims[i] + cd[i] - 1) / cd[i];
    if (n[i] == 0) return QC_CHUNKS_OK; /* no elements */
    if (__builtin_mul_overflow(total, n[i], &total) || total > MAX_CHUNKS) return QC_CHUNKS_TOO_MANY;
    at[i] = 0;
  }
  for (uint64_t k = 0; k < total; k++) {
    hsize_t off[H5S_MAX_RANK];
    for (int i = 0; i < nd; i++) off[i] = at[i] * cd[i];
    if ((k & 1023) == 0) step(w, "checking the chunks of dataset '%s'", path);
    unsigned mask = 0;
    haddr_t addr = HADDR_UNDEF;
    hsize_t size = 0;
    if (H5Dget_chunk_info_by_coord(ds, off, &mask, &addr, &size) < 0) return QC_CHUNKS_UNREADABLE;
    if (addr == HADDR_UNDEF) return QC_CHUNKS_MISSING;
    uint64_t end; /* (whether the address counts a userblock or not: the lenient reading) */
    if (__builtin_add_overflow((uint64_t)addr, (uint64_t)size, &end) || end > (uint64_t)w->size)
      return QC_CHUNKS_PAST_EOF;
    for (int i = nd - 1; i >= 0; i--) { /* next chunk coordinate, last dimension fastest */
      if (++at[i] < n[i]) break;
      at[i] = 0;
    }
  }
  return QC_CHUNKS_OK;
}

/* 1 when file type t equals this machine's memory type of its kind. */
static int is_native(hid_t t, H5T_class_t cl, size_t sz, H5T_sign_t sg) {
  hid_t m = -1;
  if (cl == H5T_FLOAT && sz == 8) m = H5T_NATIVE_DOUBLE;
  else if (cl == H5T_FLOAT && sz == 4) m = H5T_NATIVE_FLOAT;
  else if (cl == H5T_INTEGER && sz == 1 && sg == H5T_SGN_NONE) m = H5T_NATIVE_UINT8;
  else if (cl == H5T_INTEGER && sz == 2 && sg == H5T_SGN_NONE) m = H5T_NATIVE_UINT16;
  else if (cl == H5T_INTEGER && sz == 4 && sg == H5T_SGN_2) m = H5T_NATIVE_INT32;
  else if (cl == H5T_INTEGER && sz == 8 && sg == H5T_SGN_2) m = H5T_NATIVE_INT64;
  return m >= 0 && H5Tequal(t, m) > 0;
}

/* The header of dataset ds: type, shape, storage. */
static void dataset_header(walker *w, hid_t ds, const char *path) {
  qc_h5dset h;
  memset(&h, 0, sizeof h);
  h.ndim = -1;
  h.addr = -1;
  step(w, "reading the type of dataset '%s'", path);
  hid_t t = H5Dget_type(ds);
  if (t >= 0) {
    H5T_class_t cl = H5Tget_class(t);
    size_t sz = H5Tget_size(t);
    H5T_sign_t sg = cl == H5T_INTEGER ? H5Tget_sign(t) : H5T_SGN_NONE;
    h.tclass = cl == H5T_INTEGER ? QC_H5T_INT : cl == H5T_FLOAT ? QC_H5T_FLOAT : cl == H5T_STRING ? QC_H5T_STRING : QC_H5T_OTHER;
    h.tsize = sz;
    h.tsigned = sg == H5T_SGN_2;
    h.tle = (cl == H5T_INTEGER || cl == H5T_FLOAT) && H5Tget_order(t) == H5T_ORDER_LE;
    if (cl == H5T_FLOAT) {
      size_t sp = 0, ep = 0, es = 0, mp = 0, ms = 0;
      if (H5Tget_fields(t, &sp, &ep, &es, &mp, &ms) >= 0) {
        h.f_spos = sp; h.f_epos = ep; h.f_esize = es; h.f_mpos = mp; h.f_msize = ms;
      }
      h.f_ebias = H5Tget_ebias(t);
    }
    h.native = is_native(t, cl, sz, sg);
    H5Tclose(t);
  } else {
    h.tclass = QC_H5T_OTHER;
  }
  step(w, "reading the shape of dataset '%s'", path);
  hsize_t dims[H5S_MAX_RANK];
  int nd = -1;
  hid_t sp = H5Dget_space(ds);
  if (sp >= 0) {
    H5S_class_t sc = H5Sget_simple_extent_type(sp);
    if (sc == H5S_SCALAR) nd = 0;
    else if (sc == H5S_SIMPLE) {
      nd = H5Sget_simple_extent_ndims(sp);
      if (nd < 0 || nd > H5S_MAX_RANK || H5Sget_simple_extent_dims(sp, dims, NULL) < 0) nd = -1;
    }
    H5Sclose(sp);
  }
  h.ndim = nd;
  for (int i = 0; i < nd && i < QC_MAXDIM; i++) h.dims[i] = dims[i];
  step(w, "reading the storage of dataset '%s'", path);
  hid_t dcpl = H5Dget_create_plist(ds);
  h.layout = QC_H5L_OTHER;
  if (dcpl >= 0) {
    H5D_layout_t l = H5Pget_layout(dcpl);
    h.layout = l == H5D_CONTIGUOUS ? QC_H5L_CONTIGUOUS : l == H5D_CHUNKED ? QC_H5L_CHUNKED : l == H5D_COMPACT ? QC_H5L_COMPACT
             : l == H5D_VIRTUAL ? QC_H5L_VIRTUAL : QC_H5L_OTHER;
    int nf = H5Pget_nfilters(dcpl);
    h.nfilters = nf < 0 ? QC_H5_MAXFILTER + 1 : nf;
    h.filters_avail = nf >= 0;
    for (int i = 0; i < nf && i < QC_H5_MAXFILTER; i++) {
      unsigned flags = 0;
      size_t ncd = 0;
      H5Z_filter_t id = H5Pget_filter2(dcpl, (unsigned)i, &flags, &ncd, NULL, 0, NULL, NULL);
      h.filter[i] = (int)id;
      if (id < 0 || H5Zfilter_avail(id) <= 0) h.filters_avail = 0;
    }
    int ne = H5Pget_external_count(dcpl);
    h.external = ne != 0;
    if (h.layout == QC_H5L_CONTIGUOUS) {
      haddr_t a = H5Dget_offset(ds);
      h.addr = a == HADDR_UNDEF ? -1 : (int64_t)a;
    }
    h.storage = H5Dget_storage_size(ds);
    if (h.layout == QC_H5L_CHUNKED && nd >= 0) h.chunks = check_chunks(w, ds, dcpl, nd, dims, path);
    H5Pclose(dcpl);
  }
  put_u8(w, (unsigned)h.tclass);
  put_u64(w, h.tsize);
  put_u8(w, (unsigned)h.tsigned);
  put_u8(w, (unsigned)h.tle);
  put_u64(w, h.f_spos); put_u64(w, h.f_epos); put_u64(w, h.f_esize);
  put_u64(w, h.f_mpos); put_u64(w, h.f_msize); put_u64(w, h.f_ebias);
  put_u8(w, (unsigned)h.native);
  put_u64(w, (uint64_t)(int64_t)h.ndim);
  for (int i = 0; i < nd && i < QC_MAXDIM; i++) put_u64(w, h.dims[i]);
  put_u8(w, (unsigned)h.layout);
  put_u8(w, (unsigned)h.nfilters);
  for (int i = 0; i < h.nfilters && i < QC_H5_MAXFILTER; i++) put_u64(w, (uint64_t)(int64_t)h.filter[i]);
  put_u8(w, (unsigned)h.filters_avail);
  put_u8(w, (unsigned)h.external);
  put_u64(w, (uint64_t)h.addr);
  put_u64(w, h.storage);
  put_u8(w, (unsigned)h.chunks);
}

static void object_rec(walker *w, const char *path, int type) {
  put_u8(w, QC_REC_OBJ);
  put_str(w, path, strlen(path));
  put_u8(w, (unsigned)type);
}

static herr_t link_cb(hid_t g, const char *name, const H5L_info_t *info, void *op) {
  walker *w = op;
  if (++w->nobj > MAX_OBJECTS) {
    fail(w, QC_BOX_WALK, "more than %d objects: not a dump qatcheck reads", MAX_OBJECTS);
    _exit(0);
  }
  size_t l = strnlen(name, MAX_LINK_PATH + 1);
  int depth = 1;
  for (const char *c = name; *c && depth <= MAX_DEPTH; c++) depth += *c == '/';
  if (depth > MAX_DEPTH || l > MAX_LINK_PATH) { /* libhdf5 follows a cycle whose link counts were damaged forever */
    fail(w, QC_BOX_WALK, "links nested more than %d levels deep at '/%.120s...': a cycle of groups (corrupt file?)", MAX_DEPTH,
         name);
    _exit(0);
  }
  char *path = malloc(l + 2);
  if (!path) return -1;
  path[0] = '/';
  memcpy(path + 1, name, l + 1);
  if (info->type == H5L_TYPE_SOFT) object_rec(w, path, QC_H5O_SOFT);
  else if (info->type == H5L_TYPE_EXTERNAL) object_rec(w, path, QC_H5O_EXTERNAL);
  else if (info->type != H5L_TYPE_HARD) object_rec(w, path, QC_H5O_OTHER);
  else {
    step(w, "opening '%s'", path);
    hid_t o = H5Oopen(g, name, H5P_DEFAULT);
    H5I_type_t it = o >= 0 ? H5Iget_type(o) : H5I_BADID;
    if (it == H5I_GROUP) {
      object_rec(w, path, QC_H5O_GROUP);
      attributes(w, o, path, "group");
    } else if (it == H5I_DATASET) {
      object_rec(w, path, QC_H5O_DATASET);
      dataset_header(w, o, path);
      attributes(w, o, path, "dataset");
    } else {
      object_rec(w, path, QC_H5O_OTHER);
    }
    if (o >= 0) H5Oclose(o);
  }
  free(path);
  return 0;
}

/* ---- reads ------------------------------------------------------------------ */

static int get_exact(int sock, void *p, size_t n) {
  char *c = p;
  while (n) {
    ssize_t r = recv(sock, c, n, 0);
    if (r <= 0) return -1;
    c += r;
    n -= (size_t)r;
  }
  return 0;
}

static uint64_t le64(const unsigned char *b) {
  uint64_t v = 0;
  for (int i = 7; i >= 0; i--) v = (v << 8) | b[i];
  return v;
}

/* One read request: u32 path length, path, u64 index (-1: whole), u8
 * memory type, u64 bytes expected. Answers PIECE records then DONE, or
 * FAIL. */
static void serve_read(walker *w) {
  unsigned char hdr[4];
  if (get_exact(w->sock, hdr, 4)) _exit(0);
  uint32_t pl = (uint32_t)hdr[0] | (uint32_t)hdr[1] << 8 | (uint32_t)hdr[2] << 16 | (uint32_t)hdr[3] << 24;
  if (pl > (1u << 20)) _exit(0);
  char *path = malloc(pl + 1);
  unsigned char rest[17];
  if (!path || get_exact(w->sock, path, pl) || get_exact(w->sock, rest, 17)) _exit(0);
  path[pl] = 0;
  int64_t index = (int64_t)le64(rest);
  int mtc = rest[8];
  uint64_t want = le64(rest + 9);
  hid_t mem = -1, owned = -1, ds = -1, fs = -1, ms = -1;
  char *buf = NULL;
  step(w, "opening dataset '%s'", path);
  ds = H5Dopen2(w->file, path, H5P_DEFAULT);
  if (ds < 0) { fail(w, QC_BOX_READ, "dataset '%s': libhdf5 cannot open it", path); goto done; }
  switch (mtc) {
    case QC_MT_F64: mem = H5T_NATIVE_DOUBLE; break;
    case QC_MT_F32: mem = H5T_NATIVE_FLOAT; break;
    case QC_MT_I32: mem = H5T_NATIVE_INT32; break;
    case QC_MT_I64: mem = H5T_NATIVE_INT64; break;
    case QC_MT_U8: mem = H5T_NATIVE_UINT8; break;
    case QC_MT_U16: mem = H5T_NATIVE_UINT16; break;
    default: mem = owned = H5Dget_type(ds); break;
  }
  fs = H5Dget_space(ds);
  int nd = fs >= 0 ? H5Sget_simple_extent_ndims(fs) : -1;
  hsize_t dims[H5S_MAX_RANK], start[H5S_MAX_RANK], count[H5S_MAX_RANK];
  if (mem < 0 || nd < 0 || nd > H5S_MAX_RANK || H5Sget_simple_extent_dims(fs, dims, NULL) < 0) {
    fail(w, QC_BOX_READ, "dataset '%s': libhdf5 cannot read its shape", path);
    goto done;
  }
  size_t es = H5Tget_size(mem);
  uint64_t total = es;
  for (int i = 0; i < nd; i++) {
    start[i] = 0;
    count[i] = dims[i];
  }
  if (index >= 0) {
    if (nd < 1 || (hsize_t)index >= dims[0]) { fail(w, QC_BOX_READ, "dataset '%s': slice %lld is out of range", path, (long long)index); goto done; }
    start[0] = (hsize_t)index;
    count[0] = 1;
  }
  for (int i = 0; i < nd; i++)
    if (__builtin_mul_overflow(total, (uint64_t)count[i], &total)) total = UINT64_MAX;
  if (total != want) { fail(w, QC_BOX_READ, "dataset '%s' holds %llu bytes: expected %llu", path, (unsigned long long)total, (unsigned long long)want); goto done; }
  int axis = index >= 0 ? 1 : 0;
  uint64_t rows = axis < nd ? count[axis] : 1, rowbytes = rows ? total / rows : 0;
  uint64_t per = rowbytes && rowbytes < PIECE_BYTES ? PIECE_BYTES / rowbytes : 1;
  buf = malloc(total == 0 ? 1 : (size_t)(per * rowbytes < total ? per * rowbytes : total));
  if (!buf) { fail(w, QC_BOX_READ, "dataset '%s': out of memory in the reader", path); goto done; }
  for (uint64_t r0 = 0; total && r0 < rows; r0 += per) {
    uint64_t nr = rows - r0 < per ? rows - r0 : per;
    step(w, "reading dataset '%s'", path);
    herr_t st;
    if (nd == 0) {
      st = H5Dread(ds, mem, H5S_ALL, H5S_ALL, H5P_DEFAULT, buf);
    } else {
      hsize_t s[H5S_MAX_RANK], c[H5S_MAX_RANK];
      memcpy(s, start, sizeof s);
      memcpy(c, count, sizeof c);
      if (axis < nd) {
        s[axis] = r0;
        c[axis] = nr;
      }
      ms = H5Screate_simple(nd, c, NULL);
      st = ms < 0 || H5Sselect_hyperslab(fs, H5S_SELECT_SET, s, NULL, c, NULL) < 0
               ? -1
               : H5Dread(ds, mem, ms, fs, H5P_DEFAULT, buf);
      if (ms >= 0) H5Sclose(ms);
      ms = -1;
    }
    if (st < 0) { fail(w, QC_BOX_READ, "dataset '%s': libhdf5 failed reading it (corrupt data?)", path); goto done; }
    put_u8(w, QC_REC_PIECE);
    put_u64(w, nr * rowbytes);
    put(w, buf, (size_t)(nr * rowbytes));
  }
  put_u8(w, QC_REC_DONE);
  flush_out(w);
done:
  free(buf);
  free(path);
  if (fs >= 0) H5Sclose(fs);
  if (owned >= 0) H5Tclose(owned);
  if (ds >= 0) H5Dclose(ds);
}

/* Turns off libhdf5's automatic error printing, once. Here, in the child's
 * file, because the child needs it and the writer (dump.c, above) too. */
void qc_dump_silence(void) {
  static int done = 0;
  if (!done) {
    H5Eset_auto2(H5E_DEFAULT, NULL, NULL);
    done = 1;
  }
}

void qc_box_child(int sock, const char *path, int fd, int64_t size, qc_box_shared *sh) {
  walker *w = calloc(1, sizeof *w);
  if (!w) _exit(3);
  w->sock = sock;
  w->size = size;
  w->sh = sh;
  qc_dump_silence();
  char name[64];
  snprintf(name, sizeof name, "/proc/self/fd/%d", fd);
  if (access(name, R_OK) != 0) snprintf(name, sizeof name, "%s", ""); /* no /proc: the path itself */
  const char *open_as = name[0] ? name : path;
  step(w, "checking the HDF5 signature");
  if (H5Fis_hdf5(open_as) <= 0) { fail(w, QC_BOX_NOT_HDF5, "not an HDF5 file (or truncated)"); _exit(0); }
  step(w, "opening the file (superblock and root group)");
  w->file = H5Fopen(open_as, H5F_ACC_RDONLY, H5P_DEFAULT);
  if (w->file < 0) { fail(w, QC_BOX_OPEN, "libhdf5 cannot open it (truncated or corrupt)"); _exit(0); }
  hid_t fcpl = H5Fget_create_plist(w->file);
  hsize_t ub = 0;
  if (fcpl < 0 || H5Pget_userblock(fcpl, &ub) < 0) ub = 0;
  if (fcpl >= 0) H5Pclose(fcpl);
  w->userblock = ub;
  put_u8(w, QC_REC_USERBLOCK);
  put_u64(w, ub);
  object_rec(w, "/", QC_H5O_GROUP);
  step(w, "opening the root group");
  hid_t root = H5Gopen2(w->file, "/", H5P_DEFAULT);
  if (root < 0) { fail(w, QC_BOX_OPEN, "libhdf5 cannot open its root group (corrupt)"); _exit(0); }
  attributes(w, root, "/", "group");
  step(w, "walking the links under '/'");
  herr_t st = H5Lvisit(root, H5_INDEX_NAME, H5_ITER_INC, link_cb, w);
  H5Gclose(root);
  if (st < 0) { fail(w, QC_BOX_WALK, "libhdf5 cannot walk its groups (corrupt)"); _exit(0); }
  put_u8(w, QC_REC_END);
  flush_out(w);
  for (;;) {
    unsigned char tag;
    if (get_exact(sock, &tag, 1) || tag != 'R') _exit(0);
    serve_read(w);
  }
}
