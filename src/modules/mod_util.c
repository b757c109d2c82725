/* mod_util.c: see mod_util.h. */
#include "modules/mod_util.h"

#include <float.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "numerics/formats.h"
#include "backend/backend.h"
#include "core/par.h"
#include "core/qc.h"
#include "numerics/decode.h"

double *qc_mod_f64(const qc_tensor *t, const char *what) {
  double *d = qc_malloc((size_t)(qc_numel(t) + 1) * sizeof *d, what);
  if (d && qc_tensor_to_f64(t, d)) {
    free(d);
    return NULL;
  }
  return d;
}

float *qc_mod_f32(const qc_tensor *t, const char *what) {
  double *d = qc_mod_f64(t, what);
  float *f = d ? qc_malloc((size_t)(qc_numel(t) + 1) * sizeof *f, what) : NULL;
  if (f)
    for (int64_t i = 0; i < qc_numel(t); i++) f[i] = (float)d[i];
  free(d);
  return f;
}

int qc_mod_add(qc_tset *set, const char *name, qc_dtype dt, int ndim, const int64_t *shape, void **data) {
  qc_tensor t = {0};
  int rc = qc_tensor_alloc(&t, name, dt, ndim, shape);
  if (rc) return rc;
  void *p = t.data;
  if ((rc = qc_tset_add(set, &t))) {
    qc_tensor_free(&t);
    return rc;
  }
  *data = p;
  return QC_OK;
}

int qc_mod_gen_bf16(qc_tset *set, const char *name, int ndim, const int64_t *shape, qc_rng *rng, double scale,
                    uint16_t **data) {
  void *p;
  int rc = qc_mod_add(set, name, QC_BF16, ndim, shape, &p);
  if (rc) return rc;
  uint16_t *h = p;
  for (int64_t i = 0; i < qc_shape_numel(ndim, shape); i++) h[i] = qc_f32_to_bf16((float)(scale * qc_rng_normal(rng)));
  *data = h;
  return QC_OK;
}

void qc_mod_values(const qc_gen *g, qc_rng *rng, uint16_t *p, int64_t rows, int64_t cols, const float *extremes, int n) {
  if (g->values && strcmp(g->values, "heavy_tail") == 0)
    for (int64_t i = 0; i < rows * cols; i++)
      p[i] = qc_f32_to_bf16((float)(qc_bf16_to_f32(p[i]) / (0.05 + qc_rng_uniform(rng))));
  if (!qc_mod_special(g)) return;
  if (rows > 1) memset(p + (rows / 2) * cols, 0, (size_t)cols * sizeof *p);
  for (int64_t i = 5, j = 0; i < rows * cols; i += 37, j++) p[i] = qc_f32_to_bf16(extremes[j % n]);
}

int qc_mod_special(const qc_gen *g) { return g->values && strcmp(g->values, "special") == 0; }

int qc_mod_ids(const qc_module *m, const qc_tensor *t, const char *what, int64_t **out) {
  int64_t n = qc_numel(t);
  double *d = qc_mod_f64(t, what);
  int64_t *ids = d ? qc_malloc((size_t)(n + 1) * sizeof *ids, what) : NULL;
  int rc = ids ? QC_OK : QC_ESYS;
  for (int64_t i = 0; ids && i < n; i++) {
    if (!(d[i] == floor(d[i])) || fabs(d[i]) > 9.0e15) {
      rc = qc_err("%s: dataset '%s' element %lld is %g: expected an integer", m->path, what, (long long)i, d[i]);
      break;
    }
    ids[i] = (int64_t)d[i];
  }
  free(d);
  if (rc) free(ids);
  else *out = ids;
  return rc;
}

int qc_mod_unary_validate(const qc_module *m, const qc_tensor *dy) {
  const qc_tensor *xt;
  int rc = qc_module_need(m, "inputs", "x", 1, QC_MAXDIM, &xt);
  return rc ? rc : qc_module_check_dy(m, dy, qc_numel(xt), xt->shape[xt->ndim - 1], "the shape of inputs/x");
}

