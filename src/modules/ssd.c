/* modules/ssd.c: the production VJP of the Mamba-2 state-space duality (SSD)
 * scan, with G groups of B and C (ngroups: H/G consecutive heads share one),
 * optional D skip (contract d_skip = true), optional z gating (contract
 * z_gate = true), as the chunked SSD algorithm computes it in float32.
 *
 *   x [Bt, L, H, P], dt [Bt, L, H] (softplus'd, >= 0), A [H] (<= 0),
 *   Bm, Cm [Bt, L, N] (one group) or [Bt, L, G, N] (G divides H; head h
 *   reads group h / (H/G), as mamba_ssm repeats the groups over the heads),
 *   optional initial_state [Bt, H, P, N] (contract initial_state = true);
 *   dY = dy [Bt, L, H, P].
 *   Definition (per batch b, head h; state h_t [P, N]):
 *     h_0 = initial_state or 0
 *     h_t = exp(dt_t A) h_{t-1} + dt_t x_t (x) B_t,   y_t = h_t C_t (+ D_h x_t)
 *   D skip (inputs/D [H], Mamba-2's per-head D): d_x_t += D_h dy_t,
 *   d_D[h] = sum over (b, t, p) of dy x, a float32 pairwise sum.
 *   z gate (inputs/z [Bt, L, H, P], mamba_chunk_scan_combined's z): the
 *   output is o_t = y_t silu(z_t) elementwise, so with dY = do:
 *     d_z = do y silu'(z),  silu'(z) = s (1 + z (1 - s)), s = sigmoid(z),
 *   and the scan's own upstream gradient is dy = do silu(z); the forward
 *   y (scan plus skip) is recomputed in float32 by the recurrence.
 *
 * The sequence is cut into chunks of Q = chunk_size steps (the last may be
 * shorter). With a_k = dt_k A, local indices i, j in a chunk, S_in the state
 * entering it, u_j = dt_j x_j:
 *   Lseg_ij = exp(sum_{k=j+1..i} a_k)  (j <= i; the masked decay matrix)
 *   din_i   = exp(sum_{k=0..i} a_k),  dout_j = exp(sum_{k=j+1..Q'-1} a_k)
 *   y_i     = din_i S_in C_i + sum_{j<=i} Lseg_ij (C_i.B_j) u_j
 *   S_out   = din_{Q'-1} S_in + sum_j dout_j u_j (x) B_j
 * The VJP recomputes the chunk states in float32 (vLLM's visible SSD does not
 * output them), then runs the chunks in reverse with the state adjoint dS:
 * the within-chunk part is attention-like (dM_ij = dy_i.u_j), the decay
 * gradients are the log-derivatives dM_ij M_ij, din_i dy_i.(S_in C_i),
 * D <dS, S_in> and dout_j u_j.(dS B_j), scattered onto the a_k inside their
 * segments by prefix and suffix sums; d_dt = A da + x.du, d_A = sum dt da.
 * Segment sums are accumulated directly (never a difference of cumulative
 * sums), so near-reset steps (dt A << -10) lose no accuracy. float32
 * throughout, float32 gradients d_x, d_dt, d_A, d_Bm, d_Cm (each group's
 * summed over the heads of the group; shaped as Bm, Cm), d_initial_state,
 * d_D. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "model/modinfo.h"
#include "model/module.h"
#include "modules/classes.h"
#include "numerics/formats.h"
#include "core/par.h"
#include "core/qc.h"
#include "modules/mod_util.h"

static const qc_key_spec ssd_keys[] = {
    {"chunk_size", NULL, "64", "steps per chunk of the chunked scan (a whole number >= 1; L need not be a multiple)"},
    {"initial_state", "true|false", "false", "true: inputs/initial_state [B, H, P, N] is h_0 (and d_initial_state is checked)"},
    {"d_skip", "true|false", "false", "true: y += D x with inputs/D [H] (Mamba-2's D skip; d_D is checked)"},
    {"z_gate", "true|false", "false", "true: the output is y silu(z) with inputs/z [B, L, H, P] (mamba_ssm's z; d_z is checked)"},
    {NULL, NULL, NULL, NULL}};

typedef struct {
  const qc_tensor *x, *dt, *A, *Bm, *Cm, *h0, *D, *z; /* h0, D, z: NULL unless the contract uses them */
  int64_t Bt, L, H, P, N, G, Q; /* G: groups of Bm, Cm (1 for [B, L, N]) */
} ssd_view;

