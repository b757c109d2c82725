/* variants.h: the reference variants, in one place. A correct
 * implementation may round what the contract's float64 reference keeps
 * exact (an autocast step casts X, W and dY to bf16; a fake-quant GEMM
 * casts its dequantized operands; a bf16 model rounds every op). Those
 * roundings are deterministic, so instead of an allowance for them a check
 * that fails against the contract's reference, or passes with an elevated
 * bias z, is judged again against the reference of each legal rounding.
 * This module owns the list of a module's legal variants (from its class,
 * contract and data, the dump's own evidence and the case's "variants"),
 * the order they are tried in and the rule of which one a check is judged
 * against (docs/tolerances.md, "Reference variants"). The gradient checks
 * (engine/audit.c) and the forward check (engine/forward.c) only compute a
 * variant's reference and judge the candidate against it. */
#ifndef QC_ENGINE_VARIANTS_H
#define QC_ENGINE_VARIANTS_H

#include <stddef.h>

#include "model/check.h"
#include "model/module.h"

/* One variant: the parts it rounds (QC_VAR_*, model/check.h) and, with
 * QC_VAR_ROUND_OPS, the class's rounding level (qc_ctx.round_ops). */
typedef struct qc_variant {
  unsigned parts;
  int level;
} qc_variant;

#define QC_VARIANTS_MAX 32

/* The legal variants of one check kind of one module, in the order tried. */
typedef struct qc_variants {
  int n;
  qc_variant v[QC_VARIANTS_MAX];
  int levels;          /* the class's rounding levels for this module (qc_variant_levels) */
  unsigned ruled_out;  /* QC_VAR_* parts the dump's evidence rules out (qc_variants_evidence) */
} qc_variants;

typedef enum { QC_VARIANTS_GRADS = 0, QC_VARIANTS_FORWARD = 1 } qc_variants_kind;

/* 1 when m's contract quantizes something: a key named *_format whose
 * value is not "none". */
int qc_quantizes(const qc_module *m);

/* The parts the dump's own evidence rules out for m: bf16_inputs and
 * bf16_params (autocast's roundings) when its group says autocast was off
 * (`autocast` "off": scripts/qatdump.py records it at the module's call;
 * NULL or "": not recorded, nothing ruled out), its contract declares no
 * bf16 compute, none of its inputs, parameters, saved tensors, outputs or
 * dYs is stored in a 16-bit float type, and it has an output whose values
 * are not all bf16 (or float16) values: no cast to 16 bits left a trace,
 * so nothing rounded its float32 inputs. */
unsigned qc_variants_evidence(const qc_module *m, const char *autocast);

/* The legal variants of m for the gradient checks under dY dy, or (kind
 * QC_VARIANTS_FORWARD, dy NULL) for the forward check, in the order tried,
 * leaving out the parts in `off` (the case's "variants") and those the
 * dump's evidence rules out (autocast as qc_variants_evidence takes it):
 *   gradients  every combination of dY rounded to bf16 (when a value of dY
 *              is not a bf16 value), the differentiated float inputs
 *              rounded (when one of theirs is not) and a rounding level
 *              1..the class's rounding levels for m;
 *   forward    the inputs rounded, the inputs and parameters rounded
 *              (autocast), only where the contract quantizes nothing (a
 *              cast before the forward's quantizer changes which code X
 *              quantizes to: a defect the diagnosis names); and each
 *              rounding level alone;
 * ordered by level, then by parts (dY, inputs, parameters). A table the
 * class only reads (rope's inv_freq) is never rounded. */
void qc_variants_of(const qc_module *m, const qc_tensor *dy, qc_variants_kind kind, unsigned off, const char *autocast,
                    qc_variants *out);

/* What variant v computes from: c is ctx with round_ops set; alt is m with
 * the rounded tensors (owned copies of its inputs and, with bf16_params,
 * its parameters); *dv is dy (NULL: none) rounded when v rounds dY (an
 * owned copy), else dy itself. QC_OK or QC_ESYS; release with
 * qc_variant_release either way. */
