/* reference/attention_dev.c: the attention reference's blocks
 * (reference/attention_gemm.c) with every operand in the backend's device
 * buffers and the row passes on the device.
 *
 * Where the backend has device buffers and the row passes (be->att_rows,
 * backend/cuda/attrows.cu: attention_gemm.c's row loops, element by
 * element, as kernels), every operand is uploaded once, the GEMMs run on
 * the buffers (gemm_f64_buf) and the rows on the device: nothing is staged
 * per block, where the host path moves each block's [rows, keys] matrices
 * across the link and back (444 GB for a DeepSeek-V3 layer at 128 heads of
 * 4,096 tokens). Not taken (QC_NA: the host path runs) when O is read for
 * Delta (the rounded-O rows stay on the host), when the probe says no
 * (QC_CUDA_ATT_HOST=1), or when the buffers would not fit in 90% of the
 * device's free memory. The same blocks, GEMMs and sums into d_k and d_v in
 * the same order as the host path; the rows' sums as a fixed tree, not in
 * key order. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "backend/backend.h"
#include "core/qc.h"
#include "reference/ref_attention.h"
#include "reference/ref_util.h"

typedef struct {
  const qc_backend *be;
  void *p[16];
  int n;
} dbufs;

/* A device buffer of n doubles, freed by dfree; QC_OK or the backend's error. */
static int dalloc(dbufs *d, int64_t n, const char *what, double **out) {
  void *p = NULL;
  int rc = d->be->buf_alloc(d->be, (size_t)(n > 0 ? n : 1) * sizeof(double), what, &p);
  if (rc) return rc;
  d->p[d->n++] = p;
  *out = p;
  return QC_OK;
}

/* A device copy of src [n] (its magnitudes when ab), freed by dfree. */
static int dput(dbufs *d, const double *src, int64_t n, int ab, const char *what, double **out) {
  int rc = dalloc(d, n, what, out);
  if (rc || n <= 0) return rc;
  if (!ab) return d->be->upload(d->be, *out, src, (size_t)n * sizeof(double));
  double *h = qc_malloc((size_t)n * sizeof *h, what);
  if (!h) return QC_ESYS;
  memcpy(h, src, (size_t)n * sizeof *h);
  qc_abs_all(h, n);
  rc = d->be->upload(d->be, *out, h, (size_t)n * sizeof(double));
  if (!rc && d->be->sync) rc = d->be->sync(d->be); /* h is freed below: the copy must be done */
  free(h);
  return rc;
}

/* Free d's buffers, after the queued work that may still read them when rc
 * failed (the wait's own error is rc's); returns rc. */
static int dfinish(dbufs *d, int rc) {
  if (rc && d->be->sync) {
    qc_err_state es;
    qc_err_save(&es);
    (void)d->be->sync(d->be);
    qc_err_restore(&es);
  }
  for (int i = 0; i < d->n; i++) d->be->buf_free(d->be, d->p[i]);
  d->n = 0;
  return rc;
}

/* 1 when a's backend runs the rows on its device and `bytes` of buffers fit. */
static int use_device(const qc_ref_att *a, double bytes) {
  const qc_backend *be = a->be;
  if (!be->att_rows || be->host_memory || !be->buf_alloc || !be->buf_free || !be->upload || !be->download ||
      !be->gemm_f64_buf)
    return 0;
  const qc_att_rows probe = {.op = QC_ATT_PROBE};
  qc_err_state es; /* a probe or a memory query that fails is an answer: the host path */
  qc_err_save(&es);
  size_t fr = 0;
  int ok = be->att_rows(be, &probe) == QC_OK && (!be->mem_free || (be->mem_free(be, &fr) == QC_OK && bytes < 0.9 * (double)fr));
  qc_err_restore(&es);
  return ok;
}

static int rows_op(const qc_backend *be, qc_att_rows j, int op) {
  j.op = op;
  return be->att_rows(be, &j);
}

