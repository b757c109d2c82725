/* dump.c: HDF5 dumps (see dump.h): open, create, close, attributes, the
 * module groups of a file and a whole module loaded. Datasets are read in
 * dump_read.c, written in dump_write.c. Every HDF5 call's status is checked;
 * HDF5's automatic error printing is turned off once, and failures become a
 * single message naming the file and the object. */
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

void qc_dump_silence(void) {
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
int qc_dump_str_attr(hid_t obj, const char *name, char *buf, size_t n) {
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
  qc_dump_silence();
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
  qc_dump_silence();
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
  int has = qc_dump_str_attr(g, "class", cls, sizeof cls) == QC_OK;
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
