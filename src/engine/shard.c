/* shard.c: layer 1 over a sharded dump (vjp.h; docs/interfaces.md,
 * "Sharded dumps"). A tensor-, vocab-, expert- or sequence-parallel run
 * dumps one file per rank. Each module is assembled whole from the ranks'
 * pieces (a dataset's shard_dim says along which dimension; none: every
 * rank holds it whole, and they must agree), the reference runs once on
 * the whole module, and each rank's gradients are judged against the
 * reference's piece for that rank: a slice along the same dimension as the
 * tensor it differentiates, or the whole reference for a tensor every rank
 * holds whole (the trainer's all-reduce must have summed the ranks'
 * partial gradients into it). Checks are named "d_x@rank2", so a missing,
 * doubled or mis-scaled reduction, or a shard in the wrong place, fails on
 * its tensor and rank; a failed check says which of these it looks like. */
#include <glob.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/qc.h"
#include "dist/dist.h"
#include "engine/vjp.h"
#include "io/dump.h"
#include "numerics/decode.h"

int qc_shard_pattern(const char *dump) { return strpbrk(dump, "*?[") != NULL; }

typedef struct rankfile {
  qc_dump *d;
  qc_module m;      /* this rank's pieces of the module being audited */
  int loaded;
} rankfile;

/* Open the files of pattern, ordered by their root attribute `rank`: one
 * per rank 0 .. world_size-1. */
static int open_ranks(const char *pattern, rankfile **out, int *world) {
  glob_t g;
  int rc = QC_OK, W = 0;
  rankfile *rf = NULL;
  *out = NULL;
  int e = glob(pattern, 0, NULL, &g);
  if (e == GLOB_NOMATCH || (e == 0 && g.gl_pathc == 0)) {
    qc_hint("a sharded dump is one file per rank, e.g. \"dump\": \"step.rank*.h5\"");
    return qc_err("data.dump '%s': no file matches the pattern", pattern);
  }
  if (e) return qc_err_sys("data.dump '%s': cannot list the files of the pattern", pattern);
  W = (int)g.gl_pathc;
  if (!(rf = qc_calloc((size_t)W, sizeof *rf, "rank files"))) { rc = QC_ESYS; goto done; }
  for (int i = 0; i < W && !rc; i++) {
    const char *p = g.gl_pathv[i];
    qc_dump *d = NULL;
    long long r = -1, w = -1;
    if ((rc = qc_dump_open(p, &d))) break;
    int a = qc_dump_get_int_attr(d, "/", "rank", &r), b = a ? a : qc_dump_get_int_attr(d, "/", "world_size", &w);
    if (a || b) {
      qc_dump_close(d);
      rc = qc_err("dump '%s': root attribute '%s' is missing: a sharded dump holds one rank per file, with integer "
                  "attributes rank and world_size", p, a ? "rank" : "world_size");
      break;
    }
    if (w != W || r < 0 || r >= W) {
      qc_dump_close(d);
      rc = w != W ? qc_err("dump '%s': world_size %lld, but %d file(s) match '%s': expected one file per rank", p, w, W, pattern)
                  : qc_err("dump '%s': rank %lld is outside 0 .. %d", p, r, W - 1);
      break;
    }
    if (rf[r].d) {
      rc = qc_err("dumps '%s' and '%s' both hold rank %lld", qc_dump_path(rf[r].d), p, r);
      qc_dump_close(d);
      break;
    }
    rf[r].d = d;
  }
done:
  globfree(&g);
  if (rc && rf) {
    for (int i = 0; i < W; i++) qc_dump_close(rf[i].d);
    free(rf);
    rf = NULL;
  }
  *out = rf;
  *world = W;
  return rc;
}

/* The dimension dataset `dset` of rank file d is split along (its
 * shard_dim attribute, negative counting from the end), or -1: whole. */
static int shard_dim(qc_dump *d, const char *dset, int ndim, int *dim) {
  long long v;
  *dim = -1;
  int rc = qc_dump_get_int_attr(d, dset, "shard_dim", &v);
  if (rc == QC_EINPUT && !qc_err_msg()[0]) return QC_OK;
  if (rc) return rc;
  if (v < 0) v += ndim;
  if (v < 0 || v >= ndim)
    return qc_err("dump '%s': '%s': shard_dim %lld is not a dimension of its %d", qc_dump_path(d), dset, v, ndim);
  *dim = (int)v;
  return QC_OK;
}

