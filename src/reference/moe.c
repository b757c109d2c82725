/* reference/moe.c: float64 VJP of routed experts with fixed top-k ids, from
 * the definition, token by token and slot by slot (no sort, no grouping).
 *
 * For token t and slot j, e = ids[t, j] (fixed; not differentiated):
 *   h = W1_e x_t  (W1_e = w1[e], [2F, H] swiglu or [F, H] relu2)
 *   a = act(h),   y = W2_e a  (W2_e = w2[e], [H, F]),  out_t = sum_j w_tj y
 * so, with dy_t = dL/dout_t:
 *   dL/dw_tj  = <dy_t, y>
 *   dL/da     = w_tj W2_e^T dy_t,            dL/dW2_e += w_tj dy_t a^T
 *   dL/dh     = act'(h) * dL/da
 *   dL/dW1_e += dL/dh x_t^T,                 dL/dx_t  += W1_e^T dL/dh
 * act: relu2 a = max(h, 0)^2, a' = 2 max(h, 0); swiglu a_f = silu(g') u' with
 * g = h_f, u = h_{F+f}, g' = min(g, L), u' = clamp(u, -L, L) (L = 0: no
 * clamp), d/dg = u' silu'(g') [g inside], d/du = silu(g') [u inside],
 * silu'(z) = sigma(z) (1 + z (1 - sigma(z))); at exactly +-L the clamp's
 * derivative is 1 under at_limit = pass, 0 under block. Every sum over a
 * token's slots accumulates, so a token routed twice to one expert counts
 * twice; an expert nobody selects gets zero gradients. Shared experts
 * (contract shared_experts > 0, optionally gated): see ref_shared.
 * The terms' scale (ctx->terms): the forward (h, a, y) as is, the backward
 * over its terms' magnitudes: |dy|, |w|, |W1|, |W2|, |x|, |a| in every
 * product, |W2 a| summed as sum_f |W2||a|, and act' as the magnitudes of
 * its terms (swiglu's silu' = sigma + z sigma (1 - sigma) cancels near
 * z = -1.28: sigma + |z| sigma (1 - sigma)); the gate's 1 - g is a
 * difference (1 + g).
 * Variant ctx->round_ops (the legal roundings of a grouped-GEMM backward):
 * the operands the production builds and feeds to its bf16 GEMMs rounded
 * to bf16: a (into y, dL/dW2), w dy_t (into dL/da, dL/dW2), dL/dh (into
 * dL/dW1, dL/dx); for the shared experts a, g dy_t and dL/dh alike.
 * round_ops 2: also the expert outputs y (and the shared ys) held in bf16,
 * as read by dL/dw = <dy_t, y> (and the gate's <dy_t, ys>).
 * round_ops 3: an eager pure-bf16 model under torch 2 (each op in float32,
 * rounded once): also h and dL/da held in bf16, silu(z) rounded (the saved
 * activation), d_s = b(dL/da u) before silu' (swiglu's variant 1), the
 * shared gate's logit and sigmoid rounded. round_ops 4: the same with
 * silu, silu' and the sigmoid every op in bf16 (torch 1.13's CPU, swiglu's
 * variant 2). Rounding d_s times silu', a factor just above 1 for large
 * z, gives back d_s: a systematic error in d_x (bias z -8.7 on a tiny
 * bf16 Qwen2-MoE at 2 x 4096 tokens) only these variants reproduce. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "model/module.h"
#include "reference/ref_classes.h"
#include "core/qc.h"
#include "numerics/formats.h"
#include "reference/ref_util.h"

static double sigma(double z) { return z >= 0 ? 1.0 / (1.0 + exp(-z)) : exp(z) / (1.0 + exp(z)); }

/* v rounded to bf16 under the round_ops variant (rb), else v. */
static double rnd(int rb, double v) { return rb ? (double)qc_round_bf16((float)v) : v; }

/* silu(z) under variant rb: exact; b(silu(z)) computed once (rb 3, a
 * bf16 model under torch 2); every op in bf16 (rb 4, torch 1.13's CPU:
 * z / b(1 + b(exp(-z)))). */
static double silu_v(int rb, double z) {
  if (rb >= 4) return rnd(1, z / rnd(1, 1.0 + rnd(1, exp(-z))));
  return rb >= 3 ? rnd(1, z * sigma(z)) : z * sigma(z);
}

/* One row of the expert MLP's activation and its derivative, from the
 * definition: h [2F swiglu | F relu2], a [F]: a = act(h); rb >= 3: silu
 * as silu_v (the caller rounds a). */
