/* classes/registry.c: the class table. One line per module class, in the
 * order the help and `qatcheck classes` list them: QC_CLASS(name) pairs
 * the class (its production VJP, keys, generator, error model, coverage
 * facts and optional fast path: `qc_class_<name>`, src/modules/<name>.c)
 * with its independent reference (`qc_reference_<name>`,
 * src/reference/<name>.c: its VJP, and optionally its forward, the
 * saved tensors it recomputes and the saved selections it judges).
 * Adding a class adds one line here; the line declares both objects
 * itself (QC_CLASS_DECLARE, QC_REFERENCE_DECLARE: the macros of the layers
 * that define them), so no header lists classes.
 *
 * This layer sits above modules/ and reference/ (it names both) and below
 * engine/: the lookups stay the model's (qc_registry_find in model/module.h,
 * used by the case parser and the reports), over the table installed here
 * when the program starts, so no lower layer names a class's symbol. */
#include "model/module.h"
#include "modules/classes.h"
#include "reference/ref_classes.h"

#define QC_CLASSES(QC_CLASS) \
  QC_CLASS(linear)           \
  QC_CLASS(rmsnorm)          \
  QC_CLASS(layernorm)        \
  QC_CLASS(rope)             \
  QC_CLASS(swiglu)           \
  QC_CLASS(relu2)            \
  QC_CLASS(gelu)             \
  QC_CLASS(logprob)          \
  QC_CLASS(router)           \
  QC_CLASS(attention)        \
  QC_CLASS(moe)              \
  QC_CLASS(ssd)              \
  QC_CLASS(conv1d)           \
  QC_CLASS(kv_quant)         \
  QC_CLASS(fake_quant)       \
  QC_CLASS(act_quant)        \
  /* a new class: its line above this one */

/* Every line declares its class and its reference ... */
#define DECLARE(n) QC_CLASS_DECLARE(n) QC_REFERENCE_DECLARE(n)
QC_CLASSES(DECLARE)

/* ... and pairs them. */
typedef struct line {
  const qc_class *cls;
  const qc_reference *ref;
} line;
#define LINE(n) {.cls = &qc_class_##n, .ref = &qc_reference_##n},
static const line g_lines[] = {QC_CLASSES(LINE)};
#define NLINES ((int)(sizeof g_lines / sizeof g_lines[0]))

static qc_registry_row g_rows[NLINES];

/* Builds the rows from the lines and installs them before main() (and
 * before any test), in every program linked with the library's objects:
 * the tool, the tests, the benches and the fuzz harnesses. */
__attribute__((constructor)) static void registry_install(void) {
  for (int i = 0; i < NLINES; i++)
    g_rows[i] = (qc_registry_row){.cls = g_lines[i].cls,
                                  .reference = g_lines[i].ref->vjp,
                                  .fast = g_lines[i].cls->fast,
                                  .forward = g_lines[i].ref->forward,
                                  .terms = g_lines[i].ref->terms,
                                  .saved = g_lines[i].ref->saved,
                                  .select = g_lines[i].ref->select,
                                  .selected = g_lines[i].ref->selected,
                                  .bf16_params = g_lines[i].ref->bf16_params};
  qc_registry_install(g_rows, NLINES);
}
