/* case.h: a case file (docs/interfaces.md section 3), parsed and validated
 * into a struct. Nothing after the plan reads JSON. */
#ifndef QC_CASE_H
#define QC_CASE_H

#include <stdint.h>

#include "model/contract.h"
#include "model/check.h"
#include "core/tensor.h"

#define QC_MAX_SHAPES 32
#define QC_MAX_DY 32
#define QC_MAX_TOL 64

typedef enum { QC_DATA_GENERATE = 0, QC_DATA_DUMP = 1 } qc_data_kind;
typedef enum { QC_CAND_BUILTIN = 0, QC_CAND_DUMP = 1, QC_CAND_PLUGIN = 2 } qc_cand_kind;

typedef struct qc_case_tol {
  char cls[64];             /* "" for every class, else the class it applies to ("linear") */
  char tensor[QC_NAMELEN];  /* "d_x" */
  qc_tol tol;
} qc_case_tol;

typedef struct qc_case {
  char path[1024];          /* as given */
  char dir[1024];           /* its folder: relative paths resolve here */
  char name[128];
  char sha256[65];
  char module[64];          /* class name ("" = each dump group's own class) */
  qc_contract contract;     /* as declared (not yet validated against a class) */
  int has_contract;
  qc_data_kind data;
  int nshapes;              /* generate */
  int shape_n[QC_MAX_SHAPES];
  int64_t shapes[QC_MAX_SHAPES][QC_MAXDIM];
  uint64_t seed;
  char values[32];          /* "normal" | "special" | "heavy_tail" */
  char dump[1024];          /* dump: resolved path */
  char modules_re[256];     /* dump: module path regex ("" = all) */
  char split_re[256];       /* "split": modules (path regex) every rank runs together, each on a slice */
  int has_split;
  char checkpoint[1024];    /* dump: params/ from this safetensors checkpoint ("" = the dump's) */
  char ckpt_prefix[256];    /* prepended to a module's path (without '/') to name its tensors */
  qc_cand_kind cand;
  char plugin[1024];        /* resolved path */
  char symbol[128];
  unsigned variants_off;    /* "variants": the QC_VAR_* parts the case does not allow (0: every legal one;
                               QC_VAR_ALL: "none", the contract's reference alone) */
  int ndy;                  /* 0 = all (dump) or the default kinds (generate) */
  char dy[QC_MAX_DY][QC_NAMELEN];
  int ntol;
  qc_case_tol tol[QC_MAX_TOL];
  int nweak;                /* tolerances that cannot see a scale error or a sign flip */
  char weak[8192];          /* one line each: "case 'F': tolerances.d_x cannot see ..." */
} qc_case;

/* Read, parse and validate a case file. Unknown keys are refused by name,
 * types checked, every tolerance needs a bound and a reasoning, paths are
 * resolved relative to the case's folder. */
int qc_case_load(const char *path, qc_case *c);
/* Parse a JSON text (a case) already in memory; `where` names it in errors. */
int qc_case_parse(const char *text, const char *where, const char *dir, qc_case *c);
/* Weak tolerances (c->weak): refused with the first one's message and a
 * hint (QC_EINPUT) unless `allow` (--allow-weak-tolerances), when each is
 * printed to stderr as "qatcheck: warning: ..." and QC_OK returned (the
 * caller records c->weak in every report). */
int qc_case_weak(const qc_case *c, int allow);
/* Tolerance declared for a tensor of a module of class cls: the class's own
 * ("tolerances": {"<cls>": {"<tensor>": ...}}), else the default one
 * ("tolerances": {"<tensor>": ...}), else NULL. */
const qc_tol *qc_case_tol_for(const qc_case *c, const char *cls, const char *tensor);

/* Parse a contract JSON object text (a dump's `contract` attribute). */
int qc_contract_parse(const char *json, const char *where, qc_contract *out);

#endif
