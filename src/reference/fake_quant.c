/* reference/fake_quant.c: the fake quantizer with a scale contract from the
 * math: d_x by the straight-through estimator and the saturation rule,
 * d_scale by LSQ's formula (Esser et al. 2020), the amax's path under
 * scale_grad flow (reference/ref_quant_ste.c has the math). */
#include "model/module.h"
#include "reference/ref_classes.h"
#include "reference/ref_quant_ste.h"

static int ref_fq(const qc_ctx *ctx, const qc_module *m, const qc_tensor *dy, qc_tset *grads) {
  return qc_ref_quant_ste(ctx, m, dy, grads, 0);
}

/* The class's reference, its one export (src/classes/registry.c pairs it
 * with src/modules/fake_quant.c). */
const qc_reference qc_reference_fake_quant = {.vjp = ref_fq, .terms = 1};
