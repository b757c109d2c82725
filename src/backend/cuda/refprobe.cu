/* refprobe.cu: --reference auto (cuda_priv.h cu_ref_probe, cu_ref_auto).
 *
 * The probe, once per backend, before the first audit that asks for auto:
 * on square P x P operands (P = 2048; about 230 MB of device memory, freed
 * at once) it times, each as the fastest of a few batches, a tiny DGEMM
 * (the fixed cost of a call), a P^3 DGEMM (float64 rate), one int8 x int8
 * -> int32 cuBLASLt GEMM of P x P x 4P (int8 rate; the same descriptors as
 * ozaki.cu's), the split of a float64 operand into S int8 slices (its
 * bandwidth), the combine of S int32 levels (the memory-bound bandwidth)
 * and the plan's evidence on the self-check's sample (qk_oz_plan: the exact
 * values and every slice pair's product, per element and unit of k), as
 * the audit runs them (ozaki.cu). A few ms.
 * The rates feed the cost model (backend/refcost.h), which picks, per
 * reference GEMM, the Ozaki scheme with QC_REF_FAST_SLICES slices or DGEMM.
 * The self-check gate (ozaki.cu) is unchanged: a fast result it refuses is
 * recomputed with DGEMM whichever way it was chosen. */
#include <cublasLt.h>
#include <cuda_runtime.h>
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "backend/cuda/cuda_priv.h"

#define PR_P 2048 /* the probe's square size */
#define PR_BATCH 4 /* calls per timed batch */
#define PR_TRIES 3 /* batches; the fastest counts */

static_assert(QC_REF_FAST_SLICES >= 4, "the probe's int8 GEMM reads its P x 4P operands from the slices' buffers");

static size_t up256(size_t v) { return (v + 255) & ~(size_t)255; }

/* The probe's buffers, carved out of one allocation. */
typedef struct pr_bufs {
  double *A, *B, *C;   /* P x P float64 */
  int8_t *as, *bs;     /* S P P int8: slices (the int8 GEMM reads them as P x 4P) */
  int32_t *T;          /* S P P int32 levels */
  int *ea, *eb;        /* P exponents each */
  unsigned *flag;
  double *ev;          /* the plan's evidence: QC_REFCOST_CHECK_NS x QK_OZ_PLAN_W */
  void *ws;            /* the cuBLASLt workspace */
} pr_bufs;

static size_t pr_layout(char *p, pr_bufs *b) {
  const size_t pp = (size_t)PR_P * PR_P, S = QC_REF_FAST_SLICES;
  size_t o = 0;
#define PR_CARVE(field, type, bytes) (b->field = (type)(p ? p + o : NULL), o += up256(bytes))
  PR_CARVE(A, double *, pp * 8);
  PR_CARVE(B, double *, pp * 8);
  PR_CARVE(C, double *, pp * 8);
  PR_CARVE(as, int8_t *, S * pp);
  PR_CARVE(bs, int8_t *, S * pp);
  PR_CARVE(T, int32_t *, S * pp * 4);
  PR_CARVE(ea, int *, PR_P * 4);
  PR_CARVE(eb, int *, PR_P * 4);
  PR_CARVE(flag, unsigned *, 16);
  PR_CARVE(ev, double *, (size_t)QC_REFCOST_CHECK_NS * QK_OZ_PLAN_W * 8);
  PR_CARVE(ws, void *, WS_BYTES);
#undef PR_CARVE
  return o;
}

/* The probe's steps. */
enum { PR_CALL, PR_DGEMM, PR_I8, PR_SPLIT, PR_COMBINE, PR_CHECK, PR_NSTEPS };

/* The timed int8 GEMM's plan: D[P, P] (int32) = Bs^T As, contraction 4P,
 * built by cu_oz_plan_make (gemm.cu), the builder of ozaki.cu's plans (its
 * TN layout, descriptors and heuristic). The probe's own, not one of the
 * audit's cached plans (c->oz.plans): it neither evicts nor adds one, and
 * it is released when the probe ends. */
typedef struct cu::cu_oz::oz_plan pr_i8;