/* Where tensor `name` of role `role` is in module m ("inputs", "params", ...). */
static qc_tset *role_set(qc_module *m, const char *role) {
  return !strcmp(role, "inputs") ? &m->inputs : !strcmp(role, "params") ? &m->params : !strcmp(role, "saved") ? &m->saved
       : &m->grad_out;
}

/* Assemble role `role` of the whole module w from the ranks' pieces: split
 * tensors concatenated along their shard_dim in rank order, whole ones
 * checked equal on every rank. */
static int assemble(rankfile *rf, int W, const char *path, const char *role, qc_module *w) {
  const qc_tset *s0 = role_set(&rf[0].m, role);
  qc_tset *out = role_set(w, role);
  for (int i = 0; i < s0->n; i++) {
    const qc_tensor *t0 = &s0->t[i];
    char ds[QC_PATHLEN + QC_NAMELEN + 16];
    int dim0, rc;
    snprintf(ds, sizeof ds, "%s/%s/%s", path, role, t0->name);
    if ((rc = shard_dim(rf[0].d, ds, t0->ndim, &dim0))) return rc;
    int64_t shape[QC_MAXDIM], total = 0;
    memcpy(shape, t0->shape, sizeof shape);
    const qc_tensor *piece[256];
    if (W > 256) return qc_err("a sharded dump of %d ranks: at most 256", W);
    for (int r = 0; r < W; r++) {
      int dr;
      const qc_tensor *t = qc_tset_get(role_set(&rf[r].m, role), t0->name);
      if (!t) return qc_err("dump '%s': '%s' is missing (rank 0 has it)", qc_dump_path(rf[r].d), ds);
      if ((rc = shard_dim(rf[r].d, ds, t->ndim, &dr))) return rc;
      if (dr != dim0 || t->ndim != t0->ndim || t->dtype != t0->dtype)
        return qc_err("dump '%s': '%s' is %s along %d (shard_dim) where rank 0's is %s along %d: the ranks disagree",
                      qc_dump_path(rf[r].d), ds, qc_dtype_name(t->dtype), dr, qc_dtype_name(t0->dtype), dim0);
      for (int k = 0; k < t->ndim; k++)
        if (k != dim0 && t->shape[k] != t0->shape[k]) {
          char a[96], b[96];
          return qc_err("dump '%s': '%s' is %s, rank 0's %s: pieces differ outside shard_dim %d", qc_dump_path(rf[r].d), ds,
                        qc_shape_str(t->ndim, t->shape, a, sizeof a), qc_shape_str(t0->ndim, t0->shape, b, sizeof b), dim0);
        }
      if (dim0 < 0 && (t->nbytes != t0->nbytes || memcmp(t->data, t0->data, t->nbytes) != 0)) {
        qc_hint("a tensor split across the ranks carries an integer attribute shard_dim (the dimension of its pieces)");
        return qc_err("dump '%s': '%s' differs from rank 0's, and has no shard_dim: a tensor without it must be the "
                      "same on every rank", qc_dump_path(rf[r].d), ds);
      }
      piece[r] = t;
      if (dim0 >= 0) total += t->shape[dim0];
    }
    if (dim0 >= 0) shape[dim0] = total;
    qc_tensor whole;
    if ((rc = qc_tensor_alloc(&whole, t0->name, t0->dtype, t0->ndim, shape))) return rc;
    if (dim0 < 0) {
      memcpy(whole.data, t0->data, t0->nbytes);
    } else { /* rows of the dimensions before dim0, each the ranks' runs in order */
      int64_t outer = qc_shape_numel(dim0, shape), inner = qc_shape_numel(t0->ndim - dim0 - 1, shape + dim0 + 1);
      size_t es = qc_dtype_size(t0->dtype);
      char *dst = whole.data;
      for (int64_t o = 0; o < outer; o++)
        for (int r = 0; r < W; r++) {
          size_t run = (size_t)piece[r]->shape[dim0] * (size_t)inner * es;
          memcpy(dst, (const char *)piece[r]->data + (size_t)o * run, run);
          dst += run;
        }
    }
    if ((rc = qc_tset_add(out, &whole))) {
      qc_tensor_free(&whole);
      return rc;
    }
  }
  return QC_OK;
}

