/* registry.c: the class table. One row per module class: the class (its
 * production VJP, keys and generator, src/modules/), its independent
 * reference (src/reference/) and, optionally, a fast path that computes
 * both together on a backend (src/modules/<class>_fast.c). Adding a class
 * adds one row here. */
#include <string.h>

#include "core/qc.h"
#include "model/module.h"

extern const qc_class qc_class_linear;
int qc_ref_linear(const qc_ctx *, const qc_module *, const qc_tensor *, qc_tset *);
int qc_fast_linear(const qc_ctx *, const qc_module *, const qc_tensor *, const qc_tset *, qc_fast_out *);
extern const qc_class qc_class_rmsnorm;
int qc_ref_rmsnorm(const qc_ctx *, const qc_module *, const qc_tensor *, qc_tset *);
extern const qc_class qc_class_layernorm;
int qc_ref_layernorm(const qc_ctx *, const qc_module *, const qc_tensor *, qc_tset *);
extern const qc_class qc_class_rope;
int qc_ref_rope(const qc_ctx *, const qc_module *, const qc_tensor *, qc_tset *);
extern const qc_class qc_class_swiglu;
int qc_ref_swiglu(const qc_ctx *, const qc_module *, const qc_tensor *, qc_tset *);
extern const qc_class qc_class_relu2;
int qc_ref_relu2(const qc_ctx *, const qc_module *, const qc_tensor *, qc_tset *);
extern const qc_class qc_class_gelu;
int qc_ref_gelu(const qc_ctx *, const qc_module *, const qc_tensor *, qc_tset *);
extern const qc_class qc_class_logprob;
int qc_ref_logprob(const qc_ctx *, const qc_module *, const qc_tensor *, qc_tset *);
extern const qc_class qc_class_router;
int qc_ref_router(const qc_ctx *, const qc_module *, const qc_tensor *, qc_tset *);
extern const qc_class qc_class_attention;
int qc_ref_attention(const qc_ctx *, const qc_module *, const qc_tensor *, qc_tset *);
extern const qc_class qc_class_moe;
int qc_ref_moe(const qc_ctx *, const qc_module *, const qc_tensor *, qc_tset *);
extern const qc_class qc_class_ssd;
int qc_ref_ssd(const qc_ctx *, const qc_module *, const qc_tensor *, qc_tset *);

static const qc_registry_row g_rows[] = {
    {&qc_class_linear, qc_ref_linear, qc_fast_linear},
    {&qc_class_rmsnorm, qc_ref_rmsnorm, NULL},
    {&qc_class_layernorm, qc_ref_layernorm, NULL},
    {&qc_class_rope, qc_ref_rope, NULL},
    {&qc_class_swiglu, qc_ref_swiglu, NULL},
    {&qc_class_relu2, qc_ref_relu2, NULL},
    {&qc_class_gelu, qc_ref_gelu, NULL},
    {&qc_class_logprob, qc_ref_logprob, NULL},
    {&qc_class_router, qc_ref_router, NULL},
    {&qc_class_attention, qc_ref_attention, NULL},
    {&qc_class_moe, qc_ref_moe, NULL},
    {&qc_class_ssd, qc_ref_ssd, NULL},
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
