/* modules/fake_quant.c: a fake quantizer with a scale contract, as a QAT
 * trainer runs its backward (docs/classes.md, "fake_quant"): y = s Q(x / s)
 * per tensor or per channel, int8/int4 or fp8 e4m3/e5m2; the scale fixed,
 * computed from the amax and detached (stop_gradient) or not (flow), or
 * trainable (LSQ, Esser et al. 2020). d_x = the STE inside the clip range,
 * the saturation rule outside; d_scale = LSQ's gradient (trainable). The
 * arithmetic: modules/quant_ste.c. */
#include <string.h>

#include "core/qc.h"
#include "model/module.h"
#include "modules/classes.h"
#include "modules/quant_ste.h"

static int fq_validate(const qc_module *m, const qc_tensor *dy) { return qc_qste_validate(m, dy, 0); }

static int fq_vjp(const qc_ctx *ctx, const qc_module *m, const qc_tensor *dy, qc_tset *grads) {
  (void)ctx;
  return qc_qste_vjp(m, dy, grads, 0);
}

/* Generated fake_quant: x [T, C] (any rank) ~ N(0,1) bf16; params/scale
 * (fixed, trainable) 2 / qmax per tensor, per channel 2, 2.5, 3, 3.5 / qmax. */
static int fq_generate(const qc_gen *gp, qc_rng *rng, qc_module *m, int *ondim, int64_t *oshape) {
  return qc_qste_generate("fake_quant", gp, rng, m, ondim, oshape, 1.0, 0);
}

static int fq_tol_model(const qc_module *m, const qc_tensor *dy, const char *grad, qc_tol_model *tm) {
  return qc_qste_tol_model(m, dy, grad, tm, 0);
}

/* The keys both scale-aware quantizers take (act_quant adds act, order). */
static const qc_key_spec fq_keys[] = {
    {"format", "int8|int4|e4m3|e5m2", "int8", "the grid: int8 [-128, 127], int4 [-8, 7], fp8 e4m3 +-448, e5m2 +-57344"},
    {"scale_grad", "fixed|stop_gradient|flow|trainable", "trainable",
     "fixed: params/scale, no gradient; stop_gradient: amax / qmax, detached; flow: amax / qmax, its gradient reaches "
     "d_x; trainable: params/scale with LSQ's d_scale"},
    {"saturation_grad", "zero|pass", "zero", "d_x outside the clip range: zero, or dY passed"},
    {"clip", "round_first|clip_first", "round_first",
     "round_first: saturated when round(x / s) leaves the range (torch); clip_first: when x / s does (LSQ)"},
    {"granularity", "tensor|channel", "tensor", "one scale, or one per index of inputs/x's axis"},
    {"axis", NULL, "0", "granularity channel: the channel axis of inputs/x"},
    {"grad_scale", "none|lsq", "none", "lsq: d_scale times LSQ's g = 1/sqrt(N qmax), N the elements per scale"},
    {"grad_factor", NULL, "1", "d_scale times this (torch's grad_factor)"},
    {"amax_floor", NULL, "1e-12", "stop_gradient, flow: the amax floored at this (an all-zero channel)"},
    {NULL, NULL, NULL, NULL}};

const qc_class qc_class_fake_quant = {
    .name = "fake_quant",
    .summary = "fake quantizer with a scale contract (fixed, amax detached or flowing, LSQ-trainable): y = s Q(x / s), "
               "d_x = STE with the saturation rule, d_scale = LSQ's gradient",
    .tensors = "inputs/x params/scale outputs/y",
    .grads = "d_x d_scale",
    .shape_help = "[T, C] (any rank): the tensor quantized; per channel along `axis`",
    .keys = fq_keys,
    .generate = fq_generate,
    .production = fq_vjp,
    .not_checked = "",
    .tol_model = fq_tol_model,
    .validate = fq_validate,
    .hypotheses = "factor sign rows zero dy_precision nonfinite",
};
