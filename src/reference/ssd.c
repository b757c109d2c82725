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
#include "core/par.h"
#include "core/qc.h"
#include "reference/ref_util.h"

/* The sweeps of every (b, h) (ref_ssd's arrays, loaded and checked). */
typedef struct ssd_job {
  const double *X, *DT, *AA, *BB, *CC, *H0, *DD, *Z;
  double *G;                                 /* dY: the gate turns a head's rows into do silu(z) in place */
  double *dx, *ddt, *dA, *dz, *dh0, *dD;    /* each element a head's own */
  double *sB, *sC;                           /* [W, B, L, N]: head h0 + w's terms of d_Bm and d_Cm */
  int64_t Bt, L, H, P, N, NG, hpg, h0;
  int ab, gate, skip, init;
  int nomem[QC_PAR_MAX];                     /* piece tid could not allocate its states */
} ssd_job;

/* Heads h0 + [lo, hi): each head's batches in order, its forward sweep
 * keeping every state, then its reverse sweep with the adjoint state. A
 * head writes only its own elements of d_x, d_dt, d_z, d_initial_state, d_A
 * and d_D, in the order the one loop over (b, h) wrote them, and its terms
 * of d_Bm and d_Cm into its rows of sB and sC: any thread count gives the
 * same values. */
static void ssd_heads(void *ctx, int64_t lo, int64_t hi, int tid) {
  ssd_job *J = ctx;
  const int64_t Bt = J->Bt, L = J->L, H = J->H, P = J->P, N = J->N, NG = J->NG, PN = P * N;
  const int ab = J->ab, gate = J->gate, skip = J->skip;
  const double *X = J->X, *DT = J->DT, *AA = J->AA, *BB = J->BB, *CC = J->CC, *DD = J->DD, *Z = J->Z;
  double *G = J->G, *dx = J->dx, *ddt = J->ddt, *dA = J->dA, *dz = J->dz, *dD = J->dD;
  double *hs = malloc((size_t)((L + 1) * PN) * sizeof *hs), *adj = malloc((size_t)PN * sizeof *adj);
  if (!hs || !adj) {
    J->nomem[tid] = 1;
    free(hs);
    free(adj);
    return;
  }
  for (int64_t w = lo; w < hi; w++) {
    const int64_t h = J->h0 + w, g_of = h / J->hpg;
    double *sB = J->sB + w * Bt * L * N, *sC = J->sC + w * Bt * L * N;
    for (int64_t b = 0; b < Bt; b++) {
      /* forward sweep: hs[t] = h_t, t = 0..L */
      for (int64_t e = 0; e < PN; e++) hs[e] = J->init ? J->H0[(b * H + h) * PN + e] : 0.0;
      for (int64_t t = 1; t <= L; t++) {
        const int64_t r = (b * L + t - 1) * H + h;
        const double g = exp(DT[r] * AA[h]);
        const double *xr = X + r * P, *br = BB + ((b * L + t - 1) * NG + g_of) * N;
        const double *prev = hs + (t - 1) * PN;
        double *cur = hs + t * PN;
        for (int64_t p = 0; p < P; p++)
          for (int64_t n = 0; n < N; n++) cur[p * N + n] = g * prev[p * N + n] + DT[r] * xr[p] * br[n];
        /* the gate: d_z from the output y_t (the read-out plus the skip), and
         * this head's dy turned into do silu(z) for the sweep below */
        const double *cr = CC + ((b * L + t - 1) * NG + g_of) * N;
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
        const int64_t r = (b * L + t - 1) * H + h, row = (b * L + t - 1) * N;
        const double *xr = X + r * P, *br = BB + ((b * L + t - 1) * NG + g_of) * N, *cr = CC + ((b * L + t - 1) * NG + g_of) * N;
        const double *gr = G + r * P, *ht = hs + t * PN, *hp = hs + (t - 1) * PN;
        /* adj currently holds g_{t+1} G_{t+1}; add the read-out y_t = h_t C_t */
        for (int64_t p = 0; p < P; p++)
          for (int64_t n = 0; n < N; n++) adj[p * N + n] += gr[p] * cr[n];
        for (int64_t n = 0; n < N; n++) {
          double s = 0;
          for (int64_t p = 0; p < P; p++) s += ht[p * N + n] * gr[p];
          sC[row + n] = s;
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
          sB[row + n] = DT[r] * s;
        }
        e *= g;
        ddt[r] = (ab ? fabs(AA[h]) : AA[h]) * e + xg;
        dA[h] += DT[r] * e;
        for (int64_t i = 0; i < PN; i++) adj[i] *= g; /* now g_t G_t: dL/dh_{t-1} from step t */
      }
      if (J->dh0)
        for (int64_t i = 0; i < PN; i++) J->dh0[(b * H + h) * PN + i] = adj[i];
    }
  }
  free(hs);
  free(adj);
}

/* The reduction of a wave of W heads: the rows [lo, hi) of B x L, each
 * group's d_Bm and d_Cm gaining its heads' terms in head order (as the
 * one loop over (b, h) added them). */
