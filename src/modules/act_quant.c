/* modules/act_quant.c: the activation-then-quantize composite as a QAT
 * trainer runs its backward (docs/classes.md, "act_quant"): y =
 * s Q(act(x) / s) (order act_quant) or act(s Q(x / s)) (order quant_act),
 * act relu, gelu, gelu_tanh or silu, the quantizer and its scale contract
 * as fake_quant's. d_x = act'(x) STE(dY) (act_quant) or STE(act'(s q) dY)
 * (quant_act), the saturation region per the contract, plus the amax's
 * path under scale_grad flow; d_scale = LSQ's (trainable). The
 * arithmetic: modules/quant_ste.c. */
#include <string.h>

#include "core/qc.h"
#include "model/module.h"
#include "modules/classes.h"
#include "modules/quant_ste.h"

static int aq_validate(const qc_module *m, const qc_tensor *dy) { return qc_qste_validate(m, dy, 1); }

static int aq_vjp(const qc_ctx *ctx, const qc_module *m, const qc_tensor *dy, qc_tset *grads) {
  (void)ctx;
  return qc_qste_vjp(m, dy, grads, 1);
}

/* Generated act_quant: x [T, F] ~ 2 N(0,1) bf16, params/scale twice fake_quant's. */
static int aq_generate(const qc_gen *gp, qc_rng *rng, qc_module *m, int *ondim, int64_t *oshape) {
  return qc_qste_generate("act_quant", gp, rng, m, ondim, oshape, 2.0, 1);
}

static int aq_tol_model(const qc_module *m, const qc_tensor *dy, const char *grad, qc_tol_model *tm) {
  return qc_qste_tol_model(m, dy, grad, tm, 1);
}

static const qc_key_spec aq_keys[] = {
    {"act", "relu|gelu|gelu_tanh|silu", "gelu", "the activation (gelu: erf; gelu_tanh: the tanh approximation)"},
    {"order", "act_quant|quant_act", "act_quant", "act_quant: y = Q(act(x)); quant_act: y = act(Q(x))"},
    {"format", "int8|int4|e4m3|e5m2", "int8", "the grid: int8 [-128, 127], int4 [-8, 7], fp8 e4m3 +-448, e5m2 +-57344"},
    {"scale_grad", "fixed|stop_gradient|flow|trainable", "trainable",
     "fixed: params/scale, no gradient; stop_gradient: amax / qmax of the quantizer's input, detached; flow: its "
     "gradient reaches d_x; trainable: params/scale with LSQ's d_scale"},
    {"saturation_grad", "zero|pass", "zero", "the quantizer's gradient outside its clip range: zero, or passed"},
    {"clip", "round_first|clip_first", "round_first",
     "round_first: saturated when round(u / s) leaves the range (torch); clip_first: when u / s does (LSQ)"},
    {"granularity", "tensor|channel", "tensor", "one scale, or one per index of inputs/x's axis"},
    {"axis", NULL, "0", "granularity channel: the channel axis of inputs/x"},
    {"grad_scale", "none|lsq", "none", "lsq: d_scale times LSQ's g = 1/sqrt(N qmax), N the elements per scale"},
    {"grad_factor", NULL, "1", "d_scale times this (torch's grad_factor)"},
    {"amax_floor", NULL, "1e-12", "stop_gradient, flow: the amax floored at this (an all-zero channel)"},
    {NULL, NULL, NULL, NULL}};

const qc_class qc_class_act_quant = {
    .name = "act_quant",
    .summary = "activation and fake quantizer fused (relu/gelu/silu, either order, the scale contract of fake_quant): "
               "d_x = act' composed with the STE, d_scale = LSQ's gradient",
    .tensors = "inputs/x params/scale outputs/y",
    .grads = "d_x d_scale",
    .shape_help = "[T, F] (any rank): tokens, features; per channel along `axis`",
    .keys = aq_keys,
    .generate = aq_generate,
    .production = aq_vjp,
    .not_checked = "",
    .tol_model = aq_tol_model,
    .validate = aq_validate,
    .hypotheses = "factor sign rows zero dy_precision nonfinite",
};