int qc_mod_unary_vjp(const qc_module *m, const qc_tensor *dy, qc_tset *grads, qc_mod_deriv_f32 deriv, int variant) {
  const qc_tensor *xt;
  float *dx;
  int rc;
  if ((rc = qc_module_need(m, "inputs", "x", 1, QC_MAXDIM, &xt))) return rc;
  if ((rc = qc_module_check_dy(m, dy, qc_numel(xt), xt->shape[xt->ndim - 1], "the shape of inputs/x"))) return rc;
  float *x = qc_mod_f32(xt, "activation input"), *g = qc_mod_f32(dy, "activation dY");
  rc = QC_ESYS;
  if (!x || !g) goto done;
  if ((rc = qc_mod_add(grads, "d_x", QC_F32, xt->ndim, xt->shape, (void **)&dx))) goto done;
  for (int64_t i = 0; i < qc_numel(xt); i++) dx[i] = g[i] * deriv(x[i], variant);
  rc = QC_OK;
done:
  free(x); free(g);
  return rc;
}

int qc_mod_unary_forward(const qc_module *m, const qc_module *branch, qc_tensor *y, qc_mod_fn_f64 fn, int variant) {
  const qc_tensor *xt, *bt;
  int rc;
  if ((rc = qc_module_need(m, "inputs", "x", 1, QC_MAXDIM, &xt))) return rc;
  if ((rc = qc_module_need(branch, "inputs", "x", 1, QC_MAXDIM, &bt))) return rc;
  double *x = qc_mod_f64(xt, "activation input"), *b = qc_mod_f64(bt, "activation input");
  rc = QC_ESYS;
  if (!x || !b) goto done;
  if ((rc = qc_tensor_alloc(y, "y", QC_F64, xt->ndim, xt->shape))) goto done;
  for (int64_t i = 0; i < qc_numel(xt); i++) ((double *)y->data)[i] = fn(x[i], b[i], variant);
  rc = QC_OK;
done:
  free(x); free(b);
  return rc;
}

int qc_mod_unary_generate(const char *cls, const qc_gen *gp, qc_rng *rng, qc_module *m, int *ondim, int64_t *oshape,
                          double scale) {
  if (gp->nshape != 2) return qc_err("%s: generate shape needs [T, F] (tokens, features), got %d entries", cls, gp->nshape);
  if (gp->shape[0] < 1 || gp->shape[1] < 1) return qc_err("%s: generate shape entries must be >= 1", cls);
  uint16_t *x;
  int rc = qc_mod_gen_bf16(&m->inputs, "x", 2, gp->shape, rng, scale, &x);
  if (rc) return rc;
  for (int64_t i = 3; i < gp->shape[0] * gp->shape[1]; i += 11) x[i] = 0;
  static const float ext[] = {3e4f, -3e4f, 1e-30f, -1e-30f, -0.0f};
  qc_mod_values(gp, rng, x, gp->shape[0], gp->shape[1], ext, 5);
  *ondim = 2;
  memcpy(oshape, gp->shape, 2 * sizeof *oshape);
  return QC_OK;
}

void qc_mod_tm(qc_tol_model *tm, int64_t k, double lambda, int rounded, double margin, const char *fmt, ...) {
  memset(tm, 0, sizeof *tm);
  tm->k = k < 1 ? 1 : k;
  tm->lambda = lambda;
  tm->rounded_operands = rounded;
  tm->margin = margin;
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(tm->why, sizeof tm->why, fmt, ap);
  va_end(ap);
}

/* Element i of t as a double for the float types read directly (bf16,
 * f16, f32, f64); 0 for the dtypes qc_mod_terms_tensor converts first. */
