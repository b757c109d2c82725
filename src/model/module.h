/* module.h: a module instance under audit and the class table's row type.
 *
 * One module class = one file in src/modules/ (qc_class_<name>: the
 * production VJP, contract keys, generator, error model, coverage facts) +
 * one file in src/reference/ (qc_reference_<name>: the independent float64
 * VJP) + one line in src/classes/registry.c (the class table, a layer
 * above both; its lookups are below). */
#ifndef QC_MODULE_H
#define QC_MODULE_H

#include <stdint.h>

#include "model/contract.h"
#include "numerics/metrics.h"
#include "core/tensor.h"

struct qc_backend;
struct qc_rng;
struct qc_grad_sink;

#define QC_PATHLEN 256

/* One module instance: what a dump group holds, or what the generator made. */
typedef struct qc_module {
  char path[QC_PATHLEN];       /* "/model.layers.3.mlp.down_proj" or "gen/linear[127x2048x512]" */
  const struct qc_class *cls;
  qc_contract contract;        /* validated, defaults filled */
  qc_tset inputs;              /* forward inputs: x, ... */
  qc_tset params;              /* master parameters: weight, bias, ... */
  qc_tset saved;               /* what the visible forward saved: weight_q, weight_scale, ... */
  qc_tset outputs;             /* the visible forward output(s) */
  qc_tset grad_out;            /* upstream gradients, one per dY name */
  qc_tset *cand;               /* [grad_out.n]: candidate gradients per dY (dump), or NULL */
} qc_module;

void qc_module_free(qc_module *m);

/* The ranks that run one module together, each on its slice of the split dimension (docs/distributed.md):
 * a production VJP of a split module completes its partial results through `allreduce`, as a trainer's
 * tensor- or vocab-parallel backward does through its communicator. */
typedef struct qc_group {
  int rank, size;
  int64_t lo, hi, len;         /* this rank's slice [lo, hi) of the split dimension (length len) */
  /* Reduce buf (n elements of dt: float64 or float32, host memory) over the
   * group, in place, every rank getting the result (collective: every rank
   * calls it in the same order). QC_OK, or the agreed error of any rank. */
  int (*allreduce)(const struct qc_group *g, void *buf, int64_t n, qc_dtype dt, qc_redop op);
  const void *arg;
} qc_group;

/* What a VJP sees besides the module: the backend and settings. */
typedef struct qc_ctx {
  const struct qc_backend *be;
  const char *profile;         /* quantizer profile ("vllm") */
  const char *skip;            /* NULL, or "/d_x/d_weight/": gradients already judged (a
                                  fast path did them); a VJP may leave them out, and the
                                  engine ignores them if it does not */
  const qc_group *group;       /* NULL, or: the module is a slice (qc_split) run with these ranks */
  int round_ops;               /* reference variants (engine/audit.c): 1 = the class rounds to bf16
                                  the operands it builds internally (a dequantized weight or input)
                                  before its GEMMs, as an implementation may; 2 = those and the
                                  outputs held in bf16 between GEMMs (class round_ops 2); 0 = exact */
  int terms;                   /* 1: a reference whose qc_reference sets `terms` returns, under each
                                  gradient's name and shape, T instead of the gradient: T_i the sum of
                                  the magnitudes of the terms element i adds up, weighted by operands'
                                  conditioning where the math says (qc_tol_model.terms); 2: the same, or
                                  norms of T's blocks (only ||T||_2 is read); 0 = the gradient */
  double wscale;               /* diagnosis variants (engine/forward.c, diagnose.c): > 0, a per-tensor
                                  weight scale this many times the weight's own (a stale scale), for a
                                  reference that models it (else it returns QC_NA); 0: its own */
  int bf16_params;             /* forward variant bf16_params, for a reference whose qc_reference sets
                                  `bf16_params`: it reads its parameters rounded to bf16 itself (the
                                  engine then hands it the module as it is, not rounded copies) */
  int64_t master_expert;       /* diagnosis variant (moe): e + 1 = expert e's backward (d_a, d_x) through
                                  its master weights where the contract says dequantized, for a
                                  reference that models it; 0: as the contract says */
  int world_size;              /* processes the dump came from (its root attribute world_size;
                                  0 or 1: one process, so no data-parallel explanation) */
  int ref_slices;              /* --reference: 0 = float64 (a zeroed context's); S = the fast reference
                                  with S int8 slices, where a backend has one (the CUDA fused linear
                                  audit, backend.h qc_linear_audit.ref_slices); -1 = auto (vjp's
                                  default: backend.h QC_REF_AUTO); ignored elsewhere */
  const struct qc_grad_sink *sink; /* NULL, or the engine's offer to take gradients in blocks (model/sink.h) */
} qc_ctx;

