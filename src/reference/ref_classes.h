/* ref_classes.h: the float64 reference VJP of each class, one per file
 * src/reference/<name>.c, each a qc_vjp_fn (model/module.h). The class
 * table (src/classes/registry.c) pairs each with its production class.
 * Written from the math; never includes src/modules/ (independence). */
#ifndef QC_REF_CLASSES_H
#define QC_REF_CLASSES_H

#include "model/module.h"

int qc_ref_linear(const qc_ctx *ctx, const qc_module *m, const qc_tensor *dy, qc_tset *grads);
/* The linear forward the contract defines (a qc_fwd_ref_fn, reference/linear.c). */
int qc_ref_linear_forward(const qc_ctx *ctx, const qc_module *m, qc_tensor *y, qc_tol_model *tm);
int qc_ref_rmsnorm(const qc_ctx *ctx, const qc_module *m, const qc_tensor *dy, qc_tset *grads);
int qc_ref_layernorm(const qc_ctx *ctx, const qc_module *m, const qc_tensor *dy, qc_tset *grads);
int qc_ref_rope(const qc_ctx *ctx, const qc_module *m, const qc_tensor *dy, qc_tset *grads);
/* The rope forward (a qc_fwd_ref_fn, reference/rope.c). */
int qc_ref_rope_forward(const qc_ctx *ctx, const qc_module *m, qc_tensor *y, qc_tol_model *tm);
int qc_ref_swiglu(const qc_ctx *ctx, const qc_module *m, const qc_tensor *dy, qc_tset *grads);
int qc_ref_swiglu_forward(const qc_ctx *ctx, const qc_module *m, qc_tensor *y, qc_tol_model *tm);
int qc_ref_relu2(const qc_ctx *ctx, const qc_module *m, const qc_tensor *dy, qc_tset *grads);
int qc_ref_gelu(const qc_ctx *ctx, const qc_module *m, const qc_tensor *dy, qc_tset *grads);
int qc_ref_gelu_forward(const qc_ctx *ctx, const qc_module *m, qc_tensor *y, qc_tol_model *tm);
int qc_ref_logprob(const qc_ctx *ctx, const qc_module *m, const qc_tensor *dy, qc_tset *grads);
int qc_ref_router(const qc_ctx *ctx, const qc_module *m, const qc_tensor *dy, qc_tset *grads);
int qc_ref_attention(const qc_ctx *ctx, const qc_module *m, const qc_tensor *dy, qc_tset *grads);
int qc_ref_moe(const qc_ctx *ctx, const qc_module *m, const qc_tensor *dy, qc_tset *grads);
/* The moe forward, grouped by expert as its VJP (a qc_fwd_ref_fn, reference/moe.c). */
int qc_ref_moe_forward(const qc_ctx *ctx, const qc_module *m, qc_tensor *y, qc_tol_model *tm);
int qc_ref_ssd(const qc_ctx *ctx, const qc_module *m, const qc_tensor *dy, qc_tset *grads);
int qc_ref_conv1d(const qc_ctx *ctx, const qc_module *m, const qc_tensor *dy, qc_tset *grads);

/* The RMSNorm (centered = 0) and LayerNorm (centered = 1) reference
 * together (reference/rmsnorm.c). */
int qc_ref_norm(const qc_module *m, const qc_tensor *dy, qc_tset *grads, int centered);

#endif
