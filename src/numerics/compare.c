/* compare.c: the host's compare pass (see metrics.h): the metrics and the
 * rounded-reference pass (noise floor, bias test) of a float candidate
 * against its float64 reference in one read of each, the candidate read in
 * its own element type a row at a time, on qc_par_for's threads in the row
 * pieces of qc_row_pieces; and the precision a float tensor's values carry,
 * read the same way; and the noise floor of a reference alone. The sums are those of qc_metrics_compute_par and
 * qc_bias_pass up to their order, the same on any number of threads. */
#include "numerics/metrics.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "core/par.h"
#include "core/qc.h"
#include "numerics/formats.h"

int qc_compare_host_dtype(qc_dtype dt) { return dt == QC_F64 || dt == QC_F32 || dt == QC_F16 || dt == QC_BF16; }

/* out[0, n) = elements [off, off + n) of float tensor g, exactly. */
static void read_f64(const qc_tensor *g, int64_t off, int64_t n, double *out) {
  switch (g->dtype) {
    case QC_F64: memcpy(out, (const double *)g->data + off, (size_t)n * sizeof *out); break;
    case QC_F32: for (int64_t i = 0; i < n; i++) out[i] = ((const float *)g->data)[off + i]; break;
    case QC_F16: for (int64_t i = 0; i < n; i++) out[i] = qc_f16_to_f32(((const uint16_t *)g->data)[off + i]); break;
    case QC_BF16: for (int64_t i = 0; i < n; i++) out[i] = qc_bf16_to_f32(((const uint16_t *)g->data)[off + i]); break;
    default: memset(out, 0, (size_t)n * sizeof *out); break;
  }
}

/* One row piece's sums. */
typedef struct cmp_piece {
  double sg, sr, sd, dot, mx;
  int64_t worst, bad, rbad;
  qc_bias_sums s;
} cmp_piece;

typedef struct cmp_ctx {
  const qc_tensor *g;
  const double *r;             /* the block's rows [r0, r1) of the reference */
  int64_t r0, r1, k0;          /* k0: the block's first piece */
  int64_t rows, cols, per;
  qc_dtype dt; /* the rounding of the bias pass */
  int bias;
  cmp_piece *p;
  double *ct;  /* [pieces][2 cols] column sums, or NULL */
  double *row; /* [threads][cols]: each thread's candidate row */
} cmp_ctx;

/* ---- one row, four lanes at a time ----------------------------------------
 * The row's sums in 4 lanes of GCC vectors, reduced in a fixed order and
 * added to the piece, for rows whose values are all finite and a rounding
 * the lanes model (bf16, float32, float64); other rows take the scalar loop
 * in cmp_pieces. Built twice on x86-64 (target_clones), for AVX2 and for
 * the baseline, picked when the program loads: the same operations lane by
 * lane (ISO C: no contraction into FMA), so the same sums either way. On
 * one core, a 2048 x 2048 bf16 candidate: 12 ms, against 22 ms for the
 * scalar loop (its ~28 dependent float64 operations an element) and 26 ms
 * for these lanes on SSE2 alone (the baseline clone). */
#if defined(__x86_64__)
#define QC_LANES_CLONES __attribute__((target_clones("avx2", "default")))
#else
#define QC_LANES_CLONES
#endif
typedef double v4d __attribute__((vector_size(32)));
typedef float v4f __attribute__((vector_size(16)));
typedef uint32_t v4u __attribute__((vector_size(16)));

typedef int64_t v4l __attribute__((vector_size(32)));

/* q = q(b) lane-wise as qc_round_to: float32 first, then bf16 (round to
 * nearest even; b finite, so no NaN; a float32 Inf stays Inf). A macro: a
 * function passing 32-byte vectors changes the ABI without AVX. */
