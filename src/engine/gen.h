/* gen.h: generated data: module instances from a case's shapes and the
 * upstream gradient kinds (random, zero, sparse, ones). */
#ifndef QC_GEN_H
#define QC_GEN_H

#include <stdint.h>

#include "model/module.h"
#include "core/rng.h"

/* Build generated instance `index` of class row `row` for shape row
 * [n, shape] with the case's seed and values. Its grad_out holds one dY per
 * kind in kinds[0..nkinds). The module's contract must be set by the
 * caller before (generators may read it). */
int qc_gen_module(const qc_registry_row *row, int n, const int64_t *shape, uint64_t seed, int index, const char *values,
                  const char (*kinds)[QC_NAMELEN], int nkinds, qc_module *m);

#endif
