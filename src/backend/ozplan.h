/* ozplan.h: which int8 slice products the fast reference (the Ozaki scheme,
 * src/backend/cuda/ozaki.cu; docs/gpu.md "The fast reference") runs for
 * one GEMM, chosen from its self-check's sample before the products run.
 *
 * With S digit slices of each operand, the product of slices t of op(A) and
 * u of op(B) weighs 2^(-7 (t + u)); the full scheme runs every pair with t +
 * u <= S + 1. A plan (Sa, Sb, L) runs the pairs t <= Sa, u <= Sb, t + u <= L:
 * an operand whose low digits add nothing the gate can see (a bf16 dY, an
 * fp8 weight) costs fewer int8 GEMMs. The device computes, for each sampled
 * element, every pair's exact integer product and the element's exact value
 * (compensated); this module predicts each plan's self-check from them and
 * takes the one of fewest pairs whose predicted errors stay under a quarter
 * of the gate (the self-check, run after, sees the same sample: the quarter
 * is for the elements outside it). Pure C: the unit tests check it on the
 * CPU. */
#ifndef QC_BACKEND_OZPLAN_H
#define QC_BACKEND_OZPLAN_H

#include <stdint.h>

#define QC_OZPLAN_SMAX 5 /* the most slices (QK_OZ_SMAX) */
/* Doubles per sampled element (the device's layout): the products P[t][u]
 * (t, u = 1..QC_OZPLAN_SMAX, row-major, exact integers), then the exact
 * value as hi and lo, sum |a||b|, the scale exponent e_i + f_j (an integer;
 * QC_OZPLAN_ZERO when the row or the column is all zeros) and (bf16(exact) -
 * exact)^2. */
#define QC_OZPLAN_W (QC_OZPLAN_SMAX * QC_OZPLAN_SMAX + 5)
#define QC_OZPLAN_ZERO (-1e300)
#define QC_OZPLAN_GATE 1e-3 /* the self-check's gate: this fraction of the sample's noise floor */
#define QC_OZPLAN_MARGIN 0.25 /* a plan is taken only below this fraction of the gate */

typedef struct qc_ozplan {
  int Sa, Sb, L;   /* the pairs run: t <= Sa, u <= Sb, t + u <= L (L = 0: none fits the gate: DGEMM);
                      Sa, Sb at most L - 1 (the digits the pairs use) */
  int pairs;       /* how many (the full scheme: S (S + 1) / 2) */
  double err;      /* the plan's predicted self-check: max |fast - exact| / sum |a||b| over the sample */
  double err_norm; /* ... and ||fast - exact|| / ||exact|| */
  double gate;     /* the gate both are held to: QC_OZPLAN_GATE x the sample's noise floor */
} qc_ozplan;

/* The pairs of plan (Sa, Sb, L). */
int qc_ozplan_pairs(int Sa, int Sb, int L);
/* The plan for S slices from ns sampled elements (smp: ns x QC_OZPLAN_W,
 * the layout above): of the plans (Sa, Sb, L), 1 <= Sa, Sb <= S, 2 <= L <= min(S
 * + 1, Sa + Sb), the one of fewest pairs (then the smallest predicted error
 * against the gate, then the larger Sa, Sb, L) whose predicted errors are at most
 * QC_OZPLAN_MARGIN of the gate; else the full one (S, S, S + 1) when it
 * meets the gate itself; else L = 0 with the full plan's errors (the
 * self-check would refuse every plan: DGEMM at once). A NaN anywhere, or
 * no memory for the pairs' values (ns x 25 doubles), refuses every plan. */
void qc_ozplan_choose(const double *smp, int ns, int S, qc_ozplan *out);

#endif
