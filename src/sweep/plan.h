/* plan.h: inside the sweep, not its API: a module group's plan (its
 * weight, dY and X sources, every shape checked before any data is read),
 * the generated dY and X, and the pipeline that runs the planned units.
 * Every tensor is named in a tensor source (io/tsource.h), so a plan is the
 * same for an HDF5 dump and a safetensors checkpoint. */
#ifndef QC_SWEEP_PLAN_H
#define QC_SWEEP_PLAN_H

#include <stddef.h>
#include <stdint.h>

#include "backend/backend.h"
#include "io/tsource.h"
#include "sweep/sweep.h"

#define DSETLEN (QC_PATHLEN + 160)

/* A dY (or X) source of a module: a dataset, or generated. */
typedef struct sw_src {
  char name[QC_NAMELEN];  /* "dy" or "generated" */
  char dset[DSETLEN];     /* "" when generated */
  const qc_tsrc *src;     /* where dset is */
  int per_expert;         /* 3-D [E, M, *]: slice by expert */
  int64_t M;              /* tokens: the product of the leading dimensions */
  qc_tloc loc;            /* a dataset's bytes (slice 0 when per_expert) */
  int gen;                /* generated: index into the shared generated tensors */
  int xgen;               /* for a dY: its generated X (when X is generated) */
} sw_src;


/* A module to plan: its path (the name in reports), where its weight is,
 * and the source holding its "<path>/grad_out/" and "<path>/inputs/x"
 * (NULL: dY and X are generated). */
typedef struct sw_entry {
  char path[QC_PATHLEN];
  char wname[DSETLEN];
  const qc_tsrc *wsrc;
  const qc_tsrc *dsrc;
  struct qc_dump *dump;   /* the HDF5 dump the module group is in (its contract attribute and
                             deployed bytes choose the profile), NULL for a checkpoint */
  char wfmt[QC_FMTLEN];   /* deployed mode: the module's deployed weight format ("none": unquantized) */
  char wfmt_why[200];     /* where it came from */
  char profile[32];       /* the profile its quantization config names ("": qc_sweep_plan_profile decides) */
} sw_entry;

typedef struct sw_plan {
  const char *path;
  int experts;            /* 1 for a 3-D weight */
  int64_t E, N, K;
  char wdset[DSETLEN];
  const qc_tsrc *wsrc;
  qc_tloc wloc;           /* the weight's bytes (expert 0 when experts) */
  int ndy;
  sw_src *dy;
  sw_src x;                  /* used when activation formats are asked */
  int need_x;
  char wfmt[QC_FMTLEN];      /* deployed mode: the module's weight format ("none": unquantized) */
  char wfmt_why[200];
  char profile[32];          /* the module's quantizer profile (qc_sweep_plan_profile) */
  char profile_why[480];     /* where it came from */
} sw_plan;

/* ---- generated dY and X ---------------------------------------------------------
 * One generated tensor per (what, M, cols), shared by every module of that
 * width: the layers of a class then see the same dY, so their rows differ
 * only by their weights (common random numbers). */

typedef struct sw_gen {
  char what[4];        /* "dy" or "x" */
  int64_t M, cols;
  double *host;        /* [M, cols] N(0, 1) */
  void *buf;           /* the backend's copy (host itself on a host-memory backend) */
} sw_gen;

typedef struct sw_gens {
  sw_gen *v;
  int n;
} sw_gens;

/* Inspect a module group: weight layout, dY sources, X source; every shape
 * checked before any data is read. */
int qc_sweep_plan_group(const sw_entry *e, const qc_sweep_opts *o, sw_plan *g);

/* The module's quantizer profile: --profile; else its contract attribute's
 * `profile`; else (absent or auto), when it holds deployed bytes under a
 * contract weight_format, the first profile that reproduces them; else vllm.
 * Sets g->profile and g->profile_why. */
int qc_sweep_plan_profile(struct qc_dump *d, const char *path, const qc_sweep_opts *o, sw_plan *g);

/* Index of the generated (what, M, cols), added when new. */
int qc_sweep_gen_index(sw_gens *G, const char *what, int64_t M, int64_t cols, int *idx);
/* Fill every generated tensor from its seed and hand it to the backend. */
int qc_sweep_gen_fill(sw_gens *G, const qc_backend *be, uint64_t seed);
void qc_sweep_gen_free(sw_gens *G, const qc_backend *be);

/* Run every unit of the plans (pipeline.c): units u+1 .. u+ahead are read
 * while unit u computes; rows are appended to s and judged. plan_end[i]
 * (nplan entries) gets s->n after plan i's last row; on an error, *failed
 * is the plan whose unit failed (-1: none). */
int qc_sweep_run_units(const qc_backend *be, const qc_sweep_opts *o, const sw_plan *plans, int nplan,
                       const sw_gens *G, qc_sweep *s, int *plan_end, int *failed);

/* The rows' tensor names: a row's tensor points at one of these (the
 * summary compares the pointers). */
extern const char qc_sweep_t_dx[], qc_sweep_t_dw[];

/* ---- over the ranks of an MPI job (ranks.c; docs/distributed.md) ----------
 * Who runs which plan: by longest processing time first on the cost of its
 * GEMMs (E N K times the tokens of its dYs), the same on every rank;
 * owner (nplan entries). */
int qc_sweep_owners(const sw_plan *plans, int nplan, int *owner);
/* After each rank ran its plans into loc (rc its status, at the plan it
 * failed on; plan_end[k] the end of the k-th of its plans' rows): the
 * agreement, then every rank's rows into s on rank 0 in plan order, the
 * timings the slowest rank's, and the rows' metric sums all-reduced on
 * backend be (NCCL on a device) and checked against the gathered rows
 * (collective). In one process, loc's rows move into s (checked the same
 * way when the device has a communicator: QATCHECK_NCCL=1). Returns the
 * agreed status. */
int qc_sweep_merge(qc_sweep *s, qc_sweep *loc, const qc_backend *be, const int *owner, int nplan, const int *plan_end,
                   int rc, long long at);

/* ---- a checkpoint's quantization config (qconfig.c) ------------------------------ */

struct cJSON;
typedef struct sw_qconfig {
  struct cJSON *root;
  const struct cJSON *q;   /* its quantization_config; NULL: none (a master's config) */
  char file[4096];
  char method[32];         /* "fp8" or "compressed-tensors" */
} sw_qconfig;

/* Read config.json `file` (NULL: none): c->q NULL when it has no
 * quantization_config. QC_EINPUT: unreadable, not JSON, a quant_method
 * not read. */
int qc_sweep_qconfig_open(const char *file, sw_qconfig *c);
/* The deployed weight format of module `path` ("none": left unquantized)
 * and where it came from. QC_EINPUT: arguments that fit no format, a
 * pattern that does not compile. */
int qc_sweep_qconfig_format(const sw_qconfig *c, const char *path, char *fmt, size_t fn, char *why, size_t wn);
void qc_sweep_qconfig_close(sw_qconfig *c);

/* Natural order of paths: runs of digits compare as numbers, so layer 2
 * comes before layer 10 (strcmp's sign convention). */
int qc_sweep_cmp_natural(const char *a, const char *b);

/* Plan every entry, make the generated dY and X, run the units and
 * summarize (sweep.c); `what` names the source in messages. */
int qc_sweep_entries(const sw_entry *ents, int n, const char *what, const qc_backend *be, const qc_sweep_opts *o,
                     qc_sweep *s);

#endif
