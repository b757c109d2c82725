/* plugin.h: a candidate VJP from a shared library (include/qatcheck_plugin.h). */
#ifndef QC_PLUGIN_H
#define QC_PLUGIN_H

#include "model/module.h"

typedef struct qc_plugin qc_plugin;

/* dlopen `path` and find `symbol`; a clear error naming both when either
 * fails. */
int qc_plugin_open(const char *path, const char *symbol, qc_plugin **out);
void qc_plugin_close(qc_plugin *p);
/* Run the plugin's VJP on m and dy; gradients go into grads. */
int qc_plugin_vjp(qc_plugin *p, const qc_module *m, const qc_tensor *dy, qc_tset *grads);

#endif
