/* metrics.c: one float64 pass over (g, r) (see metrics.h). */
#include "numerics/metrics.h"

#include <stdlib.h>
#include <string.h>

#include "core/par.h"
#include "core/qc.h"
#include "numerics/formats.h"

#include <math.h>
#include <stdio.h>
#include <string.h>

double qc_rel_l2_sums(double ss_diff, double ss_ref) { return sqrt(ss_diff) / fmax(sqrt(ss_ref), QC_EPS_NORM); }

double qc_rel_l2(const double *a, const double *b, int64_t n) {
  double d = 0, s = 0;
  for (int64_t i = 0; i < n; i++) {
    d += (a[i] - b[i]) * (a[i] - b[i]);
    s += b[i] * b[i];
  }
  return qc_rel_l2_sums(d, s);
}

void qc_metrics_finish(double ss_g, double ss_r, double ss_d, double dot, qc_metrics *m) {
  m->norm_g = sqrt(ss_g);
  m->norm_r = sqrt(ss_r);
  m->norm_diff = sqrt(ss_d);
  m->rel_l2 = qc_rel_l2_sums(ss_d, ss_r);
  m->norm_ratio = m->norm_r > 0 ? m->norm_g / m->norm_r : (m->norm_g > 0 ? INFINITY : NAN);
  if (m->norm_g > 0 && m->norm_r > 0) {
    /* near 1, <g,r>/(|g||r|) loses the digits that matter; from
     * |g-r|^2 = |g|^2 + |r|^2 - 2<g,r>:
     *   1 - cos = (|g-r|^2 - (|g| - |r|)^2) / (2 |g| |r|)
     * where |g-r|^2 was summed from exact differences. */
    double dn = m->norm_g - m->norm_r;
    double one_minus = (ss_d - dn * dn) / (2.0 * m->norm_g * m->norm_r);
    m->cosine = one_minus < 1e-3 ? 1.0 - fmax(one_minus, 0.0) : dot / (m->norm_g * m->norm_r);
    m->cosine_null = 0;
  } else {
    m->cosine = NAN;
    m->cosine_null = 1;
  }
  m->sqnr_db = ss_d > 0 ? 10.0 * log10(ss_r / ss_d) : INFINITY;
}

/* Sums of one contiguous run [i0, i1): four partial sums, combined at the
 * end (fewer rounding steps than one), the largest |g - r| at its lowest
 * index, non-finite counts. */
typedef struct mpart {
  double sg, sr, sd, dt, mx;
  int64_t worst, bad, rbad;
} mpart;

static mpart msum(const double *g, const double *r, int64_t i0, int64_t i1) {
  mpart q = {0, 0, 0, 0, -1, -1, 0, 0};
  for (int64_t i = i0; i < i1; i++) {
    double a = g[i], b = r[i];
    if (!isfinite(b)) { q.rbad++; continue; }
    if (!isfinite(a)) { q.bad++; continue; }
    double d = a - b;
    q.sg += a * a;
    q.sr += b * b;
    q.sd += d * d;
    q.dt += a * b;
    double ad = fabs(d);
    if (ad > q.mx) { q.mx = ad; q.worst = i; }
  }
  return q;
}

void qc_metrics_set(double ss_g, double ss_r, double ss_d, double dot, double mx, int64_t worst, int64_t bad, int64_t rbad,
                    qc_metrics *m) {
  memset(m, 0, sizeof *m);
  m->noise_multiple = NAN;
  m->noise_floor = NAN;
  m->e_par = m->bias_sd = m->bias_allow = m->bias_z_raw = m->bias_z = NAN;
  m->nonfinite = bad;
  m->ref_nonfinite = rbad;
  m->max_abs = mx < 0 ? 0 : mx;
  m->worst = worst;
  qc_metrics_finish(ss_g, ss_r, ss_d, dot, m);
}