/* ref_attention.h. */
int qc_ref_att_vjp_dev(const qc_ref_att *a, double *dq, double *dk, double *dv) {
  const qc_backend *be = a->be;
  const int64_t S = a->S, D = a->D, Dv = a->Dv, grp = a->Hq / a->Hkv, DD = D > Dv ? D : Dv;
  const int ab = a->ab, nmat = ab ? 5 : 3;
  if (S < 1) return QC_NA; /* nothing to do: the host path's early return */
  const int64_t rows = qc_ref_att_block_rows(S, nmat), mn = rows * S;
  const int64_t nQ = a->B * a->Hq * S * D, nK = a->B * a->Hkv * S * D, nV = a->B * a->Hkv * S * Dv, nG = a->B * a->Hq * S * Dv;
  if (a->O || !use_device(a, 8.0 * ((double)(nQ + nK + nV + nG) * (ab ? 2 : 1) + (double)(nQ + nK + nV) +
                                     (double)(nmat * mn + 3 * rows + S * DD))))
    return QC_NA;
  dbufs d = {.be = be};
  double *Q, *K, *V, *G, *aQ = NULL, *aK = NULL, *aV = NULL, *aG = NULL, *gq, *gk, *gv, *M, *pz, *tmp;
  int rc;
  if ((rc = dput(&d, a->Q, nQ, 0, "reference attention q", &Q)) || (rc = dput(&d, a->K, nK, 0, "reference attention k", &K)) ||
      (rc = dput(&d, a->V, nV, 0, "reference attention v", &V)) || (rc = dput(&d, a->G, nG, 0, "reference attention dY", &G)) ||
      (ab && ((rc = dput(&d, a->Q, nQ, 1, "reference attention |q|", &aQ)) || (rc = dput(&d, a->K, nK, 1, "reference attention |k|", &aK)) ||
              (rc = dput(&d, a->V, nV, 1, "reference attention |v|", &aV)) || (rc = dput(&d, a->G, nG, 1, "reference attention |dY|", &aG)))) ||
      (rc = dput(&d, dq, nQ, 0, "reference attention d_q", &gq)) || (rc = dput(&d, dk, nK, 0, "reference attention d_k", &gk)) ||
      (rc = dput(&d, dv, nV, 0, "reference attention d_v", &gv)) || (rc = dalloc(&d, nmat * mn, "reference attention blocks", &M)) ||
      (rc = dalloc(&d, 3 * rows, "reference attention row sums", &pz)) || (rc = dalloc(&d, S * DD, "reference attention sums", &tmp)))
    goto done;
  qc_att_rows j = {.S = S, .W = a->W, .off = a->off, .Dv = Dv, .causal = a->causal, .ab = ab, .sc = a->sc, .cap = a->cap,
                   .M1 = M, .M2 = M + mn, .M3 = M + 2 * mn, .M4 = ab ? M + 3 * mn : NULL, .M5 = ab ? M + 4 * mn : NULL,
                   .pd = pz, .pda = pz + rows, .z = pz + 2 * rows};
  for (int64_t u = 0; u < a->B * a->Hkv && !rc; u++) {
    const double *k = K + u * S * D, *v = V + u * S * Dv, *ak = ab ? aK + u * S * D : NULL, *av = ab ? aV + u * S * Dv : NULL;
    for (int64_t hq = (u / a->Hkv) * a->Hq + (u % a->Hkv) * grp, h = hq; h < hq + grp && !rc; h++)
      for (int64_t i0 = 0; i0 < S && !rc; i0 += rows) {
        int64_t m, lo, hi;
        qc_ref_att_block(a, i0, rows, &m, &lo, &hi);
        if (hi <= lo) continue; /* no row of the block sees a key */
        const int64_t nk = hi - lo;
        const double *qb = Q + (h * S + i0) * D, *gb = G + (h * S + i0) * Dv;
        const double *aqb = ab ? aQ + (h * S + i0) * D : NULL, *agb = ab ? aG + (h * S + i0) * Dv : NULL;
        j.rows = m;
        j.i0 = i0;
        j.jlo = lo;
        j.nk = nk;
        if ((rc = be->gemm_f64_buf(be, QC_OP_N, QC_OP_T, m, nk, D, qb, D, k + lo * D, D, j.M1, nk)) ||
            (rc = be->gemm_f64_buf(be, QC_OP_N, QC_OP_T, m, nk, Dv, gb, Dv, v + lo * Dv, Dv, j.M2, nk)))
          break;
        if (ab && ((rc = be->gemm_f64_buf(be, QC_OP_N, QC_OP_T, m, nk, D, aqb, D, ak + lo * D, D, j.M4, nk)) ||
                   (rc = be->gemm_f64_buf(be, QC_OP_N, QC_OP_T, m, nk, Dv, agb, Dv, av + lo * Dv, Dv, j.M5, nk))))
          break;
        if ((rc = rows_op(be, j, QC_ATT_VJP1)) || (rc = rows_op(be, j, QC_ATT_VJP2))) break;
        if ((rc = be->gemm_f64_buf(be, QC_OP_N, QC_OP_N, m, D, nk, j.M1, nk, (ab ? ak : k) + lo * D, D, gq + (h * S + i0) * D, D)))
          break;
        qc_att_rows add = {.op = QC_ATT_ADD, .dst = gk + u * S * D + lo * D, .src = tmp, .n = nk * D};
        if ((rc = be->gemm_f64_buf(be, QC_OP_T, QC_OP_N, nk, D, m, j.M1, nk, ab ? aqb : qb, D, tmp, D)) ||
            (rc = be->att_rows(be, &add)))
          break;
        add.dst = gv + u * S * Dv + lo * Dv;
        add.n = nk * Dv;
        if ((rc = be->gemm_f64_buf(be, QC_OP_T, QC_OP_N, nk, Dv, m, ab ? j.M4 : j.M3, nk, ab ? agb : gb, Dv, tmp, Dv)) ||
            (rc = be->att_rows(be, &add)))
          break;
      }
  }
  if (!rc && !(rc = be->download(be, dq, gq, (size_t)nQ * sizeof *dq)) && !(rc = be->download(be, dk, gk, (size_t)nK * sizeof *dk)))
    rc = be->download(be, dv, gv, (size_t)nV * sizeof *dv);
done:
  return dfinish(&d, rc);
}