#define ROUND_LANES(q, b, dt)                                           \
  do {                                                                  \
    if ((dt) == QC_F64) {                                               \
      (q) = (b);                                                        \
      break;                                                            \
    }                                                                   \
    v4f f_ = __builtin_convertvector((b), v4f);                         \
    if ((dt) == QC_BF16) {                                              \
      v4u u_;                                                           \
      memcpy(&u_, &f_, sizeof u_);                                      \
      u_ = (u_ + 0x7fffu + ((u_ >> 16) & 1u)) & 0xffff0000u;            \
      memcpy(&f_, &u_, sizeof f_);                                      \
    }                                                                   \
    (q) = __builtin_convertvector(f_, v4d);                             \
  } while (0)

#define lanes(v) (((v)[0] + (v)[1]) + ((v)[2] + (v)[3]))

/* The row [cols] of candidate a against reference b into p (and ct, the
 * piece's interleaved column sums, or NULL), as the scalar loop does up to
 * the order of the sums. 0 when a value is not finite: nothing added. */
QC_LANES_CLONES static int row_lanes(const double *a, const double *b, int64_t cols, qc_dtype dt, int bias, double *ct, int64_t base,
                     cmp_piece *p) {
  const v4d zero = {0, 0, 0, 0};
  const int64_t n4 = cols & ~(int64_t)3;
  /* pass 1: the metrics' sums (a row stays in cache for pass 2; two passes
   * of 5 and 7 accumulators keep them in registers, one of 12 did not) */
  v4d sg = zero, sr = zero, sd = zero, dot = zero, mx = zero;
  for (int64_t j = 0; j < n4; j += 4) {
    v4d va, vb;
    memcpy(&va, a + j, sizeof va);
    memcpy(&vb, b + j, sizeof vb);
    const v4d d = va - vb, ad = (v4d)((v4l)d & 0x7fffffffffffffffLL);
    sg += va * va, sr += vb * vb, sd += d * d, dot += va * vb;
    const v4l gt = ad > mx;
    mx = (v4d)((gt & (v4l)ad) | (~gt & (v4l)mx));
  }
  double tg = 0, tr = 0, td = 0, tdot = 0, tmx = 0;
  for (int64_t i = n4; i < cols; i++) { /* the tail, in the same roles */
    const double va = a[i], vb = b[i], d = va - vb, ad = fabs(d);
    tg += va * va, tr += vb * vb, td += d * d, tdot += va * vb;
    if (ad > tmx) tmx = ad;
  }
  const double rg = lanes(sg) + tg, rr_ = lanes(sr) + tr;
  if (!isfinite(rg) || !isfinite(rr_)) return 0; /* a value not finite (or a square past DBL_MAX): the scalar way */
  p->sg += rg, p->sr += rr_, p->sd += lanes(sd) + td, p->dot += lanes(dot) + tdot;
  double rmx = tmx;
  for (int l = 0; l < 4; l++) rmx = mx[l] > rmx ? mx[l] : rmx;
  if (rmx > p->mx) { /* the first element of the row at the maximum: as the scalar loop's strict > */
    p->mx = rmx;
    for (int64_t i = 0; i < cols; i++)
      if (fabs(a[i] - b[i]) == rmx) { p->worst = base + i; break; }
  }
  if (!bias) return 1;
  /* pass 2: the rounded-reference sums */
  v4d snf = zero, sxr = zero, srr = zero, sxx = zero, sx2r2 = zero, sxr3 = zero, sr4 = zero;
  for (int64_t j = 0; j < n4; j += 4) {
    v4d va, vb, q;
    memcpy(&va, a + j, sizeof va);
    memcpy(&vb, b + j, sizeof vb);
    ROUND_LANES(q, vb, dt);
    const v4d e = q - vb, xv = va - q, xr = xv * vb, rr = vb * vb;
    snf += e * e, sxr += xr, srr += rr, sxx += xv * xv, sx2r2 += xr * xr, sxr3 += xr * rr, sr4 += rr * rr;
    if (ct) /* interleaved x r, r^2 a column: lane by lane (a shuffle needs GCC 12) */
      for (int l = 0; l < 4; l++) ct[2 * (j + l)] += xr[l], ct[2 * (j + l) + 1] += rr[l];
  }
  double tnf = 0, txr = 0, trr = 0, txx = 0, tx2r2 = 0, txr3 = 0, tr4 = 0;
  for (int64_t i = n4; i < cols; i++) {
    const double va = a[i], vb = b[i];
    const double q = qc_round_to(vb, dt), e = q - vb, xv = va - q, xr = xv * vb, rr = vb * vb;
    tnf += e * e, txr += xr, trr += rr, txx += xv * xv, tx2r2 += xr * xr, txr3 += xr * rr, tr4 += rr * rr;
    if (ct) ct[2 * i] += xr, ct[2 * i + 1] += rr;
  }
  const double t = lanes(sxr) + txr, c = lanes(srr) + trr;
  p->s.snf += lanes(snf) + tnf, p->s.sxr += t, p->s.srr += c, p->s.sxx += lanes(sxx) + txx;
  p->s.sx2r2 += lanes(sx2r2) + tx2r2, p->s.sxr3 += lanes(sxr3) + txr3, p->s.sr4 += lanes(sr4) + tr4;
  p->s.row_tt += t * t, p->s.row_tc += t * c, p->s.row_cc += c * c;
  return 1;
}

