/* reference/attention_gemm.c: the attention reference's products
 * (reference/attention.c's file comment is the math) as float64 GEMMs on the
 * audit's backend (gemm_f64: dgemm on the CPU, cuBLAS DGEMM on a device),
 * a block of query rows of one query head at a time:
 *   R = Q_blk K^T, dP = G_blk V^T     (the raw logits, dL/dP)
 * then on the host, row by row (qc_par_for; each row alone, so the result
 * does not depend on the thread count): the mask, softcap, softmax, Delta and
 * dS = c dL/dr, masked entries 0; then
 *   d_q_blk = dS K,  d_k += dS^T Q_blk,  d_v += P^T G_blk
 * the sums into d_k and d_v taken in a fixed order (query heads of the
 * group, then blocks, in turn). Under the terms' scale the same GEMMs run
 * on the magnitudes: |Q| |K|^T and |G| |V|^T give the rows' terms, and
 * T(dL/ds), P w feed d_q, d_k, d_v against |K|, |Q|, |G|. Only the keys
 * some row of the block sees are multiplied: [lo of its first row, hi of
 * its last). A block has at most ROWS_MAX rows and its [rows, keys]
 * matrices at most SCRATCH_BYTES together, so S = 4096 under 128 heads
 * stays within a few tens of MiB besides the operands. The saved O and
 * LSE: R (and |Q| |K|^T for the LSE's terms), the softmax on the host,
 * O_blk = exp(s - max) V / z. */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "core/par.h"
#include "core/qc.h"
#include "numerics/formats.h"
#include "reference/ref_attention.h"
#include "reference/ref_util.h"

#define ROWS_MAX 256
#define SCRATCH_BYTES ((int64_t)64 << 20)

/* ref_attention.h. */
int64_t qc_ref_att_block_rows(int64_t S, int nmat) {
  int64_t r = SCRATCH_BYTES / ((int64_t)nmat * S * (int64_t)sizeof(double));
  if (r > ROWS_MAX) r = ROWS_MAX;
  if (r > S) r = S;
  return r < 1 ? 1 : r;
}

/* The keys [*lo, *hi) query i sees (none when *hi <= *lo). */
static void keys_of(const qc_ref_att *a, int64_t i, int64_t *lo, int64_t *hi) {
  int64_t n = a->causal ? i + 1 + a->off : a->S;
  if (n > a->S) n = a->S;
  *lo = a->W > 0 && i - a->W + 1 > 0 ? i - a->W + 1 : 0; /* the window: i - j < W */
  *hi = n;
}

/* ref_attention.h. */
void qc_ref_att_block(const qc_ref_att *a, int64_t i0, int64_t rows, int64_t *m, int64_t *lo, int64_t *hi) {
  int64_t l2, h2;
  *m = a->S - i0 < rows ? a->S - i0 : rows;
  keys_of(a, i0, lo, &l2);
  keys_of(a, i0 + *m - 1, &h2, hi);
}

/* dst[0, n) = |src|. */
static void absv(const double *src, int64_t n, double *dst) {
  for (int64_t i = 0; i < n; i++) dst[i] = fabs(src[i]);
}

/* dst[0, n) += src: each element one addition (any thread count gives the same sums). */
typedef struct {
  double *dst;
  const double *src;
} add_job;

static void add_piece(void *ctx, int64_t lo, int64_t hi, int tid) {
  (void)tid;
  const add_job *j = ctx;
  for (int64_t i = lo; i < hi; i++) j->dst[i] += j->src[i];
}

static void add_into(double *dst, const double *src, int64_t n) {
  add_job j = {dst, src};
  qc_par_for(n, (int64_t)1 << 14, add_piece, &j);
}

/* The value of dt (bfloat16 or float16) next to r (a value of dt) on x's
 * side: the other end of the interval of dt values that brackets x. */
