/* ref_classes.h: what src/reference/ defines for the layers above it. Each
 * class's float64 reference is one file src/reference/<name>.c that
 * exports one object, `const qc_reference qc_reference_<name>` (its VJP,
 * optionally the forward the contract defines, and whether it gives the
 * terms' scale; model/module.h), its functions static. The class table
 * (src/classes/registry.c) declares it with QC_REFERENCE_DECLARE and pairs
 * it with its production class. Written from the math; never includes
 * src/modules/ (independence). */
#ifndef QC_REF_CLASSES_H
#define QC_REF_CLASSES_H

#include "model/module.h"

/* Declares class n's reference, qc_reference_<n> (src/reference/<n>.c):
 * the one declaration of every class's reference, expanded by the class
 * table's line. */
#define QC_REFERENCE_DECLARE(n) extern const qc_reference qc_reference_##n;

/* The RMSNorm (centered = 0) and LayerNorm (centered = 1) reference
 * together (reference/rmsnorm.c). */
int qc_ref_norm(const qc_module *m, const qc_tensor *dy, qc_tset *grads, int centered);

#endif
