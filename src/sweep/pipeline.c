/* pipeline.c: the units of the planned groups run on the backend (see
 * plan.h): worker threads read units u+1 .. u+ahead (weight, dYs, X as
 * stored, each checked finite) into pinned host slots through the
 * read-ahead (io/prefetch.h) while the main thread runs unit u: upload,
 * widen, quantize, GEMMs and metrics queued in order, then waited for; on a
 * device the host queues unit u+1 while the device still runs unit u.
 * Over 500 lines: the read-ahead's slots, the backend's work buffers and
 * the loop that hands slots from one to the other share the unit's types
 * and lifetimes, which read best in one place. */
#include <float.h>
#include <limits.h>
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "core/number.h"
#include "core/progress.h"
#include "core/qc.h"
#include "io/prefetch.h"
#include "model/check.h"
#include "numerics/formats.h"
#include "sweep/plan.h"

const char qc_sweep_t_dx[] = "d_x", qc_sweep_t_dw[] = "d_weight";

static int push_row(qc_sweep *s, qc_crow **out) {
  if (s->n == s->cap) {
    int nc = s->cap ? 2 * s->cap : 64;
    void *p = realloc(s->rows, (size_t)nc * sizeof *s->rows);
    if (!p) return qc_err_sys("out of memory for contract rows");
    s->rows = p;
    s->cap = nc;
  }
  *out = &s->rows[s->n++];
  memset(*out, 0, sizeof **out);
  return QC_OK;
}

/* Add a row comparing buffer g with r (rows x cols) through the backend's
 * queued metrics; its verdict is given after its unit's work is done
 * (judge_rows). The rows array does not move meanwhile (reserved for the
 * whole sweep before the first unit). */
static int add_row(qc_sweep *s, const qc_backend *be, const sw_plan *pl, const char *module, const char *tensor,
                   const char *wf, const char *af, const char *dy, int64_t rows, int64_t cols, const double *g,
                   const double *r) {
  qc_crow *w = NULL;
  int rc = push_row(s, &w);
  if (rc) return rc;
  snprintf(w->module, sizeof w->module, "%s", module);
  snprintf(w->profile, sizeof w->profile, "%s", pl->profile);
  snprintf(w->profile_why, sizeof w->profile_why, "%s", pl->profile_why);
  qc_contract_classify(module, w->cls, sizeof w->cls, &w->layer, &w->expert);
  snprintf(w->wfmt, sizeof w->wfmt, "%s", wf);
  if (s->deployed) snprintf(w->wfmt_why, sizeof w->wfmt_why, "%s", pl->wfmt_why);
  snprintf(w->afmt, sizeof w->afmt, "%s", af);
  snprintf(w->dy, sizeof w->dy, "%s", dy);
  w->tensor = tensor;
  w->shape[0] = rows;
  w->shape[1] = cols;
  double t0 = qc_now_s();
  rc = be->metrics_buf(be, g, r, rows * cols, &w->m);
  s->t_metrics += qc_now_s() - t0;
  return rc;
}

/* Verdicts of rows [from, to) against the thresholds. */
static void judge_rows(qc_sweep *s, const qc_sweep_opts *o, int from, int to) {
  qc_tol tol;
  memset(&tol, 0, sizeof tol);
  tol.has_cosine_min = o->has_cos_min;
  tol.cosine_min = o->cos_min;
  tol.has_norm_ratio = o->has_norm;
  tol.norm_lo = o->norm_lo;
  tol.norm_hi = o->norm_hi;
  for (int i = from; i < to; i++) {
    qc_crow *w = &s->rows[i];
    w->fail = qc_judge(&w->m, &tol, w->why, sizeof w->why) != QC_V_PASS;
  }
}