typedef struct ssd_red {
  const ssd_job *J;
  int64_t W;
  double *dB, *dC;
} ssd_red;

static void ssd_reduce(void *ctx, int64_t lo, int64_t hi, int tid) {
  (void)tid;
  const ssd_red *R = ctx;
  const ssd_job *J = R->J;
  const int64_t N = J->N, BL = J->Bt * J->L;
  for (int64_t q = lo; q < hi; q++)
    for (int64_t w = 0; w < R->W; w++) {
      const int64_t g = (J->h0 + w) / J->hpg;
      double *db = R->dB + (q * J->NG + g) * N, *dc = R->dC + (q * J->NG + g) * N;
      const double *sb = J->sB + (w * BL + q) * N, *sc = J->sC + (w * BL + q) * N;
      for (int64_t n = 0; n < N; n++) {
        db[n] += sb[n];
        dc[n] += sc[n];
      }
    }
}

/* Every head's sweeps on qc_par_for's threads, in waves of heads whose
 * terms of d_Bm and d_Cm ([W, B, L, N] each) fit in 1 GiB, or one
 * thread's worth of heads a wave, each wave then added into dB and dC;
 * the pieces' states within an eighth of the host's memory. A status. */
static int ssd_sweeps(ssd_job *j, double *dB, double *dC) {
  const int64_t per = 2 * j->Bt * j->L * j->N * (int64_t)sizeof(double), T = qc_par_threads();
  int64_t W = ((int64_t)1 << 30) / (per > 0 ? per : 1);
  W = W < T ? T : W;
  W = W > j->H ? j->H : W;
  /* each piece holds a head's states [L + 1, P, N]: no more pieces at once
   * than an eighth of the host's memory holds (long sequences) */
  const double hs = 8.0 * (double)((j->L + 1) * j->P * j->N);
  int64_t pieces = (int64_t)((double)qc_host_memory() / 8.0 / (hs > 0 ? hs : 1.0));
  pieces = pieces < 1 ? 1 : pieces;
  int rc = QC_OK;
  if (!(j->sB = qc_malloc((size_t)(W * per), "reference ssd d_Bm and d_Cm terms"))) return QC_ESYS;
  j->sC = j->sB + W * j->Bt * j->L * j->N;
  for (j->h0 = 0; j->h0 < j->H && !rc; j->h0 += W) {
    const int64_t w = j->H - j->h0 < W ? j->H - j->h0 : W, grain = (w + pieces - 1) / pieces;
    qc_par_for(w, grain, ssd_heads, j);
    for (int i = 0; i < QC_PAR_MAX; i++)
      if (j->nomem[i] && !rc) rc = qc_err_sys("out of memory: the states of a head's sweep (reference ssd)");
    ssd_red red = {.J = j, .W = w, .dB = dB, .dC = dC};
    if (!rc) qc_par_for(j->Bt * j->L, 64, ssd_reduce, &red);
  }
  free(j->sB);
  return rc;
}

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
  double *X = NULL, *DT = NULL, *AA = NULL, *BB = NULL, *CC = NULL, *H0 = NULL, *G = NULL;
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
  if ((rc = qc_refu_out(grads, "d_x", 4, xt->shape, &dx))) goto done;
  if ((rc = qc_refu_out(grads, "d_dt", 3, dtt->shape, &ddt))) goto done;
  if ((rc = qc_refu_out(grads, "d_A", 1, at->shape, &dA))) goto done;
  if ((rc = qc_refu_out(grads, "d_Bm", bt->ndim, bt->shape, &dB))) goto done;
  if ((rc = qc_refu_out(grads, "d_Cm", ct->ndim, ct->shape, &dC))) goto done;
  if (init && (rc = qc_refu_out(grads, "d_initial_state", 4, h0t->shape, &dh0))) goto done;
  if (skip && (rc = qc_refu_out(grads, "d_D", 1, Dt->shape, &dD))) goto done;
  if (gate && (rc = qc_refu_out(grads, "d_z", 4, zt->shape, &dz))) goto done;
  ssd_job j = {.X = X, .DT = DT, .AA = AA, .BB = BB, .CC = CC, .H0 = H0, .DD = DD, .Z = Z, .G = G, .dx = dx, .ddt = ddt,
               .dA = dA, .dz = dz, .dh0 = dh0, .dD = dD, .Bt = Bt, .L = L, .H = H, .P = P, .N = N, .NG = NG, .hpg = hpg,
               .ab = ab, .gate = gate, .skip = skip, .init = init};
  rc = ssd_sweeps(&j, dB, dC);
done:
  free(X); free(DT); free(AA); free(BB); free(CC); free(H0); free(DD); free(Z); free(G);
  return rc;
}

/* The class's reference, its one export (src/classes/registry.c pairs it
 * with src/modules/ssd.c). */
const qc_reference qc_reference_ssd = {.vjp = ref_ssd, .terms = 1};
