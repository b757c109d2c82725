/* modules/moe.c: the production routed-experts VJP with top-k ids fixed from
 * the forward, as DS4/Nemotron wrote it (the glue of case C): sort the
 * (token, slot) pairs by expert, grouped GEMMs through the candidate GEMM
 * (bf16 operands, fp32 accumulation), the closed-form activation derivative
 * in float32, restore to token order, sum over the top-k slots.
 *
 *   x [T, H], topk_ids [T, k] (saved, discrete), topk_weights [T, k]
 *   w1 [E, 2F, H] (swiglu: gate rows 0..F-1, up rows F..2F-1) or [E, F, H]
 *   (relu2), w2 [E, H, F]
 *   forward  per slot (t, j), e = ids[t, j]:
 *            h = w1[e] x_t, a = act(h), y = w2[e] a, out_t = sum_j w[t,j] y
 *   VJP      d_topk_weights[t, j] = <dy_t, y>
 *            g = w[t,j] dy_t;  d_w2[e] += g a^T;  d_a = w2[e]^T g
 *            d_h = act'(h) d_a;  d_w1[e] += d_h x_t^T;  d_x_t += w1[e]^T d_h
 * Per expert, the rows of its (token, slot) pairs are gathered (the sort),
 * every product above is one GEMM over the group, and d_x is scattered back
 * through the permutation with accumulation: a token routed to the same
 * expert twice gets both contributions. An expert no token selects gets a
 * zero d_w1, d_w2. The GEMM operands a trainer holds in bf16 are rounded to
 * bf16 (x, weights, dY as given; a, w g and d_h rounded from float32); the
 * gradients are returned in float32. The ids are never differentiated. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend/backend.h"
#include "model/modinfo.h"
#include "model/module.h"
#include "modules/classes.h"
#include "numerics/formats.h"
#include "core/qc.h"
#include "modules/mod_util.h"
#include "numerics/decode.h"
#include "numerics/quant.h"

static const qc_key_spec moe_keys[] = {
    {"activation", "swiglu|relu2", "swiglu", "expert activation: silu(gate) * up (w1 [E, 2F, H]) or relu(h)^2 (w1 [E, F, H])"},
    {"limit", NULL, "0", "swiglu clamp limit L: gate <= L, -L <= up <= L (0: no clamp; as the swiglu class)"},
    {"at_limit", "pass|block", "pass", "clamp derivative at exactly +-L: 1 (pass, torch.clamp) or 0 (block)"},
    {"shared_experts", NULL, "0", "S > 0: a dense shared-expert MLP (params/shared_w1 [2Fs|Fs, H], params/shared_w2 [H, Fs], "
     "S experts concatenated, Fs a multiple of S, the routed activation) added to every token's output"},
    {"shared_gate", "true|false", "false", "true: the shared output scaled by sigmoid(x . params/shared_gate [1, H] or [H]) "
     "(Qwen2-MoE); false: added unweighted (DeepSeek-V3)"},
    {"expert_weight_format", QC_WEIGHT_FORMATS, "none", "how the forward quantized each routed expert's weights: w1[e] [R, H] "
     "and w2[e] [H, F] each a matrix of its own, as linear's weight_format (deployed bytes: saved/w1_q, w2_q per expert)"},
    {"expert_act_format", QC_ACT_FORMATS, "none", "how the forward quantized the experts' inputs: each token's row of x into "
     "w1 and of act(h) into w2, as linear's activation_format"},
    {"dx_weight", "dequant|master", "dequant", "expert weights of the backward's grouped GEMMs (d_a = W2^T w dY, d_x += W1^T d_h): "
     "dequant(quant(W)) or the master W; d_w1, d_w2 take x and act(h) unquantized (straight-through)"},
    {"profile", QC_PROFILE_CHOICES, "vllm", "quantizer profile of the expert formats (auto: identified from the deployed bytes)"},
    {NULL, NULL, NULL, NULL}};

/* The tensors and settings of a moe module. */
typedef struct {
  const qc_tensor *x, *w1, *w2, *wt, *ids;
  const qc_tensor *sw1, *sw2, *sg; /* shared experts (NULL when S = 0), gate (NULL unless gated) */
  int64_t T, H, F, E, k, R; /* R: rows of w1 per expert (2F swiglu, F relu2) */
  int64_t S, Fs, Rs;        /* shared experts, their concatenated intermediate, rows of shared_w1 */
  int swiglu, block;
  double L;
  const char *wfmt, *afmt, *prof; /* expert_weight_format, expert_act_format, profile */
  int dx_master;                  /* dx_weight = master */
  const qc_tensor *fc1;           /* saved/fc1_out [T, k, R] or [T k, R], or NULL: recomputed */
  int64_t *id; /* [T*k], checked in [0, E) */
} moe_view;

/* The shared-expert part of v (v's routed shapes already read): under
 * shared_experts = S > 0, params/shared_w1 [Rs, H] (Rs = 2Fs swiglu, Fs
 * relu2) and params/shared_w2 [H, Fs] with Fs a multiple of S; under
 * shared_gate = true, params/shared_gate [1, H] or [H]. A shared tensor the
 * contract does not use is refused, never ignored. Returns a status. */
static int moe_shared_get(const qc_module *m, moe_view *v) {
  int rc;
  char s1[64];
  const double S = qc_contract_num(&m->contract, "shared_experts", 0);
  const char *gs = qc_contract_str(&m->contract, "shared_gate", "false");
  if (!(S >= 0) || S != floor(S) || S > 1e6)
    return qc_err("%s: contract key 'shared_experts' is %g: expected a whole number >= 0 (0: none)", m->path, S);
  if (strcmp(gs, "true") != 0 && strcmp(gs, "false") != 0)
    return qc_err("%s: contract key 'shared_gate' is '%s': expected true or false", m->path, gs);
  v->S = (int64_t)S;
  const int gated = strcmp(gs, "true") == 0;
  if (v->S == 0) {
    static const char *const names[] = {"shared_w1", "shared_w2", "shared_gate"};
    for (int i = 0; i < 3; i++)
      if (qc_tset_get(&m->params, names[i])) {
        qc_hint("set the contract's shared_experts to the number of shared experts to judge with them, or leave them out of the dump");
        return qc_err("%s: dataset 'params/%s' is present but the contract's shared_experts is 0: the shared experts would be ignored",
                      m->path, names[i]);
      }
    if (gated) return qc_err("%s: contract key 'shared_gate' is true but shared_experts is 0: there is no shared expert to gate", m->path);
    return QC_OK;
  }
  if ((rc = qc_module_need(m, "params", "shared_w1", 2, 2, &v->sw1))) return rc;
  if ((rc = qc_module_need(m, "params", "shared_w2", 2, 2, &v->sw2))) return rc;
  v->Fs = v->sw2->shape[1];
  v->Rs = v->swiglu ? 2 * v->Fs : v->Fs;
  if (v->sw2->shape[0] != v->H || v->Fs < 1 || v->Fs % v->S != 0)
    return qc_err("%s: 'params/shared_w2' is %s: expected [H, Fs] with H = %lld and Fs a multiple of shared_experts = %lld",
                  m->path, qc_shape_str(v->sw2->ndim, v->sw2->shape, s1, sizeof s1), (long long)v->H, (long long)v->S);
  if (v->sw1->shape[0] != v->Rs || v->sw1->shape[1] != v->H)
    return qc_err("%s: 'params/shared_w1' is %s: expected [%lld, %lld] ([%s, H]) for activation %s", m->path,
                  qc_shape_str(v->sw1->ndim, v->sw1->shape, s1, sizeof s1), (long long)v->Rs, (long long)v->H,
                  v->swiglu ? "2Fs" : "Fs", v->swiglu ? "swiglu" : "relu2");
  if (gated) {
    if ((rc = qc_module_need(m, "params", "shared_gate", 1, 2, &v->sg))) return rc;
    if (qc_numel(v->sg) != v->H || v->sg->shape[v->sg->ndim - 1] != v->H)
      return qc_err("%s: 'params/shared_gate' is %s: expected [1, H] or [H] with H = %lld", m->path,
                    qc_shape_str(v->sg->ndim, v->sg->shape, s1, sizeof s1), (long long)v->H);
  } else if (qc_tset_get(&m->params, "shared_gate")) {
    qc_hint("set the contract's shared_gate to true to judge with it, or leave it out of the dump");
    return qc_err("%s: dataset 'params/shared_gate' is present but the contract's shared_gate is false: the gate would be ignored", m->path);
  }
  return QC_OK;
}

