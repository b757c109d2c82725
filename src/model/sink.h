/* sink.h: a gradient that a reference hands over in blocks of rows instead
 * of holding it whole (a MoE's d_w1 at 256 experts is 60 GB of float64).
 *
 * The engine (engine/audit.c) offers the sink through qc_ctx.sink for the
 * contract's reference of one (module, dY); a reference that streams asks
 * `begin` for each large gradient it makes: 1, and it gives that gradient's
 * rows through `rows` (the [rows, cols] view, cols its last dimension) in
 * increasing order, every row once, and returns it in its set as a tensor
 * with the shape and no data (qc_tset's tensor with data NULL); 0, and it
 * makes the gradient whole as without a sink. What the engine does with
 * the rows (compare each block as it comes, numerics/metrics.h
 * qc_cmp_rows) gives the metrics of the whole tensor bit for bit. */
#ifndef QC_SINK_H
#define QC_SINK_H

#include <stdint.h>

typedef struct qc_grad_sink {
  /* 1: the engine takes gradient `grad` (shaped ndim, shape) in blocks; 0:
   * the reference makes it whole. Never an error: an offer refused. */
  int (*begin)(const struct qc_grad_sink *s, const char *grad, int ndim, const int64_t *shape);
  /* rows [r0, r1) of `grad`'s view, blk [(r1 - r0) cols] float64. A status
   * (the reference stops and returns it). */
  int (*rows)(const struct qc_grad_sink *s, const char *grad, int64_t r0, int64_t r1, const double *blk);
  void *arg;
} qc_grad_sink;

#endif
