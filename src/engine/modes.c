/* modes.c: a dump's execution mode judged from its evidence and against
 * the eager dump of the same step (modes.h). */
#include "engine/modes.h"

#include <cJSON.h>
#include <ctype.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/qc.h"
#include "io/dump.h"
#include "numerics/decode.h"

#define MODE_GROUP "/qatcheck_mode"
#define MAX_MARKS 4096

static const char *const modes[] = {"eager", "recompute", "autocast", "cuda_graph", "grad_accum", "tied"};
static const int mode_cov[] = {-1, QC_COV_RECOMPUTE, QC_COV_AUTOCAST, QC_COV_CUDA_GRAPH, QC_COV_GRAD_ACCUM,
                               QC_COV_SHARED_PARAMS};

typedef struct mark {
  char base[QC_PATHLEN]; /* the module's path without a micro-batch prefix */
  int bad;
} mark;

typedef struct mctx {
  qc_dump *d, *e;        /* the mode's dump, the eager one (NULL) */
  const char *mode;
  qc_results *res;
  mark *marks;
  int nmarks;
  const qc_dump_entry *sel; /* the selected module groups (tied: a tie is judged when one of its sites is) */
  int nsel;
} mctx;

/* The unit roundoff of a stored wide float type (float64, float32, float16,
 * bfloat16); 0 for any other: an 8- or 4-bit element and an integer are
 * compared bit for bit. */
static double unit(qc_dtype dt) {
  return dt == QC_F64 || dt == QC_F32 || dt == QC_F16 || dt == QC_BF16 ? qc_dtype_unit(dt) : 0;
}

