/* shard_layout.c: reading a sharded dump's layout (engine/shard_priv.h;
 * docs/interfaces.md, "Sharded dumps"): the rank files in rank order, each
 * dataset's split (shard_dim, or shard_flat for an FSDP1 flat piece), the
 * whole tensors assembled from the pieces, and the module's grad_reduce. */
#include <glob.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/qc.h"
#include "engine/shard_priv.h"

/* Open the files of pattern, ordered by their root attribute `rank`: one
 * per rank 0 .. world_size-1. */
int qc_shard_open(const char *pattern, qc_rankfile **out, int *world) {
  glob_t g;
  int rc = QC_OK, W = 0;
  qc_rankfile *rf = NULL;
  *out = NULL;
  int e = glob(pattern, 0, NULL, &g);
  if (e == GLOB_NOMATCH || (e == 0 && g.gl_pathc == 0)) {
    qc_hint("a sharded dump is one file per rank, e.g. \"dump\": \"step.rank*.h5\"");
    return qc_err("data.dump '%s': no file matches the pattern", pattern);
  }
  if (e) return qc_err_sys("data.dump '%s': cannot list the files of the pattern", pattern);
  W = (int)g.gl_pathc;
  if (W > 256) {
    rc = qc_err("data.dump '%s': %d files match: a sharded dump holds at most 256 ranks", pattern, W);
    goto done;
  }
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
  qc_err_state es; /* absent: not flat; present but not a string: this message instead of the probes' */
  qc_err_save(&es);
  if (qc_dump_get_attr(d, dset, "shard_flat", s, sizeof s) != QC_OK) {
    long long v;
    const int absent = qc_dump_get_int_attr(d, dset, "shard_flat", &v) == QC_EINPUT && !qc_err_msg()[0];
    qc_err_restore(&es);
    if (absent) return QC_OK;
    return qc_err("dump '%s': '%s': attribute shard_flat is not a string: expected the whole tensor's shape as \"[a, b]\"",
                  qc_dump_path(d), dset);
  }
  qc_err_restore(&es);
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
qc_tset *qc_shard_role(qc_module *m, const char *role) {
  return !strcmp(role, "inputs") ? &m->inputs : !strcmp(role, "params") ? &m->params : !strcmp(role, "saved") ? &m->saved
       : &m->grad_out;
}

/* Assemble flat-sharded tensor `ds` (rank 0's piece t0) into out: every
 * rank's piece 1-D of the same length ceil(n / W), the ranks agreeing on
 * the whole shape, the pieces concatenated in rank order and the padding
 * past the n elements zero (all-zero bytes). */
static int assemble_flat(qc_rankfile *rf, int W, const char *role, const char *ds, const qc_tensor *t0, qc_tset *out) {
  int64_t sh0[QC_MAXDIM], sh[QC_MAXDIM];
  int nd0, nd, dim, rc;
  char a[96], b[96];
  if ((rc = shard_flat(rf[0].d, ds, &nd0, sh0))) return rc;
  const int64_t n = qc_shape_numel(nd0, sh0), L = flat_len(n, W);
  const size_t es = qc_dtype_size(t0->dtype);
  qc_tensor whole;
  for (int r = 0; r < W; r++) {
    const qc_tensor *t = qc_tset_get(qc_shard_role(&rf[r].m, role), t0->name);
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
    const qc_tensor *t = qc_tset_get(qc_shard_role(&rf[r].m, role), t0->name);
    if (flat_real(n, L, r) > 0) memcpy((char *)whole.data + (size_t)(r * L) * es, t->data, (size_t)flat_real(n, L, r) * es);
  }
  if ((rc = qc_tset_add(out, &whole))) qc_tensor_free(&whole);
  return rc;
}

/* Assemble role `role` of the whole module w from the ranks' pieces: split
 * tensors concatenated along their shard_dim in rank order, whole ones
 * checked equal on every rank. */
int qc_shard_assemble(qc_rankfile *rf, int W, const char *path, const char *role, qc_module *w) {
  const qc_tset *s0 = qc_shard_role(&rf[0].m, role);
  qc_tset *out = qc_shard_role(w, role);
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
      const qc_tensor *t = qc_tset_get(qc_shard_role(&rf[r].m, role), t0->name);
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
int qc_shard_split(qc_rankfile *rf, int W, const char *mpath, const char *role, const char *name, int *d, int *flat,
                    int64_t *L, int64_t *off, int64_t *len) {
  char ds[QC_PATHLEN + QC_NAMELEN + 16];
  int64_t sh[QC_MAXDIM];
  int nd, rc;
  const qc_tensor *t = qc_tset_get(qc_shard_role(&rf[0].m, role), name);
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
    const qc_tensor *ts = qc_tset_get(qc_shard_role(&rf[s].m, role), name);
    off[s] = o;
    len[s] = ts->shape[*d];
    o += (int)ts->shape[*d];
  }
  return QC_OK;
}

/* The trainer's reduction of parameter gradients over the ranks, from the
 * group attribute grad_reduce (the same on every rank): *mean = 1 for
 * "mean", 0 for "sum" (the default). */
int qc_shard_grad_reduce(qc_rankfile *rf, int W, const char *path, int *mean) {
  char v0[16] = "sum", v[16];
  *mean = 0;
  for (int r = 0; r < W; r++) {
    long long x;
    qc_err_state es; /* absent: a sum; present but not a string: this message instead of the probes' */
    qc_err_save(&es);
    if (qc_dump_get_attr(rf[r].d, path, "grad_reduce", v, sizeof v) != QC_OK) {
      if (qc_dump_get_int_attr(rf[r].d, path, "grad_reduce", &x) != QC_EINPUT || qc_err_msg()[0]) {
        qc_err_restore(&es);
        return qc_err("dump '%s': module '%s': attribute grad_reduce is not a string: expected sum or mean",
                      qc_dump_path(rf[r].d), path);
      }
      snprintf(v, sizeof v, "sum"); /* absent: a sum */
    }
    qc_err_restore(&es);
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
