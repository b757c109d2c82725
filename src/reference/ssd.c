/* reference/ssd.c: the float64 VJP of the Mamba-2 SSD scan (G groups of
 * B and C, optional D skip, optional z gate), from the sequential
 * recurrence, no chunking.
 *
 * Bm, Cm are [B, L, N] (G = 1) or [B, L, G, N]; the H heads split evenly
 * into the G groups, heads g H/G .. (g+1) H/G - 1 reading group g, so B_t
 * and C_t below are head h's group's. Their gradients are summed over the
 * heads of that group only.
 * Per batch b and head h, state h_t [P, N], g_t = exp(dt_t A):
 *   h_0 = initial_state (contract initial_state = true) or 0
 *   h_t = g_t h_{t-1} + dt_t x_t (x) B_t,     y_t = h_t C_t
 * Reverse mode with the adjoint state G_t = dL/dh_t, t = L..1:
 *   G_t = dy_t (x) C_t + g_{t+1} G_{t+1}       (G_{L+1} = 0)
 *   d_C_t  += h_t^T dy_t                        (summed over the group's heads)
 *   d_x_t   = dt_t G_t B_t
 *   d_B_t  += dt_t G_t^T x_t                    (summed over the group's heads)
 *   e_t     = g_t <G_t, h_{t-1}>                (dL/d(dt_t A))
 *   d_dt_t  = A e_t + x_t . (G_t B_t)
 *   d_A    += dt_t e_t
 *   d_initial_state = g_1 G_1
 * D skip (contract d_skip = true): y_t gains D_h x_t, a direct path from
 * x to y beside the state, so d_x_t gains D_h dy_t and
 *   d_D[h] = sum over b, t, p of dy_t[p] x_t[p].
 * z gate (contract z_gate = true, inputs/z shaped as x): the output is
 * o_t = y_t * silu(z_t) elementwise, y_t the scan plus the skip above. With
 * do_t = dL/do_t (the dY given), sigma = 1 / (1 + exp(-z)):
 *   d_z_t = do_t y_t silu'(z_t),  silu'(z) = sigma (1 + z (1 - sigma))
 *   dy_t  = do_t silu(z_t)      (what every formula above reads as dy)
 * Every h_t of a (b, h) is kept from the forward sweep.
 * The terms' scale (ctx->terms): the same sweeps on |x|, |B|, |C|, |dy|,
 * |h_0|, |D| and |A| (g_t > 0 as is), so every state, adjoint and sum is
 * the sum of its terms' magnitudes. A chunked production takes g_s ... g_t
 * as exp of a difference of float32 cumsums, whose error u (|cs_t| +
 * |cs_s|) is not u |cs_t - cs_s|; but each step's cumsum rounds on its own,
 * so those errors are independent across the terms and add in quadrature,
 * below u times the sum of the magnitudes (a chunk of 64 steps of dt A ~
 * -0.6: the correct float32 d_A errs by 6e-7 relative, its terms' scale
 * allows 1e-5), and no weight is added for them. Under the gate: d_z's
 * terms |do| (|h_t| |C_t| + |D x_t|) (sigma + |z| sigma (1 - sigma)) (silu'
 * cancels near z = -1.28), and dy's |do silu(z)|. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "model/module.h"
#include "reference/ref_classes.h"
#include "core/qc.h"
#include "reference/ref_util.h"

/* The float64 VJP from the math above (a qc_vjp_fn): every gradient the contract makes
 * differentiable into grads; QC_EINPUT naming what is wrong with bad input. */
