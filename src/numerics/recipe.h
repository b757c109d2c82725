/* recipe.h: a producer path's float32 operation sequence for one format
 * (docs/numerics.md, "Profiles"), as data: the CPU quantizers (qpass.c) and
 * the CUDA kernels (kernels/quant.cu) both run a block's scale and element
 * transform from the same recipe through the same inline code, so the two
 * agree by construction and differ only where the hardware does
 * (rcp.approx, log2f), which the device test measures.
 *
 * A block's scale, in this order:
 *   fp8    a = max(amax, afloor); s = a / 448 (div) or a * RN(1/448) (mul);
 *          s = max(s, pfloor); s = pow2(s) (none, ceil2, ceil2_log);
 *          s = max(s, sfloor);
 *          element x / s, x * rcp(s) or x * rcpa(s)
 *   te     scale = 448 / amax (amax 0 or Inf -> 1, Inf scale -> FLT_MAX),
 *          optionally truncated to a power of two; element x * scale,
 *          dequantization multiplier rcp(scale)
 *   nvfp4  per-tensor g (qr_nvfp4_g), block scale sf an e4m3 byte, element
 *          multiplier or divisor from sf and g
 *   mx     an e8m0 byte, element x * 2^-e (exact)
 * Plain C11 and C++ (nvcc); every function is inline. Device code that
 * includes this file includes <cuda_fp8.h> first (qr_e4m3). */
#ifndef QC_RECIPE_H
#define QC_RECIPE_H

#include <stdint.h>

#include "numerics/minifloat.h"
#include "numerics/parith.h"

enum { QR_NONE = 0, QR_FP8, QR_TE, QR_NVFP4, QR_MX };
enum { QS_DIV = 0, QS_MUL };                               /* fp8 scale: a / 448, a * RN(1/448) */
enum { QP_NONE = 0, QP_CEIL2, QP_CEIL2_LOG, QP_TRUNC };    /* power-of-two rule (QP_TRUNC: te) */
enum { QE_DIV = 0, QE_RCP, QE_RCPA };                      /* fp8 element: x / s, x * rcp(s), x * rcpa(s) */
enum { QG_DIV = 0, QG_EAGER, QG_MULINV, QG_TE, QG_CT };  /* nvfp4 global: 2688/amax, RN(1/amax)*2688, amax*RN(1/2688),
                                                              2688/amax at most FLT_MAX (te), RN(1/max(amax, FLT_MIN))*2688
                                                              with Inf -> 1 (compressed-tensors) */
enum { QF_VLLM = 0, QF_TE, QF_MODELOPT, QF_EXACT, QF_CT }; /* nvfp4 block scale (QF_CT: QF_VLLM, byte 0 -> eps 0.125) */
enum { QN_RCP = 0, QN_RCPA, QN_DIVG, QN_DIVM, QN_RCP_TE }; /* nvfp4 element (QN_RCP_TE: rcp(sf * rcp(g)) at most FLT_MAX) */
enum { QM_CEIL2_DIV = 0, QM_LOG_MUL, QM_EVEN, QM_OCP };    /* mx shared exponent */

typedef struct qc_recipe {
  uint8_t kind, sop, pow2, eop;  /* QR_*, QS_*, QP_*, QE_* */
  uint8_t gop, sfop, nop, mop;   /* QG_*, QF_*, QN_*, QM_* */
  uint8_t fp4;                   /* e2m1 elements (else e4m3) */
  float afloor, sfloor;          /* fp8: amax floor, scale floor after pow2 (0: none) */
  float pfloor;                  /* fp8: scale floor before pow2 (0: none; vLLM's CUDA UE8M0 rule) */
} qc_recipe;

/* A block's scale: element v = x / k (div) or x * k; value = decode(q) * deq;
 * div == 2: divide, even by 0, and encode e2m1 the way ModelOpt does
 * (qr_fp4_modelopt);
 * byte: the stored e4m3 (nvfp4) or e8m0 (mx) scale byte. */
typedef struct qc_bscale {
  float k;
  int div;
  float deq;
  uint8_t byte;
} qc_bscale;

/* float32 -> e4m3 (SATFINITE, RNE, sign of zero kept) for the nvfp4 block
 * scale: CUDA's own conversion on the device, the CPU's bit encoder on the
 * host (the two agree over all 2^32 inputs: bench/fp8_conformance). */
QC_HD uint8_t qr_e4m3(float x) {
#ifdef __CUDA_ARCH__
  return (uint8_t)__nv_cvt_float_to_fp8(x, __NV_SATFINITE, __NV_E4M3);
#else
  return qc_enc_e4m3(x);
#endif
}
/* ModelOpt's e2m1 cast (NVFP4QTensor._cast_fp4 @5a4242f): the sign bit is
 * (v < 0) and the magnitude searchsorted over the midpoints, so a quotient
 * of +-0 gives code 0 and a NaN (0 / 0 in a block whose e4m3 scale is 0)
 * gives 7 (+6); c is the saturating RNE code of v (+-Inf: +-6). */
