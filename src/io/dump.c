/* dump.c: HDF5 dumps (see dump.h). Every HDF5 call's status is checked;
 * HDF5's automatic error printing is turned off once, and failures become a
 * single message naming the file and the object. */
#include "io/dump.h"

#include <errno.h>
#include <fcntl.h>
#include <hdf5.h>
#include <regex.h>
#include <unistd.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/qc.h"

struct qc_dump {
  hid_t file;
  char path[1024];
  int writable;
  int fd;          /* the same file for qc_dump_pread; -1 when direct reads are off (userblock, no descriptor) */
};

static void silence(void) {
  static int done = 0;
  if (!done) {
    H5Eset_auto2(H5E_DEFAULT, NULL, NULL);
    done = 1;
  }
}

const char *qc_dump_path(const qc_dump *d) { return d->path; }

/* Read a scalar integer attribute `name` of object `obj`. */
/* 1 when attribute a holds exactly one element (scalar or a 1-element
 * array): the only shape read here, so no read can overflow a buffer. */
static int attr_is_single(hid_t a) {
  hid_t sp = H5Aget_space(a);
  if (sp < 0) return 0;
  hssize_t n = H5Sget_simple_extent_npoints(sp);
  H5Sclose(sp);
  return n == 1;
}

static int read_int_attr(hid_t obj, const char *name, long long *v) {
  hid_t a = H5Aopen(obj, name, H5P_DEFAULT);
  if (a < 0) return QC_EINPUT;
  hid_t t = H5Aget_type(a);
  int rc = QC_EINPUT;
  if (t >= 0 && attr_is_single(a) && H5Tget_class(t) == H5T_INTEGER && H5Aread(a, H5T_NATIVE_LLONG, v) >= 0) rc = QC_OK;
  if (t >= 0) H5Tclose(t);
  H5Aclose(a);
  return rc;
}

/* Read a string attribute (fixed or variable length) into buf. */
static int read_str_attr(hid_t obj, const char *name, char *buf, size_t n) {
  if (H5Aexists(obj, name) <= 0) return QC_EINPUT;
  hid_t a = H5Aopen(obj, name, H5P_DEFAULT);
  if (a < 0) return QC_EINPUT;
  hid_t t = H5Aget_type(a);
  int rc = QC_EINPUT;
  if (t < 0 || H5Tget_class(t) != H5T_STRING || !attr_is_single(a)) goto done;
  if (H5Tis_variable_str(t) > 0) {
    hid_t mt = H5Tcopy(H5T_C_S1);
    char *s = NULL;
    if (mt >= 0 && H5Tset_size(mt, H5T_VARIABLE) >= 0 && H5Tset_cset(mt, H5Tget_cset(t)) >= 0 &&
        H5Aread(a, mt, &s) >= 0 && s) {
      snprintf(buf, n, "%s", s);
      hid_t sp = H5Aget_space(a);
      if (sp >= 0) {
        H5Dvlen_reclaim(mt, sp, H5P_DEFAULT, &s);
        H5Sclose(sp);
      }
      rc = QC_OK;
    }
    if (mt >= 0) H5Tclose(mt);
  } else {
    size_t sz = H5Tget_size(t);
    char *tmp = malloc(sz + 1);
    hid_t mt = H5Tcopy(t);
    if (tmp && mt >= 0 && H5Aread(a, mt, tmp) >= 0) {
      tmp[sz] = 0;
      snprintf(buf, n, "%s", tmp);
      rc = QC_OK;
    }
    if (mt >= 0) H5Tclose(mt);
    free(tmp);
  }
done:
  if (t >= 0) H5Tclose(t);
  H5Aclose(a);
  return rc;
}

