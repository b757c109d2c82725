/* split.c: one module run by every rank together, each on a slice of one
 * dimension (the class's qc_split: an lm_head along its output features, a
 * log-prob along the vocabulary), for a module too big for one device.
 *
 * Every rank holds the whole module (it read or generated it) and runs:
 *   reference  the class's float64 reference on its slice; a gradient that
 *              is a partial sum over the slices (a linear's d_x) is summed
 *              over the ranks here (float64, fixed order). A class whose
 *              reference needs the whole (whole_reference) runs it whole and
 *              takes its block.
 *   candidate  the production VJP on the slice with ctx->group set: it
 *              completes its own partial results through the group's
 *              all-reduce, as a tensor-parallel trainer does (NCCL on a
 *              device); or the dump's gradients, sliced.
 *   metrics    each rank's sums over its block of every gradient, summed
 *              over the ranks (qc_mparts), give the metrics, noise floor and
 *              bias test of the whole tensor up to the order of the sums.
 * Rank 0 keeps the checks (the merge reports them as the unit's); the
 * others run the same steps and drop them. Every collective is preceded by
 * an agreement (dist.h), so a rank that fails anywhere (here or on a unit
 * of its own before this one) stops every rank with its error, no rank
 * waiting. Failed checks of a split module get no diagnosis (the
 * hypotheses need the whole gradients on one rank). */
#include <math.h>
#include <regex.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend/backend.h"
#include "core/number.h"
#include "core/qc.h"
#include "dist/dist.h"
#include "engine/vjp.h"
#include "io/dump.h"
#include "numerics/decode.h"

int qc_split_wanted(const qc_case *cs, const char *path) {
  if (!cs->has_split) return 0;
  regex_t rx;
  if (regcomp(&rx, cs->split_re, REG_EXTENDED | REG_NOSUB)) return 0; /* validated when the case was read */
  int hit = regexec(&rx, path, 0, NULL, 0) == 0;
  regfree(&rx);
  return hit;
}

typedef struct split_run {
  const qc_backend *be;
  long long unit;          /* the unit's index: what a failure is reported against */
  int ndev, nhost;         /* all-reduces through the device's collectives, through the host */
} split_run;

/* The group's all-reduce (qc_group.allreduce): an agreement, then the
 * reduction of the host buffer: on a device with collectives, staged
 * through a device buffer and reduced by the backend (NCCL); else on the
 * host through MPI, fixed order. */
static int group_reduce(const qc_group *g, void *buf, int64_t n, qc_dtype dt, qc_redop op) {
  split_run *s = (split_run *)g->arg;
  const qc_backend *be = s->be;
  int rc = qc_dist_agree(QC_OK, s->unit);
  if (rc) return rc;
  if (be->host_memory || !be->coll_ready || !be->coll_ready(be)) {
    s->nhost++;
    return qc_dist_allreduce_op(qc_backend_cpu(), buf, n, dt, op);
  }
  s->ndev++;
  size_t bytes = (size_t)n * qc_dtype_size(dt);
  void *d = NULL;
  if (!(rc = be->buf_alloc(be, bytes, "split all-reduce", &d)) && !(rc = be->upload(be, d, buf, bytes)) &&
      !(rc = qc_dist_allreduce_op(be, d, n, dt, op)))
    rc = be->download(be, buf, d, bytes);
  if (d) be->buf_free(be, d);
  return rc;
}

/* Width of a float type for the widest-over-ranks judged dtype. */
static double width(qc_dtype d) { return d == QC_BF16 ? 1 : d == QC_F16 ? 2 : d == QC_F32 ? 3 : 4; }
static qc_dtype of_width(double w) { return w <= 1 ? QC_BF16 : w <= 2 ? QC_F16 : w <= 3 ? QC_F32 : QC_F64; }

/* Check k's metrics, precision and noise floor from this rank's block
 * (candidate g in its storage type, reference r in float64, both holding
 * b's elements) combined over the ranks (collective). */
