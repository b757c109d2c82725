/* metrics.h: the comparison of one candidate gradient g with its reference r,
 * computed in one float64 pass. Numerics, not model: every backend computes
 * these sums (the CUDA one on the device); the verdict on them is
 * model/check.h's qc_judge. */
#ifndef QC_METRICS_H
#define QC_METRICS_H

#include <stdint.h>

#include "core/tensor.h"

typedef struct qc_metrics {
  double max_abs;        /* max |g - r| over finite pairs */
  int64_t worst;         /* flat index of max_abs (-1 if none) */
  double rel_l2;         /* ||g - r|| / max(||r||, eps) */
  double norm_ratio;     /* ||g|| / ||r|| (NAN when ||r|| = 0) */
  double cosine;         /* <g, r> / (||g|| ||r||) */
  int cosine_null;       /* 1 when a norm is zero: cosine undefined */
  double sqnr_db;        /* 10 log10(||r||^2 / ||g - r||^2); +INF when equal */
  int64_t nonfinite;     /* non-finite values in g */
  int64_t ref_nonfinite; /* non-finite values in r: the run cannot be judged */
  double norm_g, norm_r, norm_diff;
  double noise_multiple; /* error / noise floor (NAN when not computed) */
  double noise_floor;    /* rel-L2 of the reference rounded to the candidate dtype */
  /* The bias test (qc_bias_pass; NAN where not computed): x = g - q(r), q
   * rounding to the judged element type, regressed on r (docs/tolerances.md). */
  double e_par;          /* <x, r> / <r, r>: the candidate's systematic relative error along r */
  double bias_sd;        /* its standard error: the largest of the sandwich estimates, elementwise
                            and clustered by rows and by columns (clusterings with >= 32 clusters);
                            NAN when fewer than QC_BIAS_MIN_EFF elements carry the reference */
  double bias_allow;     /* second-order rounding allowance 3 ||x - e_par r||^2 / ||r||^2 */
  double bias_z_raw;     /* e_par / bias_sd (0 when both are 0) */
  double bias_z;         /* the judged z: sign(e_par) max(0, |e_par| - bias_allow) / bias_sd */
  double term_floor;     /* absolute normwise error the arithmetic can make from the scale of the
                            gradient's terms (margin u_acc ||T||, the class's error model; 0: none):
                            the rel bounds, the noise multiple's divisor and the bias allowance
                            grow by term_floor / ||r|| (a cancelling sum is not judged against itself) */
} qc_metrics;

#define QC_EPS_NORM 1e-30

/* The relative L2 error ||a - b|| / max(||b||, QC_EPS_NORM) of a against
 * b (n each), float64 sums in index order: the one definition of rel_l2
 * (the metrics pass finishes its own sums with qc_rel_l2_sums). */
double qc_rel_l2(const double *a, const double *b, int64_t n);
/* The same from the sums ss_diff = sum (a - b)^2 and ss_ref = sum b^2:
 * sqrt(ss_diff) / max(sqrt(ss_ref), QC_EPS_NORM). */
double qc_rel_l2_sums(double ss_diff, double ss_ref);

/* Compute metrics of g against r (n elements each), float64 throughout. */
void qc_metrics_compute(const double *g, const double *r, int64_t n, qc_metrics *out);
/* The same metrics with the sums formed over fixed chunks of 65536 elements
 * on qc_par_for's threads and added in chunk order: the same result for any
 * thread count; within rounding (a few ulps) of qc_metrics_compute. */
void qc_metrics_compute_par(const double *g, const double *r, int64_t n, qc_metrics *m);
/* Fill out->rel_l2-style fields from accumulated sums (for backends that
 * accumulate in parts): ss_g = sum g^2, ss_r = sum r^2, ss_d = sum (g-r)^2,
 * dot = sum g r. */
void qc_metrics_finish(double ss_g, double ss_r, double ss_d, double dot, qc_metrics *out);
/* m from a whole pass's sums (qc_metrics_finish's four), its largest
 * |g - r| mx (-1: none) at flat index worst, and the non-finite counts of
 * g (bad) and r (rbad); the noise floor and bias fields NAN. */
void qc_metrics_set(double ss_g, double ss_r, double ss_d, double dot, double mx, int64_t worst, int64_t bad, int64_t rbad,
                    qc_metrics *m);

/* The sums of the rounded-reference pass over a [rows, cols] view of one
 * (g, r) pair (cols = the last dimension), x = g - q(r), finite pairs only:
 * elementwise sums, and the row / column cluster sums T = sum x r and
 * C = sum r^2 already squared and summed (sum T^2, sum T C, sum C^2). */