static void act_f(int relu2, double L, int rb, int64_t F, const double *h, double *a) {
  for (int64_t f = 0; f < F; f++) {
    if (relu2) {
      a[f] = h[f] > 0 ? h[f] * h[f] : 0.0;
      continue;
    }
    double z = h[f], u = h[F + f];
    if (L > 0) {
      z = z > L ? L : z;
      u = u > L ? L : (u < -L ? -L : u);
    }
    a[f] = rb >= 3 ? silu_v(rb, z) * u : z * sigma(z) * u;
  }
}

/* gh [2F | F] = act'(h)^T ga [F] for one row, the clamp's derivative at
 * exactly +-L 1 under pass, 0 otherwise; ab: the magnitudes of act''s
 * terms (the terms' scale). */
static void act_b(int relu2, double L, int pass, int ab, int rb, int64_t F, const double *h, const double *ga, double *gh) {
  for (int64_t f = 0; f < F; f++) {
    if (relu2) {
      gh[f] = h[f] > 0 ? ga[f] * 2.0 * h[f] : 0.0; /* one product: its own magnitude under ab (ga >= 0) */
      continue;
    }
    double z = h[f], u = h[F + f], dz = 1.0, du = 1.0;
    if (L > 0) {
      if (z > L || (z == L && !pass)) dz = 0.0;
      if (fabs(u) > L || (fabs(u) == L && !pass)) du = 0.0;
      z = z > L ? L : z;
      u = u > L ? L : (u < -L ? -L : u);
    }
    if (rb >= 3 && !ab) { /* a bf16 model's ops: d_s = b(ga u) first, as its autograd rounds it (swiglu's variants) */
      const double ds = rnd(1, ga[f] * u);
      if (rb >= 4) {
        const double sgb = rnd(1, 1.0 / rnd(1, 1.0 + rnd(1, exp(-z))));
        gh[f] = dz == 0.0 ? 0.0 : rnd(1, rnd(1, ds * sgb) * rnd(1, 1.0 + rnd(1, z * rnd(1, 1.0 - sgb))));
      } else {
        const double sg = sigma(z);
        gh[f] = dz == 0.0 ? 0.0 : rnd(1, ds * sg * (1.0 + z * (1.0 - sg)));
      }
      gh[F + f] = du == 0.0 ? 0.0 : rnd(1, ga[f] * silu_v(rb, z));
      continue;
    }
    const double sg = sigma(z);
    gh[f] = dz == 0.0 ? 0.0 : ab ? ga[f] * fabs(u) * (sg + fabs(z) * sg * (1.0 - sg)) : ga[f] * u * (sg + z * sg * (1.0 - sg));
    gh[F + f] = du == 0.0 ? 0.0 : ab ? ga[f] * fabs(z * sg) : ga[f] * z * sg;
  }
}

/* The shared experts (contract shared_experts = S > 0), from the math: a
 * dense MLP every token passes through, out_t += g_t Ws2 act(Ws1 x_t), with
 * g_t = sigmoid(<x_t, sg>) under shared_gate = true (1 otherwise). So
 *   dL/dys = g dy_t,  dL/dWs2 += g dy_t a^T,  dL/da = g Ws2^T dy_t,
 *   dL/dh = act'(h) dL/da,  dL/dWs1 += dL/dh x_t^T,
 *   dL/dz = g (1 - g) <dy_t, ys>,  dL/dsg += dL/dz x_t,
 *   dL/dx_t += Ws1^T dL/dh + dL/dz sg.
 * X, G [T, H] are x and dY; dx [T, H] is added to. Checks and refuses the
 * shared tensors (a shared tensor the contract does not use is refused).
 * ab: the terms' scale (G then holds |dY|); rb: the round_ops variant.
 * Returns a status. */