/* 1 unless ctx->skip names gradient `grad` ("d_x"). */
int qc_ctx_wants(const qc_ctx *ctx, const char *grad);

/* A VJP: given the module's tensors and one upstream gradient dy, put every
 * gradient it defines into `grads`, named "d_<input or param>" (d_x,
 * d_weight, d_bias). The reference returns the full set the contract makes
 * differentiable; that set is what gets checked. Returns QC_OK or a status
 * with qc_err set. Shapes: as the class documents. */
typedef int (*qc_vjp_fn)(const qc_ctx *ctx, const qc_module *m, const qc_tensor *dy, qc_tset *grads);

/* Generation parameters for one generated instance. */
typedef struct qc_gen {
  int nshape;
  int64_t shape[QC_MAXDIM];    /* the case's shape row, class-defined meaning */
  uint64_t seed;
  const char *values;          /* "normal" (default), "special" (zeros, extremes, saturation), "heavy_tail" */
} qc_gen;

/* Fill m's inputs/params (and saved, if the class needs it) for a generated
 * shape and set *out_ndim/out_shape to the shape of dY. */
typedef int (*qc_gen_fn)(const qc_gen *g, struct qc_rng *rng, qc_module *m, int *out_ndim, int64_t *out_shape);

/* The visible forward's math in float64, used only by `qatcheck fd` to
 * cross-check the reference VJP by finite differences. Computes y (allocated
 * here, QC_F64, shaped like dY) from m's tensors. Discrete branches (clamp
 * and ReLU masks, top-k, which side of a limit) are decided from `branch`'s
 * tensors (the unperturbed point), so y is smooth in m's values; branch may
 * be m itself. Optional: NULL when a class has none (fd then refuses it). */
typedef int (*qc_fwd_fn)(const qc_module *m, const qc_module *branch, qc_tensor *y);

/* A class's optional fast path: the candidate and the reference of the
 * gradients it covers computed together on the backend (one upload, no host
 * copy of the big tensors), returned as metrics for the engine to judge.
 * Declared in the class's row (qc_class.fast); the engine names no class. */
/* Which GEMM made a gradient's reference (--reference; docs/gpu.md, "The fast reference"): a zeroed one
 * is float64 (DGEMM or the host's float64 arithmetic: all but the fused CUDA linear audit's fast one). */
typedef struct qc_refgemm {
  int slices;                  /* 0: float64; S: the Ozaki scheme with S int8 slices ran */
  int kept;                    /* with slices: 1 its self-check held and it was used; 0 it did not
                                  and the reference was recomputed with float64 DGEMM */
  double err, err_norm, gate;  /* its self-check: max |fast - exact| / sum |a||b| and normwise on the
                                  sample, and the gate both had to stay below */
  int pairs;                   /* with slices and kept: the int8 slice products run (the plan from the
                                  sample, backend/ozplan.h; S (S + 1) / 2 without one) */
} qc_refgemm;

typedef struct qc_fast_grad {
  char name[QC_NAMELEN];       /* "d_x" */
  int ndim;
  int64_t shape[QC_MAXDIM];    /* the reference's shape */
  qc_dtype cand_dtype;         /* the candidate's element type */
  qc_metrics m;                /* candidate vs reference, noise floor included */
  qc_refgemm ref;             /* the reference's GEMM */
} qc_fast_grad;

#define QC_FAST_MAX 8
typedef struct qc_fast_out {
  int n;                       /* 0: the fast path does not apply; take the general path */
  qc_fast_grad g[QC_FAST_MAX];
} qc_fast_out;

/* Run the fast path for module m and upstream gradient dy. cand NULL: the
 * builtin candidate; else the candidate's gradients for this dY (a dump).
 * QC_OK with out->n == 0 when the path does not apply (the general path
 * then judges everything); an error status only for a failure that the
 * general path would meet too (out of device memory is not one: it does
 * not apply). */
typedef int (*qc_fast_fn)(const qc_ctx *ctx, const qc_module *m, const qc_tensor *dy, const qc_tset *cand,
                          qc_fast_out *out);

