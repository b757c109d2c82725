/* colsum.c: the column clusters' sums of a pass in row pieces (see
 * metrics.h, qc_col_sums), shared by the bias pass and the compare pass. */
#include "numerics/metrics.h"

#include "core/par.h"

/* Columns [lo, hi) of ctx's pieces' sums added into piece 0's, in piece
 * order. */
typedef struct colsum_ctx {
  double *ct;
  int64_t np, w; /* pieces, doubles a piece (2 cols) */
} colsum_ctx;

static void colsum_part(void *p, int64_t lo, int64_t hi, int tid) {
  (void)tid;
  const colsum_ctx *x = p;
  const int64_t j0 = lo * 4096, j1 = hi * 4096 < x->w ? hi * 4096 : x->w;
  for (int64_t k = 1; k < x->np; k++) {
    const double *q = x->ct + k * x->w;
    for (int64_t j = j0; j < j1; j++) x->ct[j] += q[j];
  }
}

void qc_col_sums(double *ct, int64_t np, int64_t cols, qc_bias_sums *s) {
  colsum_ctx x = {ct, np, 2 * cols};
  if (np > 1) qc_par_for((x.w + 4095) / 4096, 1, colsum_part, &x);
  for (int64_t j = 0; j < cols; j++) {
    const double t = ct[2 * j], c = ct[2 * j + 1];
    s->col_tt += t * t;
    s->col_tc += t * c;
    s->col_cc += c * c;
  }
}