QC_HD uint8_t qr_fp4_modelopt(float v, uint8_t c) { return v != v ? 7 : v == 0.0f ? 0 : c; }

/* Exact decode (0x7F/0xFF are not produced from finite input). */
QC_HD float qr_e4m3_val(uint8_t b) {
  uint32_t e = (b >> 3) & 0xfu, m = b & 7u;
  float v = e ? qa_float(((e + 120u) << 23) | (m << 20)) : (float)m * 0.001953125f;
  return (b & 0x80u) ? -v : v;
}

/* 2^(b-127) for an e8m0 byte b < 255 (0 is the subnormal 2^-127). */
QC_HD float qr_e8m0_val(uint8_t b) { return qa_float(b ? (uint32_t)b << 23 : 0x00400000u); }

/* floor(log2(a)) for a finite a > 0, from the bits. */
QC_HD int qr_floor_log2(float a) {
  uint32_t u = qa_bits(a), e = u >> 23;
  if (e) return (int)e - 127;
  int k = -150;
  for (uint32_t m = u & 0x7fffffu; m; m >>= 1) k++;
  return k;
}

/* nvfp4's per-tensor global scale from the tensor's amax: the divisor g
 * (QG_DIV, QG_EAGER) or modelopt's multiplier amax/2688 (QG_MULINV). An
 * all-zero tensor gets 1 (no producer defines one; every byte is 0). */
QC_HD float qr_nvfp4_g(const qc_recipe *r, float amax) {
  if (amax == 0.0f) return 1.0f;
  switch (r->gop) {
    case QG_EAGER: return qa_mul(qa_rcp(amax), 2688.0f);
    case QG_MULINV: return qa_mul(amax, qa_float(QA_R2688_BITS));
    case QG_TE: return qa_min(qa_div(2688.0f, amax), qa_float(0x7f7fffffu)); /* an infinite quotient: FLT_MAX */
    case QG_CT: { /* compressed-tensors: 2688 / Tensor is reciprocal() * 2688; the amax clamped at FLT_MIN; Inf -> 1 */
      float g = qa_mul(qa_rcp(qa_max(amax, qa_float(0x00800000u))), 2688.0f);
      return qa_bits(g) >= 0x7f800000u ? 1.0f : g;
    }
    default: return qa_div(2688.0f, amax);
  }
}

/* Transformer Engine's current scaling factor 448/amax. */
QC_HD float qr_te_scale(float amax) {
  if (amax == 0.0f || qa_bits(amax) >= 0x7f800000u) return 1.0f;
  float sc = qa_div(448.0f, amax);
  return qa_bits(sc) == 0x7f800000u ? qa_float(0x7f7fffffu) : sc;
}

/* The element factor of a multiplier-or-divisor d (0 gives signed zeros). */
QC_HD void qr_set_div(qc_bscale *b, float d) {
  b->deq = d;
  b->k = d;
  b->div = d != 0.0f;
}

/* The element transform and dequantization multiplier of a block whose
 * final scale is known: s, the dequantization multiplier, for fp8 and te
 * recipes (te's element factor is then rcp(s)); the scale byte for nvfp4
 * (e4m3) and mx (e8m0); g is nvfp4's global scale. Used on a scale just
 * derived (qr_block_scale) or on one a checkpoint stored. */
QC_HD qc_bscale qr_scale_given(const qc_recipe *r, float s, uint8_t byte, float g) {
  qc_bscale b;
  b.k = 1.0f; b.div = 0; b.deq = 1.0f; b.byte = byte;
  switch (r->kind) {
    case QR_FP8:
      b.deq = s;
      if (s == 0.0f) { b.k = 0.0f; break; } /* an all-zero tensor without a floor: signed zeros */
      if (r->eop == QE_DIV) { b.k = s; b.div = 1; }
      else b.k = r->eop == QE_RCPA ? qa_rcpa(s) : qa_rcp(s);
      break;
    case QR_TE:
      b.deq = s;
      b.k = qa_rcp(s);
      break;
    case QR_NVFP4: {
      float sf = qr_e4m3_val(byte);
      if (r->nop == QN_DIVM) { /* x / (sf * w), also when sf is 0 */
        b.deq = b.k = qa_mul(sf, g);
        b.div = 2;
        break;
      }
      b.deq = qa_div(sf, g);
      if (r->nop == QN_DIVG) { qr_set_div(&b, b.deq); break; }
      if (r->nop == QN_RCP_TE) { /* no zero case: 1/0 = Inf gives FLT_MAX, a non-zero x saturates */
        b.k = qa_min(qa_rcp(qa_mul(sf, qa_rcp(g))), qa_float(0x7f7fffffu));
        break;
      }
      if (sf == 0.0f) { b.k = 0.0f; break; }
      /* QN_RCPA: vLLM's cvt_warp_fp16_to_fp4 (nvfp4_utils.cuh @2c9ff65) uses rcp.approx.FTZ: a global
       * scale over 2^126 has reciprocal 0, so the factor is 1/0 = Inf and a non-zero element gives +-6 */
      b.k = r->nop == QN_RCPA ? qa_rcpa_ftz(qa_mul(sf, qa_rcpa_ftz(g))) : qa_rcp(qa_mul(sf, qa_rcp(g)));
      break;
    }
    case QR_MX:
      b.deq = qr_e8m0_val(byte);
      b.k = byte == 254 ? qa_float(0x00400000u) : qa_float((uint32_t)(254 - byte) << 23); /* 2^(127-b) = 1/deq, exact */
      /* vLLM's and torch's mx code divide a byte-0 block by exp2f(-127), not 2^-127; the OCP MX spec
       * (v1.0 sec. 6.3: V_i / X with X = 2^-127 exactly; microxcaling mx_ops.py _quantize_mx @3b429a8,
       * torchao to_mx @050515e: x * 2^127 exactly) and exact do not */
      if (byte == 0 && r->mop != QM_CEIL2_DIV && r->mop != QM_OCP) {
        b.k = qa_float(QA_EXP2F_M127_BITS);
        b.div = 1;
      }
      break;
    default: break;
  }
  return b;
}