/* Room for `more` rows, so that queued metrics can point into the array. */
static int reserve_rows(qc_sweep *s, int more) {
  if (s->n + more <= s->cap) return QC_OK;
  int nc = s->cap ? s->cap : 64;
  while (nc < s->n + more) nc *= 2;
  void *p = realloc(s->rows, (size_t)nc * sizeof *s->rows);
  if (!p) return qc_err_sys("out of memory for contract rows");
  s->rows = p;
  s->cap = nc;
  return QC_OK;
}

/* GEMM on backend buffers, timed and counted. */
static int gemm(qc_sweep *s, const qc_backend *be, qc_op ta, int64_t m, int64_t n, int64_t k, const double *A,
                int64_t lda, const double *B, double *C) {
  double t0 = qc_now_s();
  int rc = be->gemm_f64_buf(be, ta, QC_OP_N, m, n, k, A, lda, B, n, C, n);
  s->t_gemm += qc_now_s() - t0;
  s->gemm_flops += 2.0 * (double)m * (double)n * (double)k;
  return rc;
}

/* ---- the pipeline -----------------------------------------------------------
 * Worker threads read units u+1 .. u+ahead (weight, dYs, X as stored, each
 * checked finite) into pinned host slots while the main thread runs unit u
 * on the backend: upload, widen, quantize, GEMMs and metrics queued in
 * order, then waited for (run_units: on a device unit u+1 is queued before
 * unit u is waited for). Located tensors (a contiguous HDF5 dataset, any
 * safetensors tensor) are read without a library call, so the workers read
 * in parallel; others (chunked or filtered HDF5) through the source's
 * read_into under a lock. */

typedef struct sizes {
  int64_t nk, mn, mk, ndy;     /* largest N*K, M*N, M*K and dY count over the groups */
  size_t wb, yb, xb;           /* largest weight, one dY and one X as stored (bytes) */
} sizes;

/* One unit's data as stored: a slot of the read-ahead. */
typedef struct slot {
  const sw_plan *g;
  int e;
  char module[QC_PATHLEN + 16];
  void *w;                     /* [N, K] of g->wloc.dtype */
  void *y;                     /* [ndy] x z->yb: dY datasets as stored */
  void *x;                     /* [z->xb]: X as stored (one X for every dY of a unit) */
  double t_read;
  const sizes *z;
} slot;

static pthread_mutex_t g_read_lock = PTHREAD_MUTEX_INITIALIZER;

/* The flat index of the first non-finite element of buf (n of dt), or -1.
 * Chunks of 4096 are OR-reduced without branches (vector lanes), and only a
 * chunk that holds one is searched. */
static int64_t first_nonfinite(const void *buf, qc_dtype dt, int64_t n) {
  for (int64_t c0 = 0; c0 < n; c0 += 4096) {
    int64_t c1 = c0 + 4096 < n ? c0 + 4096 : n;
    unsigned bad = 0;
    switch (dt) {
      case QC_F64:
        for (int64_t i = c0; i < c1; i++) {
          uint64_t u;
          memcpy(&u, (const double *)buf + i, 8);
          bad |= (u & 0x7ff0000000000000ull) == 0x7ff0000000000000ull;
        }
        break;
      case QC_F32:
        for (int64_t i = c0; i < c1; i++) {
          uint32_t u;
          memcpy(&u, (const float *)buf + i, 4);
          bad |= (u & 0x7f800000u) == 0x7f800000u;
        }
        break;
      case QC_F16:
        for (int64_t i = c0; i < c1; i++) bad |= (((const uint16_t *)buf)[i] & 0x7c00) == 0x7c00;
        break;
      default: /* bfloat16 */
        for (int64_t i = c0; i < c1; i++) bad |= (((const uint16_t *)buf)[i] & 0x7f80) == 0x7f80;
        break;
    }
    if (!bad) continue;
    for (int64_t i = c0; i < c1; i++) {
      double v = dt == QC_F64 ? ((const double *)buf)[i]
                 : dt == QC_F32 ? ((const float *)buf)[i]
                 : dt == QC_F16 ? qc_f16_to_f32(((const uint16_t *)buf)[i])
                                : qc_bf16_to_f32(((const uint16_t *)buf)[i]);
      if (!isfinite(v)) return i;
    }
  }
  return -1;
}

