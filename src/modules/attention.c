/* modules/attention.c: the production scaled-dot-product-attention VJP, as
 * the flash-attention / cuDNN backward computes it: from the output O and
 * the log-sum-exp LSE the forward saved, never a recomputed normalizer.
 *
 *   q [B, Hq, S, D], k [B, Hkv, S, D], v [B, Hkv, S, Dv] (GQA: Hq a multiple
 *   of Hkv; query head h reads kv head h / (Hq / Hkv); Dv = D but for
 *   DeepSeek's MLA: q.k over 192 = 128 + 64 rope dims, v of 128); saved out
 *   [B, Hq, S, Dv] (O) and lse [B, Hq, S]; dY = dO [B, Hq, S, Dv];
 *   c = softmax_scale (1/sqrt(D))
 *   causal: key j is visible to query i when j <= i (j <= i + k under the
 *     contract's causal_offset k; a query left with no key outputs 0)
 *   window W > 0 (causal only): and when i - j < W, i.e. i - W < j <= i
 *     (Hugging Face's sliding-window mask: W keys, the query's own included)
 *   s_ij   = c q_i.k_j; softcap m > 0: s_ij = m tanh(c q_i.k_j / m)
 *   P_ij   = exp(s_ij - LSE_i)                      lse_base = e
 *          = exp2(log2(e) s_ij - LSE_i)             lse_base = 2
 *          (no softcap: exp(c q_i.k_j - LSE_i), exp2(c log2(e) q_i.k_j - LSE_i))
 *   Delta_i = sum_d dO_id O_id, O as the backward holds it: in saved_out_dtype
 *          (auto: saved/out's own dtype), float32 products and sum, as
 *          FlashAttention-2's dot_do_o and FlashAttention-3's
 *          FlashAttnBwdPreprocess compute it from the bf16/fp16 output
 *          (docs/classes.md, attention)
 *   dS_ij  = P_ij (dO_i.v_j - Delta_i)   [softcap: x (1 - tanh^2(c q_i.k_j / m))]
 *   d_q_i  = c sum_j dS_ij k_j;  d_k_j = c sum_i dS_ij q_i;  d_v_j = sum_i P_ij dO_i
 * d_k and d_v sum over the query heads sharing a kv head. float32
 * throughout, float32 gradients. A saved O or LSE that is not the forward of
 * q, k, v under the contract (wrong base, wrong scale, stale) makes these
 * gradients wrong, and the float64 reference (which recomputes the softmax)
 * catches it. */
#include <float.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "model/modinfo.h"
#include "model/module.h"
#include "modules/classes.h"
#include "numerics/formats.h"
#include "core/qc.h"
#include "modules/mod_util.h"
#include "numerics/decode.h"

static const qc_key_spec attention_keys[] = {
    {"causal", "true|false", "true", "true: query i attends to keys j <= i"},
    {"softmax_scale", NULL, NULL, "logit scale c in softmax(c Q K^T); default 1/sqrt(head_dim)"},
    {"lse_base", "e|2", "e", "base of the saved log-sum-exp: e (natural) or 2 (log2, as some kernels store it)"},
    {"window", NULL, "0", "sliding window W (causal): query i attends keys i - W < j <= i (0: no window)"},
    {"causal_offset", NULL, "0", "causal mask diagonal k: query i attends keys j <= i + k (0: the diagonal; a query left with "
     "no key outputs 0)"},
    {"softcap", NULL, "0", "logit soft-cap m: logits m tanh(c q.k / m) before the softmax (0: none)"},
    {"saved_out_dtype", "auto|float32|bfloat16|float16", "float32", "the dtype the backward reads O in for Delta = rowsum(dO * "
     "O) (flash-attention, cuDNN: the forward's output dtype; scripts/qatdump.py records it); auto: the dtype saved/out "
     "is stored in"},
    {NULL, NULL, NULL, NULL}};

/* The tensors and sizes of an attention module. */
typedef struct {
  const qc_tensor *q, *k, *v, *o, *lse;
  int64_t B, Hq, Hkv, S, D, Dv; /* D: q and k's head_dim; Dv: v's (and O's) */
  int causal, base2;
  int64_t window; /* W: keys i - W < j <= i (0: no window) */
  int64_t coff;   /* k: the causal mask's diagonal, keys j <= i + k */
  qc_dtype odt;   /* O's dtype in Delta (saved_out_dtype): QC_F32, QC_BF16 or QC_F16 */
  double scale;
  double softcap; /* m: logits m tanh(s / m) (0: none) */
} at_view;

/* The keys query i sees: j0 <= j < (the return value), causal and window
 * applied. a: the view (S, causal, window); i in [0, S); j0 [1]: out. */
