/* contract_sweep.c: layer 2 over a checkpoint (see contract_sweep.h). One
 * unit (a module, or one expert of a routed-experts group) is in memory at a
 * time: its weight, its dYs and their dX / dW. */
#include "sweep/sweep.h"

#include <ctype.h>
#include <float.h>
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "backend/backend.h"
#include "io/dump.h"
#include "numerics/formats.h"
#include "numerics/quant.h"
#include "core/qc.h"
#include "core/rng.h"
#include "model/check.h"

#define DSETLEN (QC_PATHLEN + 160)


/* ---- names ---------------------------------------------------------------- */

/* Is [s, s+n) a non-empty run of digits? */
static int all_digits(const char *s, size_t n) {
  if (n == 0) return 0;
  for (size_t i = 0; i < n; i++)
    if (!isdigit((unsigned char)s[i])) return 0;
  return 1;
}

void qc_contract_classify(const char *path, char *cls, int clslen, int *layer, int *expert) {
  size_t o = 0, cap = (size_t)clslen;
  int prev_experts = 0;
  *layer = -1;
  *expert = -1;
  const char *p = path;
  while (*p && o + 1 < cap) {
    if (*p == '.' || *p == '/') {
      cls[o++] = *p++;
      continue;
    }
    size_t n = strcspn(p, "./");
    int star = 0;
    if (all_digits(p, n) && n < 10) {
      int v = atoi(p);
      if (prev_experts && *expert < 0) { *expert = v; star = 1; }
      else if (*layer < 0) { *layer = v; star = 1; }
    }
    prev_experts = n == 7 && strncmp(p, "experts", 7) == 0;
    if (star) cls[o++] = '*';
    else
      for (size_t i = 0; i < n && o + 1 < cap; i++) cls[o++] = p[i];
    p += n;
  }
  cls[o] = 0;
}

int qc_contract_expert_name(const char *path, int e, char *out, int outlen) {
  const char *p = path;
  while ((p = strstr(p, "experts")) != NULL) {
    int starts = p == path || p[-1] == '.' || p[-1] == '/';
    int ends = p[7] == 0 || p[7] == '.' || p[7] == '/';
    if (starts && ends) break;
    p += 7;
  }
  if (!p)
    return qc_err("'%s/params/weight' is 3-D but the module path has no 'experts' component: "
                  "expected a linear weight [N, K] or routed experts [E, N, K] under '...experts...'", path);
  int head = (int)(p + 7 - path);
  if (snprintf(out, (size_t)outlen, "%.*s.%d%s", head, path, e, p + 7) >= outlen)
    return qc_err("'%s': module path too long", path);
  return QC_OK;
}

uint64_t qc_contract_seed(uint64_t seed, const char *module, const char *what) {
  uint64_t h = 0xcbf29ce484222325ull;
  const char *parts[3] = {module, "#", what};
  for (int k = 0; k < 3; k++)
    for (const unsigned char *c = (const unsigned char *)parts[k]; *c; c++) h = (h ^ *c) * 0x100000001b3ull;
  return seed ^ h;
}

/* ---- dump helpers ------------------------------------------------------------ */

/* Master weights, dY and X must decode to real numbers element for element. */
static int check_real(const char *dset, const qc_tensor *info) {
  qc_dtype t = info->dtype;
  if (t == QC_F64 || t == QC_F32 || t == QC_F16 || t == QC_BF16) return QC_OK;
  return qc_err("'%s' has element type %s: expected float64, float32, float16 or bfloat16", dset, qc_dtype_name(t));
}

/* ---- one module group -------------------------------------------------------- */

/* A dY (or X) source of a module: a dataset, or generated. */
typedef struct src {
  char name[QC_NAMELEN];  /* "dy" or "generated" */
  char dset[DSETLEN];     /* "" when generated */
  int per_expert;         /* 3-D [E, M, *]: slice by expert */
  int64_t M;
  qc_dump_loc loc;        /* a dataset's bytes (slice 0 when per_expert) */
  int gen;                /* generated: index into the shared generated tensors */
  int xgen;               /* for a dY: its generated X (when X is generated) */
} src;


typedef struct group_plan {
  const char *path;
  int experts;            /* 1 for a 3-D weight */
  int64_t E, N, K;
  char wdset[DSETLEN];
  qc_dump_loc wloc;       /* the weight's bytes (expert 0 when experts) */
  int ndy;
  src *dy;
  src x;                  /* used when activation formats are asked */
  int need_x;
} group_plan;

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

/* Inspect a module group: weight layout, dY sources, X source; every shape
 * checked before any data is read. */