static double neighbour(double x, double r, qc_dtype dt) {
  const float rf = (float)r;
  const int up = (x > r) == (rf > 0 || (rf == 0 && x > 0)); /* away from zero */
  if (dt == QC_BF16) {
    uint32_t u;
    memcpy(&u, &rf, sizeof u);
    if (rf == 0) u = (x < 0 ? 0x80000000u : 0u) | 0x10000u;
    else u = up ? u + 0x10000u : u - 0x10000u;
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
  }
  uint16_t h = qc_f32_to_f16(rf);
  if (rf == 0) h = (uint16_t)((x < 0 ? 0x8000u : 0u) | 1u);
  else h = (uint16_t)(up ? h + 1u : h - 1u);
  return qc_f16_to_f32(h);
}

/* Delta_i = sum_d dO_id O~_id, O~ the row's O o [Dv] rounded to dt, or the
 * saved O's value so [Dv] where that is the other dt value bracketing O_id
 * (a float32 O a few ulps from the exact one rounds to either: a faithful
 * rounding). g [Dv]: dO_i. */
static double delta_rounded(const double *o, const double *g, const double *so, int64_t Dv, qc_dtype dt) {
  double pd = 0;
  for (int64_t d = 0; d < Dv; d++) {
    double r = qc_round_to(o[d], dt);
    if (so[d] != r && r != o[d] && so[d] == neighbour(o[d], r, dt)) r = so[d];
    pd += g[d] * r;
  }
  return pd;
}

/* One block of rows [i0, i0 + rows) of one query head, its keys [jlo, jlo
 * + nk); the matrices [rows, nk]: M1 R, then ds/dr, then c dL/dr (or c
 * T(dL/ds)); M2 dP; M3 P; under the terms M4 w (then P w), M5 sum_d |g||v|.
 * g, so: the head's dO and saved O rows [S, Dv] (so NULL: Delta from P, dP);
 * ob [rows, Dv] the reference's O; pd, pda, z per row. */
typedef struct {
  const qc_ref_att *a;
  int64_t i0, jlo, nk;
  const double *g, *so, *ob;
  double *M1, *M2, *M3, *M4, *M5, *pd, *pda, *z;
} blk;

/* Zero x [0, lo) and [hi, n) (all of it when hi <= lo). */
static void zero_out(double *x, int64_t lo, int64_t hi, int64_t n) {
  if (hi <= lo) lo = hi = n;
  memset(x, 0, (size_t)lo * sizeof *x);
  if (hi < n) memset(x + hi, 0, (size_t)(n - hi) * sizeof *x);
}

/* Row r's visible keys within the block, [*lo, *hi); 0 when it has none. */
static int row_keys(const blk *b, int64_t r, int64_t *lo, int64_t *hi) {
  keys_of(b->a, b->i0 + r, lo, hi);
  *lo -= b->jlo;
  *hi -= b->jlo;
  if (*hi > b->nk) *hi = b->nk;
  return *hi > *lo && *hi > 0;
}

/* The softmax of rows [r0, r1): s, ds/dr (into M1), max, P (M3), pd =
 * sum_l P_il dP_il, and under the terms w (M4) and sum_l P_il |dP|_il. */
static void vjp_rows1(void *ctx, int64_t r0, int64_t r1, int tid) {
  (void)tid;
  const blk *b = ctx;
  const qc_ref_att *a = b->a;
  const int64_t nk = b->nk;
  const double sc = a->sc, cap = a->cap;
  for (int64_t r = r0; r < r1; r++) {
    double *R = b->M1 + r * nk, *dP = b->M2 + r * nk, *P = b->M3 + r * nk;
    double *Wt = a->ab ? b->M4 + r * nk : NULL, *Pa = a->ab ? b->M5 + r * nk : NULL;
    int64_t lo, hi;
    const int vis = row_keys(b, r, &lo, &hi);
    zero_out(R, lo, hi, nk);
    zero_out(P, lo, hi, nk);
    if (Wt) zero_out(Wt, lo, hi, nk);
    b->z[r] = 0;
    if (!vis) continue; /* no visible key: the output and its gradients are 0 */
    double mx = -INFINITY, z = 0, pd = 0, pda = 0;
    for (int64_t j = lo; j < hi; j++) {
      const double x = R[j] * sc;
      if (cap > 0) {
        const double th = tanh(x / cap);
        P[j] = cap * th;
        R[j] = 1 - th * th;
      } else {
        P[j] = x;
        R[j] = 1;
      }
      if (P[j] > mx) mx = P[j];
    }
    for (int64_t j = lo; j < hi; j++) {
      P[j] = exp(P[j] - mx);
      z += P[j];
    }
    for (int64_t j = lo; j < hi; j++) {
      P[j] /= z;
      pd += P[j] * dP[j];
      if (Wt) {
        Wt[j] = 1 + sc * Wt[j] + fabs(mx);
        pda += P[j] * Pa[j];
      }
    }
    b->z[r] = z;
    b->pd[r] = pd;
    b->pda[r] = pda;
  }
}

