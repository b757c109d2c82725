/* ozaki.cu: the fast reference (--reference fast): the fused audit's
 * float64 reference GEMMs by the Ozaki scheme on int8 tensor cores.
 *
 * Each row of op(A) gets a power-of-two scale 2^e_i, twice the power of two
 * above max |row|, and is cut into S int8 digits per element rounded to
 * nearest (kernels/ozaki.cu): a = 2^e_i (sum_t d_t 2^(-7t) + rest), |d_t|
 * <= 64, |rest| <= 2^(-7S-1); likewise each column of op(B) with 2^f_j. A
 * plan (backend/ozplan.h), chosen on the host from the self-check's sample
 * before any product runs, says which pairs of slices (t, u) run: t <= Sa,
 * u <= Sb, t + u <= L <= S + 1. The pairs of one level t + u are one
 * cuBLASLt int8 GEMM of contraction (pairs) x k with exact int32
 * accumulation (a row's slices lie side by side, op(B)'s reversed), where
 * (pairs) x k x 64^2 < 2^31; else one GEMM a pair and contraction chunk
 * (S x kc x 127^2 < 2^31) summed into the level with beta 1. One kernel
 * combines the levels exactly in int64 and scales by 2^(e_i + f_j - 7 L)
 * into float64. Error analysis: docs/gpu.md.
 *
 * The self-check: the sample's exact values (compensated float64 dot
 * products) are computed with the plan's evidence, before the products;
 * cu_ref_settle keeps the fast result only when the sample's error (max
 * relative to sum |a||b| and normwise) is below 1e-3 of the sample's noise
 * floor, and recomputes with DGEMM otherwise (said under --verbose).
 *
 * cuBLASLt layout (column-major, "TN", what its IMMA kernels require): the
 * row-major product C[m, n] is computed as the column-major D[np, mp] =
 * Bs^T As, Bs the slices of op(B) (column j's slices' digits contiguous,
 * leading dimension S kp), As those of op(A) likewise; m, n, k padded with
 * zeros to multiples of 16 (every pointer and leading dimension 16-byte
 * aligned). */
#include <cublasLt.h>
#include <cublas_v2.h>
#include <cuda_runtime.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend/cuda/cuda_priv.h"

#define OZ_GATE 1e-3 /* the fast result is kept below this fraction of the noise floor */

static int64_t up16(int64_t v) { return (v + 15) & ~(int64_t)15; }
static size_t up256(size_t v) { return (v + 255) & ~(size_t)255; }

/* Bytes of the Ozaki buffer for padded sizes mp, np, kp and S slices. */
static size_t oz_bytes(int64_t mp, int64_t np, int64_t kp, int S) {
  return up256((size_t)S * (size_t)(mp * kp)) + up256((size_t)S * (size_t)(np * kp)) + up256((size_t)S * (size_t)(mp * np) * 4) +
         up256((size_t)mp * 4) + up256((size_t)np * 4);
}

/* cuda_priv.h: the fast reference's plans and buffers released (at close). */
int cu_oz_free(cu *c, int rc) {
  for (int i = 0; i < CU_OZ_PLANS; i++) rc = cu_plan_free(c, rc, &c->oz.plans[i]);
  rc = cu_keep(c, rc, cudaFree(c->oz.buf[0]), "cudaFree (fast reference)");
  rc = cu_keep(c, rc, cudaFree(c->oz.buf[1]), "cudaFree (fast reference)");
  rc = cu_keep(c, rc, cudaFree(c->oz.dev), "cudaFree (fast reference's self-check)");
  if (c->oz.host) rc = cu_keep(c, rc, cudaFreeHost(c->oz.host), "cudaFreeHost (fast reference's self-check)");
  for (int s = 0; s < 2; s++)
    if (c->oz.plan_ev[s]) rc = cu_keep(c, rc, cudaEventDestroy(c->oz.plan_ev[s]), "cudaEventDestroy (fast reference)");
  memset(&c->oz, 0, sizeof c->oz);
  return rc;
}

/* The small fixed buffers: check results and flags (device and pinned),
 * scratch, the plans' evidence and their events. Device doubles: [0, 8) the
 * results, [8, 10) the flags, then 4 CU_OZ_NS of check scratch per slot, then
 * CU_OZ_NS x QK_OZ_PLAN_W of evidence per slot; pinned: the first 10, then the
 * evidence. */
