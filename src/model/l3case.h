/* l3case.h: the case files of layer 3, parsed and validated into structs
 * (docs/layer3.md): `qatcheck sft --case SFT.json` (the arms, their logs
 * and configs, the window, the expected differences, and per pair of arms
 * the checks, with bounds declared in advance, each with its reasoning) and
 * `qatcheck step --case STEP.json` (the dumps, the arms, frozen parameters,
 * the declared tolerances). Paths resolve against the case's folder.
 * Nothing after the plan reads JSON. */
#ifndef QC_L3CASE_H
#define QC_L3CASE_H

#include <regex.h>
#include <stdint.h>

#include "model/check.h"
#include "model/layer3.h"

#define QC_L3_MAXPAIRS 16
#define QC_L3_MAXTAGS 32
#define QC_L3_MAXKEYS 32
#define QC_L3_MAXEXPECTED 32

/* A log tag (or column) naming a canonical metric: tags {"loss": "lm loss"}. */
typedef struct qc_l3_tag {
  char metric[QC_L3_NAME];
  char tag[QC_L3_NAME];
} qc_l3_tag;

/* A log of another seed, for a noise band. */
typedef struct qc_sft_noise {
  char log[QC_L3_PATH];
  int ntags;                 /* 0: the tags of the pair's second arm */
  qc_l3_tag tags[QC_L3_MAXTAGS];
} qc_sft_noise;

/* The bounds of one check (each optional, at least one declared). */
typedef struct qc_sft_bounds {
  int has_pw_abs, has_pw_rel, has_mean_abs, has_mean_rel, has_equiv, has_noise;
  double pw_abs, pw_rel;     /* |a - b| <= abs + rel |b| at every point */
  double mean_abs, mean_rel; /* |cummean(a - b)| <= abs + rel cummean(|b|), from the 10th point on */
  double eq_delta, eq_alpha; /* TOST: the 1 - 2 alpha interval of the mean difference inside [-delta, delta] */
  uint64_t eq_seed;
  int eq_resamples, eq_block; /* eq_block 0: round(n^(1/3)) */
  double noise_multiple;     /* |a - b| <= k x the noise band of the noise logs */
  int nnoise;
  qc_sft_noise *noise;       /* [nnoise], malloc'd */
  char reasoning[2048];
} qc_sft_bounds;

typedef struct qc_sft_check {
  char metric[QC_L3_NAME];
  int has_window;            /* its own window; else the case's */
  double w0, w1;
  qc_sft_bounds b;
} qc_sft_check;

typedef struct qc_sft_pair {
  int a, b;                  /* arm indices: "a~b" */
  int ncheck;
  qc_sft_check *checks;      /* [ncheck], malloc'd, in the case's order */
} qc_sft_pair;

typedef struct qc_sft_arm {
  char key[QC_L3_NAME];      /* "under_test", "gradient_reference", "native_baseline" */
  char log[QC_L3_PATH];      /* resolved */
  char config[QC_L3_PATH];   /* resolved; "" when none */
  char step_key[QC_L3_NAME]; /* the log's step key ("": the known ones); its noise logs' too */
  int ntags;
  qc_l3_tag tags[QC_L3_MAXTAGS];
  int nkeys;                 /* config key paths (canonical key -> path) */
  struct {
    char key[QC_L3_NAME], path[QC_L3_NAME];
  } keys[QC_L3_MAXKEYS];
} qc_sft_arm;

typedef struct qc_sft_case {
  char path[QC_L3_PATH], dir[QC_L3_PATH];
  char name[128];
  char sha256[65];
  int x_tokens;              /* x axis: 0 step, 1 tokens */
  double w0, w1;             /* the window */
  int has_max_gap;           /* the case declares the longest stretch without a point it accepts */
  double max_gap;            /* on the x axis; else the rule of docs/layer3.md (coverage) */
  int narm;
  qc_sft_arm arms[QC_L3_MAXARMS];
  int nexpected;
  struct {
    char key[QC_L3_NAME];
    char reason[512];
  } expected[QC_L3_MAXEXPECTED];
  int npair;
  qc_sft_pair pairs[QC_L3_MAXPAIRS];
} qc_sft_case;

/* Read, parse and validate an sft case file (unknown keys refused by name,
 * every bound with its reasoning). */
int qc_sft_case_load(const char *path, qc_sft_case *c);
/* The same on JSON text in memory; dir resolves relative paths. */
int qc_sft_case_parse(const char *text, const char *where, const char *dir, qc_sft_case *c);
void qc_sft_case_free(qc_sft_case *c);
/* 1 when key is among the expected differences (*reason set). */
int qc_sft_case_expected(const qc_sft_case *c, const char *key, const char **reason);

/* ---- step ---------------------------------------------------------------------------- */

#define QC_STEP_MAXDUMPS 16
#define QC_STEP_MAXOVER 16
#define QC_STEP_MAXFROZEN 64

/* A declared tolerance set: the bounds (rel_l2, max_abs, cosine_min,
 * norm_ratio) with their reasoning, and per-parameter overrides (the first
 * whose regex matches the parameter's name wins). */
typedef struct qc_step_tolset {
  int declared;
  qc_tol tol;
  int nover;
  struct {
    char re[256];
    qc_tol tol;
  } over[QC_STEP_MAXOVER];
  regex_t rx[QC_STEP_MAXOVER]; /* compiled (POSIX extended) */
} qc_step_tolset;

typedef struct qc_step_case {
  char path[QC_L3_PATH], dir[QC_L3_PATH];
  char name[128];
  char sha256[65];
  int ndump;
  char dump[QC_STEP_MAXDUMPS][QC_L3_PATH];
  int narm;                  /* 0: every arm group found */
  char arms[QC_L3_MAXARMS][QC_L3_NAME];
  int nfrozen;
  char frozen[QC_STEP_MAXFROZEN][QC_PATHLEN];
  qc_step_tolset update, grad_pair, update_pair;
} qc_step_case;

int qc_step_case_load(const char *path, qc_step_case *c);
int qc_step_case_parse(const char *text, const char *where, const char *dir, qc_step_case *c);
void qc_step_case_free(qc_step_case *c);
/* The tolerance that applies to `param` (the first override whose regex
 * matches, else the set's), or NULL when the set is not declared. */
const qc_tol *qc_step_tol_for(const qc_step_tolset *s, const char *param);

#endif