/* The metrics from the sums. */
static void mfinish(const mpart *t, qc_metrics *m) { qc_metrics_set(t->sg, t->sr, t->sd, t->dt, t->mx, t->worst, t->bad, t->rbad, m); }

void qc_metrics_compute(const double *g, const double *r, int64_t n, qc_metrics *m) {
  mpart t = msum(g, r, 0, n);
  mfinish(&t, m);
}

/* ---- the same pass on qc_par_for's threads --------------------------------- */

#define QC_MCHUNK 65536

typedef struct mctx {
  const double *g, *r;
  int64_t n;
  mpart *p;
} mctx;

/* Chunks [lo, hi): each chunk's sums, as qc_metrics_compute forms them. */
static void mchunks(void *pv, int64_t lo, int64_t hi, int tid) {
  (void)tid;
  const mctx *x = pv;
  for (int64_t c = lo; c < hi; c++) {
    int64_t i0 = c * QC_MCHUNK, i1 = i0 + QC_MCHUNK < x->n ? i0 + QC_MCHUNK : x->n;
    x->p[c] = msum(x->g, x->r, i0, i1);
  }
}

void qc_metrics_compute_par(const double *g, const double *r, int64_t n, qc_metrics *m) {
  int64_t nc = (n + QC_MCHUNK - 1) / QC_MCHUNK;
  mpart *p = nc > 1 ? malloc((size_t)nc * sizeof *p) : NULL;
  if (!p) { qc_metrics_compute(g, r, n, m); return; }
  mctx x = {g, r, n, p};
  qc_par_for(nc, 1, mchunks, &x);
  mpart t = {0, 0, 0, 0, -1, -1, 0, 0};
  for (int64_t c = 0; c < nc; c++) { /* chunk order: the lowest index wins a tie */
    t.sg += p[c].sg; t.sr += p[c].sr; t.sd += p[c].sd; t.dt += p[c].dt;
    t.bad += p[c].bad; t.rbad += p[c].rbad;
    if (p[c].mx > t.mx) { t.mx = p[c].mx; t.worst = p[c].worst; }
  }
  free(p);
  mfinish(&t, m);
}

/* ---- the rounded-reference pass: noise floor and bias test -------------- */

double qc_round_to(double r, qc_dtype dt) {
  if (dt == QC_F64) return r;
  float f = (float)r;
  if (dt == QC_BF16) return qc_round_bf16(f);
  if (dt == QC_F16) return qc_f16_to_f32(qc_f32_to_f16(f));
  return f;
}

typedef struct round_job {
  void *a;
  qc_dtype container, dt;
} round_job;

static void round_piece(void *ctx, int64_t lo, int64_t hi, int tid) {
  (void)tid;
  const round_job *j = ctx;
  if (j->container == QC_F64) {
    double *a = j->a;
    if (j->dt == QC_BF16)
      for (int64_t i = lo; i < hi; i++) a[i] = qc_round_bf16((float)a[i]);
    else
      for (int64_t i = lo; i < hi; i++) a[i] = qc_round_to(a[i], j->dt);
  } else {
    float *a = j->a;
    if (j->dt == QC_BF16)
      for (int64_t i = lo; i < hi; i++) a[i] = qc_round_bf16(a[i]);
    else
      for (int64_t i = lo; i < hi; i++) a[i] = (float)qc_round_to(a[i], j->dt);
  }
}

void qc_round_all(void *a, qc_dtype container, int64_t n, qc_dtype dt) {
  if ((container != QC_F64 && container != QC_F32) || dt == QC_F64 || n <= 0) return;
  round_job j = {a, container, dt};
  qc_par_for(n, (int64_t)1 << 16, round_piece, &j);
}

static void abs_piece(void *ctx, int64_t lo, int64_t hi, int tid) {
  (void)tid;
  double *a = ctx;
  for (int64_t i = lo; i < hi; i++) a[i] = fabs(a[i]);
}

void qc_abs_all(double *a, int64_t n) {
  if (n > 0) qc_par_for(n, (int64_t)1 << 16, abs_piece, a);
}

