/* stepdump.c: the one-step update dump (docs/layer3.md): an HDF5 file
 * with the root attribute qatcheck_step = 1 and one group per arm holding,
 * per parameter name (a path), before/, grad/, state/exp_avg/,
 * state/exp_avg_sq/ (AdamW), state/momentum_buffer/ (SGD with momentum),
 * after/ and after_master/, and the optimizer's settings as attributes.
 * Datasets are read through the dump reader (dump_read.c: element types,
 * bfloat16, shapes) on a handle opened here. */
#include "io/stepdump.h"

#include <hdf5.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/qc.h"
#include "io/dump_priv.h"
#include "numerics/decode.h"

/* Open a step dump: an HDF5 file whose root holds qatcheck_step = 1. */
static int step_open(const char *path, qc_dump **out) {
  qc_dump_silence();
  *out = NULL;
  FILE *f = fopen(path, "rb");
  if (!f) return qc_err("step dump '%s': cannot open: no such file or not readable", path);
  fclose(f);
  if (H5Fis_hdf5(path) <= 0) return qc_err("step dump '%s': not an HDF5 file (or truncated)", path);
  hid_t fid = H5Fopen(path, H5F_ACC_RDONLY, H5P_DEFAULT);
  if (fid < 0) return qc_err("step dump '%s': HDF5 cannot open it (truncated or corrupt)", path);
  long long ver = 0;
  hid_t a = H5Aexists(fid, "qatcheck_step") > 0 ? H5Aopen(fid, "qatcheck_step", H5P_DEFAULT) : -1;
  hid_t t = a >= 0 ? H5Aget_type(a) : -1, sp = a >= 0 ? H5Aget_space(a) : -1;
  int ok = t >= 0 && sp >= 0 && H5Tget_class(t) == H5T_INTEGER && H5Sget_simple_extent_npoints(sp) == 1 &&
           H5Aread(a, H5T_NATIVE_LLONG, &ver) >= 0;
  if (sp >= 0) H5Sclose(sp);
  if (t >= 0) H5Tclose(t);
  if (a >= 0) H5Aclose(a);
  if (!ok || ver != 1) {
    H5Fclose(fid);
    qc_err("step dump '%s': root attribute 'qatcheck_step' is %s: expected the integer 1", path, ok ? "not 1" : "missing");
    qc_hint("a step dump is written by scripts/proxy_sft.py or h5py: f.attrs['qatcheck_step'] = 1");
    return QC_EINPUT;
  }
  qc_dump *d = qc_calloc(1, sizeof *d, "dump handle");
  if (!d) { H5Fclose(fid); return QC_ESYS; }
  d->file = fid;
  d->fd = -1;
  snprintf(d->path, sizeof d->path, "%s", path);
  *out = d;
  return QC_OK;
}

/* A numeric attribute of obj (integer or float, one element). *found 0
 * when absent. */
static int num_attr(qc_dump *d, hid_t obj, const char *grp, const char *name, double *v, int *found) {
  *found = 0;
  if (H5Aexists(obj, name) <= 0) return QC_OK;
  hid_t a = H5Aopen(obj, name, H5P_DEFAULT);
  hid_t t = a >= 0 ? H5Aget_type(a) : -1, sp = a >= 0 ? H5Aget_space(a) : -1;
  H5T_class_t cl = t >= 0 ? H5Tget_class(t) : H5T_NO_CLASS;
  int ok = sp >= 0 && H5Sget_simple_extent_npoints(sp) == 1 && (cl == H5T_INTEGER || cl == H5T_FLOAT) &&
           H5Aread(a, H5T_NATIVE_DOUBLE, v) >= 0 && isfinite(*v);
  if (sp >= 0) H5Sclose(sp);
  if (t >= 0) H5Tclose(t);
  if (a >= 0) H5Aclose(a);
  if (!ok) return qc_err("step dump '%s': group '%s': attribute '%s' must be one finite number", d->path, grp, name);
  *found = 1;
  return QC_OK;
}

/* The `frozen` attribute: an array of strings (h5py writes a list so), a
 * single name, JSON text of a list, or an empty array of any type. */
