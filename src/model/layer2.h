/* layer2.h: layer 2's results, as every report shows them: one row per
 * (module or expert, dY, tensor, precision combination), the class
 * summaries with their outliers, and the options the sweep ran under. The
 * sweep (src/sweep/) fills them; report/ writes them. */
#ifndef QC_LAYER2_H
#define QC_LAYER2_H

#include <stdint.h>

#include "model/module.h"
#include "numerics/metrics.h"

#define QC_FMTLEN 32
#define QC_SWEEP_MAXFMT 16

/* One row: one module (or expert), dY, tensor and format. */
typedef struct qc_crow {
  char module[QC_PATHLEN];  /* group path; routed experts get ".<e>" after "experts" */
  char cls[QC_PATHLEN];     /* module with layer and expert index replaced by "*" */
  int layer;                /* -1: none */
  int expert;               /* -1: not a routed expert */
  char wfmt[QC_FMTLEN];     /* the weight format; "none" on d_weight rows of a --weight-format sweep,
                               and on a layer deployed unquantized */
  char afmt[QC_FMTLEN];     /* "none" on d_x rows of a --weight-format sweep */
  char wfmt_why[200];       /* deployed mode: where the layer's weight format came from */
  char dy[QC_NAMELEN];      /* grad_out dataset name, or "generated" */
  char profile[32];         /* the quantizer profile the module ran under */
  char profile_why[480];    /* where it came from */
  const char *tensor;       /* "d_x" or "d_weight" */
  int64_t shape[2];
  qc_metrics m;
  int outlier;
  char outlier_why[160];
  int fail;
  char why[160];
} qc_crow;

/* One class summary: rows of one (class, tensor, wfmt, afmt). */
typedef struct qc_cclass {
  char cls[QC_PATHLEN];
  const char *tensor;
  char wfmt[QC_FMTLEN], afmt[QC_FMTLEN];
  int rows, layers, outliers, fails;
  double cos_min, cos_med, cos_max;   /* over rows with a defined cosine (NAN if none) */
  double nr_min, nr_med, nr_max;
  double rel_med;
  int first, combo_first;             /* first row of the class / of its (tensor, formats): table order */
} qc_cclass;

typedef struct qc_sweep_opts {
  const char *modules;                 /* regex on group paths (NULL: all) */
  int nw, na;
  const char *wfmt[QC_SWEEP_MAXFMT];   /* weight formats for d_x rows */
  const char *afmt[QC_SWEEP_MAXFMT];   /* activation formats for d_weight rows ("none" entries skipped) */
  int deployed;                        /* 1: each layer's own deployed format (the plan's), crossed with
                                          every activation format; 0: every layer under each of wfmt;
                                          -1 (given to the sweep): 1 when the input declares deployed
                                          formats, else 0 */
  const char *qconfig;                 /* a checkpoint's config.json with its quantization_config (NULL: none) */
  const char *profile;                 /* --profile (NULL or "auto": per module, see qc_sweep_plan_profile) */
  int64_t tokens;                      /* M of a generated dY */
  uint64_t seed;                       /* seed of generated dY / X */
  int has_cos_min, has_norm;           /* thresholds */
  double cos_min, norm_lo, norm_hi;
  int progress;                        /* progress line on stderr */
} qc_sweep_opts;

typedef struct qc_sweep {
  qc_crow *rows;
  int n, cap;
  qc_cclass *cls;
  int ncls;
  int modules, expert_groups, units;   /* linear groups, of which routed-expert groups; units = rows' modules */
  int dy_generated, x_generated;       /* any generated dY / X */
  int dy_dumped;                       /* any dY from a dump's grad_out/ */
  int deployed;                        /* rows under each layer's deployed format (qc_sweep_opts.deployed) */
  int unquantized;                     /* deployed mode: units of layers deployed unquantized */
  char wsource[200];                   /* deployed mode: where the formats came from */
  int ahead;                           /* units prepared ahead on worker threads (0: one unit in memory) */
  int in_flight;                       /* units on the backend at once: 2 when a device runs one while the next is queued */
  /* seconds: generating dY/X; reading units (summed over the readers);
   * waiting for a unit to be read; in the quantizer, GEMM and metrics calls
   * (the work itself on the CPU, queueing it on a device); the main thread
   * queueing units (those calls and the host's work between them); waiting
   * for the backend to finish each unit; the whole sweep */
  double t_gen, t_read, t_wait, t_quant, t_gemm, t_metrics, t_queue, t_sync, t_total;
  double gemm_flops;                   /* 2 M N K summed over the GEMMs done */
  /* over the ranks of an MPI job (1 in one process): the t_* above are
   * then the slowest rank's; each rank's time from the plan to its last
   * row (fastest, slowest), and rank 0's time in the agreement and the
   * gather of the rows (waiting for the slowest rank included) */
  int ranks;
  double t_rank_min, t_rank_max, t_merge;
  double gemm_flops_rank_max;          /* the GEMM work of the rank with the most */
} qc_sweep;

/* The outlier rule (docs/contract.md): within each (class, tensor, wfmt,
 * afmt) of at least QC_OUTLIER_MIN_ROWS rows, a row is an outlier when its
 * log10(rel_l2) is more than QC_OUTLIER_Z robust standard deviations
 * (1.4826 MAD, floored at QC_OUTLIER_LOG_FLOOR decades) from the class
 * median, or its norm ratio more than QC_OUTLIER_Z of max(1.4826 MAD,
 * 0.1 x median rel_l2) from the class median norm ratio. */
#define QC_OUTLIER_MIN_ROWS 4
#define QC_OUTLIER_Z 3.5
#define QC_OUTLIER_LOG_FLOOR 0.05

void qc_sweep_free(qc_sweep *s);

#endif
