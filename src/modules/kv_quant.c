/* modules/kv_quant.c: FP8 KV-cache fake quantization as a QAT trainer runs
 * it (the FP8 QAT conventions: "KV fake quantization uses identity STE";
 * "KV fake quant returns decoded values, not physical cache bytes"), as
 * vLLM's DeepSeek V4 cache writers quantize (docs/conformance.md, "KV
 * cache"). x [..., C]: each row's first n channels (contract fp8_channels,
 * 0 = all C) go through fp8, the rest through bf16, as DeepSeek V4's 448
 * fp8 NoPE + 64 bf16 RoPE channels:
 *
 *   forward  b = bf16(x) (the cache's input is bf16)
 *            fp8 channel, block of `block` channels within [0, n):
 *              scale amax:   a = max|b| over the block
 *                            swa/indexer  s = max(a, amax_floor) * RN(1/fmax)
 *                            compressed   s = max(a * RN(1/fmax), scale_floor)
 *                            ue8m0: s = exp2(ceil(log2(s))) (as the GPU's log2f)
 *              scale tensor: s = tensor_scale (vLLM's k_scale / v_scale)
 *              q = fp8(clamp(b / s, +-fmax)) (RNE, -0 kept), y = q * s (float32)
 *            bf16 channel: y = b
 *   d_x      dY (identity STE: every channel, saturated or not)
 *
 * The production VJP is the copy a trainer's straight-through estimator
 * makes; the forward below is the producer's float32 arithmetic, used to
 * make the generated outputs/y. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/qc.h"
#include "model/module.h"
#include "modules/classes.h"
#include "modules/mod_util.h"
#include "numerics/formats.h"
#include "numerics/minifloat.h"
#include "numerics/parith.h"

/* The contract as the production reads it. */
typedef struct kvq {
  int e5m2, compressed, tensor, ue8m0;
  int64_t C, n, block, rows;
  float fmax, amax_floor, scale_floor, tscale;
} kvq;

static int kvq_read(const qc_module *m, const qc_tensor **xt, kvq *p) {
  int rc = qc_module_need(m, "inputs", "x", 1, QC_MAXDIM, xt);
  if (rc) return rc;
  const qc_contract *c = &m->contract;
  memset(p, 0, sizeof *p);
  p->e5m2 = strcmp(qc_contract_str(c, "format", "e4m3"), "e5m2") == 0;
  p->fmax = p->e5m2 ? 57344.0f : 448.0f;
  const char *kind = qc_contract_str(c, "kv_kind", "swa");
  p->compressed = strcmp(kind, "compressed") == 0;
  p->tensor = strcmp(qc_contract_str(c, "scale", "amax"), "tensor") == 0;
  p->ue8m0 = strcmp(qc_contract_str(c, "scale_fmt", "ue8m0"), "ue8m0") == 0;
  p->C = (*xt)->shape[(*xt)->ndim - 1];
  p->rows = p->C ? qc_numel(*xt) / p->C : 0;
  double n = qc_contract_num(c, "fp8_channels", 0), b = qc_contract_num(c, "block", 64);
  double fa = qc_contract_num(c, strcmp(kind, "indexer") == 0 ? "indexer_amax_floor" : "swa_amax_floor", 1e-4);
  double fs = qc_contract_num(c, "compressed_scale_floor", 2.2321428e-7);
  double ts = qc_contract_num(c, "tensor_scale", 1);
  if (n < 0 || n != floor(n) || n > (double)p->C)
    return qc_err("%s: contract fp8_channels = %g: expected a whole number in 0..%lld (inputs/x's last dimension; 0 = all)",
                  m->path, n, (long long)p->C);
  if (b < 0 || b != floor(b) || b > 1e9)
    return qc_err("%s: contract block = %g: expected a whole number >= 0 (0 = one scale for a row's fp8 channels)", m->path, b);
  if (!(fa > 0) || !(fs > 0) || !isfinite(fa) || !isfinite(fs))
    return qc_err("%s: contract floors must be finite and > 0 (an all-zero block would get a zero scale): %s = %g, "
                  "compressed_scale_floor = %g", m->path, strcmp(kind, "indexer") == 0 ? "indexer_amax_floor" : "swa_amax_floor",
                  fa, fs);
  if (!(ts > 0) || !isfinite(ts)) return qc_err("%s: contract tensor_scale = %g: expected a finite number > 0", m->path, ts);
  p->n = n > 0 ? (int64_t)n : p->C;
  p->block = b > 0 ? (int64_t)b : p->n;
  p->amax_floor = (float)fa;
  p->scale_floor = (float)fs;
  p->tscale = (float)ts;
  return QC_OK;
}