static int moe_view_get(const qc_module *m, moe_view *v) {
  int rc;
  char s1[64];
  memset(v, 0, sizeof *v);
  if ((rc = qc_module_need(m, "inputs", "x", 2, 2, &v->x))) return rc;
  if ((rc = qc_module_need(m, "params", "w1", 3, 3, &v->w1))) return rc;
  if ((rc = qc_module_need(m, "params", "w2", 3, 3, &v->w2))) return rc;
  if ((rc = qc_module_need(m, "saved", "topk_ids", 2, 2, &v->ids))) return rc;
  const char *wrole = qc_tset_get(&m->inputs, "topk_weights") ? "inputs" : "saved";
  if ((rc = qc_module_need(m, wrole, "topk_weights", 1, QC_MAXDIM, &v->wt))) return rc;
  const char *act = qc_contract_str(&m->contract, "activation", "swiglu");
  v->swiglu = strcmp(act, "relu2") != 0;
  if (strcmp(act, "swiglu") != 0 && strcmp(act, "relu2") != 0)
    return qc_err("%s: contract key 'activation' is '%s': expected swiglu or relu2", m->path, act);
  v->L = qc_contract_num(&m->contract, "limit", 0);
  v->block = strcmp(qc_contract_str(&m->contract, "at_limit", "pass"), "block") == 0;
  if (!(v->L >= 0)) return qc_err("%s: contract key 'limit' is %g: expected >= 0 (0: no clamp)", m->path, v->L);
  if (v->L > 0 && !v->swiglu) return qc_err("%s: contract key 'limit' is %g: the clamp applies to activation swiglu only", m->path, v->L);
  v->T = v->x->shape[0];
  v->H = v->x->shape[1];
  v->E = v->w2->shape[0];
  v->F = v->w2->shape[2];
  v->k = v->ids->shape[1];
  v->R = v->swiglu ? 2 * v->F : v->F;
  if (v->w2->shape[1] != v->H || v->E < 1 || v->F < 1)
    return qc_err("%s: 'params/w2' is %s: expected [E, H, F] with H = %lld (inputs/x [T, H])", m->path,
                  qc_shape_str(v->w2->ndim, v->w2->shape, s1, sizeof s1), (long long)v->H);
  if (v->w1->shape[0] != v->E || v->w1->shape[1] != v->R || v->w1->shape[2] != v->H)
    return qc_err("%s: 'params/w1' is %s: expected [%lld, %lld, %lld] ([E, %s, H]) for activation %s", m->path,
                  qc_shape_str(v->w1->ndim, v->w1->shape, s1, sizeof s1), (long long)v->E, (long long)v->R,
                  (long long)v->H, v->swiglu ? "2F" : "F", act);
  if (v->ids->shape[0] != v->T || v->k < 1)
    return qc_err("%s: 'saved/topk_ids' is %s: expected [%lld, k] (T = %lld tokens of inputs/x)", m->path,
                  qc_shape_str(v->ids->ndim, v->ids->shape, s1, sizeof s1), (long long)v->T, (long long)v->T);
  if (v->wt->ndim != 2 || v->wt->shape[0] != v->T || v->wt->shape[1] != v->k)
    return qc_err("%s: '%s/topk_weights' is %s: expected [T, k] = [%lld, %lld] (the shape of saved/topk_ids)", m->path,
                  wrole, qc_shape_str(v->wt->ndim, v->wt->shape, s1, sizeof s1), (long long)v->T, (long long)v->k);
  if ((rc = moe_shared_get(m, v))) return rc;
  v->wfmt = qc_contract_str(&m->contract, "expert_weight_format", "none");
  v->afmt = qc_contract_str(&m->contract, "expert_act_format", "none");
  v->prof = qc_contract_str(&m->contract, "profile", "vllm"); /* auto is resolved from the deployed bytes before any VJP */
  if (strcmp(v->prof, "auto") == 0) v->prof = "vllm";
  v->dx_master = strcmp(qc_contract_str(&m->contract, "dx_weight", "dequant"), "master") == 0;
  if ((v->fc1 = qc_tset_get(&m->saved, "fc1_out"))) {
    const qc_tensor *h = v->fc1;
    const int ok = (h->ndim == 3 && h->shape[0] == v->T && h->shape[1] == v->k && h->shape[2] == v->R) ||
                   (h->ndim == 2 && h->shape[0] == v->T * v->k && h->shape[1] == v->R);
    if (!ok)
      return qc_err("%s: 'saved/fc1_out' is %s: expected the FC1 output of every (token, slot) pair, [T, k, R] = [%lld, %lld, %lld] "
                    "or [T k, R]", m->path, qc_shape_str(h->ndim, h->shape, s1, sizeof s1), (long long)v->T, (long long)v->k,
                    (long long)v->R);
    if (!qc_dtype_is_float(h->dtype) || h->dtype == QC_E2M1X2)
      return qc_err("%s: 'saved/fc1_out' has element type %s: expected a float tensor", m->path, qc_dtype_name(h->dtype));
  }
  if ((rc = qc_mod_ids(m, v->ids, "saved/topk_ids", &v->id))) return rc;
  for (int64_t i = 0; i < v->T * v->k; i++)
    if (v->id[i] < 0 || v->id[i] >= v->E) {
      rc = qc_err("%s: 'saved/topk_ids'[%lld, %lld] is %lld: expected an expert 0..%lld", m->path,
                  (long long)(i / v->k), (long long)(i % v->k), (long long)v->id[i], (long long)v->E - 1);
      free(v->id);
      v->id = NULL;
      return rc;
    }
  return QC_OK;
}

/* 1 when value z lies where the clamp to [lo, hi] passes the gradient. */
static int clamp_passes(double z, double lo, double hi, int block) {
  return block ? (z > lo && z < hi) : (z >= lo && z <= hi);
}

/* a = act(h) for one row of intermediate F (v->F routed, v->Fs shared):
 * h [2F swiglu | F relu2], a [F] (float32). */
static void act_row(const moe_view *v, int64_t F, const float *h, float *a) {
  const float L = (float)v->L;
  for (int64_t f = 0; f < F; f++) {
    if (!v->swiglu) {
      a[f] = h[f] > 0.0f ? h[f] * h[f] : 0.0f;
      continue;
    }
    float g = h[f], u = h[F + f];
    if (L > 0) {
      g = fminf(g, L);
      u = fminf(fmaxf(u, -L), L);
    }
    a[f] = g / (1.0f + expf(-g)) * u;
  }
}

/* d_h = act'(h) d_a for one row of intermediate F (float32, closed form):
 * h, dh [2F swiglu | F relu2], da [F]. */
static void act_vjp_row(const moe_view *v, int64_t F, const float *h, const float *da, float *dh) {
  const float L = (float)v->L;
  for (int64_t f = 0; f < F; f++) {
    if (!v->swiglu) {
      dh[f] = h[f] > 0.0f ? da[f] * 2.0f * h[f] : 0.0f;
      continue;
    }
    float g = h[f], u = h[F + f];
    int gp = 1, up = 1;
    if (L > 0) {
      gp = clamp_passes(g, -INFINITY, L, v->block);
      up = clamp_passes(u, -L, L, v->block);
      g = fminf(g, L);
      u = fminf(fmaxf(u, -L), L);
    }
    float s = 1.0f / (1.0f + expf(-g));
    dh[f] = gp ? da[f] * u * (s * (1.0f + g * (1.0f - s))) : 0.0f;
    dh[F + f] = up ? da[f] * (g * s) : 0.0f;
  }
}

/* t as bf16 (n elements): decoded to float32, rounded. */
static uint16_t *to_bf16(const qc_tensor *t, const char *what) {
  int64_t n = qc_numel(t);
  uint16_t *o = qc_malloc((size_t)n * sizeof *o + 2, what);
  if (!o) return NULL;
  if (t->dtype == QC_BF16) {
    memcpy(o, t->data, (size_t)n * sizeof *o);
    return o;
  }
  float *f = qc_mod_f32(t, what);
  if (!f) { free(o); return NULL; }
  for (int64_t i = 0; i < n; i++) o[i] = qc_f32_to_bf16(f[i]);
  free(f);
  return o;
}

