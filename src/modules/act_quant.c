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
    {"order", "act_quant|quant_act", "act_quant", "act_quant: y = Q(act(x)), u = act(x); quant_act: y = act(Q(x)), u = x"},
    QC_QSTE_KEYS,
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
