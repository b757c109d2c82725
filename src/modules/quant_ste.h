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

/* The contract keys of the scale-aware quantizer (qc_key_spec rows) that
 * fake_quant and act_quant both take; u is the quantizer's input (x, or
 * act(x) under act_quant's order act_quant). */
#define QC_QSTE_KEYS                                                                                                   \
  {"format", "int8|int4|e4m3|e5m2", "int8", "the grid: int8 [-128, 127], int4 [-8, 7], fp8 e4m3 +-448, e5m2 +-57344"}, \
      {"scale_grad", "fixed|stop_gradient|flow|trainable", "trainable",                                                \
       "fixed: params/scale, no gradient; stop_gradient: amax / qmax of u, detached; flow: amax / qmax, its gradient " \
       "reaches d_x; trainable: params/scale with LSQ's d_scale"},                                                     \
      {"saturation_grad", "zero|pass", "zero", "the quantizer's gradient outside its clip range: zero, or passed"},     \
      {"clip", "round_first|clip_first", "round_first",                                                                \
       "round_first: saturated when round(u / s) leaves the range (torch); clip_first: when u / s does (LSQ)"},         \
      {"granularity", "tensor|channel", "tensor", "one scale, or one per index of inputs/x's axis"},                    \
      {"axis", NULL, "0", "granularity channel: the channel axis of inputs/x"},                                          \
      {"grad_scale", "none|lsq", "none", "lsq: d_scale times LSQ's g = 1/sqrt(N qmax), N the elements per scale"},     \
      {"grad_factor", NULL, "1", "d_scale times this (torch's grad_factor)"},                                          \
      {"amax_floor", NULL, "1e-12", "stop_gradient, flow: the amax floored at this (an all-zero channel)"}

#endif