/* A gradient's error model, as the tolerance rules take it (model/tol.h):
 * what the class's production does when it computes gradient `grad` of a
 * module. Used to derive tolerances ({"derive": true}), the bias test's
 * allowance and the diagnosis's noise level. */
typedef struct qc_tol_model {
  int64_t k;                   /* reduction length (>= 1) */
  double lambda;               /* Higham-Mary lambda (0: 1) */
  int rounded_operands;        /* operands the production rounds to bf16 that the reference keeps exact */
  double margin;               /* safety factor (0: the default sqrt(3)) */
  double scale;                /* > 0: a bound on (|A||B|)_i from the inputs' magnitudes (gives max_abs) */
  double terms;                /* >= 0: ||T||_2, T_i the sum of |terms| that gradient element i adds up
                                  (|A||B| for a GEMM, sum |t| for a reduction), each weighted by its
                                  operands' conditioning where the class knows it (0: not known). The
                                  candidate's working-precision error is judged against u_acc ||T||
                                  besides |r|: a cancelling sum is not judged against itself */
  double terms_lambda;         /* > 0: the lambda of the terms' floor (margin lambda u_acc ||T||) where the
                                  model's lambda also carries another error than the sums' (moe: its
                                  bf16 roundings that fall the other way); 0: lambda */
  int exact;                   /* 1 (a forward's model): the output involves no rounding the dump's dtype
                                  cannot hold (a fake quantizer's decoded values): it is judged bit for
                                  bit, max_abs 0, besides the derived bounds */
  char why[384];               /* the model in words with its numbers ("d_x = dY W sums over N = 2048 outputs") */
} qc_tol_model;

/* Fill *out for gradient `grad` of m under upstream gradient dy. QC_OK, or
 * QC_EINPUT for a gradient the class does not define. */
typedef int (*qc_tol_model_fn)(const qc_module *m, const qc_tensor *dy, const char *grad, qc_tol_model *out);
/* A class's reading of m's datasets and contract with upstream gradient dy:
 * every refusal its production VJP and error model make on them (a shape,
 * a dataset the contract leaves unused, a contract value), nothing
 * computed. QC_OK or QC_EINPUT naming the module and the dataset or key. */
typedef int (*qc_validate_fn)(const qc_module *m, const qc_tensor *dy);

/* Status of a hypothesis that does not apply to this module (not an error). */
#define QC_NA 16

/* A known bug a class names for its failed checks (engine/diagnose.c tests
 * it against the candidate). The prediction comes from one of:
 *   alter   a variant of the module (a changed contract key, a replaced
 *           tensor set) that the engine runs the class's reference on
 *           (via_production 0) or its production VJP on (1). *alt starts as
 *           a shallow copy of m; a class that changes tensors replaces the
 *           whole set with its own (qc_tset_clone) and the engine frees
 *           every set whose storage differs from m's.
 *   predict the prediction itself: float64, shaped as the gradient (cand,
 *           the candidate's gradient, for a hypothesis fitted to it).
 * Either returns QC_OK, QC_NA (does not apply to this module) or an error;
 * `detail` gets specifics ("saved lse = ln-LSE x 1.4427") or stays "". */
typedef struct qc_hypothesis {
  const char *name;            /* "dx_convention" */
  const char *grads;           /* "/d_x/": the gradients it applies to */
  const char *says;            /* "d_x from the master weight where the contract says dequantized" */
  int (*alter)(const qc_module *m, qc_module *alt, char *detail, size_t n);
  int via_production;
  int (*predict)(const qc_ctx *ctx, const qc_module *m, const qc_tensor *dy, const char *grad, const qc_tensor *cand, qc_tensor *pred,
                 char *detail, size_t n);
  int fitted;                  /* 1: the prediction is fitted to the candidate (it explains more, says
                                  less): reported after every specific hypothesis that holds */
} qc_hypothesis;

/* Constant factors a class can name: up to max (k, meaning) pairs for
 * gradient `grad` of m ("normalized over every position, not the 1456
 * counted tokens"). Returns the count. */
typedef int (*qc_ratios_fn)(const qc_module *m, const char *grad, double *k, char (*says)[160], int max);

/* The hypotheses engine/diagnose.c knows without the class, by name. */
#define QC_HYP_GENERIC "factor sign transpose rows zero slice dy_precision nonfinite"

