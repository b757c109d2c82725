/* sweep.h: layer 2 over a whole checkpoint (the engine behind
 * `qatcheck contract --master-vs-dequant`; docs/contract.md).
 *
 * For every linear module group of a dump (one expert of a routed-experts
 * [E, N, K] weight at a time: a "unit"), every dY and every precision
 * combination:
 *   d_x rows:      r = dY W            g = dY dequant(quant(W))      [M, K]
 *   d_weight rows: r = dY^T X          g = dY^T dequant(quant(X))    [N, K]
 * both in float64 through the backend's float64 GEMM. Rows are then grouped
 * by (class, tensor, weight format, activation format) into class summaries
 * and outliers are marked by the rule of docs/contract.md. */
#ifndef QC_SWEEP_H
#define QC_SWEEP_H

#include <stdint.h>

#include "model/layer2.h"

struct qc_backend;
struct qc_dump;
struct qc_st;
struct qc_st_tensor;

/* Class of a module path: the layer index (the first all-digit component
 * that is not an expert index) and the expert index (the all-digit component
 * right after a component "experts") replaced by "*". Components are split at
 * '.' and '/'. Writes the class into cls and the indices (-1 when absent). */
void qc_contract_classify(const char *path, char *cls, int clslen, int *layer, int *expert);

/* Name of expert e of a routed-experts group: the index inserted right after
 * the "experts" component ("/m.layers.1.mlp.experts.down_proj", 3 ->
 * "/m.layers.1.mlp.experts.3.down_proj"). QC_EINPUT (message) when the path
 * has no "experts" component. */
int qc_contract_expert_name(const char *path, int e, char *out, int outlen);

/* Seed of generated data: seed XOR fnv1a64("<label>#<what>"); the sweep
 * labels a generated tensor by its shape, "<M>x<cols>" (one per shape). */
uint64_t qc_contract_seed(uint64_t seed, const char *module, const char *what);

/* Run the sweep over dump d (its groups of class linear). Fills s (rows, classes, outliers, verdicts).
 * QC_OK, or QC_EINPUT/QC_ESYS with the error set (bad input: no linear
 * groups, bad shapes, unknown format, ...). */
int qc_contract_sweep(struct qc_dump *d, const struct qc_backend *be, const qc_sweep_opts *o, qc_sweep *s);

/* Run the sweep over the linear weights of safetensors checkpoint st
 * (ckpt.c): every tensor '<module>.weight' of a master dtype (BF16, F16,
 * F32, F64) that is 2-D, or 3-D [E, N, K] under an 'experts' component, and
 * whose name has no 'embed' in it, as module '/<module>' (--modules matches
 * that path). dY and X come from dump dy's group of the same path when dy
 * is given and has it (grad_out/, inputs/x), else they are generated.
 * QC_EINPUT with the error set: no linear weight, none matching, a
 * selected weight stored quantized (F8, U8: a deployed checkpoint is no
 * master), a dy dump none of whose groups is a module. */
int qc_contract_sweep_ckpt(struct qc_st *st, struct qc_dump *dy, const struct qc_backend *be, const qc_sweep_opts *o,
                           qc_sweep *s);

/* Group rows into class summaries and mark outliers by the rule of
 * model/layer2.h (QC_OUTLIER_*). */
int qc_contract_summarize(qc_sweep *s);


#endif