int qc_variant_apply(const qc_variant *v, const qc_ctx *ctx, const qc_module *m, const qc_tensor *dy, qc_ctx *c, qc_module *alt,
                     qc_tensor *dv);
void qc_variant_release(const qc_variant *v, const qc_module *m, qc_module *alt, qc_tensor *dv);

/* Its parts' names joined by '+' ("bf16_dy+round_ops"), as a case names
 * them; "none" for no part (the contract's reference). */
void qc_variant_id(const qc_variant *v, char *buf, size_t n);

/* The variant parts gradient `grad` of m reads (QC_VAR_*): the words of
 * its class's grad_reads row that holds under m's contract (qc_grad_reads,
 * model/module.h: dy, inputs, params, ops), QC_VAR_ALL where there is
 * none, or where the row holds a word that is not one of those. */
unsigned qc_grad_reads_of(const qc_module *m, const char *grad);

/* The parts that row's one '='-joined word names ("inputs=ops": applying
 * either or both is one rounding of what the gradient reads, the same
 * reference bit for bit); 0 where it has none. */
unsigned qc_grad_same_of(const qc_module *m, const char *grad);

/* For a gradient that reads the parts `reads` (qc_grad_reads_of), `same`
 * of them one rounding (qc_grad_same_of): -1 when variant i of L changes
 * nothing it reads (its reference is the contract's); j < i, the first
 * variant of L whose effective variant is i's (its parts among `reads`,
 * those of `same` counted as one, and its level where round_ops is one:
 * the same reference, bit for bit); else i. A repeat can never be
 * judged strictly better than the one it repeats (qc_variant_better), so
 * the gradient checks do not compute it. */
int qc_variant_repeats(const qc_variants *L, int i, unsigned reads, unsigned same);

/* 1 when check k, judged against the contract's reference, is judged
 * against the variants too: it failed, or it passed with its bias test
 * made and |z| beyond half its bound (a production's legal roundings are
 * systematic enough to move z; against the variant that reproduces them z
 * is rounding noise again). */
int qc_variants_wanted(const qc_check *k);

/* The rule: 1 when kv (the candidate judged against a variant) is the
 * better judgement for check k (judged against the contract's reference)
 * than best (NULL: none yet). kv must pass and fit the candidate better
 * than the contract's reference (a smaller rel_l2, or a smaller multiple
 * of its own noise floor: a variant that fits no better explains nothing,
 * and a scale error never hides in a variant's noise); of those, a failed
 * k takes the one of smallest rel_l2, a passing k the one of smallest |z|
 * below its own. */
int qc_variant_better(const qc_check *k, const qc_check *best, const qc_check *kv);

/* The candidate judged against variant i (v = &L->v[i]) into a fresh check
 * *kv: QC_OK; QC_NA when the variant does not apply here (another shape, a
 * reference without that rounding); any other failure is the variant's
 * answer (it is skipped and its message dropped), but QC_ESYS, which is
 * the run's. */
typedef int (*qc_variant_judge_fn)(void *arg, int i, const qc_variant *v, qc_check *kv);

/* Judge check k against the variants of L where qc_variants_wanted says
 * so: each judged by `judge`, in L's order, the best by qc_variant_better
 * replaces k, named (k->variant, k->variant_id); k stays as it is when none
 * qualifies. QC_OK or QC_ESYS. */
int qc_variants_judge(const qc_variants *L, qc_variant_judge_fn judge, void *arg, qc_check *k);

/* A failed check k that no variant passes (after qc_variants_judge): judged
 * against the variant the candidate lies closest to in direction (the
 * largest |cosine|, which a constant factor or a sign flip leaves as it
 * is), when that variant's sine is under half the contract reference's:
 * the variant the correct code matches, so the check's metrics and its
 * diagnosis measure the defect alone, not the legal roundings beside it.
 * k is replaced (still failing, named), *chosen its index in L; else k
 * stays and *chosen is -1. QC_OK or QC_ESYS. */
int qc_variants_closest(const qc_variants *L, qc_variant_judge_fn judge, void *arg, qc_check *k, int *chosen);

#endif
