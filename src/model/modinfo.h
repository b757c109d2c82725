/* modinfo.h: what layer 1 records about each module instance it audits,
 * beside its checks: where the instance came from, its contract, its
 * tensors' shapes, its dYs and what they are, which items of the method's
 * coverage list it exercises (decided from its data), and its wall time.
 * The vjp report writes it ("modules"); the audit document reads it back
 * and builds the coverage matrix from it.
 *
 * The coverage list (qc_coverage[]) follows the method's layer-1
 * "Coverage" step item by item; each item says how an instance shows it,
 * and an item only some classes can show applies to the classes whose row
 * names it (qc_class.coverage, with the class's own words, the contract
 * that makes it apply and the class's facts from the data: the model
 * names no class). The execution modes (recompute, autocast,
 * CUDA Graph, gradient accumulation, shared parameters) are shown by a dump
 * written in that mode whose mode checks passed (engine/modes.h); the
 * parallel reduction by a sharded dump. Until then a report names them as
 * missing instead of passing over them. */
#ifndef QC_MODINFO_H
#define QC_MODINFO_H

#include <stddef.h>
#include <stdint.h>

#include "model/module.h"

#define QC_MI_TENSORS 16
#define QC_MI_DY 8

typedef enum {
  QC_COV_DECODE = 0,   /* one token */
  QC_COV_LARGE_M,      /* >= QC_COV_LARGE tokens */
  QC_COV_CONTEXTS,     /* several sequence lengths (per class, from the instances) */
  QC_COV_UNALIGNED,    /* a token or feature count off the alignment */
  QC_COV_MASK,         /* padding, packing or a mask */
  QC_COV_DY_RANDOM,
  QC_COV_DY_ZERO,
  QC_COV_DY_SPARSE,
  QC_COV_DY_REAL,      /* dY from a real training step (a dump's grad_out/) */
  QC_COV_EXTREMES,     /* zeros and extreme values */
  QC_COV_SCALES,       /* different scales */
  QC_COV_THRESHOLD,    /* both sides of the threshold (clipped STE, clamp) */
  QC_COV_SATURATION,   /* values in the saturation region */
  QC_COV_MOE_EMPTY,    /* an expert no token is routed to */
  QC_COV_MOE_REPEAT,   /* a token routed to one expert twice */
  QC_COV_MOE_SHARED,   /* shared experts */
  QC_COV_TIES,         /* top-k ties */
  QC_COV_TARGET,       /* the trainer's own gradients in its dtype/layout (candidate = dump) */
  QC_COV_SHARED_PARAMS,/* gradient accumulation across use sites */
  QC_COV_RECOMPUTE,
  QC_COV_AUTOCAST,
  QC_COV_CUDA_GRAPH,
  QC_COV_GRAD_ACCUM,
  QC_COV_PARALLEL,     /* the actual parallel reduction */
  QC_COV_COUNT
} qc_cov;

#define QC_COV_LARGE 1024  /* tokens from which M counts as large (prefill / training) */

typedef struct qc_cov_item {
  const char *id;       /* "decode": the JSON name */
  const char *label;    /* the method's words */
  int per_class;        /* 1: applies to the classes whose row names it (qc_class.coverage); 0: to every class */
  const char *how;      /* how an instance shows it, or why it cannot (a per-class item: the words
                           before the classes' own; NULL: theirs alone) */
  int integration;      /* 1: a module-level audit cannot observe it */
} qc_cov_item;

extern const qc_cov_item qc_coverage[QC_COV_COUNT];
/* The item called id, or -1. */
int qc_cov_find(const char *id);
/* 1 when item c applies to class cls under the contract (its JSON, or
 * NULL: judged by the class alone): an item of every class, or one the
 * class's row names whose condition the contract meets (a threshold needs
 * one set). A class the registry does not know gets the items of every
 * class only. */
int qc_cov_applies(int c, const char *cls, const char *contract_json);
/* How item c is shown, into buf: its words, and for a per-class item each
 * class's own ("<class>: <words>", "; "-separated) over cls[0..n) (cls
 * NULL: every class of the registry that names it). */
void qc_cov_how(int c, const char *const *cls, int n, char *buf, size_t size);
/* The entry of class `cls`'s row for item c, or NULL. */
const qc_class_cov *qc_cov_class_item(const qc_class *cls, int c);

/* Helpers for the classes' facts (cov_facts, cov_tokens, applies):
 * qc_cov_num: the number after "key": in a contract's JSON text (0 when
 * absent or cj NULL). qc_cov_values: t decoded to float64 (float tensors
 * only; malloc'd, *n its length), NULL otherwise. qc_cov_ids: integer t as
 * int64 (malloc'd), NULL when not integers. qc_cov_limit: t's values on
 * both sides of limit L (QC_COV_THRESHOLD) and beyond it
 * (QC_COV_SATURATION) into *cover; nothing for L <= 0 or t NULL. */
double qc_cov_num(const char *cj, const char *key);
double *qc_cov_values(const qc_tensor *t, int64_t *n);
int64_t *qc_cov_ids(const qc_tensor *t, int64_t *n);
void qc_cov_limit(const qc_tensor *t, double L, uint32_t *cover);

typedef struct qc_mi_tensor {
  char role[8];               /* "inputs", "params", "saved" */
  char name[QC_NAMELEN];
  char dtype[24];
  int ndim;
  int64_t shape[QC_MAXDIM];
} qc_mi_tensor;

typedef struct qc_mi_dy {
  char name[QC_NAMELEN];
  char kind[16];              /* random, zero, sparse, ones (generated), dump */
  double nonzero;             /* fraction of non-zero elements */
} qc_mi_dy;

typedef struct qc_modinfo {
  char module[QC_PATHLEN];
  char cls[64];
  char source[12];            /* "generated" | "dump" */
  char candidate[12];         /* "builtin" | "dump" | "plugin" */
  char values[24];            /* generated values: "normal", "special", "heavy_tail"; "" for a dump */
  char contract[1024];        /* validated, as JSON */
  int64_t tokens;             /* token rows */
  int64_t seqlen;             /* sequence length (0: the class has none) */
  int nt;
  qc_mi_tensor t[QC_MI_TENSORS];
  int ndy;
  qc_mi_dy dy[QC_MI_DY];
  uint32_t cover;             /* 1 << QC_COV_* */
  int first, nchecks;         /* its checks in the result list */
  double seconds;             /* wall time of its audit */
} qc_modinfo;

typedef struct qc_modinfos {
  int n, cap;
  qc_modinfo *v;
} qc_modinfos;

/* Describe module m (cls, contract, tensors and dYs set) into mi: shapes,
 * dY kinds and fractions, token count, and the coverage items its data
 * shows. source/candidate/values as the run had them (values NULL for a
 * dump). QC_OK or QC_ESYS. */
int qc_modinfo_fill(qc_modinfo *mi, const qc_module *m, const char *source, const char *candidate, const char *values);
/* The coverage items m's data shows, given mi's shapes, contract and
 * values (coverage.c; used by qc_modinfo_fill). */
void qc_cov_facts(const qc_module *m, const qc_modinfo *mi, uint32_t *cover);
/* Token rows and sequence length (0: none) of m, as its class lays them out. */
void qc_cov_tokens(const qc_module *m, int64_t *tokens, int64_t *seqlen);
int qc_modinfos_add(qc_modinfos *l, const qc_modinfo *mi);
void qc_modinfos_free(qc_modinfos *l);

#endif
