/* tol.h: tolerances derived from precision, not tuned until CI is green
 * (docs/tolerances.md). One gradient tensor g = op(A, B) reduced over K
 * terms, compared with a float64 reference r of the same inputs:
 *
 *   output rounding     e_out = u_out / sqrt(3)          (rms relative error of RNE)
 *   accumulation        e_acc = lambda sqrt(K) u_acc      (Higham & Mary 2019)
 *   operand rounding    e_op  = sqrt(n_op) u_op / sqrt(3) (n_op operands rounded)
 *   format rounding     e_fmt = u_fmt / sqrt(3)           (one operand quantized)
 *   rel_l2      = margin * sqrt(e_out^2 + e_acc^2 + e_op^2 + e_fmt^2) = e
 *   cosine_min  = sqrt(1 - e^2)      (||g - r|| <= e ||r|| bounds the angle by asin e)
 *   norm_ratio  = [1 - e, 1 + e]     (triangle inequality)
 *   noise_multiple = sqrt(1 + (2 d / e_out)^2), d = margin sqrt(e_acc^2 + e_op^2 + e_fmt^2)
 *                 (a correct candidate rounds r + d to the grid the floor
 *                 rounds r to; the floor of real data is >= e_out / 2)
 *   max_abs     = margin * S (u_out + lambda sqrt(K) u_acc + n_op u_op + u_fmt)
 *                 when S bounds (|A||B|)_i, the worst case per element.
 * Bounds are rounded outward to three significant digits. */
#ifndef QC_TOL_H
#define QC_TOL_H

#include <stddef.h>
#include <stdint.h>

#include "model/check.h"
#include "model/module.h"

#define QC_TOL_LAMBDA 1.0
/* The default safety factor sqrt(3) turns the output term into u itself,
 * RNE's worst case: a tensor of any size, even one element, cannot cross
 * the bound through output rounding alone. */
#define QC_TOL_MARGIN 1.7320508075688772

/* What the candidate computed, as `qatcheck tol` takes it. */
typedef struct qc_tol_spec {
  const char *out_dtype;     /* dtype the gradient is stored in: "bfloat16" */
  const char *operand_dtype; /* dtype the product's operands enter in (NULL: out_dtype) */
  const char *acc_dtype;     /* accumulator dtype (NULL: "float32") */
  const char *format;        /* quantization of one operand the reference does not reproduce (NULL/"none") */
  int64_t k;                 /* reduction length, >= 1 */
  int rounded_operands;      /* 0..2 operands the candidate rounds to operand_dtype */
  double lambda;             /* Higham-Mary lambda (<= 0: QC_TOL_LAMBDA) */
  double margin;             /* safety factor (<= 0: QC_TOL_MARGIN) */
  double scale;              /* > 0: bound on (|A||B|)_i, enables max_abs */
} qc_tol_spec;

/* The derivation: each term and the resulting bounds. */
typedef struct qc_tol_terms {
  double u_out, u_op, u_acc, u_fmt;   /* unit roundoffs (u_fmt 0 without a format) */
  double e_out, e_acc, e_op, e_fmt;   /* relative rms terms, as in the header comment */
  double lambda, margin;
  double rel_l2, cosine_min, norm_lo, norm_hi, noise_multiple;
  int has_max_abs;
  double max_abs;
} qc_tol_terms;

/* Unit roundoff of a dtype or format name: spec dtype names (bfloat16,
 * float8_e4m3fn, ...), short ones (bf16, fp32, e4m3, e2m1, ...) or a
 * with allow_format, a quantization format (fp8_* and mxfp8: e4m3; nvfp4,
 * mxfp4: e2m1; none: 0). QC_OK or QC_EINPUT (message names `what` and the
 * accepted names). */
int qc_tol_unit_roundoff(const char *name, const char *what, int allow_format, double *u);

/* Derive the bounds of s into t. QC_OK or QC_EINPUT naming the bad field. */
int qc_tol_derive(const qc_tol_spec *s, qc_tol_terms *t);

/* The reasoning text for a case file: every term, lambda, the margin and
 * the command line that derived it (cmdline may be NULL). */
void qc_tol_reasoning(const qc_tol_spec *s, const qc_tol_terms *t, const char *cmdline, char *buf, size_t n);

/* Fill a case tolerance (all keys the derivation gives) from t. */
void qc_tol_fill(const qc_tol_terms *t, const char *reasoning, qc_tol *out);

/* The derivation for one check from a class's error model (qc_tol_model),
 * the declared tolerance's derive options (margin, rounded_operands,
 * format; ignored unless decl->derive) and the precision the candidate is
 * judged at (out_dtype). *pre gets margin x sqrt(e_acc^2 + e_fmt^2): the
 * systematic error the bias test allows (rounded operands are not in it:
 * the engine judges against reference variants that round them). QC_OK or QC_EINPUT. */
int qc_tol_from_model(const qc_tol_model *tm, const qc_tol *decl, const char *out_dtype, qc_tol_spec *spec,
                      qc_tol_terms *terms, double *pre);
/* The derived tolerance of one check into *out: every bound of `terms`
 * (cosine_min no tighter than 1 - 1e-10, the float64 cosine's resolution),
 * decl's bias_z and dtype kept, the reasoning written from the model and
 * the terms. A zero reference (ref_zero) gets max_abs from the model's
 * magnitude bound (0 without one) and no relative bound, with the reason. */
void qc_tol_fill_derived(const qc_tol_model *tm, const qc_tol_spec *spec, const qc_tol_terms *terms, const qc_tol *decl,
                         int ref_zero, qc_tol *out);

/* Round x up (dir > 0) or down (dir < 0) to `digits` significant decimal
 * digits, returning the double nearest that short decimal (it prints short). */
double qc_tol_round(double x, int digits, int dir);

#endif
