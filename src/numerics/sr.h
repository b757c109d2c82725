/* sr.h: the stochastic-rounding contract of docs/numerics.md: Philox4x32-10,
 * key = the 64-bit seed, counter = (element index low, element index high,
 * salt, step). The first output word's top 24 bits give u in [0, 1). */
#ifndef QC_SR_H
#define QC_SR_H

#include <stdint.h>


/* Stochastic rounding settings; on = 0 means round to nearest even. */
typedef struct qc_sr {
  int on;
  uint64_t seed;
  uint32_t salt;   /* identifies the parameter (qc_sr_salt) */
  uint32_t step;   /* optimizer step */
  uint64_t base;   /* global index of this matrix's element 0 (a shard's offset) */
} qc_sr;

/* Philox4x32-10 (Random123): out = philox(ctr[4], key[2]). */
void qc_philox4x32_10(const uint32_t ctr[4], const uint32_t key[2], uint32_t out[4]);
/* The 24-bit draw for element `index` (u = result * 2^-24). */
uint32_t qc_sr_bits(const qc_sr *sr, uint64_t index);
/* Salt of a parameter: FNV-1a 32-bit hash of its PyTorch name, e.g.
 * "model.layers.3.mlp.down_proj.weight" (a leading '/' is skipped, '/'
 * becomes '.'). */
uint32_t qc_sr_salt(const char *module_path, const char *param);

#endif