#define OZ_DEV_DOUBLES (10 + 8 * CU_OZ_NS + 2 * CU_OZ_NS * QK_OZ_PLAN_W)
int cu_oz_small(cu *c) {
  int rc = QC_OK;
  if (c->oz.dev) return QC_OK;
  if ((rc = cu_dalloc(c, OZ_DEV_DOUBLES * sizeof(double), "the fast reference's self-check", &c->oz.dev))) return rc;
  CK(cudaMallocHost((void **)&c->oz.host, (10 + 2 * CU_OZ_NS * QK_OZ_PLAN_W) * sizeof(double)), "pinned self-check results");
  for (int s = 0; s < 2; s++) CK(cudaEventCreateWithFlags(&c->oz.plan_ev[s], cudaEventDisableTiming), "event (fast reference)");
done:
  return rc;
}
double *cu_oz_res(cu *c, int slot) { return (double *)c->oz.dev + 4 * slot; }
unsigned *cu_oz_flag(cu *c, int slot) { return (unsigned *)((double *)c->oz.dev + 8) + slot; }
double *cu_oz_scratch(cu *c, int slot) { return (double *)c->oz.dev + 10 + 4 * CU_OZ_NS * slot; /* after the results and the flags' 16 bytes */ }
static double *oz_ev_dev(cu *c, int slot) { return (double *)c->oz.dev + 10 + 8 * CU_OZ_NS + (size_t)CU_OZ_NS * QK_OZ_PLAN_W * slot; }
static double *oz_ev_host(cu *c, int slot) { return c->oz.host + 10 + (size_t)CU_OZ_NS * QK_OZ_PLAN_W * slot; }

/* The cached int8 plan for padded mp x np, contraction chunk kc, row pitch
 * kp (gemm.cu's cu_oz_plan_make), or a new one in place of the oldest. */
static int oz_plan(cu *c, int64_t mp, int64_t np, int64_t kc, int64_t kp, struct cu::cu_oz::oz_plan **out) {
  int rc = QC_OK;
  struct cu::cu_oz::oz_plan *p;
  for (int i = 0; i < CU_OZ_PLANS; i++) {
    p = &c->oz.plans[i];
    if (p->used && p->mp == mp && p->np == np && p->kc == kc && p->kp == kp) {
      *out = p;
      return QC_OK;
    }
  }
  p = &c->oz.plans[c->oz.next_plan];
  c->oz.next_plan = (c->oz.next_plan + 1) % CU_OZ_PLANS;
  if ((rc = cu_plan_free(c, QC_OK, p))) return rc; /* evict the oldest */
  if ((rc = cu_oz_plan_make(c, mp, np, kc, kp, p))) return rc;
  *out = p;
  return QC_OK;
}

/* The largest contraction chunk whose int32 sums cannot overflow (the cost model's, backend/refcost.h). */
static int64_t oz_chunk(int S) { return qc_refcost_chunk(S); }

typedef struct cu::cu_oz::oz_pend oz_pend;

/* The record p of one fast GEMM, C = op(A) op(B) (cu_dgemm_dev's
 * convention) with `slices` slices on stream st (h: the cuBLAS handle bound
 * to st for the settle's DGEMM, NULL where none runs): zeroed, then every
 * argument stored, nothing else (the layout, plan, ran, nonfinite and used
 * stay 0 for oz_prep and the caller). Both paths fill it here, so what
 * oz_prep, oz_products, oz_check and the settle read is set one way. */
static void oz_pend_set(oz_pend *p, cudaStream_t st, cublasHandle_t h, qc_op ta, qc_op tb, int64_t m, int64_t n, int64_t k,
                        const double *A, int64_t lda, const double *B, int64_t ldb, double *Cm, int64_t ldc, int slices) {
  memset(p, 0, sizeof *p);
  p->st = st; p->h = h;
  p->ta = ta; p->tb = tb; p->m = m; p->n = n; p->k = k;
  p->A = A; p->lda = lda; p->B = B; p->ldb = ldb; p->C = Cm; p->ldc = ldc;
  p->S = slices;
}

/* op(A)'s panel strides (rows i, contraction l) and op(B)'s (columns j). */
static void oz_strides(const oz_pend *p, int64_t *asr, int64_t *asl, int64_t *bsr, int64_t *bsl) {
  *asr = p->ta == QC_OP_N ? p->lda : 1;
  *asl = p->ta == QC_OP_N ? 1 : p->lda;
  *bsr = p->tb == QC_OP_N ? 1 : p->ldb;
  *bsl = p->tb == QC_OP_N ? p->ldb : 1;
}