static int64_t at_keys(const at_view *a, int64_t i, int64_t *j0) {
  *j0 = a->window > 0 && i - a->window + 1 > 0 ? i - a->window + 1 : 0;
  if (!a->causal) return a->S;
  int64_t n = i + 1 + a->coff;
  return n < *j0 ? *j0 : n > a->S ? a->S : n; /* j0 == n: no key (the row is 0) */
}

/* inputs only (the forward and generator need no saved tensors) */
static int at_view_inputs(const qc_module *m, at_view *a) {
  int rc;
  memset(a, 0, sizeof *a);
  if ((rc = qc_module_need(m, "inputs", "q", 4, 4, &a->q))) return rc;
  if ((rc = qc_module_need(m, "inputs", "k", 4, 4, &a->k))) return rc;
  if ((rc = qc_module_need(m, "inputs", "v", 4, 4, &a->v))) return rc;
  a->B = a->q->shape[0];
  a->Hq = a->q->shape[1];
  a->S = a->q->shape[2];
  a->D = a->q->shape[3];
  a->Hkv = a->k->shape[1];
  if (a->k->shape[0] != a->B || a->k->shape[2] != a->S || a->k->shape[3] != a->D || a->Hkv < 1)
    return qc_err("%s: 'inputs/k' is [%lld, %lld, %lld, %lld]: expected [%lld, Hkv, %lld, %lld] (q is [B, Hq, S, D])",
                  m->path, (long long)a->k->shape[0], (long long)a->k->shape[1], (long long)a->k->shape[2],
                  (long long)a->k->shape[3], (long long)a->B, (long long)a->S, (long long)a->D);
  if (a->Hq % a->Hkv)
    return qc_err("%s: 'inputs/k' has %lld kv heads: expected a divisor of the %lld query heads of 'inputs/q' (GQA)",
                  m->path, (long long)a->Hkv, (long long)a->Hq);
  a->Dv = a->v->shape[3];
  for (int d = 0; d < 3; d++)
    if (a->v->shape[d] != a->k->shape[d] || a->Dv < 1)
      return qc_err("%s: 'inputs/v' is [%lld, %lld, %lld, %lld]: expected [B, Hkv, S, Dv] = [%lld, %lld, %lld, Dv] as "
                    "'inputs/k' but for its head_dim", m->path,
                    (long long)a->v->shape[0], (long long)a->v->shape[1], (long long)a->v->shape[2],
                    (long long)a->v->shape[3], (long long)a->B, (long long)a->Hkv, (long long)a->S);
  a->causal = strcmp(qc_contract_str(&m->contract, "causal", "true"), "true") == 0;
  a->base2 = strcmp(qc_contract_str(&m->contract, "lse_base", "e"), "2") == 0;
  a->scale = qc_contract_has(&m->contract, "softmax_scale") ? qc_contract_num(&m->contract, "softmax_scale", 0)
                                                             : 1.0 / sqrt((double)a->D);
  if (!(a->scale > 0) || !(a->scale <= FLT_MAX) || a->scale < FLT_MIN) /* the production computes in float32 */
    return qc_err("%s: contract key 'softmax_scale' is %g: expected a number > 0 within float32's normal range", m->path,
                  a->scale);
  const double w = qc_contract_num(&m->contract, "window", 0);
  if (!(w >= 0) || w != floor(w) || w > 4e18)
    return qc_err("%s: contract key 'window' is %g: expected a whole number >= 0 (0: no sliding window)", m->path, w);
  a->window = (int64_t)w;
  if (a->window > 0 && !a->causal)
    return qc_err("%s: contract key 'window' is %lld with causal = false: a sliding window is causal here "
                  "(keys i - W < j <= i); a bidirectional window is not modelled",
                  m->path, (long long)a->window);
  const double co = qc_contract_num(&m->contract, "causal_offset", 0);
  if (co != floor(co) || fabs(co) > 4e18 || (co != 0 && !a->causal))
    return qc_err("%s: contract key 'causal_offset' is %g: expected a whole number, with causal = true", m->path, co);
  a->coff = (int64_t)co;
  a->softcap = qc_contract_num(&m->contract, "softcap", 0);
  if (!(a->softcap >= 0) || !(a->softcap <= FLT_MAX) || (a->softcap > 0 && a->softcap < FLT_MIN))
    return qc_err("%s: contract key 'softcap' is %g: expected 0 (none) or a number > 0 within float32's normal range",
                  m->path, a->softcap);
  return QC_OK;
}