/* Queue step `s` once on c->st. */
static int pr_step(cu *c, int s, const pr_bufs *b, const pr_i8 *g) {
  int rc = QC_OK;
  const int S = QC_REF_FAST_SLICES;
  const int32_t one = 1, zero = 0;
  switch (s) {
    case PR_CALL: return cu_dgemm_dev(c, QC_OP_N, QC_OP_N, 16, 16, 16, b->A, 16, b->B, 16, b->C, 16);
    case PR_DGEMM: return cu_dgemm_dev(c, QC_OP_N, QC_OP_N, PR_P, PR_P, PR_P, b->A, PR_P, b->B, PR_P, b->C, PR_P);
    case PR_I8:
      BK(cublasLtMatmul(c->lt, g->op, &one, b->bs, g->la, b->as, g->lb, &zero, b->T, g->ld, b->T, g->ld, &g->algo, b->ws,
                        WS_BYTES, c->st),
         "cublasLtMatmul (probe)");
      break;
    case PR_SPLIT:
      CK((cudaError_t)qk_oz_split(b->A, PR_P, PR_P, PR_P, 1, S, b->ea, b->flag, b->as, PR_P, PR_P, PR_P, (int64_t)PR_P * PR_P, 0, c->st), "probe split");
      break;
    case PR_COMBINE:
      CK((cudaError_t)qk_oz_combine(b->T, (int64_t)PR_P * PR_P, S, PR_P, PR_P, PR_P, b->ea, b->eb, b->C, PR_P, 0, c->st),
         "probe combine");
      break;
    case PR_CHECK:
      /* the slices laid out as ozaki.cu's: row i's slice t at as + i S P + t P, op(B)'s reversed */
      CK((cudaError_t)qk_oz_plan(b->as, S * (int64_t)PR_P, PR_P, b->bs + (int64_t)(S - 1) * PR_P, S * (int64_t)PR_P,
                                 -(int64_t)PR_P, S, b->ea, b->eb, b->A, PR_P, 1, b->B, PR_P, 1, PR_P, PR_P, PR_P,
                                 QC_REFCOST_CHECK_NS, b->ev, c->st),
         "probe plan evidence");
      break;
  }
done:
  return rc;
}

/* Seconds of one call of step s: a warm-up, then the fastest of PR_TRIES batches. */
static int pr_time(cu *c, int s, const pr_bufs *b, const pr_i8 *g, double *sec) {
  int rc = pr_step(c, s, b, g);
  double best = INFINITY;
  for (int t = 0; !rc && t < PR_TRIES; t++) {
    float ms = 0;
    CK(cudaEventRecord(c->ev[0], c->st), "event");
    for (int i = 0; !rc && i < PR_BATCH; i++) rc = pr_step(c, s, b, g);
    if (rc) break;
    CK(cudaEventRecord(c->ev[1], c->st), "event");
    CK(cudaEventSynchronize(c->ev[1]), "the probe");
    CK(cudaEventElapsedTime(&ms, c->ev[0], c->ev[1]), "event timing");
    if (ms / PR_BATCH < best) best = ms / PR_BATCH;
  }
  *sec = best * 1e-3;
done:
  return rc;
}

/* The rates from the steps' times (a step's own fixed cost taken out; the
 * int8 GEMM's int32 write too, which the cost model adds after its max). */
static void pr_rates(const double *t, qc_refcost_rates *r) {
  const double P = PR_P, pp = P * P, S = QC_REF_FAST_SLICES, call = t[PR_CALL];
  double e[PR_NSTEPS];
  for (int s = 0; s < PR_NSTEPS; s++) e[s] = fmax(t[s] - call, 0.5 * t[s]);
  r->call_s = call;
  r->dgemm_flops = 2 * pp * P / e[PR_DGEMM];
  r->split_bw = pp * (8 + S) / e[PR_SPLIT];
  r->bw = pp * (4 * S + 8) / e[PR_COMBINE];
  r->i8_ops = 2 * pp * 4 * P / fmax(e[PR_I8] - 4 * pp / r->bw, 0.5 * e[PR_I8]);
  r->check_s = e[PR_CHECK] / (QC_REFCOST_CHECK_NS * P);
}

