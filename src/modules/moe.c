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
#include "model/module.h"
#include "modules/classes.h"
#include "numerics/formats.h"
#include "core/qc.h"
#include "modules/mod_util.h"

static const qc_key_spec moe_keys[] = {
    {"activation", "swiglu|relu2", "swiglu", "expert activation: silu(gate) * up (w1 [E, 2F, H]) or relu(h)^2 (w1 [E, F, H])"},
    {"limit", NULL, "0", "swiglu clamp limit L: gate <= L, -L <= up <= L (0: no clamp; as the swiglu class)"},
    {"at_limit", "pass|block", "pass", "clamp derivative at exactly +-L: 1 (pass, torch.clamp) or 0 (block)"},
    {NULL, NULL, NULL, NULL}};

/* The tensors and settings of a moe module. */
typedef struct {
  const qc_tensor *x, *w1, *w2, *wt, *ids;
  int64_t T, H, F, E, k, R; /* R: rows of w1 per expert (2F swiglu, F relu2) */
  int swiglu, block;
  double L;
  int64_t *id; /* [T*k], checked in [0, E) */
} moe_view;

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

/* a = act(h) for one row: h [R], a [F] (float32). */
static void act_row(const moe_view *v, const float *h, float *a) {
  const float L = (float)v->L;
  for (int64_t f = 0; f < v->F; f++) {
    if (!v->swiglu) {
      a[f] = h[f] > 0.0f ? h[f] * h[f] : 0.0f;
      continue;
    }
    float g = h[f], u = h[v->F + f];
    if (L > 0) {
      g = fminf(g, L);
      u = fminf(fmaxf(u, -L), L);
    }
    a[f] = g / (1.0f + expf(-g)) * u;
  }
}