/* One located tensor of source src (slice e when per-expert) into buf,
 * checked finite; `quantized`: float64 values must also fit float32, the
 * quantizers' input. */
static int read_one(slot *sl, const qc_tsrc *src, const char *dset, const qc_tloc *loc, int per_expert, int64_t rows,
                    int64_t cols, void *buf, int quantized) {
  int rc;
  if (loc->offset >= 0) {
    qc_tloc l = *loc;
    if (per_expert) l.offset += (long long)sl->e * (long long)l.nbytes;
    rc = qc_tsrc_pread(src, dset, &l, buf);
  } else {
    pthread_mutex_lock(&g_read_lock);
    rc = qc_tsrc_read_into(src, dset, per_expert ? sl->e : -1, buf, loc->nbytes);
    pthread_mutex_unlock(&g_read_lock);
  }
  if (rc) return rc;
  char where[40] = "";
  if (per_expert) snprintf(where, sizeof where, " (expert %d)", sl->e);
  int64_t i = first_nonfinite(buf, loc->dtype, rows * cols);
  if (i >= 0) {
    double v = loc->dtype == QC_F64 ? ((const double *)buf)[i]
               : loc->dtype == QC_F32 ? ((const float *)buf)[i]
               : loc->dtype == QC_F16 ? qc_f16_to_f32(((const uint16_t *)buf)[i])
                                      : qc_bf16_to_f32(((const uint16_t *)buf)[i]);
    return qc_err("%s%s: non-finite value %g at [%lld, %lld]: expected finite values", dset, where, v,
                  (long long)(i / cols), (long long)(i % cols));
  }
  if (!quantized || loc->dtype != QC_F64) return QC_OK;
  for (i = 0; i < rows * cols; i++)
    if (fabs(((const double *)buf)[i]) > FLT_MAX)
      return qc_err("%s%s: value %g at [%lld, %lld] overflows float32, the quantizers' input type", dset, where,
                    ((const double *)buf)[i], (long long)(i / cols), (long long)(i % cols));
  return QC_OK;
}

/* Read the slot's unit: everything as stored, nothing converted. */
static int prepare(slot *sl) {
  const sw_plan *g = sl->g;
  const sizes *z = sl->z;
  double t0 = qc_now_s();
  int rc = read_one(sl, g->wsrc, g->wdset, &g->wloc, g->experts, g->N, g->K, sl->w, 1);
  for (int i = 0; i < g->ndy && !rc; i++) {
    const sw_src *y = &g->dy[i];
    if (y->dset[0])
      rc = read_one(sl, y->src, y->dset, &y->loc, y->per_expert, y->M, g->N, (char *)sl->y + (size_t)i * z->yb, 0);
  }
  if (!rc && g->need_x && g->x.dset[0]) /* every dY of the unit has X's tokens (plan_group) */
    rc = read_one(sl, g->x.src, g->x.dset, &g->x.loc, g->x.per_expert, g->x.M, g->K, sl->x, 1);
  sl->t_read = qc_now_s() - t0;
  return rc;
}

/* The backend's buffers for one unit. One set serves the pipelined units
 * too: the backend runs its ops in the order they were queued (one
 * stream), so unit u+1's ops overwrite these buffers only after unit u's
 * ops are done with them; what the host reads (metrics) goes out through
 * the fence, and the slots' host memory stays held until its unit's fence. */
typedef struct work {
  void *wraw, *yraw, *xraw;    /* uploads of the slot (NULL on a host-memory backend) */
  double *w64, *wq64;          /* [N, K] master and a dequantized weight */
  double *y64;                 /* [ndy][M, N] dY datasets widened */
  double *xm;                  /* [ndy][M, K] dY W */
  double *x64, *xq64;          /* [M, K] X and a quantized X */
  double *rw;                  /* [N, K] dY^T X */
  double *a;                   /* [max(M K, N K)] a candidate */
  float *scratch;              /* [max(N K, M K)] a quantizer's float32 input */
  const double **y64p;         /* [ndy] each dY's float64 buffer (its own, or the generated one) */
} work;