int qc_dump_open(const char *path, qc_dump **out) {
  silence();
  *out = NULL;
  FILE *f = fopen(path, "rb");
  if (!f) return qc_err("dump '%s': cannot open: no such file or not readable", path);
  fclose(f);
  htri_t is = H5Fis_hdf5(path);
  if (is <= 0) {
    qc_err("dump '%s': not an HDF5 file (or truncated)", path);
    qc_hint("a dump is written by scripts/qatdump.py or h5py with the schema of the README");
    return QC_EINPUT;
  }
  hid_t fid = H5Fopen(path, H5F_ACC_RDONLY, H5P_DEFAULT);
  if (fid < 0) return qc_err("dump '%s': HDF5 cannot open it (truncated or corrupt)", path);
  long long ver = 0;
  if (read_int_attr(fid, "qatcheck_dump", &ver) != QC_OK) {
    H5Fclose(fid);
    qc_err("dump '%s': root attribute 'qatcheck_dump' is missing: expected the integer 1", path);
    qc_hint("set it with h5py: f.attrs['qatcheck_dump'] = 1");
    return QC_EINPUT;
  }
  if (ver != 1) {
    H5Fclose(fid);
    return qc_err("dump '%s': root attribute 'qatcheck_dump' is %lld: expected 1", path, ver);
  }
  qc_dump *d = qc_calloc(1, sizeof *d, "dump handle");
  if (!d) { H5Fclose(fid); return QC_ESYS; }
  d->file = fid;
  snprintf(d->path, sizeof d->path, "%s", path);
  /* direct reads take HDF5's addresses as file offsets: only without a userblock */
  d->fd = -1;
  hid_t fcpl = H5Fget_create_plist(fid);
  hsize_t ub = 1;
  if (fcpl >= 0 && H5Pget_userblock(fcpl, &ub) >= 0 && ub == 0) d->fd = open(path, O_RDONLY | O_CLOEXEC);
  if (fcpl >= 0) H5Pclose(fcpl);
  *out = d;
  return QC_OK;
}

int qc_dump_create(const char *path, qc_dump **out) {
  silence();
  *out = NULL;
  hid_t fid = H5Fcreate(path, H5F_ACC_TRUNC, H5P_DEFAULT, H5P_DEFAULT);
  if (fid < 0) return qc_err("dump '%s': cannot create it", path);
  hid_t sp = H5Screate(H5S_SCALAR);
  hid_t a = sp >= 0 ? H5Acreate2(fid, "qatcheck_dump", H5T_STD_I64LE, sp, H5P_DEFAULT, H5P_DEFAULT) : -1;
  long long one = 1;
  int ok = a >= 0 && H5Awrite(a, H5T_NATIVE_LLONG, &one) >= 0;
  if (a >= 0) H5Aclose(a);
  if (sp >= 0) H5Sclose(sp);
  if (!ok) { H5Fclose(fid); return qc_err("dump '%s': cannot write the root attribute", path); }
  qc_dump *d = qc_calloc(1, sizeof *d, "dump handle");
  if (!d) { H5Fclose(fid); return QC_ESYS; }
  d->file = fid;
  d->writable = 1;
  d->fd = -1;
  snprintf(d->path, sizeof d->path, "%s", path);
  *out = d;
  return QC_OK;
}

void qc_dump_close(qc_dump *d) {
  if (!d) return;
  if (d->file >= 0) H5Fclose(d->file);
  if (d->fd >= 0) close(d->fd);
  free(d);
}

/* ---- module discovery ---------------------------------------------------- */

typedef struct {
  qc_dump *d;
  regex_t *re;
  qc_dump_entry *v;
  int n, cap;
  int rc;
} visit_ctx;

static herr_t visit_cb(hid_t obj, const char *name, const H5O_info_t *info, void *op) {
  visit_ctx *c = op;
  if (info->type != H5O_TYPE_GROUP || strcmp(name, ".") == 0) return 0;
  hid_t g = H5Gopen2(obj, name, H5P_DEFAULT);
  if (g < 0) return 0;
  char cls[64];
  int has = read_str_attr(g, "class", cls, sizeof cls) == QC_OK;
  H5Gclose(g);
  if (!has) return 0;
  char path[QC_PATHLEN];
  snprintf(path, sizeof path, "/%s", name);
  if (c->re && regexec(c->re, path, 0, NULL, 0) != 0) return 0;
  if (c->n == c->cap) {
    int cap = c->cap ? 2 * c->cap : 16;
    qc_dump_entry *nv = realloc(c->v, (size_t)cap * sizeof *nv);
    if (!nv) { c->rc = qc_err_sys("out of memory listing modules"); return -1; }
    c->v = nv;
    c->cap = cap;
  }
  snprintf(c->v[c->n].path, sizeof c->v[c->n].path, "%s", path);
  snprintf(c->v[c->n].cls, sizeof c->v[c->n].cls, "%s", cls);
  c->n++;
  return 0;
}

