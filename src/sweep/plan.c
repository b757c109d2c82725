/* plan.c: a module group's plan and the generated dY / X (see plan.h). */
#include "sweep/plan.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/qc.h"
#include "core/rng.h"
#include "engine/deployed.h"
#include "model/case.h"
#include "model/contract.h"
#include "io/dump.h"

/* Master weights, dY and X must decode to real numbers element for element. */
static int check_real(const char *dset, const qc_tensor *info) {
  qc_dtype t = info->dtype;
  if (t == QC_F64 || t == QC_F32 || t == QC_F16 || t == QC_BF16) return QC_OK;
  return qc_err("'%s' has element type %s: expected float64, float32, float16 or bfloat16", dset, qc_dtype_name(t));
}

/* Tokens and width of a dY or X `info` of a group with E experts (E 0: not
 * experts): leading dimensions are tokens ([..., M, W] -> M = their
 * product); an expert group's [E, M, W] is one slice per expert. 0 when the
 * rank is 0. */
static int tokens_of(const qc_tensor *info, int64_t E, int64_t *M, int *per_expert) {
  if (info->ndim < 1) return 0;
  *per_expert = E > 0 && info->ndim == 3 && info->shape[0] == E;
  *M = 1;
  for (int i = *per_expert; i < info->ndim - 1; i++) *M *= info->shape[i];
  return 1;
}