/* The first half of the fast GEMM p (its operands, shape and S set): slot's
 * buffer grown to fit, both operands split into S int8 slices on st (the
 * layout into p), flag zeroed first and set on a non-finite operand. QC_OK;
 * QC_EINPUT when the memory is not there (the caller takes DGEMM). */
static int oz_prep(cu *c, int slot, cudaStream_t st, oz_pend *p, unsigned *fl) {
  int rc = QC_OK;
  const int S = p->S;
  const int64_t mp = up16(p->m), np = up16(p->n), kp = up16(p->k);
  int64_t asr, asl, bsr, bsl;
  oz_strides(p, &asr, &asl, &bsr, &bsl);
  if (S < QC_REF_SLICES_MIN || S > QC_REF_SLICES_MAX || S > QK_OZ_SMAX)
    return qc_err("%s: the fast reference takes %d to %d slices, not %d", c->name, QC_REF_SLICES_MIN, QC_REF_SLICES_MAX, S);
  if (slot < 0 || slot > 1) return qc_err_sys("%s: fast reference slot %d out of range", c->name, slot);
  {
    size_t need = oz_bytes(mp, np, kp, S) + WS_BYTES;
    if (c->oz.bytes[slot] < need) {
      cudaError_t e = cudaFree(c->oz.buf[slot]); /* waits for the work queued on it */
      c->oz.buf[slot] = NULL;
      c->oz.bytes[slot] = 0;
      if (e != cudaSuccess) return cu_fail(c, "cudaFree (the fast reference's smaller buffer)", e);
      if ((rc = cu_dalloc(c, need, "the fast reference's slices and int32 products", &c->oz.buf[slot]))) return rc;
      c->oz.bytes[slot] = need;
    }
  }
  {
    char *q = (char *)c->oz.buf[slot];
    p->ws = q + oz_bytes(mp, np, kp, S);
    p->as = (int8_t *)q;
    q += up256((size_t)S * (size_t)(mp * kp));
    p->bs = (int8_t *)q;
    q += up256((size_t)S * (size_t)(np * kp));
    p->T = (int32_t *)q;
    q += up256((size_t)S * (size_t)(mp * np) * 4);
    p->ea = (int *)q;
    q += up256((size_t)mp * 4);
    p->eb = (int *)q;
    p->mp = mp; p->np = np; p->kp = kp;
  }
  CK(cudaMemsetAsync(fl, 0, sizeof *fl, st), "zero the non-finite flag");
  /* a row's S slices side by side (row pitch S kp), op(B)'s in reverse: the pairs of a level are then one
   * contiguous run of each operand's slices (oz_products) */
  CK((cudaError_t)qk_oz_split(p->A, p->m, p->k, asr, asl, S, p->ea, fl, p->as, mp, kp, S * kp, kp, 0, st),
     "split op(A) into int8 slices");
  CK((cudaError_t)qk_oz_split(p->B, p->n, p->k, bsr, bsl, S, p->eb, fl, p->bs, np, kp, S * kp, kp, 1, st),
     "split op(B) into int8 slices");
done:
  return rc;
}

/* The second half: the int8 products of plan (Sa, Sb, L) of the split p
 * into the int32 product of each level L' <= L (the pairs t + u = L', t <=
 * Sa, u <= Sb), then the exact combine into p->C, on st. The slices lie
 * side by side in each row (oz_prep), op(B)'s reversed, so a level's pairs
 * t = t0..t1 are op(A)'s slices t0..t1 against op(B)'s L' - t0 down to L' -
 * t1, both one contiguous run: one int8 GEMM of contraction (t1 - t0 + 1) kp
 * per level, written once, where its int32 sum cannot overflow ((pairs) kp
 * 64^2 < 2^31; digits are at most 64). Else a GEMM per pair and per
 * contraction chunk, summed into the level with beta 1, as before. */
