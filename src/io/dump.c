/* dump.c: HDF5 dumps (see dump.h): open (through the sandbox of
 * dump_box.c: the file's structure comes from the map its child sent),
 * create, close, the module groups of a file and a whole module loaded.
 * Datasets are validated and read in dump_read.c, written in
 * dump_write.c. */
#include "io/dump.h"

#include <errno.h>
#include <hdf5.h>
#include <regex.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "core/file.h"
#include "core/pattern.h"
#include "core/qc.h"
#include "io/dump_priv.h"

const char *qc_dump_path(const qc_dump *d) { return d->path; }

int qc_dump_open_map(const char *path, qc_dump **out) {
  *out = NULL;
  if (strlen(path) >= sizeof ((qc_dump *)0)->path)
    return qc_err("dump '%.60s...': path longer than %zu characters", path, sizeof ((qc_dump *)0)->path - 1);
  int fd;
  int64_t size;
  int rc = qc_open_regular(path, "dump", &fd, &size);
  if (rc) return rc;
  if ((rc = qc_refuse_gzip_fd("dump", path, fd))) { close(fd); return rc; }
  qc_dump *d = qc_calloc(1, sizeof *d, "dump handle");
  if (!d) { close(fd); return QC_ESYS; }
  d->file = -1;
  d->fd = fd;
  d->size = size;
  snprintf(d->path, sizeof d->path, "%s", path);
  if ((rc = qc_box_start(path, fd, size, &d->box, &d->map))) goto fail;
  /* direct reads take HDF5's addresses as file offsets: only without a userblock */
  d->direct = d->map.userblock == 0;
  *out = d;
  return QC_OK;
fail:
  qc_dump_close(d);
  return rc;
}

int qc_dump_open(const char *path, qc_dump **out) {
  qc_dump *d = NULL;
  int rc = qc_dump_open_map(path, &d);
  if (rc) return rc;
  const qc_h5attr *a = qc_h5obj_attr(qc_h5map_find(&d->map, "/"), "qatcheck_dump");
  if (!a || a->kind != QC_H5A_INT) {
    rc = qc_err("dump '%s': root attribute 'qatcheck_dump' is %s: expected the integer 1", path,
                a ? "not a single integer" : "missing");
    qc_hint("set it with h5py: f.attrs['qatcheck_dump'] = 1");
    goto fail;
  }
  if (a->ival != 1) {
    rc = qc_err("dump '%s': root attribute 'qatcheck_dump' is %lld: expected 1", path, a->ival);
    goto fail;
  }
  *out = d;
  return QC_OK;
fail:
  qc_dump_close(d);
  return rc;
}

int qc_dump_create(const char *path, qc_dump **out) {
  qc_dump_silence();
  *out = NULL;
  if (strlen(path) >= sizeof ((qc_dump *)0)->path)
    return qc_err("dump '%.60s...': path longer than %zu characters", path, sizeof ((qc_dump *)0)->path - 1);
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
  qc_box_stop(d->box);
  qc_h5map_free(&d->map);
  if (d->fd >= 0) close(d->fd);
  free(d);
}

/* ---- module discovery ---------------------------------------------------- */