int cu_ref_probe(cu *c) {
  int rc = QC_OK;
  char *p = NULL;
  pr_bufs b;
  pr_i8 g;
  double t[PR_NSTEPS], t0 = qc_now_s();
  memset(&g, 0, sizeof g);
  qc_err_state es; /* the probe is speculative: its failure is an answer (auto keeps DGEMM) */
  if (c->ra.probed) return QC_OK;
  qc_err_save(&es);
  c->ra.probed = 1;
  c->ra.ok = 0;
  const size_t need = pr_layout(NULL, &b);
  if ((rc = cu_dalloc(c, need, "the --reference auto probe", (void **)&p))) goto done;
  pr_layout(p, &b);
  /* finite operands, every element the same (0x3f bytes: 4.8e-4): the times do not depend on the values */
  CK(cudaMemsetAsync(p, 0x3f, (size_t)((char *)b.as - p), c->st), "probe operands");
  CK(cudaMemsetAsync(b.as, 0x11, (size_t)((char *)b.T - (char *)b.as), c->st), "probe slices");
  CK(cudaMemsetAsync(b.T, 0, (size_t)((char *)b.flag - (char *)b.T), c->st), "probe products");
  CK(cudaMemsetAsync(b.flag, 0, 16, c->st), "probe flag");
  if ((rc = cu_oz_plan_make(c, PR_P, PR_P, 4 * (int64_t)PR_P, 4 * (int64_t)PR_P, &g))) goto done; /* the operands as P x 4P */
  for (int s = 0; s < PR_NSTEPS && !rc; s++) rc = pr_time(c, s, &b, &g, &t[s]);
  if (rc) goto done;
  pr_rates(t, &c->ra.r);
  c->ra.ok = qc_refcost_ok(&c->ra.r);
  if (qc_verbose)
    fprintf(stderr,
            "qatcheck: %s: --reference auto: probed DGEMM %.1f TFLOP/s, int8 %.0f TOP/s, split %.0f GB/s, memory %.0f GB/s, "
            "a call %.1f us, plan evidence %.3g ns per element and k (%.1f ms)\n",
            c->name, c->ra.r.dgemm_flops * 1e-12, c->ra.r.i8_ops * 1e-12, c->ra.r.split_bw * 1e-9, c->ra.r.bw * 1e-9,
            c->ra.r.call_s * 1e6, c->ra.r.check_s * 1e9, (qc_now_s() - t0) * 1e3);
done:
  rc = cu_plan_free(c, rc, &g); /* the plan caches' one teardown (its descriptors op, la, lb, ld) */
  if (p) rc = cu_keep(c, rc, cudaFree(p), "cudaFree (the --reference auto probe)");
  if (rc == QC_EINPUT) { /* no memory for it, or no int8 algorithm: auto keeps DGEMM, said so */
    if (qc_verbose) fprintf(stderr, "qatcheck: %s: --reference auto: the probe cannot run (%s): float64 DGEMM\n", c->name, qc_err_msg());
    (void)cudaGetLastError(); /* a failed allocation's status is not left for the next launch to report */
    qc_err_restore(&es);
    return QC_OK;
  }
  if (rc) qc_err_keep(&es);
  else qc_err_restore(&es);
  return rc;
}

int cu_ref_auto(cu *c, int slot, int64_t m, int64_t n, int64_t k) {
  double td = NAN, tf = NAN;
  const int S = c->ra.ok ? qc_refcost_pick(&c->ra.r, m, n, k, QC_REF_FAST_SLICES, &td, &tf) : 0;
  if (qc_verbose)
    fprintf(stderr, "qatcheck: %s: --reference auto: %s [%lld x %lld, k %lld]: predicted DGEMM %.3f ms, Ozaki int8 (%d slices) "
            "%.3f ms: %s\n",
            c->name, slot ? "d_weight" : "d_x", (long long)m, (long long)n, (long long)k, td * 1e3, QC_REF_FAST_SLICES,
            tf * 1e3, S ? "the fast reference" : "float64 DGEMM");
  return S;
}
