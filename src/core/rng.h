/* rng.h: the deterministic generator behind generated inputs and dY
 * (splitmix64 seeding, xoshiro256** stream, Box-Muller normals). */
#ifndef QC_RNG_H
#define QC_RNG_H

#include <stdint.h>

typedef struct qc_rng {
  uint64_t s[4];
  int has_spare;
  double spare;
} qc_rng;

void qc_rng_seed(qc_rng *r, uint64_t seed);
uint64_t qc_rng_u64(qc_rng *r);
double qc_rng_uniform(qc_rng *r);   /* [0, 1) */
double qc_rng_normal(qc_rng *r);    /* N(0, 1) */

#endif