int qc_dump_modules(qc_dump *d, const char *regex, qc_dump_entry **out, int *n) {
  regex_t re;
  int have_re = 0, rc = QC_OK, cap = 0;
  *out = NULL;
  *n = 0;
  for (int i = 0; i < d->map.n; i++)
    if (d->map.o[i].type == QC_H5O_EXTERNAL) {
      qc_err("dump '%s': '%s' is an external link: module groups in other files are not followed", d->path,
             d->map.o[i].path);
      qc_hint("copy the linked groups into the dump (h5py: f.copy(...)), or audit the other file itself");
      return QC_EINPUT;
    }
  if (regex && regex[0]) {
    if ((rc = qc_pattern_compile(&re, regex, "modules regex"))) return rc;
    have_re = 1;
  }
  qc_dump_entry *v = NULL;
  for (int i = 0; i < d->map.n && !rc; i++) { /* walk order: each group's links by name, depth first */
    const qc_h5obj *o = &d->map.o[i];
    const qc_h5attr *a = o->type == QC_H5O_GROUP && strcmp(o->path, "/") != 0 ? qc_h5obj_attr(o, "class") : NULL;
    if (!a || (have_re && regexec(&re, o->path, 0, NULL, 0) != 0)) continue;
    if (a->kind != QC_H5A_STR) {
      rc = qc_err("dump '%s': group '%s': attribute 'class' is %s: expected a single string", d->path, o->path,
                  a->kind == QC_H5A_BAD ? "unreadable" : "not a single string");
      break;
    }
    if (strlen(o->path) >= sizeof v->path) {
      rc = qc_err("dump '%s': module group '%.80s...': path longer than %zu characters", d->path, o->path, sizeof v->path - 1);
      break;
    }
    if (*n == cap) {
      cap = cap ? 2 * cap : 16;
      qc_dump_entry *nv = realloc(v, (size_t)cap * sizeof *nv);
      if (!nv) { rc = qc_err_sys("out of memory listing modules"); break; }
      v = nv;
    }
    snprintf(v[*n].path, sizeof v[*n].path, "%s", o->path);
    /* a class name that does not fit cannot be a known class: keep it recognizably cut */
    if (strlen(a->str) >= sizeof v[*n].cls) snprintf(v[*n].cls, sizeof v[*n].cls, "%.56s...", a->str);
    else snprintf(v[*n].cls, sizeof v[*n].cls, "%s", a->str);
    (*n)++;
  }
  if (have_re) regfree(&re);
  if (rc) { free(v); *n = 0; return rc; }
  *out = v;
  return QC_OK;
}

/* 1 when group `path` of d's map has a child group `name`. */
static int has_child_group(const qc_dump *d, const char *path, const char *name) {
  char c[4096 + 16];
  snprintf(c, sizeof c, "%s/%s", strcmp(path, "/") == 0 ? "" : path, name);
  const qc_h5obj *o = qc_h5map_find(&d->map, c);
  return o && o->type == QC_H5O_GROUP;
}

/* 1 when `path` lies under /qatcheck_mode or under a module group (a
 * group with a `class` attribute). */
static int under_known(const qc_dump *d, const char *path) {
  char p[4096];
  if (strcmp(path, "/qatcheck_mode") == 0 || strncmp(path, "/qatcheck_mode/", 15) == 0) return 1;
  snprintf(p, sizeof p, "%s", path);
  for (char *s = strrchr(p, '/'); s && s > p; s = strrchr(p, '/')) {
    *s = 0;
    const qc_h5obj *o = qc_h5map_find(&d->map, p);
    if (o && o->type == QC_H5O_GROUP && qc_h5obj_attr(o, "class")) return 1;
  }
  return 0;
}

int qc_dump_unclassed(qc_dump *d, const char *regex, qc_dump_entry **out, int *n) {
  regex_t re;
  int have_re = 0, rc = QC_OK, cap = 0;
  qc_dump_entry *v = NULL;
  *out = NULL;
  *n = 0;
  if (regex && regex[0]) {
    if (regcomp(&re, regex, REG_EXTENDED | REG_NOSUB)) return qc_err("modules regex '%s': not a valid regex", regex);
    have_re = 1;
  }
  for (int i = 0; i < d->map.n && !rc; i++) { /* each group's inputs/ names it, in walk order */
    const qc_h5obj *in = &d->map.o[i];
    const char *base = strrchr(in->path, '/');
    if (in->type != QC_H5O_GROUP || !base || strcmp(base + 1, "inputs") != 0) continue;
    char path[4096];
    snprintf(path, sizeof path, "%.*s", base == in->path ? 1 : (int)(base - in->path), in->path);
    const qc_h5obj *g = qc_h5map_find(&d->map, path);
    if (!g || g->type != QC_H5O_GROUP || qc_h5obj_attr(g, "class")) continue;
    if (!has_child_group(d, path, "grad_out") && !has_child_group(d, path, "grads")) continue;
    if (under_known(d, path) || (have_re && regexec(&re, path, 0, NULL, 0) != 0)) continue;
    if (*n == cap) {
      cap = cap ? 2 * cap : 4;
      qc_dump_entry *nv = realloc(v, (size_t)cap * sizeof *nv);
      if (!nv) { rc = qc_err_sys("out of memory listing groups"); break; }
      v = nv;
    }
    snprintf(v[*n].path, sizeof v[*n].path, "%s", path);
    v[*n].cls[0] = 0;
    (*n)++;
  }
  if (have_re) regfree(&re);
  if (rc) { free(v); *n = 0; return rc; }
  *out = v;
  return QC_OK;
}

