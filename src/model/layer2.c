/* layer2.c: layer 2's result list (see layer2.h). */
#include "model/layer2.h"

#include <stdlib.h>
#include <string.h>

void qc_sweep_free(qc_sweep *s) {
  free(s->rows);
  free(s->cls);
  memset(s, 0, sizeof *s);
}