static void work_free(work *w, const qc_backend *be) {
  void *p[] = {w->wraw, w->yraw, w->xraw, w->w64, w->wq64, w->y64, w->xm, w->x64, w->xq64, w->rw, w->a, w->scratch};
  for (size_t i = 0; i < sizeof p / sizeof p[0]; i++)
    if (p[i]) be->buf_free(be, p[i]);
  free(w->y64p);
  memset(w, 0, sizeof *w);
}

static int work_alloc(work *w, const qc_backend *be, const sizes *z, int need_x) {
  memset(w, 0, sizeof *w);
  int64_t big = z->nk > z->mk ? z->nk : z->mk;
  int rc = be->buf_alloc(be, (size_t)z->nk * 8, "master weight (float64)", (void **)&w->w64);
  if (!rc) rc = be->buf_alloc(be, (size_t)z->nk * 8, "dequantized weight (float64)", (void **)&w->wq64);
  if (!rc) rc = be->buf_alloc(be, (size_t)(z->mn * z->ndy) * 8, "dY (float64)", (void **)&w->y64);
  if (!rc) rc = be->buf_alloc(be, (size_t)(z->mk * z->ndy) * 8, "dY W (float64)", (void **)&w->xm);
  if (!rc) rc = be->buf_alloc(be, (size_t)big * 8, "a candidate gradient", (void **)&w->a);
  if (!rc) rc = be->buf_alloc(be, (size_t)big * 4, "quantizer input (float32)", (void **)&w->scratch);
  if (!rc && need_x) rc = be->buf_alloc(be, (size_t)z->mk * 8, "X (float64)", (void **)&w->x64);
  if (!rc && need_x) rc = be->buf_alloc(be, (size_t)z->mk * 8, "quantized X (float64)", (void **)&w->xq64);
  if (!rc && need_x) rc = be->buf_alloc(be, (size_t)z->nk * 8, "dY^T X (float64)", (void **)&w->rw);
  if (!rc && !be->host_memory) {
    rc = be->buf_alloc(be, z->wb, "weight as stored", &w->wraw);
    if (!rc) rc = be->buf_alloc(be, z->yb * (size_t)z->ndy, "dY as stored", &w->yraw);
    if (!rc && need_x) rc = be->buf_alloc(be, z->xb, "X as stored", &w->xraw);
  }
  if (!rc && !(w->y64p = calloc((size_t)z->ndy, sizeof *w->y64p))) rc = qc_err_sys("out of memory");
  if (rc) work_free(w, be);
  return rc;
}

/* The slot's bytes at `host` on the backend: the host pointer itself on a
 * host-memory backend, else uploaded into dev. */
static int stage(const qc_backend *be, void *dev, const void *host, size_t bytes, const void **out) {
  if (be->host_memory) { *out = host; return QC_OK; }
  *out = dev;
  return be->upload(be, dev, host, bytes);
}

/* Queue the unit of slot sl on the backend: the GEMMs and one row per (dY,
 * format), rows appended to s with metrics pending (finish_unit judges
 * them). On the CPU the work is done when this returns. */