/* Rows [r0, r1): Delta (from the rounded O when b->so), then M1 = c dL/dr,
 * or under the terms M1 = c T(dL/ds) and M4 = P w. */
static void vjp_rows2(void *ctx, int64_t r0, int64_t r1, int tid) {
  (void)tid;
  const blk *b = ctx;
  const qc_ref_att *a = b->a;
  const int64_t nk = b->nk, Dv = a->Dv;
  const double sc = a->sc;
  for (int64_t r = r0; r < r1; r++) {
    int64_t lo, hi;
    if (!b->z[r] || !row_keys(b, r, &lo, &hi)) continue;
    double *R = b->M1 + r * nk, *dP = b->M2 + r * nk, *P = b->M3 + r * nk;
    double pd = b->pd[r];
    const double pda = b->pda[r];
    if (b->so) pd = delta_rounded(b->ob + r * Dv, b->g + (b->i0 + r) * Dv, b->so + (b->i0 + r) * Dv, Dv, a->odt);
    if (a->ab) {
      double *Wt = b->M4 + r * nk, *Pa = b->M5 + r * nk;
      for (int64_t j = lo; j < hi; j++) {
        R[j] = sc * (P[j] * (Pa[j] + pda + Wt[j] * fabs(dP[j] - pd)) * fabs(R[j]));
        Wt[j] = P[j] * Wt[j];
      }
    } else
      for (int64_t j = lo; j < hi; j++) R[j] = sc * (P[j] * (dP[j] - pd) * R[j]);
  }
}

