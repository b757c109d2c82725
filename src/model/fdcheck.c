/* fdcheck.c: see fdcheck.h. */
#include "model/fdcheck.h"

#include <math.h>

double qc_fd_rel_err(const qc_fd_row *r) {
  double d = fabs(r->vjp - r->jvp);
  return r->scale > 0 ? d / r->scale : d > 0 ? INFINITY : 0;
}