/* Piece [off, off + len) of float64 tensor t along dimension d, as out. */
static int slice_f64(const qc_tensor *t, int d, int64_t off, int64_t len, qc_tensor *out) {
  int64_t shape[QC_MAXDIM];
  memcpy(shape, t->shape, sizeof shape);
  shape[d] = len;
  int rc = qc_tensor_alloc(out, t->name, QC_F64, t->ndim, shape);
  if (rc) return rc;
  int64_t outer = qc_shape_numel(d, t->shape), inner = qc_shape_numel(t->ndim - d - 1, t->shape + d + 1);
  const double *src = t->data;
  double *dst = out->data;
  for (int64_t o = 0; o < outer; o++)
    memcpy(dst + o * len * inner, src + (o * t->shape[d] + off) * inner, (size_t)(len * inner) * sizeof(double));
  return QC_OK;
}

/* rel-L2 of a against b (float64, n each). */
static double rel(const double *a, const double *b, int64_t n, double *dot_ab, double *bb) {
  double d = 0, s = 0, ab = 0;
  for (int64_t i = 0; i < n; i++) {
    d += (a[i] - b[i]) * (a[i] - b[i]);
    s += b[i] * b[i];
    ab += a[i] * b[i];
  }
  if (dot_ab) *dot_ab = ab;
  if (bb) *bb = s;
  return sqrt(d) / fmax(sqrt(s), QC_EPS_NORM);
}

/* One hypothesis about a failed per-rank check, recorded on it: its name,
 * what it would mean, the candidate's rel-L2 to its prediction (NAN: a
 * multiple, judged by the cosine), consistent or not. */
static void hyp(qc_check *k, const char *name, const char *says, double rl, int consistent) {
  if (k->nhyp >= (int)(sizeof k->hyp / sizeof k->hyp[0])) return;
  struct qc_hyp_result *h = &k->hyp[k->nhyp++];
  snprintf(h->name, sizeof h->name, "%s", name);
  snprintf(h->says, sizeof h->says, "%s", says);
  h->rel_l2 = rl;
  h->level = 0;
  h->consistent = consistent;
}

/* What a failed per-rank check looks like, as its diagnosis (the same
 * field and form as engine/diagnose.c's): equal to this rank's own partial
 * gradient or a share of the ranks' sum (the all-reduce missing), a
 * multiple of the expected piece (reduced twice, averaged, mis-scaled), or
 * another rank's piece (shards in the wrong order). g: the candidate as
 * float64; partial: the reference on this rank's own pieces (NULL: none);
 * sum: every rank's candidate summed (NULL: none). */
static void diagnose(qc_check *k, const double *g, const qc_tensor *ref, int d, const int64_t *off, const int64_t *len,
                     int r, int W, const qc_tensor *partial, const double *sum) {
  char says[256];
  int64_t n;
  double ab, bb, exp_rel, gg = 0;
  qc_tensor mine;
  const double *want = ref->data;
  memset(&mine, 0, sizeof mine);
  if (d >= 0 && slice_f64(ref, d, off[r], len[r], &mine) != QC_OK) { qc_err_clear(); return; }
  if (d >= 0) want = mine.data;
  n = d >= 0 ? qc_numel(&mine) : qc_numel(ref);
  exp_rel = rel(g, want, n, &ab, &bb);
  const double close = 0.25 * exp_rel; /* nearer a prediction than a quarter of the miss */
  for (int64_t i = 0; i < n; i++) gg += g[i] * g[i];
  double c = bb > 0 ? ab / bb : NAN, cosine = bb > 0 && gg > 0 ? ab / sqrt(bb * gg) : 0;
  k->nhyp = 0;
  if (d < 0 && partial && qc_numel(partial) == n) {
    double rl = rel(g, partial->data, n, NULL, NULL);
    snprintf(says, sizeof says, "rank %d's own partial gradient: the all-reduce over the %d ranks is missing", r, W);
    hyp(k, "reduction_partial", says, rl, rl < close);
  }
  for (int s = 0; d >= 0 && s < W; s++) {
    qc_tensor other;
    if (s == r || len[s] != len[r] || slice_f64(ref, d, off[s], len[s], &other)) continue;
    double rl = rel(g, other.data, n, NULL, NULL);
    snprintf(says, sizeof says, "the reference's piece of rank %d: the shards are in the wrong order", s);
    hyp(k, "shard_order", says, rl, rl < close);
    qc_tensor_free(&other);
  }
  if (cosine > 0.999 && isfinite(c) && fabs(c - 1) > 0.01) {
    if (fabs(c - 2) < 0.02) snprintf(says, sizeof says, "twice the reference: reduced twice");
    else if (W > 2 && fabs(c - W) < 0.01 * W) snprintf(says, sizeof says, "%d times the reference (the world size): all-reduced twice, or a sum where one rank's share was expected", W);
    else if (fabs(c * W - 1) < 0.01) snprintf(says, sizeof says, "1/%d of the reference: averaged over the ranks where a sum was expected", W);
    else snprintf(says, sizeof says, "%.4g times the reference: mis-scaled", c);
    hyp(k, "reduction_scale", says, NAN, 1);
  } else {
    hyp(k, "reduction_scale", "a multiple of the reference: a reduction mis-scaled", NAN, 0);
  }
  /* ranks holding different partials (no common multiple of the reference) that add up to it */
  if (d < 0 && sum) {
    double rl = rel(sum, want, n, NULL, NULL);
    snprintf(says, sizeof says, "a partial sum: the %d ranks' gradients add up to the reference: the all-reduce is missing", W);
    hyp(k, "reduction_sum", says, rl, rl < close && !(cosine > 0.999 && fabs(c - 1) > 0.01));
  }
  qc_tensor_free(&mine);
  size_t o = 0;
  int nc = 0;
  for (int i = 0; i < k->nhyp && o < sizeof k->diagnosis; i++) {
    if (!k->hyp[i].consistent) continue;
    o += (size_t)snprintf(k->diagnosis + o, sizeof k->diagnosis - o, "%s%s", nc++ ? "; also: " : "consistent with: ", k->hyp[i].says);
  }
  if (!nc) {
    o = (size_t)snprintf(k->diagnosis, sizeof k->diagnosis, "no known signature (tested:");
    for (int i = 0; i < k->nhyp && o < sizeof k->diagnosis; i++)
      if (i == 0 || strcmp(k->hyp[i].name, k->hyp[i - 1].name) != 0)
        o += (size_t)snprintf(k->diagnosis + o, sizeof k->diagnosis - o, " %s", k->hyp[i].name);
    if (o < sizeof k->diagnosis) snprintf(k->diagnosis + o, sizeof k->diagnosis - o, ")");
  }
}