static int queue_unit(const qc_backend *be, const qc_sweep_opts *o, const slot *sl, work *w, const sw_gens *G, qc_sweep *s) {
  const sw_plan *g = sl->g;
  const sizes *z = sl->z;
  const int64_t N = g->N, K = g->K;
  const char *prof = g->profile;
  const void *wsrc, *ysrc = NULL, *xsrc = NULL;
  const double **y64 = w->y64p;
  char what[QC_PATHLEN + 64];
  int rc;
  double t0;
  if ((rc = reserve_rows(s, g->ndy * (o->deployed ? 2 * o->na : o->nw + o->na)))) return rc;
  /* the weight, widened; each dY widened (or the shared generated one) */
  if ((rc = stage(be, w->wraw, sl->w, g->wloc.nbytes, &wsrc))) return rc;
  if ((rc = be->to_f64(be, g->wloc.dtype, wsrc, N * K, w->w64))) return rc;
  for (int i = 0; i < g->ndy; i++) {
    const sw_src *y = &g->dy[i];
    if (!y->dset[0]) { y64[i] = G->v[y->gen].buf; continue; }
    if ((rc = stage(be, (char *)w->yraw + (size_t)i * z->yb, (const char *)sl->y + (size_t)i * z->yb, y->loc.nbytes, &ysrc)) ||
        (rc = be->to_f64(be, y->loc.dtype, ysrc, y->M * N, w->y64 + i * z->mn)))
      return rc;
    y64[i] = w->y64 + i * z->mn;
  }
  /* d_x rows: dY W against dY dequant(quant(W)) */
  for (int i = 0; i < g->ndy; i++)
    if ((rc = gemm(s, be, QC_OP_N, g->dy[i].M, K, N, y64[i], N, w->w64, w->xm + i * z->mk))) return rc;
  snprintf(what, sizeof what, "%s/params/weight", sl->module);
  const int nw = o->deployed ? 1 : o->nw;
  for (int f = 0; f < nw; f++) {
    const char *wf = o->deployed ? g->wfmt : o->wfmt[f];
    const int unq = strcmp(wf, "none") == 0; /* a layer deployed unquantized: its forward used the master */
    const double *wq = w->w64;
    if (!unq) {
      t0 = qc_now_s();
      rc = be->fake_quant_f64(be, wf, prof, N, K, g->wloc.dtype, wsrc, w->scratch, w->wq64, what);
      s->t_quant += qc_now_s() - t0;
      if (rc) return rc;
      wq = w->wq64;
    }
    for (int i = 0; i < g->ndy; i++) {
      const int64_t M = g->dy[i].M;
      const double *r = w->xm + i * z->mk, *gx = r; /* unquantized: both conventions are the same dX */
      if (!unq || !o->deployed) {
        if ((rc = gemm(s, be, QC_OP_N, M, K, N, y64[i], N, wq, w->a))) return rc;
        gx = w->a;
      }
      /* deployed: one row per activation format declared (the combination);
       * with one dY, dX does not depend on it under the identity STE */
      for (int a = 0; a < (o->deployed ? o->na : 1); a++)
        if ((rc = add_row(s, be, g, sl->module, qc_sweep_t_dx, wf, o->deployed ? o->afmt[a] : "none", g->dy[i].name, M, K,
                          gx, r)))
          return rc;
    }
  }
  /* d_weight rows: dY^T X against dY^T dequant(quant(X)) */
  snprintf(what, sizeof what, "%s/inputs/x", sl->module);
  if (g->need_x && g->x.dset[0] &&
      ((rc = stage(be, w->xraw, sl->x, g->x.loc.nbytes, &xsrc)) || (rc = be->to_f64(be, g->x.loc.dtype, xsrc, g->x.M * K, w->x64))))
    return rc;
  for (int i = 0; g->need_x && i < g->ndy; i++) {
    const int64_t M = g->dy[i].M;
    const double *x64;
    qc_dtype xdt = QC_F64;
    if (g->x.dset[0]) {
      x64 = w->x64;
      xdt = g->x.loc.dtype;
    } else {
      x64 = xsrc = G->v[g->dy[i].xgen].buf;
    }
    if ((rc = gemm(s, be, QC_OP_T, N, K, M, y64[i], N, x64, w->rw))) return rc;
    for (int a = 0; a < o->na; a++) {
      if (strcmp(o->afmt[a], "none") == 0) continue;
      t0 = qc_now_s();
      rc = be->fake_quant_f64(be, o->afmt[a], prof, M, K, xdt, xsrc, w->scratch, w->xq64, what);
      s->t_quant += qc_now_s() - t0;
      if (rc || (rc = gemm(s, be, QC_OP_T, N, K, M, y64[i], N, w->xq64, w->a)) ||
          (rc = add_row(s, be, g, sl->module, qc_sweep_t_dw, o->deployed ? g->wfmt : "none", o->afmt[a], g->dy[i].name, N,
                        K, w->a, w->rw)))
        return rc;
    }
  }
  return QC_OK;
}