/* The class's reading of m: x, its contract, dY of x's shape. */
static int kvq_validate(const qc_module *m, const qc_tensor *dy) {
  const qc_tensor *xt;
  kvq p;
  int rc = kvq_read(m, &xt, &p);
  return rc ? rc : qc_module_check_dy(m, dy, qc_numel(xt), p.C, "the shape of inputs/x");
}

/* d_x = dY: the straight-through estimator's copy, in float32. */
static int kvq_vjp(const qc_ctx *ctx, const qc_module *m, const qc_tensor *dy, qc_tset *grads) {
  (void)ctx;
  const qc_tensor *xt;
  kvq p;
  float *dx;
  int rc = kvq_read(m, &xt, &p);
  if (!rc) rc = qc_module_check_dy(m, dy, qc_numel(xt), p.C, "the shape of inputs/x");
  if (rc) return rc;
  float *g = qc_mod_f32(dy, "kv_quant dY");
  if (!g) return QC_ESYS;
  if (!(rc = qc_mod_add(grads, "d_x", QC_F32, xt->ndim, xt->shape, (void **)&dx)))
    memcpy(dx, g, (size_t)qc_numel(xt) * sizeof *dx);
  free(g);
  return rc;
}

/* One block b[0..len) of a row's fp8 channels into y, in the producer's
 * float32 arithmetic. */
static void kvq_block(const kvq *p, const float *b, float *y, int64_t len) {
  float s = p->tscale;
  if (!p->tensor) {
    float a = 0.0f;
    for (int64_t i = 0; i < len; i++) a = fmaxf(a, fabsf(b[i]));
    const float r = qa_float(p->e5m2 ? 0x37924925u : QA_R448_BITS); /* RN(1/57344), RN(1/448) */
    s = p->compressed ? fmaxf(qa_mul(a, r), p->scale_floor) : qa_mul(fmaxf(a, p->amax_floor), r);
    if (p->ue8m0) s = qa_ceil2_log(s);
  }
  for (int64_t i = 0; i < len; i++) {
    float v = fminf(fmaxf(qa_div(b[i], s), -p->fmax), p->fmax);
    float d = p->e5m2 ? qc_e5m2_to_f32(qc_enc_e5m2(v)) : qc_e4m3_to_f32(qc_enc_e4m3(v));
    y[i] = qa_mul(d, s);
  }
}

/* y (float32, x's shape) = decode(encode(x)) under m's contract. */
static int kvq_forward_f32(const qc_module *m, float *y) {
  const qc_tensor *xt;
  kvq p;
  int rc = kvq_read(m, &xt, &p);
  if (rc) return rc;
  float *x = qc_mod_f32(xt, "kv_quant x");
  if (!x) return QC_ESYS;
  for (int64_t i = 0; i < qc_numel(xt); i++) x[i] = qc_round_bf16(x[i]);
  for (int64_t r = 0; r < p.rows; r++) {
    const float *b = x + r * p.C;
    float *o = y + r * p.C;
    for (int64_t j = 0; j < p.n; j += p.block) kvq_block(&p, b + j, o + j, p.n - j < p.block ? p.n - j : p.block);
    memcpy(o + p.n, b + p.n, (size_t)(p.C - p.n) * sizeof *o);
  }
  free(x);
  return QC_OK;
}

/* Generated kv_quant: [T, C] or [T, H, D], x ~ N(0,1) bf16 per row times a
 * row scale from 1e-6 (under the floors) to 30; row 1 all zero (the
 * floor's case), a saturating element under scale = tensor; outputs/y
 * made by the forward above. */