typedef struct qc_bias_sums {
  double sxr, srr, sxx, sx2r2, sxr3, sr4, snf; /* snf = sum (q(r) - r)^2 */
  double row_tt, row_tc, row_cc, col_tt, col_tc, col_cc;
  int64_t rows, cols;
} qc_bias_sums;

#define QC_BIAS_MIN_CLUSTERS 32
/* Fewer effective elements than this ((sum r^2)^2 / sum r^4) and the bias
 * test is not made: z 0, sd and z_raw NAN. */
#define QC_BIAS_MIN_EFF 16
#define QC_BIAS_ALLOW 3.0

/* The rounded-reference pass on the host: noise floor and bias test of g
 * against r at element type dt (QC_BF16, QC_F16, QC_F32 or QC_F64: q is
 * the rounding to it, identity for float64), r a [rows, cols] row-major
 * view. Needs m->norm_r (from the metrics pass); fills noise_floor and the
 * bias fields. QC_OK, or QC_ESYS (out of memory for the column sums). */
int qc_bias_pass(const double *g, const double *r, int64_t rows, int64_t cols, qc_dtype dt, qc_metrics *m);
/* 1 when the column clusters of a [rows, cols] view are used (several rows,
 * enough columns, and the [cols] sums fit). */
int qc_bias_use_cols(int64_t rows, int64_t cols);
/* Doubles of device scratch the fused audit pass needs for a [rows, cols]
 * gradient (the CUDA backend's qk_audit_sums: per block of one strip of
 * 32 x QC_DEV_SUM_COLS columns by QC_DEV_SUM_ROWS rows a partial of 13
 * doubles (the metrics' 8 and 5 sums); 2 a row a strip; 2 a column a chunk
 * of rows; QC_DEV_SUM_FB combined partials of 21): the arena's layout and
 * the audit's memory estimate agree through this rule. */
#define QC_DEV_SUM_THREADS 256
#define QC_DEV_SUM_COLS 8
#define QC_DEV_SUM_ROWS 64
#define QC_DEV_SUM_FB 64
size_t qc_bias_dev_doubles(int64_t rows, int64_t cols);
/* The column clusters' sums of a pass in np row pieces: ct [np][2 cols]
 * holds each piece's interleaved (sum x r, sum r^2) a column; each column
 * is summed over the pieces in piece order (into piece 0's, in place, on
 * qc_par_for's threads a column range each) and its squares and product
 * added to s's col_tt, col_tc, col_cc. */
void qc_col_sums(double *ct, int64_t np, int64_t cols, qc_bias_sums *s);
/* Fill m's noise floor and bias fields from the sums (m->norm_r set). */
void qc_bias_finish(const qc_bias_sums *s, qc_metrics *m);
/* Raise m's bias allowance to `allow` (a systematic error the candidate's
 * declared error model permits) and recompute bias_z; no-op when the bias
 * was not computed or the allowance is already larger. */
void qc_bias_allow(qc_metrics *m, double allow);
/* Set m's bias allowance to exactly `allow` (a case's declared allowance,
 * 0: none, judged z = z_raw) and recompute bias_z; no-op when the bias
 * was not computed. */
void qc_bias_set_allow(qc_metrics *m, double allow);
/* r rounded to element type dt (as qc_bias_pass rounds it). */
double qc_round_to(double r, qc_dtype dt);
/* The n elements at a (container QC_F64 or QC_F32; any other: a no-op)
 * each replaced by qc_round_to(it, dt), on qc_par_for's threads: each
 * element alone, so the result does not depend on the thread count. */
void qc_round_all(void *a, qc_dtype container, int64_t n, qc_dtype dt);
/* a[0, n) = |a| in place, float64, on qc_par_for's threads (each element
 * alone). */
void qc_abs_all(double *a, int64_t n);
/* ---- metrics of a gradient held in blocks by several ranks ----------------
 * Each rank holds one block [r0, r1) x [c0, c1) of the [rows, cols] view of
 * g and r (the blocks tile the whole); it adds the block's sums into parts
 * (qc_mparts_len(rows, cols) doubles, zeroed: the metrics' sums, each row's
 * and each column's bias-cluster sums at their place in the whole) and its
 * largest |g - r| into mx; the ranks sum parts (an all-reduce) and take the
 * largest mx; qc_mparts_finish then gives the metrics, noise floor and bias
 * test of one pass over the whole tensor (qc_metrics_compute and
 * qc_bias_pass at dt), equal up to the order of the float64 sums. */
