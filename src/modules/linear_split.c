/* modules/linear_split.c: the linear class split along its output features
 * N across ranks (qc_split; engine/split.c, docs/distributed.md), as a
 * column-parallel layer (an lm_head at 128k vocabulary) is: rank r holds
 * weight rows [n0, n1), bias [n0, n1) and dY columns [n0, n1), so its
 * d_weight rows and d_bias entries are its own, and its d_x = dY[:, n0:n1]
 * W[n0:n1, :] is a partial sum that an all-reduce completes (the
 * production VJP does it through ctx->group, linear.c).
 *
 * A slice quantizes its own rows, which equals the whole's rows when the
 * weight format's scale blocks do not cross a slice boundary: per channel,
 * MX and NVFP4-style 1 x k blocks along K, 128 x 128 blocks when slices
 * start at multiples of 128. A per-tensor scale (fp8_tensor, nvfp4's global
 * scale) or a stochastic rounding stream over the whole weight would
 * differ: such a module is refused (exit 2), not split wrongly.
 *
 * Under several ranks on a device, a linear whose fused audit
 * (qc_linear_audit_bytes) does not fit a rank's free device memory is
 * split without being asked (engine/vjp.c). */
#include <stdio.h>
#include <string.h>

#include "backend/backend.h"
#include "core/qc.h"
#include "model/module.h"
#include "modules/classes.h"
#include "modules/mod_util.h"

/* N, and the alignment the weight format needs; QC_EINPUT when the split
 * would change the arithmetic. */
static int linear_split_size(const qc_module *m, int ranks, int64_t *len, int64_t *align) {
  (void)ranks;
  const qc_tensor *w = qc_tset_get(&m->params, "weight");
  if (!w || w->ndim != 2) return qc_err("%s: params/weight must be [N, K] to split along N", m->path);
  const char *f = qc_contract_str(&m->contract, "weight_format", "none");
  int master = strcmp(qc_contract_str(&m->contract, "dx_weight", "dequant"), "master") == 0;
  if (!master && (strcmp(f, "fp8_tensor") == 0 || strcmp(f, "nvfp4") == 0)) {
    qc_hint("a split module quantizes each rank's rows itself; run this module unsplit (leave it out of the case's 'split'; split "
            "because it does not fit the device: on a device with more free memory)");
    return qc_err("%s: weight_format %s has a per-tensor scale: splitting the weight along N would change it", m->path, f);
  }
  if (!master && strcmp(f, "none") != 0 && qc_contract_get(&m->contract, "rounding") &&
      strcmp(qc_contract_str(&m->contract, "rounding", "rn"), "rn") != 0) {
    qc_hint("run this module unsplit (drop it from the case's 'split')");
    return qc_err("%s: stochastic rounding draws over the whole weight: a split along N would change its stream", m->path);
  }
  *len = w->shape[0];
  *align = strncmp(f, "fp8_block128", 12) == 0 && !master ? 128 : 1;
  return QC_OK;
}

/* The module's slice [lo, hi) of N. */
static int linear_split_slice(const qc_module *m, int64_t lo, int64_t hi, qc_module *part) {
  const int64_t N = qc_tset_get(&m->params, "weight")->shape[0];
  int rc = qc_mod_part_init(m, part);
  for (int j = 0; !rc && j < m->inputs.n; j++) rc = qc_mod_add_cut(&part->inputs, &m->inputs.t[j], 0, -1, 0, 0); /* whole */
  for (int j = 0; !rc && j < m->params.n; j++) {
    const qc_tensor *t = &m->params.t[j];
    int rows = strcmp(t->name, "weight") == 0 || strcmp(t->name, "bias") == 0;
    rc = qc_mod_add_cut(&part->params, t, 0, rows ? N : -1, lo, hi);
  }
  for (int i = 0; !rc && i < m->grad_out.n; i++) {
    rc = qc_mod_add_cut(&part->grad_out, &m->grad_out.t[i], -1, N, lo, hi);
    for (int j = 0; !rc && m->cand && j < m->cand[i].n; j++) { /* the dump's gradients: d_x whole, the others' rows */
      const qc_tensor *t = &m->cand[i].t[j];
      int rows = strcmp(t->name, "d_weight") == 0 || strcmp(t->name, "d_bias") == 0;
      rc = qc_mod_add_cut(&part->cand[i], t, 0, rows ? N : -1, lo, hi);
    }
  }
  if (rc) qc_module_free(part);
  return rc;
}

/* Where each gradient of the slice sits in the whole. */
static int linear_split_place(const qc_module *m, const char *grad, int64_t lo, int64_t hi, qc_split_block *b, int *partial) {
  const qc_tensor *x = qc_tset_get(&m->inputs, "x"), *w = qc_tset_get(&m->params, "weight");
  *partial = 0;
  if (strcmp(grad, "d_x") == 0 && x) {
    qc_mod_block_whole(x->ndim, x->shape, b);
    *partial = 1;
    return QC_OK;
  }
  if (strcmp(grad, "d_weight") == 0 && w) {
    qc_mod_block_whole(2, w->shape, b);
    b->r0 = lo, b->r1 = hi;
    return QC_OK;
  }
  if (strcmp(grad, "d_bias") == 0 && w) {
    qc_mod_block_whole(1, w->shape, b);
    b->c0 = lo, b->c1 = hi;
    return QC_OK;
  }
  return qc_err("%s: class linear has no gradient '%s' to split", m->path, grad);
}

/* The fused audit's device memory for m (shapes suffice). */
static size_t linear_split_bytes(const qc_module *m) {
  const qc_tensor *x = qc_tset_get(&m->inputs, "x"), *w = qc_tset_get(&m->params, "weight");
  if (!x || !w || w->ndim != 2 || x->ndim < 1 || w->shape[1] < 1) return 0;
  const int64_t K = w->shape[1];
  return qc_linear_audit_bytes(qc_numel(x) / K, K, w->shape[0]);
}

const qc_split qc_linear_split = {
    .dim = "N (output features)",
    .size = linear_split_size,
    .slice = linear_split_slice,
    .place = linear_split_place,
    .whole_reference = 0,
    .device_bytes = linear_split_bytes,
};
