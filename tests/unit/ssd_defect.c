/* ssd_defect.c: the production SSD VJP of src/modules/ssd.c with planted
 * defects, for tests/unit/test_ssd.c. A copy of the chunked algorithm with
 * one switch (ssd_defect.h): with the switch at SSD_OK it gives the
 * production VJP's gradients bit for bit (test ssd/defect_copy_is_production
 * keeps it so: a change to the production algorithm shows there first);
 * each other value plants one defect a trainer could write. Inputs are
 * those of generated instances: shapes and values are not checked here. */
#include "ssd_defect.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "core/qc.h"
#include "modules/mod_util.h"

typedef struct {
  const qc_tensor *x, *dt, *A, *Bm, *Cm, *h0, *D, *z; /* h0, D, z: NULL unless the contract uses them */
  int64_t Bt, L, H, P, N, G, Q; /* G: groups of Bm, Cm (1 for [B, L, N]) */
} view;

/* The tensors and sizes of m (a generated instance), as ssd.c reads them. */
static int view_get(const qc_module *m, view *v) {
  memset(v, 0, sizeof *v);
  v->x = qc_tset_get(&m->inputs, "x");
  v->dt = qc_tset_get(&m->inputs, "dt");
  v->A = qc_tset_get(&m->inputs, "A");
  v->Bm = qc_tset_get(&m->inputs, "Bm");
  v->Cm = qc_tset_get(&m->inputs, "Cm");
  if (!v->x || !v->dt || !v->A || !v->Bm || !v->Cm) return qc_err("%s: the ssd defect copy needs x, dt, A, Bm, Cm", m->path);
  v->Bt = v->x->shape[0];
  v->L = v->x->shape[1];
  v->H = v->x->shape[2];
  v->P = v->x->shape[3];
  v->G = v->Bm->ndim == 4 ? v->Bm->shape[2] : 1;
  v->N = v->Bm->shape[v->Bm->ndim - 1];
  if (strcmp(qc_contract_str(&m->contract, "initial_state", "false"), "true") == 0) v->h0 = qc_tset_get(&m->inputs, "initial_state");
  if (strcmp(qc_contract_str(&m->contract, "d_skip", "false"), "true") == 0) v->D = qc_tset_get(&m->inputs, "D");
  if (strcmp(qc_contract_str(&m->contract, "z_gate", "false"), "true") == 0) v->z = qc_tset_get(&m->inputs, "z");
  v->Q = (int64_t)qc_contract_num(&m->contract, "chunk_size", 64);
  return QC_OK;
}

/* The float32 pairwise (cascade) sum of v[0 .. n): error ~ u log2(n). */
static float pair_sum(const float *v, int64_t n) {
  if (n <= 16) {
    float s = 0.0f;
    for (int64_t i = 0; i < n; i++) s += v[i];
    return s;
  }
  return pair_sum(v, n / 2) + pair_sum(v + n / 2, n - n / 2);
}

/* The z gate (v->z set): the float32 forward y (the recurrence, plus the D
 * skip) into gz as d_z = dy y silu'(z), and dy (float32, in place) turned
 * into the scan's upstream gradient dy silu(z). Defects: SSD_Z_NO_DZ leaves
 * d_z at 0, SSD_Z_UNGATED_DX keeps dy ungated (the gate's effect on every
 * other gradient forgotten). Returns a status. */