static double elem(const qc_tensor *t, int64_t i) {
  switch (t->dtype) {
    case QC_BF16: return qc_bf16_to_f32(((const uint16_t *)t->data)[i]);
    case QC_F16: return qc_f16_to_f32(((const uint16_t *)t->data)[i]);
    case QC_F32: return ((const float *)t->data)[i];
    case QC_F64: return ((const double *)t->data)[i];
    default: return 0.0;
  }
}

static int direct(const qc_tensor *t) {
  return t->dtype == QC_BF16 || t->dtype == QC_F16 || t->dtype == QC_F32 || t->dtype == QC_F64;
}

/* out[i] = bf16(src[i]) (round to nearest even) for i in [lo, hi). */
typedef struct round_ctx {
  const float *src;
  uint16_t *out;
} round_ctx;

static void round_piece(void *p, int64_t lo, int64_t hi, int tid) {
  (void)tid;
  const round_ctx *x = p;
  for (int64_t i = lo; i < hi; i++) x->out[i] = qc_f32_to_bf16(x->src[i]);
}

void qc_mod_to_bf16(const float *src, int64_t n, uint16_t *out) {
  round_ctx x = {src, out};
  qc_par_for(n, (int64_t)1 << 16, round_piece, &x);
}

/* max |v| over the finite v of pieces [lo, hi) of `per` elements into
 * mx[piece]: a maximum, the same on any number of threads. */
typedef struct maxabs_ctx {
  const qc_tensor *t;
  int64_t n, per;
  double *mx;
} maxabs_ctx;

static void maxabs_pieces(void *p, int64_t lo, int64_t hi, int tid) {
  (void)tid;
  const maxabs_ctx *x = p;
  for (int64_t c = lo; c < hi; c++) {
    float mx = 0; /* every type read directly is exact in float32; NaN and +-Inf fail both tests */
    const int64_t i0 = c * x->per, i1 = (c + 1) * x->per < x->n ? (c + 1) * x->per : x->n;
    const void *d = x->t->data;
    double m64 = 0;
    switch (x->t->dtype) { /* one read, no copy, the type's loop */
      case QC_BF16: { /* |x|'s bits order as its values: an integer maximum of the finite ones, in vector lanes */
        const uint16_t *h = (const uint16_t *)d;
        int16_t hb = 0, blk[64] = {0}; /* |x|'s bits fit int16: SSE2's signed 16-bit compare and maximum */
        int64_t i = i0;
        for (; i + 64 <= i1; i += 64) /* a fixed trip count: -O2 vectorizes it */
          for (int l = 0; l < 64; l++) {
            const int16_t u = (int16_t)(h[i + l] & 0x7fffu), v = u < 0x7f80 ? u : 0;
            blk[l] = v > blk[l] ? v : blk[l];
          }
        for (; i < i1; i++) {
          const int16_t u = (int16_t)(h[i] & 0x7fffu), v = u < 0x7f80 ? u : 0;
          hb = v > hb ? v : hb;
        }
        for (int l = 0; l < 64; l++) hb = blk[l] > hb ? blk[l] : hb;
        mx = qc_bf16_to_f32((uint16_t)hb);
        break;
      }
      case QC_F16:
        for (int64_t i = i0; i < i1; i++) {
          const float v = fabsf(qc_f16_to_f32(((const uint16_t *)d)[i]));
          if (v > mx && v <= FLT_MAX) mx = v;
        }
        break;
      case QC_F32:
        for (int64_t i = i0; i < i1; i++) {
          const float v = fabsf(((const float *)d)[i]);
          if (v > mx && v <= FLT_MAX) mx = v;
        }
        break;
      default:
        for (int64_t i = i0; i < i1; i++) {
          const double v = fabs(elem(x->t, i));
          if (v > m64 && v <= DBL_MAX) m64 = v;
        }
        break;
    }
    x->mx[c] = m64 > mx ? m64 : mx;
  }
}