static int oz_products(cu *c, cudaStream_t st, const oz_pend *p, int Sa, int Sb, int L) {
  int rc = QC_OK;
  const int32_t one = 1, zero = 0;
  const int S = p->S;
  const int64_t mp = p->mp, np = p->np, kp = p->kp, ld = S * kp, kmax = oz_chunk(S);
  const int top = L < Sa + Sb ? L : Sa + Sb; /* every level 2..top holds a pair */
  const int most = Sa < Sb ? (Sa < top - 1 ? Sa : top - 1) : (Sb < top - 1 ? Sb : top - 1); /* pairs of the fullest level */
  const int whole = qc_refcost_whole(most, kp); /* the cost model prices the same choice */
  for (int64_t k0 = 0; k0 < kp; k0 += whole ? kp : kmax) {
    const int64_t kc = whole ? kp : kp - k0 < kmax ? kp - k0 : kmax;
    for (int lv = 2; lv <= top; lv++) {
      int32_t *TL = p->T + (int64_t)(lv - 2) * mp * np;
      const int t0 = lv - Sb > 1 ? lv - Sb : 1, t1 = Sa < lv - 1 ? Sa : lv - 1; /* t0 <= t1: lv <= Sa + Sb */
      for (int t = t0; t <= t1; t += whole ? t1 - t0 + 1 : 1) {
        const int np_ = whole ? t1 - t0 + 1 : 1; /* the pairs in this GEMM */
        struct cu::cu_oz::oz_plan *pl = NULL;
        if ((rc = oz_plan(c, mp, np, np_ * kc, ld, &pl))) return rc;
        const int8_t *at = p->as + (int64_t)(t - 1) * kp + k0, *bu = p->bs + (int64_t)(S - (lv - t)) * kp + k0;
        BK(cublasLtMatmul(c->lt, pl->op, &one, bu, pl->la, at, pl->lb, t == t0 ? &zero : &one, TL, pl->ld, TL, pl->ld,
                          &pl->algo, p->ws, WS_BYTES, st),
           "cublasLtMatmul (int8 slices)");
      }
    }
    /* the combine's levels 2..top are ours: its "S" is top - 1 */
    CK((cudaError_t)qk_oz_combine(p->T, mp * np, top - 1, p->m, p->n, np, p->ea, p->eb, p->C, p->ldc, k0 > 0, st),
       "combine the int32 products");
  }
done:
  return rc;
}

/* The self-check of p's result on st into res (4 device doubles). */
static int oz_check(cu *c, int slot, cudaStream_t st, const oz_pend *p, double *res) {
  int rc = QC_OK;
  int64_t asr, asl, bsr, bsl;
  oz_strides(p, &asr, &asl, &bsr, &bsl);
  CK((cudaError_t)qk_oz_check(p->A, asr, asl, p->B, bsl, bsr, p->C, p->ldc, p->m, p->n, p->k, CU_OZ_NS, cu_oz_scratch(c, slot), res, st),
     "the fast reference's self-check");
done:
  return rc;
}

/* The Ozaki scheme's fast GEMM alone, every pair of the S slices (the
 * benchmark's and the GPU test's hook; cu_ref_gemm plans its pairs; res: 4
 * device doubles for the self-check, or NULL; flag: a device word set
 * non-zero on a non-finite operand, or NULL). */
int cu_ozaki_gemm(cu *c, int slot, cudaStream_t st, qc_op ta, qc_op tb, int64_t m, int64_t n, int64_t k, const double *A,
                         int64_t lda, const double *B, int64_t ldb, double *Cm, int64_t ldc, int slices, double *res,
                         unsigned *flag) {
  int rc = QC_OK;
  oz_pend p;
  oz_pend_set(&p, st, NULL, ta, tb, m, n, k, A, lda, B, ldb, Cm, ldc, slices);
  if (m == 0 || n == 0) return QC_OK;
  if (k == 0) {
    for (int64_t i = 0; i < m; i++) CK(cudaMemsetAsync(Cm + i * ldc, 0, (size_t)n * 8, st), "zero GEMM output");
    if (res) CK(cudaMemsetAsync(res, 0, 4 * sizeof *res, st), "zero self-check");
    return QC_OK;
  }
  if ((rc = cu_oz_small(c)) || (rc = oz_prep(c, slot, st, &p, flag ? flag : cu_oz_flag(c, slot))) ||
      (rc = oz_products(c, st, &p, slices, slices, slices + 1)))
    return rc;
  if (res) rc = oz_check(c, slot, st, &p, res);
done:
  return rc;
}