static int dim_is(const qc_tensor *t, int nd, const int64_t *want) {
  if (t->ndim != nd) return 0;
  for (int d = 0; d < nd; d++)
    if (t->shape[d] != want[d]) return 0;
  return 1;
}

static int ssd_view_get(const qc_module *m, ssd_view *v) {
  int rc;
  char s1[96], s2[96];
  memset(v, 0, sizeof *v);
  if ((rc = qc_module_need(m, "inputs", "x", 4, 4, &v->x))) return rc;
  if ((rc = qc_module_need(m, "inputs", "dt", 3, 3, &v->dt))) return rc;
  if ((rc = qc_module_need(m, "inputs", "A", 1, 1, &v->A))) return rc;
  if ((rc = qc_module_need(m, "inputs", "Bm", 3, 4, &v->Bm))) return rc;
  if ((rc = qc_module_need(m, "inputs", "Cm", 3, 4, &v->Cm))) return rc;
  v->Bt = v->x->shape[0];
  v->L = v->x->shape[1];
  v->H = v->x->shape[2];
  v->P = v->x->shape[3];
  const int bnd = v->Bm->ndim;
  v->G = bnd == 4 ? v->Bm->shape[2] : 1;
  v->N = v->Bm->shape[bnd - 1];
  const int64_t dts[3] = {v->Bt, v->L, v->H}, as[1] = {v->H}, hs[4] = {v->Bt, v->H, v->P, v->N};
  const int64_t bs[4] = {v->Bt, v->L, bnd == 4 ? v->G : v->N, v->N};
  if (!dim_is(v->dt, 3, dts))
    return qc_err("%s: 'inputs/dt' is %s: expected [B, L, H] = %s (x is [B, L, H, P])", m->path,
                  qc_shape_str(v->dt->ndim, v->dt->shape, s1, sizeof s1), qc_shape_str(3, dts, s2, sizeof s2));
  if (!dim_is(v->A, 1, as))
    return qc_err("%s: 'inputs/A' is %s: expected [H] = %s", m->path, qc_shape_str(v->A->ndim, v->A->shape, s1, sizeof s1),
                  qc_shape_str(1, as, s2, sizeof s2));
  if (v->Bm->shape[0] != v->Bt || v->Bm->shape[1] != v->L || v->G < 1 || v->H % v->G != 0)
    return qc_err("%s: 'inputs/Bm' is %s: expected [B, L, N] or [B, L, G, N] with B, L = %lld, %lld and G dividing H = %lld",
                  m->path, qc_shape_str(bnd, v->Bm->shape, s1, sizeof s1), (long long)v->Bt, (long long)v->L, (long long)v->H);
  if (!dim_is(v->Cm, bnd, bs))
    return qc_err("%s: 'inputs/Cm' is %s: expected the shape of 'inputs/Bm' %s", m->path,
                  qc_shape_str(v->Cm->ndim, v->Cm->shape, s1, sizeof s1), qc_shape_str(bnd, bs, s2, sizeof s2));
  if (strcmp(qc_contract_str(&m->contract, "initial_state", "false"), "true") == 0) {
    if ((rc = qc_module_need(m, "inputs", "initial_state", 4, 4, &v->h0))) return rc;
    if (!dim_is(v->h0, 4, hs))
      return qc_err("%s: 'inputs/initial_state' is %s: expected [B, H, P, N] = %s", m->path,
                    qc_shape_str(4, v->h0->shape, s1, sizeof s1), qc_shape_str(4, hs, s2, sizeof s2));
  } else if (qc_tset_get(&m->inputs, "initial_state")) { /* held but unused: refused, never ignored */
    qc_hint("set the contract's initial_state to true to judge with it, or leave it out of the dump");
    return qc_err("%s: dataset 'inputs/initial_state' is present but the contract's initial_state is false: "
                  "the scan would start from zero and ignore it", m->path);
  }
  if (strcmp(qc_contract_str(&m->contract, "d_skip", "false"), "true") == 0) {
    if ((rc = qc_module_need(m, "inputs", "D", 1, 1, &v->D))) return rc;
    if (!dim_is(v->D, 1, as))
      return qc_err("%s: 'inputs/D' is %s: expected [H] = %s (one D per head)", m->path,
                    qc_shape_str(v->D->ndim, v->D->shape, s1, sizeof s1), qc_shape_str(1, as, s2, sizeof s2));
  } else if (qc_tset_get(&m->inputs, "D")) { /* held but unused: refused, never ignored */
    qc_hint("set the contract's d_skip to true to judge with it, or leave it out of the dump");
    return qc_err("%s: dataset 'inputs/D' is present but the contract's d_skip is false: the D skip would be ignored", m->path);
  }
  if (strcmp(qc_contract_str(&m->contract, "z_gate", "false"), "true") == 0) {
    if ((rc = qc_module_need(m, "inputs", "z", 4, 4, &v->z))) return rc;
    if (!dim_is(v->z, 4, v->x->shape))
      return qc_err("%s: 'inputs/z' is %s: expected the shape of 'inputs/x' %s", m->path,
                    qc_shape_str(v->z->ndim, v->z->shape, s1, sizeof s1), qc_shape_str(4, v->x->shape, s2, sizeof s2));
  } else if (qc_tset_get(&m->inputs, "z")) { /* held but unused: refused, never ignored */
    qc_hint("set the contract's z_gate to true to judge with it, or leave it out of the dump");
    return qc_err("%s: dataset 'inputs/z' is present but the contract's z_gate is false: the gate would be ignored", m->path);
  }
  const double q = qc_contract_num(&m->contract, "chunk_size", 64);
  if (!(q >= 1) || q != floor(q) || q > 1e9)
    return qc_err("%s: contract key 'chunk_size' is %g: expected a whole number >= 1", m->path, q);
  v->Q = (int64_t)q;
  return QC_OK;
}

