/* reference/attention.c: the float64 VJP of scaled dot-product attention,
 * from the math, with its own softmax.
 *
 * Query head h of batch b reads kv head h / (Hq / Hkv); q and k have head_dim
 * D, v and O their own Dv (DeepSeek's MLA: 192 and 128). For query i:
 *   r_ij = c q_i.k_j (the raw logit),
 *   s_ij = r_ij, or m tanh(r_ij / m) under a softcap m > 0,
 *   over the visible keys: j <= i + k when causal (k the contract's causal_offset,
 *   0 by default; a query left with no key gives 0), else all; under a
 *   sliding window W > 0 only the W most recent of them, i - j < W,
 *   P_ij = exp(s_ij - max_j s) / sum_l exp(s_il - max_l s),
 *   O_i  = sum_j P_ij v_j.
 * The chain rule, with g = dO:
 *   dL/dP_ij = g_i.v_j
 *   dL/ds_ij = P_ij (dL/dP_ij - sum_l P_il dL/dP_il)   (the softmax Jacobian)
 *   dL/dr_ij = dL/ds_ij ds/dr, ds/dr = 1 - tanh(r_ij / m)^2 (1 without a cap)
 *   d_q_i = c sum_j dL/dr_ij k_j;  d_k_j += c dL/dr_ij q_i;  d_v_j += P_ij g_i
 * summed over every query head of a kv head's group. The saved out and lse
 * are required to be present and well-shaped (they belong to the module),
 * but not read: the reference recomputes the softmax, so a wrongly saved
 * O or LSE (base, scale, a stale forward) shows up as a gradient mismatch.
 * One exception, O held in 16 bits: the flash backward's Delta_i =
 * sum_d dO_id O_id reads O as the forward returned it (FlashAttention-2's
 * dot_do_o, FlashAttention-3's FlashAttnBwdPreprocess: the bf16 or fp16
 * output converted to float32), so under the contract's saved_out_dtype
 * bfloat16 or float16 (auto, the default: the dtype saved/out is stored in) the
 * softmax Jacobian's row term sum_l P_il dL/dP_il = dO_i.O_i takes O_i
 * rounded to that dtype: the reference's own O, rounded to nearest, or
 * the saved O's value where that is the other of the two dtype values
 * around the exact O (a float32 O a few ulps off rounds to either); any
 * other saved value is not used, so an O further off still fails.
 * The terms' scale (ctx->terms): the same chain over the terms'
 * magnitudes, P_ij from the forward: |dL/dP_ij| -> sum_d |g_i||v_j|, the
 * row's sum_l P_il |dL/dP_il| added, not subtracted, and P_ij's own error:
 * its exponent s_ij - max is a difference whose float32 error is u w_ij,
 * w_ij = 1 + c sum_d |q_i||k_j| + |max| (the logit's terms), so
 *   T(dL/ds_ij) = P_ij (sum_d |g_i||v_j| + sum_l P_il sum_d |g_i||v_l|
 *                 + w_ij |dL/dP_ij - sum_l P_il dL/dP_il|) |ds/dr|
 *   T(d_q_i) = c sum_j T(dL/ds_ij) |k_j|, T(d_k_j) = c sum_i T(dL/ds_ij) |q_i|,
 *   T(d_v_j) = sum_i P_ij w_ij |g_i|.
 * A d_q that is zero in exact arithmetic (keys sharing a large common
 * part, as a k_proj bias: sum_j dL/ds_ij = 0 cancels it) keeps the scale
 * of the common part's terms. The products (q.k, g.v, dS K, dS^T Q, P^T g,
 * P v and their magnitudes' twins) run as float64 GEMMs on the audit's
 * backend, a block of query rows at a time (reference/attention_gemm.c);
 * on a device that has the row passes, with every operand in its buffers
 * and the rows there too (reference/attention_dev.c). */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend/backend.h"