int cu_ref_gemm(cu *c, int slices, int slot, cudaStream_t st, cublasHandle_t h, qc_op ta, qc_op tb, int64_t m, int64_t n,
                int64_t k, const double *A, int64_t lda, const double *B, int64_t ldb, double *Cm, int64_t ldc) {
  int rc = QC_OK;
  if (slot < 0 || slot > 1) return qc_err_sys("%s: reference slot %d out of range", c->name, slot);
  c->oz.pend[slot].used = 0;
  if (slot == 1) c->oz.pend[0].used = 0; /* an audit's first: nothing of an earlier one is pending */
  if (slices == QC_REF_AUTO) slices = cu_ref_auto(c, slot, m, n, k); /* the cost model's pick (refprobe.cu) */
  if (slices <= 0 || m == 0 || n == 0 || k == 0) return cu_dgemm_dev_h(c, h, ta, tb, m, n, k, A, lda, B, ldb, Cm, ldc);
  oz_pend *p = &c->oz.pend[slot];
  oz_pend_set(p, st, h, ta, tb, m, n, k, A, lda, B, ldb, Cm, ldc, slices);
  if ((rc = cu_oz_small(c))) return rc;
  rc = oz_prep(c, slot, st, p, cu_oz_flag(c, slot));
  if (rc == QC_EINPUT) {
    /* no memory for the slices: the float64 reference, said so */
    if (qc_verbose) fprintf(stderr, "qatcheck: %s: the fast reference cannot run (%s): float64 DGEMM instead\n", c->name, qc_err_msg());
    qc_err_clear();
    memset(p, 0, sizeof *p);
    return cu_dgemm_dev_h(c, h, ta, tb, m, n, k, A, lda, B, ldb, Cm, ldc);
  }
  if (rc) return rc;
  /* the plan's evidence on the self-check's sample, and the split's flag, downloaded for cu_ref_run */
  {
    int64_t asr, asl, bsr, bsl;
    oz_strides(p, &asr, &asl, &bsr, &bsl);
    const int nuse = m * n < CU_OZ_NS ? (int)(m * n) : CU_OZ_NS;
    CK((cudaError_t)qk_oz_plan(p->as, slices * p->kp, p->kp, p->bs + (int64_t)(slices - 1) * p->kp, slices * p->kp, -p->kp,
                               slices, p->ea, p->eb, A, asr, asl, B, bsl, bsr, m, n, k, CU_OZ_NS, oz_ev_dev(c, slot), st),
       "the fast reference's plan");
    CK(cudaMemcpyAsync(oz_ev_host(c, slot), oz_ev_dev(c, slot), (size_t)nuse * QK_OZ_PLAN_W * sizeof(double),
                       cudaMemcpyDeviceToHost, st),
       "download the plan's evidence");
    CK(cudaMemcpyAsync((unsigned *)(c->oz.host + 8) + slot, cu_oz_flag(c, slot), sizeof(unsigned), cudaMemcpyDeviceToHost, st),
       "download the non-finite flag");
    CK(cudaEventRecord(c->oz.plan_ev[slot], st), "event (fast reference)");
  }
  p->used = 1;
done:
  return rc;
}

/* The second half of cu_ref_gemm's fast path (cu_ref_settle calls it): for
 * each slot queued, d_weight's first, waits for its plan's evidence,
 * chooses its pairs (backend/ozplan.h) and queues the int8 products, the
 * combine and the self-check, or DGEMM where no plan meets the gate. */
static int cu_ref_run(cu *c) {
  int rc = QC_OK;
  for (int s = 1; s >= 0; s--) {
    oz_pend *p = &c->oz.pend[s];
    if (!p->used || p->ran) continue;
    CK(cudaEventSynchronize(c->oz.plan_ev[s]), "the fast reference's plan");
    p->nonfinite = ((const unsigned *)(c->oz.host + 8))[s];
    const int nuse = p->m * p->n < CU_OZ_NS ? (int)(p->m * p->n) : CU_OZ_NS;
    if (p->nonfinite) {
      memset(&p->plan, 0, sizeof p->plan);
      p->plan.err = p->plan.err_norm = NAN;
    } else {
      qc_ozplan_choose(oz_ev_host(c, s), nuse, p->S, &p->plan);
    }
    p->ran = 1;
    if (p->plan.L > 0) {
      if ((rc = oz_products(c, p->st, p, p->plan.Sa, p->plan.Sb, p->plan.L))) goto done;
      /* the self-check on the plan's sample, its exact values the evidence's (computed once) */
      CK((cudaError_t)qk_oz_check_ev(oz_ev_dev(c, s), p->C, p->ldc, p->m, p->n, CU_OZ_NS, cu_oz_scratch(c, s), cu_oz_res(c, s), p->st),
         "the fast reference's self-check");
    } else if ((rc = cu_dgemm_dev_h(c, p->h, p->ta, p->tb, p->m, p->n, p->k, p->A, p->lda, p->B, p->ldb, p->C, p->ldc))) {
      goto done;
    }
  }
done:
  return rc;
}

