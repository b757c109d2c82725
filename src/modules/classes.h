/* classes.h: what src/modules/ defines for the layers above it. Each class
 * (its production VJP, contract keys and generator) is one qc_class in its
 * own file; the class table (src/classes/registry.c) pairs it with its
 * reference. Never included by src/reference/ (independence). */
#ifndef QC_MODULES_CLASSES_H
#define QC_MODULES_CLASSES_H

#include "model/module.h"

/* The classes, one per file src/modules/<name>.c. */
extern const qc_class qc_class_linear;
extern const qc_class qc_class_rmsnorm;
extern const qc_class qc_class_layernorm;
extern const qc_class qc_class_rope;
extern const qc_class qc_class_swiglu;
extern const qc_class qc_class_relu2;
extern const qc_class qc_class_gelu;
extern const qc_class qc_class_logprob;
extern const qc_class qc_class_router;
extern const qc_class qc_class_attention;
extern const qc_class qc_class_moe;
extern const qc_class qc_class_ssd;
extern const qc_class qc_class_conv1d;

/* The linear class's fast path (modules/linear_fast.c): candidate and
 * reference of d_x and d_weight together on the backend; a qc_fast_fn. */
int qc_fast_linear(const qc_ctx *ctx, const qc_module *m, const qc_tensor *dy, const qc_tset *cand, qc_fast_out *out);

/* How a linear module is split across ranks (modules/linear_split.c). */
extern const qc_split qc_linear_split;

#endif
