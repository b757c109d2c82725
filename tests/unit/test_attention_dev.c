/* test_attention_dev.c: reference/attention_dev.c's blocks, buffers and
 * sums on the CPU. A backend that is the CPU's but for host_memory 0 and an
 * att_rows written here from attention_gemm.c's row loops (sequential sums,
 * as the host's) takes the device path, so its d_q, d_k, d_v, O and LSE must
 * equal the host path's bit for bit: what this checks is the device path's
 * indexing (heads, kv groups, blocks, key windows, the sums into d_k and
 * d_v), which CI has no GPU to run. The kernels themselves are compared with
 * the host path in tests/gpu/test_gpu_attention.c. Without att_rows, with
 * a read O, and on the CPU backend the device path answers QC_NA. */
#include <criterion/criterion.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "backend/backend.h"
#include "core/qc.h"
#include "core/rng.h"
#include "model/module.h"
#include "reference/ref_attention.h"
#include "att_cfgs.h"

/* row r's keys relative to the block, as attention_gemm.c's row_keys */
static int emu_keys(const qc_att_rows *j, int64_t r, int64_t *lo, int64_t *hi) {
  const int64_t i = j->i0 + r;
  int64_t n = j->causal ? i + 1 + j->off : j->S;
  if (n > j->S) n = j->S;
  *lo = (j->W > 0 && i - j->W + 1 > 0 ? i - j->W + 1 : 0) - j->jlo;
  *hi = n - j->jlo;
  if (*hi > j->nk) *hi = j->nk;
  return *hi > *lo && *hi > 0;
}

static void emu_zero(double *x, int64_t lo, int64_t hi, int64_t n) {
  if (hi <= lo) lo = hi = n;
  for (int64_t k = 0; k < n; k++)
    if (k < lo || k >= hi) x[k] = 0;
}

static int emu_rows(const qc_backend *be, const qc_att_rows *j) {
  (void)be;
  if (j->op == QC_ATT_PROBE) return QC_OK;
  if (j->op == QC_ATT_ADD) {
    for (int64_t i = 0; i < j->n; i++) j->dst[i] += j->src[i];
    return QC_OK;
  }
  for (int64_t r = 0; r < j->rows; r++) {
    const int64_t nk = j->nk;
    int64_t lo = 0, hi = 0;
    if (j->op == QC_ATT_FWD_NORM) {
      for (int64_t d = 0; d < j->Dv; d++) j->out[r * j->Dv + d] /= j->z[r];
      continue;
    }
    if (j->op == QC_ATT_FWD) {
      double *P = j->M1 + r * nk;
      const int vis = nk > 0 && emu_keys(j, r, &lo, &hi);
      if (!j->lse && nk > 0) emu_zero(P, vis ? lo : 0, vis ? hi : 0, nk);
      j->z[r] = 1;
      if (!vis) {
        if (j->lse) j->out[j->i0 + r] = -INFINITY, j->t[j->i0 + r] = 0;
        continue;
      }
      double mx = -INFINITY, z = 0, amax = 0;
      for (int64_t k = lo; k < hi; k++) {
        const double s = P[k] * j->sc;
        P[k] = j->cap > 0 ? j->cap * tanh(s / j->cap) : s;
        mx = fmax(mx, P[k]);
        if (j->lse) amax = fmax(amax, j->sc * j->M2[r * nk + k]);
      }
      for (int64_t k = lo; k < hi; k++) z += (P[k] = exp(P[k] - mx));
      j->z[r] = z;
      if (j->lse) j->out[j->i0 + r] = mx + log(z), j->t[j->i0 + r] = fabs(mx) + amax + 1;
      continue;
    }
    double *R = j->M1 + r * nk, *dP = j->M2 + r * nk, *P = j->M3 + r * nk;
    double *Wt = j->ab ? j->M4 + r * nk : NULL, *Pa = j->ab ? j->M5 + r * nk : NULL;
    if (j->op == QC_ATT_VJP1) {
      const int vis = emu_keys(j, r, &lo, &hi);
      emu_zero(R, lo, hi, nk);
      emu_zero(P, lo, hi, nk);
      if (Wt) emu_zero(Wt, lo, hi, nk);
      j->z[r] = 0;
      if (!vis) continue;
      double mx = -INFINITY, z = 0, pd = 0, pda = 0;
      for (int64_t k = lo; k < hi; k++) {
        const double x = R[k] * j->sc;
        if (j->cap > 0) {
          const double th = tanh(x / j->cap);
          P[k] = j->cap * th;
          R[k] = 1 - th * th;
        } else {
          P[k] = x;
          R[k] = 1;
        }
        if (P[k] > mx) mx = P[k];
      }
      for (int64_t k = lo; k < hi; k++) z += (P[k] = exp(P[k] - mx));
      for (int64_t k = lo; k < hi; k++) {
        P[k] /= z;
        pd += P[k] * dP[k];
        if (Wt) {
          Wt[k] = 1 + j->sc * Wt[k] + fabs(mx);
          pda += P[k] * Pa[k];
        }
      }
      j->z[r] = z;
      j->pd[r] = pd;
      j->pda[r] = pda;
    } else if (j->op == QC_ATT_VJP2) {
      if (!j->z[r] || !emu_keys(j, r, &lo, &hi)) continue;
      for (int64_t k = lo; k < hi; k++) {
        if (j->ab) {
          R[k] = j->sc * (P[k] * (Pa[k] + j->pda[r] + Wt[k] * fabs(dP[k] - j->pd[r])) * fabs(R[k]));
          Wt[k] = P[k] * Wt[k];
        } else
          R[k] = j->sc * (P[k] * (dP[k] - j->pd[r]) * R[k]);
      }
    } else
      return qc_err("emu_rows: op %d", j->op);
  }
  return QC_OK;
}