/* Where one rank's gradient sits in the whole: the whole as a [rows, cols]
 * view (cols = its last dimension), the rank's block [r0, r1) x [c0, c1),
 * and its full shape. */
typedef struct qc_split_block {
  int64_t rows, cols, r0, r1, c0, c1;
  int ndim;
  int64_t shape[QC_MAXDIM];
} qc_split_block;

/* A class whose module can be split across ranks along one dimension (an
 * lm_head along its output features, a log-prob along the vocabulary):
 * every rank runs the slice [lo, hi) of it (engine/split.c). */
typedef struct qc_split {
  const char *dim;             /* the split dimension in words: "N (output features)" */
  /* The split dimension's length and the slices' alignment (a slice starts
   * at a multiple of it) over `ranks` ranks; QC_EINPUT naming why when m
   * cannot be split. */
  int (*size)(const qc_module *m, int ranks, int64_t *len, int64_t *align);
  /* part = m restricted to [lo, hi): the sliced tensors of inputs, params,
   * grad_out and the candidates (m->cand), owned by part (qc_module_free);
   * path, class and contract copied. */
  int (*slice)(const qc_module *m, int64_t lo, int64_t hi, qc_module *part);
  /* Where gradient `grad` of the slice [lo, hi) sits in the whole (*b);
   * *partial = 1 when the slice's gradient is a partial sum of the whole
   * one (the reference's is summed over the ranks, the production's sums
   * itself through ctx->group; b then covers the whole). */
  int (*place)(const qc_module *m, const char *grad, int64_t lo, int64_t hi, qc_split_block *b, int *partial);
  int whole_reference;         /* 1: the reference needs the whole module (a softmax over the split
                                  dimension); it runs whole on every rank, which takes its block */
  /* Optional: device memory the unsplit audit of m needs (its inputs and
   * params may be shapes without data), for the automatic split; NULL:
   * never split automatically. */
  size_t (*device_bytes)(const qc_module *m);
} qc_split;

/* One item of the coverage list (model/modinfo.h) that only some classes
 * can show, as one class shows it (its row's `coverage`). */
typedef struct qc_class_cov {
  const char *item;            /* the item's id (qc_coverage[].id) */
  const char *how;             /* how an instance of the class shows it (NULL: the item's own words say it) */
  /* optional: 1 when the item applies under a contract (its JSON; NULL when
   * not known), e.g. a threshold only where the contract sets one; NULL:
   * always */
  int (*applies)(const char *contract_json);
} qc_class_cov;

struct qc_modinfo;

/* What one gradient's reference reads, for the reference variants
 * (engine/variants.c): the words of `reads`, space-separated, name the
 * tensors and roundings its value depends on:
 *   dy      the upstream gradient           (the variant part bf16_dy)
 *   inputs  the differentiated inputs       (bf16_inputs)
 *   params  the parameters                  (bf16_params)
 *   ops     the class's rounding levels, qc_ctx.round_ops (round_ops)
 * Words joined by '=' (one such word a row, "dy inputs=ops") are one
 * rounding of what the gradient reads: applying either part or both gives
 * the same value (linear's d_weight rounds X to bf16 under bf16_inputs and
 * under its rounding level alike); ops in such a word is the class's first
 * rounding level, a deeper level stays a variant of its own.
 * A variant computes the same reference of that gradient as another one
 * (or as the contract's reference) when they differ only in parts it does
 * not read, or in which parts of the '=' word they apply: the engine does
 * not compute it again (it could never fit strictly better). The rows must hold under every contract they apply to:
 * naming more than the reference reads only costs time, naming less
 * changes verdicts. */
typedef struct qc_grad_reads {
  const char *grad;            /* "d_x" */
  const char *reads;           /* "dy params ops" */
  /* optional: the row holds only under a contract for which it returns 1
   * (a clipped STE's mask reads x); the first row of `grad` that holds is
   * taken, none: the gradient reads everything */
  int (*applies)(const qc_contract *c);
} qc_grad_reads;