/* The shared experts' VJP, added to dx [T, H] (float32, the routed part
 * already in it); xb [T, H] and gb [T, H] are x and dY in bf16. Writes
 * d_shared_w1 [Rs, H], d_shared_w2 [H, Fs] and, when gated, d_shared_gate
 * (the shape of params/shared_gate) into grads. As a trainer runs the dense
 * MLP: h = x Ws1^T [T, Rs], a = act(h), ys = a Ws2^T [T, H] (bf16 GEMMs),
 * gate z_t = <x_t, sg>, gs_t = sigmoid(z_t) in float32 (gs = 1 ungated);
 * d_z_t = gs (1 - gs) <dy_t, ys_t>, G = gs dy (bf16), d_a = G Ws2,
 * d_Ws2 = G^T a, d_h = act'(h) d_a, d_Ws1 = d_h^T x, d_x += d_h Ws1 + d_z sg.
 * Returns a status. */
static int moe_shared_vjp(const qc_backend *be, const moe_view *v, const uint16_t *xb, const uint16_t *gb, qc_tset *grads,
                          float *dx) {
  const int64_t T = v->T, H = v->H, Fs = v->Fs, Rs = v->Rs;
  uint16_t *w1b = NULL, *w2b = NULL, *ab = NULL, *Gb = NULL, *dhb = NULL;
  float *h = NULL, *a = NULL, *ys = NULL, *da = NULL, *dh = NULL, *dxs = NULL, *sg = NULL, *dsg = NULL, *dw1, *dw2;
  int rc = QC_ESYS;
  const size_t nT = (size_t)T;
  if (!(w1b = to_bf16(v->sw1, "moe shared_w1 bf16")) || !(w2b = to_bf16(v->sw2, "moe shared_w2 bf16")) ||
      !(ab = qc_malloc(nT * Fs * sizeof *ab, "moe shared a bf16")) || !(Gb = qc_malloc(nT * H * sizeof *Gb, "moe shared dY bf16")) ||
      !(dhb = qc_malloc(nT * Rs * sizeof *dhb, "moe shared d_h bf16")) || !(h = qc_malloc(nT * Rs * sizeof *h, "moe shared h")) ||
      !(a = qc_malloc(nT * Fs * sizeof *a, "moe shared a")) || !(ys = qc_malloc(nT * H * sizeof *ys, "moe shared out")) ||
      !(da = qc_malloc(nT * Fs * sizeof *da, "moe shared d_a")) || !(dh = qc_malloc(nT * Rs * sizeof *dh, "moe shared d_h")) ||
      !(dxs = qc_malloc(nT * H * sizeof *dxs, "moe shared d_x")))
    goto done;
  if (v->sg && !(sg = qc_mod_f32(v->sg, "moe shared_gate"))) goto done;
  if ((rc = qc_mod_add(grads, "d_shared_w1", QC_F32, 2, v->sw1->shape, (void **)&dw1)) ||
      (rc = qc_mod_add(grads, "d_shared_w2", QC_F32, 2, v->sw2->shape, (void **)&dw2)))
    goto done;
  if (v->sg && (rc = qc_mod_add(grads, "d_shared_gate", QC_F32, v->sg->ndim, v->sg->shape, (void **)&dsg))) goto done;
  /* forward replay: h = x Ws1^T, a = act(h), ys = a Ws2^T */
  if ((rc = be->gemm_bf16(be, QC_OP_N, QC_OP_T, T, Rs, H, xb, H, w1b, H, h, Rs))) goto done;
  for (int64_t t = 0; t < T; t++) act_row(v, Fs, h + t * Rs, a + t * Fs);
  for (int64_t i = 0; i < T * Fs; i++) ab[i] = qc_f32_to_bf16(a[i]);
  if ((rc = be->gemm_bf16(be, QC_OP_N, QC_OP_T, T, H, Fs, ab, Fs, w2b, Fs, ys, H))) goto done;
  /* the gate: gs = sigmoid(<x_t, sg>), d_z = gs (1 - gs) <dy_t, ys_t>; G = gs dy */
  for (int64_t t = 0; t < T; t++) {
    float gs = 1.0f, dz = 0.0f;
    if (sg) {
      float z = 0.0f, dot = 0.0f;
      for (int64_t c = 0; c < H; c++) {
        z += qc_bf16_to_f32(xb[t * H + c]) * sg[c];
        dot += qc_bf16_to_f32(gb[t * H + c]) * ys[t * H + c];
      }
      gs = 1.0f / (1.0f + expf(-z));
      dz = gs * (1.0f - gs) * dot;
      for (int64_t c = 0; c < H; c++) {
        dsg[c] += dz * qc_bf16_to_f32(xb[t * H + c]);
        dx[t * H + c] += dz * sg[c];
      }
    }
    for (int64_t c = 0; c < H; c++) Gb[t * H + c] = sg ? qc_f32_to_bf16(gs * qc_bf16_to_f32(gb[t * H + c])) : gb[t * H + c];
  }
  /* d_a = G Ws2 [T, Fs]; d_Ws2 = G^T a [H, Fs] */
  if ((rc = be->gemm_bf16(be, QC_OP_N, QC_OP_N, T, Fs, H, Gb, H, w2b, Fs, da, Fs))) goto done;
  if ((rc = be->gemm_bf16(be, QC_OP_T, QC_OP_N, H, Fs, T, Gb, H, ab, Fs, dw2, Fs))) goto done;
  /* d_h = act'(h) d_a; d_Ws1 = d_h^T x [Rs, H]; d_x += d_h Ws1 [T, H] */
  for (int64_t t = 0; t < T; t++) act_vjp_row(v, Fs, h + t * Rs, da + t * Fs, dh + t * Rs);
  for (int64_t i = 0; i < T * Rs; i++) dhb[i] = qc_f32_to_bf16(dh[i]);
  if ((rc = be->gemm_bf16(be, QC_OP_T, QC_OP_N, Rs, H, T, dhb, Rs, xb, H, dw1, H))) goto done;
  if ((rc = be->gemm_bf16(be, QC_OP_N, QC_OP_N, T, H, Rs, dhb, Rs, w1b, H, dxs, H))) goto done;
  for (int64_t i = 0; i < T * H; i++) dx[i] += dxs[i];
  rc = QC_OK;
done:
  free(w1b); free(w2b); free(ab); free(Gb); free(dhb); free(h); free(a); free(ys); free(da); free(dh); free(dxs); free(sg);
  return rc;
}

/* dequant(quant(.)) of f [rows, cols] in place under fmt ("none":
 * unchanged), nearest rounding, the profile of v, then rounded to bf16
 * into out (the GEMM operand a trainer feeds its bf16 grouped GEMM).
 * Returns a status. */
static int fq_bf16(const moe_view *v, const char *fmt, int64_t rows, int64_t cols, float *f, uint16_t *out, const char *what) {
  int rc = strcmp(fmt, "none") != 0 ? qc_fake_quant(fmt, v->prof, rows, cols, f, f, what) : QC_OK;
  for (int64_t i = 0; i < rows * cols && !rc; i++) out[i] = qc_f32_to_bf16(f[i]);
  return rc;
}

/* Expert e's [rows, cols] slice of the [E, rows, cols] tensor t as bf16:
 * dequant(quant(.)) under v's expert_weight_format into q (the forward's
 * operand), and the master into b when it is the backward's (dx_weight
 * master; else b = q's values). f: scratch of rows * cols floats. */
static int expert_weights(const moe_view *v, const qc_module *m, const qc_tensor *t, const uint16_t *master, int64_t e, int64_t rows,
                          int64_t cols, int dx_master, float *f, uint16_t *q, uint16_t *b) {
  const int64_t n = rows * cols;
  const uint16_t *src = master + e * n;
  char what[QC_PATHLEN + 48];
  snprintf(what, sizeof what, "%s: params/%s expert %lld", m->path, t->name, (long long)e);
  for (int64_t i = 0; i < n; i++) f[i] = qc_bf16_to_f32(src[i]);
  int rc = fq_bf16(v, v->wfmt, rows, cols, f, q, what);
  if (!rc) memcpy(b, dx_master ? src : q, (size_t)n * sizeof *b);
  return rc;
}

