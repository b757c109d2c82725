/* reference/act_quant.c: the activation-then-quantize composite from the
 * math: d_x = a'(x) composed with the straight-through estimator (or the
 * STE of a'(s q) dY when the order quantizes first), the saturation region
 * per the contract, the amax's path under scale_grad flow, and LSQ's
 * d_scale (reference/ref_quant_ste.c has the math). */
#include "model/module.h"
#include "reference/ref_classes.h"
#include "reference/ref_quant_ste.h"

static int ref_aq(const qc_ctx *ctx, const qc_module *m, const qc_tensor *dy, qc_tset *grads) {
  return qc_ref_quant_ste(ctx, m, dy, grads, 1);
}

/* The class's reference, its one export (src/classes/registry.c pairs it
 * with src/modules/act_quant.c). */
const qc_reference qc_reference_act_quant = {.vjp = ref_aq, .terms = 1};