typedef struct qc_class {
  const char *name;            /* "linear" */
  const char *summary;         /* one line */
  const char *shape_help;      /* meaning of a generate shape row: "[M, K, N]" */
  const qc_key_spec *keys;     /* contract keys, NULL-key terminated */
  const char *tensors;         /* every dataset the class models, "role/name" space-separated
                                  ("inputs/x params/weight params/bias outputs/y"; some optional):
                                  a dump group holding any other is refused (qc_module_check_known) */
  qc_gen_fn generate;
  qc_vjp_fn production;        /* src/modules/<name>.c: as a trainer runs it */
  int round_ops;               /* 1: its reference honors qc_ctx.round_ops (operands it builds,
                                  such as a dequantized weight, rounded to bf16: a variant); 2: also
                                  round_ops 2 (the outputs a production may hold in bf16 between its
                                  GEMMs, moe's expert outputs: a second variant) */
  int formats_are_arithmetic;  /* 1: its contract's *_format keys describe its GEMM's arithmetic, so
                                  compute_dtype bfloat16 adds no rounding to its error model (linear);
                                  0: the class's bf16 arithmetic is compute_dtype's (moe, whose
                                  expert formats quantize weights inside a bf16 model) */
  int bf16_gemm;               /* 1: its production multiplies matrices in its operands' dtype (linear,
                                  attention, moe): a bf16 call may run bf16 GEMMs, so where the dump's
                                  producer sums them in bf16 (qatdump's cpu_bf16_gemm_acc), failures
                                  within a bf16 sum's error are cannot judge (qc_vjp_check_gemm_acc) */
  const char *not_checked;     /* differentiable inputs deliberately unchecked, and why ("" if none) */
  qc_fwd_fn forward;           /* optional float64 forward for `fd` (NULL: none) */
  const char *fd_shape;        /* optional default generate shape for `fd`, "13,4,64" */
  const char *grads;           /* every gradient the reference can return, space-separated
                                  ("d_x d_weight d_bias"; some only when their input exists):
                                  a tolerance for any other name is refused */
  const qc_grad_reads *grad_reads; /* optional: what each gradient's reference reads, {NULL}-terminated
                                  (qc_grad_reads; NULL, or a gradient without a row: everything), so the
                                  engine computes no reference variant twice for one gradient */
  qc_tol_model_fn tol_model;   /* the error model of each gradient (NULL: none; no derived tolerances) */
  qc_validate_fn validate;     /* m's datasets and contract as its production and error model read them
                                  (NULL: qc_module_check_known's names only); qc_module_validate runs it
                                  on every module before any check, whatever the tolerance form */
  const char *hypotheses;      /* the generic hypotheses (QC_HYP_GENERIC's names) that apply, space-separated */
  const qc_hypothesis *hyps;   /* the class's own, {NULL}-terminated (NULL: none) */
  qc_ratios_fn ratios;         /* constant factors it can name (NULL: none) */
  const qc_split *split;       /* optional: how a module is split across ranks (NULL: never split) */
  qc_fast_fn fast;             /* optional: candidate and reference together on a backend
                                  (src/modules/<name>_fast.c; NULL: none) */
  /* Coverage (model/modinfo.h): the items only some classes can show that
   * this one can, {NULL}-terminated (NULL: none); the token rows and
   * sequence length of m as the class lays them out (1 when set; NULL or 0:
   * the rows of its first float input, no sequence); and the items of `coverage` m's data
   * shows, given its description mi, as bits 1 << QC_COV_* into *cover
   * (NULL: none from the data). */
  const qc_class_cov *coverage;
  /* Optional: deployed bytes per expert (engine/vjp_prep.c), "KEY P1 P2":
   * the contract key that names the format (as linear's weight_format) and
   * the stacked parameters [E, N, K] whose experts' bytes (saved/<P>_q,
   * _scale or _scale_inv, nvfp4's _global_scale or _scale_2, the experts
   * leading) are checked byte for byte, each expert as one weight (NULL:
   * none). */
  const char *stacked_deployed;
  /* Optional: the slices along dimension 0 of gradient `grad` of m that
   * must be exactly zero whatever the rounding (an expert no token is
   * routed to): zero[i] = 1 for them, i < n (the gradient's shape[0]);
   * *what names a slice ("expert"). QC_OK, QC_NA (none for this gradient),
   * or an error. The engine fails the gradient's check, naming the slice,
   * where the candidate holds anything but zeros there (NULL: none). */
  int (*zero_slices)(const qc_module *m, const char *grad, int64_t n, unsigned char *zero, const char **what);
  int (*cov_tokens)(const qc_module *m, int64_t *tokens, int64_t *seqlen);
  void (*cov_facts)(const qc_module *m, const struct qc_modinfo *mi, uint32_t *cover);
} qc_class;

