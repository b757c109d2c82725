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
  const double *r;
  int64_t rows, cols, per;
  qc_dtype dt; /* the rounding of the bias pass */
  int bias;
  cmp_piece *p;
  double *ct;  /* [pieces][2 cols] column sums, or NULL */
  double *row; /* [threads][cols]: each thread's candidate row */
} cmp_ctx;

static void cmp_pieces(void *pv, int64_t lo, int64_t hi, int tid) {
  const cmp_ctx *x = pv;
  const int64_t cols = x->cols;
  double *row = x->row + (int64_t)tid * cols;
  for (int64_t k = lo; k < hi; k++) {
    cmp_piece *p = &x->p[k];
    p->mx = -1;
    p->worst = -1;
    double *ct = x->ct ? x->ct + k * 2 * cols : NULL;
    const int64_t r1 = (k + 1) * x->per < x->rows ? (k + 1) * x->per : x->rows;
    for (int64_t i = k * x->per; i < r1; i++) {
      const double *ri = x->r + i * cols;
      double t = 0, c = 0;
      read_f64(x->g, i * cols, cols, row);
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

int qc_compare_host(const qc_tensor *g, const double *r, int64_t rows, int64_t cols, qc_dtype dt, int bias, qc_metrics *m) {
  if (!qc_compare_host_dtype(g->dtype)) return qc_err("'%s': compare pass of element type %s", g->name, qc_dtype_name(g->dtype));
  const int use_cols = bias && qc_bias_use_cols(rows, cols);
  int64_t per, np = qc_row_pieces(rows, cols, use_cols, &per);
  cmp_piece *p = calloc((size_t)np, sizeof *p);
  double *ct = use_cols ? calloc((size_t)(np * cols * 2), sizeof *ct) : NULL;
  double *row = malloc((size_t)(qc_par_threads() * (cols > 0 ? cols : 1)) * sizeof *row);
  if (!p || !row || (use_cols && !ct)) {
    free(p), free(ct), free(row);
    return qc_err_sys("out of memory for the compare pass of '%s' (%lld columns)", g->name, (long long)cols);
  }
  cmp_ctx x = {g, r, rows, cols, per, dt, bias, p, ct, row};
  if (rows > 0 && cols > 0) qc_par_for(np, 1, cmp_pieces, &x);
  double sg = 0, sr = 0, sd = 0, dot = 0, mx = -1;
  int64_t worst = -1, bad = 0, rbad = 0;
  qc_bias_sums s;
  memset(&s, 0, sizeof s);
  for (int64_t k = 0; k < np; k++) { /* piece order; the lowest index wins a tie */
    sg += p[k].sg, sr += p[k].sr, sd += p[k].sd, dot += p[k].dot;
    bad += p[k].bad, rbad += p[k].rbad;
    if (p[k].mx > mx) { mx = p[k].mx; worst = p[k].worst; }
    s.snf += p[k].s.snf, s.sxr += p[k].s.sxr, s.srr += p[k].s.srr, s.sxx += p[k].s.sxx;
    s.sx2r2 += p[k].s.sx2r2, s.sxr3 += p[k].s.sxr3, s.sr4 += p[k].s.sr4;
    s.row_tt += p[k].s.row_tt, s.row_tc += p[k].s.row_tc, s.row_cc += p[k].s.row_cc;
  }
  for (int64_t j = 0; ct && j < cols; j++) {
    double t = 0, c = 0;
    for (int64_t k = 0; k < np; k++) t += ct[k * 2 * cols + 2 * j], c += ct[k * 2 * cols + 2 * j + 1];
    s.col_tt += t * t, s.col_tc += t * c, s.col_cc += c * c;
  }
  free(p), free(ct), free(row);
  qc_metrics_set(sg, sr, sd, dot, mx, worst, bad, rbad, m);
  if (bias) {
    s.rows = rows;
    s.cols = use_cols ? cols : 0; /* no column clusters */
    qc_bias_finish(&s, m);
  }
  return QC_OK;
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