static int at_view_get(const qc_module *m, at_view *a) {
  int rc = at_view_inputs(m, a);
  if (rc) return rc;
  if ((rc = qc_module_need(m, "saved", "out", 4, 4, &a->o))) return rc;
  if ((rc = qc_module_need(m, "saved", "lse", 3, 3, &a->lse))) return rc;
  for (int d = 0; d < 4; d++)
    if (a->o->shape[d] != (d < 3 ? a->q->shape[d] : a->Dv))
      return qc_err("%s: 'saved/out' is [%lld, %lld, %lld, %lld]: expected [B, Hq, S, Dv] = [%lld, %lld, %lld, %lld] (q's "
                    "rows, v's head_dim)",
                    m->path, (long long)a->o->shape[0], (long long)a->o->shape[1], (long long)a->o->shape[2],
                    (long long)a->o->shape[3], (long long)a->B, (long long)a->Hq, (long long)a->S, (long long)a->Dv);
  for (int d = 0; d < 3; d++)
    if (a->lse->shape[d] != a->q->shape[d])
      return qc_err("%s: 'saved/lse' is [%lld, %lld, %lld]: expected [B, Hq, S] = [%lld, %lld, %lld]", m->path,
                    (long long)a->lse->shape[0], (long long)a->lse->shape[1], (long long)a->lse->shape[2],
                    (long long)a->B, (long long)a->Hq, (long long)a->S);
  const char *od = qc_contract_str(&m->contract, "saved_out_dtype", "float32");
  a->odt = strcmp(od, "auto") == 0 ? (a->o->dtype == QC_BF16 || a->o->dtype == QC_F16 ? a->o->dtype : QC_F32)
           : strcmp(od, "bfloat16") == 0 ? QC_BF16 : strcmp(od, "float16") == 0 ? QC_F16 : QC_F32;
  return QC_OK;
}

/* The flash backward (see the file comment): d_q [B, Hq, S, D], d_k [B, Hkv,
 * S, D], d_v [B, Hkv, S, Dv] into grads from m and dy [B, Hq, S, Dv]. cap_grad 0 drops
 * the softcap's derivative 1 - tanh^2 (the diagnosis's prediction of a
 * backward that lost it); 1 is the production. Returns a status. */
static int attention_flash(const qc_module *m, const qc_tensor *dy, qc_tset *grads, int cap_grad) {
  at_view a;
  int rc = at_view_get(m, &a);
  if (rc) return rc;
  if ((rc = qc_module_check_dy(m, dy, qc_numel(a.o), a.Dv, "the shape of saved/out [B, Hq, S, Dv]"))) return rc;
  float *q = qc_mod_f32(a.q, "attention q"), *k = qc_mod_f32(a.k, "attention k"), *v = qc_mod_f32(a.v, "attention v");
  float *o = qc_mod_f32(a.o, "attention out"), *lse = qc_mod_f32(a.lse, "attention lse"), *g = qc_mod_f32(dy, "attention dY");
  float *dq, *dk, *dv;
  rc = QC_ESYS;
  if (!q || !k || !v || !o || !lse || !g) goto done;
  for (int64_t i = 0; a.odt != QC_F32 && i < qc_numel(a.o); i++) /* O as the backward holds it */
    o[i] = a.odt == QC_BF16 ? qc_round_bf16(o[i]) : qc_f16_to_f32(qc_f32_to_f16(o[i]));
  if ((rc = qc_mod_add(grads, "d_q", QC_F32, 4, a.q->shape, (void **)&dq))) goto done;
  if ((rc = qc_mod_add(grads, "d_k", QC_F32, 4, a.k->shape, (void **)&dk))) goto done;
  if ((rc = qc_mod_add(grads, "d_v", QC_F32, 4, a.v->shape, (void **)&dv))) goto done;
  const int64_t S = a.S, D = a.D, Dv = a.Dv, group = a.Hq / a.Hkv;
  const float c = (float)a.scale, c2 = (float)(a.scale * 1.4426950408889634); /* c log2(e) */
  const float cap = (float)a.softcap, l2e = 1.4426950408889634f;
  for (int64_t b = 0; b < a.B; b++)
    for (int64_t h = 0; h < a.Hq; h++) {
      const int64_t qo = (b * a.Hq + h) * S * D, ko = (b * a.Hkv + h / group) * S * D;
      const int64_t go = (b * a.Hq + h) * S * Dv, vo = (b * a.Hkv + h / group) * S * Dv; /* dO, O; v */
      for (int64_t i = 0; i < S; i++) {
        const float *qi = q + qo + i * D, *gi = g + go + i * Dv, *oi = o + go + i * Dv;
        const float L = lse[(b * a.Hq + h) * S + i];
        float delta = 0.0f;
        for (int64_t d = 0; d < Dv; d++) delta += gi[d] * oi[d];
        int64_t j0;
        const int64_t jn = at_keys(&a, i, &j0);
        for (int64_t j = j0; j < jn; j++) {
          const float *kj = k + ko + j * D, *vj = v + vo + j * Dv;
          float s = 0.0f, dp = 0.0f;
          for (int64_t d = 0; d < D; d++) s += qi[d] * kj[d];
          for (int64_t d = 0; d < Dv; d++) dp += gi[d] * vj[d];
          float p, ds;
          if (cap > 0.0f) { /* s' = m tanh(c s / m); ds/ds' = 1 - tanh^2 */
            const float t = tanhf((c * s) / cap), sc = cap * t;
            p = a.base2 ? exp2f(l2e * sc - L) : expf(sc - L);
            ds = c * ((p * (dp - delta)) * (cap_grad ? 1.0f - t * t : 1.0f));
          } else {
            p = a.base2 ? exp2f(c2 * s - L) : expf(c * s - L);
            ds = c * (p * (dp - delta));
          }
          float *dqi = dq + qo + i * D, *dkj = dk + ko + j * D, *dvj = dv + vo + j * Dv;
          for (int64_t d = 0; d < D; d++) {
            dqi[d] += ds * kj[d];
            dkj[d] += ds * qi[d];
          }
          for (int64_t d = 0; d < Dv; d++) dvj[d] += p * gi[d];
        }
      }
    }
  rc = QC_OK;
done:
  free(q); free(k); free(v); free(o); free(lse); free(g);
  return rc;
}

