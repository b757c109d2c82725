/* stepdump.c: the one-step update dump (docs/layer3.md): an HDF5 file
 * with the root attribute qatcheck_step = 1 and one group per arm holding,
 * per parameter name (a path), before/, grad/, state/exp_avg/,
 * state/exp_avg_sq/ (AdamW), state/momentum_buffer/ (SGD with momentum),
 * after/ and after_master/, and the optimizer's settings as attributes.
 * The file is read through the dump reader's sandbox (dump_box.c: libhdf5
 * parses it in a child process, this one reads the map it sent) and its
 * datasets through dump_read.c (element types, bfloat16, shapes, storage
 * checked against the file). */
#include "io/stepdump.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/qc.h"
#include "io/dump_priv.h"
#include "numerics/decode.h"

/* Open a step dump (through the dump reader's sandbox: libhdf5 never
 * parses the file in this process): root attribute qatcheck_step = 1. */
static int step_open(const char *path, qc_dump **out) {
  qc_dump *d = NULL;
  *out = NULL;
  int rc = qc_dump_open_map(path, &d);
  if (rc) return rc;
  const qc_h5attr *a = qc_h5obj_attr(qc_h5map_find(&d->map, "/"), "qatcheck_step");
  int ok = a && a->kind == QC_H5A_INT;
  if (!ok || a->ival != 1) {
    qc_dump_close(d);
    qc_err("step dump '%s': root attribute 'qatcheck_step' is %s: expected the integer 1", path, ok ? "not 1" : "missing");
    qc_hint("a step dump is written by scripts/proxy_sft.py or h5py: f.attrs['qatcheck_step'] = 1");
    return QC_EINPUT;
  }
  *out = d;
  return QC_OK;
}

/* A numeric attribute of group grp (integer or float, one element).
 * *found 0 when absent. */
static int num_attr(qc_dump *d, const qc_h5obj *g, const char *grp, const char *name, double *v, int *found) {
  *found = 0;
  const qc_h5attr *a = qc_h5obj_attr(g, name);
  if (!a) return QC_OK;
  *v = a->kind == QC_H5A_INT ? (double)a->ival : a->dval;
  if ((a->kind != QC_H5A_INT && a->kind != QC_H5A_FLOAT) || !isfinite(*v))
    return qc_err("step dump '%s': group '%s': attribute '%s' must be one finite number", d->path, grp, name);
  *found = 1;
  return QC_OK;
}

/* The `frozen` attribute: an array of strings (h5py writes a list so), a
 * single name, or an empty array of any type. */
static int frozen_attr(qc_dump *d, const qc_h5obj *g, const char *grp, qc_step_arm *arm) {
  const qc_h5attr *a = qc_h5obj_attr(g, "frozen");
  if (!a) return QC_OK;
  const char *one[1];
  const char *const *s = (const char *const *)a->strs;
  int n = a->nstr;
  if (a->kind == QC_H5A_STR) {
    one[0] = a->str;
    s = one;
    n = 1;
  } else if (a->kind != QC_H5A_STRS) {
    return qc_err("step dump '%s': group '%s': attribute 'frozen' must be a list of parameter names (h5py: a list of str)", d->path, grp);
  }
  if (n && !(arm->frozen = calloc((size_t)n, sizeof *arm->frozen))) return qc_err_sys("out of memory reading 'frozen'");
  for (int i = 0; i < n; i++) {
    if (!s[i][0] || strlen(s[i]) >= QC_PATHLEN) return qc_err("step dump '%s': group '%s': a frozen name is empty or too long", d->path, grp);
    snprintf(arm->frozen[arm->nfrozen++], QC_PATHLEN, "%s", s[i]);
  }
  return QC_OK;
}

typedef struct {
  char (*v)[QC_PATHLEN];
  int n, cap, rc;
} names;

/* Append name to nm (QC_ESYS / QC_EINPUT, message set, on failure). */
static int add_name(names *nm, const char *name) {
  if (strlen(name) >= QC_PATHLEN) return qc_err("a parameter name longer than %d characters", QC_PATHLEN - 1);
  if (nm->n == nm->cap) {
    int cap = nm->cap ? 2 * nm->cap : 64;
    void *nv = realloc(nm->v, (size_t)cap * sizeof *nm->v);
    if (!nv) return qc_err_sys("out of memory listing parameters");
    nm->v = nv;
    nm->cap = cap;
  }
  snprintf(nm->v[nm->n++], QC_PATHLEN, "%s", name);
  return QC_OK;
}

static int cmp_name(const void *a, const void *b) { return strcmp(a, b); }

/* Every dataset below group `path` at any depth (names relative to it,
 * sorted); none when absent. */
static int list_datasets(qc_dump *d, const char *path, names *out) {
  memset(out, 0, sizeof *out);
  const qc_h5obj *g = qc_h5map_find(&d->map, path);
  if (!g) return QC_OK;
  if (g->type != QC_H5O_GROUP) return qc_err("step dump '%s': '%s' is not a group", d->path, path);
  size_t l = strlen(path);
  for (int i = 0; i < d->map.n; i++) {
    const qc_h5obj *o = &d->map.o[i];
    if (o->type != QC_H5O_DATASET || strncmp(o->path, path, l) != 0 || o->path[l] != '/') continue;
    int rc = add_name(out, o->path + l + 1);
    if (rc) return rc;
  }
  if (out->n) qsort(out->v, (size_t)out->n, sizeof *out->v, cmp_name);
  return QC_OK;
}

