/* sr.h: the stochastic-rounding contract of docs/numerics.md ("Stochastic
 * rounding"): one stateless contract shared by every rank, replica, shard,
 * micro-step, pass and replay. Philox4x32-10, key = the 64-bit seed,
 * counter = (i low, i high, salt, step), with
 *   salt = FNV-1a 32 of the parameter's identity string (qc_sr_salt_id),
 *   i    = expert * numel + base + the element's row-major index,
 * numel the elements of one expert's (or a dense parameter's) whole matrix.
 * The first output word's top 24 bits give u in [0, 1). */
#ifndef QC_SR_H
#define QC_SR_H

#include <stdint.h>


/* Stochastic rounding settings; on = 0 means round to nearest even. */
typedef struct qc_sr {
  int on;
  uint64_t seed;
  uint32_t salt;   /* identifies the parameter (qc_sr_salt_id of its identity) */
  uint32_t step;   /* optimizer step */
  uint64_t base;   /* index of this matrix's element 0 in its expert's whole matrix (a shard's offset) */
  uint64_t expert; /* global expert id of a routed expert's matrix (0: a dense parameter) */
  uint64_t numel;  /* elements of one expert's whole matrix when this is a shard of it (0: the piece is whole) */
} qc_sr;

/* Philox4x32-10 (Random123): out = philox(ctr[4], key[2]). */
void qc_philox4x32_10(const uint32_t ctr[4], const uint32_t key[2], uint32_t out[4]);
/* The 24-bit draw for counter index `index` (u = result * 2^-24). */
uint32_t qc_sr_bits(const qc_sr *sr, uint64_t index);
/* The counter index of element `i` (row-major) of a matrix piece of
 * piece_numel elements: expert * numel + base + i (numel = sr->numel, or
 * piece_numel when the piece is the whole matrix). */
static inline uint64_t qc_sr_index(const qc_sr *sr, uint64_t piece_numel, uint64_t i) {
  return sr->expert * (sr->numel ? sr->numel : piece_numel) + sr->base + i;
}
/* Salt of a parameter identity string ("model.embed_tokens.weight"):
 * FNV-1a 32-bit hash of its bytes. */
uint32_t qc_sr_salt_id(const char *identity);
/* The legacy salt (before the sr_salt contract key): the identity made from
 * the module path, a leading '/' skipped and '/' made '.', plus "." param:
 * qc_sr_salt_path("/model.layers.3.mlp.down_proj", "weight") ==
 * qc_sr_salt_id("model.layers.3.mlp.down_proj.weight"). Right only for a
 * parameter used at one module, under its own name. */
uint32_t qc_sr_salt_path(const char *module_path, const char *param);

#endif