int qc_sweep_plan_group(const sw_entry *e, const qc_sweep_opts *o, sw_plan *g) {
  const char *path = e->path, *file = e->wsrc->path;
  char gdir[DSETLEN], s1[96];
  qc_tensor info = {0};
  int rc;
  memset(g, 0, sizeof *g);
  g->path = path;
  g->wsrc = e->wsrc;
  snprintf(g->wfmt, sizeof g->wfmt, "%s", e->wfmt[0] ? e->wfmt : "none");
  snprintf(g->wfmt_why, sizeof g->wfmt_why, "%s", e->wfmt_why);
  snprintf(g->wdset, sizeof g->wdset, "%s", e->wname);
  if (!qc_tsrc_exists(e->wsrc, g->wdset))
    return e->wsrc == e->dsrc ? qc_err("%s: linear module '%s' has no dataset 'params/weight'", file, path)
                              : qc_err("%s: linear module '%s' has no tensor '%s'", file, path, g->wdset);
  if ((rc = qc_tsrc_info(e->wsrc, g->wdset, &info))) return rc;
  if ((rc = check_real(g->wdset, &info))) return rc;
  if (info.ndim == 3) {
    char tmp[QC_PATHLEN + 16];
    if ((rc = qc_contract_expert_name(path, 0, tmp, sizeof tmp))) return rc;
    g->experts = 1;
    g->E = info.shape[0];
  } else if (info.ndim == 2) {
    g->E = 1;
  } else {
    return qc_err("'%s' is %s: expected a linear weight [N, K] or routed experts [E, N, K]", g->wdset,
                  qc_shape_str(info.ndim, info.shape, s1, sizeof s1));
  }
  g->N = info.shape[info.ndim - 2];
  g->K = info.shape[info.ndim - 1];
  if (g->E < 1 || g->N < 1 || g->K < 1)
    return qc_err("'%s' is %s: expected no empty dimension", g->wdset, qc_shape_str(info.ndim, info.shape, s1, sizeof s1));
  if ((rc = qc_tsrc_locate(e->wsrc, g->wdset, g->experts ? 0 : -1, &g->wloc))) return rc;

  char (*dl_name)[QC_NAMELEN] = NULL;
  int dl_n = 0;
  const int64_t E = g->experts ? g->E : 0;
  snprintf(gdir, sizeof gdir, "%s/grad_out", path);
  if (e->dsrc && (rc = qc_tsrc_list(e->dsrc, gdir, &dl_name, &dl_n))) return rc;
  g->ndy = dl_n ? dl_n : 1;
  g->dy = calloc((size_t)g->ndy, sizeof *g->dy);
  if (!g->dy) { free(dl_name); return qc_err_sys("out of memory"); }
  if (dl_n == 0) {
    snprintf(g->dy[0].name, QC_NAMELEN, "generated");
    g->dy[0].M = o->tokens;
  }
  for (int i = 0; i < dl_n; i++) {
    sw_src *y = &g->dy[i];
    snprintf(y->name, QC_NAMELEN, "%s", dl_name[i]);
    y->src = e->dsrc;
    if (snprintf(y->dset, sizeof y->dset, "%s/%s", gdir, dl_name[i]) >= (int)sizeof y->dset) {
      rc = qc_err("'%s/%s': dataset path too long", gdir, dl_name[i]);
      break;
    }
    if ((rc = qc_tsrc_info(y->src, y->dset, &info)) || (rc = check_real(y->dset, &info))) break;
    qc_shape_str(info.ndim, info.shape, s1, sizeof s1);
    if (!tokens_of(&info, E, &y->M, &y->per_expert)) {
      rc = qc_err("dY '%s' is %s: expected [..., M, %lld]%s", y->dset, s1, (long long)g->N,
                  g->experts ? " or one per expert [E, M, N]" : "");
      break;
    }
    if (info.shape[info.ndim - 1] != g->N) {
      rc = qc_err("dY '%s' is %s: expected width %lld (the out_features of '%s', weight [.., %lld, %lld])", y->dset, s1,
                  (long long)g->N, g->wdset, (long long)g->N, (long long)g->K);
      break;
    }
    if (y->M < 1) { rc = qc_err("dY '%s' is %s: expected at least one token", y->dset, s1); break; }
    if ((rc = qc_tsrc_locate(y->src, y->dset, y->per_expert ? 0 : -1, &y->loc))) break;
  }
  free(dl_name);
  if (rc) return rc;

  for (int i = 0; i < o->na; i++) g->need_x |= strcmp(o->afmt[i], "none") != 0;
  if (!g->need_x) return QC_OK;
  snprintf(g->x.dset, sizeof g->x.dset, "%s/inputs/x", path);
  if (!e->dsrc || !qc_tsrc_exists(e->dsrc, g->x.dset)) {
    g->x.dset[0] = 0;
    snprintf(g->x.name, QC_NAMELEN, "generated");
    return QC_OK;
  }
  snprintf(g->x.name, QC_NAMELEN, "x");
  g->x.src = e->dsrc;
  if ((rc = qc_tsrc_info(g->x.src, g->x.dset, &info)) || (rc = check_real(g->x.dset, &info))) return rc;
  qc_shape_str(info.ndim, info.shape, s1, sizeof s1);
  if (!tokens_of(&info, E, &g->x.M, &g->x.per_expert) || info.shape[info.ndim - 1] != g->K)
    return qc_err("input '%s' is %s: expected [..., M, %lld]%s", g->x.dset, s1, (long long)g->K,
                  g->experts ? " or one per expert [E, M, K]" : "");
  if ((rc = qc_tsrc_locate(g->x.src, g->x.dset, g->x.per_expert ? 0 : -1, &g->x.loc))) return rc;
  for (int i = 0; i < g->ndy; i++)
    if (g->dy[i].M != g->x.M)
      return qc_err("input '%s' has %lld tokens but dY '%s' has %lld: expected the same M", g->x.dset,
                    (long long)g->x.M, g->dy[i].dset[0] ? g->dy[i].dset : "generated", (long long)g->dy[i].M);
  return QC_OK;
}