double qc_mod_maxabs(const qc_tensor *t) {
  double mx = 0;
  const int64_t n = t ? qc_numel(t) : 0;
  if (n && !direct(t)) {
    qc_err_state es; /* a magnitude that cannot be read is 0, no error */
    qc_err_save(&es);
    double *d = qc_mod_f64(t, "magnitude");
    for (int64_t j = 0; d && j < n; j++)
      if (isfinite(d[j]) && fabs(d[j]) > mx) mx = fabs(d[j]);
    free(d);
    qc_err_restore(&es);
    return mx;
  }
  if (!n) return 0;
  const int64_t per = (int64_t)1 << 16, np = (n + per - 1) / per;
  double one, *p = np > 1 ? malloc((size_t)np * sizeof *p) : NULL; /* NULL: one piece */
  maxabs_ctx x = {t, n, p ? per : n, p ? p : &one};
  qc_par_for(p ? np : 1, 1, maxabs_pieces, &x);
  for (int64_t c = 0; c < (p ? np : 1); c++)
    if (x.mx[c] > mx) mx = x.mx[c];
  free(p);
  return mx;
}

/* ---- slices of a module split across ranks -------------------------------- */

/* out = t's entries [lo, hi) along dimension dim (-1: the last), name and
 * dtype kept. QC_OK, QC_EINPUT (dim or range outside t), QC_ESYS. */
static int qc_mod_cut(const qc_tensor *t, int dim, int64_t lo, int64_t hi, qc_tensor *out) {
  if (dim < 0) dim += t->ndim;
  if (dim < 0 || dim >= t->ndim || lo < 0 || hi > t->shape[dim] || lo > hi)
    return qc_err("'%s': slice [%lld, %lld) of dimension %d is outside its shape", t->name, (long long)lo, (long long)hi, dim);
  int64_t shape[QC_MAXDIM], outer = 1, inner = 1;
  memcpy(shape, t->shape, sizeof shape);
  for (int d = 0; d < dim; d++) outer *= t->shape[d];
  for (int d = dim + 1; d < t->ndim; d++) inner *= t->shape[d];
  shape[dim] = hi - lo;
  int rc = qc_tensor_alloc(out, t->name, t->dtype, t->ndim, shape);
  if (rc) return rc;
  const size_t es = qc_dtype_size(t->dtype), run = (size_t)((hi - lo) * inner) * es;
  for (int64_t o = 0; o < outer && run; o++)
    memcpy((char *)out->data + (size_t)o * run, (const char *)t->data + ((size_t)(o * t->shape[dim] + lo) * (size_t)inner) * es, run);
  return QC_OK;
}

int qc_mod_add_cut(qc_tset *dst, const qc_tensor *t, int dim, int64_t dim_len, int64_t lo, int64_t hi) {
  qc_tensor c = {0};
  int d = dim < 0 ? dim + t->ndim : dim;
  int cut = d >= 0 && d < t->ndim && t->shape[d] == dim_len;
  int rc = cut ? qc_mod_cut(t, d, lo, hi, &c) : qc_tensor_copy(&c, t);
  if (!rc) rc = qc_tset_add(dst, &c);
  qc_tensor_free(&c);
  return rc;
}

int qc_mod_part_init(const qc_module *m, qc_module *part) {
  memset(part, 0, sizeof *part);
  snprintf(part->path, sizeof part->path, "%s", m->path);
  part->cls = m->cls;
  part->contract = m->contract;
  if (m->cand && !(part->cand = qc_calloc((size_t)(m->grad_out.n > 0 ? m->grad_out.n : 1), sizeof *part->cand, "split candidates")))
    return QC_ESYS;
  return QC_OK;
}

void qc_mod_block_whole(int ndim, const int64_t *shape, qc_split_block *b) {
  memset(b, 0, sizeof *b);
  b->ndim = ndim;
  memcpy(b->shape, shape, (size_t)ndim * sizeof *shape);
  b->cols = ndim ? shape[ndim - 1] : 1;
  b->rows = 1;
  for (int d = 0; d + 1 < ndim; d++) b->rows *= shape[d];
  b->r1 = b->rows;
  b->c1 = b->cols;
}


