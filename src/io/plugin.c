/* plugin.c: loading and calling a plugin candidate (see plugin.h). */
#include "io/plugin.h"

#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "qatcheck_plugin.h"
#include "core/file.h"
#include "core/qc.h"

struct qc_plugin {
  void *lib;
  qatcheck_vjp_fn fn;
  char path[1024], symbol[128];
};

int qc_plugin_open(const char *path, const char *symbol, qc_plugin **out) {
  *out = NULL;
  int fd;
  int64_t size;
  int rc = qc_open_regular(path, "plugin", &fd, &size); /* a FIFO would block dlopen */
  if (rc) return rc;
  close(fd);
  void *lib = dlopen(path, RTLD_NOW | RTLD_LOCAL);
  if (!lib) {
    const char *e = dlerror();
    return qc_err("plugin '%s': cannot load: %s", path, e ? e : "unknown reason");
  }
  dlerror();
  void *sym = dlsym(lib, symbol);
  if (!sym) {
    dlclose(lib);
    return qc_err("plugin '%s': symbol '%s' not found", path, symbol);
  }
  qc_plugin *p = qc_calloc(1, sizeof *p, "plugin handle");
  if (!p) { dlclose(lib); return QC_ESYS; }
  p->lib = lib;
  memcpy(&p->fn, &sym, sizeof p->fn);
  snprintf(p->path, sizeof p->path, "%s", path);
  snprintf(p->symbol, sizeof p->symbol, "%s", symbol);
  *out = p;
  return QC_OK;
}

void qc_plugin_close(qc_plugin *p) {
  if (!p) return;
  dlclose(p->lib);
  free(p);
}

typedef struct {
  qc_tset *grads;
  qc_plugin *p;
  int rc;
} emit_host;

/* Copy one emitted gradient into the host's set. */
static int emit_cb(void *host, const char *name, int dtype, int ndim, const int64_t *shape, const void *data) {
  emit_host *h = host;
  if (!name || !name[0] || strlen(name) >= QC_NAMELEN) { h->rc = qc_err("plugin '%s': emitted a gradient with a bad name", h->p->path); return 1; }
  if (dtype < 0 || dtype >= QC_DTYPE_COUNT) {
    h->rc = qc_err("plugin '%s': gradient '%s': unknown dtype %d", h->p->path, name, dtype);
    return 1;
  }
  if (ndim < 0 || ndim > QC_MAXDIM || (ndim > 0 && !shape) || !data) {
    h->rc = qc_err("plugin '%s': gradient '%s': bad rank, shape or data", h->p->path, name);
    return 1;
  }
  qc_tensor t;
  int rc = qc_tensor_alloc(&t, name, (qc_dtype)dtype, ndim, shape);
  if (rc) { h->rc = rc; return 1; }
  memcpy(t.data, data, t.nbytes);
  if ((rc = qc_tset_add(h->grads, &t))) { qc_tensor_free(&t); h->rc = rc; return 1; }
  return 0;
}

/* Views of a tensor set as the ABI's tensors (pointing into the set). */
static qcp_tensor *views(const qc_tset *s) {
  qcp_tensor *v = calloc((size_t)(s->n ? s->n : 1), sizeof *v);
  if (!v) return NULL;
  for (int i = 0; i < s->n; i++) {
    v[i].name = s->t[i].name;
    v[i].dtype = (int)s->t[i].dtype;
    v[i].ndim = s->t[i].ndim;
    v[i].shape = s->t[i].shape;
    v[i].data = s->t[i].data;
  }
  return v;
}

int qc_plugin_vjp(qc_plugin *p, const qc_module *m, const qc_tensor *dy, qc_tset *grads) {
  char contract[2048], err[512] = "";
  qc_contract_json(&m->contract, contract, sizeof contract);
  qcp_tensor *in = views(&m->inputs), *pa = views(&m->params), *sv = views(&m->saved);
  qcp_tensor d = {dy->name, (int)dy->dtype, dy->ndim, dy->shape, dy->data};
  emit_host h = {grads, p, QC_OK};
  int rc = QC_OK;
  if (!in || !pa || !sv) { rc = qc_err_sys("out of memory calling plugin '%s'", p->path); goto done; }
  qcp_call call = {QATCHECK_PLUGIN_ABI, m->cls ? m->cls->name : "", m->path, contract, in, m->inputs.n, pa,
                   m->params.n, sv, m->saved.n, &d, emit_cb, &h, err, sizeof err};
  int prc = p->fn(&call);
  if (h.rc) { rc = h.rc; goto done; }
  if (prc != 0) {
    err[sizeof err - 1] = 0;
    rc = qc_err("plugin '%s' symbol '%s' failed on '%s': %s", p->path, p->symbol, m->path, err[0] ? err : "no message");
  }
done:
  free(in); free(pa); free(sv);
  return rc;
}