/* 1 when v (finite) is exactly a value of dt. */
static int holds(double v, qc_dtype dt) {
  if (dt == QC_F64) return 1;
  float f = (float)v;
  if ((double)f != v) return 0;
  if (dt == QC_F32) return 1;
  if (dt == QC_BF16) return qc_round_bf16(f) == f;
  return qc_f16_to_f32(qc_f32_to_f16(f)) == f;
}

static const qc_dtype g_vorder[3] = {QC_BF16, QC_F16, QC_F32};

unsigned qc_values_want(qc_dtype container) {
  int width[QC_DTYPE_COUNT] = {0};
  width[QC_BF16] = 1;
  width[QC_F16] = 2;
  width[QC_F32] = 3;
  width[QC_F64] = 4;
  unsigned want = 0;
  for (int k = 0; width[container] && k < 3 && width[g_vorder[k]] < width[container]; k++) want |= 1u << k;
  return want;
}

unsigned qc_values_held(const double *g, int64_t n, unsigned want) {
  unsigned h = want;
  for (int64_t i = 0; i < n && h; i++)
    if (isfinite(g[i]))
      for (int k = 0; k < 3; k++)
        if ((h & (1u << k)) && !holds(g[i], g_vorder[k])) h &= ~(1u << k);
  return h;
}

qc_dtype qc_values_pick(unsigned held, qc_dtype container) {
  for (int k = 0; k < 3; k++)
    if (held & qc_values_want(container) & (1u << k)) return g_vorder[k];
  return container;
}

/* Pieces of qc_values_dtype: held[piece] = qc_values_held of the piece. */
typedef struct vd_ctx {
  const double *g;
  int64_t n, per;
  unsigned want, *held;
} vd_ctx;

static void vd_pieces(void *p, int64_t lo, int64_t hi, int tid) {
  (void)tid;
  const vd_ctx *x = p;
  for (int64_t c = lo; c < hi; c++) {
    const int64_t i1 = (c + 1) * x->per < x->n ? (c + 1) * x->per : x->n;
    x->held[c] = qc_values_held(x->g + c * x->per, i1 - c * x->per, x->want);
  }
}

qc_dtype qc_values_dtype(const double *g, int64_t n, qc_dtype container) {
  const unsigned want = qc_values_want(container);
  if (!want) return container;
  const int64_t per = (int64_t)1 << 16, np = n > 0 ? (n + per - 1) / per : 1;
  unsigned one, *held = np > 1 ? malloc((size_t)np * sizeof *held) : NULL; /* NULL: one piece */
  const int64_t pieces = held ? np : 1;
  vd_ctx x = {g, n, held ? per : (n > 0 ? n : 1), want, held ? held : &one};
  qc_par_for(pieces, 1, vd_pieces, &x);
  unsigned all = want;
  for (int64_t c = 0; c < pieces; c++) all &= x.held[c];
  free(held);
  return qc_values_pick(all, container);
}