static int combine(const qc_group *grp, const qc_tensor *g, const double *r, const qc_split_block *b, const qc_tol *t,
                   qc_check *k) {
  const int64_t n = (b->r1 - b->r0) * (b->c1 - b->c0), len = qc_mparts_len(b->rows, b->cols);
  double *gd = qc_malloc((size_t)(n > 0 ? n : 1) * sizeof *gd, "candidate block (float64)");
  double *parts = qc_calloc((size_t)len, sizeof *parts, "metric sums of a split gradient");
  int rc = !gd || !parts ? QC_ESYS : QC_OK;
  if (!rc) rc = qc_tensor_to_f64(g, gd);
  double wd = 0, mx[2] = {-1, -1}, top, idx;
  if (!rc) wd = width((g->dtype == QC_F32 || g->dtype == QC_F64) ? qc_values_dtype(gd, n, g->dtype) : g->dtype);
  /* the judged precision: the widest any rank's values need (qc_audit_dtype) */
  if (rc || (rc = grp->allreduce(grp, &wd, 1, QC_F64, QC_RED_MAX))) goto done;
  const qc_dtype dt = qc_audit_dtype(g->dtype, of_width(wd), t, k);
  qc_mparts_add(gd, r, b->r0, b->r1, b->c0, b->c1, b->rows, b->cols, dt, parts, mx);
  top = mx[0];
  if ((rc = grp->allreduce(grp, parts, len, QC_F64, QC_RED_SUM)) || (rc = grp->allreduce(grp, &top, 1, QC_F64, QC_RED_MAX)))
    goto done;
  idx = mx[0] >= 0 && mx[0] == top ? -mx[1] : -INFINITY; /* the lowest index of the largest difference */
  if ((rc = grp->allreduce(grp, &idx, 1, QC_F64, QC_RED_MAX))) goto done;
  mx[0] = top;
  mx[1] = isfinite(idx) ? -idx : -1;
  qc_mparts_finish(parts, mx, b->rows, b->cols, &k->m);
  if (k->m.ref_nonfinite) {
    rc = qc_err("%s: the reference '%s' has %lld non-finite value(s) for dY '%s': its inputs, parameters or dY are not finite",
                k->module, k->tensor, (long long)k->m.ref_nonfinite, k->dy);
    goto done;
  }
  snprintf(k->judged_dtype, sizeof k->judged_dtype, "%s", qc_dtype_name(dt));
  k->has_metrics = 1;
done:
  free(gd);
  free(parts);
  return rc;
}

/* Rows [r0, r1) x columns [c0, c1) of the [rows, cols] float64 tensor r, copied. */
static int cut(const qc_tensor *r, const qc_split_block *b, qc_tensor *out) {
  int64_t shape[2] = {b->r1 - b->r0, b->c1 - b->c0};
  int rc = qc_tensor_alloc(out, r->name, QC_F64, 2, shape);
  if (rc) return rc;
  for (int64_t i = b->r0; i < b->r1; i++)
    memcpy((double *)out->data + (i - b->r0) * shape[1], (const double *)r->data + i * b->cols + b->c0,
           (size_t)shape[1] * sizeof(double));
  return QC_OK;
}

/* The check of reference gradient r (this rank's piece, or the whole after
 * the sum of a partial one) against the candidate's set c, into *k. */
static int check_one(qc_audit *a, const qc_module *m, const qc_tensor *dy, const qc_group *grp, const qc_tensor *r,
                     const qc_tset *c, const qc_split_block *b, int partial, qc_check *k) {
  const qc_tol *t = qc_audit_tol(a, m, r->name);
  if (!t) return QC_EINPUT;
  qc_check_init(k, m, dy->name, r->name, b->ndim, b->shape, t);
  const qc_tensor *g = qc_tset_get(c, r->name);
  const int64_t want = (b->r1 - b->r0) * (b->c1 - b->c0);
  /* what is wrong with this rank's piece (0: nothing), taken as the worst of any rank's: every rank then
   * goes on to the collective combine, or none does */
  double bad = !g ? 3 : !qc_dtype_is_float(g->dtype) || g->dtype == QC_E2M1X2 ? 2
                   : qc_numel(g) != (partial ? b->rows * b->cols : want) || qc_numel(r) != qc_numel(g) ? 1 : 0;
  int rc = grp->allreduce(grp, &bad, 1, QC_F64, QC_RED_MAX);
  if (rc) return rc;
  if (g) snprintf(k->cand_dtype, sizeof k->cand_dtype, "%s", qc_dtype_name(g->dtype));
  if (bad > 0) {
    char s1[96] = "";
    k->verdict = QC_V_FAIL;
    if (g) qc_shape_str(g->ndim, g->shape, s1, sizeof s1);
    if (bad == 3) snprintf(k->why, sizeof k->why, "missing%s", g ? " on a rank" : "");
    else if (bad == 2) snprintf(k->why, sizeof k->why, "candidate has element type %s: expected a float gradient", k->cand_dtype);
    else snprintf(k->why, sizeof k->why, "shape mismatch: the candidate's piece %s on rank %d, expected %lld elements%s", s1,
                  grp->rank, (long long)(partial ? b->rows * b->cols : want), g && qc_numel(g) == (partial ? b->rows * b->cols : want) ? " (another rank's differs)" : "");
    return QC_OK;
  }
  qc_split_block blk = *b;
  const double *rp = r->data;
  qc_tensor gv = *g;
  if (partial) { /* every rank holds the whole: each takes its rows */
    blk.r0 = b->rows * grp->rank / grp->size;
    blk.r1 = b->rows * (grp->rank + 1) / grp->size;
    blk.c0 = 0;
    blk.c1 = b->cols;
    rp += blk.r0 * b->cols;
    gv.data = (char *)g->data + (size_t)(blk.r0 * b->cols) * qc_dtype_size(g->dtype);
    gv.ndim = 1;
    gv.shape[0] = (blk.r1 - blk.r0) * b->cols;
    gv.nbytes = (size_t)gv.shape[0] * qc_dtype_size(g->dtype);
  }
  rc = combine(grp, &gv, rp, &blk, t, k);
  if (!rc) rc = qc_audit_judge(m, dy, t, k);
  return rc;
}