/* dt >= 0 and A <= 0, finite (exp(dt A) in (0, 1]) */
static int ssd_check_values(const qc_module *m, const ssd_view *v, const float *dt, const float *A) {
  for (int64_t h = 0; h < v->H; h++)
    if (!(A[h] <= 0) || !isfinite(A[h]))
      return qc_err("%s: dataset 'inputs/A' element %lld is %g: expected a finite value <= 0 (A = -exp(A_log))", m->path,
                    (long long)h, (double)A[h]);
  for (int64_t i = 0; i < v->Bt * v->L * v->H; i++)
    if (!(dt[i] >= 0) || !isfinite(dt[i]))
      return qc_err("%s: dataset 'inputs/dt' element %lld is %g: expected a finite value >= 0 (dt after softplus)", m->path,
                    (long long)i, (double)dt[i]);
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
 * into the scan's upstream gradient dy silu(z). Returns a status. */
static int ssd_gate(const ssd_view *v, const float *x, const float *dt, const float *A, const float *Bm, const float *Cm,
                    const float *h0, const float *Dh, float *dy, float *gz) {
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
          gz[i] = dy[i] * y * (sg * (1.0f + zi * (1.0f - sg)));
          dy[i] *= zi * sg;
        }
      }
    }
  rc = QC_OK;
done:
  free(z); free(st);
  return rc;
}

/* The class's production VJP (the chunked algorithm above) of m for dyt
 * into grads: the float32 gradients named in the file's comment. Returns a
 * status. tests/unit/ssd_defect.c holds a copy with planted defects, bit
 * for bit this one with every defect off. */