/* Production VJP (see the file comment). */
static int attention_vjp(const qc_ctx *ctx, const qc_module *m, const qc_tensor *dy, qc_tset *grads) {
  (void)ctx;
  return attention_flash(m, dy, grads, 1);
}

/* float64 forward of one instance: O [B, Hq, S, Dv] and the natural LSE
 * [B, Hq, S] (either may be NULL) of the capped logits, over the keys the
 * mask and window leave. Max-subtracted softmax. q [B, Hq, S, D]; k [B,
 * Hkv, S, D]; v [B, Hkv, S, Dv]. Returns QC_OK or QC_ESYS. */
static int attention_fwd64(const at_view *a, const double *q, const double *k, const double *v, double *o, double *lse) {
  const int64_t S = a->S, D = a->D, Dv = a->Dv, group = a->Hq / a->Hkv;
  double *p = qc_malloc((size_t)S * sizeof *p, "attention probabilities");
  if (!p) return QC_ESYS;
  for (int64_t b = 0; b < a->B; b++)
    for (int64_t h = 0; h < a->Hq; h++) {
      const int64_t qo = (b * a->Hq + h) * S * D, ko = (b * a->Hkv + h / group) * S * D;
      const int64_t oo = (b * a->Hq + h) * S * Dv, vo = (b * a->Hkv + h / group) * S * Dv;
      for (int64_t i = 0; i < S; i++) {
        int64_t j0;
        const int64_t jn = at_keys(a, i, &j0);
        if (jn <= j0) { /* no visible key (a mask shifted back): the output is 0 */
          if (lse) lse[(b * a->Hq + h) * S + i] = -INFINITY;
          for (int64_t d = 0; o && d < Dv; d++) o[oo + i * Dv + d] = 0;
          continue;
        }
        double mx = -INFINITY, z = 0;
        for (int64_t j = j0; j < jn; j++) {
          double s = 0;
          for (int64_t d = 0; d < D; d++) s += q[qo + i * D + d] * k[ko + j * D + d];
          p[j] = a->scale * s;
          if (a->softcap > 0) p[j] = a->softcap * tanh(p[j] / a->softcap);
          mx = fmax(mx, p[j]);
        }
        for (int64_t j = j0; j < jn; j++) z += (p[j] = exp(p[j] - mx));
        if (lse) lse[(b * a->Hq + h) * S + i] = mx + log(z);
        if (!o) continue;
        double *oi = o + oo + i * Dv; /* each O_id summed over j in order, the rows of v read in turn */
        for (int64_t d = 0; d < Dv; d++) oi[d] = 0;
        for (int64_t j = j0; j < jn; j++)
          for (int64_t d = 0; d < Dv; d++) oi[d] += p[j] * v[vo + j * Dv + d];
        for (int64_t d = 0; d < Dv; d++) oi[d] /= z;
      }
    }
  free(p);
  return QC_OK;
}

/* Float64 forward y = O [B, Hq, S, Dv]; no discrete branch (the mask is fixed). */
static int attention_forward(const qc_module *m, const qc_module *branch, qc_tensor *y) {
  (void)branch;
  at_view a;
  int rc = at_view_inputs(m, &a);
  if (rc) return rc;
  double *q = qc_mod_f64(a.q, "attention q"), *k = qc_mod_f64(a.k, "attention k"), *v = qc_mod_f64(a.v, "attention v");
  rc = QC_ESYS;
  if (!q || !k || !v) goto done;
  const int64_t ys[4] = {a.B, a.Hq, a.S, a.Dv};
  if ((rc = qc_tensor_alloc(y, "y", QC_F64, 4, ys))) goto done;
  rc = attention_fwd64(&a, q, k, v, y->data, NULL);
done:
  free(q); free(k); free(v);
  return rc;
}