static int plan_group(qc_dump *d, const char *path, const qc_sweep_opts *o, group_plan *g) {
  const char *file = qc_dump_path(d);
  char gdir[DSETLEN], s1[96];
  qc_tensor info = {0};
  int rc;
  memset(g, 0, sizeof *g);
  g->path = path;
  snprintf(g->wdset, sizeof g->wdset, "%s/params/weight", path);
  if (!qc_dump_exists(d, g->wdset)) return qc_err("%s: linear module '%s' has no dataset 'params/weight'", file, path);
  if ((rc = qc_dump_info(d, g->wdset, &info))) return rc;
  if ((rc = check_real(g->wdset, &info))) return rc;
  if (info.ndim == 3) {
    char tmp[QC_PATHLEN + 16];
    if ((rc = qc_contract_expert_name(path, 0, tmp, sizeof tmp))) return rc;
    g->experts = 1;
    g->E = info.shape[0];
  } else if (info.ndim == 2) {
    g->E = 1;
  } else {
    return qc_err("'%s' is %s: expected a linear weight [N, K] or routed experts [E, N, K]", g->wdset,
                  qc_shape_str(info.ndim, info.shape, s1, sizeof s1));
  }
  g->N = info.shape[info.ndim - 2];
  g->K = info.shape[info.ndim - 1];
  if (g->E < 1 || g->N < 1 || g->K < 1)
    return qc_err("'%s' is %s: expected no empty dimension", g->wdset, qc_shape_str(info.ndim, info.shape, s1, sizeof s1));
  if ((rc = qc_dump_locate(d, g->wdset, g->experts ? 0 : -1, &g->wloc))) return rc;

  char (*dl_name)[QC_NAMELEN] = NULL;
  int dl_n = 0;
  snprintf(gdir, sizeof gdir, "%s/grad_out", path);
  if ((rc = qc_dump_list(d, gdir, &dl_name, &dl_n))) return rc;
  g->ndy = dl_n ? dl_n : 1;
  g->dy = calloc((size_t)g->ndy, sizeof *g->dy);
  if (!g->dy) { free(dl_name); return qc_err_sys("out of memory"); }
  if (dl_n == 0) {
    snprintf(g->dy[0].name, QC_NAMELEN, "generated");
    g->dy[0].M = o->tokens;
  }
  for (int i = 0; i < dl_n; i++) {
    src *y = &g->dy[i];
    snprintf(y->name, QC_NAMELEN, "%s", dl_name[i]);
    if (snprintf(y->dset, sizeof y->dset, "%s/%s", gdir, dl_name[i]) >= (int)sizeof y->dset) {
      rc = qc_err("'%s/%s': dataset path too long", gdir, dl_name[i]);
      break;
    }
    if ((rc = qc_dump_info(d, y->dset, &info)) || (rc = check_real(y->dset, &info))) break;
    qc_shape_str(info.ndim, info.shape, s1, sizeof s1);
    int ok2 = info.ndim == 2, ok3 = info.ndim == 3 && g->experts && info.shape[0] == g->E;
    if (!ok2 && !ok3) {
      rc = qc_err("dY '%s' is %s: expected [M, %lld]%s", y->dset, s1, (long long)g->N,
                  g->experts ? " or one per expert [E, M, N]" : "");
      break;
    }
    if (info.shape[info.ndim - 1] != g->N) {
      rc = qc_err("dY '%s' is %s: expected width %lld (the out_features of '%s', weight [.., %lld, %lld])", y->dset, s1,
                  (long long)g->N, g->wdset, (long long)g->N, (long long)g->K);
      break;
    }
    y->per_expert = ok3;
    y->M = info.shape[info.ndim - 2];
    if (y->M < 1) { rc = qc_err("dY '%s' is %s: expected at least one token", y->dset, s1); break; }
    if ((rc = qc_dump_locate(d, y->dset, ok3 ? 0 : -1, &y->loc))) break;
  }
  free(dl_name);
  if (rc) return rc;

  for (int i = 0; i < o->na; i++) g->need_x |= strcmp(o->afmt[i], "none") != 0;
  if (!g->need_x) return QC_OK;
  snprintf(g->x.dset, sizeof g->x.dset, "%s/inputs/x", path);
  if (!qc_dump_exists(d, g->x.dset)) {
    g->x.dset[0] = 0;
    snprintf(g->x.name, QC_NAMELEN, "generated");
    return QC_OK;
  }
  snprintf(g->x.name, QC_NAMELEN, "x");
  if ((rc = qc_dump_info(d, g->x.dset, &info)) || (rc = check_real(g->x.dset, &info))) return rc;
  qc_shape_str(info.ndim, info.shape, s1, sizeof s1);
  int ok2 = info.ndim == 2, ok3 = info.ndim == 3 && g->experts && info.shape[0] == g->E;
  if ((!ok2 && !ok3) || info.shape[info.ndim - 1] != g->K)
    return qc_err("input '%s' is %s: expected [M, %lld]%s", g->x.dset, s1, (long long)g->K,
                  g->experts ? " or one per expert [E, M, K]" : "");
  g->x.per_expert = ok3;
  g->x.M = info.shape[info.ndim - 2];
  if ((rc = qc_dump_locate(d, g->x.dset, ok3 ? 0 : -1, &g->x.loc))) return rc;
  for (int i = 0; i < g->ndy; i++)
    if (g->dy[i].M != g->x.M)
      return qc_err("input '%s' has %lld tokens but dY '%s' has %lld: expected the same M", g->x.dset,
                    (long long)g->x.M, g->dy[i].dset[0] ? g->dy[i].dset : "generated", (long long)g->dy[i].M);
  return QC_OK;
}