/* The forward the contract defines, from the math (src/reference/): y
 * (allocated here, QC_F64, shaped like outputs/y) from m's inputs and
 * params, with every quantizer the contract names (format, profile,
 * rounding); ctx->round_ops rounds the GEMM operands to bf16 after their
 * quantization (a legal variant), ctx->wscale > 0 quantizes a per-tensor
 * weight with that multiple of its scale. *tm gets y's error model (the
 * reduction length, ||T|| of the terms each y element sums). QC_OK, QC_NA
 * (the variant does not apply), or an error. */
typedef int (*qc_fwd_ref_fn)(const qc_ctx *ctx, const qc_module *m, qc_tensor *y, qc_tol_model *tm);

/* A saved tensor recomputed from the math (src/reference/): saved/<name> of
 * m as the forward the contract defines computes it from m's inputs and
 * params, in float64 (allocated here, QC_F64, shaped like saved/<name>),
 * and its error model *tm (tm->k 0: the forward check's default model, the
 * one outputs/y gets). An entry the forward leaves without a value (the
 * LSE of a query with no visible key) is non-finite. QC_OK, QC_NA (the
 * class does not recompute that one), or an error. */
typedef int (*qc_saved_ref_fn)(const qc_ctx *ctx, const qc_module *m, const char *name, qc_tensor *r, qc_tol_model *tm);

/* A discrete saved tensor (integer ids: router's saved/topk_ids) judged
 * against the selection the contract defines, recomputed from the math in
 * float64. A row (token) whose saved selection no admissible selection
 * equals differs; a row with more than one admissible selection (a
 * near-tie within the precision of the dumped inputs, or an exact tie the
 * contract's tie rule leaves open) is ambiguous and any of them is taken. */
typedef struct qc_select_result {
  const char *unit;            /* what a row is, plural ("tokens"; NULL: "rows") */
  int64_t rows;                /* rows judged */
  int64_t differ;              /* rows whose saved selection the contract cannot give */
  int64_t first;               /* the first of them (-1: none) */
  int64_t ambiguous;           /* rows with more than one admissible selection */
  int64_t unjudged;            /* rows that cannot be judged (a non-finite key): named, taken */
  char first_says[320];        /* the first differing row in words: its saved ids and the contract's */
  char rule[256];              /* the selection recomputed, in words ("top-8 of sigmoid + bias, 4 of 8 groups") */
} qc_select_result;

/* Saved tensor `name` of m judged as a selection (qc_select_result) into
 * *r. QC_OK, QC_NA (not one the class judges), or an error (QC_EINPUT
 * naming what is wrong with the module). */
typedef int (*qc_select_ref_fn)(const qc_ctx *ctx, const qc_module *m, const char *name, qc_select_result *r);

/* A class's independent reference, as src/reference/<name>.c exports it
 * (qc_reference_<name>, its only global symbol). */
typedef struct qc_reference {
  qc_vjp_fn vjp;               /* the float64 VJP, from the math */
  qc_fwd_ref_fn forward;       /* optional: the forward the contract defines (NULL: none) */
  qc_saved_ref_fn saved;       /* optional: the saved tensors it recomputes (NULL: none) */
  qc_select_ref_fn select;     /* optional: the saved selections it judges (NULL: none) */
  const char *selected;        /* their names, space-separated ("topk_ids"; NULL: none) */
  int terms;                   /* 1: vjp honors qc_ctx.terms (the terms' scale of every gradient whose
                                  class model leaves qc_tol_model.terms at 0) */
  int bf16_params;             /* 1: forward honors qc_ctx.bf16_params (no rounded copies made) */
} qc_reference;

/* A registry row: the class, its independent reference and, optionally, a
 * fast path that runs both together on the backend, and the reference's
 * forward (NULL: the forward check uses the class's float64 `forward`
 * where the contract quantizes nothing). Made by src/classes/registry.c
 * from the class's qc_class and qc_reference. */
