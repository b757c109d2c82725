/* dump_write.c: writing dumps (see dump.h): datasets with their `dtype`
 * attribute, string attributes, intermediate groups. */
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