/* Production VJP (see the file comment). Under the expert formats, the
 * grouped GEMMs of the forward replay take each expert's dequant(quant(W))
 * and the dequant(quant(.)) rows of x and act(h); the backward's take the
 * weights dx_weight names and x, act(h) unquantized (the straight-through
 * estimator), as a QAT trainer's FP8 forward / BF16 backward does. With
 * saved/fc1_out, h is the forward's saved FC1 output, not a replay. */
static int moe_vjp(const qc_ctx *ctx, const qc_module *m, const qc_tensor *dy, qc_tset *grads) {
  moe_view v;
  int rc = moe_view_get(m, &v);
  if (rc) return rc;
  const int64_t T = v.T, H = v.H, F = v.F, E = v.E, k = v.k, R = v.R, N = T * k;
  uint16_t *xb = NULL, *xqb = NULL, *w1b = NULL, *w2b = NULL, *gb = NULL, *Xe = NULL, *Xq = NULL, *ab = NULL, *aqb = NULL, *Ge = NULL,
           *dhb = NULL, *W1f = NULL, *W1b = NULL, *W2f = NULL, *W2b = NULL;
  float *wt = NULL, *g = NULL, *h = NULL, *a = NULL, *ye = NULL, *da = NULL, *dh = NULL, *dxe = NULL, *fs = NULL, *fc1 = NULL;
  int64_t *cnt = NULL, *perm = NULL;
  float *dx, *dw1, *dw2, *dwt;
  const qc_backend *be = ctx->be;
  const int aq = strcmp(v.afmt, "none") != 0;
  char what[QC_PATHLEN + 48];
  if ((rc = qc_module_check_dy(m, dy, T * H, H, "the shape of inputs/x [T, H]"))) goto done;
  rc = QC_ESYS;
  if (!(xb = to_bf16(v.x, "moe x bf16")) || !(w1b = to_bf16(v.w1, "moe w1 bf16")) || !(w2b = to_bf16(v.w2, "moe w2 bf16")) ||
      !(gb = to_bf16(dy, "moe dY bf16")) || !(wt = qc_mod_f32(v.wt, "moe topk_weights")) ||
      !(xqb = qc_malloc((size_t)(T * H + 1) * sizeof *xqb, "moe quantized x")) ||
      !(fs = qc_malloc((size_t)(R * H + H * F + T * H + N * F + 1) * sizeof *fs, "moe quantizer scratch")) ||
      !(W1f = qc_malloc((size_t)(R * H) * sizeof *W1f, "moe w1 expert")) || !(W1b = qc_malloc((size_t)(R * H) * sizeof *W1b, "moe w1 expert")) ||
      !(W2f = qc_malloc((size_t)(H * F) * sizeof *W2f, "moe w2 expert")) || !(W2b = qc_malloc((size_t)(H * F) * sizeof *W2b, "moe w2 expert")) ||
      (v.fc1 && !(fc1 = qc_mod_f32(v.fc1, "moe saved fc1_out"))))
    goto done;
  /* the forward's input rows: dequant(quant(x)) under the activation format */
  for (int64_t i = 0; i < T * H; i++) fs[i] = qc_bf16_to_f32(xb[i]);
  snprintf(what, sizeof what, "%s: inputs/x", m->path);
  if ((rc = fq_bf16(&v, v.afmt, T, H, fs, xqb, what))) goto done;
  rc = QC_ESYS;
  /* the sort: (token, slot) pairs grouped by expert, stable (counting sort) */
  if (!(cnt = qc_malloc((size_t)(E + 1) * sizeof *cnt, "moe expert offsets")) || !(perm = qc_malloc((size_t)N * sizeof *perm, "moe permutation")))
    goto done;
  memset(cnt, 0, (size_t)(E + 1) * sizeof *cnt);
  for (int64_t s = 0; s < N; s++) cnt[v.id[s] + 1]++;
  for (int64_t e = 0; e < E; e++) cnt[e + 1] += cnt[e];
  int64_t nmax = 0;
  for (int64_t e = 0; e < E; e++) nmax = cnt[e + 1] - cnt[e] > nmax ? cnt[e + 1] - cnt[e] : nmax;
  {
    int64_t *pos = qc_malloc((size_t)E * sizeof *pos + 8, "moe sort cursor");
    if (!pos) goto done;
    memcpy(pos, cnt, (size_t)E * sizeof *pos);
    for (int64_t s = 0; s < N; s++) perm[pos[v.id[s]]++] = s; /* sorted row -> (t, j) slot */
    free(pos);
  }
  size_t nw = (size_t)(nmax > 0 ? nmax : 1);
  if (!(Xe = qc_malloc(nw * H * sizeof *Xe, "moe gathered x")) || !(Xq = qc_malloc(nw * H * sizeof *Xq, "moe gathered x")) ||
      !(ab = qc_malloc(nw * F * sizeof *ab, "moe a bf16")) || !(aqb = qc_malloc(nw * F * sizeof *aqb, "moe a quantized")) ||
      !(Ge = qc_malloc(nw * H * sizeof *Ge, "moe w dY bf16")) || !(dhb = qc_malloc(nw * R * sizeof *dhb, "moe d_h bf16")) ||
      !(g = qc_malloc((size_t)H * sizeof *g, "moe dY row")) || !(h = qc_malloc(nw * R * sizeof *h, "moe h")) ||
      !(a = qc_malloc(nw * F * sizeof *a, "moe a")) || !(ye = qc_malloc(nw * H * sizeof *ye, "moe expert out")) ||
      !(da = qc_malloc(nw * F * sizeof *da, "moe d_a")) || !(dh = qc_malloc(nw * R * sizeof *dh, "moe d_h")) ||
      !(dxe = qc_malloc(nw * H * sizeof *dxe, "moe d_x rows")))
    goto done;
  int64_t ws[2] = {T, k};
  if ((rc = qc_mod_add(grads, "d_x", QC_F32, 2, v.x->shape, (void **)&dx)) ||
      (rc = qc_mod_add(grads, "d_w1", QC_F32, 3, v.w1->shape, (void **)&dw1)) ||
      (rc = qc_mod_add(grads, "d_w2", QC_F32, 3, v.w2->shape, (void **)&dw2)) ||
      (rc = qc_mod_add(grads, "d_topk_weights", QC_F32, 2, ws, (void **)&dwt)))
    goto done;
  for (int64_t e = 0; e < E; e++) {
    const int64_t off = cnt[e], n = cnt[e + 1] - cnt[e];
    if (n == 0) continue; /* empty expert: d_w1[e], d_w2[e] stay zero */
    if ((rc = expert_weights(&v, m, v.w1, w1b, e, R, H, v.dx_master, fs, W1f, W1b)) ||
        (rc = expert_weights(&v, m, v.w2, w2b, e, H, F, v.dx_master, fs, W2f, W2b)))
      goto done;
    for (int64_t i = 0; i < n; i++) {
      memcpy(Xe + i * H, xb + (perm[off + i] / k) * H, (size_t)H * sizeof *Xe);
      memcpy(Xq + i * H, xqb + (perm[off + i] / k) * H, (size_t)H * sizeof *Xq);
    }
    /* forward replay: h = Xq W1f^T [n, R] (or the saved FC1 output), a = act(h), y = aq W2f^T [n, H] */
    if (fc1)
      for (int64_t i = 0; i < n; i++) memcpy(h + i * R, fc1 + perm[off + i] * R, (size_t)R * sizeof *h);
    else if ((rc = be->gemm_bf16(be, QC_OP_N, QC_OP_T, n, R, H, Xq, H, W1f, H, h, R)))
      goto done;
    for (int64_t i = 0; i < n; i++) act_row(&v, F, h + i * R, a + i * F);
    for (int64_t i = 0; i < n * F; i++) ab[i] = qc_f32_to_bf16(a[i]);
    if (aq) {
      for (int64_t i = 0; i < n * F; i++) fs[i] = qc_bf16_to_f32(ab[i]);
      snprintf(what, sizeof what, "%s: expert %lld activation rows", m->path, (long long)e);
      if ((rc = fq_bf16(&v, v.afmt, n, F, fs, aqb, what))) goto done;
    }
    if ((rc = be->gemm_bf16(be, QC_OP_N, QC_OP_T, n, H, F, aq ? aqb : ab, F, W2f, F, ye, H))) goto done;
    /* d_topk_weights = <dy_t, y>; G = w dy_t (bf16 for the GEMMs) */
    for (int64_t i = 0; i < n; i++) {
      const int64_t s = perm[off + i], t = s / k;
      float dot = 0.0f;
      for (int64_t c = 0; c < H; c++) {
        g[c] = qc_bf16_to_f32(gb[t * H + c]);
        dot += g[c] * ye[i * H + c];
      }
      dwt[s] = dot;
      for (int64_t c = 0; c < H; c++) Ge[i * H + c] = qc_f32_to_bf16(wt[s] * g[c]);
    }
    /* d_a = G W2b [n, F]; d_w2[e] = G^T a [H, F] */
    if ((rc = be->gemm_bf16(be, QC_OP_N, QC_OP_N, n, F, H, Ge, H, W2b, F, da, F))) goto done;
    if ((rc = be->gemm_bf16(be, QC_OP_T, QC_OP_N, H, F, n, Ge, H, ab, F, dw2 + e * H * F, F))) goto done;
    /* d_h = act'(h) d_a; d_w1[e] = d_h^T Xe [R, H]; d_x rows = d_h W1b [n, H] */
    for (int64_t i = 0; i < n; i++) act_vjp_row(&v, F, h + i * R, da + i * F, dh + i * R);
    for (int64_t i = 0; i < n * R; i++) dhb[i] = qc_f32_to_bf16(dh[i]);
    if ((rc = be->gemm_bf16(be, QC_OP_T, QC_OP_N, R, H, n, dhb, R, Xe, H, dw1 + e * R * H, H))) goto done;
    if ((rc = be->gemm_bf16(be, QC_OP_N, QC_OP_N, n, H, R, dhb, R, W1b, H, dxe, H))) goto done;
    /* restore: back to the token through the permutation, accumulating */
    for (int64_t i = 0; i < n; i++) {
      float *dr = dx + (perm[off + i] / k) * H;
      for (int64_t c = 0; c < H; c++) dr[c] += dxe[i * H + c];
    }
  }
  if (v.S > 0 && (rc = moe_shared_vjp(be, &v, xb, gb, grads, dx))) goto done;
  rc = QC_OK;
done:
  free(xb); free(xqb); free(w1b); free(w2b); free(gb); free(wt); free(cnt); free(perm); free(fs); free(fc1);
  free(W1f); free(W1b); free(W2f); free(W2b);
  free(Xe); free(Xq); free(ab); free(aqb); free(Ge); free(dhb); free(g); free(h); free(a); free(ye); free(da); free(dh); free(dxe);
  free(v.id);
  return rc;
}