int64_t qc_mparts_len(int64_t rows, int64_t cols);
/* Add the block (g, r: its (r1 - r0) x (c1 - c0) elements, row-major,
 * contiguous) into parts; mx[0] = its max |g - r| over finite pairs (-1:
 * none), mx[1] = the flat index in the whole of its first occurrence. */
void qc_mparts_add(const double *g, const double *r, int64_t r0, int64_t r1, int64_t c0, int64_t c1, int64_t rows, int64_t cols,
                   qc_dtype dt, double *parts, double *mx);
/* The metrics from the summed parts and the largest mx (max_abs, worst). */
void qc_mparts_finish(const double *parts, const double *mx, int64_t rows, int64_t cols, qc_metrics *m);

/* The narrowest of bfloat16, float16, float32 (no wider than `container`)
 * that holds every finite value of g exactly: the precision the values
 * carry, whatever their storage. Returns container when none is narrower. */
qc_dtype qc_values_dtype(const double *g, int64_t n, qc_dtype container);
/* The pieces of that rule: the mask of the types narrower than container
 * (bit 0 bfloat16, 1 float16, 2 float32); the bits of `want` whose type
 * holds every finite value of g[0, n); the narrowest type of a mask held
 * over all pieces (AND-ed), else container. */
unsigned qc_values_want(qc_dtype container);
unsigned qc_values_held(const double *g, int64_t n, unsigned want);
qc_dtype qc_values_pick(unsigned held, qc_dtype container);

/* The row pieces of a [rows, cols] pass on the host (the bias pass, the
 * compare pass): fixed by the shape alone, so the sums added in piece
 * order are the same on any number of threads; returns their count and
 * sets *per, the rows of each (the last may have fewer). use_cols: each
 * piece keeps [cols] column sums, which bounds the count. */
int64_t qc_row_pieces(int64_t rows, int64_t cols, int use_cols, int64_t *per);

/* ---- the host's compare pass (compare.c) ----------------------------------
 * 1 when qc_compare_host reads element type dt (float64, float32, float16,
 * bfloat16). */
int qc_compare_host_dtype(qc_dtype dt);
/* m = the metrics of candidate g against its float64 reference r, both a
 * [rows, cols] row-major view, and (bias) the rounded-reference pass at dt
 * (qc_bias_pass's noise floor and bias test), in one read of each: the
 * candidate in its own element type, no float64 copy of it. QC_EINPUT for
 * an element type qc_compare_host_dtype refuses, QC_ESYS. */
int qc_compare_host(const qc_tensor *g, const double *r, int64_t rows, int64_t cols, qc_dtype dt, int bias, qc_metrics *m);
/* The same pass with the reference given in blocks of rows, for a
 * reference too large to hold whole (a reference that streams: model/
 * sink.h): open it for g, hand it rows [r0, r1) of r in increasing order,
 * each row once (qc_cmp_rows; r0 the rows given so far), and finish once
 * every row is in (qc_cmp_finish frees the stream; qc_cmp_free drops one
 * not finished). A row piece's sums are formed row by row in row order
 * whatever the blocks, so the metrics equal qc_compare_host's bit for bit
 * (which is this stream with one block). Each returns a status. */
typedef struct qc_cmp_stream qc_cmp_stream;
int qc_cmp_open(const qc_tensor *g, int64_t rows, int64_t cols, qc_dtype dt, int bias, qc_cmp_stream **out);
int qc_cmp_rows(qc_cmp_stream *s, const double *r, int64_t r0, int64_t r1);
int qc_cmp_finish(qc_cmp_stream *s, qc_metrics *m);
void qc_cmp_free(qc_cmp_stream *s);
/* The squared differences *sd and the reference's squares *sr over the
 * rows given so far (not the finished metrics' sums bit for bit: a
 * difference of two of these names where a block's error lies). */
void qc_cmp_sums(const qc_cmp_stream *s, double *sd, double *sr);
/* qc_values_dtype of a float tensor read in its own element type. */
qc_dtype qc_values_dtype_of(const qc_tensor *g);
/* The noise floor: rel-L2 between r and r rounded to dtype (bf16, f16,
 * f32, as qc_round_to); NAN for dtypes without a rounding here, 0 for
 * float64. */
double qc_noise_floor(const double *r, int64_t n, qc_dtype dtype);

#endif