static int ssd_gate(const view *v, const float *x, const float *dt, const float *A, const float *Bm, const float *Cm,
                    const float *h0, const float *Dh, float *dy, float *gz, int defect) {
  const int64_t L = v->L, H = v->H, P = v->P, N = v->N, G = v->G;
  float *z = qc_mod_f32(v->z, "ssd z"), *st = qc_malloc((size_t)(P * N + 1) * sizeof *st, "ssd gate state");
  int rc = QC_ESYS;
  if (!z || !st) goto done;
  for (int64_t b = 0; b < v->Bt; b++)
    for (int64_t h = 0; h < H; h++) {
      for (int64_t e = 0; e < P * N; e++) st[e] = h0 ? h0[(b * H + h) * P * N + e] : 0.0f;
      for (int64_t t = 0; t < L; t++) {
        const int64_t r = (b * L + t) * H + h;
        const float d = dt[r], g = expf(d * A[h]);
        const float *bt = Bm + ((b * L + t) * G + h / (H / G)) * N, *ct = Cm + ((b * L + t) * G + h / (H / G)) * N;
        for (int64_t p = 0; p < P; p++) {
          float y = 0.0f;
          const float xd = d * x[r * P + p];
          for (int64_t q = 0; q < N; q++) {
            st[p * N + q] = g * st[p * N + q] + xd * bt[q];
            y += st[p * N + q] * ct[q];
          }
          if (Dh) y += Dh[h] * x[r * P + p];
          const int64_t i = r * P + p;
          const float zi = z[i], sg = 1.0f / (1.0f + expf(-zi));
          gz[i] = defect == SSD_Z_NO_DZ ? 0.0f : dy[i] * y * (sg * (1.0f + zi * (1.0f - sg)));
          if (defect != SSD_Z_UNGATED_DX) dy[i] *= zi * sg;
        }
      }
    }
  rc = QC_OK;
done:
  free(z); free(st);
  return rc;
}

