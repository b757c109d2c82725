/* dump_read.c: datasets of a dump (see dump.h): element types, shapes,
 * whole and sliced reads, direct (pread) reads of located contiguous data,
 * existence and listing. */
#include "io/dump.h"

#include <errno.h>
#include <fcntl.h>
#include <hdf5.h>
#include <regex.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "core/qc.h"
#include "io/dump_priv.h"

/* Map a dataset's HDF5 type and its `dtype` attribute to a qc_dtype and the
 * native memory type to read it with. */
static int dset_dtype(qc_dump *d, hid_t ds, const char *name, qc_dtype *dt, hid_t *mem) {
  hid_t t = H5Dget_type(ds);
  if (t < 0) return qc_err("dump '%s': dataset '%s': cannot read its type", d->path, name);
  H5T_class_t cl = H5Tget_class(t);
  size_t sz = H5Tget_size(t);
  H5T_sign_t sg = cl == H5T_INTEGER ? H5Tget_sign(t) : H5T_SGN_NONE;
  H5Tclose(t);
  char attr[64] = "";
  int has_attr = qc_dump_str_attr(ds, "dtype", attr, sizeof attr) == QC_OK;
  qc_dtype native;
  if (cl == H5T_FLOAT && sz == 8) { native = QC_F64; *mem = H5T_NATIVE_DOUBLE; }
  else if (cl == H5T_FLOAT && sz == 4) { native = QC_F32; *mem = H5T_NATIVE_FLOAT; }
  else if (cl == H5T_FLOAT && sz == 2) {
    /* read raw (HDF5 1.10 has no half-precision memory type): only the
     * little-endian IEEE binary16 layout may be taken bit for bit */
    hid_t ft = H5Dget_type(ds);
    size_t spos = 0, epos = 0, esize = 0, mpos = 0, msize = 0;
    int ok = ft >= 0 && H5Tget_order(ft) == H5T_ORDER_LE && H5Tget_fields(ft, &spos, &epos, &esize, &mpos, &msize) >= 0 &&
             spos == 15 && epos == 10 && esize == 5 && mpos == 0 && msize == 10 && H5Tget_ebias(ft) == 15;
    if (ft >= 0) H5Tclose(ft);
    if (!ok) {
      qc_err("dump '%s': dataset '%s': a 16-bit float that is not little-endian IEEE binary16", d->path, name);
      qc_hint("store float16 as numpy '<f2', or bfloat16 as uint16 with dtype='bfloat16'");
      return QC_EINPUT;
    }
    native = QC_F16;
    *mem = -1;
  }
  else if (cl == H5T_INTEGER && sz == 4 && sg == H5T_SGN_2) { native = QC_I32; *mem = H5T_NATIVE_INT32; }
  else if (cl == H5T_INTEGER && sz == 8 && sg == H5T_SGN_2) { native = QC_I64; *mem = H5T_NATIVE_INT64; }
  else if (cl == H5T_INTEGER && sz == 1 && sg == H5T_SGN_NONE) { native = QC_U8; *mem = H5T_NATIVE_UINT8; }
  else if (cl == H5T_INTEGER && sz == 2 && sg == H5T_SGN_NONE) { native = QC_BF16; *mem = H5T_NATIVE_UINT16; }
  else {
    qc_err("dump '%s': dataset '%s': element type (class %d, %zu bytes) is not supported", d->path, name, (int)cl, sz);
    qc_hint("use float64/32/16, int32/64, uint8, or bfloat16 as uint16 with attribute dtype='bfloat16'");
    return QC_EINPUT;
  }
  if (cl == H5T_FLOAT && sz == 2) *mem = -1; /* read raw bits with the file's own type (see read_impl) */
  if (!has_attr) {
    if (native == QC_BF16) {
      qc_err("dump '%s': dataset '%s' is uint16 without a 'dtype' attribute: expected dtype='bfloat16'", d->path, name);
      return QC_EINPUT;
    }
    *dt = native;
    return QC_OK;
  }
  qc_dtype want;
  if (qc_dtype_from_name(attr, &want) != QC_OK) {
    qc_err("dump '%s': dataset '%s': attribute dtype='%s' is not a known element type", d->path, name, attr);
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
    qc_err("dump '%s': dataset '%s': attribute dtype='%s' does not match its storage (%s)", d->path, name, attr,
           native == QC_BF16 ? "uint16" : qc_dtype_name(native));
    qc_hint("bfloat16 is stored as uint16, float8/float4/e8m0 as uint8");
    return QC_EINPUT;
  }
  *dt = want;
  return QC_OK;
}

