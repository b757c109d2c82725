/* mod_util.h: small helpers shared by the production class files in
 * src/modules/ (loading tensors the way a trainer holds them, adding output
 * tensors, generating bf16 inputs). Never used by src/reference/. */
#ifndef QC_MOD_UTIL_H
#define QC_MOD_UTIL_H

#include <stdint.h>

#include "model/module.h"
#include "core/rng.h"
#include "core/tensor.h"

/* A new float32 array holding t decoded (qc_numel(t) elements); NULL with
 * the error set (naming `what`) when out of memory or t is not decodable. */
float *qc_mod_f32(const qc_tensor *t, const char *what);
/* The same in float64 (for the classes' float64 forwards). */
double *qc_mod_f64(const qc_tensor *t, const char *what);
/* Allocate a zeroed tensor `name` [shape] of dtype dt, add it to set and
 * point *data at its storage (valid while the set lives). */
int qc_mod_add(qc_tset *set, const char *name, qc_dtype dt, int ndim, const int64_t *shape, void **data);
/* Add a bfloat16 tensor of N(0, scale^2) draws to set; *data points at it. */
int qc_mod_gen_bf16(qc_tset *set, const char *name, int ndim, const int64_t *shape, qc_rng *rng, double scale,
                    uint16_t **data);
/* Apply the generate request's values to a [rows, cols] bf16 tensor:
 * "special": row rows/2 zeroed and every 37th element (from element 5)
 * replaced by extremes[i % n]; "heavy_tail": every element divided by
 * 0.05 + U(0,1) (magnitudes up to 20x); "normal": unchanged. */
void qc_mod_values(const qc_gen *g, qc_rng *rng, uint16_t *p, int64_t rows, int64_t cols, const float *extremes, int n);
/* 1 when the generate request asks for values = "special". */
int qc_mod_special(const qc_gen *g);
/* Read integer ids (any integer or float dtype holding integers) into a new
 * int64 array; QC_EINPUT naming m and `what` when a value is not an integer. */
int qc_mod_ids(const qc_module *m, const qc_tensor *t, const char *what, int64_t **out);

/* Fill a gradient's error model: reduction length k, lambda, operands
 * rounded to bf16, margin (0: default) and the model in words (printf). */
void qc_mod_tm(qc_tol_model *tm, int64_t k, double lambda, int rounded, double margin, const char *fmt, ...)
    __attribute__((format(printf, 6, 7)));
/* out[0, n) = src rounded to bfloat16 (nearest even), elementwise on
 * qc_par_for's threads (the same on any number of them). */
void qc_mod_to_bf16(const float *src, int64_t n, uint16_t *out);
/* The largest finite |value| of t (0 for an undecodable tensor). */
double qc_mod_maxabs(const qc_tensor *t);
/* ||T||_F of T = |A| |B|, T [M, N] reducing over K, A(i, k) = a[i sa_i +
 * k sa_k], B(k, j) = b[k sb_k + j sb_j] (strides in elements): the scale of
 * a GEMM's terms. Rows and columns of T are taken at an even stride (at
 * most 64 rows by 256 columns, each element its whole sum over K) and the
 * sum of squares is scaled to all M x N: a scale, not an exact norm. Read
 * in place for bf16, f16, f32 and f64 (no float64 copy of a whole operand);
 * other element types through copies. 0 when M, N or K is 0. */
double qc_mod_terms_tensor(const qc_tensor *a, int64_t sa_i, int64_t sa_k, const qc_tensor *b, int64_t sb_k, int64_t sb_j,
                           int64_t M, int64_t N, int64_t K);

/* ---- slices of a module split across ranks (qc_split) ---------------------- */
/* Add to set `dst` a copy of t, or its cut along dim when dim_len is t's
 * length along dim (else the whole: a tensor the split does not touch). */
int qc_mod_add_cut(qc_tset *dst, const qc_tensor *t, int dim, int64_t dim_len, int64_t lo, int64_t hi);
/* Start part as a slice of m: path, class and contract copied, no tensors,
 * candidate sets allocated (one per dY) when m has them. */
int qc_mod_part_init(const qc_module *m, qc_module *part);
/* The block of a gradient shaped like t (ndim, shape) in the whole: b's
 * [rows, cols] view, its full shape, and every element in the block. */
void qc_mod_block_whole(int ndim, const int64_t *shape, qc_split_block *b);

#endif

/* Elementwise one-input classes (relu2, gelu): inputs/x [...], y = f(x),
 * d_x = dy * f'(x). `variant` is the class's contract choice. */
typedef float (*qc_mod_deriv_f32)(float x, int variant);
typedef double (*qc_mod_fn_f64)(double x, double branch_x, int variant);
/* Production VJP: d_x (float32, shape of x) = dy * deriv(x) in float32. */
/* An elementwise class's validate (qc_validate_fn): inputs/x and dY of its shape. */
int qc_mod_unary_validate(const qc_module *m, const qc_tensor *dy);
int qc_mod_unary_vjp(const qc_module *m, const qc_tensor *dy, qc_tset *grads, qc_mod_deriv_f32 deriv, int variant);
/* Float64 forward y = fn(x, branch x) (shape of x). */
int qc_mod_unary_forward(const qc_module *m, const qc_module *branch, qc_tensor *y, qc_mod_fn_f64 fn, int variant);
/* Generator for [T, F]: x ~ scale N(0,1) bf16 with exact zeros every 11th
 * element; values = "special" adds a zero row and +-3e4, +-1e-30, -0. */
int qc_mod_unary_generate(const char *cls, const qc_gen *gp, qc_rng *rng, qc_module *m, int *ondim, int64_t *oshape,
                          double scale);
