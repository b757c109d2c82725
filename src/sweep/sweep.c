/* sweep.c: layer 2 over a checkpoint (see sweep.h): the linear groups of
 * the dump in natural order, every group planned before any data is read,
 * the generated dY and X made once, the units run (pipeline.c), the rows
 * summarized (summary.c). */
#include "sweep/sweep.h"

#include <ctype.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/qc.h"
#include "dist/dist.h"
#include "io/dump.h"
#include "model/case.h"
#include "model/contract.h"
#include "numerics/quant.h"
#include "sweep/plan.h"

/* Natural order of paths: runs of digits compare as numbers, so layer 2
 * comes before layer 10. */
int qc_sweep_cmp_natural(const char *a, const char *b) {
  while (*a && *b) {
    if (isdigit((unsigned char)*a) && isdigit((unsigned char)*b)) {
      while (*a == '0') a++;
      while (*b == '0') b++;
      size_t na = strspn(a, "0123456789"), nb = strspn(b, "0123456789");
      if (na != nb) return na < nb ? -1 : 1;
      int c = strncmp(a, b, na);
      if (c) return c;
      a += na;
      b += nb;
      continue;
    }
    if (*a != *b) return (unsigned char)*a < (unsigned char)*b ? -1 : 1;
    a++;
    b++;
  }
  return (unsigned char)*a - (unsigned char)*b;
}

static int cmp_natural(const void *pa, const void *pb) {
  return qc_sweep_cmp_natural(((const qc_dump_entry *)pa)->path, ((const qc_dump_entry *)pb)->path);
}

int qc_sweep_entries(const sw_entry *ents, int n, const char *what, const qc_backend *be, const qc_sweep_opts *o,
                     qc_sweep *s) {
  sw_gens G = {NULL, 0};
  int rc = QC_OK, nmine = 0, failed = -1;
  int *owner = NULL, *plan_end = NULL, *gidx = NULL;
  sw_plan *mine = NULL;
  qc_sweep loc;
  long long at = -1;
  double t_start = qc_now_s();
  memset(&loc, 0, sizeof loc);
  loc.deployed = s->deployed = o->deployed;
  /* plan every group first: bad input exits before any work */
  sw_plan *plans = calloc((size_t)n, sizeof *plans);
  gidx = calloc((size_t)(n > 0 ? n : 1), sizeof *gidx);
  if (!plans || !gidx) { rc = qc_err_sys("out of memory"); goto merge; }
  for (int i = 0; i < n; i++) {
    if ((rc = qc_sweep_plan_group(&ents[i], o, &plans[i])) ||
        (rc = qc_sweep_plan_profile(ents[i].dump, ents[i].path, o, &plans[i]))) {
      at = i;
      goto merge;
    }
    if (ents[i].profile[0] && (!o->profile || strcmp(o->profile, "auto") == 0)) { /* the quantization config's producer */
      snprintf(plans[i].profile, sizeof plans[i].profile, "%s", ents[i].profile);
      snprintf(plans[i].profile_why, sizeof plans[i].profile_why, "the checkpoint's quantization config");
    }
    if (o->deployed && strcmp(plans[i].wfmt, "none") == 0) s->unquantized += (int)plans[i].E;
    s->units += (int)plans[i].E;
    for (int j = 0; j < plans[i].ndy; j++) s->dy_dumped |= plans[i].dy[j].dset[0] != 0;
    s->expert_groups += plans[i].experts;
  }
  s->modules = n;

  /* this rank's plans (every plan in one process) */
  if (!(owner = calloc((size_t)n, sizeof *owner)) || !(mine = calloc((size_t)n, sizeof *mine)) ||
      !(plan_end = calloc((size_t)n, sizeof *plan_end))) {
    rc = qc_err_sys("out of memory");
    goto merge;
  }
  if ((rc = qc_sweep_owners(plans, n, owner))) goto merge;
  for (int i = 0; i < n; i++)
    if (owner[i] == qc_dist_rank()) {
      gidx[nmine] = i;
      mine[nmine++] = plans[i];
      loc.units += (int)plans[i].E;
    }

  /* the generated dY and X of its plans, one per shape */
  for (int i = 0; i < nmine; i++) {
    sw_plan *g = &mine[i];
    for (int j = 0; j < g->ndy; j++) {
      sw_src *y = &g->dy[j];
      if (!y->dset[0]) {
        if ((rc = qc_sweep_gen_index(&G, "dy", y->M, g->N, &y->gen))) goto merge;
        loc.dy_generated = 1;
      }
      if (g->need_x && !g->x.dset[0]) {
        if ((rc = qc_sweep_gen_index(&G, "x", y->M, g->K, &y->xgen))) goto merge;
        loc.x_generated = 1;
      }
    }
  }
  double t0 = qc_now_s();
  rc = qc_sweep_gen_fill(&G, be, o->seed);
  loc.t_gen = qc_now_s() - t0;
  if (rc) goto merge;
  if (nmine > 0 && (rc = qc_sweep_run_units(be, o, mine, nmine, &G, &loc, plan_end, &failed)) && failed >= 0)
    at = gidx[failed];
merge:
  loc.t_total = qc_now_s() - t_start;
  if ((rc = qc_sweep_merge(s, &loc, be, owner, n, plan_end, rc, at))) goto done;
  if (qc_dist_rank() != 0) goto done; /* rank 0 holds every row */
  if (s->n == 0) { rc = qc_err("%s: nothing to check: the linear groups hold no experts", what); goto done; }
  rc = qc_contract_summarize(s);
done:
  qc_sweep_gen_free(&G, be);
  if (plans)
    for (int i = 0; i < n; i++) free(plans[i].dy);
  free(plans);
  free(mine);
  free(gidx);
  free(owner);
  free(plan_end);
  qc_sweep_free(&loc);
  s->t_total = qc_now_s() - t_start;
  return rc;
}