/* Unit u (slot sl, rows [from, to)) finished: wait for its work (its fence
 * when pipelined, else everything queued), judge its rows, release its slot
 * (the uploads from it are done). */
static int finish_unit(const qc_backend *be, const qc_sweep_opts *o, qc_sweep *s, int pipelined, int u, const slot *sl,
                       int from, int to, qc_prefetch *pf, qc_progress *pg) {
  double t0 = qc_now_s();
  int rc = pipelined ? be->wait_fence(be, u % QC_FENCES) : be->sync(be);
  s->t_sync += qc_now_s() - t0;
  if (rc) return rc;
  judge_rows(s, o, from, to);
  qc_progress_step(pg, u + 1, sl->module);
  return qc_prefetch_release(pf, u);
}

/* Point slot sl at unit u (group and expert) of the plans. */
static int slot_set(slot *sl, const sw_plan *plans, const int *ug, const int *ue, int u) {
  sl->g = &plans[ug[u]];
  sl->e = ue[u];
  if (sl->g->experts) return qc_contract_expert_name(sl->g->path, sl->e, sl->module, sizeof sl->module);
  snprintf(sl->module, sizeof sl->module, "%s", sl->g->path);
  return QC_OK;
}

/* How many units are read ahead on worker threads while the main thread
 * runs one on the backend (0: none, one unit in memory). Reading is a copy
 * out of the page cache and a finiteness scan, light next to the GEMMs: on
 * the CPU one reader (when there are 2 or more cores); on a device, where
 * the reads are the floor, half the cores, at most QC_MAX_AHEAD; never more
 * slots than a quarter of physical memory holds. QATCHECK_AHEAD=N overrides. */
#define QC_MAX_AHEAD 8
static int units_ahead(const qc_backend *be, size_t slot_bytes) {
  double v = qc_env_value("QATCHECK_AHEAD", -1); /* 0 .. QC_MAX_AHEAD (core/number.c) */
  if (v >= 0) return v > QC_MAX_AHEAD ? QC_MAX_AHEAD : (int)v;
  long ncpu = sysconf(_SC_NPROCESSORS_ONLN);
  int p = be->host_memory ? (ncpu >= 2 ? 1 : 0) : (ncpu >= 4 ? (int)(ncpu / 2) : 1);
  if (p > QC_MAX_AHEAD) p = QC_MAX_AHEAD;
  double mem = (double)sysconf(_SC_PHYS_PAGES) * (double)sysconf(_SC_PAGESIZE);
  while (p > 0 && (double)(p + 1) * (double)slot_bytes > 0.25 * mem) p--;
  return p;
}

static void slot_free(slot *sl, const qc_backend *be) {
  if (sl->w) be->host_free(be, sl->w);
  if (sl->y) be->host_free(be, sl->y);
  if (sl->x) be->host_free(be, sl->x);
  sl->w = sl->y = sl->x = NULL;
}

static int slot_alloc(slot *sl, const qc_backend *be, const sizes *z, int need_x) {
  int rc = be->host_alloc(be, z->wb, "a unit's weight", &sl->w);
  if (!rc) rc = be->host_alloc(be, z->yb * (size_t)z->ndy, "a unit's dY", &sl->y);
  if (!rc && need_x) rc = be->host_alloc(be, z->xb, "a unit's X", &sl->x);
  return rc;
}