/* Judge rank r's gradients for dY j against the whole reference grads. */
static int judge_rank(qc_audit *a, const qc_registry_row *row, qc_module *w, rankfile *rf, int W, int r, int j,
                      const qc_tset *ref) {
  qc_module *mr = &rf[r].m;
  const char *dyn = w->grad_out.t[j].name;
  int rc = QC_OK;
  qc_tset partial = {0};
  int have_partial = 0;
  for (int i = 0; i < ref->n && !rc; i++) {
    const qc_tensor *rg = &ref->t[i];
    const char *base = strncmp(rg->name, "d_", 2) == 0 ? rg->name + 2 : rg->name;
    const char *role = qc_tset_get(&mr->inputs, base) ? "inputs" : qc_tset_get(&mr->params, base) ? "params" : NULL;
    const qc_tol *tol = qc_audit_tol(a, w, rg->name);
    if (!tol) return QC_EINPUT;
    char tname[QC_NAMELEN], ds[QC_PATHLEN + QC_NAMELEN + 16];
    snprintf(tname, sizeof tname, "%s@rank%d", rg->name, r);
    int d = -1;
    int64_t off[256], len[256];
    if (role) {
      snprintf(ds, sizeof ds, "%s/%s/%s", w->path, role, base);
      const qc_tensor *t = qc_tset_get(role_set(mr, role), base);
      if ((rc = shard_dim(rf[r].d, ds, t->ndim, &d))) break;
      for (int s = 0, o = 0; d >= 0 && s < W; s++) {
        const qc_tensor *ts = qc_tset_get(role_set(&rf[s].m, role), base);
        off[s] = o;
        len[s] = ts->shape[d];
        o += (int)ts->shape[d];
      }
    }
    qc_tensor want;
    memset(&want, 0, sizeof want);
    if (d >= 0 && (d >= rg->ndim || (rc = slice_f64(rg, d, off[r], len[r], &want)))) {
      if (!rc) rc = qc_err("module '%s': gradient '%s' has %d dimension(s), its tensor is split along %d", w->path, rg->name, rg->ndim, d);
      break;
    }
    const qc_tensor *exp = d >= 0 ? &want : rg;
    qc_check k;
    qc_check_init(&k, w, dyn, tname, exp->ndim, exp->shape, tol);
    const qc_tensor *g = mr->cand ? qc_tset_get(&mr->cand[j], rg->name) : NULL;
    if (!g) {
      rc = qc_err("dump '%s': module '%s' has no dataset 'grads/%s/%s' for rank %d", qc_dump_path(rf[r].d), w->path, dyn,
                  rg->name, r);
    } else if (!qc_shape_eq(g, exp) && qc_numel(g) != qc_numel(exp)) {
      char s1[96], s2[96];
      snprintf(k.cand_dtype, sizeof k.cand_dtype, "%s", qc_dtype_name(g->dtype));
      k.verdict = QC_V_FAIL;
      snprintf(k.why, sizeof k.why, "shape %s, expected the reference's piece %s", qc_shape_str(g->ndim, g->shape, s1, sizeof s1),
               qc_shape_str(exp->ndim, exp->shape, s2, sizeof s2));
      rc = qc_results_add(a->res, &k);
    } else {
      snprintf(k.cand_dtype, sizeof k.cand_dtype, "%s", qc_dtype_name(g->dtype));
      rc = qc_audit_compare(a->ctx, g, exp, tol, &k);
      if (!rc) rc = qc_audit_judge(w, &w->grad_out.t[j], tol, &k);
      if (!rc && k.verdict != QC_V_PASS) {
        double *gd = qc_malloc((size_t)qc_numel(exp) * sizeof *gd, "candidate gradient (float64)");
        if (!gd) rc = QC_ESYS;
        if (!rc) rc = qc_tensor_to_f64(g, gd);
        if (!rc && d < 0 && !have_partial) { /* the reference on this rank's pieces alone: its partial gradient */
          have_partial = 1;
          if (row->reference(a->ctx, mr, &mr->grad_out.t[j], &partial)) qc_err_clear(); /* no partial: not every class has one */
        }
        double *sum = NULL;
        if (!rc && d < 0 && (sum = qc_calloc((size_t)qc_numel(exp), sizeof *sum, "the ranks' gradients summed"))) {
          for (int s = 0; s < W && sum; s++) { /* every rank's candidate of this gradient, summed */
            const qc_tensor *gs = rf[s].m.cand ? qc_tset_get(&rf[s].m.cand[j], rg->name) : NULL;
            double *tmp = gs && qc_numel(gs) == qc_numel(exp) ? qc_malloc((size_t)qc_numel(exp) * sizeof *tmp, "a rank's gradient") : NULL;
            if (!tmp || qc_tensor_to_f64(gs, tmp)) {
              free(sum);
              sum = NULL;
            } else {
              for (int64_t e = 0; e < qc_numel(exp); e++) sum[e] += tmp[e];
            }
            free(tmp);
          }
          qc_err_clear(); /* a diagnosis that cannot be made is no error */
        }
        if (!rc) diagnose(&k, gd, rg, d, off, len, r, W, qc_tset_get(&partial, rg->name), sum);
        free(sum);
        free(gd);
      }
      if (!rc) rc = qc_results_add(a->res, &k);
    }
    qc_tensor_free(&want);
  }
  qc_tset_free(&partial);
  return rc;
}