/* Open dataset `name` and read its shape; QC_EINPUT naming it if absent. */
static int dset_open(qc_dump *d, const char *name, hid_t *ds, int *ndim, hsize_t *dims) {
  htri_t ex = H5Lexists(d->file, name, H5P_DEFAULT);
  if (ex <= 0) return qc_err("dump '%s': dataset '%s' is missing", d->path, name);
  *ds = H5Dopen2(d->file, name, H5P_DEFAULT);
  if (*ds < 0) return qc_err("dump '%s': '%s' is not a readable dataset", d->path, name);
  /* data kept in other files is not followed (as external links are not) */
  hid_t dcpl = H5Dget_create_plist(*ds);
  int elsewhere = dcpl < 0 || H5Pget_layout(dcpl) == H5D_VIRTUAL || H5Pget_external_count(dcpl) != 0;
  if (dcpl >= 0) H5Pclose(dcpl);
  if (elsewhere) {
    H5Dclose(*ds);
    qc_err("dump '%s': dataset '%s' is a virtual dataset or has external storage (data that may live in other files): not followed",
           d->path, name);
    qc_hint("write the tensor into the dump itself (h5py create_dataset with data=...)");
    return QC_EINPUT;
  }
  hid_t sp = H5Dget_space(*ds);
  int nd = sp >= 0 ? H5Sget_simple_extent_ndims(sp) : -1;
  if (nd < 0 || nd > QC_MAXDIM) {
    if (sp >= 0) H5Sclose(sp);
    H5Dclose(*ds);
    return qc_err("dump '%s': dataset '%s': rank %d is not supported: expected at most %d", d->path, name, nd, QC_MAXDIM);
  }
  H5Sget_simple_extent_dims(sp, dims, NULL);
  H5Sclose(sp);
  *ndim = nd;
  return QC_OK;
}

static const char *base_name(const char *p) {
  const char *s = strrchr(p, '/');
  return s ? s + 1 : p;
}

int qc_dump_info(qc_dump *d, const char *dset, qc_tensor *t) {
  hid_t ds;
  int nd;
  hsize_t dims[QC_MAXDIM];
  int rc = dset_open(d, dset, &ds, &nd, dims);
  if (rc) return rc;
  hid_t mem;
  memset(t, 0, sizeof *t);
  rc = dset_dtype(d, ds, dset, &t->dtype, &mem);
  H5Dclose(ds);
  if (rc) return rc;
  snprintf(t->name, sizeof t->name, "%s", base_name(dset));
  t->ndim = nd;
  for (int i = 0; i < nd; i++) t->shape[i] = (int64_t)dims[i];
  return QC_OK;
}

/* The extent read for (dset, index): shape and element count; checks the
 * slice index. ds open. */
static int read_extent(qc_dump *d, const char *dset, long long index, int nd, const hsize_t *dims, int *ond,
                       int64_t *shape) {
  if (index >= 0) {
    if (nd < 1 || (hsize_t)index >= dims[0])
      return qc_err("dump '%s': dataset '%s': slice %lld is out of range", d->path, dset, index);
    *ond = nd - 1;
    for (int i = 1; i < nd; i++) shape[i - 1] = (int64_t)dims[i];
  } else {
    *ond = nd;
    for (int i = 0; i < nd; i++) shape[i] = (int64_t)dims[i];
  }
  return QC_OK;
}

/* H5Dread of (dset, index) from the open ds into buf, memory type mem. */
static int read_ds(qc_dump *d, hid_t ds, hid_t mem, const char *dset, long long index, int nd, const hsize_t *dims,
                   void *buf) {
  herr_t st;
  if (index >= 0) {
    hid_t fs = H5Dget_space(ds);
    hsize_t start[QC_MAXDIM] = {0}, count[QC_MAXDIM];
    start[0] = (hsize_t)index;
    count[0] = 1;
    for (int i = 1; i < nd; i++) count[i] = dims[i];
    hid_t ms = H5Screate_simple(nd, count, NULL);
    st = (fs < 0 || ms < 0 || H5Sselect_hyperslab(fs, H5S_SELECT_SET, start, NULL, count, NULL) < 0)
             ? -1
             : H5Dread(ds, mem, ms, fs, H5P_DEFAULT, buf);
    if (ms >= 0) H5Sclose(ms);
    if (fs >= 0) H5Sclose(fs);
  } else {
    st = H5Dread(ds, mem, H5S_ALL, H5S_ALL, H5P_DEFAULT, buf);
  }
  if (st < 0) return qc_err("dump '%s': dataset '%s': read failed (truncated or corrupt file?)", d->path, dset);
  return QC_OK;
}

