/* contract_sweep.c: layer 2 over a checkpoint (see contract_sweep.h). One
 * unit (a module, or one expert of a routed-experts group) is in memory at a
 * time: its weight, its dYs and their dX / dW. */
#include "contract_sweep.h"

#include <ctype.h>
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "backend/backend.h"
#include "dump.h"
#include "numerics/quant.h"
#include "qc.h"
#include "rng.h"

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

/* Read dataset dset (slice `index` of its first dimension when index >= 0)
 * decoded to float64 into out (rows x cols elements, checked). */
static int read_f64(qc_dump *d, const char *dset, long long index, int64_t rows, int64_t cols, double *out) {
  qc_tensor t = {0};
  int rc = index >= 0 ? qc_dump_read_slice(d, dset, index, &t) : qc_dump_read(d, dset, &t);
  if (rc) return rc;
  if (qc_numel(&t) != rows * cols) {
    qc_tensor_free(&t);
    return qc_err("'%s': read %lld elements: expected %lld x %lld", dset, (long long)qc_numel(&t), (long long)rows,
                  (long long)cols);
  }
  rc = qc_tensor_to_f64(&t, out);
  qc_tensor_free(&t);
  return rc;
}

/* Refuse a non-finite value: neither convention has a defined gradient then. */
static int check_finite(const double *a, int64_t rows, int64_t cols, const char *module, const char *what) {
  for (int64_t i = 0; i < rows * cols; i++)
    if (!isfinite(a[i]))
      return qc_err("%s/%s: non-finite value %g at [%lld, %lld]: expected finite master values", module, what, a[i],
                    (long long)(i / cols), (long long)(i % cols));
  return QC_OK;
}

/* ---- one module group -------------------------------------------------------- */

/* A dY (or X) source of a module: a dataset, or generated. */
typedef struct src {
  char name[QC_NAMELEN];  /* "dy" or "generated" */
  char dset[DSETLEN];     /* "" when generated */
  int per_expert;         /* 3-D [E, M, *]: slice by expert */
  int64_t M;
} src;

typedef struct group_plan {
  const char *path;
  int experts;            /* 1 for a 3-D weight */
  int64_t E, N, K;
  char wdset[DSETLEN];
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
  for (int i = 0; i < g->ndy; i++)
    if (g->dy[i].M != g->x.M)
      return qc_err("input '%s' has %lld tokens but dY '%s' has %lld: expected the same M", g->x.dset,
                    (long long)g->x.M, g->dy[i].dset[0] ? g->dy[i].dset : "generated", (long long)g->dy[i].M);
  return QC_OK;
}

/* Fill a [rows, cols] buffer: from the source's dataset (sliced per expert)
 * or generated N(0, 1) from the row module's seed. */
static int load_src(qc_dump *d, const src *y, int expert, const char *module, const char *what, uint64_t seed,
                    int64_t cols, double *out) {
  if (y->dset[0]) return read_f64(d, y->dset, y->per_expert ? expert : -1, y->M, cols, out);
  qc_rng r;
  qc_rng_seed(&r, qc_contract_seed(seed, module, what));
  for (int64_t i = 0; i < y->M * cols; i++) out[i] = qc_rng_normal(&r);
  return QC_OK;
}

/* Add a row comparing g with r (n elements) and judge it. */
static int add_row(qc_sweep *s, const qc_backend *be, const qc_sweep_opts *o, const char *module, const char *tensor,
                   const char *wf, const char *af, const char *dy, int64_t rows, int64_t cols, const double *g,
                   const double *r) {
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
  if ((rc = be->metrics(be, g, r, rows * cols, &w->m))) return rc;
  s->t_metrics += qc_now_s() - t0;
  qc_tol tol;
  memset(&tol, 0, sizeof tol);
  tol.has_cosine_min = o->has_cos_min;
  tol.cosine_min = o->cos_min;
  tol.has_norm_ratio = o->has_norm;
  tol.norm_lo = o->norm_lo;
  tol.norm_hi = o->norm_hi;
  w->fail = qc_judge(&w->m, &tol, w->why, sizeof w->why) != QC_V_PASS;
  return QC_OK;
}

/* GEMM through the backend, timed and counted. */
static int gemm(qc_sweep *s, const qc_backend *be, qc_op ta, int64_t m, int64_t n, int64_t k, const double *A,
                int64_t lda, const double *B, double *C) {
  double t0 = qc_now_s();
  int rc = be->gemm_f64(be, ta, QC_OP_N, m, n, k, A, lda, B, n, C, n);
  s->t_gemm += qc_now_s() - t0;
  s->gemm_flops += 2.0 * (double)m * (double)n * (double)k;
  return rc;
}