/* Audit module `path` (class row) over the W rank files: assemble, run the
 * reference once per dY, judge every rank. */
static int audit_sharded(qc_audit *a, const qc_case *cs, const char *profile, rankfile *rf, int W, const qc_dump_entry *e,
                         const qc_registry_row *row) {
  qc_module w;
  qc_modinfo *mi = NULL;
  char contract[4096] = "", kind[32] = "";
  int rc = QC_OK, first = a->res->n;
  double t0 = qc_now_s();
  memset(&w, 0, sizeof w);
  for (int r = 0; r < W && !rc; r++) {
    char c[4096];
    rc = qc_dump_load_module(rf[r].d, e->path, 1, &rf[r].m, r ? c : contract, r ? sizeof c : sizeof contract);
    rf[r].loaded = !rc;
    if (!rc) rf[r].m.cls = row->cls;
    if (!rc && (rc = qc_vjp_set_contract(&rf[r].m, cs, r ? c : contract, profile))) break;
    if (!rc && (rc = qc_vjp_select_dy(&rf[r].m, cs, qc_dump_path(rf[r].d)))) break;
  }
  if (rc) goto done;
  if (qc_dump_get_attr(rf[0].d, e->path, "parallel", kind, sizeof kind) == QC_OK &&
      !strstr("|tp_column|tp_row|vocab|expert|sequence|", kind)) { /* the kinds docs/interfaces.md describes */
    rc = qc_err("dump '%s': module '%s': attribute parallel '%s': expected tp_column, tp_row, vocab, expert or sequence",
                qc_dump_path(rf[0].d), e->path, kind);
    goto done;
  }
  /* no deployed-bytes check on shards: a profile left to "auto" is vllm's, as for a dump without bytes */
  for (int r = 0; r < W && !rc; r++)
    if (!strcmp(qc_contract_str(&rf[r].m.contract, "profile", "-"), "auto"))
      rc = qc_contract_set(&rf[r].m.contract, "profile", "vllm", 0, 0);
  if (rc) goto done;
  snprintf(w.path, sizeof w.path, "%s", e->path);
  w.cls = row->cls;
  w.contract = rf[0].m.contract;
  if ((rc = assemble(rf, W, e->path, "inputs", &w)) || (rc = assemble(rf, W, e->path, "params", &w)) ||
      (rc = assemble(rf, W, e->path, "saved", &w)) || (rc = assemble(rf, W, e->path, "grad_out", &w)))
    goto done;
  if (w.grad_out.n == 0) {
    rc = qc_err("dump '%s': module '%s': has no upstream gradient: expected at least one dataset under 'grad_out/'",
                qc_dump_path(rf[0].d), e->path);
    goto done;
  }
  for (int j = 0; j < w.grad_out.n && !rc; j++) {
    qc_tset ref = {0};
    rc = row->reference(a->ctx, &w, &w.grad_out.t[j], &ref);
    for (int r = 0; r < W && !rc; r++) rc = judge_rank(a, row, &w, rf, W, r, j, &ref);
    qc_tset_free(&ref);
  }
  if (!rc && a->info) {
    if (!(mi = qc_malloc(sizeof *mi, "module facts"))) { rc = QC_ESYS; goto done; }
    if (!(rc = qc_modinfo_fill(mi, &w, "dump", "dump", NULL))) {
      mi->cover |= 1u << QC_COV_PARALLEL; /* the trainer's own reduction across the ranks, judged per rank */
      mi->first = first;
      mi->nchecks = a->res->n - first;
      mi->seconds = qc_now_s() - t0;
      rc = qc_modinfos_add(a->info, mi);
    }
  }
done:
  free(mi);
  qc_module_free(&w);
  for (int r = 0; r < W; r++)
    if (rf[r].loaded) {
      qc_module_free(&rf[r].m);
      rf[r].loaded = 0;
    }
  return rc;
}

