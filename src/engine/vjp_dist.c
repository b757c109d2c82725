/* vjp_dist.c: layer 1 over the ranks of an MPI job (vjp.h): which rank runs
 * which unit, and the merge of every rank's checks and module facts on
 * rank 0 in unit order, so that its reports are those of one process. */
#include <stdlib.h>
#include <string.h>

#include "core/qc.h"
#include "dist/dist.h"
#include "engine/vjp.h"

int qc_vjp_units(int n, int **owner) { return qc_vjp_units_split(n, NULL, owner); }

int qc_vjp_units_split(int n, const char *split, int **owner) {
  double *cost = qc_calloc((size_t)(n > 0 ? n : 1), sizeof *cost, "unit costs");
  *owner = qc_calloc((size_t)(n > 0 ? n : 1), sizeof **owner, "unit owners");
  if (!cost || !*owner) {
    free(cost);
    free(*owner);
    *owner = NULL;
    return QC_ESYS;
  }
  int m = 0;
  for (int i = 0; i < n; i++) cost[i] = 1; /* equal costs: round robin */
  for (int i = 0; i < n; i++) m += !(split && split[i]);
  int rc = qc_dist_assign(cost, m, *owner); /* the units of one rank, compacted */
  for (int i = n - 1, j = m - 1; !rc && i >= 0; i--) (*owner)[i] = split && split[i] ? -1 : (*owner)[j--];
  free(cost);
  if (rc) {
    free(*owner);
    *owner = NULL;
  }
  return rc;
}

/* What a rank sends: its module facts (one per unit it ran, in unit
 * order), then its checks. */
typedef struct part_head {
  int nmods, nchecks;
} part_head;

/* This rank's part as one byte buffer (malloc'd into *buf, *n bytes). */
static int pack(const qc_audit *a, char **buf, size_t *n) {
  part_head h = {a->info->n, a->res->n};
  *n = sizeof h + (size_t)h.nmods * sizeof(qc_modinfo) + (size_t)h.nchecks * sizeof(qc_check);
  if (!(*buf = qc_malloc(*n, "results to send to rank 0"))) return QC_ESYS;
  memcpy(*buf, &h, sizeof h);
  if (h.nmods) memcpy(*buf + sizeof h, a->info->v, (size_t)h.nmods * sizeof(qc_modinfo));
  if (h.nchecks) memcpy(*buf + sizeof h + (size_t)h.nmods * sizeof(qc_modinfo), a->res->v, (size_t)h.nchecks * sizeof(qc_check));
  return QC_OK;
}

/* Rank 0: the ranks' parts (all, lens[r] bytes each) into a->res and
 * a->info in unit order: unit u is the next module of rank owner[u]. */
static int unpack(qc_audit *a, const char *all, const size_t *lens, int size, const int *owner, int nunits) {
  int rc = QC_OK;
  const char **at = qc_calloc((size_t)size, sizeof *at, "rank parts");
  int *next = qc_calloc((size_t)size, sizeof *next, "rank parts");
  if (!at || !next) { rc = QC_ESYS; goto done; }
  for (int r = 0, off = 0; r < size; off += (int)lens[r], r++) {
    at[r] = all + off;
    if (lens[r] < sizeof(part_head)) { rc = qc_err_sys("rank %d sent %zu bytes of results: fewer than a header", r, lens[r]); goto done; }
    part_head h;
    memcpy(&h, at[r], sizeof h);
    if (lens[r] != sizeof h + (size_t)h.nmods * sizeof(qc_modinfo) + (size_t)h.nchecks * sizeof(qc_check)) {
      rc = qc_err_sys("rank %d sent %zu bytes of results for %d module(s) and %d check(s)", r, lens[r], h.nmods, h.nchecks);
      goto done;
    }
  }
  qc_results res = {0};
  qc_modinfos info = {0};
  for (int u = 0; u < nunits && !rc; u++) {
    int r = owner[u] < 0 ? 0 : owner[u]; /* a split unit: rank 0 holds its checks */
    part_head h;
    memcpy(&h, at[r], sizeof h);
    if (next[r] >= h.nmods) { rc = qc_err_sys("rank %d sent %d module(s): fewer than the units it owns", r, h.nmods); break; }
    qc_modinfo mi;
    memcpy(&mi, at[r] + sizeof h + (size_t)next[r]++ * sizeof mi, sizeof mi);
    const char *checks = at[r] + sizeof h + (size_t)h.nmods * sizeof(qc_modinfo);
    if (mi.first < 0 || mi.nchecks < 0 || mi.first + mi.nchecks > h.nchecks) {
      rc = qc_err_sys("rank %d: module '%s' names checks %d..%d of %d", r, mi.module, mi.first, mi.first + mi.nchecks, h.nchecks);
      break;
    }
    int first = res.n;
    for (int k = 0; k < mi.nchecks && !rc; k++) {
      qc_check c;
      memcpy(&c, checks + (size_t)(mi.first + k) * sizeof c, sizeof c);
      rc = qc_results_add(&res, &c);
    }
    mi.first = first;
    if (!rc) rc = qc_modinfos_add(&info, &mi);
  }
  if (rc) {
    qc_results_free(&res);
    qc_modinfos_free(&info);
    goto done;
  }
  qc_results_free(a->res);
  qc_modinfos_free(a->info);
  *a->res = res;
  *a->info = info;
done:
  free(at);
  free(next);
  return rc;
}

int qc_vjp_merge(qc_audit *a, int rc, long long at, int nunits) {
  if (!qc_dist_active()) return rc;
  char *mine = NULL;
  void *all = NULL;
  size_t n = 0, *lens = NULL;
  int *owner = NULL;
  const int size = qc_dist_size();
  if (!rc && !a->info) rc = qc_err_sys("vjp over several ranks needs the module facts (qc_audit.info)");
  if (!rc) rc = pack(a, &mine, &n);
  if (!rc && !(lens = qc_calloc((size_t)size, sizeof *lens, "result sizes"))) rc = QC_ESYS;
  if (!rc) rc = qc_vjp_units_split(nunits, a->split, &owner); /* nunits: the same on every rank (one case, one dump) */
  if ((rc = qc_dist_agree(rc, at))) goto done; /* every rank ran its units, or every rank stops here */
  if ((rc = qc_dist_gather(mine, n, &all, lens))) goto done;
  if (qc_dist_rank() == 0) rc = unpack(a, all, lens, size, owner, nunits);
done:
  free(mine);
  free(all);
  free(lens);
  free(owner);
  return rc;
}