/* ---- the pipeline -----------------------------------------------------------
 * A worker thread prepares unit u+1 (reads its weight and dYs, quantizes the
 * weight under every format, reads X and quantizes it) while the main thread
 * runs unit u's GEMMs and metrics. Two slots alternate; the HDF5 library is
 * only ever called by one thread at a time (the worker, or the main thread
 * between units). */

typedef struct sizes {
  int64_t nk, mn, mk, m, ndy;   /* largest N*K, M*N, M*K, M and dY count over the groups */
} sizes;

/* One prepared unit. */
typedef struct slot {
  const group_plan *g;
  int e;
  char module[QC_PATHLEN + 16];
  double *W;      /* [N, K] master weight */
  float *Wq;      /* [nw][N, K] dequant(quant(W)) per weight format (slot unused for "none") */
  double *G;      /* [ndy][M, N] */
  double *X;      /* [ndy][M, K] when activation formats are asked */
  float *Xq;      /* [ndy][na][M, K] */
  float *f;       /* scratch [max(N K, M K)] */
  double t_read, t_quant;
  int dy_gen, x_gen;
  /* worker arguments and result */
  const qc_backend *be;
  qc_dump *d;
  const qc_sweep_opts *o;
  const sizes *z;
  int rc;
} slot;

static void slot_free(slot *sl) {
  free(sl->W); free(sl->Wq); free(sl->G); free(sl->X); free(sl->Xq); free(sl->f);
  memset(sl, 0, sizeof *sl);
}

static int slot_alloc(slot *sl, const sizes *z, const qc_sweep_opts *o, int need_x) {
  memset(sl, 0, sizeof *sl);
  int64_t big = z->nk > z->mk ? z->nk : z->mk;
  sl->W = malloc((size_t)z->nk * sizeof(double));
  sl->Wq = malloc((size_t)(z->nk * (o->nw ? o->nw : 1)) * sizeof(float));
  sl->G = malloc((size_t)(z->mn * z->ndy) * sizeof(double));
  sl->f = malloc((size_t)big * sizeof(float));
  int ok = sl->W && sl->Wq && sl->G && sl->f;
  if (ok && need_x) {
    sl->X = malloc((size_t)(z->mk * z->ndy) * sizeof(double));
    sl->Xq = malloc((size_t)(z->mk * z->ndy * (o->na ? o->na : 1)) * sizeof(float));
    ok = sl->X && sl->Xq;
  }
  if (!ok) {
    slot_free(sl);
    return qc_err_sys("out of memory for the unit buffers (largest weight %lld elements)", (long long)z->nk);
  }
  return QC_OK;
}

/* in (float64) narrowed to float32: exact for BF16/FP16/FP32 master values. */
static void narrow(const double *in, float *out, int64_t n) {
  for (int64_t i = 0; i < n; i++) out[i] = (float)in[i];
}

/* HDF5 (not thread-safe as built) and generated data are read under this lock. */
static pthread_mutex_t g_read_lock = PTHREAD_MUTEX_INITIALIZER;

/* Prepare the slot's unit: everything read and quantized, nothing multiplied. */
/* out = dequant(quant(in)) [rows, cols]: on the backend's own quantizer when
 * it has one for this profile (the CUDA kernels, byte-identical to the CPU
 * quantizers and tested so; profile vllm), else on the CPU. */
static int fake_quant(const slot *sl, const char *fmt, int64_t rows, int64_t cols, const float *in, float *out,
                      const char *what) {
  const char *prof = sl->o->profile ? sl->o->profile : "vllm";
  if (sl->be && sl->be->quantize && strcmp(prof, "vllm") == 0) {
    for (int64_t i = 0; i < rows * cols; i++)
      if (!isfinite(in[i])) return qc_err("%s: non-finite value at flat index %lld", what, (long long)i);
    qc_qout q;
    memset(&q, 0, sizeof q);
    q.deq = out;
    return sl->be->quantize(sl->be, fmt, prof, rows, cols, in, &q);
  }
  return qc_fake_quant(fmt, sl->o->profile, rows, cols, in, out, what);
}