#include "model/module.h"
#include "reference/ref_attention.h"
#include "reference/ref_classes.h"
#include "core/qc.h"
#include "numerics/formats.h"
#include "numerics/metrics.h"
#include "reference/ref_util.h"

/* 1 when a [4 dims] has shape s [4]. */
static int same4(const qc_tensor *a, const int64_t *s) {
  return a->shape[0] == s[0] && a->shape[1] == s[1] && a->shape[2] == s[2] && a->shape[3] == s[3];
}

/* m's q [B, Hq, S, D], k [B, Hkv, S, D] and v [B, Hkv, S, Dv] into *qt,
 * *kt, *vt, checked against each other (Hkv dividing Hq). QC_OK, or
 * QC_EINPUT naming the tensor and the shape expected. */
static int need_qkv(const qc_module *m, const qc_tensor **qt, const qc_tensor **kt, const qc_tensor **vt) {
  int rc;
  if ((rc = qc_module_need(m, "inputs", "q", 4, 4, qt))) return rc;
  if ((rc = qc_module_need(m, "inputs", "k", 4, 4, kt))) return rc;
  if ((rc = qc_module_need(m, "inputs", "v", 4, 4, vt))) return rc;
  const int64_t B = (*qt)->shape[0], Hq = (*qt)->shape[1], S = (*qt)->shape[2], D = (*qt)->shape[3], Hkv = (*kt)->shape[1];
  const int64_t Dv = (*vt)->shape[3], kvs[4] = {B, Hkv, S, D}, vs[4] = {B, Hkv, S, Dv};
  if (!same4(*kt, kvs) || Hkv < 1 || Hq % Hkv)
    return qc_err("%s: 'inputs/k': expected [%lld, Hkv, %lld, %lld] with Hkv dividing the %lld query heads", m->path,
                  (long long)B, (long long)S, (long long)D, (long long)Hq);
  if (Dv < 1 || !same4(*vt, vs))
    return qc_err("%s: 'inputs/v': expected [%lld, %lld, %lld, Dv]: the shape of 'inputs/k' but for its head_dim", m->path,
                  (long long)B, (long long)Hkv, (long long)S);
  return QC_OK;
}

/* The dtype the backward holds O in for Delta: the contract's
 * saved_out_dtype (default float32: an eager backward's O), or under auto
 * the dtype saved/out ot is stored in (bfloat16, float16; anything else float32). QC_OK, or QC_EINPUT for another value. */
static int out_dtype(const qc_module *m, const qc_tensor *ot, qc_dtype *odt) {
  const char *s = qc_contract_str(&m->contract, "saved_out_dtype", "float32");
  if (strcmp(s, "auto") == 0) {
    *odt = ot->dtype == QC_BF16 || ot->dtype == QC_F16 ? ot->dtype : QC_F32;
    return QC_OK;
  }
  if (strcmp(s, "float32") == 0) *odt = QC_F32;
  else if (strcmp(s, "bfloat16") == 0) *odt = QC_BF16;
  else if (strcmp(s, "float16") == 0) *odt = QC_F16;
  else return qc_err("%s: contract key 'saved_out_dtype' = '%s': expected auto, float32, bfloat16 or float16", m->path, s);
  return QC_OK;
}

/* The reference VJP (see the file comment): d_q [B, Hq, S, D], d_k [B, Hkv,
 * S, D], d_v [B, Hkv, S, Dv] into grads from m's q, k, v and dy [B, Hq, S,
 * Dv]; QC_EINPUT for bad shapes or contract values. */
