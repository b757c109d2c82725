/* reference/kv_quant.c: FP8 KV-cache fake quantization from the math
 * (docs/classes.md, "kv_quant"; the producer's rule: docs/conformance.md,
 * "KV cache").
 *
 * Forward, per row of x [..., C] (b = x rounded to bf16, the cache's
 * input): channels [0, n) in blocks of `block`, each with a scale s:
 *   scale = amax: A = max |b| over the block, r = RN32(1/fmax) (fmax 448
 *     for e4m3, 57344 for e5m2);
 *     swa, indexer: s = RN32(max(A, amax_floor) r)
 *     compressed:   s = max(RN32(A r), compressed_scale_floor)
 *     scale_fmt ue8m0: s = 2^k, k = ceil(log2(s)) as the GPU's log2f gives it
 *     (numerics: the measured exception list);
 *   scale = tensor: s = tensor_scale;
 *   v = RN32(b / s) clamped to [-fmax, fmax], q = v rounded to the nearest
 *   fp8 value, ties to even (subnormals below 2^emin, the sign of a zero
 *   kept); y = RN32(q s) (exact for a power-of-two s).
 * Channels [n, C): y = b.
 * Backward: the straight-through estimator is the identity, d_x = dY, on
 * every channel; the terms' scale is |dY|.
 *
 * The forward is exact (no sums): y's error model says so, and the check
 * judges y bit for bit wherever y's dtype holds the decoded values exactly
 * (a power-of-two scale in bf16, float32 or float64; any scale in float32
 * or float64): the model says exact (qc_tol_model.exact), so the check's
 * max_abs is 0 and an element that differs at all fails. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/qc.h"
#include "model/module.h"
#include "numerics/formats.h"
#include "numerics/parith.h"
#include "reference/ref_classes.h"
#include "reference/ref_util.h"

typedef struct rkv {
  int mbits, emin, compressed, tensor, ue8m0;
  double fmax, afloor, sfloor, tscale;
  int64_t C, n, block;
} rkv;

static int rkv_read(const qc_module *m, const qc_tensor **xt, rkv *p) {
  int rc = qc_module_need(m, "inputs", "x", 1, QC_MAXDIM, xt);
  if (rc) return rc;
  const qc_contract *c = &m->contract;
  const int e5 = strcmp(qc_contract_str(c, "format", "e4m3"), "e5m2") == 0;
  const char *kind = qc_contract_str(c, "kv_kind", "swa");
  p->mbits = e5 ? 2 : 3;
  p->emin = e5 ? -14 : -6;
  p->fmax = e5 ? 57344.0 : 448.0;
  p->compressed = strcmp(kind, "compressed") == 0;
  p->tensor = strcmp(qc_contract_str(c, "scale", "amax"), "tensor") == 0;
  p->ue8m0 = strcmp(qc_contract_str(c, "scale_fmt", "ue8m0"), "ue8m0") == 0;
  p->C = (*xt)->shape[(*xt)->ndim - 1];
  const double n = qc_contract_num(c, "fp8_channels", 0), b = qc_contract_num(c, "block", 64);
  p->afloor = qc_contract_num(c, strcmp(kind, "indexer") == 0 ? "indexer_amax_floor" : "swa_amax_floor", 1e-4);
  p->sfloor = qc_contract_num(c, "compressed_scale_floor", 2.2321428e-7);
  p->tscale = qc_contract_num(c, "tensor_scale", 1);
  if (!(n >= 0 && n <= (double)p->C && n == floor(n)))
    return qc_err("%s: contract fp8_channels = %g: the reference takes a whole number of channels in 0..%lld", m->path, n,
                  (long long)p->C);
  if (!(b >= 0 && b == floor(b) && b <= 1e9)) return qc_err("%s: contract block = %g: not a whole number >= 0", m->path, b);
  if (!(p->afloor > 0 && p->sfloor > 0 && isfinite(p->afloor) && isfinite(p->sfloor)))
    return qc_err("%s: contract floors must be finite and > 0: amax floor %g, compressed_scale_floor %g", m->path, p->afloor,
                  p->sfloor);
  if (!(p->tscale > 0 && isfinite(p->tscale)))
    return qc_err("%s: contract tensor_scale = %g: expected a finite number > 0", m->path, p->tscale);
  p->n = n > 0 ? (int64_t)n : p->C;
  p->block = b > 0 ? (int64_t)b : p->n;
  return QC_OK;
}

/* v (|v| <= fmax) to the nearest fp8 value, ties to even, sign of zero kept. */
static double fp8_round(const rkv *p, double v) {
  if (v == 0) return v;
  int e;
  frexp(fabs(v), &e); /* |v| in [2^(e-1), 2^e) */
  int ex = e - 1 < p->emin ? p->emin : e - 1;
  const double quantum = ldexp(1.0, ex - p->mbits);
  return copysign(nearbyint(fabs(v) / quantum) * quantum, v);
}