int cu_ref_settle(cu *c, qc_linear_audit_out *o) {
  int rc = QC_OK;
  const char *names[2] = {"d_x", "d_weight"};
  if (o)
    for (int s = 0; s < 2; s++)
      o->ref_ran[s] = o->ref_fast[s] = o->ref_pairs[s] = 0, o->ref_err[s] = o->ref_err_norm[s] = o->ref_gate[s] = 0;
  if (!c->oz.pend[0].used && !c->oz.pend[1].used) return QC_OK;
  double *h = c->oz.host;
  int fell = 0;
  if ((rc = cu_ref_run(c))) goto done;
  for (int s = 0; s < 2; s++)
    if (c->oz.pend[s].used) CK(cudaStreamSynchronize(c->oz.pend[s].st), "the fast reference");
  CK(cudaMemcpyAsync(h, c->oz.dev, 8 * sizeof(double) + 2 * sizeof(unsigned), cudaMemcpyDeviceToHost, c->st),
     "download the self-check");
  CK(cudaStreamSynchronize(c->st), "the fast reference's self-check");
  for (int s = 0; s < 2; s++) {
    oz_pend *p = &c->oz.pend[s];
    if (!p->used) continue;
    const int ns = p->m * p->n < CU_OZ_NS ? (int)(p->m * p->n) : CU_OZ_NS;
    if (p->plan.L == 0) { /* no plan met the gate on the sample (or a non-finite operand): DGEMM ran instead */
      if (o) {
        o->ref_ran[s] = p->S;
        o->ref_err[s] = p->plan.err;
        o->ref_err_norm[s] = p->plan.err_norm;
        o->ref_gate[s] = p->plan.gate;
      }
      if (qc_verbose)
      {
        if (p->nonfinite)
          fprintf(stderr, "qatcheck: %s: fast reference %s: a non-finite operand: float64 DGEMM instead\n", c->name, names[s]);
        else if (p->plan.pairs == 0)
          fprintf(stderr, "qatcheck: %s: fast reference %s: no memory to predict its plan: float64 DGEMM instead\n", c->name,
                  names[s]);
        else
          fprintf(stderr,
                  "qatcheck: %s: fast reference %s: on the self-check's %d elements even all %d slice products would miss the "
                  "gate (predicted max error %.3g of sum |a||b|, normwise %.3g, bound %.3g): float64 DGEMM instead\n",
                  c->name, names[s], ns, p->plan.pairs, p->plan.err, p->plan.err_norm, p->plan.gate);
      }
      continue;
    }
    const double *r = h + 4 * s;
    const unsigned fl = ((const unsigned *)(h + 8))[s];
    const double nrm = fmax(sqrt(r[2]), QC_EPS_NORM);
    const double err_norm = sqrt(r[1]) / nrm, gate = OZ_GATE * (sqrt(r[3]) / nrm);
    const int keep = !fl && r[0] <= gate && err_norm <= gate; /* a NaN fails both */
    if (o) {
      o->ref_ran[s] = p->S;
      o->ref_fast[s] = keep;
      o->ref_pairs[s] = keep ? p->plan.pairs : 0;
      o->ref_err[s] = r[0];
      o->ref_err_norm[s] = err_norm;
      o->ref_gate[s] = gate;
    }
    if (qc_verbose)
      fprintf(stderr,
              "qatcheck: %s: fast reference %s: %d of the %d slice products (digits %d x %d, levels <= %d, chosen on the "
              "sample: predicted max error %.3g, normwise %.3g); self-check on %d elements: max error %.3g of sum |a||b|, "
              "normwise %.3g, bound %.3g (1e-3 x the noise floor)%s\n",
              c->name, names[s], p->plan.pairs, p->S * (p->S + 1) / 2, p->plan.Sa, p->plan.Sb, p->plan.L, p->plan.err,
              p->plan.err_norm, ns, r[0], err_norm, gate, keep ? ": kept" : ": recomputed with float64 DGEMM");
    if (!keep && (rc = cu_dgemm_dev_h(c, p->h, p->ta, p->tb, p->m, p->n, p->k, p->A, p->lda, p->B, p->ldb, p->C, p->ldc)))
      goto done;
    if (!keep) fell |= 1 << s;
  }
  /* a fallback ran after the events the audit recorded on its stream: wait for it here */
  for (int s = 0; s < 2; s++)
    if (fell >> s & 1) CK(cudaStreamSynchronize(c->oz.pend[s].st), "the float64 reference");
done:
  c->oz.pend[0].used = c->oz.pend[1].used = 0;
  return rc;
}
