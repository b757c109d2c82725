/* ref_quant_ste.h: the float64 reference of the scale-aware fake quantizers
 * (classes fake_quant and act_quant), from the math (reference/
 * ref_quant_ste.c). Never includes src/modules/ (independence). */
#ifndef QC_REF_QUANT_STE_H
#define QC_REF_QUANT_STE_H

#include "model/module.h"

/* d_x, and d_scale under scale_grad trainable (a qc_vjp_fn with with_act:
 * act_quant's act and order; 0: fake_quant, no activation). Under
 * ctx->terms each gradient's terms' scale. */
int qc_ref_quant_ste(const qc_ctx *ctx, const qc_module *m, const qc_tensor *dy, qc_tset *grads, int with_act);

#endif
