/* memo.h: values a reference derives from one tensor of the module under
 * audit (a weight's dequant(quant(.)), expert by expert), kept while the
 * engine audits that module (the engine opens the scope with the module's
 * tensor sets), so its forward check, its reference, the
 * terms' run and every reference variant compute them once. The quantized
 * linears of a whole model re-ran their weight's fake quantization in each
 * variant's reference; a MoE layer its experts' three times (reference,
 * terms, forward).
 *
 * A value is kept under (t, tag) only while a scope is open and only for a
 * tensor t of the scope's sets themselves (the module's own params, inputs,
 * saved tensors and dYs, by address): a variant that rounds its own copy of a tensor holds
 * another address, and neither finds nor leaves anything. The module's
 * tensors do not change during its audit, so an address names its values.
 * One scope a thread; at most qc_memo_budget() bytes kept in it. Values only: the
 * reference computes them itself, so it stays independent of the
 * production code (scripts/check-independence.sh allows core/). */
#ifndef QC_CORE_MEMO_H
#define QC_CORE_MEMO_H

#include <stddef.h>
#include <stdint.h>

#include "core/tensor.h"

/* The most bytes a scope keeps: a third of the host memory the process may
 * assume (core/par.h qc_host_memory; a MoE
 * layer at DeepSeek-V3's real size keeps 45 GB of its experts' quantized
 * weights, each made once for the forward check, the reference and the
 * terms' run; 4 GiB, the fixed budget before, held a fifth of them at 128
 * experts and the rest were quantized three times). Read again at each
 * call: a virtual machine whose memory grows as it is used (Firecracker
 * with its memory hot-added; the lent H200s' MemTotal starts at a fraction
 * of what they hold) shows more as the audit runs, and a budget fixed at
 * the first read kept the fraction. */
int64_t qc_memo_budget(void);

/* Open the scope of the n tensor sets (n 0: close it); frees what the last
 * one kept. The sets must stay where they are until it closes. */
#define QC_MEMO_SETS 4
void qc_memo_scope(const qc_tset *const *sets, int n);

/* The n float32 values kept under (t, tag), or NULL. */
const float *qc_memo_get(const qc_tensor *t, const char *tag, int64_t n);

/* Hand v (malloc'd, n float32 values, derived from t alone) to the scope
 * under (t, tag): 1 when it took it (and frees it at the scope's end), 0
 * when not (no scope, t not the module's own, over the budget, out of
 * memory, QATCHECK_MEMO=0 in the environment: the benchmarks' side by
 * side): the caller keeps and frees v. */
int qc_memo_take(const qc_tensor *t, const char *tag, float *v, int64_t n);

/* 1 when the calling thread's open scope holds the bytes [p, p + bytes)
 * unchanged until it closes: they lie in a tensor of its sets or in a value
 * kept in it (0 with QATCHECK_MEMO=0). A device backend keeps its copy of
 * such an operand (backend.h, gemm_f64_x) while qc_memo_gen() stays the
 * same. */
int qc_memo_holds(const void *p, size_t bytes);

/* A number that changes whenever a scope opens or closes, on any thread.
 * A device backend reads it once at the start of a call (a scope's
 * addresses are only the calling thread's to vouch for: the audit opens
 * scopes and calls the backend on one thread). */
uint64_t qc_memo_gen(void);

#endif