/* The error model: d_q = c dS K sums over the n visible keys, d_k = c dS^T Q
 * and d_v = P^T dO over the n queries of each of the Hq/Hkv heads sharing a
 * kv head, n = S, or min(W, S) under a sliding window W (a key is seen by
 * at most W queries of a head); float32 throughout (lambda 1; the softcap's
 * tanh and its derivative 1 - t^2 add a few ulps to each term's factor,
 * within the per-term bound). The magnitude bound for a zero reference (one
 * key: d_q = 0): |d_q_i| <= c max|k| (|dP_ij| + |Delta_i|) <= c max|k|
 * ||dO_i|| (max_j ||v_j|| + ||O_i||); the softcap factor 1 - t^2 <= 1 only
 * lowers it. m, dy (shape of saved/out), grad: the gradient's name; tm: out. */
static int attention_tol_model(const qc_module *m, const qc_tensor *dy, const char *grad, qc_tol_model *tm) {
  at_view a;
  int rc = at_view_get(m, &a);
  if (rc) return rc;
  const int64_t group = a.Hq / a.Hkv, n = a.window > 0 && a.window < a.S ? a.window : a.S;
  char win[64] = "";
  if (a.window > 0) snprintf(win, sizeof win, " (window W = %lld)", (long long)a.window);
  if (strcmp(grad, "d_q") == 0)
    qc_mod_tm(tm, n, 1, 0, 0, "d_q = c dS K sums over the n = %lld %skeys%s", (long long)n,
              a.causal ? "(at most) visible " : "", win);
  else if (strcmp(grad, "d_k") == 0 || strcmp(grad, "d_v") == 0)
    qc_mod_tm(tm, n * group, 1, 0, 0, "%s sums over the n = %lld queries%s of the %lld query heads sharing a kv head: K = %lld",
              strcmp(grad, "d_k") == 0 ? "d_k = c dS^T Q" : "d_v = P^T dO", (long long)n, win, (long long)group,
              (long long)(n * group));
  else
    return qc_err("%s: class attention has no gradient '%s'", m->path, grad);
  /* row norms of dO, v and O, for the magnitude bound */
  double *g = qc_mod_f64(dy, "attention dY"), *v = qc_mod_f64(a.v, "attention v"), *o = qc_mod_f64(a.o, "attention out");
  double gmax = 0, vmax = 0, omax = 0;
  if (g && v && o && qc_numel(dy) == qc_numel(a.o)) {
    for (int64_t r = 0; r < qc_numel(a.o) / a.Dv; r++) {
      double sg = 0, so = 0;
      for (int64_t d = 0; d < a.Dv; d++) {
        sg += g[r * a.Dv + d] * g[r * a.Dv + d];
        so += o[r * a.Dv + d] * o[r * a.Dv + d];
      }
      gmax = fmax(gmax, sqrt(sg));
      omax = fmax(omax, sqrt(so));
    }
    for (int64_t r = 0; r < qc_numel(a.v) / a.Dv; r++) {
      double sv = 0;
      for (int64_t d = 0; d < a.Dv; d++) sv += v[r * a.Dv + d] * v[r * a.Dv + d];
      vmax = fmax(vmax, sqrt(sv));
    }
    if (strcmp(grad, "d_q") == 0) tm->scale = a.scale * qc_mod_maxabs(a.k) * gmax * (vmax + omax);
    else if (strcmp(grad, "d_k") == 0) tm->scale = (double)(n * group) * a.scale * qc_mod_maxabs(a.q) * gmax * (vmax + omax);
    else tm->scale = (double)(n * group) * qc_mod_maxabs(dy);
  }
  free(g); free(v); free(o);
  return QC_OK;
}

/* Hypothesis: the saved LSE is in the other base than the contract's
 * lse_base (it is compared with the LSE recomputed from q and k); the
 * prediction is what a correct flash backward computes from that saved
 * state (the production VJP). */