/* Lambda for n operands rounded to bf16 from float32 sums of K terms,
 * judged against the round_ops variant that rounds the exact values: an
 * operand within its float32 error e = sqrt(K) u_f32 of a bf16 rounding
 * boundary rounds the other way, an error of u_bf16 with probability
 * ~e / u_bf16, so n such operands add n u_bf16 e in square:
 * e_acc^2 (1 + n u_bf16 / (sqrt(K) u_f32)) = (lambda sqrt(K) u_f32)^2. */
static double moe_flips(int64_t K, int n) {
  return sqrt(1.0 + n * qc_dtype_unit(QC_BF16) / (sqrt((double)(K > 0 ? K : 1)) * qc_dtype_unit(QC_F32)));
}

/* The error model: the grouped GEMMs take bf16 operands the production
 * rounds from float32 (w dY and d_h into d_x and d_w1; w dY and a into
 * d_w2; a into d_topk_weights): the reference's round_ops variant rounds
 * them too, and what is left between the two, the roundings that fall the
 * other way of a boundary, is the lambda of moe_flips; d_x sums k x
 * rows-of-w1 products per token (plus the shared rows), d_w1 and d_w2 sum
 * over the (token, slot) pairs of the busiest expert, the shared weights'
 * over all T tokens, d_topk_weights is one length-H dot whose cancellation
 * needs margin 3 (few elements per token to average over), as is each
 * token's term of d_shared_gate. The terms' scale comes from the
 * reference. Returns a status. */
static int moe_tol_model(const qc_module *m, const qc_tensor *dy, const char *grad, qc_tol_model *tm) {
  (void)dy;
  moe_view v;
  int rc = moe_view_get(m, &v);
  int64_t busiest = 1;
  if (!rc) {
    int64_t *cnt = qc_calloc((size_t)v.E, sizeof *cnt, "moe expert counts");
    if (!cnt) rc = QC_ESYS;
    for (int64_t i = 0; cnt && i < v.T * v.k; i++)
      if (++cnt[v.id[i]] > busiest) busiest = cnt[v.id[i]];
    free(cnt);
  }
  free(v.id);
  if (rc) return rc;
  if (strcmp(grad, "d_x") == 0)
    qc_mod_tm(tm, v.k * v.R + v.Rs, moe_flips(v.k * v.R + v.Rs, 2), 0, 0, "d_x_t = sum_j W1_e^T d_h (+ Ws1^T d_hs of the shared experts) over k x rows "
              "of w1 (+ rows of shared_w1) = %lld products; the production rounds w dY and d_h to bf16, the round_ops variant too: "
              "lambda sqrt(1 + 2 u_bf16 / (sqrt(K) u_f32)) for the roundings that fall the other way", (long long)(v.k * v.R + v.Rs));
  else if (strcmp(grad, "d_w1") == 0 || strcmp(grad, "d_w2") == 0)
    qc_mod_tm(tm, busiest, moe_flips(busiest, 2), 0, 0, "%s sums over the (token, slot) pairs of an expert, %lld at most; "
              "the production rounds %s to bf16, the round_ops variant too: lambda sqrt(1 + 2 u_bf16 / (sqrt(K) u_f32))", grad, (long long)busiest, grad[3] == '1' ? "w dY and d_h" : "w dY and a");
  else if (strcmp(grad, "d_shared_w1") == 0 || strcmp(grad, "d_shared_w2") == 0)
    qc_mod_tm(tm, v.T, moe_flips(v.T, 2), 0, 0, "%s = the dense shared MLP's weight gradient, a sum over all T = %lld tokens; "
              "the production rounds %s to bf16, the round_ops variant too: lambda sqrt(1 + 2 u_bf16 / (sqrt(K) u_f32))", grad, (long long)v.T, grad[10] == '1' ? "gs dY and d_h" : "gs dY and a");
  else if (strcmp(grad, "d_shared_gate") == 0)
    qc_mod_tm(tm, v.T > v.H ? v.T : v.H, moe_flips(v.T > v.H ? v.T : v.H, 2), 0, 3, "d_shared_gate = sum_t gs(1 - gs) <dY_t, ys_t> x_t: a length-H = %lld dot "
              "per token summed over T = %lld; a and ys rounded to bf16, by the round_ops variants too: lambda sqrt(1 + 2 "
              "u_bf16 / (sqrt(K) u_f32)); margin 3 for the dot's cancellation", (long long)v.H, (long long)v.T);
  else if (strcmp(grad, "d_topk_weights") == 0)
    qc_mod_tm(tm, v.H, moe_flips(v.H, 2), 0, 3, "d_topk_weights[t, j] = <dY_t, W2_e a>, one length-H = %lld dot; a and y "
              "rounded to bf16, by the round_ops variants too: lambda sqrt(1 + 2 u_bf16 / (sqrt(K) u_f32)); margin 3 for the dot's cancellation over few elements", (long long)v.H);
  else
    return qc_err("%s: class moe has no gradient '%s'", m->path, grad);
  tm->terms_lambda = 1; /* the sums' own floor: the flips are in lambda only */
  return QC_OK;
}

/* a [F] = act(h) in float64 for one row of intermediate F, h and bh
 * [2F swiglu | F relu2]: the ReLU's side and the clamp's side of each value
 * are taken from the branch row bh. */
