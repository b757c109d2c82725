/* tsource.c: the tensor sources (see tsource.h): an HDF5 dump and a
 * safetensors checkpoint behind one table of operations. */
#include "io/tsource.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/qc.h"
#include "io/dump.h"
#include "io/safetensors.h"

/* ---- an HDF5 dump: dataset paths ------------------------------------------ */

static int d_exists(const qc_tsrc *s, const char *name) { return qc_dump_exists(s->impl, name); }
static int d_info(const qc_tsrc *s, const char *name, qc_tensor *t) { return qc_dump_info(s->impl, name, t); }

static int d_locate(const qc_tsrc *s, const char *name, long long index, qc_tloc *loc) {
  qc_dump_loc l;
  int rc = qc_dump_locate(s->impl, name, index, &l);
  memset(loc, 0, sizeof *loc);
  if (rc) return rc;
  loc->dtype = l.dtype;
  loc->nbytes = l.nbytes;
  loc->offset = l.offset;
  return QC_OK;
}

static int d_pread(const qc_tsrc *s, const char *name, const qc_tloc *loc, void *buf) {
  qc_dump_loc l = {.dtype = loc->dtype, .nbytes = loc->nbytes, .offset = loc->offset};
  return qc_dump_pread(s->impl, name, &l, buf);
}

static int d_read_into(const qc_tsrc *s, const char *name, long long index, void *buf, size_t nbytes) {
  return qc_dump_read_into(s->impl, name, index, buf, nbytes);
}

static int d_list(const qc_tsrc *s, const char *group, char (**names)[QC_NAMELEN], int *n) {
  return qc_dump_list(s->impl, group, names, n);
}

static const qc_tsrc_ops g_dump_ops = {"hdf5 dump", d_exists, d_info, d_locate, d_pread, d_read_into, d_list};

void qc_tsrc_dump(qc_tsrc *s, qc_dump *d) {
  s->ops = &g_dump_ops;
  s->impl = d;
  s->path = qc_dump_path(d);
}

/* ---- a safetensors checkpoint: tensor names ---------------------------------- */

/* The tensor `name`, readable by qatcheck, or NULL with the error set. */
static const qc_st_tensor *st_get(const qc_tsrc *s, const char *name) {
  const qc_st_tensor *t = qc_st_find(s->impl, name);
  if (!t) {
    qc_err("checkpoint '%s': tensor '%s' is missing", s->path, name);
    return NULL;
  }
  if (t->dtype < 0) {
    qc_err("checkpoint '%s': tensor '%s' has dtype %s, which qatcheck does not read", s->path, name, t->st_dtype);
    return NULL;
  }
  return t;
}

static int s_exists(const qc_tsrc *s, const char *name) { return qc_st_find(s->impl, name) != NULL; }

static int s_info(const qc_tsrc *s, const char *name, qc_tensor *out) {
  const qc_st_tensor *t = st_get(s, name);
  memset(out, 0, sizeof *out);
  if (!t) return QC_EINPUT;
  const char *base = strrchr(name, '.');
  snprintf(out->name, sizeof out->name, "%s", base ? base + 1 : name);
  out->dtype = (qc_dtype)t->dtype;
  out->ndim = t->ndim;
  memcpy(out->shape, t->shape, sizeof out->shape);
  return QC_OK;
}

static int s_locate(const qc_tsrc *s, const char *name, long long index, qc_tloc *loc) {
  const qc_st_tensor *t = st_get(s, name);
  memset(loc, 0, sizeof *loc);
  if (!t) return QC_EINPUT;
  loc->dtype = (qc_dtype)t->dtype;
  loc->part = t->part;
  loc->offset = (long long)t->offset;
  loc->nbytes = (size_t)t->nbytes;
  if (index >= 0) {
    if (t->ndim < 1 || index >= t->shape[0])
      return qc_err("checkpoint '%s': tensor '%s': slice %lld is out of range", s->path, name, index);
    loc->nbytes = (size_t)(t->nbytes / (uint64_t)t->shape[0]);
    loc->offset += index * (long long)loc->nbytes;
  }
  return QC_OK;
}

static int s_pread(const qc_tsrc *s, const char *name, const qc_tloc *loc, void *buf) {
  if (loc->offset < 0) return qc_err("checkpoint '%s': tensor '%s': not located", s->path, name);
  return qc_st_pread(s->impl, loc->part, (uint64_t)loc->offset, buf, loc->nbytes, name);
}

static int s_read_into(const qc_tsrc *s, const char *name, long long index, void *buf, size_t nbytes) {
  const qc_st_tensor *t = st_get(s, name);
  return t ? qc_st_read(s->impl, t, index, buf, nbytes) : QC_EINPUT;
}

static int s_list(const qc_tsrc *s, const char *group, char (**names)[QC_NAMELEN], int *n) {
  const qc_st *st = s->impl;
  size_t gl = strlen(group);
  int cap = 0;
  *names = NULL;
  *n = 0;
  for (int i = 0; i < qc_st_count(st); i++) {
    const char *nm = qc_st_at(st, i)->name;
    if (strncmp(nm, group, gl) || nm[gl] != '/' || strchr(nm + gl + 1, '/')) continue;
    if (strlen(nm + gl + 1) >= QC_NAMELEN) continue;
    if (*n == cap) {
      cap = cap ? 2 * cap : 8;
      void *p = realloc(*names, (size_t)cap * sizeof **names);
      if (!p) { free(*names); *names = NULL; *n = 0; return qc_err_sys("out of memory listing tensors"); }
      *names = p;
    }
    snprintf((*names)[(*n)++], QC_NAMELEN, "%s", nm + gl + 1);
  }
  return QC_OK;
}

static const qc_tsrc_ops g_st_ops = {"safetensors checkpoint", s_exists, s_info, s_locate, s_pread, s_read_into, s_list};

void qc_tsrc_st(qc_tsrc *s, qc_st *st) {
  s->ops = &g_st_ops;
  s->impl = st;
  s->path = qc_st_path(st);
}

/* ---- dispatch ---------------------------------------------------------------- */

int qc_tsrc_exists(const qc_tsrc *s, const char *name) { return s->ops->exists(s, name); }
int qc_tsrc_info(const qc_tsrc *s, const char *name, qc_tensor *t) { return s->ops->info(s, name, t); }
int qc_tsrc_locate(const qc_tsrc *s, const char *name, long long index, qc_tloc *loc) {
  return s->ops->locate(s, name, index, loc);
}
int qc_tsrc_pread(const qc_tsrc *s, const char *name, const qc_tloc *loc, void *buf) { return s->ops->pread(s, name, loc, buf); }
int qc_tsrc_read_into(const qc_tsrc *s, const char *name, long long index, void *buf, size_t nbytes) {
  return s->ops->read_into(s, name, index, buf, nbytes);
}
int qc_tsrc_list(const qc_tsrc *s, const char *group, char (**names)[QC_NAMELEN], int *n) {
  return s->ops->list(s, group, names, n);
}
