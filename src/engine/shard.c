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
#include "engine/shard_priv.h"
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

/* Whether dataset `dset` of rank file d is a flat piece (FSDP1): its
 * string attribute shard_flat holds the whole tensor's shape "[a, b, ...]";
 * *nd: its dimensions (0: not flat), shape: the whole shape. */
static int shard_flat(qc_dump *d, const char *dset, int *nd, int64_t *shape) {
  char s[256];
  const char *p = s;
  int n = 0;
  *nd = 0;
  if (qc_dump_get_attr(d, dset, "shard_flat", s, sizeof s) != QC_OK) {
    long long v;
    if (qc_dump_get_int_attr(d, dset, "shard_flat", &v) == QC_EINPUT && !qc_err_msg()[0]) return QC_OK; /* absent */
    qc_err_clear();
    return qc_err("dump '%s': '%s': attribute shard_flat is not a string: expected the whole tensor's shape as \"[a, b]\"",
                  qc_dump_path(d), dset);
  }
  while (*p == ' ') p++;
  if (*p++ != '[') goto bad;
  for (;;) {
    char *end;
    long long v = strtoll(p, &end, 10);
    if (end == p || v < 1 || v > (1LL << 40) || n == QC_MAXDIM) goto bad;
    shape[n++] = v;
    for (p = end; *p == ' '; p++) {}
    if (*p == ',') { p++; continue; }
    if (*p++ == ']') break;
    goto bad;
  }
  while (*p == ' ') p++;
  if (*p) goto bad;
  *nd = n;
  return QC_OK;
bad:
  return qc_err("dump '%s': '%s': attribute shard_flat '%s': expected the whole tensor's shape as \"[a, b, ...]\" (1 to %d "
                "positive integers)", qc_dump_path(d), dset, s, QC_MAXDIM);
}

/* The length of each rank's flat piece of n elements over W ranks: n
 * zero-padded to a multiple of W, split in W equal pieces. */
static int64_t flat_len(int64_t n, int W) { return (n + W - 1) / W; }

/* The real (unpadded) elements of rank r's flat piece of length L. */
static int64_t flat_real(int64_t n, int64_t L, int r) {
  int64_t v = n - (int64_t)r * L;
  return v < 0 ? 0 : v > L ? L : v;
}

/* Where tensor `name` of role `role` is in module m ("inputs", "params", ...). */
static qc_tset *role_set(qc_module *m, const char *role) {
  return !strcmp(role, "inputs") ? &m->inputs : !strcmp(role, "params") ? &m->params : !strcmp(role, "saved") ? &m->saved
       : &m->grad_out;
}

/* Assemble flat-sharded tensor `ds` (rank 0's piece t0) into out: every
 * rank's piece 1-D of the same length ceil(n / W), the ranks agreeing on
 * the whole shape, the pieces concatenated in rank order and the padding
 * past the n elements zero (all-zero bytes). */