static int ref_attention(const qc_ctx *ctx, const qc_module *m, const qc_tensor *dy, qc_tset *grads) {
  const int ab = ctx && ctx->terms;
  const qc_tensor *qt, *kt, *vt, *ot, *lt;
  int rc;
  if ((rc = need_qkv(m, &qt, &kt, &vt))) return rc;
  if ((rc = qc_module_need(m, "saved", "out", 4, 4, &ot))) return rc;
  if ((rc = qc_module_need(m, "saved", "lse", 3, 3, &lt))) return rc;
  const int64_t B = qt->shape[0], Hq = qt->shape[1], S = qt->shape[2], D = qt->shape[3], Hkv = kt->shape[1];
  const int64_t Dv = vt->shape[3], os[4] = {B, Hq, S, Dv};
  if (!same4(ot, os))
    return qc_err("%s: 'saved/out': expected [%lld, %lld, %lld, %lld]: the rows of 'inputs/q', the head_dim of 'inputs/v'",
                  m->path, (long long)B, (long long)Hq, (long long)S, (long long)Dv);
  if (lt->shape[0] != B || lt->shape[1] != Hq || lt->shape[2] != S)
    return qc_err("%s: 'saved/lse': expected [%lld, %lld, %lld]", m->path, (long long)B, (long long)Hq, (long long)S);
  if ((rc = qc_module_check_dy(m, dy, B * Hq * S * Dv, Dv, "the shape of saved/out [B, Hq, S, Dv]"))) return rc;
  const qc_contract *c = &m->contract;
  const int causal = strcmp(qc_contract_str(c, "causal", "true"), "false") != 0;
  const double sc = qc_contract_has(c, "softmax_scale") ? qc_contract_num(c, "softmax_scale", 0) : 1.0 / sqrt((double)D);
  if (!(sc > 0) || !isfinite(sc)) return qc_err("%s: contract key 'softmax_scale' = %g: expected > 0", m->path, sc);
  const double wd = qc_contract_num(c, "window", 0), cap = qc_contract_num(c, "softcap", 0);
  if (!(wd >= 0) || floor(wd) != wd || wd > 4e18)
    return qc_err("%s: contract key 'window' = %g: expected a whole number >= 0", m->path, wd);
  const int64_t W = (int64_t)wd; /* 0: no window */
  if (W > 0 && !causal) return qc_err("%s: contract key 'window' = %lld: needs causal = true", m->path, (long long)W);
  const double cod = qc_contract_num(c, "causal_offset", 0);
  if (floor(cod) != cod || fabs(cod) > 4e18 || (cod != 0 && !causal))
    return qc_err("%s: contract key 'causal_offset' = %g: expected a whole number, with causal = true", m->path, cod);
  const int64_t off = (int64_t)cod; /* the mask's diagonal: keys j <= i + off */
  if (!(cap >= 0) || !isfinite(cap)) return qc_err("%s: contract key 'softcap' = %g: expected >= 0", m->path, cap);
  const char *base = qc_contract_str(c, "lse_base", "e");
  if (strcmp(base, "e") != 0 && strcmp(base, "2") != 0)
    return qc_err("%s: contract key 'lse_base' = '%s': expected e or 2", m->path, base);
  qc_dtype odt = QC_F32;
  if ((rc = out_dtype(m, ot, &odt))) return rc;
  double *Q = NULL, *K = NULL, *V = NULL, *G = NULL, *O = NULL, *dq, *dk, *dv;
  rc = QC_ESYS;
  if (!(Q = qc_refu_load(qt, "reference attention q")) || !(K = qc_refu_load(kt, "reference attention k")) ||
      !(V = qc_refu_load(vt, "reference attention v")) || !(G = qc_refu_load(dy, "reference attention dY")) ||
      (odt != QC_F32 && !ab && !(O = qc_refu_load(ot, "reference attention saved out"))))
    goto done;
  if ((rc = qc_refu_out(grads, "d_q", 4, qt->shape, &dq))) goto done;
  if ((rc = qc_refu_out(grads, "d_k", 4, kt->shape, &dk))) goto done;
  if ((rc = qc_refu_out(grads, "d_v", 4, vt->shape, &dv))) goto done;
  {
    const qc_ref_att a = {.be = ctx && ctx->be ? ctx->be : qc_backend_cpu(), .Q = Q, .K = K, .V = V, .G = G, .O = O,
                          .B = B, .Hq = Hq, .Hkv = Hkv, .S = S, .D = D, .Dv = Dv, .W = W, .off = off, .sc = sc,
                          .cap = cap, .causal = causal, .ab = ab, .odt = odt};
    if ((rc = qc_ref_att_vjp_dev(&a, dq, dk, dv)) == QC_NA) rc = qc_ref_att_vjp(&a, dq, dk, dv); /* the device's rows, or the host's */
  }
done:
  free(Q); free(K); free(V); free(G); free(O);
  return rc;
}