/* The block's rows of pieces k0 + [lo, hi): each piece's rows in row
 * order, wherever the blocks start and end (a piece's sums are the same
 * whether its rows come in one block or several). */
static void cmp_pieces(void *pv, int64_t lo, int64_t hi, int tid) {
  const cmp_ctx *x = pv;
  const int64_t cols = x->cols;
  const int lanes_ok = x->dt == QC_BF16 || x->dt == QC_F32 || x->dt == QC_F64 || !x->bias;
  double *row = x->row + (int64_t)tid * cols;
  for (int64_t k = x->k0 + lo; k < x->k0 + hi; k++) {
    cmp_piece *p = &x->p[k];
    double *ct = x->ct ? x->ct + k * 2 * cols : NULL;
    int64_t i0 = k * x->per, r1 = (k + 1) * x->per < x->rows ? (k + 1) * x->per : x->rows;
    i0 = i0 > x->r0 ? i0 : x->r0;
    r1 = r1 < x->r1 ? r1 : x->r1;
    for (int64_t i = i0; i < r1; i++) {
      const double *ri = x->r + (i - x->r0) * cols;
      double t = 0, c = 0;
      read_f64(x->g, i * cols, cols, row);
      if (lanes_ok && row_lanes(row, ri, cols, x->dt, x->bias, ct, i * cols, p)) continue;
      for (int64_t j = 0; j < cols; j++) {
        const double a = row[j], b = ri[j];
        if (!isfinite(b)) { p->rbad++; continue; }
        if (!isfinite(a)) { p->bad++; continue; }
        const double d = a - b, ad = fabs(d);
        p->sg += a * a;
        p->sr += b * b;
        p->sd += d * d;
        p->dot += a * b;
        if (ad > p->mx) { p->mx = ad; p->worst = i * cols + j; }
        if (!x->bias) continue;
        const double q = qc_round_to(b, x->dt), e = q - b, xv = a - q, xr = xv * b, rr = b * b;
        p->s.snf += e * e;
        p->s.sxr += xr;
        p->s.srr += rr;
        p->s.sxx += xv * xv;
        p->s.sx2r2 += xr * xr;
        p->s.sxr3 += xr * rr;
        p->s.sr4 += rr * rr;
        t += xr;
        c += rr;
        if (ct) { ct[2 * j] += xr; ct[2 * j + 1] += rr; }
      }
      p->s.row_tt += t * t;
      p->s.row_tc += t * c;
      p->s.row_cc += c * c;
    }
  }
}