static int ref_ssd(const qc_ctx *ctx, const qc_module *m, const qc_tensor *dy, qc_tset *grads) {
  const int ab = ctx && ctx->terms;
  const qc_tensor *xt, *dtt, *at, *bt, *ct, *h0t = NULL, *Dt = NULL, *zt = NULL;
  int rc;
  if ((rc = qc_module_need(m, "inputs", "x", 4, 4, &xt))) return rc;
  if ((rc = qc_module_need(m, "inputs", "dt", 3, 3, &dtt))) return rc;
  if ((rc = qc_module_need(m, "inputs", "A", 1, 1, &at))) return rc;
  if ((rc = qc_module_need(m, "inputs", "Bm", 3, 4, &bt))) return rc;
  if ((rc = qc_module_need(m, "inputs", "Cm", 3, 4, &ct))) return rc;
  const int64_t Bt = xt->shape[0], L = xt->shape[1], H = xt->shape[2], P = xt->shape[3];
  const int64_t NG = bt->ndim == 4 ? bt->shape[2] : 1, N = bt->shape[bt->ndim - 1];
  if (dtt->shape[0] != Bt || dtt->shape[1] != L || dtt->shape[2] != H)
    return qc_err("%s: 'inputs/dt': expected [B, L, H] = [%lld, %lld, %lld]", m->path, (long long)Bt, (long long)L,
                  (long long)H);
  if (at->shape[0] != H) return qc_err("%s: 'inputs/A': expected [H] = [%lld]", m->path, (long long)H);
  if (bt->shape[0] != Bt || bt->shape[1] != L || NG < 1 || H % NG != 0)
    return qc_err("%s: 'inputs/Bm': expected [B, L, N] or [B, L, G, N] with B = %lld, L = %lld and G dividing H = %lld", m->path,
                  (long long)Bt, (long long)L, (long long)H);
  if (ct->ndim != bt->ndim || ct->shape[0] != Bt || ct->shape[1] != L || ct->shape[ct->ndim - 1] != N ||
      (ct->ndim == 4 && ct->shape[2] != NG))
    return qc_err("%s: 'inputs/Cm': expected the shape of 'inputs/Bm' (B = %lld, L = %lld, G = %lld, N = %lld)", m->path,
                  (long long)Bt, (long long)L, (long long)NG, (long long)N);
  const int64_t hpg = H / NG; /* heads per group */
  const int init = strcmp(qc_contract_str(&m->contract, "initial_state", "false"), "true") == 0;
  if (init) {
    if ((rc = qc_module_need(m, "inputs", "initial_state", 4, 4, &h0t))) return rc;
    if (h0t->shape[0] != Bt || h0t->shape[1] != H || h0t->shape[2] != P || h0t->shape[3] != N)
      return qc_err("%s: 'inputs/initial_state': expected [B, H, P, N] = [%lld, %lld, %lld, %lld]", m->path, (long long)Bt,
                    (long long)H, (long long)P, (long long)N);
  }
  const int skip = strcmp(qc_contract_str(&m->contract, "d_skip", "false"), "true") == 0;
  if (skip) {
    if ((rc = qc_module_need(m, "inputs", "D", 1, 1, &Dt))) return rc;
    if (Dt->shape[0] != H) return qc_err("%s: 'inputs/D': expected [H] = [%lld]", m->path, (long long)H);
  }
  const int gate = strcmp(qc_contract_str(&m->contract, "z_gate", "false"), "true") == 0;
  if (gate) {
    if ((rc = qc_module_need(m, "inputs", "z", 4, 4, &zt))) return rc;
    if (!qc_shape_eq(zt, xt)) return qc_err("%s: 'inputs/z': expected the shape of 'inputs/x' [B, L, H, P]", m->path);
  }
  const double cs = qc_contract_num(&m->contract, "chunk_size", 64); /* the production's blocking; no effect here */
  if (!(cs >= 1) || cs != floor(cs)) return qc_err("%s: contract key 'chunk_size' = %g: expected a whole number >= 1", m->path, cs);
  if ((rc = qc_module_check_dy(m, dy, Bt * L * H * P, P, "the shape of inputs/x [B, L, H, P]"))) return rc;
  const int64_t PN = P * N;
  double *X = NULL, *DT = NULL, *AA = NULL, *BB = NULL, *CC = NULL, *H0 = NULL, *G = NULL, *hs = NULL, *adj = NULL;
  double *DD = NULL, *Z = NULL;
  double *dx, *ddt, *dA, *dB, *dC, *dh0 = NULL, *dD = NULL, *dz = NULL;
  rc = QC_ESYS;
  if (!(X = qc_refu_load(xt, "reference ssd x")) || !(DT = qc_refu_load(dtt, "reference ssd dt")) ||
      !(AA = qc_refu_load(at, "reference ssd A")) || !(BB = qc_refu_load(bt, "reference ssd Bm")) ||
      !(CC = qc_refu_load(ct, "reference ssd Cm")) || !(G = qc_refu_load(dy, "reference ssd dY")) ||
      (init && !(H0 = qc_refu_load(h0t, "reference ssd initial_state"))) || (skip && !(DD = qc_refu_load(Dt, "reference ssd D"))) ||
      (gate && !(Z = qc_refu_load(zt, "reference ssd z"))))
    goto done;
  for (int64_t h = 0; h < H; h++)
    if (!(AA[h] <= 0) || !isfinite(AA[h])) {
      rc = qc_err("%s: dataset 'inputs/A' element %lld = %g: expected a finite value <= 0", m->path, (long long)h, AA[h]);
      goto done;
    }
  for (int64_t i = 0; i < Bt * L * H; i++)
    if (!(DT[i] >= 0) || !isfinite(DT[i])) {
      rc = qc_err("%s: dataset 'inputs/dt' element %lld = %g: expected a finite value >= 0", m->path, (long long)i, DT[i]);
      goto done;
    }
  if (ab) { /* the terms' scale: every operand in magnitude */
    double *const arr[] = {X, BB, CC, G, H0, DD};
    const int64_t len[] = {Bt * L * H * P, Bt * L * NG * N, Bt * L * NG * N, Bt * L * H * P, init ? Bt * H * PN : 0, skip ? H : 0};
    for (int j = 0; j < 6; j++)
      for (int64_t i = 0; i < len[j]; i++) arr[j][i] = fabs(arr[j][i]);
  }
  rc = QC_ESYS;
  if (!(hs = qc_malloc((size_t)((L + 1) * PN) * sizeof *hs, "reference ssd states")) ||
      !(adj = qc_malloc((size_t)PN * sizeof *adj, "reference ssd adjoint state")))
    goto done;
  if ((rc = qc_refu_out(grads, "d_x", 4, xt->shape, &dx))) goto done;
  if ((rc = qc_refu_out(grads, "d_dt", 3, dtt->shape, &ddt))) goto done;
  if ((rc = qc_refu_out(grads, "d_A", 1, at->shape, &dA))) goto done;
  if ((rc = qc_refu_out(grads, "d_Bm", bt->ndim, bt->shape, &dB))) goto done;
  if ((rc = qc_refu_out(grads, "d_Cm", ct->ndim, ct->shape, &dC))) goto done;
  if (init && (rc = qc_refu_out(grads, "d_initial_state", 4, h0t->shape, &dh0))) goto done;
  if (skip && (rc = qc_refu_out(grads, "d_D", 1, Dt->shape, &dD))) goto done;
  if (gate && (rc = qc_refu_out(grads, "d_z", 4, zt->shape, &dz))) goto done;
  for (int64_t b = 0; b < Bt; b++)
    for (int64_t h = 0; h < H; h++) {
      /* forward sweep: hs[t] = h_t, t = 0..L */
      for (int64_t e = 0; e < PN; e++) hs[e] = init ? H0[(b * H + h) * PN + e] : 0.0;
      for (int64_t t = 1; t <= L; t++) {
        const int64_t r = (b * L + t - 1) * H + h;
        const double g = exp(DT[r] * AA[h]);
        const double *xr = X + r * P, *br = BB + ((b * L + t - 1) * NG + h / hpg) * N;
        const double *prev = hs + (t - 1) * PN;
        double *cur = hs + t * PN;
        for (int64_t p = 0; p < P; p++)
          for (int64_t n = 0; n < N; n++) cur[p * N + n] = g * prev[p * N + n] + DT[r] * xr[p] * br[n];
        /* the gate: d_z from the output y_t (the read-out plus the skip), and
         * this head's dy turned into do silu(z) for the sweep below */
        const double *cr = CC + ((b * L + t - 1) * NG + h / hpg) * N;
        for (int64_t p = 0; gate && p < P; p++) {
          double y = skip ? DD[h] * xr[p] : 0.0;
          for (int64_t n = 0; n < N; n++) y += cur[p * N + n] * cr[n];
          const int64_t i = r * P + p;
          const double z = Z[i], sg = 1.0 / (1.0 + exp(-z));
          dz[i] = ab ? fabs(G[i]) * y * (sg + fabs(z) * sg * (1.0 - sg)) : G[i] * y * sg * (1.0 + z * (1.0 - sg));
          G[i] *= ab ? fabs(z * sg) : z * sg;
        }
      }
      /* reverse sweep with the adjoint state */
      memset(adj, 0, (size_t)PN * sizeof *adj);
      for (int64_t t = L; t >= 1; t--) {
        const int64_t r = (b * L + t - 1) * H + h;
        const double *xr = X + r * P, *br = BB + ((b * L + t - 1) * NG + h / hpg) * N, *cr = CC + ((b * L + t - 1) * NG + h / hpg) * N, *gr = G + r * P;
        const double *ht = hs + t * PN, *hp = hs + (t - 1) * PN;
        /* adj currently holds g_{t+1} G_{t+1}; add the read-out y_t = h_t C_t */
        for (int64_t p = 0; p < P; p++)
          for (int64_t n = 0; n < N; n++) adj[p * N + n] += gr[p] * cr[n];
        for (int64_t n = 0; n < N; n++) {
          double s = 0;
          for (int64_t p = 0; p < P; p++) s += ht[p * N + n] * gr[p];
          dC[((b * L + t - 1) * NG + h / hpg) * N + n] += s;
        }
        const double g = exp(DT[r] * AA[h]);
        double e = 0, xg = 0;
        for (int64_t p = 0; p < P; p++) {
          double gb = 0;
          for (int64_t n = 0; n < N; n++) {
            gb += adj[p * N + n] * br[n];
            e += adj[p * N + n] * hp[p * N + n];
          }
          dx[r * P + p] = DT[r] * gb + (skip ? DD[h] * gr[p] : 0.0); /* the state path + the skip path */
          if (skip) dD[h] += gr[p] * xr[p];
          xg += xr[p] * gb;
        }
        for (int64_t n = 0; n < N; n++) {
          double s = 0;
          for (int64_t p = 0; p < P; p++) s += adj[p * N + n] * xr[p];
          dB[((b * L + t - 1) * NG + h / hpg) * N + n] += DT[r] * s;
        }
        e *= g;
        ddt[r] = (ab ? fabs(AA[h]) : AA[h]) * e + xg;
        dA[h] += DT[r] * e;
        for (int64_t i = 0; i < PN; i++) adj[i] *= g; /* now g_t G_t: dL/dh_{t-1} from step t */
      }
      if (dh0)
        for (int64_t i = 0; i < PN; i++) dh0[(b * H + h) * PN + i] = adj[i];
    }
  rc = QC_OK;
done:
  free(X); free(DT); free(AA); free(BB); free(CC); free(H0); free(DD); free(Z); free(G); free(hs); free(adj);
  return rc;
}

/* The class's reference, its one export (src/classes/registry.c pairs it
 * with src/modules/ssd.c). */
const qc_reference qc_reference_ssd = {.vjp = ref_ssd, .terms = 1};