int qc_sweep_plan_profile(qc_dump *d, const char *path, const qc_sweep_opts *o, sw_plan *g) {
  char cj[4096] = "", where[QC_PATHLEN + 32], ds[DSETLEN];
  qc_contract c;
  int rc;
  memset(&c, 0, sizeof c);
  if (o->profile && strcmp(o->profile, "auto") != 0) {
    snprintf(g->profile, sizeof g->profile, "%s", o->profile);
    snprintf(g->profile_why, sizeof g->profile_why, "--profile");
    return QC_OK;
  }
  if (!d) { /* a checkpoint: master weights, no contract, no deployed bytes */
    snprintf(g->profile, sizeof g->profile, "vllm");
    snprintf(g->profile_why, sizeof g->profile_why, "default: no deployed bytes to identify a producer from");
    return QC_OK;
  }
  snprintf(where, sizeof where, "module '%s'", path);
  qc_err_state es; /* an absent attribute is no error */
  qc_err_save(&es);
  const int have = qc_dump_get_attr(d, path, "contract", cj, sizeof cj) == QC_OK && cj[0];
  qc_err_restore(&es);
  if (have && (rc = qc_contract_parse(cj, where, &c))) return rc;
  const char *pn = qc_contract_str(&c, "profile", "auto"), *fn = qc_contract_str(&c, "weight_format", "none");
  if (strcmp(pn, "auto") != 0) {
    qc_qprof p;
    if ((rc = qc_qprof_parse(pn, &p))) return rc;
    snprintf(g->profile, sizeof g->profile, "%s", pn);
    snprintf(g->profile_why, sizeof g->profile_why, "the module's contract");
    return QC_OK;
  }
  snprintf(g->profile, sizeof g->profile, "vllm");
  snprintf(ds, sizeof ds, "%s/saved/weight_q", path);
  if (strcmp(fn, "none") == 0 || !qc_dump_exists(d, ds)) {
    snprintf(g->profile_why, sizeof g->profile_why, "default: no deployed bytes to identify a producer from");
    return QC_OK;
  }
  /* auto: the producer the deployed bytes identify */
  qc_qfmt f;
  qc_module m;
  char cj2[4096];
  qc_identify *idf = NULL;
  qc_sr sr;
  memset(&m, 0, sizeof m);
  if ((rc = qc_qfmt_parse(fn, &f))) return rc;
  if ((rc = qc_dump_load_module(d, path, 0, &m, cj2, sizeof cj2))) goto done;
  if (!(idf = qc_calloc(1, sizeof *idf, "profile identification"))) { rc = QC_ESYS; goto done; }
  if ((rc = qc_sr_from_contract(&c, path, &sr))) goto done;
  if ((rc = qc_deployed_identify_module(&m, f, &sr, idf))) goto done;
  if (idf->any) snprintf(g->profile, sizeof g->profile, "%s", qc_qprof_name((qc_qprof)idf->chosen));
  snprintf(g->profile_why, sizeof g->profile_why, "auto, from the deployed %s bytes: %s%s", fn, idf->why,
           idf->any ? "" : "; vllm used");
done:
  free(idf);
  qc_module_free(&m);
  return rc;
}

/* ---- generated dY and X: one per (what, M, cols), shared by every module of
 * that width (common random numbers across the layers of a class) ---- */

int qc_sweep_gen_index(sw_gens *G, const char *what, int64_t M, int64_t cols, int *idx) {
  for (int i = 0; i < G->n; i++)
    if (!strcmp(G->v[i].what, what) && G->v[i].M == M && G->v[i].cols == cols) { *idx = i; return QC_OK; }
  void *p = realloc(G->v, (size_t)(G->n + 1) * sizeof *G->v);
  if (!p) return qc_err_sys("out of memory");
  G->v = p;
  sw_gen *g = &G->v[G->n];
  memset(g, 0, sizeof *g);
  snprintf(g->what, sizeof g->what, "%s", what);
  g->M = M;
  g->cols = cols;
  *idx = G->n++;
  return QC_OK;
}

int qc_sweep_gen_fill(sw_gens *G, const qc_backend *be, uint64_t seed) {
  int rc;
  for (int i = 0; i < G->n; i++) {
    sw_gen *g = &G->v[i];
    size_t n = (size_t)(g->M * g->cols);
    char label[64];
    if (!(g->host = qc_malloc(n * sizeof(double), "generated dY / X"))) return QC_ESYS;
    qc_rng r;
    snprintf(label, sizeof label, "%lldx%lld", (long long)g->M, (long long)g->cols);
    qc_rng_seed(&r, qc_contract_seed(seed, label, g->what));
    for (size_t k = 0; k < n; k++) g->host[k] = qc_rng_normal(&r);
    if (be->host_memory) { g->buf = g->host; continue; }
    if ((rc = be->buf_alloc(be, n * sizeof(double), "generated dY / X", &g->buf)) ||
        (rc = be->upload(be, g->buf, g->host, n * sizeof(double))))
      return rc;
  }
  return QC_OK;
}

void qc_sweep_gen_free(sw_gens *G, const qc_backend *be) {
  for (int i = 0; i < G->n; i++) {
    if (G->v[i].buf && G->v[i].buf != G->v[i].host) be->buf_free(be, G->v[i].buf);
    free(G->v[i].host);
  }
  free(G->v);
  memset(G, 0, sizeof *G);
}