struct qc_cmp_stream {
  cmp_ctx x;
  int64_t np, next; /* pieces; the rows delivered so far, [0, next) */
};

void qc_cmp_free(qc_cmp_stream *s) {
  if (!s) return;
  free(s->x.p), free(s->x.ct), free(s->x.row), free(s);
}

int qc_cmp_open(const qc_tensor *g, int64_t rows, int64_t cols, qc_dtype dt, int bias, qc_cmp_stream **out) {
  *out = NULL;
  if (!qc_compare_host_dtype(g->dtype)) return qc_err("'%s': compare pass of element type %s", g->name, qc_dtype_name(g->dtype));
  const int use_cols = bias && qc_bias_use_cols(rows, cols);
  int64_t per, np = qc_row_pieces(rows, cols, use_cols, &per);
  qc_cmp_stream *s = calloc(1, sizeof *s);
  cmp_piece *p = calloc((size_t)(np ? np : 1), sizeof *p);
  double *ct = use_cols ? calloc((size_t)(np * cols * 2), sizeof *ct) : NULL;
  double *row = malloc((size_t)(qc_par_threads() * (cols > 0 ? cols : 1)) * sizeof *row);
  if (!s || !p || !row || (use_cols && !ct)) {
    free(s), free(p), free(ct), free(row);
    return qc_err_sys("out of memory for the compare pass of '%s' (%lld columns)", g->name, (long long)cols);
  }
  for (int64_t k = 0; k < np; k++) p[k].mx = -1, p[k].worst = -1;
  s->x = (cmp_ctx){.g = g, .rows = rows, .cols = cols, .per = per, .dt = dt, .bias = bias, .p = p, .ct = ct, .row = row};
  s->np = np;
  *out = s;
  return QC_OK;
}

int qc_cmp_rows(qc_cmp_stream *s, const double *r, int64_t r0, int64_t r1) {
  if (r0 != s->next || r1 < r0 || r1 > s->x.rows)
    return qc_err("compare pass of '%s': rows [%lld, %lld) given after %lld of %lld", s->x.g->name, (long long)r0,
                  (long long)r1, (long long)s->next, (long long)s->x.rows);
  if (r1 > r0 && s->x.cols > 0) {
    const int64_t k0 = r0 / s->x.per, k1 = (r1 - 1) / s->x.per + 1;
    s->x.r = r, s->x.r0 = r0, s->x.r1 = r1, s->x.k0 = k0;
    qc_par_for(k1 - k0, 1, cmp_pieces, &s->x);
  }
  s->next = r1;
  return QC_OK;
}

int qc_cmp_finish(qc_cmp_stream *s, qc_metrics *m) {
  if (s->next != s->x.rows) {
    int rc = qc_err("compare pass of '%s': %lld of %lld rows given", s->x.g->name, (long long)s->next, (long long)s->x.rows);
    qc_cmp_free(s);
    return rc;
  }
  const cmp_piece *p = s->x.p;
  const double *ct = s->x.ct;
  const int64_t np = s->np, cols = s->x.cols;
  double sg = 0, sr = 0, sd = 0, dot = 0, mx = -1;
  int64_t worst = -1, bad = 0, rbad = 0;
  qc_bias_sums b;
  memset(&b, 0, sizeof b);
  for (int64_t k = 0; k < np; k++) { /* piece order; the lowest index wins a tie */
    sg += p[k].sg, sr += p[k].sr, sd += p[k].sd, dot += p[k].dot;
    bad += p[k].bad, rbad += p[k].rbad;
    if (p[k].mx > mx) { mx = p[k].mx; worst = p[k].worst; }
    b.snf += p[k].s.snf, b.sxr += p[k].s.sxr, b.srr += p[k].s.srr, b.sxx += p[k].s.sxx;
    b.sx2r2 += p[k].s.sx2r2, b.sxr3 += p[k].s.sxr3, b.sr4 += p[k].s.sr4;
    b.row_tt += p[k].s.row_tt, b.row_tc += p[k].s.row_tc, b.row_cc += p[k].s.row_cc;
  }
  if (ct) qc_col_sums(s->x.ct, np, cols, &b);
  qc_metrics_set(sg, sr, sd, dot, mx, worst, bad, rbad, m);
  if (s->x.bias) {
    b.rows = s->x.rows;
    b.cols = ct ? cols : 0; /* no column clusters */
    qc_bias_finish(&b, m);
  }
  qc_cmp_free(s);
  return QC_OK;
}