/* Read dataset `dset` (whole, or slice `index` of dim 0 when index >= 0)
 * into a new tensor (buf NULL), or into buf of cap bytes (the element count
 * and size must fill it exactly). */
static int read_impl(qc_dump *d, const char *dset, long long index, qc_tensor *out, void *buf, size_t cap) {
  hid_t ds, mem;
  int nd, ond;
  hsize_t dims[QC_MAXDIM];
  qc_dtype dt;
  hid_t owned = -1;
  int64_t shape[QC_MAXDIM];
  if (out) memset(out, 0, sizeof *out);
  int rc = dset_open(d, dset, &ds, &nd, dims);
  if (rc) return rc;
  if ((rc = dset_dtype(d, ds, dset, &dt, &mem))) goto done;
  if (mem < 0) mem = owned = H5Dget_type(ds); /* float16: the file's type, no conversion */
  if ((rc = read_extent(d, dset, index, nd, dims, &ond, shape))) goto done;
  if (buf) {
    size_t want = (size_t)qc_shape_numel(ond, shape) * qc_dtype_size(dt);
    if (want != cap) {
      rc = qc_err("dump '%s': dataset '%s' holds %zu bytes: expected %zu", d->path, dset, want, cap);
      goto done;
    }
    if (want) rc = read_ds(d, ds, mem, dset, index, nd, dims, buf);
    goto done;
  }
  if ((rc = qc_tensor_alloc(out, base_name(dset), dt, ond, shape))) {
    if (rc == QC_EINPUT) qc_hint("dataset '%s' of dump '%s'", dset, d->path);
    goto done;
  }
  if (out->nbytes == 0) goto done;
  if ((rc = read_ds(d, ds, mem, dset, index, nd, dims, out->data))) qc_tensor_free(out);
done:
  if (owned >= 0) H5Tclose(owned);
  H5Dclose(ds);
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
  hid_t ds, mem, dcpl = -1, ft = -1;
  int nd, ond;
  hsize_t dims[QC_MAXDIM];
  int64_t shape[QC_MAXDIM];
  memset(loc, 0, sizeof *loc);
  loc->offset = -1;
  int rc = dset_open(d, dset, &ds, &nd, dims);
  if (rc) return rc;
  if ((rc = dset_dtype(d, ds, dset, &loc->dtype, &mem)) || (rc = read_extent(d, dset, index, nd, dims, &ond, shape)))
    goto done;
  size_t es = qc_dtype_size(loc->dtype);
  loc->nbytes = (size_t)qc_shape_numel(ond, shape) * es;
  if (d->fd < 0 || loc->nbytes == 0) goto done;
  /* bytes as stored = bytes as read only for contiguous, unfiltered,
   * allocated storage in this machine's own layout */
  dcpl = H5Dget_create_plist(ds);
  ft = H5Dget_type(ds);
  if (dcpl < 0 || ft < 0 || H5Pget_layout(dcpl) != H5D_CONTIGUOUS || H5Pget_nfilters(dcpl) != 0 ||
      H5Pget_external_count(dcpl) != 0)
    goto done;
  if (mem >= 0 && H5Tequal(ft, mem) <= 0) goto done;                  /* float16 (mem -1): LE binary16, checked */
  {
    int64_t all[QC_MAXDIM];
    for (int i = 0; i < nd; i++) all[i] = (int64_t)dims[i];
    size_t total = (size_t)qc_shape_numel(nd, all) * es;
    haddr_t a = H5Dget_offset(ds);
    if (a == HADDR_UNDEF || H5Dget_storage_size(ds) != (hsize_t)total) goto done;
    loc->offset = (long long)a + (index >= 0 ? index * (long long)loc->nbytes : 0);
  }
done:
  if (ft >= 0) H5Tclose(ft);
  if (dcpl >= 0) H5Pclose(dcpl);
  H5Dclose(ds);
  return rc;
}

int qc_dump_pread(const qc_dump *d, const char *dset, const qc_dump_loc *loc, void *buf) {
  if (loc->offset < 0 || d->fd < 0) return qc_err("dump '%s': dataset '%s': no direct read", d->path, dset);
  size_t got = 0;
  while (got < loc->nbytes) {
    ssize_t r = pread(d->fd, (char *)buf + got, loc->nbytes - got, (off_t)(loc->offset + (long long)got));
    if (r < 0 && errno == EINTR) continue;
    if (r < 0) return qc_err_sys("dump '%s': dataset '%s': read failed: %s", d->path, dset, strerror(errno));
    if (r == 0) return qc_err("dump '%s': dataset '%s': the file ends early (truncated?)", d->path, dset);
    got += (size_t)r;
  }
  return QC_OK;
}

