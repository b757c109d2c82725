/* ref_util.h: helpers shared by the float64 references (src/reference/).
 * Written apart from src/modules/ on purpose (independence). */
#ifndef QC_REF_UTIL_H
#define QC_REF_UTIL_H

#include <stdint.h>

#include "backend/backend.h"
#include "model/module.h"
#include "core/tensor.h"

/* A new float64 array holding t decoded (two values a byte for a packed
 * float4 tensor); NULL with the error set. */
double *qc_refu_load(const qc_tensor *t, const char *what);
/* Allocate a zeroed float64 tensor `name` [shape], add it to grads and point
 * *data at its storage. */
int qc_refu_out(qc_tset *grads, const char *name, int ndim, const int64_t *shape, double **data);
/* qc_refu_out left unzeroed when zero is 0: for a gradient whose every
 * element the caller writes (a GEMM's output), where zeroing a reused
 * buffer costs a pass over it. */
int qc_refu_out_z(qc_tset *grads, const char *name, int ndim, const int64_t *shape, int zero, double **data);
/* qc_refu_out_z, or, when ctx offers a sink (model/sink.h) and it takes
 * `name`: its shape alone added to grads (data NULL) and *data NULL; the
 * caller then hands every row of it to ctx->sink->rows in order. */
int qc_refu_out_s(const qc_ctx *ctx, qc_tset *grads, const char *name, int ndim, const int64_t *shape, int zero,
                  double **data);
/* C [m, n] = op(A) op(B) through the backend's float64 GEMM, row-major and
 * packed (A is [m, k] or, transposed, [k, m]; B is [k, n] or [n, k]); C is
 * overwritten. Returns the backend's status. */
int qc_refu_gemm(const qc_backend *be, qc_op ta, qc_op tb, int64_t m, int64_t n, int64_t k, const double *A, const double *B,
                 double *C);
/* On a backend of host memory (the CPU), gemm_f64_x operand *o [rows,
 * cols] (packed) widened once into d (rows x cols doubles) and *o made
 * that float64, for a reference that hands it to several GEMMs (the host
 * would widen it for each; a device keeps its own copy instead). Nothing
 * is done on a device, or for a float64 operand without flags. */
int qc_refu_hold(const qc_backend *be, qc_gemm_x *o, int64_t rows, int64_t cols, double *d);
/* The rows of `width` doubles a qc_par_for piece takes at least: about
 * 2^14 elements, so a thread is started only for work worth its start. */
int64_t qc_refu_row_grain(int64_t width);
/* Integer ids of t as int64 (exact); QC_EINPUT naming m/what when a value is
 * not an integer. */
int qc_refu_ids(const qc_module *m, const qc_tensor *t, const char *what, int64_t **out);



/* Elementwise one-input references: inputs/x [...], d_x (float64, shape of
 * x) = dy * grad(x, variant). Under ctx->terms (the terms' scale) d_x =
 * |dy| * grad(x, variant | QC_REFU_TERMS), grad then returning the sum of
 * the magnitudes of the derivative's terms. With QC_REFU_BF16 in variant
 * (a bf16 model's variant) d_x = b(dy * grad(x, variant)), b() the
 * rounding to bf16: grad then returns its own rounded derivative. */
#define QC_REFU_TERMS 0x100
#define QC_REFU_BF16 0x200
/* grad runs on qc_par_for's threads (it must be a pure function). */
int qc_refu_pointwise(const qc_ctx *ctx, const qc_module *m, const qc_tensor *dy, qc_tset *grads,
                      double (*grad)(double x, int variant), int variant);
/* The same on ctx's device where its backend has pw_op's pass (backend.h
 * qc_pw: QC_PW_GELU; variant's low byte its form;
 * reference/pointwise_dev.c), else as qc_refu_pointwise. */
int qc_refu_pointwise_dev(const qc_ctx *ctx, const qc_module *m, const qc_tensor *dy, qc_tset *grads,
                          double (*grad)(double x, int variant), int variant, int pw_op);
#endif