/* ---- module loading -------------------------------------------------------- */

typedef struct role_ctx {
  qc_dump *d;
  const char *group;
  qc_tset *set;        /* NULL: validate only */
  int rc;
} role_ctx;

static int role_item(void *arg, const qc_h5obj *o) {
  role_ctx *c = arg;
  if (o->type != QC_H5O_DATASET) {
    c->rc = qc_err("dump '%s': '%s' is %s: expected a dataset", c->d->path, o->path,
                   o->type == QC_H5O_GROUP ? "a group" : "a link or object that is not a dataset");
    return 1;
  }
  if (!c->set) {
    qc_tensor shape_only;
    c->rc = qc_dump_info(c->d, o->path, &shape_only);
    return c->rc != QC_OK;
  }
  qc_tensor t;
  if ((c->rc = qc_dump_read(c->d, o->path, &t))) return 1;
  if ((c->rc = qc_tset_add(c->set, &t))) { qc_tensor_free(&t); return 1; }
  return 0;
}

/* Every dataset directly under `group` (absent group: nothing): validated
 * only (set NULL), or read into set. */
static int load_role(qc_dump *d, const char *group, qc_tset *set) {
  const qc_h5obj *g = qc_h5map_find(&d->map, group);
  if (!g) return QC_OK;
  if (g->type != QC_H5O_GROUP) return qc_err("dump '%s': '%s' is not a group", d->path, group);
  role_ctx c = {.d = d, .group = group, .set = set};
  qc_h5map_children(&d->map, group, role_item, &c);
  return c.rc;
}

typedef struct grads_ctx {
  qc_dump *d;
  const qc_module *m;
  const char *path;
  int rc;
} grads_ctx;

/* a grads/<name> without a matching grad_out/<name> is a schema error */
static int grads_item(void *arg, const qc_h5obj *o) {
  grads_ctx *c = arg;
  const char *name = strrchr(o->path, '/') + 1;
  if (qc_tset_get(&c->m->grad_out, name)) return 0;
  c->rc = qc_err("dump '%s': '%s' has no matching upstream gradient '%s/grad_out/%s'", c->d->path, o->path, c->path, name);
  return 1;
}

/* validation pass: the datasets of each grads/<dY>/ group */
static int grads_check(void *arg, const qc_h5obj *o) {
  grads_ctx *c = arg;
  if (o->type == QC_H5O_GROUP) c->rc = load_role(c->d, o->path, NULL);
  return c->rc != QC_OK;
}

typedef struct kids_ctx {
  qc_dump *d;
  const char *path;
  int rc;
} kids_ctx;

/* A module group's child: a role group, or a module group of its own (a
 * nested module, read on its own); anything else would be ignored. */
static int kid_item(void *arg, const qc_h5obj *o) {
  static const char *roles[] = {"inputs", "params", "saved", "outputs", "grad_out", "grads"};
  kids_ctx *c = arg;
  const char *name = strrchr(o->path, '/') + 1;
  for (int i = 0; i < 6; i++)
    if (strcmp(name, roles[i]) == 0) return 0;
  if (o->type == QC_H5O_GROUP && qc_h5obj_attr(o, "class")) return 0;
  c->rc = qc_err("dump '%s': module '%s': '%s' is not one of a module group's roles (inputs/, params/, saved/, outputs/, "
                 "grad_out/, grads/) nor a module group: it would be ignored",
                 c->d->path, c->path, name);
  return 1;
}

/* Module group g's attributes and children are ones the reader models:
 * QC_OK, or QC_EINPUT naming the first other one. */