int qc_vjp_sharded(qc_audit *a, const qc_case *cs, const char *profile, long long *at, int *nunits) {
  rankfile *rf = NULL;
  qc_dump_entry *ents = NULL;
  int *owner = NULL, W = 0, n = 0, rc;
  if ((rc = open_ranks(cs->dump, &rf, &W))) return rc;
  if (cs->cand != QC_CAND_DUMP) {
    rc = qc_err("case '%s': a sharded dump (data.dump '%s') is audited rank by rank against the trainer's own gradients: "
                "expected \"candidate\": \"dump\"", cs->path, cs->dump);
    goto done;
  }
  if ((rc = qc_dump_modules(rf[0].d, cs->modules_re, &ents, &n))) goto done;
  if (n == 0) {
    rc = qc_err("dump '%s': no module group matches '%s': nothing to check", qc_dump_path(rf[0].d),
                cs->modules_re[0] ? cs->modules_re : ".*");
    goto done;
  }
  for (int i = 0; i < n; i++) {
    if (!qc_registry_find(ents[i].cls)) {
      rc = qc_err("dump '%s': module '%s': module class '%s' is not known", qc_dump_path(rf[0].d), ents[i].path, ents[i].cls);
      goto done;
    }
    for (int r = 1; r < W; r++)
      if (!qc_dump_exists(rf[r].d, ents[i].path)) {
        rc = qc_err("dump '%s': module '%s' is missing (rank 0's dump has it)", qc_dump_path(rf[r].d), ents[i].path);
        goto done;
      }
  }
  *nunits = n;
  if ((rc = qc_vjp_units(n, &owner))) goto done;
  for (int i = 0; i < n && !rc; i++) {
    if (owner[i] != qc_dist_rank()) continue;
    if ((rc = audit_sharded(a, cs, profile, rf, W, &ents[i], qc_registry_find(ents[i].cls)))) *at = i;
  }
done:
  free(owner);
  free(ents);
  for (int r = 0; rf && r < W; r++) qc_dump_close(rf[r].d);
  free(rf);
  return rc;
}
