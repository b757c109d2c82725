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

/* The keys of quant_ste.h, which act_quant shares. */
static const qc_key_spec fq_keys[] = {
    QC_QSTE_KEYS, /* u = x */
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