static int attention_lse_base(const qc_ctx *ctx, const qc_module *m, const qc_tensor *dy, const char *grad, const qc_tensor *cand, qc_tensor *pred,
                              char *detail, size_t n) {
  (void)cand;
  at_view a;
  int rc = at_view_get(m, &a);
  if (rc) return rc;
  const int64_t rows = a.B * a.Hq * a.S;
  double *q = qc_mod_f64(a.q, "attention q"), *k = qc_mod_f64(a.k, "attention k"), *v = qc_mod_f64(a.v, "attention v");
  double *l = qc_mod_f64(a.lse, "attention lse"), *ln = qc_malloc((size_t)rows * sizeof *ln, "attention lse");
  qc_tset out = {0};
  rc = QC_ESYS;
  if (!q || !k || !v || !l || !ln) goto done;
  if ((rc = attention_fwd64(&a, q, k, v, NULL, ln))) goto done;
  /* the saved values against the natural LSE in both bases */
  const double l2e = 1.4426950408889634;
  double e_nat = 0, e_two = 0, s = 0;
  for (int64_t i = 0; i < rows; i++) {
    e_nat += (l[i] - ln[i]) * (l[i] - ln[i]);
    e_two += (l[i] - ln[i] * l2e) * (l[i] - ln[i] * l2e);
    s += ln[i] * ln[i];
  }
  int saved_two = e_two < e_nat;
  rc = QC_NA;
  if (saved_two == a.base2 || !(s > 0) || fmin(e_nat, e_two) > 1e-6 * s) goto done; /* in the contract's base, or neither */
  snprintf(detail, n, "saved/lse holds the %s LSE (rms %.2g from it) where the contract says lse_base = %s",
           saved_two ? "base-2" : "natural", sqrt(fmin(e_nat, e_two) / (double)rows), a.base2 ? "2" : "e");
  if ((rc = attention_vjp(ctx, m, dy, &out))) goto done;
  const qc_tensor *t = qc_tset_get(&out, grad);
  rc = QC_NA;
  if (!t) goto done;
  if ((rc = qc_tensor_alloc(pred, grad, QC_F64, t->ndim, t->shape)) || (rc = qc_tensor_to_f64(t, pred->data))) goto done;
  rc = QC_OK;
done:
  free(q); free(k); free(v); free(l); free(ln);
  qc_tset_free(&out);
  return rc;
}

/* Hypothesis: the causal mask applied where the contract has none, or missing. */
static int attention_flip_causal(const qc_module *m, qc_module *alt, char *detail, size_t n) {
  int causal = strcmp(qc_contract_str(&m->contract, "causal", "true"), "true") == 0;
  snprintf(detail, n, "the contract says causal = %s", causal ? "true" : "false");
  return qc_contract_set(&alt->contract, "causal", causal ? "false" : "true", 0, 0);
}

/* The causal mask's diagonal moved by `by` from the contract's. m: the
 * module; alt: its copy to alter; detail [n]: out. QC_NA without a mask. */
static int attention_shift(const qc_module *m, qc_module *alt, char *detail, size_t n, int by) {
  if (strcmp(qc_contract_str(&m->contract, "causal", "true"), "true") != 0) return QC_NA;
  const double k = qc_contract_num(&m->contract, "causal_offset", 0);
  snprintf(detail, n, "the contract says keys j <= i%+.0f", k);
  if (k == 0) detail[strlen(detail) - 2] = 0; /* "j <= i" */
  return qc_contract_set(&alt->contract, "causal_offset", "", k + by, 1);
}

/* Hypothesis: the causal mask one key later (attention_shift, +1). */
static int attention_shift_plus1(const qc_module *m, qc_module *alt, char *detail, size_t n) {
  return attention_shift(m, alt, detail, n, 1);
}

/* Hypothesis: the causal mask one key earlier (attention_shift, -1). */
static int attention_shift_minus1(const qc_module *m, qc_module *alt, char *detail, size_t n) {
  return attention_shift(m, alt, detail, n, -1);
}

/* Hypothesis: the sliding window one key wider than the contract's W (the
 * key at i - W attended: a mask j >= i - W, as `i - j <= W`). m: the module;
 * alt: its copy to alter; detail [n]: out. QC_NA without a window. */
static int attention_window_wide(const qc_module *m, qc_module *alt, char *detail, size_t n) {
  const double w = qc_contract_num(&m->contract, "window", 0);
  if (!(w >= 1)) return QC_NA;
  snprintf(detail, n, "the contract says window = %.0f (keys i - %.0f < j <= i)", w, w);
  return qc_contract_set(&alt->contract, "window", "", w + 1, 1);
}

/* Hypothesis: the sliding window one key narrower than the contract's W
 * (the key at i - W + 1 masked: `i - j < W - 1`). QC_NA for W <= 1. */
static int attention_window_narrow(const qc_module *m, qc_module *alt, char *detail, size_t n) {
  const double w = qc_contract_num(&m->contract, "window", 0);
  if (!(w >= 2)) return QC_NA;
  snprintf(detail, n, "the contract says window = %.0f (keys i - %.0f < j <= i)", w, w);
  return qc_contract_set(&alt->contract, "window", "", w - 1, 1);
}

/* Hypothesis: under a softcap, the backward lost the cap's derivative
 * (dS not multiplied by 1 - tanh^2: a detached or straight-through tanh).
 * The prediction is the flash backward without that factor. m, dy [shape
 * of q], grad: the gradient; pred: out; detail [n]: out. QC_NA without a
 * softcap or for d_v (which the factor does not reach). */