static int emu_mem(const qc_backend *be, size_t *bytes) {
  (void)be;
  *bytes = (size_t)1 << 34;
  return QC_OK;
}

/* The CPU backend posing as a device with the row passes above. */
static qc_backend emu(void) {
  qc_backend b = *qc_backend_cpu();
  b.host_memory = 0;
  b.att_rows = emu_rows;
  b.mem_free = emu_mem;
  return b;
}

static double *randn(int64_t n, uint64_t seed) {
  qc_rng r;
  qc_rng_seed(&r, seed);
  double *a = malloc((size_t)n * sizeof *a);
  cr_assert_not_null(a);
  for (int64_t i = 0; i < n; i++) a[i] = qc_rng_normal(&r);
  return a;
}

static void same(const double *a, const double *b, int64_t n, const char *what, int c) {
  for (int64_t i = 0; i < n; i++)
    if (memcmp(&a[i], &b[i], sizeof *a) != 0) {
      cr_expect(0, "config %d %s: element %lld: device path %.17g, host %.17g", c, what, (long long)i, a[i], b[i]);
      return;
    }
}

Test(attention_dev, device_path_equals_host_bit_for_bit) {
  const qc_backend dev = emu();
  for (int c = 0; c < ATT_NCFGS; c++) {
    const att_cfg *cf = &g_att_cfgs[c];
    const int64_t nQ = cf->B * cf->Hq * cf->S * cf->D, nK = cf->B * cf->Hkv * cf->S * cf->D;
    const int64_t nV = cf->B * cf->Hkv * cf->S * cf->Dv, nG = cf->B * cf->Hq * cf->S * cf->Dv;
    const int64_t nL = cf->B * cf->Hq * cf->S;
    double *Q = randn(nQ, 1 + c), *K = randn(nK, 11 + c), *V = randn(nV, 21 + c), *G = randn(nG, 31 + c);
    qc_ref_att a = {.Q = Q, .K = K, .V = V, .G = G, .B = cf->B, .Hq = cf->Hq, .Hkv = cf->Hkv, .S = cf->S,
                    .D = cf->D, .Dv = cf->Dv, .W = cf->W, .off = cf->off, .sc = 1.0 / sqrt((double)cf->D),
                    .cap = cf->cap, .causal = cf->causal};
    for (int ab = 0; ab < 2; ab++) {
      const int64_t n[3] = {nQ, nK, nV};
      double *h[3], *d[3];
      for (int t = 0; t < 3; t++) h[t] = calloc((size_t)n[t], 8), d[t] = calloc((size_t)n[t], 8);
      a.ab = ab;
      a.be = qc_backend_cpu();
      cr_assert_eq(qc_ref_att_vjp_dev(&a, h[0], h[1], h[2]), QC_NA, "the CPU backend took the device path");
      cr_assert_eq(qc_ref_att_vjp(&a, h[0], h[1], h[2]), QC_OK, "%s", qc_err_msg());
      a.be = &dev;
      cr_assert_eq(qc_ref_att_vjp_dev(&a, d[0], d[1], d[2]), QC_OK, "%s", qc_err_msg());
      for (int t = 0; t < 3; t++) {
        same(d[t], h[t], n[t], t == 0 ? (ab ? "T(d_q)" : "d_q") : t == 1 ? (ab ? "T(d_k)" : "d_k") : (ab ? "T(d_v)" : "d_v"), c);
        free(h[t]);
        free(d[t]);
      }
    }
    a.ab = 0;
    for (int lse = 0; lse < 2; lse++) {
      const int64_t no = lse ? nL : nG;
      double *ho = calloc((size_t)no, 8), *dout = calloc((size_t)no, 8), *ht = calloc((size_t)nL, 8), *dt = calloc((size_t)nL, 8);
      a.be = qc_backend_cpu();
      cr_assert_eq(qc_ref_att_fwd(&a, lse, ho, ht), QC_OK, "%s", qc_err_msg());
      a.be = &dev;
      cr_assert_eq(qc_ref_att_fwd_dev(&a, lse, dout, dt), QC_OK, "%s", qc_err_msg());
      same(dout, ho, no, lse ? "LSE" : "O", c);
      if (lse) same(dt, ht, nL, "the LSE's terms", c);
      free(ho); free(dout); free(ht); free(dt);
    }
    free(Q); free(K); free(V); free(G);
  }
}

/* A read O (the rounded-O Delta) and a backend without att_rows keep the host path. */
Test(attention_dev, host_path_where_the_rows_cannot_move) {
  const int64_t S = 20, D = 4, n = S * D;
  double *Q = randn(n, 1), *dq = calloc((size_t)n, 8), *dk = calloc((size_t)n, 8), *dv = calloc((size_t)n, 8);
  qc_backend dev = emu();
  qc_ref_att a = {.be = &dev, .Q = Q, .K = Q, .V = Q, .G = Q, .O = Q, .B = 1, .Hq = 1, .Hkv = 1, .S = S, .D = D, .Dv = D,
                  .sc = 0.5, .causal = 1, .odt = QC_BF16};
  cr_expect_eq(qc_ref_att_vjp_dev(&a, dq, dk, dv), QC_NA);
  a.O = NULL;
  dev.att_rows = NULL;
  cr_expect_eq(qc_ref_att_vjp_dev(&a, dq, dk, dv), QC_NA);
  cr_expect_eq(qc_ref_att_fwd_dev(&a, 0, dq, NULL), QC_NA);
  cr_expect_eq(qc_err_msg()[0], 0, "a declined device path set an error: %s", qc_err_msg());
  free(Q); free(dq); free(dk); free(dv);
}