static herr_t link_cb(hid_t g, const char *name, const H5L_info_t *info, void *op) {
  (void)g;
  if (info->type == H5L_TYPE_EXTERNAL) {
    snprintf((char *)op, QC_PATHLEN, "/%s", name);
    return 1;
  }
  return 0;
}

int qc_dump_modules(qc_dump *d, const char *regex, qc_dump_entry **out, int *n) {
  char ext[QC_PATHLEN] = "";
  if (H5Lvisit(d->file, H5_INDEX_NAME, H5_ITER_INC, link_cb, ext) > 0) {
    qc_err("dump '%s': '%s' is an external link: module groups in other files are not followed", d->path, ext);
    qc_hint("copy the linked groups into the dump (h5py: f.copy(...)), or audit the other file itself");
    return QC_EINPUT;
  }
  visit_ctx c = {.d = d};
  regex_t re;
  *out = NULL;
  *n = 0;
  if (regex && regex[0]) {
    int e = regcomp(&re, regex, REG_EXTENDED | REG_NOSUB);
    if (e) {
      char eb[128];
      regerror(e, &re, eb, sizeof eb);
      return qc_err("modules regex '%s': %s", regex, eb);
    }
    c.re = &re;
  }
  herr_t st = H5Ovisit(d->file, H5_INDEX_NAME, H5_ITER_INC, visit_cb, &c);
  if (c.re) regfree(c.re);
  if (c.rc) { free(c.v); return c.rc; }
  if (st < 0) { free(c.v); return qc_err("dump '%s': cannot walk its groups (corrupt file?)", d->path); }
  *out = c.v;
  *n = c.n;
  return QC_OK;
}

/* ---- datasets -------------------------------------------------------------- */

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
  int has_attr = read_str_attr(ds, "dtype", attr, sizeof attr) == QC_OK;
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
  int rc = read_str_attr(o, name, buf, n);
  H5Oclose(o);
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

/* ---- module loading -------------------------------------------------------- */

typedef struct {
  qc_dump *d;
  const char *group;
  qc_tset *set;
  char (*names)[QC_NAMELEN]; /* when non-NULL, collect subgroup names instead */
  int nnames, capnames;
  int rc;
} iter_ctx;

static herr_t iter_cb(hid_t g, const char *name, const H5L_info_t *info, void *op) {
  (void)info;
  iter_ctx *c = op;
  H5O_info_t oi;
  if (H5Oget_info_by_name(g, name, &oi, H5P_DEFAULT) < 0) {
    c->rc = qc_err("dump '%s': '%s/%s' cannot be inspected", c->d->path, c->group, name);
    return -1;
  }
  char full[QC_PATHLEN * 2];
  snprintf(full, sizeof full, "%s/%s", c->group, name);
  if (oi.type != H5O_TYPE_DATASET) {
    c->rc = qc_err("dump '%s': '%s' is a group: expected a dataset", c->d->path, full);
    return -1;
  }
  qc_tensor t;
  if ((c->rc = qc_dump_read(c->d, full, &t))) return -1;
  if ((c->rc = qc_tset_add(c->set, &t))) { qc_tensor_free(&t); return -1; }
  return 0;
}

/* Read every dataset directly under `group` (absent group: nothing). */
static int load_role(qc_dump *d, const char *group, qc_tset *set) {
  if (H5Lexists(d->file, group, H5P_DEFAULT) <= 0) return QC_OK;
  hid_t g = H5Gopen2(d->file, group, H5P_DEFAULT);
  if (g < 0) return qc_err("dump '%s': '%s' is not a group", d->path, group);
  iter_ctx c = {.d = d, .group = group, .set = set};
  herr_t st = H5Literate(g, H5_INDEX_NAME, H5_ITER_INC, NULL, iter_cb, &c);
  H5Gclose(g);
  if (c.rc) return c.rc;
  if (st < 0) return qc_err("dump '%s': cannot list '%s'", d->path, group);
  return QC_OK;
}