/* The read-ahead's fetch (qc_fetch_fn): unit `u` into slot `k`. */
typedef struct units {
  const sw_plan *plans;
  const int *ug, *ue;          /* unit -> plan index, expert */
  slot *sl;
} units;

static int fetch_unit(void *arg, int u, int k) {
  units *U = arg;
  slot *sl = &U->sl[k];
  int rc = slot_set(sl, U->plans, U->ug, U->ue, u);
  return rc ? rc : prepare(sl);
}

/* Run every unit: units u+1 .. u+ahead are read while unit u computes.
 * Pipelined (a device backend with fences, 2 or more units read ahead):
 * unit u is queued and fenced, then unit u-1 is waited for, judged and its
 * slot released, so the device goes from unit u-1 to unit u without waiting
 * for the host. Unit u-1's slot is held past the wait for unit u, which the
 * read-ahead serves with ahead >= 1 (its next read starts at the release);
 * ahead 1 would serialize that read with the queueing, so 0 and 1 keep the
 * plain order (queue, wait, judge, release). */
int qc_sweep_run_units(const qc_backend *be, const qc_sweep_opts *o, const sw_plan *plans, int nplan,
                     const sw_gens *G, qc_sweep *s, int *plan_end, int *failed) {
  sizes z = {1, 1, 1, 1, 1, 1, 1};
  int need_x = 0, rc = QC_OK;
  int64_t nrows = 0;
  for (int i = 0; i < nplan; i++) {
    const sw_plan *g = &plans[i];
    if (g->N * g->K > z.nk) z.nk = g->N * g->K;
    if (g->wloc.nbytes > z.wb) z.wb = g->wloc.nbytes;
    if (g->ndy > z.ndy) z.ndy = g->ndy;
    need_x |= g->need_x;
    for (int j = 0; j < g->ndy; j++) {
      const int64_t M = g->dy[j].M;
      if (M * g->N > z.mn) z.mn = M * g->N;
      if (M * g->K > z.mk) z.mk = M * g->K;
      if (g->dy[j].loc.nbytes > z.yb) z.yb = g->dy[j].loc.nbytes;
    }
    if (g->need_x && g->x.loc.nbytes > z.xb) z.xb = g->x.loc.nbytes;
    nrows += (int64_t)g->E * g->ndy * (o->deployed ? 2 * o->na : o->nw + o->na); /* at most, per unit: each dY by each format */
  }
  /* per-dY strides in whole 256-byte lines: every dY's buffers stay aligned
   * for the device's vector loads */
  z.mn = (z.mn + 31) / 32 * 32;
  z.mk = (z.mk + 31) / 32 * 32;
  z.yb = (z.yb + 255) / 256 * 256;
  int *ug = malloc((size_t)s->units * sizeof *ug), *ue = malloc((size_t)s->units * sizeof *ue);
  slot *sl = NULL;
  int nslot = 0;
  work w;
  qc_prefetch pf;
  qc_progress pg;
  memset(&w, 0, sizeof w);
  memset(&pf, 0, sizeof pf);
  qc_progress_start(&pg, "contract", "units", s->units);
  if (!o->progress) pg.on = 0;
  if (!ug || !ue) { rc = qc_err_sys("out of memory"); goto out; }
  /* every row's place now: pending metrics point into the array, and a
   * pipelined unit's stay pending while the next unit adds its rows */
  if (nrows > INT_MAX - s->n) { rc = qc_err("the sweep would have %lld rows: more than %d", (long long)nrows, INT_MAX - s->n); goto out; }
  if ((rc = reserve_rows(s, (int)nrows))) goto out;
  for (int i = 0, u = 0; i < nplan; i++)
    for (int e = 0; e < plans[i].E; e++, u++) { ug[u] = i; ue[u] = e; }
  int ahead = units_ahead(be, z.wb + (z.yb + (need_x ? z.xb : 0)) * (size_t)z.ndy);
  if (ahead > s->units - 1) ahead = s->units > 1 ? s->units - 1 : 0;
  nslot = ahead + 1;
  sl = calloc((size_t)nslot, sizeof *sl);
  if (!sl) { rc = qc_err_sys("out of memory"); goto out; }
  for (int k = 0; k < nslot; k++) {
    qc_err_state es; /* a slot after the first is speculative */
    qc_err_save(&es);
    if ((rc = slot_alloc(&sl[k], be, &z, need_x))) {
      /* pinned memory can run out before physical memory does: read
       * fewer units ahead (the rows are the same) rather than give up */
      slot_free(&sl[k], be);
      if (k == 0) {
        qc_err_keep(&es);
        goto out;
      }
      if (qc_verbose) fprintf(stderr, "qatcheck: contract: %s: reading %d unit(s) ahead instead of %d\n", qc_err_msg(), k - 1, ahead);
      qc_err_restore(&es);
      rc = QC_OK;
      nslot = k;
      ahead = k - 1;
      break;
    }
    qc_err_restore(&es);
    sl[k].z = &z;
  }
  s->ahead = ahead;
  if ((rc = work_alloc(&w, be, &z, need_x))) goto out;
  units U = {.plans = plans, .ug = ug, .ue = ue, .sl = sl};
  const int pipelined = !be->host_memory && be->fence && be->wait_fence && ahead >= 2;
  s->in_flight = pipelined ? 2 : 1;
  const qc_crow *rows0 = s->rows;
  int held = -1, held_k = 0, held_from = 0, held_to = 0; /* pipelined: the unit queued before, not yet finished */
  /* units 0 .. ahead-1 start now (unit 0 in this thread when ahead is 0) */
  if ((rc = qc_prefetch_start(&pf, s->units, ahead, fetch_unit, &U))) goto out;
  for (int u = 0; u < s->units; u++) {
    int k, from = s->n;
    double t0 = qc_now_s();
    *failed = ug[u];
    rc = qc_prefetch_wait(&pf, u, &k); /* and unit u+ahead starts in a free slot */
    s->t_wait += qc_now_s() - t0;
    if (rc) goto out;
    slot *cur = &sl[k];
    s->t_read += cur->t_read;
    t0 = qc_now_s();
    rc = queue_unit(be, o, cur, &w, G, s);
    if (!rc && pipelined) rc = be->fence(be, u % QC_FENCES);
    s->t_queue += qc_now_s() - t0;
    if (rc) goto out;
    if (s->rows != rows0) { rc = qc_err_sys("contract: the rows moved while their metrics were pending"); goto out; }
    if (ue[u] == plans[ug[u]].E - 1) plan_end[ug[u]] = s->n; /* the plan's rows are all queued */
    if (!pipelined) {
      if ((rc = finish_unit(be, o, s, 0, u, cur, from, s->n, &pf, &pg))) goto out;
      continue;
    }
    if (held >= 0) {
      *failed = ug[held]; /* a failure in the wait is the held unit's */
      if ((rc = finish_unit(be, o, s, 1, held, &sl[held_k], held_from, held_to, &pf, &pg))) goto out;
    }
    held = u;
    held_k = k;
    held_from = from;
    held_to = s->n;
  }
  if (held >= 0) {
    *failed = ug[held];
    rc = finish_unit(be, o, s, 1, held, &sl[held_k], held_from, held_to, &pf, &pg);
  }
  if (!rc) *failed = -1;
out:
  qc_progress_end(&pg);
  qc_prefetch_stop(&pf);
  if (rc) be->sync(be); /* nothing queued may outlive the buffers (nor the fenced metrics' rows) */
  for (int k = 0; sl && k < nslot; k++) slot_free(&sl[k], be);
  free(sl);
  work_free(&w, be);
  free(ug);
  free(ue);
  return rc;
}