/* Sampled rows [lo, hi) of qc_mod_terms_tensor: rs[row] = sum over the
 * sampled columns c of T[row, c]^2 (finite ones), each T a whole sum over
 * K in k order; tid's own [cols] scratch in t. */
typedef struct terms_ctx {
  const qc_tensor *a;
  int64_t sa_i, sa_k;
  const qc_tensor *b;
  int64_t sb_k, sb_j, K, step, cols, cstep;
  const double *bc; /* |b|'s sampled columns, [K, cols], or NULL */
  double *t, *rs;
} terms_ctx;

static void terms_rows(void *p, int64_t lo, int64_t hi, int tid) {
  const terms_ctx *x = p;
  double *t = x->t + (int64_t)tid * x->cols;
  for (int64_t r = lo; r < hi; r++) {
    const int64_t i = r * x->step;
    memset(t, 0, (size_t)x->cols * sizeof *t);
    for (int64_t k = 0; k < x->K; k++) {
      double av = fabs(elem(x->a, i * x->sa_i + k * x->sa_k));
      if (!(av > 0) || !isfinite(av)) continue;
      if (x->bc) {
        const double *br = x->bc + k * x->cols;
        for (int64_t c = 0; c < x->cols; c++) t[c] += av * br[c];
      } else {
        for (int64_t c = 0; c < x->cols; c++) t[c] += av * fabs(elem(x->b, k * x->sb_k + c * x->cstep * x->sb_j));
      }
    }
    double ss = 0;
    for (int64_t c = 0; c < x->cols; c++) ss += isfinite(t[c]) ? t[c] * t[c] : 0.0;
    x->rs[r] = ss;
  }
}

/* out[l] = |t[off + l stride]| for l in [0, n), t of a type read directly. */
static void gather_abs(const qc_tensor *t, int64_t off, int64_t stride, int64_t n, double *out) {
  const void *d = t->data;
  switch (t->dtype) { /* the type's loop, not elem()'s switch an element */
    case QC_BF16:
      for (int64_t l = 0; l < n; l++) out[l] = fabsf(qc_bf16_to_f32(((const uint16_t *)d)[off + l * stride]));
      break;
    case QC_F32:
      for (int64_t l = 0; l < n; l++) out[l] = fabsf(((const float *)d)[off + l * stride]);
      break;
    case QC_F64:
      for (int64_t l = 0; l < n; l++) out[l] = fabs(((const double *)d)[off + l * stride]);
      break;
    default:
      for (int64_t l = 0; l < n; l++) out[l] = fabs(elem(t, off + l * stride));
      break;
  }
}

/* Rows [lo, hi) of a gather: row k = |t[k rstep + l stride]|, l < n. */
typedef struct gather_ctx {
  const qc_tensor *t;
  int64_t rstep, stride, n;
  double *out;
} gather_ctx;

static void gather_rows(void *p, int64_t lo, int64_t hi, int tid) {
  (void)tid;
  const gather_ctx *x = p;
  for (int64_t k = lo; k < hi; k++) gather_abs(x->t, k * x->rstep, x->stride, x->n, x->out + k * x->n);
}

/* terms_rows' sums as one float64 GEMM on the CPU backend: T = |A_s| B_s
 * with A_s the sampled rows of a (non-finite and zero elements 0, as
 * terms_rows skips them) and B_s = bc (all finite: a non-finite |b| would
 * make 0 x Inf where terms_rows skips the product), then rs[row] = sum of
 * T's finite squares. 0 when done; non-zero (nothing reported) when the
 * caller should run terms_rows instead. The sampled terms were 5% of the
 * CPU linear audit as a loop (bench/cpu_linear.sh). */