static herr_t names_cb(hid_t g, const char *name, const H5L_info_t *info, void *op) {
  (void)g; (void)info;
  iter_ctx *c = op;
  if (c->nnames == c->capnames) {
    int cap = c->capnames ? 2 * c->capnames : 8;
    void *nv = realloc(c->names, (size_t)cap * sizeof *c->names);
    if (!nv) { c->rc = qc_err_sys("out of memory"); return -1; }
    c->names = nv;
    c->capnames = cap;
  }
  snprintf(c->names[c->nnames++], QC_NAMELEN, "%s", name);
  return 0;
}

int qc_dump_load_module(qc_dump *d, const char *path, int with_grads, qc_module *m, char *contract_json,
                        size_t contract_len) {
  static const char *roles[] = {"inputs", "params", "saved", "outputs", "grad_out"};
  memset(m, 0, sizeof *m);
  snprintf(m->path, sizeof m->path, "%s", path);
  if (contract_json) contract_json[0] = 0;
  if (H5Lexists(d->file, path, H5P_DEFAULT) <= 0)
    return qc_err("dump '%s': module group '%s' is missing", d->path, path);
  if (contract_json) qc_dump_get_attr(d, path, "contract", contract_json, contract_len);
  qc_tset *sets[] = {&m->inputs, &m->params, &m->saved, &m->outputs, &m->grad_out};
  char g[QC_PATHLEN * 2];
  int rc = QC_OK;
  for (int i = 0; i < 5; i++) {
    snprintf(g, sizeof g, "%s/%s", path, roles[i]);
    if ((rc = load_role(d, g, sets[i]))) goto fail;
  }
  if (!with_grads) return QC_OK;
  m->cand = qc_calloc((size_t)(m->grad_out.n ? m->grad_out.n : 1), sizeof *m->cand, "candidate gradients");
  if (!m->cand) { rc = QC_ESYS; goto fail; }
  for (int i = 0; i < m->grad_out.n; i++) {
    snprintf(g, sizeof g, "%s/grads/%s", path, m->grad_out.t[i].name);
    if ((rc = load_role(d, g, &m->cand[i]))) goto fail;
  }
  /* a grads/<name> without a matching grad_out/<name> is a schema error */
  snprintf(g, sizeof g, "%s/grads", path);
  if (H5Lexists(d->file, g, H5P_DEFAULT) > 0) {
    hid_t gg = H5Gopen2(d->file, g, H5P_DEFAULT);
    if (gg < 0) { rc = qc_err("dump '%s': '%s' is not a group", d->path, g); goto fail; }
    iter_ctx c = {.d = d};
    H5Literate(gg, H5_INDEX_NAME, H5_ITER_INC, NULL, names_cb, &c);
    H5Gclose(gg);
    if (c.rc) { free(c.names); rc = c.rc; goto fail; }
    for (int i = 0; i < c.nnames; i++)
      if (!qc_tset_get(&m->grad_out, c.names[i])) {
        rc = qc_err("dump '%s': '%s/%s' has no matching upstream gradient '%s/grad_out/%s'", d->path, g, c.names[i],
                    path, c.names[i]);
        break;
      }
    free(c.names);
    if (rc) goto fail;
  }
  return QC_OK;
fail:
  qc_module_free(m);
  return rc;
}

/* ---- writing ------------------------------------------------------------------ */

static int write_str_attr(hid_t obj, const char *name, const char *value) {
  hid_t t = H5Tcopy(H5T_C_S1);
  hid_t sp = H5Screate(H5S_SCALAR);
  int ok = t >= 0 && sp >= 0 && H5Tset_size(t, H5T_VARIABLE) >= 0 && H5Tset_cset(t, H5T_CSET_UTF8) >= 0;
  if (ok && H5Aexists(obj, name) > 0) ok = H5Adelete(obj, name) >= 0;
  hid_t a = ok ? H5Acreate2(obj, name, t, sp, H5P_DEFAULT, H5P_DEFAULT) : -1;
  ok = a >= 0 && H5Awrite(a, t, &value) >= 0;
  if (a >= 0) H5Aclose(a);
  if (sp >= 0) H5Sclose(sp);
  if (t >= 0) H5Tclose(t);
  return ok ? QC_OK : QC_EINPUT;
}