static int ssd_vjp(const qc_ctx *ctx, const qc_module *m, const qc_tensor *dyt, qc_tset *grads) {
  (void)ctx;
  ssd_view v;
  int rc = ssd_view_get(m, &v);
  if (rc) return rc;
  if ((rc = qc_module_check_dy(m, dyt, qc_numel(v.x), v.x->shape[3], "the shape of inputs/x [B, L, H, P]"))) return rc;
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
  if ((rc = ssd_check_values(m, &v, dt, A))) goto done;
  if ((rc = qc_mod_add(grads, "d_x", QC_F32, 4, v.x->shape, (void **)&gx))) goto done;
  if ((rc = qc_mod_add(grads, "d_dt", QC_F32, 3, v.dt->shape, (void **)&gdt))) goto done;
  if ((rc = qc_mod_add(grads, "d_A", QC_F32, 1, v.A->shape, (void **)&gA))) goto done;
  if ((rc = qc_mod_add(grads, "d_Bm", QC_F32, v.Bm->ndim, v.Bm->shape, (void **)&gB))) goto done;
  if ((rc = qc_mod_add(grads, "d_Cm", QC_F32, v.Cm->ndim, v.Cm->shape, (void **)&gC))) goto done;
  if (v.h0 && (rc = qc_mod_add(grads, "d_initial_state", QC_F32, 4, v.h0->shape, (void **)&gh0))) goto done;
  if (v.D && (rc = qc_mod_add(grads, "d_D", QC_F32, 1, v.D->shape, (void **)&gD))) goto done;
  if (v.z && ((rc = qc_mod_add(grads, "d_z", QC_F32, 4, v.z->shape, (void **)&gz)) ||
              (rc = ssd_gate(&v, x, dt, A, Bm, Cm, h0, Dh, dy, gz))))
    goto done;
  for (int64_t b = 0; b < Bt; b++)
    for (int64_t h = 0; h < H; h++) {
      const float Ah = A[h];
      /* the group head h reads (and its d_Bm, d_Cm go to) */
      const int64_t grp = h / (H / G);
#define XI(t, p) x[(((b * L + (t)) * H + h) * P) + (p)]
#define DTI(t) ((b * L + (t)) * H + h)
#define BI(t, n) ((((b * L + (t)) * G + grp) * N) + (n))
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
          acc += dt[DTI(s + k)] * Ah;
        }
        const float D = expf(acc);
        for (int64_t e = 0; e < PN; e++) So[e] = D * Si[e];
        for (int64_t j = 0; j < n; j++) {
          const float w = dout[j] * dt[DTI(s + j)];
          for (int64_t p = 0; p < P; p++) {
            const float xw = w * XI(s + j, p);
            for (int64_t q = 0; q < N; q++) So[p * N + q] += xw * Bm[BI(s + j, q)];
          }
        }
      }
      /* pass 2: chunks in reverse with the state adjoint dS (the final state is no output: 0) */
      memset(dS, 0, (size_t)PN * sizeof *dS);
      for (int64_t c = nc - 1; c >= 0; c--) {
        const int64_t s = c * Q, n = (s + Q <= L ? Q : L - s);
        const float *Si = Sin + c * PN;
        float acc = 0.0f;
        for (int64_t k = 0; k < n; k++) {
          a[k] = dt[DTI(s + k)] * Ah;
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
              gC[BI(s + i, q)] += dCB * Bm[BI(s + j, q)];
              gB[BI(s + j, q)] += dCB * Cm[BI(s + i, q)];
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
            gC[BI(s + i, q)] += din[i] * t;
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
            gB[BI(s + j, q)] += dout[j] * t;
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
          const int64_t t = s + k;
          gdt[DTI(t)] += Ah * (da[k] + dai[k]);
          gA[h] += dt[DTI(t)] * (da[k] + dai[k]);
          float xd = 0.0f;
          for (int64_t p = 0; p < P; p++) {
            gx[((b * L + t) * H + h) * P + p] = dt[DTI(t)] * du[k * P + p];
            xd += XI(t, p) * du[k * P + p];
          }
          gdt[DTI(t)] += xd;
        }
        memcpy(dS, dSn, (size_t)PN * sizeof *dS);
      }
      if (gh0)
        for (int64_t e = 0; e < PN; e++) gh0[(b * H + h) * PN + e] = dS[e];