/* O [B, Hq, S, Dv] (lse 0) or the natural LSE [B, Hq, S] (lse 1) of m
 * recomputed from q, k, v under the contract (mask, window, softcap,
 * scale) into r (float64, named `name`), from the math above: O_i = sum_j
 * P_ij v_j and LSE_i = log sum_j exp(s_ij) over the visible keys; a query
 * with no visible key has O_i = 0 and no LSE (-inf: the log of an empty
 * sum). A (lse 1, [B, Hq, S]) gets the LSE's terms, |max| + c max_j
 * sum_d |q_id k_jd| + 1 per query. QC_OK, or QC_EINPUT naming what is
 * wrong, or QC_ESYS. */
static int recompute(const qc_ctx *ctx, const qc_module *m, int lse, const char *name, qc_tensor *r, double *A) {
  const qc_tensor *qt, *kt, *vt;
  int rc;
  if ((rc = need_qkv(m, &qt, &kt, &vt))) return rc;
  const int64_t B = qt->shape[0], Hq = qt->shape[1], S = qt->shape[2], D = qt->shape[3], Hkv = kt->shape[1];
  const int64_t Dv = vt->shape[3], os[4] = {B, Hq, S, Dv};
  const qc_contract *c = &m->contract;
  const int causal = strcmp(qc_contract_str(c, "causal", "true"), "false") != 0;
  const double sc = qc_contract_has(c, "softmax_scale") ? qc_contract_num(c, "softmax_scale", 0) : 1.0 / sqrt((double)D);
  const double wd = qc_contract_num(c, "window", 0), cap = qc_contract_num(c, "softcap", 0);
  const double cod = qc_contract_num(c, "causal_offset", 0);
  if (!(sc > 0) || !isfinite(sc) || !(wd >= 0) || floor(wd) != wd || wd > 4e18 || floor(cod) != cod || fabs(cod) > 4e18 ||
      !(cap >= 0) || !isfinite(cap))
    return qc_err("%s: the contract's softmax_scale, window, causal_offset or softcap is out of range", m->path);
  const int64_t W = (int64_t)wd, off = causal ? (int64_t)cod : 0;
  if (W > 0 && !causal) return qc_err("%s: contract key 'window' = %lld: needs causal = true", m->path, (long long)W);
  double *Q = NULL, *K = NULL, *V = NULL;
  rc = QC_ESYS;
  if (!(Q = qc_refu_load(qt, "reference attention q")) || !(K = qc_refu_load(kt, "reference attention k")) ||
      !(V = qc_refu_load(vt, "reference attention v")))
    goto done;
  if ((rc = qc_tensor_alloc(r, name, QC_F64, lse ? 3 : 4, os))) goto done;
  {
    const qc_ref_att a = {.be = ctx && ctx->be ? ctx->be : qc_backend_cpu(), .Q = Q, .K = K, .V = V, .B = B, .Hq = Hq,
                          .Hkv = Hkv, .S = S, .D = D, .Dv = Dv, .W = W, .off = off, .sc = sc, .cap = cap,
                          .causal = causal};
    if ((rc = qc_ref_att_fwd_dev(&a, lse, r->data, A)) == QC_NA) rc = qc_ref_att_fwd(&a, lse, r->data, A);
  }
done:
  if (rc) qc_tensor_free(r);
  free(Q); free(K); free(V);
  return rc;
}