static int prepare(slot *sl) {
  const group_plan *g = sl->g;
  const qc_sweep_opts *o = sl->o;
  const int64_t N = g->N, K = g->K;
  char what[QC_PATHLEN + 64];
  int rc;
  sl->t_read = sl->t_quant = 0;
  pthread_mutex_lock(&g_read_lock);
  double t0 = qc_now_s();
  rc = read_f64(sl->d, g->wdset, g->experts ? sl->e : -1, N, K, sl->W);
  for (int i = 0; i < g->ndy && !rc; i++)
    rc = load_src(sl->d, &g->dy[i], sl->e, sl->module, "dy", o->seed, N, sl->G + i * sl->z->mn);
  sl->t_read += qc_now_s() - t0;
  pthread_mutex_unlock(&g_read_lock);
  if (rc) return rc;
  if ((rc = check_finite(sl->W, N, K, sl->module, "params/weight"))) return rc;
  for (int i = 0; i < g->ndy; i++)
    if ((rc = check_finite(sl->G + i * sl->z->mn, g->dy[i].M, N, sl->module, g->dy[i].dset[0] ? "grad_out" : "dy")))
      return rc;
  sl->dy_gen = !g->dy[0].dset[0];
  t0 = qc_now_s();
  snprintf(what, sizeof what, "%s/params/weight", sl->module);
  narrow(sl->W, sl->f, N * K);
  for (int w = 0; w < o->nw; w++)
    if (strcmp(o->wfmt[w], "none") != 0 &&
        (rc = fake_quant(sl, o->wfmt[w], N, K, sl->f, sl->Wq + w * sl->z->nk, what)))
      return rc;
  sl->t_quant += qc_now_s() - t0;
  if (!g->need_x) return QC_OK;
  snprintf(what, sizeof what, "%s/inputs/x", sl->module);
  for (int i = 0; i < g->ndy; i++) {
    src xs = g->x;
    xs.M = g->dy[i].M;
    double *X = sl->X + i * sl->z->mk;
    pthread_mutex_lock(&g_read_lock);
    t0 = qc_now_s();
    rc = load_src(sl->d, &xs, sl->e, sl->module, "x", o->seed, K, X);
    sl->t_read += qc_now_s() - t0;
    pthread_mutex_unlock(&g_read_lock);
    if (rc || (rc = check_finite(X, xs.M, K, sl->module, "inputs/x"))) return rc;
    sl->x_gen = !xs.dset[0];
    t0 = qc_now_s();
    narrow(X, sl->f, xs.M * K);
    for (int a = 0; a < o->na; a++)
      if (strcmp(o->afmt[a], "none") != 0 &&
          (rc = fake_quant(sl, o->afmt[a], xs.M, K, sl->f, sl->Xq + (i * o->na + a) * sl->z->mk, what)))
        return rc;
    sl->t_quant += qc_now_s() - t0;
  }
  return QC_OK;
}

static void *prepare_thread(void *arg) {
  slot *sl = arg;
  sl->rc = prepare(sl);
  return NULL;
}

/* The main thread's buffers. */
typedef struct work {
  double *Wd;     /* [N, K] a quantized weight widened to float64 */
  double *dXm;    /* [ndy][M, K] dY W */
  double *dA;     /* [max(M K, N K)] a candidate */
  double *dB;     /* [N, K] dY^T X */
  double *Xd;     /* [M, K] a quantized X widened */
} work;

static void work_free(work *w) {
  free(w->Wd); free(w->dXm); free(w->dA); free(w->dB); free(w->Xd);
  memset(w, 0, sizeof *w);
}

static int work_alloc(work *w, const sizes *z, int need_x) {
  memset(w, 0, sizeof *w);
  int64_t big = z->nk > z->mk ? z->nk : z->mk;
  w->Wd = malloc((size_t)z->nk * sizeof(double));
  w->dXm = malloc((size_t)(z->mk * z->ndy) * sizeof(double));
  w->dA = malloc((size_t)big * sizeof(double));
  int ok = w->Wd && w->dXm && w->dA;
  if (ok && need_x) {
    w->dB = malloc((size_t)z->nk * sizeof(double));
    w->Xd = malloc((size_t)z->mk * sizeof(double));
    ok = w->dB && w->Xd;
  }
  if (!ok) {
    work_free(w);
    return qc_err_sys("out of memory for the GEMM buffers (largest weight %lld elements)", (long long)z->nk);
  }
  return QC_OK;
}