#undef XI
#undef DTI
#undef BI
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
          gx[i] += Dh[h] * dy[i];
          prod[k] = dy[i] * x[i];
        }
      gD[h] = pair_sum(prod, K);
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

/* The error model: nested float32 reductions on the longest path of each
 * gradient: d_x (and d_initial_state) C.B (N) + the within-chunk sum (Q)
 * + the state read (N) + the chunk hops (L/Q); d_Bm and d_Cm dy.u (P) + C.B
 * (N) + the chunk (Q) + the H/G heads of a group, lambda 3 (random-signed sums that
 * cancel; at one step a shared sum scales the whole gradient); d_dt the
 * P x N products of <dS, S>;
 * d_A those over the B x L steps. */
static int ssd_tol_model(const qc_module *m, const qc_tensor *dy, const char *grad, qc_tol_model *tm) {
  (void)dy;
  ssd_view v;
  int rc = ssd_view_get(m, &v);
  if (rc) return rc;
  const int64_t Q = v.Q < v.L ? v.Q : (v.L > 0 ? v.L : 1), hops = (v.L + Q - 1) / Q;
  if (strcmp(grad, "d_x") == 0 || strcmp(grad, "d_initial_state") == 0)
    qc_mod_tm(tm, 2 * v.N + Q + hops, 1, 0, 0, "%s: C.B (N = %lld) + the within-chunk sum (Q = %lld) + the state read (N) + "
              "%lld chunk hops", grad, (long long)v.N, (long long)Q, (long long)hops);
  else if (strcmp(grad, "d_Bm") == 0 || strcmp(grad, "d_Cm") == 0)
    qc_mod_tm(tm, v.P + v.N + Q + v.H / v.G, 3, 0, 0, "%s: dy.u (P = %lld) + C.B (N = %lld) + the chunk (Q = %lld) + the H/G = %lld "
              "heads of a group; lambda 3: those random-signed sums cancel, and with few steps one of them scales every element "
              "alike (measured up to 1.75 at L = 1)", grad, (long long)v.P, (long long)v.N, (long long)Q, (long long)(v.H / v.G));
  else if (strcmp(grad, "d_dt") == 0)
    qc_mod_tm(tm, v.P * v.N, 1, 0, 0, "d_dt = A da + x.du, da carrying <dS, S> over P x N = %lld products", (long long)(v.P * v.N));
  else if (strcmp(grad, "d_z") == 0)
    qc_mod_tm(tm, 2 * v.N + Q + hops, 2, 0, 0, "d_z = dY y silu'(z), y the scan's float32 forward: h.C (N = %lld) over the "
              "recurrence's chunk (Q = %lld) and %lld hops; lambda 2 for silu' and its expf", (long long)v.N, (long long)Q,
              (long long)hops);
  else if (strcmp(grad, "d_D") == 0)
    qc_mod_tm(tm, v.Bt * v.L * v.P, 1, 0, 0, "d_D[h] = sum of dy x over B x L x P = %lld products (pairwise in the "
              "production; bounded as a sequential sum)", (long long)(v.Bt * v.L * v.P));
  else if (strcmp(grad, "d_A") == 0)
    qc_mod_tm(tm, v.Bt * v.L + v.P * v.N, 1, 0, 0, "d_A sums dt da over the B x L = %lld steps, each da over P x N = %lld products",
              (long long)(v.Bt * v.L), (long long)(v.P * v.N));
  else
    return qc_err("%s: class ssd has no gradient '%s'", m->path, grad);
  return QC_OK;
}