void qc_cmp_sums(const qc_cmp_stream *s, double *sd, double *sr) {
  double d = 0, r = 0;
  for (int64_t k = 0; k < s->np; k++) d += s->x.p[k].sd, r += s->x.p[k].sr;
  *sd = d, *sr = r;
}

int qc_compare_host(const qc_tensor *g, const double *r, int64_t rows, int64_t cols, qc_dtype dt, int bias, qc_metrics *m) {
  qc_cmp_stream *s;
  int rc = qc_cmp_open(g, rows, cols, dt, bias, &s);
  if (!rc) rc = qc_cmp_rows(s, r, 0, rows);
  if (rc) {
    qc_cmp_free(s);
    return rc;
  }
  return qc_cmp_finish(s, m);
}

/* Pieces of qc_values_dtype_of: held[piece] for QC_VCHUNK-sized pieces,
 * each read into its thread's buffer. */
#define QC_VCHUNK ((int64_t)1 << 16)
typedef struct vt_ctx {
  const qc_tensor *g;
  int64_t n;
  unsigned want, *held;
  double *buf; /* [threads][QC_VCHUNK] */
} vt_ctx;

static void vt_pieces(void *pv, int64_t lo, int64_t hi, int tid) {
  const vt_ctx *x = pv;
  double *b = x->buf + (int64_t)tid * QC_VCHUNK;
  for (int64_t c = lo; c < hi; c++) {
    const int64_t i0 = c * QC_VCHUNK, n = i0 + QC_VCHUNK < x->n ? QC_VCHUNK : x->n - i0;
    read_f64(x->g, i0, n, b);
    x->held[c] = qc_values_held(b, n, x->want);
  }
}

qc_dtype qc_values_dtype_of(const qc_tensor *g) {
  const unsigned want = qc_values_want(g->dtype);
  const int64_t n = qc_numel(g), np = (n + QC_VCHUNK - 1) / QC_VCHUNK;
  if (!want || !qc_compare_host_dtype(g->dtype) || n == 0) return g->dtype;
  unsigned *held = malloc((size_t)np * sizeof *held);
  const int threads = qc_par_threads();
  double *buf = malloc((size_t)(threads * QC_VCHUNK) * sizeof *buf);
  qc_dtype out = g->dtype; /* no memory: judged at its storage type */
  if (held && buf) {
    vt_ctx x = {g, n, want, held, buf};
    qc_par_for(np, 1, vt_pieces, &x);
    unsigned all = want;
    for (int64_t c = 0; c < np; c++) all &= held[c];
    out = qc_values_pick(all, g->dtype);
  }
  free(held), free(buf);
  return out;
}

double qc_noise_floor(const double *r, int64_t n, qc_dtype dtype) {
  double sd = 0, sr = 0;
  if (dtype == QC_F64) return 0.0;
  if (dtype != QC_BF16 && dtype != QC_F16 && dtype != QC_F32) return NAN;
  for (int64_t i = 0; i < n; i++) {
    const double d = qc_round_to(r[i], dtype) - r[i];
    sd += d * d;
    sr += r[i] * r[i];
  }
  return qc_rel_l2_sums(sd, sr); /* rel_l2 of q(r) against r, q formed on the fly */
}