int qc_ref_att_vjp(const qc_ref_att *a, double *dq, double *dk, double *dv) {
  const qc_backend *be = a->be;
  const int64_t S = a->S, D = a->D, Dv = a->Dv, grp = a->Hq / a->Hkv, DD = D > Dv ? D : Dv;
  const int ab = a->ab, nmat = ab ? 5 : 3;
  if (S < 1) return QC_OK;
  const int64_t rows = qc_ref_att_block_rows(S, nmat), mn = rows * S;
  double *scr = qc_malloc(((size_t)nmat * (size_t)mn + (size_t)(rows * Dv) + (size_t)(S * DD) + 3 * (size_t)rows +
                           (ab ? (size_t)(S * (D + Dv) + rows * (D + Dv)) : 0)) * sizeof *scr,
                          "reference attention blocks");
  if (!scr) return QC_ESYS;
  blk b = {.a = a, .M1 = scr, .M2 = scr + mn, .M3 = scr + 2 * mn};
  double *p = scr + 3 * mn;
  if (ab) {
    b.M4 = p;
    b.M5 = p + mn;
    p += 2 * mn;
  }
  double *ob = p, *tmp = ob + rows * Dv;
  b.ob = ob;
  b.pd = tmp + S * DD;
  b.pda = b.pd + rows;
  b.z = b.pda + rows;
  double *aK = ab ? b.z + rows : NULL, *aV = ab ? aK + S * D : NULL; /* the magnitudes, under the terms */
  double *aQ = ab ? aV + S * Dv : NULL, *aG = ab ? aQ + rows * D : NULL;
  int rc = QC_OK;
  for (int64_t u = 0; u < a->B * a->Hkv && !rc; u++) {
    const double *k = a->K + u * S * D, *v = a->V + u * S * Dv;
    double *gk = dk + u * S * D, *gv = dv + u * S * Dv;
    if (ab) {
      absv(k, S * D, aK);
      absv(v, S * Dv, aV);
    }
    for (int64_t hq = (u / a->Hkv) * a->Hq + (u % a->Hkv) * grp, h = hq; h < hq + grp && !rc; h++) {
      const double *q = a->Q + h * S * D;
      b.g = a->G + h * S * Dv;
      b.so = a->O ? a->O + h * S * Dv : NULL;
      for (int64_t i0 = 0; i0 < S && !rc; i0 += rows) {
        int64_t m, lo, hi;
        qc_ref_att_block(a, i0, rows, &m, &lo, &hi);
        if (hi <= lo) continue; /* no row of the block sees a key */
        const double *qb = q + i0 * D, *gb = b.g + i0 * Dv;
        b.i0 = i0;
        b.jlo = lo;
        b.nk = hi - lo;
        if ((rc = qc_refu_gemm(be, QC_OP_N, QC_OP_T, m, b.nk, D, qb, k + lo * D, b.M1)) ||
            (rc = qc_refu_gemm(be, QC_OP_N, QC_OP_T, m, b.nk, Dv, gb, v + lo * Dv, b.M2)))
          break;
        if (ab) {
          absv(qb, m * D, aQ);
          absv(gb, m * Dv, aG);
          if ((rc = qc_refu_gemm(be, QC_OP_N, QC_OP_T, m, b.nk, D, aQ, aK + lo * D, b.M4)) ||
              (rc = qc_refu_gemm(be, QC_OP_N, QC_OP_T, m, b.nk, Dv, aG, aV + lo * Dv, b.M5)))
            break;
        }
        qc_par_for(m, 1, vjp_rows1, &b);
        if (b.so && (rc = qc_refu_gemm(be, QC_OP_N, QC_OP_N, m, Dv, b.nk, b.M3, v + lo * Dv, ob))) break;
        qc_par_for(m, 1, vjp_rows2, &b);
        /* d_q's rows are this block's alone; d_k, d_v sum over blocks and heads */
        if ((rc = qc_refu_gemm(be, QC_OP_N, QC_OP_N, m, D, b.nk, b.M1, (ab ? aK : k) + lo * D, dq + (h * S + i0) * D))) break;
        if ((rc = qc_refu_gemm(be, QC_OP_T, QC_OP_N, b.nk, D, m, b.M1, ab ? aQ : qb, tmp))) break;
        add_into(gk + lo * D, tmp, b.nk * D);
        if ((rc = qc_refu_gemm(be, QC_OP_T, QC_OP_N, b.nk, Dv, m, ab ? b.M4 : b.M3, ab ? aG : gb, tmp))) break;
        add_into(gv + lo * Dv, tmp, b.nk * Dv);
      }
    }
  }
  free(scr);
  return rc;
}

/* The forward's block: M1 R then exp(s - max), M2 c sum_d |q||k| (LSE
 * only); out and t the head's rows. */
typedef struct {
  const qc_ref_att *a;
  int64_t i0, jlo, nk, Dv;
  double *M1, *M2, *out, *t, *z;
  int lse;
} fblk;