static int frozen_attr(qc_dump *d, hid_t g, const char *grp, qc_step_arm *arm) {
  if (H5Aexists(g, "frozen") <= 0) return QC_OK;
  hid_t a = H5Aopen(g, "frozen", H5P_DEFAULT);
  hid_t t = a >= 0 ? H5Aget_type(a) : -1, sp = a >= 0 ? H5Aget_space(a) : -1;
  hssize_t n = sp >= 0 ? H5Sget_simple_extent_npoints(sp) : -1;
  int rc = QC_OK;
  char **s = NULL;
  if (n == 0) goto done; /* [] */
  if (t < 0 || n < 0 || n > 100000 || H5Tget_class(t) != H5T_STRING) {
    rc = qc_err("step dump '%s': group '%s': attribute 'frozen' must be a list of parameter names", d->path, grp);
    goto done;
  }
  hid_t mt = H5Tcopy(H5T_C_S1);
  if (mt < 0 || H5Tset_size(mt, H5T_VARIABLE) < 0 || !(s = calloc((size_t)n, sizeof *s))) {
    if (mt >= 0) H5Tclose(mt);
    rc = qc_err_sys("out of memory reading 'frozen'");
    goto done;
  }
  if (H5Tis_variable_str(t) <= 0 || H5Aread(a, mt, s) < 0) {
    H5Tclose(mt);
    rc = qc_err("step dump '%s': group '%s': attribute 'frozen': store it as variable-length strings (h5py: a list of str)", d->path, grp);
    goto done;
  }
  if (!(arm->frozen = calloc((size_t)n, sizeof *arm->frozen))) rc = qc_err_sys("out of memory reading 'frozen'");
  for (hssize_t i = 0; !rc && i < n; i++) {
    if (!s[i] || strlen(s[i]) >= QC_PATHLEN) { rc = qc_err("step dump '%s': group '%s': a frozen name is empty or too long", d->path, grp); break; }
    snprintf(arm->frozen[arm->nfrozen++], QC_PATHLEN, "%s", s[i]);
  }
  H5Dvlen_reclaim(mt, sp, H5P_DEFAULT, s);
  H5Tclose(mt);
done:
  free(s);
  if (sp >= 0) H5Sclose(sp);
  if (t >= 0) H5Tclose(t);
  if (a >= 0) H5Aclose(a);
  return rc;
}

typedef struct {
  char (*v)[QC_PATHLEN];
  int n, cap, rc;
} names;

static herr_t dset_cb(hid_t o, const char *name, const H5O_info_t *info, void *op) {
  (void)o;
  names *nm = op;
  if (info->type != H5O_TYPE_DATASET) return 0;
  if (strlen(name) >= QC_PATHLEN) { nm->rc = qc_err("a parameter name longer than %d characters", QC_PATHLEN - 1); return -1; }
  if (nm->n == nm->cap) {
    int cap = nm->cap ? 2 * nm->cap : 64;
    void *nv = realloc(nm->v, (size_t)cap * sizeof *nm->v);
    if (!nv) { nm->rc = qc_err_sys("out of memory listing parameters"); return -1; }
    nm->v = nv;
    nm->cap = cap;
  }
  snprintf(nm->v[nm->n++], QC_PATHLEN, "%s", name);
  return 0;
}

static int cmp_name(const void *a, const void *b) { return strcmp(a, b); }

/* Every dataset below group `path` (relative names, sorted); none when absent. */
static int list_datasets(qc_dump *d, const char *path, names *out) {
  memset(out, 0, sizeof *out);
  if (H5Lexists(d->file, path, H5P_DEFAULT) <= 0) return QC_OK;
  hid_t g = H5Gopen2(d->file, path, H5P_DEFAULT);
  if (g < 0) return qc_err("step dump '%s': '%s' is not a group", d->path, path);
  herr_t st = H5Ovisit(g, H5_INDEX_NAME, H5_ITER_INC, dset_cb, out);
  H5Gclose(g);
  if (out->rc) return out->rc;
  if (st < 0) return qc_err("step dump '%s': cannot walk '%s' (corrupt file?)", d->path, path);
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
  hid_t g = H5Gopen2(d->file, grp, H5P_DEFAULT);
  if (g < 0) return qc_err("step dump '%s': arm group '%s' cannot be opened", d->path, grp);
  char opt[32] = "";
  int rc = QC_OK, f;
  double step = 0;
  if (qc_dump_str_attr(g, "optimizer", opt, sizeof opt) != QC_OK || (strcmp(opt, "adamw") && strcmp(opt, "sgd"))) {
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
        (rc = read_f64(d, grp, "after", p, 1, &p->after, NULL)) ||
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
  H5Gclose(g);
  if (rc) qc_step_arm_free(arm);
  return rc;
}

static herr_t group_cb(hid_t g, const char *name, const H5L_info_t *info, void *op) {
  (void)info;
  names *nm = op;
  H5O_info_t oi;
  if (H5Oget_info_by_name(g, name, &oi, H5P_DEFAULT) < 0 || oi.type != H5O_TYPE_GROUP) return 0;
  return dset_cb(g, name, &(H5O_info_t){.type = H5O_TYPE_DATASET}, nm);
}

int qc_step_dump_read(const char *path, const char *const *want, int nwant, qc_step_arm **arms, int *narm) {
  qc_dump *d = NULL;
  names groups = {0};
  int rc = step_open(path, &d);
  if (rc) return rc;
  if (H5Literate(d->file, H5_INDEX_NAME, H5_ITER_INC, NULL, group_cb, &groups) < 0 && !groups.rc)
    rc = qc_err("step dump '%s': cannot list its groups (corrupt file?)", path);
  if (!rc) rc = groups.rc;
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