/* A tolerance of rel_l2 bound alone, with its reasoning (printf-style). */
static qc_tol rel_tol(double bound, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static qc_tol rel_tol(double bound, const char *fmt, ...) {
  qc_tol t;
  memset(&t, 0, sizeof t);
  t.has_rel_l2 = 1;
  t.rel_l2 = bound;
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(t.reasoning, sizeof t.reasoning, fmt, ap);
  va_end(ap);
  return t;
}

/* Module `base` passed (bad 0) or failed a check of the mode. */
static int mark_module(mctx *c, const char *base, int bad) {
  for (int i = 0; i < c->nmarks; i++)
    if (strcmp(c->marks[i].base, base) == 0) {
      c->marks[i].bad |= bad;
      return QC_OK;
    }
  if (c->nmarks == MAX_MARKS) return QC_OK; /* coverage only: more modules change nothing it says */
  snprintf(c->marks[c->nmarks].base, QC_PATHLEN, "%s", base);
  c->marks[c->nmarks++].bad = bad;
  return QC_OK;
}

/* "/microbatch3/fc1" -> "/fc1"; other paths as they are. */
static const char *base_of(const char *path) {
  const char *p = path;
  if (strncmp(p, "/microbatch", 11) != 0) return path;
  p += 11;
  if (!isdigit((unsigned char)*p)) return path;
  while (isdigit((unsigned char)*p)) p++;
  return *p == '/' ? p : path;
}

/* One check into the results: g against r (n values), judged by t, or
 * verdict/why given (why non-NULL: the verdict is the caller's). */
static int add_check(mctx *c, const char *module, const char *cls, const char *against, const char *tensor,
                     const qc_tensor *shape, qc_dtype cand, const double *g, const double *r, int64_t n, const qc_tol *t,
                     int verdict, const char *why, const char *diag) {
  qc_check k;
  memset(&k, 0, sizeof k);
  snprintf(k.module, sizeof k.module, "%s", module);
  snprintf(k.cls, sizeof k.cls, "%s", cls);
  snprintf(k.dy, sizeof k.dy, "%s:%s", c->mode, against);
  snprintf(k.tensor, sizeof k.tensor, "%s", tensor);
  if (shape) {
    k.ndim = shape->ndim;
    memcpy(k.shape, shape->shape, sizeof k.shape);
  }
  snprintf(k.cand_dtype, sizeof k.cand_dtype, "%s", qc_dtype_name(cand));
  if (g && r) {
    qc_metrics_compute(g, r, n, &k.m);
    k.has_metrics = 1;
  }
  k.tol = *t;
  k.has_tol = 1;
  if (why) {
    k.verdict = verdict;
    snprintf(k.why, sizeof k.why, "%s", why);
  } else {
    k.verdict = qc_judge(&k.m, t, k.why, sizeof k.why);
  }
  if (k.verdict != QC_V_PASS && diag) snprintf(k.diagnosis, sizeof k.diagnosis, "%s", diag);
  mark_module(c, base_of(module), k.verdict != QC_V_PASS);
  return qc_results_add(c->res, &k);
}

/* Dataset dset of d decoded into a malloc'd float64 array (*v), its
 * tensor in *t (caller frees both). */
static int read64(qc_dump *d, const char *dset, qc_tensor *t, double **v) {
  int rc = qc_dump_read(d, dset, t);
  if (rc) return rc;
  int64_t n = qc_numel(t) * (t->dtype == QC_E2M1X2 ? 2 : 1);
  *v = qc_malloc((size_t)(n > 0 ? n : 1) * sizeof **v, "mode comparison");
  if (!*v) { qc_tensor_free(t); return QC_ESYS; }
  if ((rc = qc_tensor_to_f64(t, *v))) { free(*v); *v = NULL; qc_tensor_free(t); }
  return rc;
}

/* The tensor at path `cp` of dump cd against the one at `rp` of rd: bit
 * for bit (exact), or within one unit roundoff of the reference's dtype. */
static int compare(mctx *c, const char *module, const char *cls, const char *against, const char *tensor, qc_dump *cd,
                   const char *cp, qc_dump *rd, const char *rp, int exact) {
  qc_tensor ct = {0}, rt = {0};
  double *g = NULL, *r = NULL;
  qc_tol t;
  memset(&t, 0, sizeof t);
  int rc;
  if ((rc = read64(cd, cp, &ct, &g)) || (rc = read64(rd, rp, &rt, &r))) goto done;
  char why[256] = "";
  int verdict = QC_V_PASS;
  int64_t n = qc_numel(&rt) * (rt.dtype == QC_E2M1X2 ? 2 : 1);
  if (ct.dtype != rt.dtype || !qc_shape_eq(&ct, &rt)) {
    char a[96], b[96];
    snprintf(why, sizeof why, "%s %s here, %s %s in %s", qc_dtype_name(ct.dtype), qc_shape_str(ct.ndim, ct.shape, a, sizeof a),
             qc_dtype_name(rt.dtype), qc_shape_str(rt.ndim, rt.shape, b, sizeof b), against);
    verdict = QC_V_FAIL;
    free(g);
    g = NULL;
  }
  if (exact) {
    t.has_max_abs = 1;
    snprintf(t.reasoning, sizeof t.reasoning, "the same forward on the same data: bit for bit (%s)",
             strcmp(against, "first_forward") == 0 ? "a recompute rebuilds the first forward's scales, routing and draws"
                                                   : "the eager step's forward state");
    if (verdict == QC_V_PASS && memcmp(ct.data, rt.data, rt.nbytes) != 0) {
      size_t es = qc_dtype_size(rt.dtype);
      int64_t diff = 0;
      for (int64_t i = 0; es && i < qc_numel(&rt); i++)
        diff += memcmp((const char *)ct.data + i * (int64_t)es, (const char *)rt.data + i * (int64_t)es, es) != 0;
      qc_metrics m;
      qc_metrics_compute(g, r, n, &m);
      snprintf(why, sizeof why, "not bit for bit: %lld of %lld elements differ (max_abs %.3g, rel_l2 %.3g)", (long long)diff,
               (long long)qc_numel(&rt), m.max_abs, m.rel_l2);
      verdict = QC_V_FAIL;
    }
    rc = add_check(c, module, cls, against, tensor, &rt, ct.dtype, g, r, n, &t, verdict, why, NULL);
  } else {
    double u = unit(rt.dtype);
    t.has_rel_l2 = 1;
    t.rel_l2 = u;
    snprintf(t.reasoning, sizeof t.reasoning,
             "the same kernels on the same data: bit for bit, or within one unit roundoff of %s (%.3g: a "
             "non-deterministic reduction order)", qc_dtype_name(rt.dtype), u);
    rc = add_check(c, module, cls, against, tensor, &rt, ct.dtype, g, r, n, &t, verdict, verdict ? why : NULL, NULL);
  }
done:
  free(g);
  free(r);
  qc_tensor_free(&ct);
  qc_tensor_free(&rt);
  return rc;
}

/* 1 when name is one of names[0..n). */
static int has_name(char (*names)[QC_NAMELEN], int n, const char *name) {
  for (int i = 0; i < n; i++)
    if (strcmp(names[i], name) == 0) return 1;
  return 0;
}

/* The datasets of group `role` under cpath (in cd) and under rpath (in
 * rd) have the same names: QC_OK, or QC_EINPUT naming the first dataset
 * one side holds and the other lacks (evidence is compared both ways or
 * refused). *names (malloc'd, caller frees) and *n: the names. */
static int same_names(mctx *c, qc_dump *cd, const char *cpath, qc_dump *rd, const char *rpath, const char *role,
                      char (**names)[QC_NAMELEN], int *n) {
  char g[QC_PATHLEN + 32];
  char(*other)[QC_NAMELEN] = NULL;
  int no = 0, rc;
  *names = NULL;
  *n = 0;
  snprintf(g, sizeof g, "%s/%s", rpath, role);
  if ((rc = qc_dump_list(rd, g, names, n))) return rc;
  snprintf(g, sizeof g, "%s/%s", cpath, role);
  rc = qc_dump_list(cd, g, &other, &no);
  for (int side = 0; side < 2 && !rc; side++) {
    char(*have)[QC_NAMELEN] = side ? other : *names, (*want)[QC_NAMELEN] = side ? *names : other;
    int nh = side ? no : *n, nw = side ? *n : no;
    qc_dump *hd = side ? cd : rd, *wd = side ? rd : cd;
    const char *hp = side ? cpath : rpath, *wp = side ? rpath : cpath;
    for (int i = 0; i < nh && !rc; i++)
      if (!has_name(want, nw, have[i]))
        rc = qc_err("dump '%s': no '%s/%s/%s' to compare with '%s/%s/%s' of '%s': mode %s compares every piece of "
                    "evidence with its counterpart", qc_dump_path(wd), wp, role, have[i], hp, role, have[i],
                    qc_dump_path(hd), c->mode);
  }
  free(other);
  if (rc) {
    free(*names);
    *names = NULL;
    *n = 0;
  }
  return rc;
}

/* Every dataset of role group `role` of module cpath (in cd) against the
 * one of the same name under rpath (in rd), after both hold the same
 * names; *ncmp (NULL: not counted) += the datasets compared. */
static int compare_role(mctx *c, const char *module, const char *cls, const char *against, qc_dump *cd, const char *cpath,
                        qc_dump *rd, const char *rpath, const char *role, int exact, int *ncmp) {
  char(*names)[QC_NAMELEN] = NULL;
  int n = 0, rc;
  if ((rc = same_names(c, cd, cpath, rd, rpath, role, &names, &n))) return rc;
  for (int i = 0; i < n && !rc; i++) {
    char cp[QC_PATHLEN * 2], rp[QC_PATHLEN * 2], tn[QC_NAMELEN + 16];
    snprintf(cp, sizeof cp, "%s/%s/%s", cpath, role, names[i]);
    snprintf(rp, sizeof rp, "%s/%s/%s", rpath, role, names[i]);
    /* gradients by their own name (d_x); forward state by role/name */
    if (strncmp(role, "grads/", 6) == 0) snprintf(tn, sizeof tn, "%s", names[i]);
    else snprintf(tn, sizeof tn, "%s/%s", role, names[i]);
    rc = compare(c, module, cls, against, tn, cd, cp, rd, rp, exact);
  }
  if (ncmp && !rc) *ncmp += n;
  free(names);
  return rc;
}

/* Module path of the mode's dump against the same path of the eager dump:
 * forward state bit for bit, dY and gradients within noise. */
static int against_eager(mctx *c, const qc_dump_entry *e) {
  static const char *fwd[] = {"inputs", "params", "saved", "outputs"};
  if (!qc_dump_exists(c->e, e->path))
    return qc_err("eager dump '%s': no module group '%s': the eager dump must be the same step of the same model "
                  "(%s holds it)", qc_dump_path(c->e), e->path, qc_dump_path(c->d));
  int rc = QC_OK, ngrads = 0;
  for (int i = 0; i < 4 && !rc; i++)
    rc = compare_role(c, e->path, e->cls, "eager", c->d, e->path, c->e, e->path, fwd[i], 1, NULL);
  char gp[QC_PATHLEN + 16];
  char(*dys)[QC_NAMELEN] = NULL;
  int ndy = 0;
  snprintf(gp, sizeof gp, "%s/grad_out", e->path);
  if (!rc) rc = compare_role(c, e->path, e->cls, "eager", c->d, e->path, c->e, e->path, "grad_out", 0, NULL);
  if (!rc) rc = qc_dump_list(c->e, gp, &dys, &ndy);
  for (int i = 0; i < ndy && !rc; i++) {
    char role[QC_NAMELEN + 8];
    snprintf(role, sizeof role, "grads/%s", dys[i]);
    rc = compare_role(c, e->path, e->cls, "eager", c->d, e->path, c->e, e->path, role, 0, &ngrads);
  }
  free(dys);
  if (!rc && !ngrads)
    rc = qc_err("dump '%s': module '%s' holds no gradient (grads/<dY>/d_<name>) to compare with the eager step's in '%s'",
                qc_dump_path(c->d), e->path, qc_dump_path(c->e));
  return rc;
}

/* recompute: the recomputed forward (the module group) against the first
 * (/qatcheck_mode/first_forward<path>), bit for bit. */
static int recompute(mctx *c, const qc_dump_entry *e) {
  static const char *roles[] = {"inputs", "outputs", "saved"};
  char ff[QC_PATHLEN + 32];
  snprintf(ff, sizeof ff, MODE_GROUP "/first_forward%s", e->path);
  if (!qc_dump_exists(c->d, ff)) return QC_OK; /* ran once: not under a checkpoint */
  int rc = QC_OK;
  for (int i = 0; i < 3 && !rc; i++) {
    if (i == 2) { /* saved/: where the writer has the first forward's */
      char sg[QC_PATHLEN + 48];
      char(*sv)[QC_NAMELEN] = NULL;
      int ns = 0;
      snprintf(sg, sizeof sg, "%s/saved", ff);
      if ((rc = qc_dump_list(c->d, sg, &sv, &ns))) break;
      free(sv);
      if (!ns) break;
    }
    rc = compare_role(c, e->path, e->cls, "first_forward", c->d, e->path, c->d, ff, roles[i], 1, NULL);
  }
  return rc;
}

/* sum += dataset dset of d (n values, same shape as `like`); QC_EINPUT naming it otherwise.
 * *u (when given) is raised to the unit roundoff of the precision its
 * values carry (qc_values_dtype: bf16-valued float32 has bfloat16's). */
static int add_into(qc_dump *d, const char *dset, const qc_tensor *like, double *sum, int64_t n, double *u) {
  qc_tensor t;
  double *v = NULL;
  int rc = read64(d, dset, &t, &v);
  if (rc) return rc;
  if (!qc_shape_eq(&t, like) || qc_numel(&t) * (t.dtype == QC_E2M1X2 ? 2 : 1) != n) {
    char a[96], b[96];
    rc = qc_err("dump '%s': '%s' is %s: the accumulated gradient it adds to is %s", qc_dump_path(d), dset,
                qc_shape_str(t.ndim, t.shape, a, sizeof a), qc_shape_str(like->ndim, like->shape, b, sizeof b));
  }
  for (int64_t i = 0; !rc && i < n; i++) sum[i] += v[i];
  if (!rc && u && unit(t.dtype) > 0) *u = fmax(*u, unit(qc_values_dtype(v, n, t.dtype)));
  free(v);
  qc_tensor_free(&t);
  return rc;
}

/* A failed sum's likely cause: g a constant factor of r. */
static void factor_diag(const double *g, const double *r, int64_t n, double bound, char *out, size_t len) {
  double gr = 0, rr = 0;
  for (int64_t i = 0; i < n; i++) {
    gr += g[i] * r[i];
    rr += r[i] * r[i];
  }
  if (rr <= 0) return;
  double k = gr / rr, d = 0;
  for (int64_t i = 0; i < n; i++) d += (g[i] - k * r[i]) * (g[i] - k * r[i]);
  if (sqrt(d) / sqrt(rr) <= 4 * bound + 1e-6 && fabs(k - 1) > 4 * bound)
    snprintf(out, len, "consistent with: a constant factor k = %.4g (a loss scaled %s)", k,
             k < 1 ? "down twice, or divided by the micro-batch count where it was already a mean" : "up twice");
}

/* The gradient tensors d_<p> of module `path` for every dY it holds, summed
 * into sum; *u (when given) raised to the unit roundoff their values carry. */
static int module_grad(qc_dump *d, const char *path, const char *dname, const qc_tensor *like, double *sum, int64_t n, int *found,
                       double *u) {
  char gp[QC_PATHLEN + 16];
  char(*dys)[QC_NAMELEN] = NULL;
  int ndy = 0, rc;
  snprintf(gp, sizeof gp, "%s/grad_out", path);
  if ((rc = qc_dump_list(d, gp, &dys, &ndy))) return rc;
  for (int i = 0; i < ndy && !rc; i++) {
    char ds[QC_PATHLEN * 2];
    snprintf(ds, sizeof ds, "%s/grads/%s/%s", path, dys[i], dname);
    if (!qc_dump_exists(d, ds)) continue;
    rc = add_into(d, ds, like, sum, n, u);
    (*found)++;
  }
  free(dys);
  return rc;
}

/* *found: how many dYs of module `path` in d hold gradient dname (grads/<dY>/dname). */
static int grad_count(qc_dump *d, const char *path, const char *dname, int *found) {
  char gp[QC_PATHLEN + 16];
  char(*dys)[QC_NAMELEN] = NULL;
  int ndy = 0, rc;
  *found = 0;
  snprintf(gp, sizeof gp, "%s/grad_out", path);
  if ((rc = qc_dump_list(d, gp, &dys, &ndy))) return rc;
  for (int i = 0; i < ndy; i++) {
    char ds[QC_PATHLEN * 2];
    snprintf(ds, sizeof ds, "%s/grads/%s/%s", path, dys[i], dname);
    *found += qc_dump_exists(d, ds);
  }
  free(dys);
  return QC_OK;
}

/* grad_accum, module `base` over nmb micro-batches, both ways: the
 * accumulated group ag (its datasets names[0..n)) holds each parameter
 * gradient a micro-batch or the eager step (when given) holds, and each
 * of them holds every accumulated one. QC_OK, or QC_EINPUT naming what is
 * missing. */
static int accum_both_ways(mctx *c, const char *base, int nmb, const char *ag, char (*names)[QC_NAMELEN], int n) {
  int rc = QC_OK;
  for (int k = 0; k <= nmb && !rc; k++) {
    qc_dump *d = k < nmb ? c->d : c->e;
    char mp[QC_PATHLEN + 32], pg[QC_PATHLEN + 48];
    if (!d) break;
    if (k < nmb) snprintf(mp, sizeof mp, "/microbatch%d%s", k, base);
    else snprintf(mp, sizeof mp, "%s", base);
    if (k == nmb && !qc_dump_exists(d, mp))
      return qc_err("eager dump '%s': no module group '%s': the eager dump must be the same step of the same model, "
                    "the whole batch in one backward", qc_dump_path(d), base);
    char(*ps)[QC_NAMELEN] = NULL;
    int np = 0, f = 0;
    snprintf(pg, sizeof pg, "%s/params", mp);
    if ((rc = qc_dump_list(d, pg, &ps, &np))) break;
    for (int i = 0; i < np && !rc; i++) {
      char dn[QC_NAMELEN + 2];
      snprintf(dn, sizeof dn, "d_%s", ps[i]);
      if (!(rc = grad_count(d, mp, dn, &f)) && f && !has_name(names, n, dn))
        rc = qc_err("dump '%s': no '%s/%s': %s module '%s' holds the gradient %s, and grad_accum compares each "
                    "parameter's gradient with its accumulation", qc_dump_path(c->d), ag, dn,
                    k < nmb ? "the micro-batch's" : "the eager dump's", mp, dn);
    }
    free(ps);
    for (int i = 0; i < n && !rc; i++)
      if (!(rc = grad_count(d, mp, names[i], &f)) && !f)
        rc = qc_err("%sdump '%s': module '%s' has no gradient %s (grads/<dY>/%s) to compare with '%s/%s' of '%s'",
                    k < nmb ? "" : "eager ", qc_dump_path(d), mp, names[i], names[i], ag, names[i], qc_dump_path(c->d));
  }
  return rc;
}

/* grad_accum, module `base` (first micro-batch entry e): each parameter's
 * accumulated gradient against the sum of the micro-batches' gradients,
 * and that sum against the eager whole batch's. */
static int grad_accum(mctx *c, const qc_dump_entry *e, const char *base, int nmb) {
  char ag[QC_PATHLEN + 32];
  char(*names)[QC_NAMELEN] = NULL;
  int n = 0, rc;
  snprintf(ag, sizeof ag, MODE_GROUP "/accumulated%s", base);
  if (!qc_dump_exists(c->d, ag))
    return qc_err("dump '%s': mode grad_accum but no '%s': the accumulated gradients of module '%s' are missing "
                  "(scripts/qatdump.py writes them)", qc_dump_path(c->d), ag, base);
  if ((rc = qc_dump_list(c->d, ag, &names, &n)) || (rc = accum_both_ways(c, base, nmb, ag, names, n))) {
    free(names);
    return rc;
  }
  for (int i = 0; i < n && !rc; i++) {
    char ap[QC_PATHLEN * 2];
    qc_tensor at;
    double *acc = NULL, *sum = NULL;
    snprintf(ap, sizeof ap, "%s/%s", ag, names[i]);
    if ((rc = read64(c->d, ap, &at, &acc))) break;
    int64_t nv = qc_numel(&at);
    double **parts = qc_calloc((size_t)nmb, sizeof *parts, "micro-batch gradients");
    sum = qc_calloc((size_t)(nv > 0 ? nv : 1), sizeof *sum, "micro-batch sum");
    if (!parts || !sum) rc = QC_ESYS;
    int found = 0;
    double u_mb = 0, u_w = 0; /* the unit roundoff the micro-batches' and the whole batch's gradients carry */
    for (int k = 0; k < nmb && !rc; k++) {
      char mp[QC_PATHLEN + 32];
      snprintf(mp, sizeof mp, "/microbatch%d%s", k, base);
      if (!(parts[k] = qc_calloc((size_t)(nv > 0 ? nv : 1), sizeof **parts, "micro-batch gradient"))) { rc = QC_ESYS; break; }
      int f = 0;
      if ((rc = module_grad(c->d, mp, names[i], &at, parts[k], nv, &f, &u_mb))) break;
      found += f;
      for (int64_t j = 0; j < nv; j++) sum[j] += parts[k][j];
    }
    if (!rc && !found) rc = qc_err("dump '%s': '%s' has no micro-batch gradient %s to sum", qc_dump_path(c->d), ap, names[i]);
    if (!rc) {
      double u = unit(at.dtype), bound = 2.0 * (nmb + 1) * u;
      qc_tol t = rel_tol(bound,
               "the accumulated .grad is the sum of the %d micro-batches' gradients: %d additions rounded to %s, "
               "2 (N + 1) u = %.3g", nmb, nmb, qc_dtype_name(at.dtype), bound);
      char diag[256] = "";
      for (int k = 0; k < nmb && !diag[0]; k++) { /* the sum without micro-batch k */
        for (int64_t j = 0; j < nv; j++) sum[j] -= parts[k][j];
        if (nmb > 1 && qc_rel_l2(acc, sum, nv) <= bound)
          snprintf(diag, sizeof diag, "consistent with: micro-batch %d's gradient is not in the accumulated .grad "
                   "(cleared by a zero_grad inside the loop, or dropped)", k);
        for (int64_t j = 0; j < nv; j++) sum[j] += parts[k][j];
      }
      if (!diag[0]) factor_diag(acc, sum, nv, bound, diag, sizeof diag);
      rc = add_check(c, base, e->cls, "accumulated", names[i], &at, at.dtype, acc, sum, nv, &t, 0, NULL, diag);
    }
    if (!rc && c->e) { /* the sum against the whole batch's gradient */
      qc_tensor wt = {0};
      double *w = NULL, *wsum = qc_calloc((size_t)(nv > 0 ? nv : 1), sizeof *wsum, "whole-batch gradient");
      int f = 0;
      if (!wsum) rc = QC_ESYS;
      if (!rc && !qc_dump_exists(c->e, base))
        rc = qc_err("eager dump '%s': no module group '%s': the eager dump must be the same step of the same model, "
                    "the whole batch in one backward", qc_dump_path(c->e), base);
      if (!rc) rc = module_grad(c->e, base, names[i], &at, wsum, nv, &f, &u_w);
      if (!rc && !f) rc = qc_err("eager dump '%s': module '%s' has no gradient %s", qc_dump_path(c->e), base, names[i]);
      char gp[QC_PATHLEN + 32];
      char(*dys)[QC_NAMELEN] = NULL;
      int ndy = 0;
      snprintf(gp, sizeof gp, "%s/grad_out", base);
      if (!rc) rc = qc_dump_list(c->e, gp, &dys, &ndy);
      int64_t tokens = 1;
      if (!rc && ndy) {
        char dp[QC_PATHLEN * 2];
        snprintf(dp, sizeof dp, "%s/%s", gp, dys[0]);
        if (!(rc = qc_dump_info(c->e, dp, &wt)) && wt.ndim >= 1) tokens = qc_numel(&wt) / (wt.shape[wt.ndim - 1] ? wt.shape[wt.ndim - 1] : 1);
      }
      free(dys);
      if (!rc) {
        /* each gradient rounded to the precision its values carry (a
         * micro-batch's bf16 matmul output summed in a float32 .grad:
         * bfloat16's, not the .grad's), N of them against the whole one */
        const double ua = unit(at.dtype), um = fmax(u_mb, ua), uw = fmax(u_w, ua);
        double bound = nmb * um + uw + 8 * qc_dtype_unit(QC_F32) * sqrt((double)tokens);
        char pm[80], pw[80];
        snprintf(pm, sizeof pm, "%s (u = %.3g)", um > ua ? "the precision their values carry" : qc_dtype_name(at.dtype), um);
        snprintf(pw, sizeof pw, "%s (u = %.3g)", uw > ua ? "the precision its values carry" : qc_dtype_name(at.dtype), uw);
        qc_tol t = rel_tol(bound,
                 "the micro-batches' gradients sum to the whole batch's: the %d micro-batches' each rounded to %s, "
                 "the whole batch's to %s, N u_mb + u_whole, plus a float32 accumulator over the %lld tokens in "
                 "another order, 8 u32 sqrt(tokens): %.3g",
                 nmb, pm, pw, (long long)tokens, bound);
        char diag[256] = "";
        factor_diag(sum, wsum, nv, bound, diag, sizeof diag);
        rc = add_check(c, base, e->cls, "eager", names[i], &at, at.dtype, sum, wsum, nv, &t, 0, NULL, diag);
      }
      free(w);
      free(wsum);
    }
    for (int k = 0; parts && k < nmb; k++) free(parts[k]);
    free(parts);
    free(sum);
    free(acc);
    qc_tensor_free(&at);
  }
  free(names);
  return rc;
}

/* tied: the tie group `tg` (attributes sites, parameters; dataset
 * accumulated) against the sum of its sites' shares, when `chosen` (the
 * module it is named after is selected) or one of its sites is selected. */
static int tied(mctx *c, const char *tg, const char *cls, int chosen) {
  /* the attributes whole, however many sites the tie has (a fixed buffer cut a 60-site list);
   * 'parameters' is optional (the diagnosis names them when there) */
  const char *buf = qc_dump_attr_text(c->d, tg, "sites"), *pbuf = qc_dump_attr_text(c->d, tg, "parameters");
  int rc;
  if (!buf) return qc_err("dump '%s': tie '%s' has no string attribute 'sites' (a JSON list of \"/module/param\")",
                          qc_dump_path(c->d), tg);
  if (!pbuf) pbuf = "";
  cJSON *s = cJSON_Parse(buf);
  int ns = cJSON_IsArray(s) ? cJSON_GetArraySize(s) : 0;
  if (ns < 2) {
    cJSON_Delete(s);
    return qc_err("dump '%s': tie '%s': attribute 'sites' is %.80s: expected a JSON list of two or more \"/module/param\"",
                  qc_dump_path(c->d), tg, buf);
  }
  for (int i = 0; i < ns && !chosen; i++) { /* a site selected, or not a site (refused below) */
    const char *site = cJSON_GetStringValue(cJSON_GetArrayItem(s, i)), *sl = site ? strrchr(site, '/') : NULL;
    chosen = !sl;
    for (int j = 0; sl && j < c->nsel && !chosen; j++)
      chosen = strlen(c->sel[j].path) == (size_t)(sl - site) && strncmp(c->sel[j].path, site, (size_t)(sl - site)) == 0;
  }
  if (!chosen) {
    cJSON_Delete(s);
    return QC_OK;
  }
  char ap[QC_PATHLEN + 32], first[QC_PATHLEN] = "", pname[QC_NAMELEN] = "";
  snprintf(ap, sizeof ap, "%s/accumulated", tg);
  qc_tensor at = {0};
  double *acc = NULL, *sum = NULL, **parts = NULL;
  if ((rc = read64(c->d, ap, &at, &acc))) goto done;
  int64_t nv = qc_numel(&at);
  sum = qc_calloc((size_t)(nv > 0 ? nv : 1), sizeof *sum, "tied sum");
  parts = qc_calloc((size_t)ns, sizeof *parts, "tied sites");
  if (!sum || !parts) { rc = QC_ESYS; goto done; }
  for (int i = 0; i < ns && !rc; i++) {
    const cJSON *it = cJSON_GetArrayItem(s, i);
    const char *site = cJSON_GetStringValue(it), *sl = site ? strrchr(site, '/') : NULL;
    if (!sl || sl == site || strlen(sl + 1) + 2 >= QC_NAMELEN || (size_t)(sl - site) >= QC_PATHLEN) {
      rc = qc_err("dump '%s': tie '%s': site %d is not \"/module/param\"", qc_dump_path(c->d), tg, i);
      break;
    }
    char mod[QC_PATHLEN], dn[QC_NAMELEN];
    snprintf(mod, sizeof mod, "%.*s", (int)(sl - site), site);
    snprintf(dn, sizeof dn, "d_%s", sl + 1);
    if (!i) {
      snprintf(first, sizeof first, "%s", mod);
      snprintf(pname, sizeof pname, "%s", dn);
    }
    if (!qc_dump_exists(c->d, mod)) {
      rc = qc_err("dump '%s': tie '%s': site module '%s' is not in the dump", qc_dump_path(c->d), tg, mod);
      break;
    }
    if (!(parts[i] = qc_calloc((size_t)(nv > 0 ? nv : 1), sizeof **parts, "tied site"))) { rc = QC_ESYS; break; }
    int f = 0;
    rc = module_grad(c->d, mod, dn, &at, parts[i], nv, &f, NULL);
    if (!rc && !f) /* its share would count as zero, and a lost share would pass */
      rc = qc_err("dump '%s': tie '%s': site module '%s' holds no gradient %s (grads/<dY>/%s): its share of the tie",
                  qc_dump_path(c->d), tg, mod, dn, dn);
    for (int64_t j = 0; !rc && j < nv; j++) sum[j] += parts[i][j];
    mark_module(c, mod, 0);
  }
  if (rc) goto done;
  double bound = 2.0 * (ns + 1) * unit(at.dtype);
  qc_tol t = rel_tol(bound,
           "a parameter used at %d sites accumulates their shares: %d additions rounded to %s, 2 (N + 1) u = %.3g", ns, ns,
           qc_dtype_name(at.dtype), bound);
  char diag[512] = "";
  for (int k = 0; k < ns && !diag[0]; k++) {
    for (int64_t j = 0; j < nv; j++) sum[j] -= parts[k][j];
    if (qc_rel_l2(acc, sum, nv) <= bound)
      snprintf(diag, sizeof diag, "consistent with: site %d's share (%s) is lost from the accumulated gradient%s%s", k,
               cJSON_GetStringValue(cJSON_GetArrayItem(s, k)), strchr(pbuf, ',') ? "; the sites hold distinct Parameters "
               "over one storage: " : "", strchr(pbuf, ',') ? pbuf : "");
    for (int64_t j = 0; j < nv; j++) sum[j] += parts[k][j];
  }
  if ((rc = add_check(c, first, cls, "accumulated", pname, &at, at.dtype, acc, sum, nv, &t, 0, NULL, diag))) goto done;
  /* every site shares the tie's verdict (the check just added: add_check failed above when it added none) */
  for (int i = 0; i < ns; i++) {
    const char *site = cJSON_GetStringValue(cJSON_GetArrayItem(s, i)), *sl = strrchr(site, '/');
    char mod[QC_PATHLEN];
    snprintf(mod, sizeof mod, "%.*s", (int)(sl - site), site);
    mark_module(c, mod, c->res->v[c->res->n - 1].verdict != QC_V_PASS);
  }
done:
  for (int i = 0; parts && i < ns; i++) free(parts[i]);
  free(parts);
  free(sum);
  free(acc);
  qc_tensor_free(&at);
  cJSON_Delete(s);
  return rc;
}

/* The coverage item of the mode, in the facts of every module whose mode
 * checks all passed (autocast: whose vjp checks all passed). */
static void cover(mctx *c, int m, qc_modinfos *mods) {
  for (int i = 0; i < mods->n; i++) {
    qc_modinfo *mi = &mods->v[i];
    int ok = 0;
    if (m == 2) { /* autocast: its own reference only */
      ok = mi->nchecks > 0;
      for (int k = mi->first; k < mi->first + mi->nchecks && k < c->res->n; k++) ok &= c->res->v[k].verdict == QC_V_PASS;
    } else {
      for (int k = 0; k < c->nmarks; k++)
        if (strcmp(c->marks[k].base, base_of(mi->module)) == 0) ok = !c->marks[k].bad;
    }
    if (ok) mi->cover |= 1u << mode_cov[m];
  }
}

/* The reverse of each module's comparison: every module of the eager
 * dump matching `re` has its counterpart in the mode's dump (the same
 * path; under grad_accum, micro-batch 0's). QC_OK, or QC_EINPUT naming
 * the first that has none. */
static int eager_counterparts(mctx *c, const char *re, int accum) {
  qc_dump_entry *ee = NULL;
  int ne = 0, rc = qc_dump_modules(c->e, re, &ee, &ne);
  for (int i = 0; i < ne && !rc; i++) {
    char mp[QC_PATHLEN + 32];
    snprintf(mp, sizeof mp, "%s%s", accum ? "/microbatch0" : "", ee[i].path);
    if (!qc_dump_exists(c->d, mp))
      rc = qc_err("eager dump '%s': module '%s' has no counterpart '%s' in dump '%s': mode %s compares every module of "
                  "the eager step", qc_dump_path(c->e), ee[i].path, mp, qc_dump_path(c->d), c->mode);
  }
  free(ee);
  return rc;
}

/* Open dump `path` and (when given) the eager dump, and check the pair
 * before anything is judged: *m the index of path's mode in modes[] (0:
 * eager, nothing to judge), *dp and *ep open (ep NULL when no eager), both
 * closed again on an error. QC_OK, or QC_EINPUT / QC_ESYS with the error
 * set. */
static int open_mode(const char *path, const char *eager, qc_dump **dp, qc_dump **ep, int *mp) {
  qc_dump *d = NULL, *e = NULL;
  int m = 0, rc;
  char mode[64] = "eager", emode[64] = "eager";
  if ((rc = qc_dump_open(path, &d))) return rc;
  int has_mode = 1;
  if (qc_dump_get_attr(d, "/", "mode", mode, sizeof mode) != QC_OK) {
    if (qc_err_msg()[0]) { rc = QC_EINPUT; goto done; }
    snprintf(mode, sizeof mode, "eager");
    has_mode = 0;
  }
  for (m = 0; m < 6 && strcmp(mode, modes[m]) != 0; m++) {}
  if (m == 6) {
    rc = qc_err("dump '%s': root attribute 'mode' is '%.40s': expected eager, recompute, autocast, cuda_graph, grad_accum "
                "or tied", path, mode);
    goto done;
  }
  if (m == 0 && qc_dump_exists(d, MODE_GROUP)) { /* evidence no mode names: it would go unjudged */
    rc = qc_err("dump '%s' holds '" MODE_GROUP "', the evidence of an execution mode, but its root attribute 'mode' is %s: "
                "set the mode that wrote it (recompute, cuda_graph, grad_accum or tied)", path, has_mode ? "'eager'" : "missing");
    goto done;
  }
  if (m == 0) {
    if (eager) {
      rc = qc_err("--eager '%s': dump '%s' is itself an eager step (no root attribute 'mode', or 'eager'): --eager judges "
                  "a dump written in an execution mode", eager, path);
      qc_hint("scripts/qatdump.py attach(..., mode='recompute') (docs/qatdump.md, \"Execution modes\")");
    }
    goto done;
  }
  if (eager && (m == 2 || m == 5)) { /* judged from its own evidence: an eager dump would be accepted and never read */
    rc = qc_err("--eager '%s': dump '%s' is written in mode %s, which is judged %s: --eager compares a recompute, "
                "cuda_graph or grad_accum dump with the eager step", eager, path, modes[m],
                m == 2 ? "against its own reference" : "from its ties' accumulated gradients");
    goto done;
  }
  if (eager) {
    if ((rc = qc_dump_open(eager, &e))) goto done;
    qc_err_state es; /* absent: an eager step; unreadable: an error */
    qc_err_save(&es);
    if (qc_dump_get_attr(e, "/", "mode", emode, sizeof emode) != QC_OK && qc_err_msg()[0]) {
      qc_err_keep(&es);
      rc = QC_EINPUT;
      goto done;
    }
    qc_err_restore(&es);
    if (strcmp(emode, "eager") != 0) {
      rc = qc_err("--eager '%s': root attribute 'mode' is '%.40s': expected the eager dump of the same step", eager, emode);
      goto done;
    }
    if (qc_dump_exists(e, MODE_GROUP)) {
      rc = qc_err("--eager '%s' holds '" MODE_GROUP "', the evidence of an execution mode: expected the eager dump of the "
                  "same step", eager);
      goto done;
    }
  }
done:
  if (rc) {
    if (e) qc_dump_close(e);
    qc_dump_close(d);
    d = e = NULL;
  }
  *dp = d;
  *ep = e;
  *mp = m;
  return rc;
}

int qc_modes_check(const char *path, const char *eager) {
  qc_dump *d = NULL, *e = NULL;
  int m;
  int rc = open_mode(path, eager, &d, &e, &m);
  if (e) qc_dump_close(e);
  if (d) qc_dump_close(d);
  return rc;
}

int qc_modes_audit(const char *path, const char *re, const char *eager, qc_results *res, qc_modinfos *mods) {
  qc_dump *d = NULL, *e = NULL;
  qc_dump_entry *ents = NULL;
  int n = 0, m = 0, rc;
  mctx c = {.res = res};
  if ((rc = open_mode(path, eager, &d, &e, &m))) return rc;
  if (m == 0) goto done;
  c.d = d;
  c.e = e;
  c.mode = modes[m];
  if (!(c.marks = qc_calloc(MAX_MARKS, sizeof *c.marks, "mode coverage"))) { rc = QC_ESYS; goto done; }
  if ((rc = qc_dump_modules(d, re, &ents, &n))) goto done;
  if (m == 4) { /* grad_accum: one base module at a time, over its micro-batches */
    for (int i = 0; i < n && !rc; i++) {
      const char *b = base_of(ents[i].path);
      if (b == ents[i].path) {
        rc = qc_err("dump '%s': mode grad_accum but module '%s' is not under /microbatch<k>/", path, ents[i].path);
        break;
      }
      int seen = 0, nmb = 0;
      long k = strtol(ents[i].path + 11, NULL, 10);
      for (;; nmb++) {
        char mp[QC_PATHLEN + 32];
        snprintf(mp, sizeof mp, "/microbatch%d%s", nmb, b);
        if (!qc_dump_exists(d, mp)) break;
      }
      if (k >= nmb) { /* counted from 0 without a gap: one after the gap would go unsummed */
        rc = qc_err("dump '%s': module '%s' but no '/microbatch%d%s': micro-batches are numbered from 0 without a gap",
                    path, ents[i].path, nmb, b);
        break;
      }
      for (int j = 0; j < i && !seen; j++) seen = strcmp(base_of(ents[j].path), b) == 0;
      if (seen) continue;
      rc = grad_accum(&c, &ents[i], b, nmb);
    }
  } else if (m == 5) { /* tied: every tie a selected module is a site of (named after its first site, any module) */
    qc_dump_entry *all = NULL;
    int na = 0;
    c.sel = ents;
    c.nsel = n;
    if ((rc = qc_dump_modules(d, "", &all, &na))) goto done;
    for (int i = 0; i < na && !rc; i++) {
      char pg[QC_PATHLEN + 16];
      char(*ps)[QC_NAMELEN] = NULL;
      int np = 0;
      snprintf(pg, sizeof pg, "%s/params", all[i].path);
      if ((rc = qc_dump_list(d, pg, &ps, &np))) break;
      for (int k = 0; k < np && !rc; k++) {
        char tg[QC_PATHLEN * 2];
        snprintf(tg, sizeof tg, MODE_GROUP "/tied/%s.%s", all[i].path + 1, ps[k]);
        int named = 0;
        for (int j = 0; j < n && !named; j++) named = strcmp(ents[j].path, all[i].path) == 0;
        if (qc_dump_exists(d, tg)) rc = tied(&c, tg, all[i].cls, named);
      }
      free(ps);
    }
    free(all);
  } else {
    for (int i = 0; i < n && !rc; i++) {
      if (m == 1) rc = recompute(&c, &ents[i]);
      if (!rc && e && (m == 1 || m == 3)) rc = against_eager(&c, &ents[i]);
    }
  }
  if (!rc && e) rc = eager_counterparts(&c, re, m == 4);
  if (!rc) cover(&c, m, mods);
done:
  free(ents);
  free(c.marks);
  if (e) qc_dump_close(e);
  qc_dump_close(d);
  return rc;
}