static int has_name(const names *nm, const char *s) {
  return nm->n && bsearch(s, nm->v, (size_t)nm->n, sizeof *nm->v, cmp_name) != NULL;
}

/* Read dataset <arm>/<role>/<param> as float64 (NULL when absent and
 * optional). Its shape must be the parameter's. */
static int read_f64(qc_dump *d, const char *arm, const char *role, qc_step_param *p, int required, double **out, char *dtype) {
  char ds[3 * QC_PATHLEN];
  *out = NULL;
  snprintf(ds, sizeof ds, "/%s/%s/%s", arm, role, p->name);
  if (!qc_dump_exists(d, ds)) {
    if (required) return qc_err("step dump '%s': parameter '%s' of arm '%s' has no '%s/%s'", d->path, p->name, arm, role, p->name);
    return QC_OK;
  }
  qc_tensor t = {0}, f = {0};
  int rc = qc_dump_read(d, ds, &t);
  if (rc) return rc;
  if (!qc_dtype_is_float(t.dtype) || t.dtype == QC_E2M1X2) rc = qc_err("step dump '%s': '%s' is %s: expected a floating-point type", d->path, ds, qc_dtype_name(t.dtype));
  else if (p->ndim >= 0 && (t.ndim != p->ndim || memcmp(t.shape, p->shape, sizeof(int64_t) * (size_t)t.ndim) != 0)) {
    char s1[96], s2[96];
    rc = qc_err("step dump '%s': '%s' is %s: expected %s, the shape of before/%s", d->path, ds, qc_shape_str(t.ndim, t.shape, s1, sizeof s1),
                qc_shape_str(p->ndim, p->shape, s2, sizeof s2), p->name);
  } else if (!(rc = qc_tensor_decode_f64(&t, &f))) {
    if (p->ndim < 0) {
      p->ndim = t.ndim;
      memcpy(p->shape, t.shape, sizeof p->shape);
      p->n = qc_shape_numel(t.ndim, t.shape);
    }
    if (dtype) snprintf(dtype, 24, "%s", qc_dtype_name(t.dtype));
    *out = f.data;
    f.data = NULL;
  }
  qc_tensor_free(&t);
  qc_tensor_free(&f);
  return rc;
}