/* ref_attention.h. */
int qc_ref_att_fwd_dev(const qc_ref_att *a, int lse, double *out, double *t) {
  const qc_backend *be = a->be;
  const int64_t S = a->S, D = a->D, Dv = a->Dv, grp = a->Hq / a->Hkv;
  if (S < 1) return QC_NA;
  const int64_t rows = qc_ref_att_block_rows(S, lse ? 2 : 1), mn = rows * S;
  const int64_t nQ = a->B * a->Hq * S * D, nK = a->B * a->Hkv * S * D, nV = lse ? 0 : a->B * a->Hkv * S * Dv;
  const int64_t nO = lse ? a->B * a->Hq * S : a->B * a->Hq * S * Dv;
  if (!use_device(a, 8.0 * ((double)(nQ + nK) * (lse ? 2 : 1) + (double)(nV + nO * (lse ? 2 : 1)) + (double)((lse ? 2 : 1) * mn + rows))))
    return QC_NA;
  dbufs d = {.be = be};
  double *Q, *K, *V = NULL, *aQ = NULL, *aK = NULL, *go, *gt = NULL, *M, *z;
  int rc;
  if ((rc = dput(&d, a->Q, nQ, 0, "reference attention q", &Q)) || (rc = dput(&d, a->K, nK, 0, "reference attention k", &K)) ||
      (!lse && (rc = dput(&d, a->V, nV, 0, "reference attention v", &V))) ||
      (lse && ((rc = dput(&d, a->Q, nQ, 1, "reference attention |q|", &aQ)) || (rc = dput(&d, a->K, nK, 1, "reference attention |k|", &aK)) ||
               (rc = dalloc(&d, nO, "reference attention LSE terms", &gt)))) ||
      (rc = dalloc(&d, nO, "reference attention forward", &go)) || (rc = dalloc(&d, (lse ? 2 : 1) * mn, "reference attention forward blocks", &M)) ||
      (rc = dalloc(&d, rows, "reference attention row sums", &z)))
    goto done;
  qc_att_rows j = {.S = S, .W = a->W, .off = a->off, .Dv = Dv, .causal = a->causal, .lse = lse, .sc = a->sc, .cap = a->cap,
                   .M1 = M, .M2 = lse ? M + mn : NULL, .z = z};
  for (int64_t h = 0; h < a->B * a->Hq && !rc; h++) {
    const int64_t u = (h / a->Hq) * a->Hkv + (h % a->Hq) / grp; /* the kv head */
    for (int64_t i0 = 0; i0 < S && !rc; i0 += rows) {
      int64_t m, lo, hi;
      qc_ref_att_block(a, i0, rows, &m, &lo, &hi);
      j.rows = m;
      j.i0 = i0;
      j.jlo = lo;
      j.nk = hi > lo ? hi - lo : 0;
      j.out = lse ? go + h * S : go + (h * S + i0) * Dv;
      j.t = lse ? gt + h * S : NULL;
      if (j.nk && ((rc = be->gemm_f64_buf(be, QC_OP_N, QC_OP_T, m, j.nk, D, Q + (h * S + i0) * D, D, K + (u * S + lo) * D, D, j.M1, j.nk)) ||
                   (lse && (rc = be->gemm_f64_buf(be, QC_OP_N, QC_OP_T, m, j.nk, D, aQ + (h * S + i0) * D, D, aK + (u * S + lo) * D, D,
                                                  j.M2, j.nk)))))
        break;
      if (lse) {
        j.out = go + h * S; /* the rows' LSE at out[i0 + r] */
        if ((rc = rows_op(be, j, QC_ATT_FWD))) break;
        continue;
      }
      qc_att_rows f = j;
      f.out = go + h * S; /* FWD writes nothing to out without lse */
      if ((rc = rows_op(be, f, QC_ATT_FWD))) break;
      /* O's rows: P V (k = 0 zeroes them: no key), then / z */
      if ((rc = be->gemm_f64_buf(be, QC_OP_N, QC_OP_N, m, Dv, j.nk, j.M1, j.nk, V + (u * S + lo) * Dv, Dv, j.out, Dv)) ||
          (rc = rows_op(be, j, QC_ATT_FWD_NORM)))
        break;
    }
  }
  if (!rc && !(rc = be->download(be, out, go, (size_t)nO * sizeof *out)) && lse)
    rc = be->download(be, t, gt, (size_t)nO * sizeof *t);
done:
  return dfinish(&d, rc);
}