/* d_h [R] = act'(h) d_a for one row (float32, closed form). */
static void act_vjp_row(const moe_view *v, const float *h, const float *da, float *dh) {
  const float L = (float)v->L;
  for (int64_t f = 0; f < v->F; f++) {
    if (!v->swiglu) {
      dh[f] = h[f] > 0.0f ? da[f] * 2.0f * h[f] : 0.0f;
      continue;
    }
    float g = h[f], u = h[v->F + f];
    int gp = 1, up = 1;
    if (L > 0) {
      gp = clamp_passes(g, -INFINITY, L, v->block);
      up = clamp_passes(u, -L, L, v->block);
      g = fminf(g, L);
      u = fminf(fmaxf(u, -L), L);
    }
    float s = 1.0f / (1.0f + expf(-g));
    dh[f] = gp ? da[f] * u * (s * (1.0f + g * (1.0f - s))) : 0.0f;
    dh[v->F + f] = up ? da[f] * (g * s) : 0.0f;
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

/* Production VJP (see the file comment). */
static int moe_vjp(const qc_ctx *ctx, const qc_module *m, const qc_tensor *dy, qc_tset *grads) {
  moe_view v;
  int rc = moe_view_get(m, &v);
  if (rc) return rc;
  const int64_t T = v.T, H = v.H, F = v.F, E = v.E, k = v.k, R = v.R, N = T * k;
  uint16_t *xb = NULL, *w1b = NULL, *w2b = NULL, *gb = NULL, *Xe = NULL, *ab = NULL, *Ge = NULL, *dhb = NULL;
  float *wt = NULL, *g = NULL, *h = NULL, *a = NULL, *ye = NULL, *da = NULL, *dh = NULL, *dxe = NULL;
  int64_t *cnt = NULL, *perm = NULL;
  float *dx, *dw1, *dw2, *dwt;
  const qc_backend *be = ctx->be;
  if ((rc = qc_module_check_dy(m, dy, T * H, H, "the shape of inputs/x [T, H]"))) goto done;
  rc = QC_ESYS;
  if (!(xb = to_bf16(v.x, "moe x bf16")) || !(w1b = to_bf16(v.w1, "moe w1 bf16")) || !(w2b = to_bf16(v.w2, "moe w2 bf16")) ||
      !(gb = to_bf16(dy, "moe dY bf16")) || !(wt = qc_mod_f32(v.wt, "moe topk_weights")))
    goto done;
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
  if (!(Xe = qc_malloc(nw * H * sizeof *Xe, "moe gathered x")) || !(ab = qc_malloc(nw * F * sizeof *ab, "moe a bf16")) ||
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
    const uint16_t *W1 = w1b + e * R * H, *W2 = w2b + e * H * F;
    for (int64_t i = 0; i < n; i++) memcpy(Xe + i * H, xb + (perm[off + i] / k) * H, (size_t)H * sizeof *Xe);
    /* forward replay: h = Xe W1^T [n, R], a = act(h), y = a W2^T [n, H] */
    if ((rc = be->gemm_bf16(be, QC_OP_N, QC_OP_T, n, R, H, Xe, H, W1, H, h, R))) goto done;
    for (int64_t i = 0; i < n; i++) act_row(&v, h + i * R, a + i * F);
    for (int64_t i = 0; i < n * F; i++) ab[i] = qc_f32_to_bf16(a[i]);
    if ((rc = be->gemm_bf16(be, QC_OP_N, QC_OP_T, n, H, F, ab, F, W2, F, ye, H))) goto done;
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
    /* d_a = G W2 [n, F]; d_w2[e] = G^T a [H, F] */
    if ((rc = be->gemm_bf16(be, QC_OP_N, QC_OP_N, n, F, H, Ge, H, W2, F, da, F))) goto done;
    if ((rc = be->gemm_bf16(be, QC_OP_T, QC_OP_N, H, F, n, Ge, H, ab, F, dw2 + e * H * F, F))) goto done;
    /* d_h = act'(h) d_a; d_w1[e] = d_h^T Xe [R, H]; d_x rows = d_h W1 [n, H] */
    for (int64_t i = 0; i < n; i++) act_vjp_row(&v, h + i * R, da + i * F, dh + i * R);
    for (int64_t i = 0; i < n * R; i++) dhb[i] = qc_f32_to_bf16(dh[i]);
    if ((rc = be->gemm_bf16(be, QC_OP_T, QC_OP_N, R, H, n, dhb, R, Xe, H, dw1 + e * R * H, H))) goto done;
    if ((rc = be->gemm_bf16(be, QC_OP_N, QC_OP_N, n, H, R, dhb, R, W1, H, dxe, H))) goto done;
    /* restore: back to the token through the permutation, accumulating */
    for (int64_t i = 0; i < n; i++) {
      float *dr = dx + (perm[off + i] / k) * H;
      for (int64_t c = 0; c < H; c++) dr[c] += dxe[i * H + c];
    }
  }
  rc = QC_OK;
done:
  free(xb); free(w1b); free(w2b); free(gb); free(wt); free(cnt); free(perm);
  free(Xe); free(ab); free(Ge); free(dhb); free(g); free(h); free(a); free(ye); free(da); free(dh); free(dxe);
  free(v.id);
  return rc;
}

/* The error model: the grouped GEMMs take bf16 operands the production
 * rounds from float32 and the reference keeps exact (w dY and d_h into d_x
 * and d_w1; w dY and a into d_w2; a into d_topk_weights); d_x sums k x
 * rows-of-w1 products per token, d_w1 and d_w2 sum over the (token, slot)
 * pairs of the busiest expert, d_topk_weights is one length-H dot whose
 * cancellation needs margin 3 (few elements per token to average over). */
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
    qc_mod_tm(tm, v.k * v.R, 1, 2, 0, "d_x_t = sum_j W1_e^T d_h over k x rows of w1 = %lld products; the production rounds "
              "w dY and d_h to bf16 (2 operands)", (long long)(v.k * v.R));
  else if (strcmp(grad, "d_w1") == 0 || strcmp(grad, "d_w2") == 0)
    qc_mod_tm(tm, busiest, 1, 2, 0, "%s sums over the (token, slot) pairs of an expert, %lld at most; the production rounds "
              "%s to bf16 (2 operands)", grad, (long long)busiest, grad[3] == '1' ? "w dY and d_h" : "w dY and a");
  else if (strcmp(grad, "d_topk_weights") == 0)
    qc_mod_tm(tm, v.H, 1, 1, 3, "d_topk_weights[t, j] = <dY_t, W2_e a>, one length-H = %lld dot; a rounded to bf16 (1 "
              "operand); margin 3 for the dot's cancellation over few elements", (long long)v.H);
  else
    return qc_err("%s: class moe has no gradient '%s'", m->path, grad);
  return QC_OK;
}

/* Float64 forward out [T, H]. The discrete branches are taken from branch:
 * the ids, the ReLU's side and which side of the clamp limit each value of
 * h = w1[e] x_t lies on. */
static int moe_forward(const qc_module *m, const qc_module *branch, qc_tensor *y) {
  moe_view v, bv;
  int rc;
  double *x = NULL, *w1 = NULL, *w2 = NULL, *wt = NULL, *bx = NULL, *bw1 = NULL, *h = NULL, *bh = NULL, *a = NULL;
  memset(&bv, 0, sizeof bv);
  if ((rc = moe_view_get(m, &v))) return rc;
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
      for (int64_t f = 0; f < F; f++) {
        if (!v.swiglu) {
          a[f] = bh[f] > 0 ? h[f] * h[f] : 0.0;
          continue;
        }
        double gc = h[f], uc = h[F + f];
        if (v.L > 0) {
          if (!clamp_passes(bh[f], -INFINITY, v.L, v.block)) gc = v.L;
          if (!clamp_passes(bh[F + f], -v.L, v.L, v.block)) uc = bh[F + f] > 0 ? v.L : -v.L;
        }
        a[f] = gc / (1.0 + exp(-gc)) * uc;
      }
      for (int64_t c = 0; c < H; c++) {
        double s = 0;
        for (int64_t f = 0; f < F; f++) s += w2[(e * H + c) * F + f] * a[f];
        out[t * H + c] += wt[t * k + j] * s;
      }
    }
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
 * 0.05 + U(0,1). */
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
  *ondim = 2;
  oshape[0] = T;
  oshape[1] = H;
  return QC_OK;
}

const qc_class qc_class_moe = {
    .name = "moe",
    .summary = "routed experts with fixed top-k ids: sort, grouped GEMMs, swiglu|relu2, restore, weighted sum: d_x, d_w1, d_w2, d_topk_weights",
    .tensors = "inputs/x inputs/topk_weights saved/topk_weights saved/topk_ids params/w1 params/w2 outputs/y",
    .grads = "d_x d_w1 d_w2 d_topk_weights",
    .shape_help = "[T, H, F, E, k]: tokens, hidden, expert intermediate, experts, top-k",
    .keys = moe_keys,
    .generate = moe_generate,
    .production = moe_vjp,
    .not_checked = "saved/topk_ids: the selection is discrete (ids fixed from the forward); no gradient by design",
    .forward = moe_forward,
    .fd_shape = "5,6,4,4,2",
    .tol_model = moe_tol_model,
    .hypotheses = "factor sign transpose rows zero slice dy_precision nonfinite",
};