static int terms_gemm(const qc_tensor *a, int64_t sa_i, int64_t sa_k, int64_t K, int64_t step, int64_t rows, int64_t cols,
                      const double *bc, double *rs) {
  double *A = malloc((size_t)(rows * K) * sizeof *A), *T = malloc((size_t)(rows * cols) * sizeof *T);
  int bad = !A || !T;
  if (!bad) {
    gather_ctx g = {a, step * sa_i, sa_k, K, A};
    qc_par_for(rows, 4, gather_rows, &g);
    for (int64_t i = 0; i < rows * K; i++) A[i] = A[i] <= DBL_MAX ? A[i] : 0.0; /* NaN fails too */
  }
  if (!bad) {
    const qc_backend *be = qc_backend_cpu();
    qc_err_state es; /* an error here only sends the caller to the loop */
    qc_err_save(&es);
    bad = be->gemm_f64(be, QC_OP_N, QC_OP_N, rows, cols, K, A, K, bc, cols, T, cols) != QC_OK;
    qc_err_restore(&es);
  }
  for (int64_t r = 0; !bad && r < rows; r++) {
    double ss = 0;
    for (int64_t c = 0; c < cols; c++) ss += isfinite(T[r * cols + c]) ? T[r * cols + c] * T[r * cols + c] : 0.0;
    rs[r] = ss;
  }
  free(A), free(T);
  return bad;
}

double qc_mod_terms_tensor(const qc_tensor *a, int64_t sa_i, int64_t sa_k, const qc_tensor *b, int64_t sb_k, int64_t sb_j,
                           int64_t M, int64_t N, int64_t K) {
  if (M < 1 || N < 1 || K < 1) return 0.0;
  if (!direct(a) || !direct(b)) { /* other element types: through float64 copies, read as float64 views */
    double *A = qc_mod_f64(a, "terms"), *B = A ? qc_mod_f64(b, "terms") : NULL, r = 0.0;
    qc_tensor va = {.dtype = QC_F64, .data = A}, vb = {.dtype = QC_F64, .data = B};
    if (A && B) r = qc_mod_terms_tensor(&va, sa_i, sa_k, &vb, sb_k, sb_j, M, N, K);
    free(A);
    free(B);
    return r;
  }
  /* rows and columns of T at an even stride, each element its whole sum over K */
  const int64_t step = M > 64 ? (M + 63) / 64 : 1, cstep = N > 256 ? (N + 255) / 256 : 1;
  const int64_t cols = (N + cstep - 1) / cstep, rows = (M + step - 1) / step;
  /* the sampled columns of |b| once, contiguous, where they fit in 64 MiB
   * (each row then sums a vector at a time, in the same order: the same
   * result; element by element through elem() and b's strides it was 12%
   * of a whole-model audit) */
  double *bc = (uint64_t)K * (uint64_t)cols <= ((uint64_t)64 << 20) / sizeof(double) ? malloc((size_t)(K * cols) * sizeof *bc) : NULL;
  double *rs = malloc((size_t)rows * sizeof *rs), *t = malloc((size_t)(QC_PAR_MAX * cols) * sizeof *t);
  if (!rs || !t) {
    free(bc), free(rs), free(t);
    return 0.0;
  }
  int finite = 1;
  if (bc) {
    gather_ctx g = {b, sb_k, cstep * sb_j, cols, bc};
    qc_par_for(K, 64, gather_rows, &g);
    for (int64_t i = 0; i < K * cols; i++) finite &= bc[i] <= DBL_MAX;
  }
  if (bc && finite && !terms_gemm(a, sa_i, sa_k, K, step, rows, cols, bc, rs)) {
    /* rs filled by one float64 GEMM of the sampled |a| rows and |b| columns */
  } else {
    terms_ctx x = {a, sa_i, sa_k, b, sb_k, sb_j, K, step, cols, cstep, bc, t, rs};
    qc_par_for(rows, 1, terms_rows, &x);
  }
  double ss = 0;
  for (int64_t r = 0; r < rows; r++) ss += rs[r]; /* row order: the same on any number of threads */
  free(bc), free(rs), free(t);
  return sqrt(ss * ((double)M / (double)rows) * ((double)N / (double)cols));
}

