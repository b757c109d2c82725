/* vjp.h: layer 1 over a whole case (the `vjp` verb's run): every module
 * instance the case names, generated or read from its dump, audited into
 * a->res. */
#ifndef QC_ENGINE_VJP_H
#define QC_ENGINE_VJP_H

#include "engine/audit.h"

/* Run case a->cs: generated instances (its shapes, seed, values, dY kinds)
 * or its dump's matching module groups. profile (NULL: none) is --profile,
 * set over every module's contract. Checks go to a->res; QC_EINPUT/QC_ESYS
 * with the error set when the run cannot be judged. */
int qc_vjp_case(qc_audit *a, const char *profile);

#endif
