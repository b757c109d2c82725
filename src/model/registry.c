/* registry.c: lookups in the class table. The table itself is one layer up
 * (src/classes/registry.c pairs each class of src/modules/ with its
 * reference in src/reference/) and is installed here when the program
 * starts, so the model names no class: the case parser and the reports
 * find a class by name through these functions. */
#include <string.h>

#include "core/qc.h"
#include "model/module.h"

static const qc_registry_row *g_rows; /* NULL until installed: no class is known */
static int g_nrows;

/* Makes rows[0..n) the class table; returns QC_OK. */
int qc_registry_install(const qc_registry_row *rows, int n) {
  g_rows = rows;
  g_nrows = n;
  return QC_OK;
}

/* The table and its length (0 rows when none is installed). */
const qc_registry_row *qc_registry_rows(int *n) {
  *n = g_nrows;
  return g_rows;
}

/* The row of class `name`, or NULL. */
const qc_registry_row *qc_registry_find(const char *name) {
  int n;
  const qc_registry_row *r = qc_registry_rows(&n);
  for (int i = 0; i < n; i++)
    if (strcmp(r[i].cls->name, name) == 0) return &r[i];
  return NULL;
}

/* The row of class `name`, or NULL with the error and the known classes. */
const qc_registry_row *qc_registry_need(const char *name, const char *where) {
  const qc_registry_row *row = qc_registry_find(name);
  if (!row) {
    int n;
    const qc_registry_row *r = qc_registry_rows(&n);
    char list[512] = "";
    for (int i = 0; i < n; i++) {
      strncat(list, i ? ", " : "", sizeof list - strlen(list) - 1);
      strncat(list, r[i].cls->name, sizeof list - strlen(list) - 1);
    }
    qc_err("%s: module class '%s' is not known", where, name);
    qc_hint("known classes: %s", list);
  }
  return row;
}
