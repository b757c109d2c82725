/* classes/registry.c: the class table. One row per module class: the class
 * (its production VJP, keys and generator, src/modules/<name>.c), its
 * independent reference (src/reference/<name>.c) and, optionally, a fast
 * path that computes both together on a backend (src/modules/<name>_fast.c),
 * and whether the reference gives the terms' scale (qc_ctx.terms; linear
 * and the norms compute theirs in their error model). Adding a class adds
 * one row here.
 *
 * This layer sits above modules/ and reference/ (it names both) and below
 * engine/: the lookups stay the model's (qc_registry_find in model/module.h,
 * used by the case parser and the reports), over the table installed here
 * when the program starts, so no lower layer names a class's symbol. */
#include "model/module.h"
#include "modules/classes.h"
#include "reference/ref_classes.h"

static const qc_registry_row g_rows[] = {
    {&qc_class_linear, qc_ref_linear, qc_fast_linear, qc_ref_linear_forward, 0},
    {&qc_class_rmsnorm, qc_ref_rmsnorm, NULL, NULL, 0},
    {&qc_class_layernorm, qc_ref_layernorm, NULL, NULL, 0},
    {&qc_class_rope, qc_ref_rope, NULL, qc_ref_rope_forward, 1},
    {&qc_class_swiglu, qc_ref_swiglu, NULL, qc_ref_swiglu_forward, 1},
    {&qc_class_relu2, qc_ref_relu2, NULL, NULL, 1},
    {&qc_class_gelu, qc_ref_gelu, NULL, qc_ref_gelu_forward, 1},
    {&qc_class_logprob, qc_ref_logprob, NULL, NULL, 1},
    {&qc_class_router, qc_ref_router, NULL, NULL, 1},
    {&qc_class_attention, qc_ref_attention, NULL, NULL, 1},
    {&qc_class_moe, qc_ref_moe, NULL, qc_ref_moe_forward, 1},
    {&qc_class_ssd, qc_ref_ssd, NULL, NULL, 1},
    {&qc_class_conv1d, qc_ref_conv1d, NULL, NULL, 1},
};

/* Installs the table before main() (and before any test), in every program
 * linked with the library's objects: the tool, the tests, the benches and
 * the fuzz harnesses. */
__attribute__((constructor)) static void registry_install(void) {
  qc_registry_install(g_rows, (int)(sizeof g_rows / sizeof g_rows[0]));
}