/* The block's scale s (float32 value). */
static double block_scale(const rkv *p, const double *b, int64_t len) {
  const float af = (float)p->afloor, sf = (float)p->sfloor; /* the producer holds its floors in float32 */
  if (p->tensor) return (float)p->tscale;
  double a = 0;
  for (int64_t i = 0; i < len; i++) a = fmax(a, fabs(b[i]));
  const double r = (float)(1.0 / p->fmax);
  double s = p->compressed ? fmax((float)(a * r), sf) : (float)(fmax(a, af) * r);
  if (p->ue8m0) s = ldexp(1.0, qc_ceil_log2_gpu((float)s));
  return s;
}

/* y = decode(encode(x)) in float64 (a qc_fwd_ref_fn). */
static int ref_kvq_forward(const qc_ctx *ctx, const qc_module *m, qc_tensor *y, qc_tol_model *tm) {
  (void)ctx;
  const qc_tensor *xt;
  rkv p;
  memset(tm, 0, sizeof *tm);
  int rc = rkv_read(m, &xt, &p);
  if (rc) return rc;
  double *x = qc_refu_load(xt, "reference x");
  if (!x) return QC_ESYS;
  if ((rc = qc_tensor_alloc(y, "y", QC_F64, xt->ndim, xt->shape))) goto done;
  double *o = y->data;
  const int64_t rows = p.C ? qc_numel(xt) / p.C : 0;
  for (int64_t i = 0; i < qc_numel(xt); i++) x[i] = qc_round_bf16((float)x[i]);
  for (int64_t r = 0; r < rows; r++) {
    const double *b = x + r * p.C;
    double *yo = o + r * p.C;
    for (int64_t j0 = 0; j0 < p.n; j0 += p.block) {
      const int64_t len = p.n - j0 < p.block ? p.n - j0 : p.block;
      const double s = block_scale(&p, b + j0, len); /* a float32 value */
      for (int64_t i = j0; i < j0 + len; i++) {
        double v = (float)(b[i] / s);
        v = v > p.fmax ? p.fmax : v < -p.fmax ? -p.fmax : v;
        yo[i] = (float)(fp8_round(&p, v) * s);
      }
    }
    for (int64_t i = p.n; i < p.C; i++) yo[i] = b[i]; /* the bf16 channels */
  }
  /* exact where y's dtype holds the decoded values: judged bit for bit (a
   * margin that leaves only float64's own resolution) */
  const qc_tensor *yc = qc_tset_get(&m->outputs, "y");
  const int pow2 = !p.tensor && p.ue8m0;
  const int exact = yc && (yc->dtype == QC_F32 || yc->dtype == QC_F64 || (yc->dtype == QC_BF16 && pow2));
  tm->k = 1;
  tm->lambda = 1;
  tm->exact = exact;
  snprintf(tm->why, sizeof tm->why, "%s",
           exact ? "decode(encode(x)) is exact in y's dtype: every element judged bit for bit"
                 : "decode(encode(x)) rounded once to y's dtype");
  rc = QC_OK;
done:
  free(x);
  return rc;
}

/* d_x = dY (or |dY| under ctx->terms): the identity STE (a qc_vjp_fn). */
static int ref_kvq(const qc_ctx *ctx, const qc_module *m, const qc_tensor *dy, qc_tset *grads) {
  const qc_tensor *xt;
  rkv p;
  double *dx;
  int rc = rkv_read(m, &xt, &p);
  if (rc) return rc;
  if (qc_numel(dy) != qc_numel(xt) || dy->ndim < 1 || dy->shape[dy->ndim - 1] != p.C)
    return qc_err("%s: dY '%s' is not shaped as inputs/x (%lld elements, last dimension %lld)", m->path, dy->name,
                  (long long)qc_numel(xt), (long long)p.C);
  double *g = qc_refu_load(dy, "reference dY");
  if (!g) return QC_ESYS;
  if (!(rc = qc_refu_out(grads, "d_x", xt->ndim, xt->shape, &dx)))
    for (int64_t i = 0; i < qc_numel(xt); i++) dx[i] = ctx && ctx->terms ? fabs(g[i]) : g[i];
  free(g);
  return rc;
}

/* The class's reference, its one export (src/classes/registry.c pairs it
 * with src/modules/kv_quant.c). */
const qc_reference qc_reference_kv_quant = {.vjp = ref_kvq, .forward = ref_kvq_forward, .terms = 1};