/* Each module's deployed format from its contract attribute's
 * weight_format (absent or "none": deployed unquantized). With o->deployed
 * -1, deployed mode (oo->deployed 1) when any module declares one. */
static int dump_formats(qc_dump *d, const qc_sweep_opts *o, sw_entry *se, int n, qc_sweep_opts *oo, qc_sweep *s) {
  int rc, declared = 0;
  if (oo->deployed < 0) oo->deployed = 0;
  if (o->deployed == 0) return QC_OK;
  for (int i = 0; i < n; i++) {
    char cj[4096] = "", where[QC_PATHLEN + 32];
    qc_contract c;
    memset(&c, 0, sizeof c);
    qc_err_state es; /* an absent attribute is no error */
    qc_err_save(&es);
    const int have = qc_dump_get_attr(d, se[i].path, "contract", cj, sizeof cj) == QC_OK && cj[0];
    qc_err_restore(&es);
    snprintf(where, sizeof where, "module '%s'", se[i].path);
    if (have && (rc = qc_contract_parse(cj, where, &c))) return rc;
    const char *f = qc_contract_str(&c, "weight_format", "none");
    if (strcmp(f, "none") != 0 && !qc_quant_known(f))
      return qc_err("%s: module '%s': contract weight_format '%s' is not a format of this build's quantizer library",
                    qc_dump_path(d), se[i].path, f);
    declared += strcmp(f, "none") != 0;
    snprintf(se[i].wfmt, sizeof se[i].wfmt, "%s", f);
    snprintf(se[i].wfmt_why, sizeof se[i].wfmt_why, have && qc_contract_has(&c, "weight_format")
                                                         ? "the module's contract weight_format"
                                                         : "no weight_format in the module's contract: deployed unquantized");
  }
  if (!declared) return QC_OK;
  oo->deployed = 1;
  snprintf(s->wsource, sizeof s->wsource, "%s: each module's contract weight_format", qc_dump_path(d));
  return QC_OK;
}

int qc_contract_sweep(qc_dump *d, const qc_backend *be, const qc_sweep_opts *o, qc_sweep *s) {
  qc_dump_entry *ents = NULL;
  sw_entry *se = NULL;
  qc_tsrc src;
  int nent = 0, rc;
  memset(s, 0, sizeof *s);
  qc_tsrc_dump(&src, d);
  if ((rc = qc_dump_modules(d, o->modules, &ents, &nent))) return rc;
  int nlin = 0;
  for (int i = 0; i < nent; i++)
    if (strcmp(ents[i].cls, "linear") == 0) ents[nlin++] = ents[i];
  if (nlin > 1) qsort(ents, (size_t)nlin, sizeof *ents, cmp_natural);
  if (nlin == 0) {
    free(ents);
    if (o->modules && o->modules[0])
      qc_err("%s: no linear module group matches --modules '%s' (%d module group(s) matched)", qc_dump_path(d), o->modules, nent);
    else
      qc_err("%s: no linear module group: expected groups with attribute class = \"linear\"", qc_dump_path(d));
    qc_hint("a linear module is a group with string attribute class=linear holding params/weight [N, K]");
    return QC_EINPUT;
  }
  if (!(se = calloc((size_t)nlin, sizeof *se))) { free(ents); return qc_err_sys("out of memory"); }
  for (int i = 0; i < nlin; i++) {
    snprintf(se[i].path, sizeof se[i].path, "%s", ents[i].path);
    snprintf(se[i].wname, sizeof se[i].wname, "%s/params/weight", ents[i].path);
    se[i].wsrc = se[i].dsrc = &src;
    se[i].dump = d;
  }
  free(ents);
  qc_sweep_opts oo = *o;
  if ((rc = dump_formats(d, o, se, nlin, &oo, s)) == QC_OK) rc = qc_sweep_entries(se, nlin, qc_dump_path(d), be, &oo, s);
  free(se);
  return rc;
}