static void widen(const float *in, double *out, int64_t n) {
  for (int64_t i = 0; i < n; i++) out[i] = in[i];
}

/* Unit of slot sl: the GEMMs and one row per (dY, format). */
static int compute(const qc_backend *be, const qc_sweep_opts *o, const slot *sl, work *w, qc_sweep *s) {
  const group_plan *g = sl->g;
  const int64_t N = g->N, K = g->K;
  const sizes *z = sl->z;
  int rc;
  /* d_x rows: dY W against dY dequant(quant(W)) */
  for (int i = 0; i < g->ndy; i++)
    if ((rc = gemm(s, be, QC_OP_N, g->dy[i].M, K, N, sl->G + i * z->mn, N, sl->W, w->dXm + i * z->mk))) return rc;
  for (int f = 0; f < o->nw; f++) {
    const double *Wq = sl->W;
    if (strcmp(o->wfmt[f], "none") != 0) {
      widen(sl->Wq + f * z->nk, w->Wd, N * K);
      Wq = w->Wd;
    }
    for (int i = 0; i < g->ndy; i++) {
      const int64_t M = g->dy[i].M;
      if ((rc = gemm(s, be, QC_OP_N, M, K, N, sl->G + i * z->mn, N, Wq, w->dA))) return rc;
      if ((rc = add_row(s, be, o, sl->module, "d_x", o->wfmt[f], "none", g->dy[i].name, M, K, w->dA, w->dXm + i * z->mk)))
        return rc;
    }
  }
  if (!g->need_x) return QC_OK;
  /* d_weight rows: dY^T X against dY^T dequant(quant(X)) */
  for (int i = 0; i < g->ndy; i++) {
    const int64_t M = g->dy[i].M;
    const double *G = sl->G + i * z->mn;
    if ((rc = gemm(s, be, QC_OP_T, N, K, M, G, N, sl->X + i * z->mk, w->dB))) return rc;
    for (int a = 0; a < o->na; a++) {
      if (strcmp(o->afmt[a], "none") == 0) continue;
      widen(sl->Xq + (i * o->na + a) * z->mk, w->Xd, M * K);
      if ((rc = gemm(s, be, QC_OP_T, N, K, M, G, N, w->Xd, w->dA))) return rc;
      if ((rc = add_row(s, be, o, sl->module, "d_weight", "none", o->afmt[a], g->dy[i].name, N, K, w->dA, w->dB)))
        return rc;
    }
  }
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

/* How many units to prepare ahead on worker threads while the main thread
 * multiplies (0: none, everything in one thread, one unit in memory). More
 * than 0 only when the GEMMs run on a device or the host has 4 or more cores
 * (on 2 cores the worker competes with the BLAS threads and gained nothing
 * measurable, bench/RESULTS.md): a quarter
 * of the online cores, at most QC_MAX_AHEAD, and no more than a quarter of
 * physical memory's worth of unit buffers. QATCHECK_AHEAD=N overrides. */
#define QC_MAX_AHEAD 8
static int units_ahead(const qc_backend *be, size_t slot_bytes) {
  const char *env = getenv("QATCHECK_AHEAD");
  if (env && *env) {
    int v = atoi(env);
    return v < 0 ? 0 : v > QC_MAX_AHEAD ? QC_MAX_AHEAD : v;
  }
  long ncpu = sysconf(_SC_NPROCESSORS_ONLN);
  int p = be != qc_backend_cpu() ? (ncpu >= 4 ? (int)(ncpu / 4) : 1) : (ncpu >= 4 ? (int)(ncpu / 4) : 0);
  if (p > QC_MAX_AHEAD) p = QC_MAX_AHEAD;
  double mem = (double)sysconf(_SC_PHYS_PAGES) * (double)sysconf(_SC_PAGESIZE);
  while (p > 0 && (double)(p + 1) * (double)slot_bytes > 0.25 * mem) p--;
  return p;
}

/* A unit in flight: its slot, worker thread and whether one was started. */
typedef struct flight {
  pthread_t th;
  int started;
} flight;

/* Start preparing unit u in slot sl: on a worker thread when ahead > 0. */
static int launch(slot *sl, flight *fl, const group_plan *plans, const int *ug, const int *ue, int u, int ahead) {
  int rc = slot_set(sl, plans, ug, ue, u);
  if (rc) return rc;
  fl->started = ahead > 0 && pthread_create(&fl->th, NULL, prepare_thread, sl) == 0;
  if (!fl->started) sl->rc = prepare(sl);
  return QC_OK;
}

/* Run every unit: units u+1 .. u+ahead are prepared while unit u multiplies. */
static int run_units(qc_dump *d, const qc_backend *be, const qc_sweep_opts *o, const group_plan *plans, int nplan,
                     qc_sweep *s) {
  sizes z = {1, 1, 1, 1, 1};
  int need_x = 0, rc = QC_OK;
  for (int i = 0; i < nplan; i++) {
    const group_plan *g = &plans[i];
    need_x |= g->need_x;
    if (g->N * g->K > z.nk) z.nk = g->N * g->K;
    if (g->ndy > z.ndy) z.ndy = g->ndy;
    for (int j = 0; j < g->ndy; j++) {
      int64_t M = g->dy[j].M;
      if (M > z.m) z.m = M;
      if (M * g->N > z.mn) z.mn = M * g->N;
      if (M * g->K > z.mk) z.mk = M * g->K;
    }
  }
  size_t slot_bytes = (size_t)z.nk * (8 + 4 * (size_t)o->nw) + (size_t)(z.mn * z.ndy) * 8 +
                      (need_x ? (size_t)(z.mk * z.ndy) * (8 + 4 * (size_t)o->na) : 0);
  int ahead = units_ahead(be, slot_bytes), nslot = ahead + 1;
  s->ahead = ahead;
  int *ug = malloc((size_t)s->units * sizeof *ug), *ue = malloc((size_t)s->units * sizeof *ue);
  slot *sl = calloc((size_t)nslot, sizeof *sl);
  flight *fl = calloc((size_t)nslot, sizeof *fl);
  work w;
  memset(&w, 0, sizeof w);
  if (!ug || !ue || !sl || !fl) { rc = qc_err_sys("out of memory"); goto out; }
  for (int i = 0, u = 0; i < nplan; i++)
    for (int e = 0; e < plans[i].E; e++, u++) { ug[u] = i; ue[u] = e; }
  for (int k = 0; k < nslot; k++) {
    if ((rc = slot_alloc(&sl[k], &z, o, need_x))) goto out;
    sl[k].d = d; sl[k].o = o; sl[k].z = &z; sl[k].be = be;
  }
  if ((rc = work_alloc(&w, &z, need_x))) goto out;
  /* units 0 .. ahead-1 start now (unit 0 in this thread when ahead is 0) */
  int launched = 0;
  for (; launched < (ahead ? ahead : 1) && launched < s->units; launched++)
    if ((rc = launch(&sl[launched % nslot], &fl[launched % nslot], plans, ug, ue, launched, ahead))) goto out;
  for (int u = 0; u < s->units; u++) {
    slot *cur = &sl[u % nslot];
    flight *cf = &fl[u % nslot];
    if (cf->started) { pthread_join(cf->th, NULL); cf->started = 0; }
    if ((rc = cur->rc)) {
      /* workers share the one error channel: let them finish, then redo this
       * (the first failing) unit alone so the message is its own */
      for (int k = 0; ahead && k < nslot; k++)
        if (fl[k].started) { pthread_join(fl[k].th, NULL); fl[k].started = 0; }
      if (ahead) {
        qc_err_clear();
        if (prepare(cur) == QC_OK) rc = qc_err_sys("%s: preparing the unit failed on a worker thread", cur->module);
      }
      goto out;
    }
    /* the slot of unit u-1 is free: start unit u+ahead in it */
    if (ahead && launched < s->units) {
      if ((rc = launch(&sl[launched % nslot], &fl[launched % nslot], plans, ug, ue, launched, ahead))) goto out;
      launched++;
    }
    if (o->progress) fprintf(stderr, "\r\033[K[%d/%d] %s", u + 1, s->units, cur->module);
    s->t_read += cur->t_read;
    s->t_quant += cur->t_quant;
    s->dy_generated |= cur->dy_gen;
    s->x_generated |= cur->x_gen;
    if ((rc = compute(be, o, cur, &w, s))) goto out;
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
  for (int k = 0; sl && k < nslot; k++) slot_free(&sl[k]);
  free(sl);
  free(fl);
  work_free(&w);
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

  if ((rc = run_units(d, be, o, plans, nlin, s))) goto done;
  if (s->n == 0) { rc = qc_err("%s: nothing to check: the linear groups hold no experts", qc_dump_path(d)); goto done; }
  rc = qc_contract_summarize(s);
done:
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