typedef struct qc_registry_row {
  const qc_class *cls;
  qc_vjp_fn reference;         /* src/reference/<name>.c */
  qc_fast_fn fast;             /* NULL, or src/modules/<name>_fast.c */
  qc_fwd_ref_fn forward;       /* NULL, or src/reference/<name>.c */
  int terms;                   /* 1: the reference honors qc_ctx.terms (the terms' scale of every
                                  gradient whose class model leaves qc_tol_model.terms at 0) */
  qc_saved_ref_fn saved;       /* NULL, or src/reference/<name>.c: the saved tensors it recomputes,
                                  each judged against the dump's (engine/forward.c) */
  qc_select_ref_fn select;     /* NULL, or src/reference/<name>.c: the saved selections it judges
                                  (engine/forward_select.c) */
  const char *selected;        /* their names, space-separated (NULL: none) */
  int bf16_params;             /* 1: forward honors qc_ctx.bf16_params (qc_reference.bf16_params) */
} qc_registry_row;

/* The class table is src/classes/registry.c's, installed when the program
 * starts (the model names no class): qc_registry_install makes rows[0..n)
 * the table; qc_registry_rows returns it (NULL and *n = 0 before that);
 * qc_registry_find returns the row of class `name` or NULL. */
int qc_registry_install(const qc_registry_row *rows, int n);
const qc_registry_row *qc_registry_find(const char *name);
const qc_registry_row *qc_registry_rows(int *n);
/* qc_registry_find, or NULL with the error "<where>: module class 'X' is
 * not known" and a hint listing the classes. */
const qc_registry_row *qc_registry_need(const char *name, const char *where);



/* A deep copy of set src into *dst (for hypothesis variants). */
int qc_tset_clone(qc_tset *dst, const qc_tset *src);
/* Free what a hypothesis variant alt of m owns: each tensor set whose
 * storage differs from m's. */
void qc_module_variant_free(qc_module *alt, const qc_module *m);

/* Look up m's tensor `name` in role set `role` ("inputs", "params", "saved",
 * "outputs") and check its rank is within [min_ndim, max_ndim]. A missing
 * tensor or wrong rank is QC_EINPUT naming the module, role and tensor. */
int qc_module_need(const qc_module *m, const char *role, const char *name, int min_ndim, int max_ndim,
                   const qc_tensor **out);
/* k > 0 when m's class differentiates its input `name` (d_<name> is word k
 * of its `grads`): an activation a trainer may hold in bf16, so the legal
 * variants round it; 0 for a buffer the class only reads (rope's
 * inv_freq), which they leave as stored. */
int qc_module_input_grad(const qc_module *m, const char *name);

/* 1 when `grad` is a word of cls's space-separated `grads` (NULL: none). */
int qc_class_has_grad(const qc_class *cls, const char *grad);
/* Refuse what m's class does not model: a dataset of inputs/, params/,
 * saved/ or outputs/ not named in m->cls->tensors (but a saved copy of an
 * input, qc_module_saved_copy), and a candidate
 * gradient (m->cand, when loaded) that is not d_<name> of one of the
 * class's `grads` whose tensor <name> m holds; an outputs/ dataset that
 * is not of a float dtype (int32, packed float4: the forward check could
 * not judge it). QC_OK, or QC_EINPUT with one line "<where>: <role>/<name>
 * is not modelled by class 'C' ..." listing what the class takes, or naming
 * the output's dtype and the float dtype expected. m->cls must be set. */
int qc_module_check_known(const qc_module *m, const char *where);
/* The one validation of a module every run makes before judging it, once
 * its contract is final and its dYs selected: qc_module_check_known, then
 * the class's validate with each dY of m->grad_out (none: not run). So a
 * dataset the class refuses is refused whatever the case's tolerances
 * (declared, derived, per module): the reference, which is all an explicit
 * tolerance needs, reads only what the math uses. */
int qc_module_validate(const qc_module *m, const char *where);
/* The input of m that saved tensor `name` is a copy of: saved/<x> or
 * saved/<x>_saved with inputs/<x> one of m's inputs (a Function that
 * saves q, k, v beside its own results), unless the class models
 * saved/<name> itself; NULL otherwise. Such a copy is not refused by
 * qc_module_check_known; the forward check (engine/forward.c) compares it
 * with the input, exactly or as its rounding to the copy's dtype. */
const qc_tensor *qc_module_saved_copy(const qc_module *m, const char *name);
/* Check that dY holds `numel` elements laid out as `want` describes
 * ("[tokens, features]"), with `last` as its last dimension when last > 0
 * (so a transposed dY of the same size is refused, not misread); QC_EINPUT
 * naming the module and dY otherwise. */
int qc_module_check_dy(const qc_module *m, const qc_tensor *dy, int64_t numel, int64_t last, const char *want);
#endif