static void act_row_f64(const moe_view *v, int64_t F, const double *h, const double *bh, double *a) {
  for (int64_t f = 0; f < F; f++) {
    if (!v->swiglu) {
      a[f] = bh[f] > 0 ? h[f] * h[f] : 0.0;
      continue;
    }
    double gc = h[f], uc = h[F + f];
    if (v->L > 0) {
      if (!clamp_passes(bh[f], -INFINITY, v->L, v->block)) gc = v->L;
      if (!clamp_passes(bh[F + f], -v->L, v->L, v->block)) uc = bh[F + f] > 0 ? v->L : -v->L;
    }
    a[f] = gc / (1.0 + exp(-gc)) * uc;
  }
}

/* The shared experts' float64 forward added to out [T, H]: out_t +=
 * gs_t Ws2 act(Ws1 x_t), gs_t = sigmoid(<x_t, sg>) (1 ungated); x, bx
 * [T, H] are the inputs of v and of the branch bv (whose h decides the
 * activation's branches). Returns a status. */
static int moe_shared_forward(const moe_view *v, const moe_view *bv, const double *x, const double *bx, double *out) {
  const int64_t T = v->T, H = v->H, Fs = v->Fs, Rs = v->Rs;
  double *w1 = NULL, *w2 = NULL, *bw1 = NULL, *sg = NULL, *h = NULL, *bh = NULL, *a = NULL;
  int rc = QC_ESYS;
  if (!(w1 = qc_mod_f64(v->sw1, "moe shared_w1")) || !(w2 = qc_mod_f64(v->sw2, "moe shared_w2")) ||
      !(bw1 = qc_mod_f64(bv->sw1, "moe shared_w1")) || (v->sg && !(sg = qc_mod_f64(v->sg, "moe shared_gate"))) ||
      !(h = qc_malloc((size_t)Rs * sizeof *h, "moe shared h")) || !(bh = qc_malloc((size_t)Rs * sizeof *bh, "moe shared h")) ||
      !(a = qc_malloc((size_t)Fs * sizeof *a, "moe shared a")))
    goto done;
  for (int64_t t = 0; t < T; t++) {
    double gs = 1.0;
    if (sg) {
      double z = 0;
      for (int64_t c = 0; c < H; c++) z += x[t * H + c] * sg[c];
      gs = 1.0 / (1.0 + exp(-z));
    }
    for (int64_t r = 0; r < Rs; r++) {
      double s = 0, bs = 0;
      for (int64_t c = 0; c < H; c++) {
        s += w1[r * H + c] * x[t * H + c];
        bs += bw1[r * H + c] * bx[t * H + c];
      }
      h[r] = s;
      bh[r] = bs;
    }
    act_row_f64(v, Fs, h, bh, a);
    for (int64_t c = 0; c < H; c++) {
      double s = 0;
      for (int64_t f = 0; f < Fs; f++) s += w2[c * Fs + f] * a[f];
      out[t * H + c] += gs * s;
    }
  }
  rc = QC_OK;
done:
  free(w1); free(w2); free(bw1); free(sg); free(h); free(bh); free(a);
  return rc;
}

/* Float64 forward out [T, H]. The discrete branches are taken from branch:
 * the ids, the ReLU's side and which side of the clamp limit each value of
 * h = w1[e] x_t (and of the shared experts' h) lies on. Returns a status. */
static int moe_forward(const qc_module *m, const qc_module *branch, qc_tensor *y) {
  moe_view v, bv;
  int rc;
  double *x = NULL, *w1 = NULL, *w2 = NULL, *wt = NULL, *bx = NULL, *bw1 = NULL, *h = NULL, *bh = NULL, *a = NULL;
  memset(&bv, 0, sizeof bv);
  if ((rc = moe_view_get(m, &v))) return rc;
  if (strcmp(v.wfmt, "none") != 0 || strcmp(v.afmt, "none") != 0) { /* the method: no finite differences through an STE */
    free(v.id);
    qc_hint("finite differences check the smooth unquantized forward: set expert_weight_format and expert_act_format to none");
    return qc_err("%s: the contract quantizes the experts (expert_weight_format %s, expert_act_format %s): finite differences of "
                  "the quantized forward measure the rounding, not the straight-through derivative", m->path, v.wfmt, v.afmt);
  }
  if ((rc = moe_view_get(branch, &bv))) goto done;
  const int64_t T = v.T, H = v.H, F = v.F, R = v.R, k = v.k;
  rc = QC_ESYS;
  if (!(x = qc_mod_f64(v.x, "moe x")) || !(w1 = qc_mod_f64(v.w1, "moe w1")) || !(w2 = qc_mod_f64(v.w2, "moe w2")) ||
      !(wt = qc_mod_f64(v.wt, "moe topk_weights")) || !(bx = qc_mod_f64(bv.x, "moe x")) || !(bw1 = qc_mod_f64(bv.w1, "moe w1")) ||
      !(h = qc_malloc((size_t)R * sizeof *h, "moe h")) || !(bh = qc_malloc((size_t)R * sizeof *bh, "moe h")) ||
      !(a = qc_malloc((size_t)F * sizeof *a, "moe a")))
    goto done;
  if ((rc = qc_tensor_alloc(y, "y", QC_F64, 2, v.x->shape))) goto done;
  double *out = y->data;
  for (int64_t t = 0; t < T; t++)
    for (int64_t j = 0; j < k; j++) {
      const int64_t e = bv.id[t * k + j];
      for (int64_t r = 0; r < R; r++) {
        double s = 0, bs = 0;
        for (int64_t c = 0; c < H; c++) {
          s += w1[(e * R + r) * H + c] * x[t * H + c];
          bs += bw1[(e * R + r) * H + c] * bx[t * H + c];
        }
        h[r] = s;
        bh[r] = bs;
      }
      act_row_f64(&v, F, h, bh, a);
      for (int64_t c = 0; c < H; c++) {
        double s = 0;
        for (int64_t f = 0; f < F; f++) s += w2[(e * H + c) * F + f] * a[f];
        out[t * H + c] += wt[t * k + j] * s;
      }
    }
  if (v.S > 0 && (rc = moe_shared_forward(&v, &bv, x, bx, out))) goto done;
  rc = QC_OK;
done:
  free(x); free(w1); free(w2); free(wt); free(bx); free(bw1); free(h); free(bh); free(a);
  free(v.id); free(bv.id);
  return rc;
}

/* Generated moe: shape [T, H, F, E, k]. x ~ N(0,1) bf16; w1 ~ 2.5 N(0,1) /
 * sqrt(H) bf16 (h ~ 2.5 N(0,1): some gates beyond a clamp of 7 in the
 * special values), w2 ~ N(0,1) / sqrt(F) bf16. topk_ids [T, k] int64, fixed:
 * distinct random experts other than E/2 (expert E/2 is never selected: an
 * empty expert in the middle, so the first and the last are used), with
 * repeated routing (slot 1 = slot 0: the same expert twice) on
 * tokens 1, 5, 9, ... when k >= 2. topk_weights [T, k] float32: the softmax of
 * N(0,1) logits over the k slots, except every third token (t % 3 == 2) with
 * plain N(0,1) weights (signed, unnormalized), and token 0 with equal weights
 * 1/k (a tie). values = "special": x row T/2 zero, token T/2 + 1 scaled by 8
 * (h beyond the clamp), a zero weight; "heavy_tail": x divided by
 * 0.05 + U(0,1). Under shared_experts = S (1..64): shared_w1 [2Fs | Fs, H]
 * ~ 2.5 N(0,1) / sqrt(H), shared_w2 [H, Fs] ~ N(0,1) / sqrt(Fs) bf16 with
 * Fs = S F; under shared_gate = true, shared_gate [1, H] ~ 2 N(0,1) /
 * sqrt(H) bf16 (gate logits ~ 2 N(0,1): gates across (0, 1)). Returns a
 * status. */