/* ssd_forward's arrays, for its heads' pieces. */
typedef struct fwd_job {
  const double *x, *dt, *A, *Bm, *Cm, *h0, *Dh, *Z;
  double *Y;
  int64_t Bt, L, H, P, N, G;
  int nomem[QC_PAR_MAX]; /* piece tid could not allocate its state */
} fwd_job;

/* Heads [lo, hi), each its batches in order: every output element is its
 * own head's, so any thread count gives the same values. */
static void fwd_heads(void *ctx, int64_t lo, int64_t hi, int tid) {
  fwd_job *J = ctx;
  const int64_t L = J->L, H = J->H, P = J->P, N = J->N, G = J->G;
  double *st = malloc((size_t)(P * N + 1) * sizeof *st);
  if (!st) {
    J->nomem[tid] = 1;
    return;
  }
  for (int64_t h = lo; h < hi; h++)
    for (int64_t b = 0; b < J->Bt; b++) {
      for (int64_t e = 0; e < P * N; e++) st[e] = J->h0 ? J->h0[(b * H + h) * P * N + e] : 0;
      for (int64_t t = 0; t < L; t++) {
        const double d = J->dt[(b * L + t) * H + h], g = exp(d * J->A[h]);
        const double *xt = J->x + ((b * L + t) * H + h) * P, *bt = J->Bm + ((b * L + t) * G + h / (H / G)) * N,
                     *ct = J->Cm + ((b * L + t) * G + h / (H / G)) * N;
        for (int64_t p = 0; p < P; p++) {
          double acc = 0;
          for (int64_t q = 0; q < N; q++) {
            double *sp = st + p * N + q;
            *sp = g * *sp + d * xt[p] * bt[q];
            acc += *sp * ct[q];
          }
          const int64_t i = ((b * L + t) * H + h) * P + p;
          J->Y[i] = (acc + (J->Dh ? J->Dh[h] * xt[p] : 0)) * (J->Z ? J->Z[i] / (1.0 + exp(-J->Z[i])) : 1.0);
        }
      }
    }
  free(st);
}

/* Float64 forward y [B, L, H, P] by the recurrence, gated by silu(z) under
 * z_gate (for `fd` and the forward check), a head a unit on qc_par_for's
 * threads; no discrete branch. */
static int ssd_forward(const qc_module *m, const qc_module *branch, qc_tensor *y) {
  (void)branch;
  ssd_view v;
  int rc = ssd_view_get(m, &v);
  if (rc) return rc;
  double *x = qc_mod_f64(v.x, "ssd x"), *dt = qc_mod_f64(v.dt, "ssd dt"), *A = qc_mod_f64(v.A, "ssd A");
  double *Bm = qc_mod_f64(v.Bm, "ssd Bm"), *Cm = qc_mod_f64(v.Cm, "ssd Cm");
  double *h0 = v.h0 ? qc_mod_f64(v.h0, "ssd initial_state") : NULL;
  double *Dh = v.D ? qc_mod_f64(v.D, "ssd D") : NULL, *Z = v.z ? qc_mod_f64(v.z, "ssd z") : NULL;
  rc = QC_ESYS;
  if (!x || !dt || !A || !Bm || !Cm || (v.h0 && !h0) || (v.D && !Dh) || (v.z && !Z)) goto done;
  if ((rc = qc_tensor_alloc(y, "y", QC_F64, 4, v.x->shape))) goto done;
  fwd_job j = {.x = x, .dt = dt, .A = A, .Bm = Bm, .Cm = Cm, .h0 = h0, .Dh = Dh, .Z = Z, .Y = y->data,
               .Bt = v.Bt, .L = v.L, .H = v.H, .P = v.P, .N = v.N, .G = v.G};
  qc_par_for(v.H, 1, fwd_heads, &j);
  for (int i = 0; i < QC_PAR_MAX && rc == QC_OK; i++)
    if (j.nomem[i]) rc = qc_err_sys("out of memory: the state of a head's forward (ssd)");
  if (rc) qc_tensor_free(y); /* no half-made forward */
done:
  free(x); free(dt); free(A); free(Bm); free(Cm); free(h0); free(Dh); free(Z);
  return rc;
}