int t_ssd_vjp_defect(const qc_module *m, const qc_tensor *dyt, qc_tset *grads, int defect) {
  view v;
  int rc = view_get(m, &v);
  if (rc) return rc;
  const int64_t Bt = v.Bt, L = v.L, H = v.H, P = v.P, N = v.N, G = v.G, Q = v.Q, PN = P * N;
  const int64_t nc = L > 0 ? (L + Q - 1) / Q : 0, Qm = Q < L ? Q : (L > 0 ? L : 1);
  float *x = qc_mod_f32(v.x, "ssd x"), *dt = qc_mod_f32(v.dt, "ssd dt"), *A = qc_mod_f32(v.A, "ssd A");
  float *Bm = qc_mod_f32(v.Bm, "ssd Bm"), *Cm = qc_mod_f32(v.Cm, "ssd Cm"), *dy = qc_mod_f32(dyt, "ssd dY");
  float *h0 = v.h0 ? qc_mod_f32(v.h0, "ssd initial_state") : NULL;
  float *Dh = v.D ? qc_mod_f32(v.D, "ssd D") : NULL;
  float *Sin = qc_malloc((size_t)((nc + 1) * PN) * sizeof *Sin, "ssd chunk states");
  float *dS = qc_malloc((size_t)PN * sizeof *dS, "ssd state adjoint");
  float *dSn = qc_malloc((size_t)PN * sizeof *dSn, "ssd state adjoint");
  float *a = qc_malloc((size_t)Qm * sizeof *a, "ssd decay"), *din = qc_malloc((size_t)Qm * sizeof *din, "ssd decay");
  float *dout = qc_malloc((size_t)Qm * sizeof *dout, "ssd decay"), *da = qc_malloc((size_t)Qm * sizeof *da, "ssd da");
  float *dai = qc_malloc((size_t)Qm * sizeof *dai, "ssd da"), *lin = qc_malloc((size_t)Qm * sizeof *lin, "ssd da");
  float *lout = qc_malloc((size_t)Qm * sizeof *lout, "ssd da");
  float *Lseg = qc_malloc((size_t)(Qm * Qm) * sizeof *Lseg, "ssd decay matrix");
  float *CB = qc_malloc((size_t)(Qm * Qm) * sizeof *CB, "ssd C.B"), *dlog = qc_malloc((size_t)(Qm * Qm) * sizeof *dlog, "ssd dlog");
  float *u = qc_malloc((size_t)(Qm * P) * sizeof *u, "ssd u"), *du = qc_malloc((size_t)(Qm * P) * sizeof *du, "ssd du");
  float *gx, *gdt, *gA, *gB, *gC, *gh0 = NULL, *gD = NULL, *gz = NULL;
  rc = QC_ESYS;
  if (!x || !dt || !A || !Bm || !Cm || !dy || (v.h0 && !h0) || (v.D && !Dh) || !Sin || !dS || !dSn || !a || !din || !dout || !da || !dai ||
      !lin || !lout || !Lseg || !CB || !dlog || !u || !du)
    goto done;
  if ((rc = qc_mod_add(grads, "d_x", QC_F32, 4, v.x->shape, (void **)&gx))) goto done;
  if ((rc = qc_mod_add(grads, "d_dt", QC_F32, 3, v.dt->shape, (void **)&gdt))) goto done;
  if ((rc = qc_mod_add(grads, "d_A", QC_F32, 1, v.A->shape, (void **)&gA))) goto done;
  if ((rc = qc_mod_add(grads, "d_Bm", QC_F32, v.Bm->ndim, v.Bm->shape, (void **)&gB))) goto done;
  if ((rc = qc_mod_add(grads, "d_Cm", QC_F32, v.Cm->ndim, v.Cm->shape, (void **)&gC))) goto done;
  if (v.h0 && (rc = qc_mod_add(grads, "d_initial_state", QC_F32, 4, v.h0->shape, (void **)&gh0))) goto done;
  if (v.D && (rc = qc_mod_add(grads, "d_D", QC_F32, 1, v.D->shape, (void **)&gD))) goto done;
  if (v.z && ((rc = qc_mod_add(grads, "d_z", QC_F32, 4, v.z->shape, (void **)&gz)) ||
              (rc = ssd_gate(&v, x, dt, A, Bm, Cm, h0, Dh, dy, gz, defect))))
    goto done;
  for (int64_t b = 0; b < Bt; b++)
    for (int64_t h = 0; h < H; h++) {
      const float Ah = A[h];
      /* the group head h reads, and the one its d_Bm, d_Cm go to (the
       * defect: heads interleaved over the groups, h mod G) */
      const int64_t grp = h / (H / G), ggrp = defect == SSD_GROUP_WRONG_HEADS ? h % G : grp;
#define XI(t, p) x[(((b * L + (t)) * H + h) * P) + (p)]
#define DTI(t) ((b * L + (t)) * H + h)
#define BI(t, n) ((((b * L + (t)) * G + grp) * N) + (n))
#define GI(t, n) ((((b * L + (t)) * G + ggrp) * N) + (n))
      /* the decay step of global time t: a = dt_src A */
#define ASRC(t) (defect == SSD_DECAY_OFF_BY_ONE && (t) > 0 ? (t) - 1 : (t))
      /* pass 1: the chunk states, float32 */
      float *S0 = Sin;
      for (int64_t e = 0; e < PN; e++) S0[e] = h0 ? h0[(b * H + h) * PN + e] : 0.0f;
      for (int64_t c = 0; c < nc; c++) {
        const int64_t s = c * Q, n = (s + Q <= L ? Q : L - s);
        const float *Si = Sin + c * PN;
        float *So = Sin + (c + 1) * PN;
        float acc = 0.0f;
        for (int64_t k = n - 1; k >= 0; k--) { /* dout_j = exp(sum_{k>j} a_k) */
          dout[k] = expf(acc);
          acc += dt[DTI(ASRC(s + k))] * Ah;
        }
        const float D = expf(acc);
        for (int64_t e = 0; e < PN; e++) So[e] = defect == SSD_NO_STATE_PASS ? 0.0f : D * Si[e];
        if (defect == SSD_NO_STATE_PASS) continue; /* every chunk starts from zero */
        for (int64_t j = 0; j < n; j++) {
          const float w = dout[j] * dt[DTI(s + j)];
          for (int64_t p = 0; p < P; p++) {
            const float xw = w * XI(s + j, p);
            for (int64_t q = 0; q < N; q++) So[p * N + q] += xw * Bm[BI(s + j, q)];
          }
        }
      }
      if (defect == SSD_NO_STATE_PASS)
        for (int64_t c = 1; c <= nc; c++) memset(Sin + c * PN, 0, (size_t)PN * sizeof *Sin);
      /* pass 2: chunks in reverse with the state adjoint dS (the final state is no output: 0) */
      memset(dS, 0, (size_t)PN * sizeof *dS);
      for (int64_t c = nc - 1; c >= 0; c--) {
        const int64_t s = c * Q, n = (s + Q <= L ? Q : L - s);
        const float *Si = Sin + c * PN;
        float acc = 0.0f;
        for (int64_t k = 0; k < n; k++) {
          a[k] = dt[DTI(ASRC(s + k))] * Ah;
          acc += a[k];
          din[k] = expf(acc);
        }
        const float D = din[n - 1];
        acc = 0.0f;
        for (int64_t k = n - 1; k >= 0; k--) {
          dout[k] = expf(acc);
          acc += a[k];
        }
        for (int64_t i = 0; i < n; i++) {
          float seg = 0.0f;
          for (int64_t j = i; j >= 0; j--) {
            if (j < i) seg += a[j + 1];
            Lseg[i * n + j] = expf(seg);
            float cb = 0.0f;
            for (int64_t q = 0; q < N; q++) cb += Cm[BI(s + i, q)] * Bm[BI(s + j, q)];
            CB[i * n + j] = cb;
          }
        }
        for (int64_t j = 0; j < n; j++)
          for (int64_t p = 0; p < P; p++) u[j * P + p] = dt[DTI(s + j)] * XI(s + j, p);
        memset(du, 0, (size_t)(n * P) * sizeof *du);
        memset(dSn, 0, (size_t)PN * sizeof *dSn);
        /* within the chunk (attention-like) and the entering state's read-out */
        for (int64_t i = 0; i < n; i++) {
          const float *g = dy + ((b * L + s + i) * H + h) * P;
          for (int64_t j = 0; j <= i; j++) {
            float dM = 0.0f;
            for (int64_t p = 0; p < P; p++) dM += g[p] * u[j * P + p];
            const float M = Lseg[i * n + j] * CB[i * n + j], dCB = dM * Lseg[i * n + j];
            for (int64_t p = 0; p < P; p++) du[j * P + p] += M * g[p];
            for (int64_t q = 0; q < N; q++) {
              gC[GI(s + i, q)] += dCB * Bm[BI(s + j, q)];
              gB[GI(s + j, q)] += dCB * Cm[BI(s + i, q)];
            }
            dlog[i * n + j] = dM * M;
          }
          /* y_i += din_i S_in C_i */
          float gsc = 0.0f;
          for (int64_t p = 0; p < P; p++) {
            float sc = 0.0f;
            for (int64_t q = 0; q < N; q++) sc += Si[p * N + q] * Cm[BI(s + i, q)];
            gsc += g[p] * sc;
          }
          lin[i] = din[i] * gsc;
          for (int64_t q = 0; q < N; q++) {
            float t = 0.0f;
            for (int64_t p = 0; p < P; p++) t += g[p] * Si[p * N + q];
            gC[GI(s + i, q)] += din[i] * t;
          }
          for (int64_t p = 0; p < P; p++) {
            const float w = din[i] * g[p];
            for (int64_t q = 0; q < N; q++) dSn[p * N + q] += w * Cm[BI(s + i, q)];
          }
        }
        /* the leaving state S_out = D S_in + sum_j dout_j u_j (x) B_j, adjoint dS */
        float lD = 0.0f;
        for (int64_t e = 0; e < PN; e++) {
          lD += dS[e] * Si[e];
          dSn[e] += D * dS[e];
        }
        lD *= D;
        for (int64_t j = 0; j < n; j++) {
          float l = 0.0f;
          for (int64_t p = 0; p < P; p++) {
            float t = 0.0f;
            for (int64_t q = 0; q < N; q++) t += dS[p * N + q] * Bm[BI(s + j, q)];
            l += u[j * P + p] * t;
            du[j * P + p] += dout[j] * t;
          }
          lout[j] = dout[j] * l;
          for (int64_t q = 0; q < N; q++) {
            float t = 0.0f;
            for (int64_t p = 0; p < P; p++) t += dS[p * N + q] * u[j * P + p];
            gB[GI(s + j, q)] += dout[j] * t;
          }
        }
        /* scatter the log-derivatives onto the a_k of their segments */
        for (int64_t k = 0; k < n; k++) da[k] = dai[k] = 0.0f;
        for (int64_t i = 0; i < n; i++) { /* (j, i]: k in j+1..i */
          float r = 0.0f;
          for (int64_t k = 1; k <= i; k++) {
            r += dlog[i * n + k - 1];
            dai[k] += r;
          }
        }
        float suf = 0.0f;
        for (int64_t k = n - 1; k >= 0; k--) { /* [0, i] for every i >= k */
          suf += lin[k];
          da[k] += suf;
        }
        float pre = 0.0f;
        for (int64_t k = 0; k < n; k++) { /* (j, n-1] for every j < k */
          da[k] += lD + pre;
          pre += lout[k];
        }
        for (int64_t k = 0; k < n; k++) {
          const int64_t t = s + k, src = ASRC(t);
          gdt[DTI(src)] += Ah * (da[k] + dai[k]);
          gA[h] += dt[DTI(src)] * (defect == SSD_DA_NO_INTRA ? da[k] : da[k] + dai[k]);
          float xd = 0.0f;
          for (int64_t p = 0; p < P; p++) {
            gx[((b * L + t) * H + h) * P + p] = dt[DTI(t)] * du[k * P + p];
            xd += XI(t, p) * du[k * P + p];
          }
          if (defect != SSD_DDT_NO_XB) gdt[DTI(t)] += xd;
        }
        if (defect == SSD_NO_STATE_PASS && c > 0) memset(dSn, 0, (size_t)PN * sizeof *dSn);
        memcpy(dS, dSn, (size_t)PN * sizeof *dS);
      }
      if (gh0)
        for (int64_t e = 0; e < PN; e++) gh0[(b * H + h) * PN + e] = dS[e];
#undef XI
#undef DTI
#undef BI
#undef GI
#undef ASRC
    }
  /* the D skip y += D_h x: d_x += D_h dy; d_D[h] = sum dy x over (b, t, p),
   * a float32 pairwise sum of the float32 products (as torch's
   * (dy * x).sum(dim=(0, 1, 3)) reduces) */
  if (gD) {
    const int64_t K = Bt * L * P;
    float *prod = qc_malloc((size_t)K * sizeof *prod, "ssd dy x products");
    if (!prod) { rc = QC_ESYS; goto done; }
    for (int64_t h = 0; h < H; h++) {
      int64_t k = 0;
      for (int64_t r = 0; r < Bt * L; r++)
        for (int64_t p = 0; p < P; p++, k++) {
          const int64_t i = (r * H + h) * P + p;
          if (defect != SSD_NO_D_GRAD) gx[i] += Dh[h] * dy[i]; /* defect: d_x from the state path only */
          prod[k] = dy[i] * x[i];
        }
      gD[h] = defect == SSD_NO_D_PARAM ? 0.0f : pair_sum(prod, K); /* defect: d_D left at 0 */
    }
    free(prod);
  }
  rc = QC_OK;
done:
  free(x); free(dt); free(A); free(Bm); free(Cm); free(dy); free(h0); free(Dh); free(Sin); free(dS); free(dSn);
  free(a); free(din); free(dout); free(da); free(dai); free(lin); free(lout); free(Lseg); free(CB); free(dlog);
  free(u); free(du);
  return rc;
}