static int read_arm(qc_dump *d, const char *grp, qc_step_arm *arm) {
  memset(arm, 0, sizeof *arm);
  snprintf(arm->name, sizeof arm->name, "%s", grp);
  snprintf(arm->file, sizeof arm->file, "%s", d->path);
  char gpath[QC_PATHLEN + 2];
  snprintf(gpath, sizeof gpath, "/%s", grp);
  const qc_h5obj *g = qc_h5map_find(&d->map, gpath);
  if (!g || g->type != QC_H5O_GROUP) return qc_err("step dump '%s': arm group '%s' cannot be opened", d->path, grp);
  const char *opt = "";
  int rc = QC_OK, f;
  double step = 0;
  const qc_h5attr *oa = qc_h5obj_attr(g, "optimizer");
  if (oa && oa->kind == QC_H5A_STR) opt = oa->str;
  if (strcmp(opt, "adamw") && strcmp(opt, "sgd")) {
    rc = qc_err("step dump '%s': group '%s': attribute 'optimizer' must be \"adamw\" or \"sgd\"", d->path, grp);
    goto done;
  }
  arm->opt = strcmp(opt, "sgd") == 0 ? QC_OPT_SGD : QC_OPT_ADAMW;
  struct { const char *name; double *v, def; int required; } at[] = {
      {"lr", &arm->lr, 0, 1},
      {"weight_decay", &arm->weight_decay, 0, 1},
      {"step", &step, 0, 1},
      {"beta1", &arm->beta1, 0.9, arm->opt == QC_OPT_ADAMW},
      {"beta2", &arm->beta2, 0.999, arm->opt == QC_OPT_ADAMW},
      {"eps", &arm->eps, 1e-8, arm->opt == QC_OPT_ADAMW},
      {"max_grad_norm", &arm->max_grad_norm, 0, 0},
      {"grad_scale", &arm->grad_scale, 1, 0},
      {"momentum", &arm->momentum, 0, 0},
  };
  for (size_t i = 0; i < sizeof at / sizeof at[0]; i++) {
    if ((rc = num_attr(d, g, grp, at[i].name, at[i].v, &f))) goto done;
    if (!f && at[i].required) { rc = qc_err("step dump '%s': group '%s': attribute '%s' is missing", d->path, grp, at[i].name); goto done; }
    if (!f) *at[i].v = at[i].def;
  }
  if (step < 0 || step != floor(step) || step > 1e15) { rc = qc_err("step dump '%s': group '%s': 'step' must be a count >= 0", d->path, grp); goto done; }
  arm->step = (int64_t)step;
  if (!(arm->grad_scale > 0)) { rc = qc_err("step dump '%s': group '%s': 'grad_scale' must be > 0", d->path, grp); goto done; }
  if (arm->max_grad_norm < 0 || arm->lr < 0 || arm->eps < 0) { rc = qc_err("step dump '%s': group '%s': lr, eps and max_grad_norm must be >= 0", d->path, grp); goto done; }
  if ((rc = frozen_attr(d, g, grp, arm))) goto done;
  /* the parameters: before/; every other role must name the same ones */
  char path[QC_PATHLEN + 64];
  names before, grads, after;
  memset(&grads, 0, sizeof grads);
  memset(&after, 0, sizeof after);
  snprintf(path, sizeof path, "/%s/before", grp);
  if ((rc = list_datasets(d, path, &before))) goto done;
  if (before.n == 0) { rc = qc_err("step dump '%s': arm '%s' has no parameters under before/", d->path, grp); free(before.v); goto done; }
  snprintf(path, sizeof path, "/%s/grad", grp);
  if (!(rc = list_datasets(d, path, &grads))) {
    snprintf(path, sizeof path, "/%s/after", grp);
    rc = list_datasets(d, path, &after);
  }
  for (int i = 0; !rc && i < after.n; i++)
    if (!has_name(&before, after.v[i]))
      rc = qc_err("step dump '%s': arm '%s': after/%s has no before/%s", d->path, grp, after.v[i], after.v[i]);
  for (int i = 0; !rc && i < grads.n; i++)
    if (!has_name(&before, grads.v[i])) {
      if (!arm->stray && !(arm->stray = calloc((size_t)grads.n, sizeof *arm->stray))) { rc = qc_err_sys("out of memory"); break; }
      snprintf(arm->stray[arm->nstray++], QC_PATHLEN, "%s", grads.v[i]);
    }
  if (!rc && !(arm->params = calloc((size_t)before.n, sizeof *arm->params))) rc = qc_err_sys("out of memory reading '%s'", d->path);
  for (int i = 0; !rc && i < before.n; i++) {
    qc_step_param *p = &arm->params[i];
    snprintf(p->name, sizeof p->name, "%s", before.v[i]);
    p->ndim = -1;
    arm->nparam = i + 1;
    int state_needed = arm->step > 0 && has_name(&grads, p->name);
    if ((rc = read_f64(d, grp, "before", p, 1, &p->before, NULL)) || (rc = read_f64(d, grp, "grad", p, 0, &p->grad, NULL)) ||
        (rc = read_f64(d, grp, "after", p, 1, &p->after, p->after_dtype)) ||
        (rc = read_f64(d, grp, "after_master", p, 0, &p->after_master, p->after_master_dtype)))
      break;
    if (arm->opt == QC_OPT_ADAMW) {
      if ((rc = read_f64(d, grp, "state/exp_avg", p, state_needed, &p->exp_avg, NULL)) ||
          (rc = read_f64(d, grp, "state/exp_avg_sq", p, state_needed, &p->exp_avg_sq, NULL)))
        break;
    } else if (arm->momentum > 0 && (rc = read_f64(d, grp, "state/momentum_buffer", p, state_needed, &p->momentum, NULL)))
      break;
  }
  free(before.v);
  free(grads.v);
  free(after.v);
done:
  if (rc) qc_step_arm_free(arm);
  return rc;
}

/* The top-level groups of the dump (qc_h5map_children's callback). */
static int group_cb(void *op, const qc_h5obj *o) {
  names *nm = op;
  return o->type == QC_H5O_GROUP && (nm->rc = add_name(nm, strrchr(o->path, '/') + 1)) != QC_OK;
}

int qc_step_dump_read(const char *path, const char *const *want, int nwant, qc_step_arm **arms, int *narm) {
  qc_dump *d = NULL;
  names groups = {0};
  int rc = step_open(path, &d);
  if (rc) return rc;
  qc_h5map_children(&d->map, "/", group_cb, &groups);
  rc = groups.rc;
  for (int i = 0; !rc && i < groups.n; i++) {
    int take = nwant == 0;
    for (int w = 0; w < nwant; w++) take |= strcmp(want[w], groups.v[i]) == 0;
    if (!take) continue;
    for (int j = 0; j < *narm; j++)
      if (strcmp((*arms)[j].name, groups.v[i]) == 0) {
        rc = qc_err("step dump '%s': arm group '%s' found twice: also in '%s'", path, groups.v[i], (*arms)[j].file);
        qc_hint("each arm comes from one dump: remove one, or name the arms to read with the case's 'arms'");
        break;
      }
    if (rc) break;
    qc_step_arm *nv = realloc(*arms, (size_t)(*narm + 1) * sizeof *nv);
    if (!nv) { rc = qc_err_sys("out of memory reading '%s'", path); break; }
    *arms = nv;
    if ((rc = read_arm(d, groups.v[i], &nv[*narm]))) break;
    (*narm)++;
  }
  free(groups.v);
  qc_dump_close(d);
  return rc;
}