void qc_bias_finish(const qc_bias_sums *s, qc_metrics *m) {
  m->noise_floor = sqrt(s->snf) / fmax(m->norm_r, QC_EPS_NORM);
  if (!(s->srr > 0)) { /* a zero reference: nothing to project on */
    m->e_par = m->bias_sd = m->bias_allow = m->bias_z_raw = m->bias_z = 0.0;
    return;
  }
  double b = s->sxr / s->srr;
  /* a standard error needs enough contributing elements: the participation
   * ratio (sum r^2)^2 / sum r^4 counts them (1 when one element dominates) */
  if (s->srr * s->srr < QC_BIAS_MIN_EFF * s->sr4) {
    m->e_par = b;
    m->bias_sd = m->bias_z_raw = NAN;
    m->bias_allow = 0;
    m->bias_z = 0.0;
    return;
  }
  /* sandwich variances of b (times srr^2) from the residuals x - b r:
   * elementwise, and clustered by rows and by columns, expanded so that
   * one pass of sums suffices */
  double v = s->sx2r2 - 2.0 * b * s->sxr3 + b * b * s->sr4;
  if (s->rows >= QC_BIAS_MIN_CLUSTERS) v = fmax(v, s->row_tt - 2.0 * b * s->row_tc + b * b * s->row_cc);
  if (s->cols >= QC_BIAS_MIN_CLUSTERS && s->rows > 1) v = fmax(v, s->col_tt - 2.0 * b * s->col_tc + b * b * s->col_cc);
  double sd = sqrt(fmax(v, 0.0)) / s->srr;
  double allow = QC_BIAS_ALLOW * fmax(s->sxx - b * b * s->srr, 0.0) / s->srr;
  double excess = fmax(fabs(b) - allow, 0.0);
  m->e_par = b;
  m->bias_sd = sd;
  m->bias_allow = allow;
  m->bias_z_raw = sd > 0 ? b / sd : (b == 0 ? 0.0 : copysign(INFINITY, b));
  m->bias_z = excess == 0 ? 0.0 : sd > 0 ? copysign(excess / sd, b) : copysign(INFINITY, b);
}

int qc_bias_use_cols(int64_t rows, int64_t cols) {
  return rows > 1 && cols >= QC_BIAS_MIN_CLUSTERS && cols <= ((int64_t)1 << 24);
}

size_t qc_bias_dev_doubles(int64_t rows, int64_t cols) {
  int64_t strips = (cols + 32 * QC_DEV_SUM_COLS - 1) / (32 * QC_DEV_SUM_COLS);
  int64_t chunks = (rows + QC_DEV_SUM_ROWS - 1) / QC_DEV_SUM_ROWS;
  return (size_t)(strips * chunks * 13 + rows * strips * 2 + chunks * cols * 2 + QC_DEV_SUM_FB * 21);
}

/* Rows [r0, r1) of the rounded-reference pass into s (its elementwise and
 * row-cluster sums, added) and ct (its column sums, interleaved x r and
 * r^2; NULL: none). */
static void bias_rows(const double *g, const double *r, int64_t r0, int64_t r1, int64_t cols, qc_dtype dt, qc_bias_sums *s,
                      double *ct) {
  for (int64_t i = r0; i < r1; i++) {
    const double *gi = g + i * cols, *ri = r + i * cols;
    double t = 0, c = 0;
    for (int64_t j = 0; j < cols; j++) {
      double rv = ri[j], gv = gi[j];
      if (!isfinite(rv) || !isfinite(gv)) continue;
      double q = qc_round_to(rv, dt), x = gv - q, e = q - rv, xr = x * rv, rr = rv * rv;
      s->snf += e * e;
      s->sxr += xr;
      s->srr += rr;
      s->sxx += x * x;
      s->sx2r2 += xr * xr;
      s->sxr3 += xr * rr;
      s->sr4 += rr * rr;
      t += xr;
      c += rr;
      if (ct) { ct[2 * j] += xr; ct[2 * j + 1] += rr; }
    }
    s->row_tt += t * t;
    s->row_tc += t * c;
    s->row_cc += c * c;
  }
}

/* The pass in row pieces on qc_par_for's threads. The pieces are fixed by
 * the shape alone (QC_BIAS_PIECES at most, at least QC_BIAS_PIECE_MIN
 * elements each, their column sums within QC_BIAS_PIECE_COLS doubles), and
 * their sums are added in piece order: the same result on any number of
 * threads. Many small pieces, not one a thread: a reference that streams
 * (qc_cmp_rows) hands over one expert's rows at a time, and only the
 * pieces those rows touch run in parallel (an expert of a [256 x 4096,
 * 7168] d_w1 spans 10 or 11 pieces of 449 rows; its column sums are then
 * 256 MiB, added up by qc_col_sums). */