static int assemble_flat(rankfile *rf, int W, const char *role, const char *ds, const qc_tensor *t0, qc_tset *out) {
  int64_t sh0[QC_MAXDIM], sh[QC_MAXDIM];
  int nd0, nd, dim, rc;
  char a[96], b[96];
  if ((rc = shard_flat(rf[0].d, ds, &nd0, sh0))) return rc;
  const int64_t n = qc_shape_numel(nd0, sh0), L = flat_len(n, W);
  const size_t es = qc_dtype_size(t0->dtype);
  qc_tensor whole;
  for (int r = 0; r < W; r++) {
    const qc_tensor *t = qc_tset_get(role_set(&rf[r].m, role), t0->name);
    const char *f = qc_dump_path(rf[r].d);
    if (!t) return qc_err("dump '%s': '%s' is missing (rank 0 has it)", f, ds);
    if ((rc = shard_flat(rf[r].d, ds, &nd, sh)) || (rc = shard_dim(rf[r].d, ds, t->ndim, &dim))) return rc;
    if (dim >= 0) return qc_err("dump '%s': '%s' has both shard_dim and shard_flat: expected one of them", f, ds);
    if (nd != nd0 || memcmp(sh, sh0, (size_t)nd * sizeof *sh) != 0)
      return qc_err("dump '%s': '%s': shard_flat %s where rank 0's is %s: the ranks disagree on the whole shape", f, ds,
                    nd ? qc_shape_str(nd, sh, a, sizeof a) : "none", qc_shape_str(nd0, sh0, b, sizeof b));
    if (t->dtype != t0->dtype)
      return qc_err("dump '%s': '%s' is %s where rank 0's is %s: the ranks disagree", f, ds, qc_dtype_name(t->dtype),
                    qc_dtype_name(t0->dtype));
    if (t->ndim != 1 || t->shape[0] != L) {
      qc_hint("an fsdp_flat piece is the whole tensor flattened, zero-padded to a multiple of the world size, split in "
              "equal pieces");
      return qc_err("dump '%s': '%s' is %s: expected a flat piece [%lld] (the whole %s of %lld elements over %d ranks)", f, ds,
                    qc_shape_str(t->ndim, t->shape, a, sizeof a), (long long)L, qc_shape_str(nd0, sh0, b, sizeof b),
                    (long long)n, W);
    }
    const int64_t real = flat_real(n, L, r);
    for (size_t i = (size_t)real * es; i < (size_t)L * es; i++)
      if (((const unsigned char *)t->data)[i])
        return qc_err("dump '%s': '%s': the padding of the flat piece (elements %lld .. %lld) is not zero: the whole tensor "
                      "is zero-padded to a multiple of the world size", f, ds, (long long)real, (long long)(L - 1));
  }
  if ((rc = qc_tensor_alloc(&whole, t0->name, t0->dtype, nd0, sh0))) return rc;
  for (int r = 0; r < W; r++) {
    const qc_tensor *t = qc_tset_get(role_set(&rf[r].m, role), t0->name);
    if (flat_real(n, L, r) > 0) memcpy((char *)whole.data + (size_t)(r * L) * es, t->data, (size_t)flat_real(n, L, r) * es);
  }
  if ((rc = qc_tset_add(out, &whole))) qc_tensor_free(&whole);
  return rc;
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
    int dim0, rc, fnd;
    int64_t fsh[QC_MAXDIM];
    snprintf(ds, sizeof ds, "%s/%s/%s", path, role, t0->name);
    if ((rc = shard_dim(rf[0].d, ds, t0->ndim, &dim0)) || (rc = shard_flat(rf[0].d, ds, &fnd, fsh))) return rc;
    if (fnd) {
      if ((rc = assemble_flat(rf, W, role, ds, t0, out))) return rc;
      continue;
    }
    int64_t shape[QC_MAXDIM], total = 0;
    memcpy(shape, t0->shape, sizeof shape);
    const qc_tensor *piece[256];
    if (W > 256) return qc_err("a sharded dump of %d ranks: at most 256", W);
    for (int r = 0; r < W; r++) {
      int dr;
      const qc_tensor *t = qc_tset_get(role_set(&rf[r].m, role), t0->name);
      if (!t) return qc_err("dump '%s': '%s' is missing (rank 0 has it)", qc_dump_path(rf[r].d), ds);
      if ((rc = shard_dim(rf[r].d, ds, t->ndim, &dr)) || (rc = shard_flat(rf[r].d, ds, &fnd, fsh))) return rc;
      if (fnd) return qc_err("dump '%s': '%s' has shard_flat, rank 0's has none: the ranks disagree", qc_dump_path(rf[r].d), ds);
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

/* How tensor `name` of role `role` of module `mpath` is split over the W
 * ranks: *d the dimension (-1: whole on every rank) and off[s], len[s]
 * rank s's piece along it; a flat piece (shard_flat): *flat = 1, *d = 0 and
 * off/len its real elements in the flattened whole, *L the pieces' stored
 * length. */
static int split_of(rankfile *rf, int W, const char *mpath, const char *role, const char *name, int *d, int *flat,
                    int64_t *L, int64_t *off, int64_t *len) {
  char ds[QC_PATHLEN + QC_NAMELEN + 16];
  int64_t sh[QC_MAXDIM];
  int nd, rc;
  const qc_tensor *t = qc_tset_get(role_set(&rf[0].m, role), name);
  *flat = 0;
  *d = -1;
  if (!t) return QC_OK;
  snprintf(ds, sizeof ds, "%s/%s/%s", mpath, role, name);
  if ((rc = shard_dim(rf[0].d, ds, t->ndim, d)) || (rc = shard_flat(rf[0].d, ds, &nd, sh))) return rc;
  if (nd) {
    const int64_t n = qc_shape_numel(nd, sh);
    *flat = 1;
    *d = 0;
    *L = flat_len(n, W);
    for (int s = 0; s < W; s++) {
      off[s] = (int64_t)s * *L;
      len[s] = flat_real(n, *L, s);
    }
    return QC_OK;
  }
  for (int s = 0, o = 0; *d >= 0 && s < W; s++) {
    const qc_tensor *ts = qc_tset_get(role_set(&rf[s].m, role), name);
    off[s] = o;
    len[s] = ts->shape[*d];
    o += (int)ts->shape[*d];
  }
  return QC_OK;
}

/* Rank r's piece of whole float64 tensor t (split along d at off/len, or
 * flattened when flat), as out. */
static int piece(const qc_tensor *t, int flat, int d, const int64_t *off, const int64_t *len, int r, qc_tensor *out) {
  qc_tensor v = *t; /* a flat view of the same data */
  if (flat) {
    v.ndim = 1;
    v.shape[0] = qc_numel(t);
  }
  if (d >= v.ndim)
    return qc_err("module gradient '%s' has %d dimension(s), its tensor is split along %d", t->name, v.ndim, d);
  return qc_shard_slice(&v, d, off[r], len[r], out);
}

/* The reference on whole module w with the split tensors of the parameters
 * (params = 1) or of the other roles (params = 0) zeroed outside rank r's
 * piece: what rank r computes from its own pieces alone, before a reduction
 * over the ranks. *any = 0 (and out left empty) when no such tensor is
 * split. */
static int own_share(const qc_ctx *ctx, const qc_registry_row *row, qc_module *w, rankfile *rf, int W, int r, int j,
                     int params, qc_tset *out, int *any) {
  static const char *roles[] = {"inputs", "params", "saved", "grad_out"};
  qc_module m;
  int rc = QC_OK;
  int64_t off[256], len[256], L;
  memset(&m, 0, sizeof m);
  memcpy(m.path, w->path, sizeof m.path);
  m.cls = w->cls;
  m.contract = w->contract; /* borrowed: not freed here */
  *any = 0;
  for (int ri = 0; ri < 4 && !rc; ri++) {
    const qc_tset *src = role_set(w, roles[ri]);
    const int mask = params == !strcmp(roles[ri], "params");
    for (int i = 0; i < src->n && !rc; i++) {
      const qc_tensor *t = &src->t[i];
      qc_tensor c;
      int d = -1, flat = 0;
      if (mask && (rc = split_of(rf, W, w->path, roles[ri], t->name, &d, &flat, &L, off, len))) break;
      const size_t es = qc_dtype_size(t->dtype);
      if ((rc = qc_tensor_alloc(&c, t->name, t->dtype, t->ndim, t->shape))) break;
      if (d < 0) {
        memcpy(c.data, t->data, t->nbytes);
      } else if (flat) { /* rank r's real elements only */
        if (len[r] > 0) memcpy((char *)c.data + (size_t)off[r] * es, (const char *)t->data + (size_t)off[r] * es, (size_t)len[r] * es);
      } else { /* rank r's run of every row along d */
        const int64_t outer = qc_shape_numel(d, t->shape), inner = qc_shape_numel(t->ndim - d - 1, t->shape + d + 1);
        const size_t run = (size_t)(len[r] * inner) * es;
        for (int64_t o = 0; o < outer; o++) {
          const size_t at = (size_t)((o * t->shape[d] + off[r]) * inner) * es;
          memcpy((char *)c.data + at, (const char *)t->data + at, run);
        }
      }
      *any |= d >= 0;
      if ((rc = qc_tset_add(role_set(&m, roles[ri]), &c))) qc_tensor_free(&c);
    }
  }
  if (!rc && *any) rc = row->reference(ctx, &m, &m.grad_out.t[j], out);
  qc_tset_free(&m.inputs);
  qc_tset_free(&m.params);
  qc_tset_free(&m.saved);
  qc_tset_free(&m.grad_out);
  return rc;
}

/* Rank r's candidate g of a flat piece [L] trimmed to its len real
 * elements (out); *pad: the largest |value| in its padding. */
static int flat_candidate(const qc_tensor *g, int64_t L, int64_t len, qc_tensor *out, double *pad) {
  int rc;
  double *v = qc_malloc((size_t)L * sizeof *v, "flat gradient piece (float64)");
  *pad = 0;
  if (!v) return QC_ESYS;
  if (!(rc = qc_tensor_to_f64(g, v)))
    for (int64_t i = len; i < L; i++) *pad = fmax(*pad, fabs(v[i]));
  free(v);
  if (!rc && !(rc = qc_tensor_alloc(out, g->name, g->dtype, 1, &len)))
    memcpy(out->data, g->data, (size_t)len * qc_dtype_size(g->dtype));
  return rc;
}

/* rel-L2 of a against b (n each). */
static double rel_l2(const double *a, const double *b, int64_t n) {
  double d = 0, s = 0;
  for (int64_t i = 0; i < n; i++) {
    d += (a[i] - b[i]) * (a[i] - b[i]);
    s += b[i] * b[i];
  }
  return sqrt(d) / fmax(sqrt(s), QC_EPS_NORM);
}

/* The diagnosis of failed check k (candidate g, rank r, dY j): the
 * hypotheses of qc_shard_diagnose, with rank r's partial gradient, the
 * ranks' sum (whole gradients) and rank r's own shares (split ones), each
 * computed once per rank and dY into the caches. */
typedef struct rank_cache {
  qc_tset partial, ownp, owni;
  int have_partial, have_own, anyp, anyi;
} rank_cache;

static int diagnose_check(qc_audit *a, const qc_registry_row *row, qc_module *w, rankfile *rf, int W, int r, int j,
                          const qc_tensor *rg, const qc_tensor *refv, const qc_tensor *g, int flat, int d,
                          const int64_t *off, const int64_t *len, int64_t n, double scale, rank_cache *c, qc_check *k) {
  qc_module *mr = &rf[r].m;
  qc_tensor pp, pi, full;
  double *sum = NULL;
  int rc;
  char sp[200], si[200];
  memset(&pp, 0, sizeof pp);
  memset(&pi, 0, sizeof pi);
  memset(&full, 0, sizeof full);
  double *gd = qc_malloc((size_t)n * sizeof *gd, "candidate gradient (float64)");
  if (!gd) return QC_ESYS;
  if ((rc = qc_tensor_to_f64(g, gd))) goto done;
  if (d < 0 && !c->have_partial) { /* the reference on this rank's pieces alone: its partial gradient */
    c->have_partial = 1;
    if (row->reference(a->ctx, mr, &mr->grad_out.t[j], &c->partial)) qc_err_clear(); /* not every class has one */
  }
  if (d >= 0 && !c->have_own) { /* what this rank computes from its own pieces: a share not reduced */
    c->have_own = 1;
    if (own_share(a->ctx, row, w, rf, W, r, j, 1, &c->ownp, &c->anyp)) qc_err_clear();
    if (own_share(a->ctx, row, w, rf, W, r, j, 0, &c->owni, &c->anyi)) qc_err_clear();
  }
  if (d < 0 && (sum = qc_calloc((size_t)n, sizeof *sum, "the ranks' gradients summed"))) {
    for (int s = 0; s < W && sum; s++) { /* every rank's candidate of this gradient, summed */
      const qc_tensor *gs = rf[s].m.cand ? qc_tset_get(&rf[s].m.cand[j], rg->name) : NULL;
      double *tmp = gs && qc_numel(gs) == n ? qc_malloc((size_t)n * sizeof *tmp, "a rank's gradient") : NULL;
      if (!tmp || qc_tensor_to_f64(gs, tmp)) {
        free(sum);
        sum = NULL;
      } else {
        for (int64_t e = 0; e < n; e++) sum[e] += tmp[e];
      }
      free(tmp);
    }
  }
  const qc_tensor *op = qc_tset_get(&c->ownp, rg->name), *oi = qc_tset_get(&c->owni, rg->name);
  if (op && piece(op, flat, d, off, len, r, &pp)) memset(&pp, 0, sizeof pp);
  if (oi && piece(oi, flat, d, off, len, r, &pi)) memset(&pi, 0, sizeof pi);
  if (d >= 0 && !piece(refv, 0, d, off, len, r, &full)) { /* a share equal to the unreduced whole is no partial sum */
    for (int64_t e = 0; e < n; e++) ((double *)full.data)[e] /= scale;
    if (pp.data && qc_numel(&pp) == n && rel_l2(pp.data, full.data, n) < 1e-9) qc_tensor_free(&pp);
    if (pi.data && qc_numel(&pi) == n && rel_l2(pi.data, full.data, n) < 1e-9) qc_tensor_free(&pi);
  }
  qc_err_clear(); /* a diagnosis that cannot be made is no error */
  snprintf(sp, sizeof sp, "rank %d's own parameter pieces' share only (a partial sum): the reduction of the %d ranks' "
                          "contributions is missing", r, W);
  snprintf(si, sizeof si, "rank %d's local gradient from its own pieces of the inputs only (a partial sum): the reduction "
                          "over the %d ranks is missing", r, W);
  qc_shard_own own[2] = {{pp.data && qc_numel(&pp) == n ? pp.data : NULL, sp}, {pi.data && qc_numel(&pi) == n ? pi.data : NULL, si}};
  qc_shard_diagnose(k, gd, refv, d, off, len, r, W, qc_tset_get(&c->partial, rg->name), sum, own, 2);
done:
  qc_tensor_free(&pp);
  qc_tensor_free(&pi);
  qc_tensor_free(&full);
  free(sum);
  free(gd);
  return rc;
}

/* Judge rank r's gradients for dY j against the whole reference grads:
 * each the reference's piece of the tensor it differentiates (a slice, a
 * flat piece, or the whole). */
static int judge_rank(qc_audit *a, const qc_registry_row *row, qc_module *w, rankfile *rf, int W, int r, int j,
                      const qc_tset *ref, int mean) {
  qc_module *mr = &rf[r].m;
  const char *dyn = w->grad_out.t[j].name;
  int rc = QC_OK;
  rank_cache cache;
  memset(&cache, 0, sizeof cache);
  for (int i = 0; i < ref->n && !rc; i++) {
    const qc_tensor *rg = &ref->t[i];
    const char *base = strncmp(rg->name, "d_", 2) == 0 ? rg->name + 2 : rg->name;
    const char *role = qc_tset_get(&mr->inputs, base) ? "inputs" : qc_tset_get(&mr->params, base) ? "params" : NULL;
    const qc_tol *tol = qc_audit_tol(a, w, rg->name);
    if (!tol) { rc = QC_EINPUT; break; }
    char tname[QC_NAMELEN];
    snprintf(tname, sizeof tname, "%s@rank%d", rg->name, r);
    int d = -1, flat = 0;
    int64_t off[256], len[256], L = 0;
    if (role && (rc = split_of(rf, W, w->path, role, base, &d, &flat, &L, off, len))) break;
    if (flat && len[r] == 0) continue; /* a piece of padding only: nothing to judge */
    qc_tensor want, gt;
    memset(&want, 0, sizeof want);
    memset(&gt, 0, sizeof gt);
    qc_tensor refv = *rg; /* the reference as the pieces are cut from it */
    if (flat) {
      refv.ndim = 1;
      refv.shape[0] = qc_numel(rg);
    }
    if (d >= 0 && (rc = piece(rg, flat, d, off, len, r, &want))) {
      rc = qc_err("module '%s': %s", w->path, qc_err_msg());
      break;
    }
    const qc_tensor *exp = d >= 0 ? &want : rg;
    qc_check k;
    qc_check_init(&k, w, dyn, tname, exp->ndim, exp->shape, tol);
    const qc_tensor *g = mr->cand ? qc_tset_get(&mr->cand[j], rg->name) : NULL;
    double pad = 0;
    if (!g) {
      rc = qc_err("dump '%s': module '%s' has no dataset 'grads/%s/%s' for rank %d", qc_dump_path(rf[r].d), w->path, dyn,
                  rg->name, r);
    } else if (flat ? g->ndim != 1 || g->shape[0] != L : !qc_shape_eq(g, exp) && qc_numel(g) != qc_numel(exp)) {
      char s1[96], s2[96];
      int64_t lshape[1] = {L};
      snprintf(k.cand_dtype, sizeof k.cand_dtype, "%s", qc_dtype_name(g->dtype));
      k.verdict = QC_V_FAIL;
      snprintf(k.why, sizeof k.why, "shape %s, expected the reference's piece %s", qc_shape_str(g->ndim, g->shape, s1, sizeof s1),
               flat ? qc_shape_str(1, lshape, s2, sizeof s2) : qc_shape_str(exp->ndim, exp->shape, s2, sizeof s2));
      rc = qc_results_add(a->res, &k);
    } else {
      if (flat && !(rc = flat_candidate(g, L, len[r], &gt, &pad))) g = &gt;
      snprintf(k.cand_dtype, sizeof k.cand_dtype, "%s", qc_dtype_name(g->dtype));
      if (!rc) rc = qc_audit_compare(a->ctx, g, exp, tol, &k);
      if (!rc) rc = qc_audit_judge(w, &w->grad_out.t[j], tol, &k);
      if (!rc && pad > 0) { /* the padding's gradient is zero: anything else is a misplaced piece */
        k.verdict = QC_V_FAIL;
        snprintf(k.why, sizeof k.why, "the padding of the flat piece (elements %lld .. %lld) holds a gradient up to |%.3g|: "
                 "expected zero", (long long)len[r], (long long)(L - 1), pad);
      }
      if (!rc && k.verdict != QC_V_PASS)
        rc = diagnose_check(a, row, w, rf, W, r, j, rg, &refv, g, flat, d, off, len, qc_numel(exp),
                            mean && !strcmp(role ? role : "", "params") ? 1.0 / W : 1.0, &cache, &k);
      if (!rc) rc = qc_results_add(a->res, &k);
    }
    qc_tensor_free(&want);
    qc_tensor_free(&gt);
  }
  qc_tset_free(&cache.partial);
  qc_tset_free(&cache.ownp);
  qc_tset_free(&cache.owni);
  return rc;
}

/* The trainer's reduction of parameter gradients over the ranks, from the
 * group attribute grad_reduce (the same on every rank): *mean = 1 for
 * "mean", 0 for "sum" (the default). */
static int grad_reduce(rankfile *rf, int W, const char *path, int *mean) {
  char v0[16] = "sum", v[16];
  *mean = 0;
  for (int r = 0; r < W; r++) {
    snprintf(v, sizeof v, "sum");
    if (qc_dump_get_attr(rf[r].d, path, "grad_reduce", v, sizeof v) != QC_OK) snprintf(v, sizeof v, "sum"); /* absent: a sum */
    if (strcmp(v, "sum") != 0 && strcmp(v, "mean") != 0)
      return qc_err("dump '%s': module '%s': attribute grad_reduce '%s': expected sum or mean", qc_dump_path(rf[r].d), path, v);
    if (r == 0) snprintf(v0, sizeof v0, "%s", v);
    else if (strcmp(v, v0) != 0)
      return qc_err("dump '%s': module '%s': grad_reduce '%s' where rank 0's is '%s': the ranks disagree", qc_dump_path(rf[r].d),
                    path, v, v0);
  }
  *mean = !strcmp(v0, "mean");
  return QC_OK;
}

/* Audit module `path` (class row) over the W rank files: assemble, run the
 * reference once per dY, judge every rank. */
static int audit_sharded(qc_audit *a, const qc_case *cs, const char *profile, rankfile *rf, int W, const qc_dump_entry *e,
                         const qc_registry_row *row) {
  qc_module w;
  qc_modinfo *mi = NULL;
  char contract[4096] = "", kind[32] = "";
  int rc = QC_OK, first = a->res->n, mean = 0;
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
      !strstr("|tp_column|tp_row|vocab|expert|sequence|fsdp_flat|", kind)) { /* the kinds docs/interfaces.md describes */
    rc = qc_err("dump '%s': module '%s': attribute parallel '%s': expected tp_column, tp_row, vocab, expert, sequence or "
                "fsdp_flat",
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
  if ((rc = grad_reduce(rf, W, e->path, &mean))) goto done;
  for (int j = 0; j < w.grad_out.n && !rc; j++) {
    qc_tset ref = {0};
    rc = row->reference(a->ctx, &w, &w.grad_out.t[j], &ref);
    for (int i = 0; i < ref.n && !rc && mean; i++) { /* the trainer averages parameter gradients over the ranks */
      qc_tensor *t = &ref.t[i];
      if (strncmp(t->name, "d_", 2) != 0 || !qc_tset_get(&w.params, t->name + 2)) continue;
      for (int64_t e2 = 0; e2 < qc_numel(t); e2++) ((double *)t->data)[e2] /= W;
    }
    for (int r = 0; r < W && !rc; r++) rc = judge_rank(a, row, &w, rf, W, r, j, &ref, mean);
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