/* The saved O ("out", [B, Hq, S, Dv]) or LSE ("lse", [B, Hq, S], in the
 * contract's lse_base) recomputed (recompute above). The error model: O's
 * is the forward check's (tm->k 0, as outputs/y, which O is); the LSE's,
 * the logits' reduction over D products and the sum over the n visible
 * keys (K the larger), its terms per query in the saved base. QC_NA for
 * another name. (a qc_saved_ref_fn) */
static int ref_attention_saved(const qc_ctx *ctx, const qc_module *m, const char *name, qc_tensor *r, qc_tol_model *tm) {
  const qc_tensor *qt, *kt, *vt, *st;
  const int lse = strcmp(name, "lse") == 0;
  int rc;
  memset(tm, 0, sizeof *tm);
  if (!lse && strcmp(name, "out") != 0) return QC_NA;
  if ((rc = need_qkv(m, &qt, &kt, &vt))) return rc;
  if ((rc = qc_module_need(m, "saved", name, lse ? 3 : 4, lse ? 3 : 4, &st))) return rc;
  const int64_t B = qt->shape[0], Hq = qt->shape[1], S = qt->shape[2], D = qt->shape[3];
  const int64_t Dv = vt->shape[3], os[4] = {B, Hq, S, Dv};
  if (lse ? st->shape[0] != B || st->shape[1] != Hq || st->shape[2] != S : !same4(st, os))
    return qc_err("%s: 'saved/%s': expected the shape [B, Hq, S%s] of the rows of 'inputs/q'", m->path, name, lse ? "" : ", Dv");
  const double wd = qc_contract_num(&m->contract, "window", 0);
  const int base2 = strcmp(qc_contract_str(&m->contract, "lse_base", "e"), "2") == 0;
  const double unit = base2 ? 1.4426950408889634 : 1.0; /* the saved base: log2 x = ln x log2(e) */
  double *A = NULL, tt = 0, tmax = 0;
  if (lse && !(A = qc_calloc((size_t)(B * Hq * S), sizeof *A, "reference LSE terms"))) return QC_ESYS;
  if ((rc = recompute(ctx, m, lse, name, r, A))) goto done;
  double *out = r->data;
  for (int64_t i = 0; lse && i < B * Hq * S; i++) { /* in the saved base; the terms summed in the order of one loop */
    out[i] *= unit;
    A[i] *= unit;
    tt += A[i] * A[i];
    tmax = fmax(tmax, A[i]);
  }
  if (lse) {
    const int64_t W = (int64_t)wd, n = W > 0 && W < S ? W : S, kk = n > D ? n : D;
    tm->k = kk;
    tm->lambda = 1;
    tm->terms = sqrt(tt);
    tm->scale = tmax;
    snprintf(tm->why, sizeof tm->why, "LSE = max + log sum exp of the logits c q.k, each a reduction over D = %lld products, "
             "summed over up to n = %lld visible keys: K = %lld; terms |max| + c sum |q||k| + 1 per query", (long long)D,
             (long long)n, (long long)kk);
  }
done:
  free(A);
  return rc;
}

/* The forward the contract defines, y = O [B, Hq, S, Dv] (recompute
 * above: the products as float64 GEMMs on the audit's backend, where the
 * class's own float64 forward loops over every logit on one thread: at
 * 128 heads of 4,096 tokens it would take minutes); the error model left
 * to the forward check's (tm->k 0), as the class's forward's was. QC_NA
 * under a variant that rounds the class's ops or scales its weights: there
 * is no such rounding in this forward. (a qc_fwd_ref_fn) */
static int ref_attention_forward(const qc_ctx *ctx, const qc_module *m, qc_tensor *y, qc_tol_model *tm) {
  memset(tm, 0, sizeof *tm);
  if (ctx && (ctx->round_ops || ctx->wscale > 0)) return QC_NA;
  return recompute(ctx, m, 0, "y", y, NULL);
}

/* The class's reference, its one export (src/classes/registry.c pairs it
 * with src/modules/attention.c). */
const qc_reference qc_reference_attention = {.vjp = ref_attention, .forward = ref_attention_forward, .saved = ref_attention_saved,
                                              .terms = 1};