static int ref_shared(const qc_module *m, int relu2, double L, int pass, int ab, int rb, const double *X, const double *G,
                      int64_t T, int64_t H, double *dx, qc_tset *grads) {
  const double S = qc_contract_num(&m->contract, "shared_experts", 0);
  const char *gk = qc_contract_str(&m->contract, "shared_gate", "false");
  const int gated = strcmp(gk, "true") == 0;
  const qc_tensor *t1, *t2, *tg = NULL;
  int rc;
  if (!(S >= 0) || S != floor(S)) return qc_err("%s: contract key 'shared_experts' = %g: expected a whole number >= 0", m->path, S);
  if (!gated && strcmp(gk, "false") != 0) return qc_err("%s: contract key 'shared_gate' = '%s': expected true or false", m->path, gk);
  if (S == 0) {
    static const char *const names[] = {"shared_w1", "shared_w2", "shared_gate"};
    for (int i = 0; i < 3; i++)
      if (qc_tset_get(&m->params, names[i]))
        return qc_err("%s: dataset 'params/%s' is present but the contract's shared_experts is 0", m->path, names[i]);
    if (gated) return qc_err("%s: contract key 'shared_gate' is true but shared_experts is 0", m->path);
    return QC_OK;
  }
  if ((rc = qc_module_need(m, "params", "shared_w1", 2, 2, &t1))) return rc;
  if ((rc = qc_module_need(m, "params", "shared_w2", 2, 2, &t2))) return rc;
  if (gated && (rc = qc_module_need(m, "params", "shared_gate", 1, 2, &tg))) return rc;
  if (!gated && qc_tset_get(&m->params, "shared_gate"))
    return qc_err("%s: dataset 'params/shared_gate' is present but the contract's shared_gate is false", m->path);
  const int64_t Fs = t2->shape[1], Rs = relu2 ? Fs : 2 * Fs;
  if (t2->shape[0] != H || Fs < 1 || Fs % (int64_t)S != 0)
    return qc_err("%s: 'params/shared_w2': expected [H, Fs] with H = %lld, Fs a multiple of %g", m->path, (long long)H, S);
  if (t1->shape[0] != Rs || t1->shape[1] != H)
    return qc_err("%s: 'params/shared_w1': expected [%lld, %lld]", m->path, (long long)Rs, (long long)H);
  if (tg && (qc_numel(tg) != H || tg->shape[tg->ndim - 1] != H))
    return qc_err("%s: 'params/shared_gate': expected [1, H] or [H] with H = %lld", m->path, (long long)H);
  double *W1 = NULL, *W2 = NULL, *SG = NULL, *h = NULL, *a = NULL, *ys = NULL, *ga = NULL, *gh = NULL, *d1, *d2, *dg = NULL;
  rc = QC_ESYS;
  if (!(W1 = qc_refu_load(t1, "reference moe shared_w1")) || !(W2 = qc_refu_load(t2, "reference moe shared_w2")) ||
      (tg && !(SG = qc_refu_load(tg, "reference moe shared_gate"))) || !(h = qc_malloc((size_t)Rs * sizeof *h, "reference h")) ||
      !(a = qc_malloc((size_t)Fs * sizeof *a, "reference a")) || !(ys = qc_malloc((size_t)H * sizeof *ys, "reference ys")) ||
      !(ga = qc_malloc((size_t)Fs * sizeof *ga, "reference dL/da")) || !(gh = qc_malloc((size_t)Rs * sizeof *gh, "reference dL/dh")))
    goto done;
  if ((rc = qc_refu_out(grads, "d_shared_w1", 2, t1->shape, &d1)) || (rc = qc_refu_out(grads, "d_shared_w2", 2, t2->shape, &d2)) ||
      (tg && (rc = qc_refu_out(grads, "d_shared_gate", tg->ndim, tg->shape, &dg))))
    goto done;
  for (int64_t t = 0; t < T; t++) {
    const double *xr = X + t * H, *g = G + t * H;
    for (int64_t r = 0; r < Rs; r++) {
      double s = 0;
      for (int64_t c = 0; c < H; c++) s += W1[r * H + c] * xr[c];
      h[r] = rb >= 3 ? rnd(rb, s) : s; /* rb >= 3: the GEMM's output held in bf16 */
    }
    act_f(relu2, L, rb, Fs, h, a);
    for (int64_t f = 0; rb && f < Fs; f++) a[f] = rnd(rb, a[f]);
    double z = 0, dot = 0;
    for (int64_t c = 0; c < H; c++) {
      double y = 0;
      for (int64_t f = 0; f < Fs; f++) y += ab ? fabs(W2[c * Fs + f] * a[f]) : W2[c * Fs + f] * a[f];
      ys[c] = rb >= 2 ? rnd(rb, y) : y;
      dot += g[c] * ys[c];
      if (SG) z += xr[c] * SG[c];
    }
    if (rb >= 3) z = rnd(rb, z); /* the gate's GEMM output, then its sigmoid rounded (every op under rb 4) */
    const double gs = !SG ? 1.0 : rb >= 4 ? rnd(1, 1.0 / rnd(1, 1.0 + rnd(1, exp(-z)))) : rb >= 3 ? rnd(1, sigma(z)) : sigma(z);
    const double dz = SG ? gs * (ab ? 1.0 + gs : 1.0 - gs) * dot : 0.0;
    for (int64_t f = 0; f < Fs; f++) ga[f] = 0;
    for (int64_t c = 0; c < H; c++)
      for (int64_t f = 0; f < Fs; f++) {
        const double gg = SG ? rnd(rb, gs * g[c]) : g[c];
        ga[f] += gg * (ab ? fabs(W2[c * Fs + f]) : W2[c * Fs + f]);
        d2[c * Fs + f] += gg * (ab ? fabs(a[f]) : a[f]);
      }
    for (int64_t f = 0; rb >= 3 && f < Fs; f++) ga[f] = rnd(rb, ga[f]); /* dL/da: a GEMM's output held in bf16 */
    act_b(relu2, L, pass, ab, rb, Fs, h, ga, gh);
    for (int64_t r = 0; rb && r < Rs; r++) gh[r] = rnd(rb, gh[r]);
    for (int64_t r = 0; r < Rs; r++)
      for (int64_t c = 0; c < H; c++) {
        d1[r * H + c] += gh[r] * (ab ? fabs(xr[c]) : xr[c]);
        dx[t * H + c] += (ab ? fabs(W1[r * H + c]) : W1[r * H + c]) * gh[r];
      }
    for (int64_t c = 0; SG && c < H; c++) {
      dg[c] += dz * (ab ? fabs(xr[c]) : xr[c]);
      dx[t * H + c] += dz * (ab ? fabs(SG[c]) : SG[c]);
    }
  }
  rc = QC_OK;
done:
  free(W1); free(W2); free(SG); free(h); free(a); free(ys); free(ga); free(gh);
  return rc;
}