static int kvq_generate(const qc_gen *gp, qc_rng *rng, qc_module *m, int *ondim, int64_t *oshape) {
  if (gp->nshape != 2 && gp->nshape != 3)
    return qc_err("kv_quant: generate shape needs [T, C] or [T, H, D], got %d entries", gp->nshape);
  for (int d = 0; d < gp->nshape; d++)
    if (gp->shape[d] < 1) return qc_err("kv_quant: generate shape entries must be >= 1");
  uint16_t *x;
  int rc = qc_mod_gen_bf16(&m->inputs, "x", gp->nshape, gp->shape, rng, 1.0, &x);
  if (rc) return rc;
  const int64_t C = gp->shape[gp->nshape - 1], rows = qc_shape_numel(gp->nshape, gp->shape) / C;
  static const double row_scale[] = {1.0, 0.0, 1e-6, 30.0, 3e-5, 0.25};
  for (int64_t r = 0; r < rows; r++)
    for (int64_t j = 0; j < C; j++) {
      uint16_t *e = &x[r * C + j];
      *e = qc_f32_to_bf16((float)(qc_bf16_to_f32(*e) * row_scale[r % 6]));
    }
  if (rows * C > 7) x[7] = qc_f32_to_bf16(-1e-30f); /* a tiny negative: encodes as -0 */
  static const float ext[] = {3e4f, -3e4f, -0.0f};
  qc_mod_values(gp, rng, x, rows, C, ext, 3);
  float *y;
  if ((rc = qc_mod_add(&m->outputs, "y", QC_F32, gp->nshape, gp->shape, (void **)&y))) return rc;
  if ((rc = kvq_forward_f32(m, y))) return rc;
  *ondim = gp->nshape;
  memcpy(oshape, gp->shape, (size_t)gp->nshape * sizeof *oshape);
  return QC_OK;
}

static int kvq_tol_model(const qc_module *m, const qc_tensor *dy, const char *grad, qc_tol_model *tm) {
  (void)dy;
  if (strcmp(grad, "d_x") != 0) return qc_err("%s: class kv_quant has no gradient '%s'", m->path, grad);
  qc_mod_tm(tm, 1, 1, 0, 0, "identity STE (K = 1): d_x = dY copied, no arithmetic; one float32 rounding of dY at most");
  return QC_OK;
}

static const qc_key_spec kvq_keys[] = {
    {"format", "e4m3|e5m2", "e4m3", "the fp8 element format (vLLM kv_cache_dtype fp8 / fp8_e4m3, fp8_e5m2)"},
    {"kv_kind", "swa|compressed|indexer", "swa", "which cache: its floor (swa_amax_floor, compressed_scale_floor, "
     "indexer_amax_floor)"},
    {"scale", "amax|tensor", "amax", "amax: a scale per row and block from its amax; tensor: tensor_scale (k_scale / v_scale)"},
    {"scale_fmt", "ue8m0|float", "ue8m0", "ue8m0: the amax scale rounded up to a power of two; float: kept"},
    {"block", NULL, "64", "channels sharing one scale within a row's fp8 channels (0: all of them)"},
    {"fp8_channels", NULL, "0", "n: channels 0..n-1 of a row in fp8, the rest in bf16 (0: all)"},
    {"swa_amax_floor", NULL, "1e-4", "swa: the amax floored at this before the scale"},
    {"compressed_scale_floor", NULL, "2.2321428e-7", "compressed: the scale floored at this (RN(1e-4 RN(1/448)))"},
    {"indexer_amax_floor", NULL, "1e-4", "indexer: the amax floored at this before the scale"},
    {"tensor_scale", NULL, "1", "scale = tensor: the per-tensor scale"},
    {NULL, NULL, NULL, NULL}};

const qc_class qc_class_kv_quant = {
    .name = "kv_quant",
    .summary = "FP8 KV-cache fake quantization (fp8/bf16 channel split, per-block or per-tensor scale, floors): "
               "y = decode(encode(x)), d_x = dY (identity STE)",
    .tensors = "inputs/x outputs/y",
    .grads = "d_x",
    .shape_help = "[T, C] or [T, H, D]: tokens, (heads,) channels",
    .keys = kvq_keys,
    .generate = kvq_generate,
    .production = kvq_vjp,
    .not_checked = "",
    .tol_model = kvq_tol_model,
    .validate = kvq_validate,
    .hypotheses = "factor sign rows zero dy_precision nonfinite",
};