static float softplus(double z) { return (float)(z > 20 ? z : log1p(exp(z))); }

/* Generated SSD: shape [B, L, H, P, N] (Bm, Cm [B, L, N]) or [B, L, H, P,
 * N, G] (Bm, Cm [B, L, G, N], G dividing H). x ~ N(0,1), Bm, Cm ~ N(0,1) bf16;
 * dt = softplus(N(0,1) - 2) float32 (about 0.01..1.3); A = -exp(U(-1, 1))
 * float32; initial_state ~ N(0,1) float32 when the contract asks for it;
 * D [H] = 1 + 0.5 N(0,1) float32 under d_skip = true; z [B, L, H, P] ~
 * 2 N(0,1) bf16 under z_gate = true.
 * values = "special": head 0 decays very slowly (dt = 1e-4 at every step,
 * dt A ~ -1e-4: memory over the whole sequence), and every 7th step of the
 * last head (from step 3) is a near-reset (dt = 40, dt A <= -14.7); a zero x
 * row and x values +-8. "heavy_tail": x, Bm, Cm divided by 0.05 + U(0,1). */
static int ssd_generate(const qc_gen *gp, qc_rng *rng, qc_module *m, int *ondim, int64_t *oshape) {
  if (gp->nshape != 5 && gp->nshape != 6)
    return qc_err("ssd: generate shape needs [B, L, H, P, N] (batch, sequence, heads, head_dim, state size) or [B, L, H, P, N, "
                  "G] (G groups of Bm, Cm), got %d entries", gp->nshape);
  const int64_t B = gp->shape[0], L = gp->shape[1], H = gp->shape[2], P = gp->shape[3], N = gp->shape[4];
  const int64_t G = gp->nshape == 6 ? gp->shape[5] : 1;
  if (B < 1 || L < 1 || H < 1 || P < 1 || N < 1 || G < 1) return qc_err("ssd: generate shape needs B, L, H, P, N, G >= 1");
  if (H % G != 0) return qc_err("ssd: generate shape: G = %lld groups must divide H = %lld heads", (long long)G, (long long)H);
  const int bnd = gp->nshape == 6 ? 4 : 3;
  const int64_t xs[4] = {B, L, H, P}, ds[3] = {B, L, H}, as[1] = {H}, hs[4] = {B, H, P, N};
  const int64_t bs[4] = {B, L, bnd == 4 ? G : N, N};
  uint16_t *x, *bm, *cm;
  float *dt, *A, *h0;
  int rc;
  if ((rc = qc_mod_gen_bf16(&m->inputs, "x", 4, xs, rng, 1.0, &x))) return rc;
  if ((rc = qc_mod_add(&m->inputs, "dt", QC_F32, 3, ds, (void **)&dt))) return rc;
  if ((rc = qc_mod_add(&m->inputs, "A", QC_F32, 1, as, (void **)&A))) return rc;
  if ((rc = qc_mod_gen_bf16(&m->inputs, "Bm", bnd, bs, rng, 1.0, &bm))) return rc;
  if ((rc = qc_mod_gen_bf16(&m->inputs, "Cm", bnd, bs, rng, 1.0, &cm))) return rc;
  for (int64_t i = 0; i < B * L * H; i++) dt[i] = softplus(qc_rng_normal(rng) - 2.0);
  for (int64_t h = 0; h < H; h++) A[h] = (float)-exp(2.0 * qc_rng_uniform(rng) - 1.0);
  if (strcmp(qc_contract_str(&m->contract, "initial_state", "false"), "true") == 0) {
    if ((rc = qc_mod_add(&m->inputs, "initial_state", QC_F32, 4, hs, (void **)&h0))) return rc;
    for (int64_t i = 0; i < B * H * P * N; i++) h0[i] = (float)qc_rng_normal(rng);
  }
  if (strcmp(qc_contract_str(&m->contract, "d_skip", "false"), "true") == 0) {
    float *D;
    if ((rc = qc_mod_add(&m->inputs, "D", QC_F32, 1, as, (void **)&D))) return rc;
    for (int64_t h = 0; h < H; h++) D[h] = (float)(1.0 + 0.5 * qc_rng_normal(rng)); /* Mamba-2 starts D at ones */
  }
  if (strcmp(qc_contract_str(&m->contract, "z_gate", "false"), "true") == 0) {
    uint16_t *z;
    if ((rc = qc_mod_gen_bf16(&m->inputs, "z", 4, xs, rng, 2.0, &z))) return rc;
  }
  if (qc_mod_special(gp)) {
    for (int64_t b = 0; b < B; b++)
      for (int64_t t = 0; t < L; t++) {
        dt[(b * L + t) * H] = 1e-4f;
        if (H > 1 && t % 7 == 3) dt[(b * L + t) * H + H - 1] = 40.0f;
      }
    static const float ext[] = {8.0f, -8.0f, 0.0f};
    qc_mod_values(gp, rng, x, B * L * H, P, ext, 3);
  } else {
    static const float none[] = {0.0f};
    qc_mod_values(gp, rng, x, B * L * H, P, none, 1);
    qc_mod_values(gp, rng, bm, B * L * G, N, none, 1);
    qc_mod_values(gp, rng, cm, B * L * G, N, none, 1);
  }
  *ondim = 4;
  memcpy(oshape, xs, sizeof xs);
  return QC_OK;
}

