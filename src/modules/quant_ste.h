/* quant_ste.h: the production of the scale-aware fake quantizers, shared by
 * classes fake_quant (y = Q(x)) and act_quant (y = Q(act(x)) or act(Q(x))):
 * their contract read, float32 VJP (the straight-through estimator, the
 * saturation rule, LSQ's scale gradient and the gradient through an amax
 * scale) and generator. Never used by src/reference/. */
#ifndef QC_QUANT_STE_H
#define QC_QUANT_STE_H

#include <stdint.h>

#include "core/rng.h"
#include "model/module.h"

enum { QS_FIXED, QS_STOP, QS_FLOW, QS_TRAIN };           /* scale_grad */
enum { QS_NONE, QS_RELU, QS_GELU, QS_GELU_TANH, QS_SILU }; /* act */

/* The contract as the production reads it; x viewed as [outer, C, inner],
 * C the channel axis's length (1 for a per-tensor scale). */
typedef struct qste {
  int fp8, mbits, emin;      /* fp8: element grid (mantissa bits, least normal exponent) */
  double qmin, qmax;         /* the clip range in units of the scale */
  int round_first;           /* clip = round_first: saturated when round(v) leaves the range */
  int sg, sat_pass, act, quant_first, lsq;
  double factor, floor;
  int64_t n, C, inner;       /* elements; channels; elements after the channel axis */
  const qc_tensor *x, *scale;
} qste;

/* The class's validate: m's contract and tensors as the production reads
 * them (with_act: act_quant's keys), params/scale finite and > 0, dY of
 * x's shape; QC_EINPUT naming the key or dataset otherwise. */
int qc_qste_validate(const qc_module *m, const qc_tensor *dy, int with_act);
/* The production VJP: d_x, and d_scale under scale_grad = trainable. */
int qc_qste_vjp(const qc_module *m, const qc_tensor *dy, qc_tset *grads, int with_act);
/* The generator: x [shape] ~ xs N(0,1) bf16, params/scale when the contract
 * takes one, no element within 1e-3 quanta of a rounding tie or the clip
 * boundary (under the production's own arithmetic). */
int qc_qste_generate(const char *cls, const qc_gen *gp, qc_rng *rng, qc_module *m, int *ondim, int64_t *oshape,
                     double xs, int with_act);
/* The error model of d_x and d_scale. */
int qc_qste_tol_model(const qc_module *m, const qc_tensor *dy, const char *grad, qc_tol_model *tm, int with_act);

#endif