#define QC_BIAS_PIECES 4096
#define QC_BIAS_PIECE_MIN ((int64_t)1 << 18)
#define QC_BIAS_PIECE_COLS ((int64_t)1 << 24)
typedef struct bias_ctx {
  const double *g, *r;
  int64_t rows, cols, per;
  qc_dtype dt;
  qc_bias_sums *s; /* [pieces] */
  double *ct;      /* [pieces][2 cols], or NULL */
} bias_ctx;

static void bias_pieces(void *p, int64_t lo, int64_t hi, int tid) {
  (void)tid;
  const bias_ctx *x = p;
  for (int64_t k = lo; k < hi; k++) {
    int64_t r0 = k * x->per, r1 = r0 + x->per < x->rows ? r0 + x->per : x->rows;
    bias_rows(x->g, x->r, r0, r1, x->cols, x->dt, &x->s[k], x->ct ? x->ct + k * 2 * x->cols : NULL);
  }
}

int64_t qc_row_pieces(int64_t rows, int64_t cols, int use_cols, int64_t *per) {
  int64_t np = rows * cols / QC_BIAS_PIECE_MIN;
  if (np > QC_BIAS_PIECES) np = QC_BIAS_PIECES;
  if (np > rows) np = rows;
  if (use_cols && np * cols > QC_BIAS_PIECE_COLS) np = QC_BIAS_PIECE_COLS / cols;
  if (np < 1) np = 1;
  *per = rows > 0 ? (rows + np - 1) / np : 0;
  return *per > 0 ? (rows + *per - 1) / *per : 1;
}

int qc_bias_pass(const double *g, const double *r, int64_t rows, int64_t cols, qc_dtype dt, qc_metrics *m) {
  qc_bias_sums s;
  memset(&s, 0, sizeof s);
  s.rows = rows;
  s.cols = cols;
  const int use_cols = qc_bias_use_cols(rows, cols);
  int64_t per, np = qc_row_pieces(rows, cols, use_cols, &per);
  qc_bias_sums *ps = calloc((size_t)np, sizeof *ps);
  double *ct = use_cols ? calloc((size_t)(np * cols * 2), sizeof *ct) : NULL;
  if (!ps || (use_cols && !ct)) {
    free(ps);
    free(ct);
    return qc_err_sys("out of memory for the bias test's column sums");
  }
  bias_ctx x = {g, r, rows, cols, per, dt, ps, ct};
  if (rows > 0) qc_par_for(np, 1, bias_pieces, &x);
  for (int64_t k = 0; k < np; k++) { /* piece order */
    s.snf += ps[k].snf;
    s.sxr += ps[k].sxr;
    s.srr += ps[k].srr;
    s.sxx += ps[k].sxx;
    s.sx2r2 += ps[k].sx2r2;
    s.sxr3 += ps[k].sxr3;
    s.sr4 += ps[k].sr4;
    s.row_tt += ps[k].row_tt;
    s.row_tc += ps[k].row_tc;
    s.row_cc += ps[k].row_cc;
  }
  if (ct)
    qc_col_sums(ct, np, cols, &s);
  else
    s.cols = 0; /* no column clusters */
  free(ct);
  free(ps);
  qc_bias_finish(&s, m);
  return QC_OK;
}

void qc_bias_allow(qc_metrics *m, double allow) {
  if (isnan(m->bias_z) || isnan(m->bias_sd) || !(allow > m->bias_allow)) return;
  m->bias_allow = allow;
  double excess = fmax(fabs(m->e_par) - allow, 0.0);
  m->bias_z = excess == 0 ? 0.0 : m->bias_sd > 0 ? copysign(excess / m->bias_sd, m->e_par) : copysign(INFINITY, m->e_par);
}

void qc_bias_set_allow(qc_metrics *m, double allow) {
  if (isnan(m->bias_z) || isnan(m->bias_sd)) return;
  m->bias_allow = allow;
  double excess = fmax(fabs(m->e_par) - allow, 0.0);
  m->bias_z = excess == 0 ? 0.0 : m->bias_sd > 0 ? copysign(excess / m->bias_sd, m->e_par) : copysign(INFINITY, m->e_par);
}

