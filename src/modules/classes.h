/* classes.h: what src/modules/ defines for the layers above it. Each class
 * (its production VJP, contract keys, generator, error model, coverage
 * facts and optional fast path) is one object in its own file
 * src/modules/<name>.c, `const qc_class qc_class_<name>` (model/module.h);
 * the class table (src/classes/registry.c) declares it with
 * QC_CLASS_DECLARE and pairs it with its reference. Never included by
 * src/reference/ (independence). */
#ifndef QC_MODULES_CLASSES_H
#define QC_MODULES_CLASSES_H

#include "model/module.h"

/* Declares class n's row, qc_class_<n> (src/modules/<n>.c): the one
 * declaration of every class, expanded by the class table's line. */
#define QC_CLASS_DECLARE(n) extern const qc_class qc_class_##n;

/* The linear class's fast path (modules/linear_fast.c; its row's `fast`):
 * candidate and reference of d_x and d_weight together on the backend; a
 * qc_fast_fn. */
int qc_fast_linear(const qc_ctx *ctx, const qc_module *m, const qc_tensor *dy, const qc_tset *cand, qc_fast_out *out);

/* How a linear module is split across ranks (modules/linear_split.c). */
extern const qc_split qc_linear_split;

#endif
