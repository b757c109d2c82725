/* registry.c: the class table. One row per module class: the class (its
 * production VJP, keys and generator, src/modules/) and its independent
 * reference (src/reference/). Adding a class adds one row here. */
#include <string.h>

#include "module.h"

extern const qc_class qc_class_linear;
int qc_ref_linear(const qc_ctx *, const qc_module *, const qc_tensor *, qc_tset *);

static const qc_registry_row g_rows[] = {
    {&qc_class_linear, qc_ref_linear},
};

const qc_registry_row *qc_registry_rows(int *n) {
  *n = (int)(sizeof g_rows / sizeof g_rows[0]);
  return g_rows;
}

const qc_registry_row *qc_registry_find(const char *name) {
  int n;
  const qc_registry_row *r = qc_registry_rows(&n);
  for (int i = 0; i < n; i++)
    if (strcmp(r[i].cls->name, name) == 0) return &r[i];
  return NULL;
}
