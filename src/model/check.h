/* check.h: the declared tolerances of one gradient, the one verdict function,
 * one judged comparison (module, dY, gradient tensor) and the result list
 * every report format is a view of. */
#ifndef QC_CHECK_H
#define QC_CHECK_H

#include <stdint.h>

#include "numerics/metrics.h"
#include "model/module.h"
#include "core/tensor.h"

/* The bias test's bound on |bias_z| when a tolerance does not declare one. */
#define QC_BIAS_Z_DEFAULT 5.0

/* Tolerances declared for one gradient tensor. */
typedef struct qc_tol {
  int has_rel_l2, has_max_abs, has_cosine_min, has_norm_ratio, has_noise_multiple;
  double rel_l2, max_abs, cosine_min, norm_lo, norm_hi, noise_multiple;
  int has_bias_z;            /* declared (0 turns the test off); else QC_BIAS_Z_DEFAULT where computed */
  double bias_z;
  int has_bias_allow;        /* declared: the bias test's allowance (0: none; z = z_raw), replacing the model's */
  double bias_allow;
  char dtype[24];            /* declared precision the gradient is judged at ("": from its values) */
  /* {"derive": true, ...}: the bounds are derived for each check from the
   * class's error model, the shapes and the dtypes (engine/audit.c) */
  int derive;
  int derive_rounded_operands; /* -1: the class's count */
  double derive_margin;      /* 0: the default margin */
  char derive_format[24];    /* "": none */
  char reasoning[1024];
} qc_tol;

enum { QC_V_PASS = 0, QC_V_FAIL = 1 };

/* The parts a reference variant combines: the legal roundings a correct
 * implementation may make that the contract's reference does not
 * (docs/tolerances.md, "Reference variants"). Which variants a module has,
 * the order they are tried in and which one judges a check are
 * engine/variants.c's; a case's "variants" names the parts it allows. */
enum {
  QC_VAR_BF16_DY = 1,     /* "bf16_dy": dY rounded to bf16 (the gradients) */
  QC_VAR_BF16_INPUTS = 2, /* "bf16_inputs": the float inputs the class differentiates rounded to bf16 */
  QC_VAR_BF16_PARAMS = 4, /* "bf16_params": the parameters too (autocast's forward) */
  QC_VAR_ROUND_OPS = 8,   /* "round_ops": the class's own rounding variants (qc_ctx.round_ops) */
  QC_VAR_ALL = 15
};
/* The part named `name` ("bf16_inputs"), 0 when none is. */
unsigned qc_variant_part(const char *name);
/* The name of part `bit` (one QC_VAR_* bit), NULL for another value. */
const char *qc_variant_part_name(unsigned bit);
/* The parts' names, ", "-separated, for messages ("bf16_dy, bf16_inputs, ..."). */
const char *qc_variant_part_names(void);

/* The one verdict: QC_V_PASS only if every declared bound holds, nothing is
 * non-finite and no metric is NaN where a bound needs it. Writes every
 * violated bound into why, "; "-separated ("" on pass). */
int qc_judge(const qc_metrics *m, const qc_tol *t, char *why, int whylen);

typedef struct qc_check {
  char module[QC_PATHLEN];   /* "/model.layers.3.mlp.down_proj" */
  char cls[64];              /* "linear" */
  char dy[QC_NAMELEN];       /* "random", or a grad_out dataset name */
  char tensor[QC_NAMELEN];   /* "d_x", or "quantizer", or "y" (the forward check) */
  char kind[16];             /* "forward" for the forward check ("": a gradient, or the deployed bytes) */
  int ndim;
  int64_t shape[QC_MAXDIM];  /* the reference's shape */
  char cand_dtype[24];       /* the candidate's element type ("" when missing) */
  int has_metrics;
  qc_metrics m;
  int has_tol;
  qc_tol tol;
  char judged_dtype[24];     /* the precision the metrics were judged at ("" when not judged) */
  double level;              /* the noise level of a correct candidate (the class model's rel_l2; 0: none) */
  char precision[160];       /* why, when it is not the storage type ("" otherwise) */
  char variant[96];          /* the legal reference variant the candidate was judged against
                                ("bf16-rounded dY"; "" for the reference as the contract states it) */
  char variant_id[48];       /* its parts' names ("bf16_dy+round_ops"; "" for the contract's reference) */
  qc_refgemm ref;           /* the GEMM that made the reference (zeroed: float64; the fast path's
                                fused audit under --reference fast or auto may say otherwise) */
  int verdict;               /* QC_V_PASS / QC_V_FAIL */
  char why[512];
  char diagnosis[1024];       /* failed checks: "consistent with: ...", or "no known signature" ("" on pass) */
  int nhyp;                  /* hypotheses tested (engine/diagnose.c) */
  struct qc_hyp_result {
    char name[32];           /* "factor", "transpose", "dx_convention", ... */
    char says[256];          /* what it would mean: "d_weight transposed" */
    double rel_l2;           /* candidate vs the hypothesis' prediction (NAN: not computed) */
    double level;            /* the noise level it is compared with */
    int consistent;
  } hyp[16];
} qc_check;

typedef struct qc_results {
  int n, cap;
  qc_check *v;
} qc_results;

int qc_results_add(qc_results *r, const qc_check *c);
void qc_results_free(qc_results *r);
/* 0 pass (all passed and n > 0), 1 fail, 2 nothing checked. */
int qc_results_verdict(const qc_results *r);

/* The precision a candidate stored as `stored` is judged at: t's declared
 * dtype, else (float32, float64 storage) `values`, the narrowest type that
 * holds its values (qc_values_dtype), else its storage; noted in
 * k->precision when it is not the storage type. */
qc_dtype qc_audit_dtype(qc_dtype stored, qc_dtype values, const qc_tol *t, qc_check *k);

#endif
