/* fdcheck.h: what a finite-difference cross-check (engine/fd.h) judges:
 * its settings and one row per (gradient tensor, direction). */
#ifndef QC_FDCHECK_H
#define QC_FDCHECK_H

#include <stdint.h>

#include "core/tensor.h"

typedef struct qc_fd_opts {
  uint64_t seed;     /* directions u, v */
  int directions;    /* per tensor (default 3) */
  double h;          /* step (default 1e-3; inputs are O(1)) */
  double tol;        /* relative tolerance (default 1e-6) */
} qc_fd_opts;

/* One comparison: one gradient tensor, one direction. */
typedef struct qc_fd_row {
  char tensor[QC_NAMELEN];  /* "d_x" */
  int dir;
  double vjp;               /* <u, J^T v> from the VJP */
  double jvp;               /* <J u, v> from the differences */
  double scale;             /* ||u|| ||J^T v||: |vjp - jvp| / scale is the relative error */
  double bound;             /* allowed |vjp - jvp|: tol * scale + 1e-12 sum |y v| */
  int pass;
} qc_fd_row;

/* |vjp - jvp| relative to the row's scale (INFINITY when the scale is 0 and
 * they differ). */
double qc_fd_rel_err(const qc_fd_row *r);

#endif