/* Open group `path`, creating it and its parents if needed. */
static hid_t ensure_group(hid_t file, const char *path) {
  if (strcmp(path, "/") == 0 || path[0] == 0) return H5Gopen2(file, "/", H5P_DEFAULT);
  if (H5Lexists(file, path, H5P_DEFAULT) > 0) return H5Gopen2(file, path, H5P_DEFAULT);
  hid_t lcpl = H5Pcreate(H5P_LINK_CREATE);
  if (lcpl < 0) return -1;
  H5Pset_create_intermediate_group(lcpl, 1);
  hid_t g = H5Gcreate2(file, path, lcpl, H5P_DEFAULT, H5P_DEFAULT);
  H5Pclose(lcpl);
  return g;
}

int qc_dump_set_attr(qc_dump *d, const char *group, const char *name, const char *value) {
  hid_t g = ensure_group(d->file, group);
  if (g < 0) return qc_err("dump '%s': cannot create group '%s'", d->path, group);
  int rc = write_str_attr(g, name, value);
  H5Gclose(g);
  if (rc) return qc_err("dump '%s': cannot write attribute '%s' on '%s'", d->path, name, group);
  return QC_OK;
}

int qc_dump_write(qc_dump *d, const char *dset, const qc_tensor *t) {
  hid_t ftype, mtype;
  switch (t->dtype) {
    case QC_F64: ftype = H5T_IEEE_F64LE; mtype = H5T_NATIVE_DOUBLE; break;
    case QC_F32: ftype = H5T_IEEE_F32LE; mtype = H5T_NATIVE_FLOAT; break;
    case QC_F16: ftype = mtype = -1; break; /* made below: IEEE binary16 */
    case QC_BF16: ftype = H5T_STD_U16LE; mtype = H5T_NATIVE_UINT16; break;
    case QC_I32: ftype = H5T_STD_I32LE; mtype = H5T_NATIVE_INT32; break;
    case QC_I64: ftype = H5T_STD_I64LE; mtype = H5T_NATIVE_INT64; break;
    default: ftype = H5T_STD_U8LE; mtype = H5T_NATIVE_UINT8; break;
  }
  char parent[QC_PATHLEN * 2];
  snprintf(parent, sizeof parent, "%s", dset);
  char *slash = strrchr(parent, '/');
  if (slash && slash != parent) *slash = 0; else snprintf(parent, sizeof parent, "/");
  hid_t g = ensure_group(d->file, parent);
  if (g < 0) return qc_err("dump '%s': cannot create group '%s'", d->path, parent);
  H5Gclose(g);
  hid_t f16 = -1;
  if (t->dtype == QC_F16) {
    f16 = H5Tcopy(H5T_IEEE_F32LE);
    if (f16 < 0 || H5Tset_fields(f16, 15, 10, 5, 0, 10) < 0 || H5Tset_size(f16, 2) < 0 || H5Tset_ebias(f16, 15) < 0) {
      if (f16 >= 0) H5Tclose(f16);
      return qc_err("dump '%s': cannot make a float16 type for '%s'", d->path, dset);
    }
    ftype = mtype = f16;
  }
  hsize_t dims[QC_MAXDIM];
  for (int i = 0; i < t->ndim; i++) dims[i] = (hsize_t)t->shape[i];
  hid_t sp = t->ndim ? H5Screate_simple(t->ndim, dims, NULL) : H5Screate(H5S_SCALAR);
  hid_t ds = sp >= 0 ? H5Dcreate2(d->file, dset, ftype, sp, H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT) : -1;
  int ok = ds >= 0 && (t->nbytes == 0 || H5Dwrite(ds, mtype, H5S_ALL, H5S_ALL, H5P_DEFAULT, t->data) >= 0);
  if (ok && t->dtype != QC_F64 && t->dtype != QC_F32 && t->dtype != QC_F16 && t->dtype != QC_I32 &&
      t->dtype != QC_I64 && t->dtype != QC_U8)
    ok = write_str_attr(ds, "dtype", qc_dtype_name(t->dtype)) == QC_OK;
  if (ds >= 0) H5Dclose(ds);
  if (sp >= 0) H5Sclose(sp);
  if (f16 >= 0) H5Tclose(f16);
  if (!ok) return qc_err("dump '%s': cannot write dataset '%s'", d->path, dset);
  return QC_OK;
}