/* Slice [lo, hi) of rank `rank` among `size`: equal parts rounded to the alignment. */
static int64_t slice_at(int64_t len, int64_t align, int rank, int size) {
  int64_t at = (len * rank / size + align - 1) / align * align;
  return at < len ? at : len;
}

int qc_split_audit(qc_audit *a, const qc_module *m, long long unit) {
  const qc_split *sp = m->cls->split;
  const int W = qc_dist_size(), R = qc_dist_rank();
  int64_t len = 0, align = 1, lo = 0, hi = 0;
  qc_module part;
  memset(&part, 0, sizeof part);
  int rc = QC_OK, sliced = 0, first = a->res->n;
  if (!sp) {
    rc = qc_err("case '%s': key 'split' names module '%s' of class '%s', which cannot be split across ranks", a->cs->path,
                m->path, m->cls->name);
    qc_hint("the classes that split are those whose documentation names a split dimension (docs/distributed.md)");
  }
  if (!rc) rc = sp->size(m, W, &len, &align);
  if (!rc) {
    lo = slice_at(len, align, R, W);
    hi = slice_at(len, align, R + 1, W);
    if (slice_at(len, align, W - 1, W) >= len) /* every rank needs a slice */
      rc = qc_err("%s: %s is %lld: too short to split into %d slices (aligned to %lld)", m->path, sp->dim, (long long)len, W,
                  (long long)align);
  }
  if (!rc && !(rc = sp->slice(m, lo, hi, &part))) sliced = 1;
  if ((rc = qc_dist_agree(rc, unit))) goto done; /* every rank is here, with its slice */
  split_run run = {a->ctx->be, unit, 0, 0};
  qc_group grp = {.rank = R, .size = W, .lo = lo, .hi = hi, .len = len, .allreduce = group_reduce, .arg = &run};
  qc_ctx ctx = *a->ctx;
  ctx.group = &grp;
  ctx.skip = NULL;
  const qc_registry_row *row = qc_registry_find(m->cls->name);
  if (!row) { rc = qc_err("%s: class '%s' has no registry row", m->path, m->cls->name); goto done; }
  if (qc_verbose && R == 0)
    fprintf(stderr, "qatcheck: %s: split along %s over %d rank(s): rank 0 has [%lld, %lld) of %lld\n", m->path, sp->dim, W,
            (long long)lo, (long long)hi, (long long)len);
  for (int i = 0; i < m->grad_out.n && !rc; i++) {
    const qc_tensor *dy = &m->grad_out.t[i];
    qc_tset ref = {0}, cand = {0};
    const qc_tset *cset = &cand;
    qc_ctx rctx = *a->ctx; /* the reference is never told about the group */
    rc = sp->whole_reference ? row->reference(&rctx, m, dy, &ref) : row->reference(&rctx, &part, &part.grad_out.t[i], &ref);
    if (!rc) {
      if (a->cs->cand == QC_CAND_DUMP) {
        static const qc_tset none;
        cset = part.cand ? &part.cand[i] : &none;
      } else {
        rc = m->cls->production(&ctx, &part, &part.grad_out.t[i], &cand);
      }
    }
    for (int j = 0; !rc && j < ref.n; j++) {
      qc_tensor *r = &ref.t[j], blk = {0};
      qc_split_block b;
      int partial = 0;
      qc_check k;
      if ((rc = sp->place(m, r->name, lo, hi, &b, &partial))) break;
      char fz[QC_NAMELEN + 3];
      snprintf(fz, sizeof fz, "/%s/", r->name);
      if (!qc_tset_get(cset, r->name) && a->frozen && strstr(a->frozen, fz)) continue; /* frozen: not expected */
      if (sp->whole_reference) {
        if ((rc = cut(r, &b, &blk))) break;
        partial = 0;
      } else if (partial && (rc = grp.allreduce(&grp, r->data, qc_numel(r), QC_F64, QC_RED_SUM))) {
        break;
      }
      rc = check_one(a, m, dy, &grp, sp->whole_reference ? &blk : r, cset, &b, partial, &k);
      qc_tensor_free(&blk);
      if (!rc && R == 0) rc = qc_results_add(a->res, &k);
    }
    qc_tset_free(&ref);
    qc_tset_free(&cand);
  }
  if (!rc && qc_verbose && R == 0)
    fprintf(stderr, "qatcheck: %s: split over %d rank(s): %d all-reduce(s) through NCCL on %s, %d through the host\n", m->path, W,
            run.ndev, a->ctx->be->name, run.nhost);
done:
  if (rc >= QC_EINPUT && !qc_dist_failed()) rc = qc_dist_agree(rc, unit); /* meet the others at their next agreement */
  if (sliced) qc_module_free(&part);
  if (rc) a->res->n = first > a->res->n ? a->res->n : first;
  return rc;
}