/* Add a row comparing buffer g with r (rows x cols) through the backend's
 * queued metrics; its verdict is given after sync (judge_rows). The rows
 * array does not move meanwhile (reserve_rows). */
static int add_row(qc_sweep *s, const qc_backend *be, const char *module, const char *tensor, const char *wf,
                   const char *af, const char *dy, int64_t rows, int64_t cols, const double *g, const double *r) {
  qc_crow *w = NULL;
  int rc = push_row(s, &w);
  if (rc) return rc;
  snprintf(w->module, sizeof w->module, "%s", module);
  qc_contract_classify(module, w->cls, sizeof w->cls, &w->layer, &w->expert);
  snprintf(w->wfmt, sizeof w->wfmt, "%s", wf);
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

/* Verdicts of rows [from, s->n) against the thresholds. */
static void judge_rows(qc_sweep *s, const qc_sweep_opts *o, int from) {
  qc_tol tol;
  memset(&tol, 0, sizeof tol);
  tol.has_cosine_min = o->has_cos_min;
  tol.cosine_min = o->cos_min;
  tol.has_norm_ratio = o->has_norm;
  tol.norm_lo = o->norm_lo;
  tol.norm_hi = o->norm_hi;
  for (int i = from; i < s->n; i++) {
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

/* ---- generated dY and X ---------------------------------------------------------
 * One generated tensor per (what, M, cols), shared by every module of that
 * width: the layers of a class then see the same dY, so their rows differ
 * only by their weights (common random numbers). */

typedef struct gen_t {
  char what[4];        /* "dy" or "x" */
  int64_t M, cols;
  double *host;        /* [M, cols] N(0, 1) */
  void *buf;           /* the backend's copy (host itself on a host-memory backend) */
} gen_t;

typedef struct gens {
  gen_t *v;
  int n;
} gens;

/* Index of the generated (what, M, cols), added when new. */
static int gen_index(gens *G, const char *what, int64_t M, int64_t cols, int *idx) {
  for (int i = 0; i < G->n; i++)
    if (!strcmp(G->v[i].what, what) && G->v[i].M == M && G->v[i].cols == cols) { *idx = i; return QC_OK; }
  void *p = realloc(G->v, (size_t)(G->n + 1) * sizeof *G->v);
  if (!p) return qc_err_sys("out of memory");
  G->v = p;
  gen_t *g = &G->v[G->n];
  memset(g, 0, sizeof *g);
  snprintf(g->what, sizeof g->what, "%s", what);
  g->M = M;
  g->cols = cols;
  *idx = G->n++;
  return QC_OK;
}

/* Fill every generated tensor from its seed and hand it to the backend. */
static int gen_fill(gens *G, const qc_backend *be, uint64_t seed) {
  int rc;
  for (int i = 0; i < G->n; i++) {
    gen_t *g = &G->v[i];
    size_t n = (size_t)(g->M * g->cols);
    char label[64];
    if (!(g->host = qc_malloc(n * sizeof(double), "generated dY / X"))) return QC_ESYS;
    qc_rng r;
    snprintf(label, sizeof label, "%lldx%lld", (long long)g->M, (long long)g->cols);
    qc_rng_seed(&r, qc_contract_seed(seed, label, g->what));
    for (size_t k = 0; k < n; k++) g->host[k] = qc_rng_normal(&r);
    if (be->host_memory) { g->buf = g->host; continue; }
    if ((rc = be->buf_alloc(be, n * sizeof(double), "generated dY / X", &g->buf)) ||
        (rc = be->upload(be, g->buf, g->host, n * sizeof(double))))
      return rc;
  }
  return QC_OK;
}

static void gen_free(gens *G, const qc_backend *be) {
  for (int i = 0; i < G->n; i++) {
    if (G->v[i].buf && G->v[i].buf != G->v[i].host) be->buf_free(be, G->v[i].buf);
    free(G->v[i].host);
  }
  free(G->v);
  memset(G, 0, sizeof *G);
}

/* ---- the pipeline -----------------------------------------------------------
 * Worker threads read units u+1 .. u+ahead (weight, dYs, X as stored, each
 * checked finite) into pinned host slots while the main thread runs unit u
 * on the backend: upload, widen, quantize, GEMMs and metrics queued in
 * order, one sync per unit. Contiguous datasets are read with pread (no
 * HDF5 call, so the workers read in parallel); others through HDF5 under a
 * lock, which the main thread also holds for its own HDF5 calls. */

typedef struct sizes {
  int64_t nk, mn, mk, ndy;     /* largest N*K, M*N, M*K and dY count over the groups */
  size_t wb, yb, xb;           /* largest weight, one dY and one X as stored (bytes) */
} sizes;

/* One unit's data as stored. */
typedef struct slot {
  const group_plan *g;
  int e;
  char module[QC_PATHLEN + 16];
  void *w;                     /* [N, K] of g->wloc.dtype */
  void *y;                     /* [ndy] x z->yb: dY datasets as stored */
  void *x;                     /* [z->xb]: X as stored (one X for every dY of a unit) */
  double t_read;
  char err[1024], hint[512];    /* a worker's error (qc_err is per thread) */
  /* worker arguments and result */
  qc_dump *d;
  const sizes *z;
  int rc;
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

/* One located dataset (slice e when per-expert) into buf, checked finite;
 * `quantized`: float64 values must also fit float32, the quantizers' input. */
static int read_one(slot *sl, const char *dset, const qc_dump_loc *loc, int per_expert, int64_t rows, int64_t cols,
                    void *buf, int quantized) {
  int rc;
  if (loc->offset >= 0) {
    qc_dump_loc l = *loc;
    if (per_expert) l.offset += (long long)sl->e * (long long)l.nbytes;
    rc = qc_dump_pread(sl->d, dset, &l, buf);
  } else {
    pthread_mutex_lock(&g_read_lock);
    rc = qc_dump_read_into(sl->d, dset, per_expert ? sl->e : -1, buf, loc->nbytes);
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
  const group_plan *g = sl->g;
  const sizes *z = sl->z;
  double t0 = qc_now_s();
  int rc = read_one(sl, g->wdset, &g->wloc, g->experts, g->N, g->K, sl->w, 1);
  for (int i = 0; i < g->ndy && !rc; i++) {
    const src *y = &g->dy[i];
    if (y->dset[0])
      rc = read_one(sl, y->dset, &y->loc, y->per_expert, y->M, g->N, (char *)sl->y + (size_t)i * z->yb, 0);
  }
  if (!rc && g->need_x && g->x.dset[0]) /* every dY of the unit has X's tokens (plan_group) */
    rc = read_one(sl, g->x.dset, &g->x.loc, g->x.per_expert, g->x.M, g->K, sl->x, 1);
  sl->t_read = qc_now_s() - t0;
  return rc;
}

static void *prepare_thread(void *arg) {
  slot *sl = arg;
  sl->rc = prepare(sl);
  if (sl->rc) { /* hand the message to the main thread */
    snprintf(sl->err, sizeof sl->err, "%s", qc_err_msg());
    snprintf(sl->hint, sizeof sl->hint, "%s", qc_err_hint());
  }
  return NULL;
}

/* The backend's buffers for one unit. */
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

/* Unit of slot sl on the backend: the GEMMs and one row per (dY, format). */
static int compute(const qc_backend *be, const qc_sweep_opts *o, const slot *sl, work *w, const gens *G, qc_sweep *s) {
  const group_plan *g = sl->g;
  const sizes *z = sl->z;
  const int64_t N = g->N, K = g->K;
  const char *prof = o->profile ? o->profile : "vllm";
  const void *wsrc, *ysrc = NULL, *xsrc = NULL;
  const double **y64 = w->y64p;
  char what[QC_PATHLEN + 64];
  int rc, first = s->n;
  double t0;
  if ((rc = reserve_rows(s, g->ndy * (o->nw + o->na)))) return rc;
  /* the weight, widened; each dY widened (or the shared generated one) */
  if ((rc = stage(be, w->wraw, sl->w, g->wloc.nbytes, &wsrc))) return rc;
  if ((rc = be->to_f64(be, g->wloc.dtype, wsrc, N * K, w->w64))) return rc;
  for (int i = 0; i < g->ndy; i++) {
    const src *y = &g->dy[i];
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
  for (int f = 0; f < o->nw; f++) {
    const double *wq = w->w64;
    if (strcmp(o->wfmt[f], "none") != 0) {
      t0 = qc_now_s();
      rc = be->fake_quant_f64(be, o->wfmt[f], prof, N, K, g->wloc.dtype, wsrc, w->scratch, w->wq64, what);
      s->t_quant += qc_now_s() - t0;
      if (rc) return rc;
      wq = w->wq64;
    }
    for (int i = 0; i < g->ndy; i++) {
      const int64_t M = g->dy[i].M;
      if ((rc = gemm(s, be, QC_OP_N, M, K, N, y64[i], N, wq, w->a)) ||
          (rc = add_row(s, be, sl->module, "d_x", o->wfmt[f], "none", g->dy[i].name, M, K, w->a, w->xm + i * z->mk)))
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
          (rc = add_row(s, be, sl->module, "d_weight", "none", o->afmt[a], g->dy[i].name, N, K, w->a, w->rw)))
        return rc;
    }
  }
  t0 = qc_now_s();
  rc = be->sync(be);
  s->t_sync += qc_now_s() - t0;
  if (rc) return rc;
  judge_rows(s, o, first);
  return QC_OK;
}

/* Point slot sl at unit u (group and expert) of the plans. */
static int slot_set(slot *sl, const group_plan *plans, const int *ug, const int *ue, int u) {
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
  const char *env = getenv("QATCHECK_AHEAD");
  if (env && *env) {
    int v = atoi(env);
    return v < 0 ? 0 : v > QC_MAX_AHEAD ? QC_MAX_AHEAD : v;
  }
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

/* A unit in flight: its worker thread, and whether one was started. */
typedef struct flight {
  pthread_t th;
  int started;
} flight;

/* Start reading unit u into slot sl: on a worker thread when ahead > 0. */
static int launch(slot *sl, flight *fl, const group_plan *plans, const int *ug, const int *ue, int u, int ahead) {
  int rc = slot_set(sl, plans, ug, ue, u);
  if (rc) return rc;
  sl->err[0] = sl->hint[0] = 0;
  fl->started = ahead > 0 && pthread_create(&fl->th, NULL, prepare_thread, sl) == 0;
  if (!fl->started) sl->rc = prepare(sl);
  return QC_OK;
}

/* Run every unit: units u+1 .. u+ahead are read while unit u computes. */
static int run_units(qc_dump *d, const qc_backend *be, const qc_sweep_opts *o, const group_plan *plans, int nplan,
                     const gens *G, qc_sweep *s) {
  sizes z = {1, 1, 1, 1, 1, 1, 1};
  int need_x = 0, rc = QC_OK;
  for (int i = 0; i < nplan; i++) {
    const group_plan *g = &plans[i];
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
  }
  /* per-dY strides in whole 256-byte lines: every dY's buffers stay aligned
   * for the device's vector loads */
  z.mn = (z.mn + 31) / 32 * 32;
  z.mk = (z.mk + 31) / 32 * 32;
  z.yb = (z.yb + 255) / 256 * 256;
  int *ug = malloc((size_t)s->units * sizeof *ug), *ue = malloc((size_t)s->units * sizeof *ue);
  slot *sl = NULL;
  flight *fl = NULL;
  int nslot = 0;
  work w;
  memset(&w, 0, sizeof w);
  if (!ug || !ue) { rc = qc_err_sys("out of memory"); goto out; }
  for (int i = 0, u = 0; i < nplan; i++)
    for (int e = 0; e < plans[i].E; e++, u++) { ug[u] = i; ue[u] = e; }
  int ahead = units_ahead(be, z.wb + (z.yb + (need_x ? z.xb : 0)) * (size_t)z.ndy);
  if (ahead > s->units - 1) ahead = s->units > 1 ? s->units - 1 : 0;
  s->ahead = ahead;
  nslot = ahead + 1;
  sl = calloc((size_t)nslot, sizeof *sl);
  fl = calloc((size_t)nslot, sizeof *fl);
  if (!sl || !fl) { rc = qc_err_sys("out of memory"); goto out; }
  for (int k = 0; k < nslot; k++) {
    if ((rc = slot_alloc(&sl[k], be, &z, need_x))) {
      /* pinned memory can run out before physical memory does: read
       * fewer units ahead (the rows are the same) rather than give up */
      slot_free(&sl[k], be);
      if (k == 0) goto out;
      if (qc_verbose) fprintf(stderr, "qatcheck: contract: %s: reading %d unit(s) ahead instead of %d\n", qc_err_msg(), k - 1, ahead);
      qc_err_clear();
      rc = QC_OK;
      nslot = k;
      ahead = s->ahead = k - 1;
      break;
    }
    sl[k].d = d;
    sl[k].z = &z;
  }
  if ((rc = work_alloc(&w, be, &z, need_x))) goto out;
  /* units 0 .. ahead-1 start now (unit 0 in this thread when ahead is 0) */
  int launched = 0;
  for (; launched < (ahead ? ahead : 1) && launched < s->units; launched++)
    if ((rc = launch(&sl[launched % nslot], &fl[launched % nslot], plans, ug, ue, launched, ahead))) goto out;
  for (int u = 0; u < s->units; u++) {
    slot *cur = &sl[u % nslot];
    flight *cf = &fl[u % nslot];
    double t0 = qc_now_s();
    if (cf->started) { pthread_join(cf->th, NULL); cf->started = 0; }
    s->t_wait += qc_now_s() - t0;
    if ((rc = cur->rc)) {
      /* the first failing unit: let the other workers finish, then report
       * the message its worker left in the slot */
      for (int k = 0; ahead && k < nslot; k++)
        if (fl[k].started) { pthread_join(fl[k].th, NULL); fl[k].started = 0; }
      if (ahead) {
        qc_err_clear();
        if (rc == QC_ESYS) qc_err_sys("%s", cur->err[0] ? cur->err : "reading a unit failed on a worker thread");
        else qc_err("%s", cur->err[0] ? cur->err : "reading a unit failed on a worker thread");
        if (cur->hint[0]) qc_hint("%s", cur->hint);
      }
      goto out;
    }
    /* the slot of unit u-1 is free (its work synced): start unit u+ahead in it */
    if (ahead && launched < s->units) {
      if ((rc = launch(&sl[launched % nslot], &fl[launched % nslot], plans, ug, ue, launched, ahead))) goto out;
      launched++;
    }
    if (o->progress) fprintf(stderr, "\r\033[K[%d/%d] %s", u + 1, s->units, cur->module);
    s->t_read += cur->t_read;
    if ((rc = compute(be, o, cur, &w, G, s))) goto out;
    if (!ahead && launched < s->units) {
      if ((rc = launch(&sl[launched % nslot], &fl[launched % nslot], plans, ug, ue, launched, ahead))) goto out;
      launched++;
    }
  }
  if (o->progress) fprintf(stderr, "\r\033[K");
out:
  if (rc && o->progress) fprintf(stderr, "\n");
  for (int k = 0; fl && k < nslot; k++)
    if (fl[k].started) pthread_join(fl[k].th, NULL);
  if (rc) be->sync(be); /* nothing queued may outlive the buffers */
  for (int k = 0; sl && k < nslot; k++) slot_free(&sl[k], be);
  free(sl);
  free(fl);
  work_free(&w, be);
  free(ug);
  free(ue);
  return rc;
}

/* Natural order of paths: runs of digits compare as numbers, so layer 2
 * comes before layer 10. */
static int cmp_natural(const void *pa, const void *pb) {
  const char *a = ((const qc_dump_entry *)pa)->path, *b = ((const qc_dump_entry *)pb)->path;
  while (*a && *b) {
    if (isdigit((unsigned char)*a) && isdigit((unsigned char)*b)) {
      while (*a == '0') a++;
      while (*b == '0') b++;
      size_t na = strspn(a, "0123456789"), nb = strspn(b, "0123456789");
      if (na != nb) return na < nb ? -1 : 1;
      int c = strncmp(a, b, na);
      if (c) return c;
      a += na;
      b += nb;
      continue;
    }
    if (*a != *b) return (unsigned char)*a < (unsigned char)*b ? -1 : 1;
    a++;
    b++;
  }
  return (unsigned char)*a - (unsigned char)*b;
}

int qc_contract_sweep(qc_dump *d, const qc_backend *be, const qc_sweep_opts *o, qc_sweep *s) {
  qc_dump_entry *ents = NULL;
  int nent = 0, rc;
  gens G = {NULL, 0};
  double t_start = qc_now_s();
  memset(s, 0, sizeof *s);
  if ((rc = qc_dump_modules(d, o->modules, &ents, &nent))) return rc;
  int nlin = 0;
  for (int i = 0; i < nent; i++)
    if (strcmp(ents[i].cls, "linear") == 0) ents[nlin++] = ents[i];
  if (nlin > 1) qsort(ents, (size_t)nlin, sizeof *ents, cmp_natural);
  if (nlin == 0) {
    free(ents);
    if (o->modules && o->modules[0])
      qc_err("%s: no linear module group matches --modules '%s' (%d module group(s) matched)", qc_dump_path(d), o->modules, nent);
    else
      qc_err("%s: no linear module group: expected groups with attribute class = \"linear\"", qc_dump_path(d));
    qc_hint("a linear module is a group with string attribute class=linear holding params/weight [N, K]");
    return QC_EINPUT;
  }

  /* plan every group first: bad input exits before any work */
  group_plan *plans = calloc((size_t)nlin, sizeof *plans);
  if (!plans) { rc = qc_err_sys("out of memory"); goto done; }
  for (int i = 0; i < nlin; i++) {
    if ((rc = plan_group(d, ents[i].path, o, &plans[i]))) goto done;
    s->units += (int)plans[i].E;
    s->expert_groups += plans[i].experts;
  }
  s->modules = nlin;

  /* the generated dY and X, one per shape */
  for (int i = 0; i < nlin; i++) {
    group_plan *g = &plans[i];
    for (int j = 0; j < g->ndy; j++) {
      src *y = &g->dy[j];
      if (!y->dset[0]) {
        if ((rc = gen_index(&G, "dy", y->M, g->N, &y->gen))) goto done;
        s->dy_generated = 1;
      }
      if (g->need_x && !g->x.dset[0]) {
        if ((rc = gen_index(&G, "x", y->M, g->K, &y->xgen))) goto done;
        s->x_generated = 1;
      }
    }
  }
  double t0 = qc_now_s();
  rc = gen_fill(&G, be, o->seed);
  s->t_gen = qc_now_s() - t0;
  if (rc) goto done;

  if ((rc = run_units(d, be, o, plans, nlin, &G, s))) goto done;
  if (s->n == 0) { rc = qc_err("%s: nothing to check: the linear groups hold no experts", qc_dump_path(d)); goto done; }
  rc = qc_contract_summarize(s);
done:
  gen_free(&G, be);
  if (plans)
    for (int i = 0; i < nlin; i++) free(plans[i].dy);
  free(plans);
  free(ents);
  s->t_total = qc_now_s() - t_start;
  return rc;
}

/* ---- classes and outliers ------------------------------------------------------ */

static int cmp_d(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return (x > y) - (x < y);
}

/* Median of v[0..n) (sorted in place); NAN when n = 0. */
static double median(double *v, int n) {
  if (n == 0) return NAN;
  qsort(v, (size_t)n, sizeof *v, cmp_d);
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

/* Median absolute deviation of v[0..n) from m (tmp: n doubles). */
static double mad(const double *v, int n, double m, double *tmp) {
  for (int i = 0; i < n; i++) tmp[i] = fabs(v[i] - m);
  return median(tmp, n);
}

static int same_class(const qc_crow *r, const qc_cclass *c) {
  return strcmp(r->cls, c->cls) == 0 && strcmp(r->tensor, c->tensor) == 0 && strcmp(r->wfmt, c->wfmt) == 0 &&
         strcmp(r->afmt, c->afmt) == 0;
}

/* Summarize class c over its rows idx[0..n); mark outliers. */
static void summarize_one(qc_sweep *s, qc_cclass *c, const int *idx, int n, double *a, double *b, double *t) {
  int k = 0;
  /* cosine */
  for (int i = 0; i < n; i++)
    if (!s->rows[idx[i]].m.cosine_null) a[k++] = s->rows[idx[i]].m.cosine;
  c->cos_med = median(a, k);
  c->cos_min = k ? a[0] : NAN;
  c->cos_max = k ? a[k - 1] : NAN;
  /* norm ratio (finite only) */
  int kn = 0;
  for (int i = 0; i < n; i++)
    if (isfinite(s->rows[idx[i]].m.norm_ratio)) b[kn++] = s->rows[idx[i]].m.norm_ratio;
  double nr_med = median(b, kn);
  c->nr_med = nr_med;
  c->nr_min = kn ? b[0] : NAN;
  c->nr_max = kn ? b[kn - 1] : NAN;
  double nr_mad = kn ? mad(b, kn, nr_med, t) : NAN;
  /* rel_l2 on a log scale */
  for (int i = 0; i < n; i++) t[i] = s->rows[idx[i]].m.rel_l2;
  c->rel_med = median(t, n);
  for (int i = 0; i < n; i++) a[i] = log10(fmax(s->rows[idx[i]].m.rel_l2, 1e-12));
  for (int i = 0; i < n; i++) b[i] = a[i];
  double lr_med = median(b, n), lr_mad = mad(a, n, lr_med, t);
  /* distinct layers */
  c->layers = 0;
  for (int i = 0; i < n; i++) {
    int seen = 0;
    for (int j = 0; j < i && !seen; j++) seen = s->rows[idx[j]].layer == s->rows[idx[i]].layer;
    c->layers += !seen;
  }
  c->rows = n;
  for (int i = 0; i < n; i++) c->fails += s->rows[idx[i]].fail;
  if (n < QC_OUTLIER_MIN_ROWS) return;
  double lr_scale = fmax(1.4826 * lr_mad, QC_OUTLIER_LOG_FLOOR);
  double nr_scale = fmax(fmax(1.4826 * nr_mad, 0.1 * c->rel_med), 1e-12);
  for (int i = 0; i < n; i++) {
    qc_crow *r = &s->rows[idx[i]];
    double lr = log10(fmax(r->m.rel_l2, 1e-12));
    double zl = fabs(lr - lr_med) / lr_scale;
    double zn = isfinite(r->m.norm_ratio) ? fabs(r->m.norm_ratio - nr_med) / nr_scale : 0;
    if (zl > QC_OUTLIER_Z)
      snprintf(r->outlier_why, sizeof r->outlier_why, "rel_l2 %.4g vs class median %.4g (%.1f robust sd on a log scale)",
               r->m.rel_l2, c->rel_med, zl);
    else if (zn > QC_OUTLIER_Z)
      snprintf(r->outlier_why, sizeof r->outlier_why, "norm ratio %.6f vs class median %.6f (%.1f robust sd)",
               r->m.norm_ratio, nr_med, zn);
    else
      continue;
    r->outlier = 1;
    c->outliers++;
  }
}

/* Table order: d_x before d_weight, then formats in the order first seen,
 * then classes in the order first seen (checkpoint order). */
static int cmp_class(const void *pa, const void *pb) {
  const qc_cclass *a = pa, *b = pb;
  int ta = strcmp(a->tensor, "d_x") != 0, tb = strcmp(b->tensor, "d_x") != 0;
  if (ta != tb) return ta - tb;
  if (a->combo_first != b->combo_first) return a->combo_first - b->combo_first;
  return a->first - b->first;
}

int qc_contract_summarize(qc_sweep *s) {
  int rc = QC_OK;
  free(s->cls);
  s->cls = NULL;
  s->ncls = 0;
  int *idx = malloc((size_t)(s->n + 1) * sizeof *idx);
  double *a = malloc((size_t)(s->n + 1) * sizeof *a), *b = malloc((size_t)(s->n + 1) * sizeof *b);
  double *t = malloc((size_t)(s->n + 1) * sizeof *t);
  int *done = calloc((size_t)(s->n + 1), sizeof *done);
  s->cls = calloc((size_t)(s->n + 1), sizeof *s->cls);
  if (!idx || !a || !b || !t || !done || !s->cls) { rc = qc_err_sys("out of memory for contract classes"); goto out; }
  for (int i = 0; i < s->n; i++) {
    if (done[i]) continue;
    qc_cclass *c = &s->cls[s->ncls++];
    const qc_crow *r = &s->rows[i];
    snprintf(c->cls, sizeof c->cls, "%s", r->cls);
    c->tensor = r->tensor;
    snprintf(c->wfmt, sizeof c->wfmt, "%s", r->wfmt);
    snprintf(c->afmt, sizeof c->afmt, "%s", r->afmt);
    int n = 0;
    for (int j = i; j < s->n; j++)
      if (!done[j] && same_class(&s->rows[j], c)) { idx[n++] = j; done[j] = 1; }
    for (int j = 0; j < n; j++) { s->rows[idx[j]].outlier = 0; s->rows[idx[j]].outlier_why[0] = 0; }
    c->first = i;
    c->combo_first = i;
    for (int j = 0; j < i; j++)
      if (s->rows[j].tensor == r->tensor && !strcmp(s->rows[j].wfmt, r->wfmt) && !strcmp(s->rows[j].afmt, r->afmt)) {
        c->combo_first = j;
        break;
      }
    summarize_one(s, c, idx, n, a, b, t);
  }
  qsort(s->cls, (size_t)s->ncls, sizeof *s->cls, cmp_class);
out:
  free(idx); free(a); free(b); free(t); free(done);
  return rc;
}

void qc_sweep_free(qc_sweep *s) {
  free(s->rows);
  free(s->cls);
  memset(s, 0, sizeof *s);
}