/* The scale of a block with absolute maximum amax (finite, >= 0); g is
 * nvfp4's global scale (qr_nvfp4_g), unused otherwise. */
QC_HD qc_bscale qr_block_scale(const qc_recipe *r, float amax, float g) {
  switch (r->kind) {
    case QR_FP8: {
      float a = qa_max(amax, r->afloor);
      float s = r->sop == QS_MUL ? qa_mul(a, qa_float(QA_R448_BITS)) : qa_div(a, 448.0f);
      if (r->pfloor > 0.0f) s = qa_max(s, r->pfloor);
      if (r->pow2 == QP_CEIL2) s = qa_ceil2(s);
      else if (r->pow2 == QP_CEIL2_LOG) s = qa_ceil2_log(s);
      return qr_scale_given(r, qa_max(s, r->sfloor), 0, g);
    }
    case QR_TE: { /* element factor = the scale itself, not rcp(rcp(scale)) */
      float sc = qr_te_scale(amax);
      if (r->pow2 == QP_TRUNC) sc = qa_float(qa_bits(sc) & 0xff800000u);
      qc_bscale b;
      b.k = sc; b.div = 0; b.deq = qa_rcp(sc); b.byte = 0;
      return b;
    }
    case QR_NVFP4: {
      float v;
      if (r->sfop == QF_MODELOPT) { /* g is wsf2 = amax/2688; no lower clamp: under 2^-10 the byte is 0 */
        v = qa_div(amax, qa_mul(6.0f, g));
        v = v == 0.0f ? 1.0f : qa_min(v, 448.0f);
      } else if (r->sfop == QF_TE) {
        v = qa_mul(amax, qa_mul(g, qa_float(QA_R6_BITS)));
      } else if (r->sfop == QF_EXACT) {
        v = qa_min(qa_mul(g, qa_div(amax, 6.0f)), 448.0f);
      } else {
        v = qa_min(qa_mul(g, qa_mul(amax, qa_float(QA_R6_BITS))), 448.0f);
      }
      uint8_t sb = qr_e4m3(v);
      if (r->sfop == QF_CT && sb == 0) sb = 0x20; /* a zero scale becomes the e4m3 eps 0.125 */
      return qr_scale_given(r, 0.0f, sb, g);
    }
    case QR_MX: {
      int emax = r->fp4 ? 2 : 8, byte;
      if (r->mop == QM_OCP) {
        byte = amax > 0.0f ? qr_floor_log2(amax) - emax + 127 : 0;
      } else if (r->mop == QM_EVEN) {
        byte = (int)(((qa_bits(amax) + 0x200000u) >> 23) & 0xffu) - emax;
      } else if (r->mop == QM_LOG_MUL) {
        byte = qa_ceil_log2(r->fp4 ? qa_mul(amax, qa_float(QA_R6_BITS)) : qa_mul(amax, qa_float(QA_R448_BITS))) + 127;
      } else {
        byte = (int)((qa_bits(qa_ceil2(qa_div(amax, r->fp4 ? 6.0f : 448.0f))) >> 23) & 0xffu);
      }
      return qr_scale_given(r, 0.0f, (uint8_t)(byte < 0 ? 0 : byte > 254 ? 254 : byte), g);
    }
    default: {
      qc_bscale b;
      b.k = 1.0f; b.div = 0; b.deq = 1.0f; b.byte = 0;
      return b;
    }
  }
}

/* The element before encoding: x / k or x * k. */
QC_HD float qr_elem(const qc_bscale *b, float x) { return b->div ? qa_div(x, b->k) : qa_mul(x, b->k); }

#endif