int qc_dump_get_attr(qc_dump *d, const char *obj, const char *name, char *buf, size_t n) {
  if (H5Lexists(d->file, obj, H5P_DEFAULT) <= 0 && strcmp(obj, "/") != 0) return QC_EINPUT;
  hid_t o = H5Oopen(d->file, obj, H5P_DEFAULT);
  if (o < 0) return QC_EINPUT;
  int rc = qc_dump_str_attr(o, name, buf, n);
  H5Oclose(o);
  return rc;
}

int qc_dump_get_int_attr(qc_dump *d, const char *obj, const char *name, long long *v) {
  char buf[64], *end;
  if (H5Lexists(d->file, obj, H5P_DEFAULT) <= 0 && strcmp(obj, "/") != 0) return QC_EINPUT;
  hid_t o = H5Oopen(d->file, obj, H5P_DEFAULT);
  if (o < 0) return QC_EINPUT;
  int rc = QC_EINPUT, there = H5Aexists(o, name) > 0;
  if (there && qc_dump_str_attr(o, name, buf, sizeof buf) == QC_OK) {
    long long x = strtoll(buf, &end, 10);
    if (buf[0] && !*end) { *v = x; rc = QC_OK; }
  } else if (there) {
    hid_t a = H5Aopen(o, name, H5P_DEFAULT), t = a >= 0 ? H5Aget_type(a) : -1, sp = a >= 0 ? H5Aget_space(a) : -1;
    if (t >= 0 && sp >= 0 && H5Tget_class(t) == H5T_INTEGER && H5Sget_simple_extent_npoints(sp) == 1 &&
        H5Aread(a, H5T_NATIVE_LLONG, v) >= 0)
      rc = QC_OK;
    if (sp >= 0) H5Sclose(sp);
    if (t >= 0) H5Tclose(t);
    if (a >= 0) H5Aclose(a);
  }
  H5Oclose(o);
  if (rc && there) return qc_err("dump '%s': '%s': attribute '%s' is not an integer", d->path, obj, name);
  return rc;
}

int qc_dump_exists(qc_dump *d, const char *path) {
  char buf[QC_PATHLEN * 2];
  if (!path[0]) return 0;
  /* H5Lexists needs every intermediate link to exist */
  for (const char *p = strchr(path + 1, '/'); p; p = strchr(p + 1, '/')) {
    snprintf(buf, sizeof buf, "%.*s", (int)(p - path), path);
    if (H5Lexists(d->file, buf, H5P_DEFAULT) <= 0) return 0;
  }
  return H5Lexists(d->file, path, H5P_DEFAULT) > 0;
}

typedef struct {
  int n, cap, rc;
  char (*name)[QC_NAMELEN];
} name_list;

static herr_t list_cb(hid_t g, const char *name, const H5L_info_t *info, void *op) {
  (void)info;
  name_list *l = op;
  H5O_info_t oi;
  if (H5Oget_info_by_name(g, name, &oi, H5P_DEFAULT) < 0 || oi.type != H5O_TYPE_DATASET) return 0;
  if (strlen(name) >= QC_NAMELEN) { l->rc = qc_err("dataset name '%.40s...' is longer than %d characters", name, QC_NAMELEN - 1); return -1; }
  if (l->n == l->cap) {
    int nc = l->cap ? 2 * l->cap : 8;
    void *p = realloc(l->name, (size_t)nc * sizeof *l->name);
    if (!p) { l->rc = qc_err_sys("out of memory listing datasets"); return -1; }
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
  if (!qc_dump_exists(d, group)) return QC_OK;
  hid_t g = H5Gopen2(d->file, group, H5P_DEFAULT);
  if (g < 0) return qc_err("dump '%s': '%s' is not a group", d->path, group);
  herr_t r = H5Literate(g, H5_INDEX_NAME, H5_ITER_INC, NULL, list_cb, &l);
  H5Gclose(g);
  if (l.rc || r < 0) {
    free(l.name);
    return l.rc ? l.rc : qc_err("dump '%s': cannot list group '%s'", d->path, group);
  }
  *names = l.name;
  *n = l.n;
  return QC_OK;
}