int qc_ref_moe(const qc_ctx *ctx, const qc_module *m, const qc_tensor *dy, qc_tset *grads) {
  const int ab = ctx && ctx->terms, rb = ctx && !ab ? ctx->round_ops : 0;
  const qc_tensor *xt, *w1t, *w2t, *it, *wtt;
  int rc;
  if ((rc = qc_module_need(m, "inputs", "x", 2, 2, &xt))) return rc;
  if ((rc = qc_module_need(m, "params", "w1", 3, 3, &w1t))) return rc;
  if ((rc = qc_module_need(m, "params", "w2", 3, 3, &w2t))) return rc;
  if ((rc = qc_module_need(m, "saved", "topk_ids", 2, 2, &it))) return rc;
  const char *role = qc_tset_get(&m->inputs, "topk_weights") ? "inputs" : "saved";
  if ((rc = qc_module_need(m, role, "topk_weights", 1, QC_MAXDIM, &wtt))) return rc;
  const char *act = qc_contract_str(&m->contract, "activation", "swiglu");
  const int relu2 = strcmp(act, "relu2") == 0;
  if (!relu2 && strcmp(act, "swiglu") != 0) return qc_err("%s: contract key 'activation' = '%s': expected swiglu or relu2", m->path, act);
  const double L = qc_contract_num(&m->contract, "limit", 0);
  const int pass = strcmp(qc_contract_str(&m->contract, "at_limit", "pass"), "pass") == 0;
  if (!(L >= 0)) return qc_err("%s: contract key 'limit' = %g: expected >= 0", m->path, L);
  if (L > 0 && relu2) return qc_err("%s: contract key 'limit' = %g: only activation swiglu has a clamp", m->path, L);
  const int64_t T = xt->shape[0], H = xt->shape[1], E = w2t->shape[0], F = w2t->shape[2], k = it->shape[1];
  const int64_t R = relu2 ? F : 2 * F;
  if (w2t->shape[1] != H || F < 1 || E < 1) return qc_err("%s: 'params/w2': expected [E, H, F] with H = %lld", m->path, (long long)H);
  if (w1t->shape[0] != E || w1t->shape[1] != R || w1t->shape[2] != H)
    return qc_err("%s: 'params/w1' is [%lld, %lld, %lld]: expected [%lld, %lld, %lld] for activation %s", m->path,
                  (long long)w1t->shape[0], (long long)w1t->shape[1], (long long)w1t->shape[2], (long long)E, (long long)R,
                  (long long)H, act);
  if (it->shape[0] != T) return qc_err("%s: 'saved/topk_ids': expected [%lld, k]", m->path, (long long)T);
  if (wtt->ndim != 2 || wtt->shape[0] != T || wtt->shape[1] != k)
    return qc_err("%s: '%s/topk_weights': expected [T, k] = [%lld, %lld]", m->path, role, (long long)T, (long long)k);
  if ((rc = qc_module_check_dy(m, dy, T * H, H, "the shape of inputs/x [T, H]"))) return rc;
  int64_t *id = NULL;
  double *X = NULL, *W1 = NULL, *W2 = NULL, *Wt = NULL, *G = NULL, *h = NULL, *a = NULL, *ga = NULL, *gh = NULL;
  double *dx, *dw1, *dw2, *dwt;
  if ((rc = qc_refu_ids(m, it, "saved/topk_ids", &id))) return rc;
  for (int64_t i = 0; i < T * k; i++)
    if (id[i] < 0 || id[i] >= E) {
      rc = qc_err("%s: 'saved/topk_ids'[%lld, %lld] = %lld: expected 0..%lld", m->path, (long long)(i / k), (long long)(i % k),
                  (long long)id[i], (long long)(E - 1));
      goto done;
    }
  rc = QC_ESYS;
  if (!(X = qc_refu_load(xt, "reference moe x")) || !(W1 = qc_refu_load(w1t, "reference moe w1")) ||
      !(W2 = qc_refu_load(w2t, "reference moe w2")) || !(Wt = qc_refu_load(wtt, "reference moe topk_weights")) ||
      !(G = qc_refu_load(dy, "reference moe dY")))
    goto done;
  for (int64_t i = 0; ab && i < T * H; i++) G[i] = fabs(G[i]); /* the terms' scale: |dY|, |w| */
  for (int64_t i = 0; ab && i < T * k; i++) Wt[i] = fabs(Wt[i]);
  if (!(h = qc_malloc((size_t)R * sizeof *h, "reference h")) || !(a = qc_malloc((size_t)F * sizeof *a, "reference a")) ||
      !(ga = qc_malloc((size_t)F * sizeof *ga, "reference dL/da")) || !(gh = qc_malloc((size_t)R * sizeof *gh, "reference dL/dh")))
    goto done;
  int64_t ws[2] = {T, k};
  if ((rc = qc_refu_out(grads, "d_x", 2, xt->shape, &dx)) || (rc = qc_refu_out(grads, "d_w1", 3, w1t->shape, &dw1)) ||
      (rc = qc_refu_out(grads, "d_w2", 3, w2t->shape, &dw2)) || (rc = qc_refu_out(grads, "d_topk_weights", 2, ws, &dwt)))
    goto done;
  for (int64_t t = 0; t < T; t++) {
    const double *xr = X + t * H, *g = G + t * H;
    for (int64_t j = 0; j < k; j++) {
      const int64_t e = id[t * k + j];
      const double w = Wt[t * k + j], *A1 = W1 + e * R * H, *A2 = W2 + e * H * F;
      double *D1 = dw1 + e * R * H, *D2 = dw2 + e * H * F;
      for (int64_t r = 0; r < R; r++) {
        double s = 0;
        for (int64_t c = 0; c < H; c++) s += A1[r * H + c] * xr[c];
        h[r] = rb >= 3 ? rnd(rb, s) : s;
      }
      act_f(relu2, L, rb, F, h, a);
      for (int64_t f = 0; rb && f < F; f++) a[f] = rnd(rb, a[f]);
      /* dL/dw = <dy_t, W2_e a>;  dL/da = w W2_e^T dy_t;  dW2_e += w dy_t a^T */
      double dot = 0;
      for (int64_t f = 0; f < F; f++) ga[f] = 0;
      for (int64_t c = 0; c < H; c++) {
        double yc = 0;
        for (int64_t f = 0; f < F; f++) {
          const double w2 = ab ? fabs(A2[c * F + f]) : A2[c * F + f], af = ab ? fabs(a[f]) : a[f];
          yc += w2 * af;
          const double wg = rnd(rb, w * g[c]);
          ga[f] += wg * w2;
          D2[c * F + f] += wg * af;
        }
        dot += g[c] * (rb >= 2 ? rnd(rb, yc) : yc);
      }
      dwt[t * k + j] = dot;
      /* dL/dh */
      for (int64_t f = 0; rb >= 3 && f < F; f++) ga[f] = rnd(rb, ga[f]);
      act_b(relu2, L, pass, ab, rb, F, h, ga, gh);
      for (int64_t r = 0; rb && r < R; r++) gh[r] = rnd(rb, gh[r]);
      /* dW1_e += dL/dh x_t^T;  d_x_t += W1_e^T dL/dh */
      for (int64_t r = 0; r < R; r++)
        for (int64_t c = 0; c < H; c++) {
          D1[r * H + c] += gh[r] * (ab ? fabs(xr[c]) : xr[c]);
          dx[t * H + c] += (ab ? fabs(A1[r * H + c]) : A1[r * H + c]) * gh[r];
        }
    }
  }
  rc = ref_shared(m, relu2, L, pass, ab, rb, X, G, T, H, dx, grads);
done:
  free(id); free(X); free(W1); free(W2); free(Wt); free(G); free(h); free(a); free(ga); free(gh);
  return rc;
}