/* ---- the automatic split ---------------------------------------------------- */

/* The shapes (no data) of m's inputs/ and params/ in dump group `path`. */
static int shapes_of(qc_dump *d, const char *path, qc_module *m) {
  static const char *const roles[2] = {"inputs", "params"};
  int rc = QC_OK;
  for (int r = 0; r < 2 && !rc; r++) {
    char grp[QC_PATHLEN + 16], ds[QC_PATHLEN + QC_NAMELEN + 16];
    char (*names)[QC_NAMELEN] = NULL;
    int n = 0;
    snprintf(grp, sizeof grp, "%s/%s", path, roles[r]);
    rc = qc_dump_list(d, grp, &names, &n);
    for (int j = 0; !rc && j < n; j++) {
      qc_tensor t;
      snprintf(ds, sizeof ds, "%s/%s", grp, names[j]);
      if (!(rc = qc_dump_info(d, ds, &t))) rc = qc_tset_add(r ? &m->params : &m->inputs, &t);
    }
    free(names);
  }
  return rc;
}

/* The automatic split (vjp.h). */
int qc_split_auto(const qc_audit *a, qc_dump *d, const qc_dump_entry *ents, int n, char *split) {
  const qc_backend *be = a->ctx->be;
  double env = -1; /* QATCHECK_MEM_FREE: a whole number of bytes (core/number.c); -1: unset */
  size_t fr = 0;
  int rc = qc_env_num("QATCHECK_MEM_FREE", -1, &env);
  if (rc) return rc;
  if (qc_dist_size() < 2 || (env < 0 && (be->host_memory || !be->mem_free))) return QC_OK;
  if (env >= 0) {
    fr = (size_t)env;
  } else if ((rc = be->mem_free(be, &fr))) {
    return rc;
  }
  double *big = qc_calloc((size_t)n + 1, sizeof *big, "automatic split");
  size_t *need = qc_calloc((size_t)n + 1, sizeof *need, "automatic split");
  if (!big || !need) rc = QC_ESYS;
  for (int i = 0; !rc && i < n; i++) {
    const qc_registry_row *row = qc_registry_find(ents[i].cls);
    const qc_split *sp = row ? row->cls->split : NULL;
    if (split[i] || !sp || !sp->device_bytes) continue;
    qc_module m;
    memset(&m, 0, sizeof m);
    m.cls = row->cls;
    if (!(rc = shapes_of(d, ents[i].path, &m))) need[i] = sp->device_bytes(&m);
    big[i] = need[i] > fr;
    qc_module_free(&m);
  }
  if (!(rc = qc_dist_agree(rc, -1))) rc = qc_dist_allreduce_op(qc_backend_cpu(), big, n, QC_F64, QC_RED_MAX); /* any rank's */
  for (int i = 0; !rc && i < n; i++) {
    if (!big[i] || split[i]) continue;
    split[i] = 1;
    if (qc_verbose && qc_dist_rank() == 0)
      fprintf(stderr, "qatcheck: %s: its audit needs %.2f GiB of device memory, more than a rank has free (%.2f GiB here): "
                      "split across the %d ranks\n", ents[i].path, need[i] / 1073741824.0, fr / 1073741824.0, qc_dist_size());
  }
  free(big);
  free(need);
  return rc;
}