static int moe_generate(const qc_gen *gp, qc_rng *rng, qc_module *m, int *ondim, int64_t *oshape) {
  if (gp->nshape != 5) return qc_err("moe: generate shape needs [T, H, F, E, k] (tokens, hidden, expert intermediate, experts, top-k), got %d entries", gp->nshape);
  const int64_t T = gp->shape[0], H = gp->shape[1], F = gp->shape[2], E = gp->shape[3], K = gp->shape[4];
  if (T < 1 || H < 1 || F < 1 || E < 2 || K < 1) return qc_err("moe: generate shape needs T, H, F, k >= 1 and E >= 2");
  const int swiglu = strcmp(qc_contract_str(&m->contract, "activation", "swiglu"), "relu2") != 0;
  const int64_t R = swiglu ? 2 * F : F;
  int64_t xs[2] = {T, H}, w1s[3] = {E, R, H}, w2s[3] = {E, H, F}, is[2] = {T, K};
  uint16_t *x, *w1, *w2;
  int64_t *ids;
  float *wt;
  int rc;
  if ((rc = qc_mod_gen_bf16(&m->inputs, "x", 2, xs, rng, 1.0, &x))) return rc;
  if ((rc = qc_mod_add(&m->inputs, "topk_weights", QC_F32, 2, is, (void **)&wt))) return rc;
  if ((rc = qc_mod_gen_bf16(&m->params, "w1", 3, w1s, rng, 2.5 / sqrt((double)H), &w1))) return rc;
  if ((rc = qc_mod_gen_bf16(&m->params, "w2", 3, w2s, rng, 1.0 / sqrt((double)F), &w2))) return rc;
  if ((rc = qc_mod_add(&m->saved, "topk_ids", QC_I64, 2, is, (void **)&ids))) return rc;
  if (gp->values && strcmp(gp->values, "heavy_tail") == 0)
    for (int64_t i = 0; i < T * H; i++) x[i] = qc_f32_to_bf16((float)(qc_bf16_to_f32(x[i]) / (0.05 + qc_rng_uniform(rng))));
  if (qc_mod_special(gp)) {
    memset(x + (T / 2) * H, 0, (size_t)H * sizeof *x);
    for (int64_t c = 0; T / 2 + 1 < T && c < H; c++) x[(T / 2 + 1) * H + c] = qc_f32_to_bf16(8.0f * qc_bf16_to_f32(x[(T / 2 + 1) * H + c]));
  }
  const int64_t avail = E - 1, empty = E / 2; /* expert E/2 stays empty */
  for (int64_t t = 0; t < T; t++) {
    for (int64_t j = 0; j < K; j++) {
      int64_t e, again;
      do {
        e = (int64_t)(qc_rng_uniform(rng) * (double)avail);
        if (e >= avail) e = avail - 1;
        if (e >= empty) e++; /* skip the empty expert */
        again = 0;
        for (int64_t i = 0; i < j && K <= avail; i++) again |= ids[t * K + i] == e;
      } while (again);
      ids[t * K + j] = e;
    }
    if (K >= 2 && t % 4 == 1) ids[t * K + 1] = ids[t * K]; /* repeated routing */
    for (int64_t j = 0; j < K; j++) wt[t * K + j] = (float)qc_rng_normal(rng);
    if (t % 3 != 2) { /* softmax-normalized over the k slots */
      double mx = -INFINITY, sum = 0;
      for (int64_t j = 0; j < K; j++) mx = fmax(mx, wt[t * K + j]);
      for (int64_t j = 0; j < K; j++) sum += exp(wt[t * K + j] - mx);
      for (int64_t j = 0; j < K; j++) wt[t * K + j] = (float)(exp(wt[t * K + j] - mx) / sum);
    }
    if (t == 0)
      for (int64_t j = 0; j < K; j++) wt[j] = (float)(1.0 / (double)K); /* tie */
  }
  if (qc_mod_special(gp) && T > 3) wt[3 * K] = 0.0f;
  /* the shared experts, drawn after everything else (the routed data of a
   * seed does not depend on them) */
  const double S = qc_contract_num(&m->contract, "shared_experts", 0);
  if (S >= 1 && S == floor(S) && S <= 64) {
    const int64_t Fs = (int64_t)S * F, sw1s[2] = {swiglu ? 2 * Fs : Fs, H}, sw2s[2] = {H, Fs}, sgs[2] = {1, H};
    uint16_t *p;
    if ((rc = qc_mod_gen_bf16(&m->params, "shared_w1", 2, sw1s, rng, 2.5 / sqrt((double)H), &p))) return rc;
    if ((rc = qc_mod_gen_bf16(&m->params, "shared_w2", 2, sw2s, rng, 1.0 / sqrt((double)Fs), &p))) return rc;
    if (strcmp(qc_contract_str(&m->contract, "shared_gate", "false"), "true") == 0 &&
        (rc = qc_mod_gen_bf16(&m->params, "shared_gate", 2, sgs, rng, 2.0 / sqrt((double)H), &p)))
      return rc;
  }
  *ondim = 2;
  oshape[0] = T;
  oshape[1] = H;
  return QC_OK;
}

/* ---- coverage (model/modinfo.h) ---- */

/* The threshold applies under a clamp limit. */
static int moe_limited(const char *cj) { return qc_cov_num(cj, "limit") > 0; }

/* Empty experts, repeated routing and tied weights from the routing; shared
 * experts; both sides of a clamp limit in generated special values. */
static void moe_cov_facts(const qc_module *m, const qc_modinfo *mi, uint32_t *cover) {
  const qc_tensor *ids = qc_tset_get(&m->saved, "topk_ids"), *w1 = qc_tset_get(&m->params, "w1");
  const qc_tensor *wt = qc_tset_get(&m->inputs, "topk_weights");
  if (!wt) wt = qc_tset_get(&m->saved, "topk_weights");
  int64_t n, nw;
  int64_t *id = qc_cov_ids(ids, &n);
  if (id && ids->ndim == 2 && w1 && w1->ndim == 3) {
    int64_t E = w1->shape[0], k = ids->shape[1], T = ids->shape[0];
    char *used = calloc((size_t)E + 1, 1);
    for (int64_t i = 0; used && i < n; i++)
      if (id[i] >= 0 && id[i] < E) used[id[i]] = 1;
    for (int64_t e = 0; used && e < E; e++)
      if (!used[e]) *cover |= 1u << QC_COV_MOE_EMPTY;
    free(used);
    for (int64_t t = 0; t < T; t++)
      for (int64_t a = 0; a < k; a++)
        for (int64_t b = a + 1; b < k; b++)
          if (id[t * k + a] == id[t * k + b]) *cover |= 1u << QC_COV_MOE_REPEAT;
  }
  free(id);
  double *w = wt ? qc_cov_values(wt, &nw) : NULL;
  int64_t k = wt && wt->ndim >= 2 ? wt->shape[wt->ndim - 1] : 0;
  for (int64_t t = 0; w && k > 1 && t < nw / k; t++)
    for (int64_t a = 0; a < k; a++)
      for (int64_t b = a + 1; b < k; b++)
        if (w[t * k + a] == w[t * k + b]) *cover |= 1u << QC_COV_TIES;
  free(w);
  if (qc_tset_get(&m->params, "shared_w1")) *cover |= 1u << QC_COV_MOE_SHARED;
  if (moe_limited(mi->contract) && strcmp(mi->values, "special") == 0)
    *cover |= 1u << QC_COV_THRESHOLD | 1u << QC_COV_SATURATION;
}

static const qc_class_cov moe_cov[] = {
    {.item = "threshold", .how = "a clamp limit L (generated special values)", .applies = moe_limited},
    {.item = "saturation", .how = "the clamp limit L (generated special values)", .applies = moe_limited},
    {.item = "moe_empty"},
    {.item = "moe_repeated"},
    {.item = "moe_shared", .how = "params/shared_w1 (the contract's shared_experts)"},
    {.item = "topk_ties", .how = "equal routing weights within a token"},
    {NULL, NULL, NULL},
};

/* The class's reading of m for the engine's validation (qc_module_validate):
 * the view (the shared experts and gate the contract leaves unused
 * included) and dY. */
static int moe_validate(const qc_module *m, const qc_tensor *dy) {
  moe_view v;
  int rc = moe_view_get(m, &v);
  if (!rc) rc = qc_module_check_dy(m, dy, v.T * v.H, v.H, "the shape of inputs/x [T, H]");
  free(v.id);
  return rc;
}