static int attention_softcap_grad(const qc_ctx *ctx, const qc_module *m, const qc_tensor *dy, const char *grad,
                                  const qc_tensor *cand, qc_tensor *pred, char *detail, size_t n) {
  (void)ctx;
  (void)cand;
  at_view a;
  int rc = at_view_get(m, &a);
  if (rc) return rc;
  if (!(a.softcap > 0) || strcmp(grad, "d_v") == 0) return QC_NA;
  qc_tset out = {0};
  if ((rc = attention_flash(m, dy, &out, 0))) goto done;
  const qc_tensor *t = qc_tset_get(&out, grad);
  rc = QC_NA;
  if (!t) goto done;
  if ((rc = qc_tensor_alloc(pred, grad, QC_F64, t->ndim, t->shape)) || (rc = qc_tensor_to_f64(t, pred->data))) goto done;
  snprintf(detail, n, "the contract says softcap = %g: dS x (1 - tanh^2(c q.k / %g)) in the backward", a.softcap, a.softcap);
  rc = QC_OK;
done:
  qc_tset_free(&out);
  return rc;
}

static const qc_hypothesis attention_hyps[] = {
    {"lse_base", "/d_q/d_k/d_v/", "the saved LSE in the wrong base (log2 read as ln, or the reverse)", NULL, 0,
     attention_lse_base, 0},
    {"causal_mask", "/d_q/d_k/d_v/", "the causal mask the other way than the contract's", attention_flip_causal, 0, NULL, 0},
    {"window_wide", "/d_q/d_k/d_v/", "the sliding window off by one: the key at i - W attended too", attention_window_wide, 0,
     NULL, 0},
    {"window_narrow", "/d_q/d_k/d_v/", "the sliding window off by one: the key at i - W + 1 masked", attention_window_narrow, 0,
     NULL, 0},
    {"causal_shift_plus1", "/d_q/d_k/d_v/", "the causal mask shifted by +1: query i attends key i + 1 too (a future token)",
     attention_shift_plus1, 0, NULL, 0},
    {"causal_shift_minus1", "/d_q/d_k/d_v/", "the causal mask shifted by -1: query i does not attend key i (its own)",
     attention_shift_minus1, 0, NULL, 0},
    {"softcap_grad", "/d_q/d_k/", "the softcap's derivative 1 - tanh^2 lost in the backward (a detached tanh)", NULL, 0,
     attention_softcap_grad, 0},
    {NULL, NULL, NULL, NULL, 0, NULL, 0}};

/* Generated attention: shape [B, Hq, Hkv, S, D] or [B, Hq, Hkv, S, D, Dv]
 * (v's head_dim, D by default). q, k, v ~ N(0,1) bf16;
 * saved out (float32) and lse (float32, in the contract's base) from the
 * float64 forward under the contract (mask, window, softcap). values = "special": query rows of
 * head 0 scaled by 64 (logits in the hundreds: the LSE formula must not
 * overflow), a zero query row (uniform attention), keys +-30 at a few
 * entries; "heavy_tail": every input divided by 0.05 + U(0,1). */