/* ---- blocks of several ranks (metrics.h) ------------------------------------ */

enum { P_SG, P_SR, P_SD, P_DT, P_BAD, P_RBAD, P_SXR, P_SRR, P_SXX, P_SX2R2, P_SXR3, P_SR4, P_SNF, P_N };

int64_t qc_mparts_len(int64_t rows, int64_t cols) {
  return P_N + 2 * rows + (qc_bias_use_cols(rows, cols) ? 2 * cols : 0);
}

void qc_mparts_add(const double *g, const double *r, int64_t r0, int64_t r1, int64_t c0, int64_t c1, int64_t rows, int64_t cols,
                   qc_dtype dt, double *parts, double *mx) {
  double *rt = parts + P_N, *ct = qc_bias_use_cols(rows, cols) ? parts + P_N + 2 * rows : NULL;
  const int64_t w = c1 - c0;
  mx[0] = -1;
  mx[1] = -1;
  for (int64_t i = r0; i < r1; i++) {
    const double *gi = g + (i - r0) * w, *ri = r + (i - r0) * w;
    double t = 0, c = 0;
    for (int64_t j = 0; j < w; j++) {
      double a = gi[j], b = ri[j];
      if (!isfinite(b)) { parts[P_RBAD] += 1; continue; }
      if (!isfinite(a)) { parts[P_BAD] += 1; continue; }
      double d = a - b, ad = fabs(d);
      parts[P_SG] += a * a;
      parts[P_SR] += b * b;
      parts[P_SD] += d * d;
      parts[P_DT] += a * b;
      if (ad > mx[0]) { mx[0] = ad; mx[1] = (double)(i * cols + c0 + j); }
      double q = qc_round_to(b, dt), x = a - q, e = q - b, xr = x * b, rr = b * b;
      parts[P_SNF] += e * e;
      parts[P_SXR] += xr;
      parts[P_SRR] += rr;
      parts[P_SXX] += x * x;
      parts[P_SX2R2] += xr * xr;
      parts[P_SXR3] += xr * rr;
      parts[P_SR4] += rr * rr;
      t += xr;
      c += rr;
      if (ct) { ct[2 * (c0 + j)] += xr; ct[2 * (c0 + j) + 1] += rr; }
    }
    rt[2 * i] += t;
    rt[2 * i + 1] += c;
  }
}

void qc_mparts_finish(const double *parts, const double *mx, int64_t rows, int64_t cols, qc_metrics *m) {
  mpart t = {parts[P_SG], parts[P_SR], parts[P_SD], parts[P_DT], mx[0], (int64_t)mx[1], (int64_t)parts[P_BAD], (int64_t)parts[P_RBAD]};
  mfinish(&t, m);
  qc_bias_sums s;
  memset(&s, 0, sizeof s);
  s.rows = rows;
  s.cols = qc_bias_use_cols(rows, cols) ? cols : 0;
  s.sxr = parts[P_SXR], s.srr = parts[P_SRR], s.sxx = parts[P_SXX], s.sx2r2 = parts[P_SX2R2];
  s.sxr3 = parts[P_SXR3], s.sr4 = parts[P_SR4], s.snf = parts[P_SNF];
  for (int64_t i = 0; i < rows; i++) {
    const double *a = parts + P_N + 2 * i;
    s.row_tt += a[0] * a[0];
    s.row_tc += a[0] * a[1];
    s.row_cc += a[1] * a[1];
  }
  for (int64_t j = 0; j < s.cols; j++) {
    const double *a = parts + P_N + 2 * rows + 2 * j;
    s.col_tt += a[0] * a[0];
    s.col_tc += a[0] * a[1];
    s.col_cc += a[1] * a[1];
  }
  qc_bias_finish(&s, m);
}