static int check_group(qc_dump *d, const qc_h5obj *g, const char *path) {
  static const char *attrs[] = {"class", "contract", "not_captured", "parallel", "grad_reduce", "autocast", "cpu_bf16_gemm_acc"};
  for (int i = 0; i < g->nattr; i++) {
    int known = 0;
    for (size_t j = 0; j < sizeof attrs / sizeof attrs[0]; j++) known |= strcmp(g->attr[i].name, attrs[j]) == 0;
    if (!known)
      return qc_err("dump '%s': module '%s': attribute '%s' is not one qatcheck reads (class, contract, not_captured, "
                    "parallel, grad_reduce, autocast, cpu_bf16_gemm_acc): it would be ignored; put settings in the 'contract' "
                    "attribute",
                    d->path, path, g->attr[i].name);
    if (strcmp(g->attr[i].name, "cpu_bf16_gemm_acc") == 0 && g->attr[i].kind != QC_H5A_STR) /* else read as absent */
      return qc_err("dump '%s': module '%s': attribute 'cpu_bf16_gemm_acc' is not a string: expected \"float32\" or "
                    "\"bfloat16\"",
                    d->path, path);
  }
  kids_ctx c = {.d = d, .path = path};
  qc_h5map_children(&d->map, path, kid_item, &c);
  return c.rc;
}

/* The roles of module `path` (and grads/<dY>/ when with_grads): each
 * dataset validated (set NULL: sets unused) or read. */
static int load_all(qc_dump *d, const char *path, int with_grads, qc_module *m, int validate) {
  static const char *roles[] = {"inputs", "params", "saved", "outputs", "grad_out"};
  qc_tset *sets[] = {&m->inputs, &m->params, &m->saved, &m->outputs, &m->grad_out};
  char g[QC_PATHLEN * 2 + QC_NAMELEN];
  int rc;
  for (int i = 0; i < 5; i++) {
    snprintf(g, sizeof g, "%s/%s", path, roles[i]);
    if ((rc = load_role(d, g, validate ? NULL : sets[i]))) return rc;
  }
  if (!with_grads) return QC_OK;
  snprintf(g, sizeof g, "%s/grads", path);
  const qc_h5obj *gg = qc_h5map_find(&d->map, g);
  if (gg && gg->type != QC_H5O_GROUP) return qc_err("dump '%s': '%s' is not a group", d->path, g);
  if (validate) {
    grads_ctx c = {.d = d, .m = m, .path = path};
    if (gg) qc_h5map_children(&d->map, g, grads_check, &c);
    return c.rc;
  }
  m->cand = qc_calloc((size_t)(m->grad_out.n ? m->grad_out.n : 1), sizeof *m->cand, "candidate gradients");
  if (!m->cand) return QC_ESYS;
  for (int i = 0; i < m->grad_out.n; i++) {
    snprintf(g, sizeof g, "%s/grads/%s", path, m->grad_out.t[i].name);
    if ((rc = load_role(d, g, &m->cand[i]))) return rc;
  }
  if (gg) {
    grads_ctx c = {.d = d, .m = m, .path = path};
    qc_h5map_children(&d->map, gg->path, grads_item, &c);
    if (c.rc) return c.rc;
  }
  return QC_OK;
}

int qc_dump_load_module(qc_dump *d, const char *path, int with_grads, qc_module *m, char *contract_json,
                        size_t contract_len) {
  memset(m, 0, sizeof *m);
  if (contract_json && contract_len) contract_json[0] = 0;
  if (strlen(path) >= sizeof m->path) return qc_err("dump '%s': module path '%.60s...' is too long", d->path, path);
  snprintf(m->path, sizeof m->path, "%s", path);
  const qc_h5obj *g = d->writable ? NULL : qc_h5map_find(&d->map, path);
  if (!g || g->type != QC_H5O_GROUP) return qc_err("dump '%s': module group '%s' is missing", d->path, path);
  const qc_h5attr *ca = qc_h5obj_attr(g, "contract");
  if (contract_json && contract_len && ca) {
    if (ca->kind != QC_H5A_STR) return qc_err("dump '%s': module '%s': attribute 'contract' is not a single string", d->path, path);
    if (strlen(ca->str) >= contract_len)
      return qc_err("dump '%s': module '%s': attribute 'contract' is longer than %zu characters", d->path, path, contract_len - 1);
    snprintf(contract_json, contract_len, "%s", ca->str);
  }
  /* every dataset's type, shape and storage checked against the file
   * before the first byte of tensor data is read */
  int rc = check_group(d, g, path);
  if (!rc) rc = load_all(d, path, with_grads, m, 1);
  if (!rc) rc = load_all(d, path, with_grads, m, 0);
  if (rc) qc_module_free(m);
  return rc;
}