static int attention_generate(const qc_gen *gp, qc_rng *rng, qc_module *m, int *ondim, int64_t *oshape) {
  if (gp->nshape != 5 && gp->nshape != 6)
    return qc_err("attention: generate shape needs [B, Hq, Hkv, S, D] or [B, Hq, Hkv, S, D, Dv] (batch, query heads, kv "
                  "heads, sequence, head_dim, v's head_dim), got %d entries", gp->nshape);
  const int64_t B = gp->shape[0], Hq = gp->shape[1], Hkv = gp->shape[2], S = gp->shape[3], D = gp->shape[4];
  const int64_t Dv = gp->nshape == 6 ? gp->shape[5] : D;
  if (B < 1 || Hq < 1 || Hkv < 1 || S < 1 || D < 1 || Dv < 1)
    return qc_err("attention: generate shape needs B, Hq, Hkv, S, D, Dv >= 1");
  if (Hq % Hkv)
    return qc_err("attention: generate shape: Hkv = %lld kv heads must divide Hq = %lld query heads (GQA)", (long long)Hkv,
                  (long long)Hq);
  const int64_t qs[4] = {B, Hq, S, D}, ks[4] = {B, Hkv, S, D}, vs[4] = {B, Hkv, S, Dv}, os[4] = {B, Hq, S, Dv},
                ls[3] = {B, Hq, S};
  uint16_t *q, *k, *v;
  float *o, *lse;
  int rc;
  if ((rc = qc_mod_gen_bf16(&m->inputs, "q", 4, qs, rng, 1.0, &q))) return rc;
  if ((rc = qc_mod_gen_bf16(&m->inputs, "k", 4, ks, rng, 1.0, &k))) return rc;
  if ((rc = qc_mod_gen_bf16(&m->inputs, "v", 4, vs, rng, 1.0, &v))) return rc;
  if (qc_mod_special(gp)) {
    for (int64_t b = 0; b < B; b++)
      for (int64_t i = 0; i < S; i++)
        for (int64_t d = 0; d < D; d++) {
          uint16_t *x = q + ((b * Hq) * S + i) * D + d;
          *x = qc_f32_to_bf16(64.0f * qc_bf16_to_f32(*x));
        }
    if (Hq > 1 && S > 2) memset(q + (S * D + (S / 2) * D), 0, (size_t)D * sizeof *q);
    for (int64_t i = 3; i < B * Hkv * S * D; i += 41) k[i] = qc_f32_to_bf16(i % 2 ? 30.0f : -30.0f);
  } else {
    static const float none[] = {0.0f};
    qc_mod_values(gp, rng, q, B * Hq * S, D, none, 1);
    qc_mod_values(gp, rng, k, B * Hkv * S, D, none, 1);
    qc_mod_values(gp, rng, v, B * Hkv * S, Dv, none, 1);
  }
  if ((rc = qc_mod_add(&m->saved, "out", QC_F32, 4, os, (void **)&o))) return rc;
  if ((rc = qc_mod_add(&m->saved, "lse", QC_F32, 3, ls, (void **)&lse))) return rc;
  at_view a;
  if ((rc = at_view_inputs(m, &a))) return rc;
  double *qd = qc_mod_f64(a.q, "attention q"), *kd = qc_mod_f64(a.k, "attention k"), *vd = qc_mod_f64(a.v, "attention v");
  double *od = qc_malloc((size_t)(B * Hq * S * Dv) * sizeof *od, "attention out"), *ld = qc_malloc((size_t)(B * Hq * S) * sizeof *ld, "attention lse");
  rc = QC_ESYS;
  if (!qd || !kd || !vd || !od || !ld) goto done;
  if ((rc = attention_fwd64(&a, qd, kd, vd, od, ld))) goto done;
  for (int64_t i = 0; i < B * Hq * S * Dv; i++) o[i] = (float)od[i];
  for (int64_t i = 0; i < B * Hq * S; i++) lse[i] = (float)(a.base2 ? ld[i] * 1.4426950408889634 : ld[i]);
  *ondim = 4;
  memcpy(oshape, os, sizeof os);
  rc = QC_OK;
done:
  free(qd); free(kd); free(vd); free(od); free(ld);
  return rc;
}

/* ---- coverage (model/modinfo.h) ---- */

/* Tokens B S and sequence length S of q [B, H, S, D]. */
static int attention_cov_tokens(const qc_module *m, int64_t *tokens, int64_t *seqlen) {
  const qc_tensor *t = qc_tset_get(&m->inputs, "q");
  if (!t || t->ndim != 4) return 0;
  *tokens = t->shape[0] * t->shape[2];
  *seqlen = t->shape[2];
  return 1;
}

/* A causal mask. */
static void attention_cov_facts(const qc_module *m, const qc_modinfo *mi, uint32_t *cover) {
  (void)m;
  if (!strstr(mi->contract, "\"causal\":\"false\"") && !strstr(mi->contract, "\"causal\": \"false\""))
    *cover |= 1u << QC_COV_MASK;
}

static const qc_class_cov attention_cov[] = {
    {.item = "context_lengths"},
    {.item = "mask", .how = "a causal mask"},
    {NULL, NULL, NULL},
};

/* The class's reading of m for the engine's validation (qc_module_validate). */
static int attention_validate(const qc_module *m, const qc_tensor *dy) {
  at_view a;
  int rc = at_view_get(m, &a);
  return rc ? rc : qc_module_check_dy(m, dy, qc_numel(a.o), a.Dv, "the shape of saved/out [B, Hq, S, Dv]");
}

const qc_class qc_class_attention = {
    .name = "attention",
    .summary = "scaled dot-product attention (causal, sliding window, softcap, GQA) from the saved O and LSE, flash-attention style: d_q, d_k, d_v",
    .bf16_gemm = 1,
    .tensors = "inputs/q inputs/k inputs/v saved/out saved/lse outputs/y",
    .grads = "d_q d_k d_v",
    .shape_help = "[B, Hq, Hkv, S, D] or [B, Hq, Hkv, S, D, Dv]: batch, query heads, kv heads, sequence, head_dim, v's "
                  "head_dim (MLA: D 192, Dv 128)",
    .keys = attention_keys,
    .generate = attention_generate,
    .production = attention_vjp,
    .not_checked = "saved/out, saved/lse: the forward's saved results, not inputs (no gradient; judged against the forward "
                   "recomputed from q, k, v, and through the gradients they feed)",
    .forward = attention_forward,
    .fd_shape = "2,4,2,5,6",
    .tol_model = attention_tol_model,
    .validate = attention_validate,
    .hypotheses = "factor sign rows zero slice dy_precision nonfinite",
    .hyps = attention_hyps,
    .coverage = attention_cov,
    .cov_tokens = attention_cov_tokens,
    .cov_facts = attention_cov_facts,
};