/* Hypothesis: the backward's grouped GEMMs (d_a, hence d_h, d_w1 and d_x)
 * through the other expert weights than the contract's dx_weight (the
 * masters where it says dequantized, or the reverse), every expert. */
static int alter_dx_weight(const qc_module *m, qc_module *alt, char *detail, size_t n) {
  if (strcmp(qc_contract_str(&m->contract, "expert_weight_format", "none"), "none") == 0) return QC_NA; /* the same weights */
  int master = strcmp(qc_contract_str(&m->contract, "dx_weight", "dequant"), "master") == 0;
  snprintf(detail, n, "the contract says dx_weight = %s for every expert", master ? "master" : "dequant");
  return qc_contract_set(&alt->contract, "dx_weight", master ? "dequant" : "master", 0, 0);
}

/* Hypothesis (fitted over the experts): one expert's backward through its
 * master weights where the contract says dequantized, the others as the
 * contract says: the class's reference run once per used expert (E <= 64)
 * under that diagnosis variant (qc_ctx.master_expert), the expert whose
 * prediction is closest to the candidate named. For a stacked d_w1 only the
 * two experts whose slices stray furthest from the contract's reference are
 * tried (the variant changes its own expert's slice alone): three runs, not
 * one per expert; d_x, where nothing tells the experts apart, is tried
 * while the runs stay under about 2e11 multiply-adds in all. */
static int predict_master_expert(const qc_ctx *ctx, const qc_module *m, const qc_tensor *dy, const char *grad, const qc_tensor *cand,
                                 qc_tensor *pred, char *detail, size_t n) {
  const qc_registry_row *row = qc_registry_find(m->cls->name);
  if (!row || !cand || strcmp(qc_contract_str(&m->contract, "expert_weight_format", "none"), "none") == 0 ||
      strcmp(qc_contract_str(&m->contract, "dx_weight", "dequant"), "master") == 0)
    return QC_NA;
  moe_view v;
  int rc = moe_view_get(m, &v);
  if (rc) return rc;
  const int64_t E = v.E, N = qc_numel(cand);
  unsigned char *used = qc_calloc((size_t)E, 1, "moe expert mask");
  double *g = qc_mod_f64(cand, "moe candidate"), best = INFINITY;
  int64_t be = -1;
  rc = E > 64 ? QC_NA : QC_ESYS;
  if (E > 64 || !used || !g) goto done;
  for (int64_t i = 0; i < v.T * v.k; i++) used[v.id[i]] = 1;
  const int stacked = N % E == 0 && cand->ndim == 3 && cand->shape[0] == E;
  if (!stacked && (double)E * (double)(v.T * v.k) * (double)v.H * (double)(v.R + v.F) > 2e11) {
    rc = QC_NA; /* too many full runs for a diagnosis */
    goto done;
  }
  if (stacked) { /* keep the two used experts whose slices stray furthest */
    qc_tset out = {0};
    qc_ctx c = *ctx;
    c.master_expert = 0;
    c.skip = NULL;
    rc = row->reference(&c, m, dy, &out);
    const qc_tensor *p = rc ? NULL : qc_tset_get(&out, grad);
    double *pv = p && qc_numel(p) == N ? qc_mod_f64(p, "moe reference") : NULL;
    qc_tset_free(&out);
    if (rc || !pv) {
      rc = rc ? rc : QC_NA;
      goto done;
    }
    const int64_t in = N / E;
    double d1 = -1, d2 = -1;
    int64_t e1 = -1, e2 = -1;
    for (int64_t e = 0; e < E; e++) {
      if (!used[e]) continue;
      double dev = 0;
      for (int64_t i = e * in; i < (e + 1) * in; i++) dev += (g[i] - pv[i]) * (g[i] - pv[i]);
      if (dev > d1) { d2 = d1; e2 = e1; d1 = dev; e1 = e; }
      else if (dev > d2) { d2 = dev; e2 = e; }
    }
    free(pv);
    for (int64_t e = 0; e < E; e++) used[e] = 0;
    if (e1 >= 0) used[e1] = 1;
    if (e2 >= 0) used[e2] = 1;
  }
  for (int64_t e = 0; e < E; e++) {
    if (!used[e]) continue;
    qc_tset out = {0};
    qc_ctx c = *ctx;
    c.master_expert = e + 1;
    c.skip = NULL;
    rc = row->reference(&c, m, dy, &out);
    const qc_tensor *p = rc ? NULL : qc_tset_get(&out, grad);
    if (p && qc_numel(p) == N) {
      double *pv = qc_mod_f64(p, "moe prediction");
      double r = pv ? qc_rel_l2(g, pv, N) : INFINITY;
      if (r < best) {
        best = r;
        be = e;
        qc_tensor_free(pred);
        rc = qc_tensor_copy(pred, p);
      }
      free(pv);
    }
    qc_tset_free(&out);
    if (rc) goto done;
  }
  rc = be < 0 ? QC_NA : QC_OK;
  if (be >= 0) snprintf(detail, n, "expert %lld (the closest of the used experts)", (long long)be);
done:
  if (rc) qc_tensor_free(pred);
  free(used); free(g); free(v.id);
  return rc;
}

static const qc_hypothesis moe_hyps[] = {
    {"dx_convention", "/d_x/d_w1/", "the backward's expert weights (d_a, d_x) the other ones than the contract's dx_weight "
     "(master vs dequantized)", alter_dx_weight, 0, NULL, 0},
    {"dx_master_expert", "/d_x/d_w1/", "one expert's backward (d_a, d_x) from its master weights where the contract says "
     "dequantized", NULL, 0, predict_master_expert, 1},
    {NULL, NULL, NULL, NULL, 0, NULL, 0}};

/* The experts no (token, slot) pair is routed to: their d_w1 and d_w2
 * slices are exactly zero (nothing is summed into them), whatever the
 * rounding (qc_class.zero_slices). */
static int moe_zero_slices(const qc_module *m, const char *grad, int64_t n, unsigned char *zero, const char **what) {
  if (strcmp(grad, "d_w1") != 0 && strcmp(grad, "d_w2") != 0) return QC_NA;
  moe_view v;
  int rc = moe_view_get(m, &v);
  if (rc) return rc;
  if (n != v.E) { free(v.id); return QC_NA; }
  memset(zero, 1, (size_t)n);
  for (int64_t i = 0; i < v.T * v.k; i++) zero[v.id[i]] = 0;
  free(v.id);
  *what = "expert";
  return QC_OK;
}

const qc_class qc_class_moe = {
    .name = "moe",
    .summary = "routed experts with fixed top-k ids: sort, grouped GEMMs, swiglu|relu2, restore, weighted sum, optional shared "
               "experts (gated or not): d_x, d_w1, d_w2, d_topk_weights, d_shared_w1, d_shared_w2, d_shared_gate",
    .bf16_gemm = 1,
    .tensors = "inputs/x inputs/topk_weights saved/topk_weights saved/topk_ids params/w1 params/w2 params/shared_w1 "
               "params/shared_w2 params/shared_gate saved/fc1_out saved/w1_q saved/w1_scale saved/w1_scale_inv "
               "saved/w1_scale_2 saved/w1_global_scale saved/w2_q saved/w2_scale saved/w2_scale_inv saved/w2_scale_2 "
               "saved/w2_global_scale outputs/y",
    .grads = "d_x d_w1 d_w2 d_topk_weights d_shared_w1 d_shared_w2 d_shared_gate",
    .shape_help = "[T, H, F, E, k]: tokens, hidden, expert intermediate, experts, top-k",
    .keys = moe_keys,
    .generate = moe_generate,
    .production = moe_vjp,
    .not_checked = "saved/topk_ids: the selection is discrete (ids fixed from the forward); no gradient by design",
    .forward = moe_forward,
    .fd_shape = "5,6,4,4,2",
    .tol_model = moe_tol_model,
    .validate = moe_validate,
    .round_ops = 4, /* reference variants: operands; outputs; a torch 2 and a torch 1.13 pure-bf16 model (reference/moe.c) */
    .hypotheses = "factor sign transpose rows zero slice dy_precision nonfinite",
    .coverage = moe_cov,
    .cov_facts = moe_cov_facts,
    .stacked_deployed = "expert_weight_format w1 w2",
    .zero_slices = moe_zero_slices,
    .hyps = moe_hyps,
};
