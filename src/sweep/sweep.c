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
#include "sweep/plan.h"

/* Natural order of paths: runs of digits compare as numbers, so layer 2
 * comes before layer 10. */
static int cmp_natural(const void *pa, const void *pb) {
  const char *a = ((const qc_dump_entry *)pa)->path, *b = ((const qc_dump_entry *)pb)->path;
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

int qc_contract_sweep(qc_dump *d, const qc_backend *be, const qc_sweep_opts *o, qc_sweep *s) {
  qc_dump_entry *ents = NULL;
  int nent = 0, rc;
  sw_gens G = {NULL, 0};
  double t_start = qc_now_s();
  memset(s, 0, sizeof *s);
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

  /* plan every group first: bad input exits before any work */
  sw_plan *plans = calloc((size_t)nlin, sizeof *plans);
  if (!plans) { rc = qc_err_sys("out of memory"); goto done; }
  for (int i = 0; i < nlin; i++) {
    if ((rc = qc_sweep_plan_group(d, ents[i].path, o, &plans[i])) || (rc = qc_sweep_plan_profile(d, ents[i].path, o, &plans[i])))
      goto done;
    s->units += (int)plans[i].E;
    s->expert_groups += plans[i].experts;
  }
  s->modules = nlin;

  /* the generated dY and X, one per shape */
  for (int i = 0; i < nlin; i++) {
    sw_plan *g = &plans[i];
    for (int j = 0; j < g->ndy; j++) {
      sw_src *y = &g->dy[j];
      if (!y->dset[0]) {
        if ((rc = qc_sweep_gen_index(&G, "dy", y->M, g->N, &y->gen))) goto done;
        s->dy_generated = 1;
      }
      if (g->need_x && !g->x.dset[0]) {
        if ((rc = qc_sweep_gen_index(&G, "x", y->M, g->K, &y->xgen))) goto done;
        s->x_generated = 1;
      }
    }
  }
  double t0 = qc_now_s();
  rc = qc_sweep_gen_fill(&G, be, o->seed);
  s->t_gen = qc_now_s() - t0;
  if (rc) goto done;

  if ((rc = qc_sweep_run_units(d, be, o, plans, nlin, &G, s))) goto done;
  if (s->n == 0) { rc = qc_err("%s: nothing to check: the linear groups hold no experts", qc_dump_path(d)); goto done; }
  rc = qc_contract_summarize(s);
done:
  qc_sweep_gen_free(&G, be);
  if (plans)
    for (int i = 0; i < nlin; i++) free(plans[i].dy);
  free(plans);
  free(ents);
  s->t_total = qc_now_s() - t_start;
  return rc;
}