static void fwd_rows(void *ctx, int64_t r0, int64_t r1, int tid) {
  (void)tid;
  const fblk *f = ctx;
  const blk kb = {.a = f->a, .i0 = f->i0, .jlo = f->jlo, .nk = f->nk};
  const int64_t nk = f->nk;
  const double sc = f->a->sc, cap = f->a->cap;
  for (int64_t r = r0; r < r1; r++) {
    double *P = f->M1 + r * nk;
    int64_t lo, hi;
    const int vis = row_keys(&kb, r, &lo, &hi);
    if (!f->lse) zero_out(P, lo, hi, nk);
    f->z[r] = 1;
    if (!vis) { /* no visible key: O_i = 0, no LSE */
      if (f->lse) {
        f->out[f->i0 + r] = -INFINITY;
        f->t[f->i0 + r] = 0;
      }
      continue;
    }
    double mx = -INFINITY, z = 0, amax = 0;
    for (int64_t j = lo; j < hi; j++) {
      const double s = P[j] * sc;
      P[j] = cap > 0 ? cap * tanh(s / cap) : s;
      mx = fmax(mx, P[j]);
      if (f->lse) amax = fmax(amax, sc * f->M2[r * nk + j]);
    }
    for (int64_t j = lo; j < hi; j++) z += (P[j] = exp(P[j] - mx));
    if (f->lse) {
      f->out[f->i0 + r] = mx + log(z);
      f->t[f->i0 + r] = fabs(mx) + amax + 1;
    }
    f->z[r] = z;
  }
}

/* O's rows [r0, r1) divided by their z. */
static void fwd_norm(void *ctx, int64_t r0, int64_t r1, int tid) {
  (void)tid;
  const fblk *f = ctx;
  for (int64_t r = r0; r < r1; r++)
    for (int64_t d = 0; d < f->Dv; d++) f->out[(f->i0 + r) * f->Dv + d] /= f->z[r];
}

int qc_ref_att_fwd(const qc_ref_att *a, int lse, double *out, double *t) {
  const qc_backend *be = a->be;
  const int64_t S = a->S, D = a->D, Dv = a->Dv, grp = a->Hq / a->Hkv;
  if (S < 1) return QC_OK;
  const int64_t rows = qc_ref_att_block_rows(S, lse ? 2 : 1), mn = rows * S;
  double *scr = qc_malloc(((size_t)(lse ? 2 : 1) * (size_t)mn + (size_t)rows +
                           (lse ? (size_t)(S * D + rows * D) : 0)) * sizeof *scr, "reference attention forward blocks");
  if (!scr) return QC_ESYS;
  fblk f = {.a = a, .Dv = Dv, .M1 = scr, .M2 = lse ? scr + mn : NULL, .lse = lse};
  f.z = scr + (lse ? 2 : 1) * mn;
  double *aK = lse ? f.z + rows : NULL, *aQ = lse ? aK + S * D : NULL;
  int rc = QC_OK;
  for (int64_t h = 0; h < a->B * a->Hq && !rc; h++) {
    const int64_t u = (h / a->Hq) * a->Hkv + (h % a->Hq) / grp; /* the kv head */
    const double *q = a->Q + h * S * D, *k = a->K + u * S * D, *v = a->V + u * S * Dv;
    f.out = lse ? out + h * S : out + h * S * Dv;
    f.t = lse ? t + h * S : NULL;
    if (lse && (h % a->Hq) % grp == 0) absv(k, S * D, aK);
    for (int64_t i0 = 0; i0 < S && !rc; i0 += rows) {
      int64_t m, lo, hi;
      qc_ref_att_block(a, i0, rows, &m, &lo, &hi);
      f.i0 = i0;
      f.jlo = lo;
      f.nk = hi > lo ? hi - lo : 0;
      if (f.nk) {
        if ((rc = qc_refu_gemm(be, QC_OP_N, QC_OP_T, m, f.nk, D, q + i0 * D, k + lo * D, f.M1))) break;
        if (lse) {
          absv(q + i0 * D, m * D, aQ);
          if ((rc = qc_refu_gemm(be, QC_OP_N, QC_OP_T, m, f.nk, D, aQ, aK + lo * D, f.M2))) break;
        }
      }
      qc_par_for(m, 1, fwd_rows, &f); /* with nk 0 every row is empty */
      if (lse) continue;
      if (!f.nk) {
        memset(f.out + i0 * Dv, 0, (size_t)(m * Dv) * sizeof *out);
        continue;
      }
      if ((rc = qc_refu_gemm(be, QC_OP_N, QC_OP_N, m, Dv, f.nk, f.M1, v + lo * Dv, f.out + i0 * Dv))) break;
      qc_par_for(m, 1, fwd_norm, &f);
    }
  }
  free(scr);
  return rc;
}