/* ---- coverage (model/modinfo.h) ---- */

/* Tokens B L and sequence length L of x [B, L, H, P]. */
static int ssd_cov_tokens(const qc_module *m, int64_t *tokens, int64_t *seqlen) {
  const qc_tensor *t = qc_tset_get(&m->inputs, "x");
  if (!t || t->ndim != 4) return 0;
  *tokens = t->shape[0] * t->shape[1];
  *seqlen = t->shape[1];
  return 1;
}

static const qc_class_cov ssd_cov[] = {
    {.item = "context_lengths"},
    {NULL, NULL, NULL},
};

/* The class's reading of m for the engine's validation (qc_module_validate):
 * the view (shapes, the datasets the contract leaves unused), dY, and the
 * values exp(dt A) needs, as ssd_vjp refuses them. */
static int ssd_validate(const qc_module *m, const qc_tensor *dy) {
  ssd_view v;
  int rc = ssd_view_get(m, &v);
  if (rc) return rc;
  if ((rc = qc_module_check_dy(m, dy, qc_numel(v.x), v.x->shape[3], "the shape of inputs/x [B, L, H, P]"))) return rc;
  float *dt = qc_mod_f32(v.dt, "ssd dt"), *A = qc_mod_f32(v.A, "ssd A");
  rc = dt && A ? ssd_check_values(m, &v, dt, A) : QC_ESYS;
  free(dt); free(A);
  return rc;
}

const qc_class qc_class_ssd = {
    .name = "ssd",
    .summary = "Mamba-2 SSD scan (ngroups from Bm's shape, optional D skip, optional z gate), chunked float32 closed-form VJP: d_x, d_dt, d_A, d_Bm, d_Cm, d_D, d_z",
    .tensors = "inputs/x inputs/dt inputs/A inputs/Bm inputs/Cm inputs/initial_state inputs/D inputs/z outputs/y",
    .grads = "d_x d_dt d_A d_Bm d_Cm d_initial_state d_D d_z",
    .shape_help = "[B, L, H, P, N] or [B, L, H, P, N, G]: batch, sequence, heads, head_dim, state size, groups of Bm, Cm",
    .keys = ssd_keys,
    .generate = ssd_generate,
    .production = ssd_vjp,
    .not_checked = "",
    .forward = ssd_forward,
    .fd_shape = "2,9,2,3,4",
    .tol_model = ssd_tol_model,
    .validate = ssd_validate,
    .hypotheses = "factor sign rows zero dy_precision nonfinite",
    .coverage = ssd_cov,
    .cov_tokens = ssd_cov_tokens,
};
