/* ckpt_quant.h: `quant` over many modules: every quantized module of a
 * deployed safetensors checkpoint against its master checkpoint, or every
 * module of a dump with deployed bytes. Each module is assembled as a
 * qc_module (params/weight from the master, saved/weight_q, weight_scale,
 * weight_global_scale from the deployed tensors, as stored) and compared
 * by the one deployed-bytes check (engine/deployed.h). Also: a module's
 * params/ taken from a checkpoint by name, for `vjp` cases. */
#ifndef QC_CKPT_QUANT_H
#define QC_CKPT_QUANT_H

#include "io/dump.h"
#include "io/safetensors.h"
#include "model/deployed.h"
#include "model/module.h"

typedef struct qc_quant_many_opts {
  const char *format;      /* NULL: each module's own (its naming convention, its contract) */
  const char *profile;     /* NULL: each module's default (convention or contract) */
  const char *modules;     /* POSIX extended regex on module paths (NULL: all) */
  const char *config;      /* the deployed checkpoint's config.json, or NULL (read for scale_fmt) */
} qc_quant_many_opts;

/* Every quantized module of deployed checkpoint `dep` (naming conventions
 * of docs/interfaces.md section 2b: DeepSeek FP8 weight + weight_scale_inv;
 * compressed-tensors weight or weight_packed + weight_scale [+
 * weight_global_scale]; ModelOpt weight + weight_scale + weight_scale_2)
 * against master `mst`'s '<module>.weight', one row each; modules that
 * cannot be compared (unquantized, int8, e5m2) are listed as skipped.
 * QC_EINPUT naming the module and tensors: a master tensor missing or of
 * another shape, scales that fit no format, nothing to compare. */
int qc_quant_checkpoint(const qc_st *dep, const qc_st *mst, const qc_quant_many_opts *o, qc_quant_rows *out);

/* Every module group of dump d with saved/weight_q, its format and profile
 * from its contract (o->format / o->profile override). */
int qc_quant_dump_all(qc_dump *d, const qc_quant_many_opts *o, qc_quant_rows *out);

/* Replace (or add) m's params/ by checkpoint tensors '<prefix><module>.<name>'
 * where <module> is m->path without its leading '/': every such tensor of
 * the checkpoint becomes params/<name> (<name> without a '.'). QC_EINPUT
 * when the checkpoint has none for the module (naming the tensor expected). */
int qc_ckpt_params(const qc_st *st, const char *prefix, qc_module *m);

#endif
