/* ranks.c: layer 2 over the ranks of an MPI job (plan.h): who runs which
 * plan, and the merge of every rank's rows on rank 0 in plan order, so
 * that the summary, the outliers and the reports are those of one
 * process. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/qc.h"
#include "dist/dist.h"
#include "sweep/plan.h"

int qc_sweep_owners(const sw_plan *plans, int nplan, int *owner) {
  double *cost = calloc((size_t)(nplan > 0 ? nplan : 1), sizeof *cost);
  if (!cost) return qc_err_sys("out of memory");
  for (int i = 0; i < nplan; i++) {
    double m = 0;
    for (int j = 0; j < plans[i].ndy; j++) m += (double)plans[i].dy[j].M;
    /* the GEMMs' work: E N K per token of every dY (d_x and d_weight alike) */
    cost[i] = (double)plans[i].E * (double)plans[i].N * (double)plans[i].K * (m > 0 ? m : 1);
  }
  int rc = qc_dist_assign(cost, nplan, owner);
  free(cost);
  return rc;
}

/* What a rank sends ahead of its rows. */
typedef struct part_head {
  int nrows, nplans, dy_generated, x_generated;
  double t_gen, t_read, t_wait, t_quant, t_gemm, t_metrics, t_queue, t_sync, t_total, gemm_flops;
} part_head;

/* Rows travel with their tensor as an index (a pointer means nothing on
 * another rank); after the head: nplans row counts, then the rows. */
static int pack(const qc_sweep *loc, int nplans, const int *plan_end, char **buf, size_t *n) {
  part_head h = {loc->n, nplans, loc->dy_generated, loc->x_generated, loc->t_gen, loc->t_read, loc->t_wait, loc->t_quant,
                 loc->t_gemm, loc->t_metrics, loc->t_queue, loc->t_sync, loc->t_total, loc->gemm_flops};
  *n = sizeof h + (size_t)nplans * sizeof(int) + (size_t)loc->n * sizeof(qc_crow);
  char *b = *buf = malloc(*n);
  if (!b) return qc_err_sys("out of memory packing %d contract rows for rank 0", loc->n);
  memcpy(b, &h, sizeof h);
  int *cnt = (int *)(b + sizeof h);
  for (int k = 0; k < nplans; k++) cnt[k] = plan_end[k] - (k ? plan_end[k - 1] : 0);
  char *rows = b + sizeof h + (size_t)nplans * sizeof(int); /* not aligned for a qc_crow: copied bytewise */
  for (int i = 0; i < loc->n; i++) {
    qc_crow w = loc->rows[i];
    w.tensor = (const char *)(uintptr_t)(loc->rows[i].tensor == qc_sweep_t_dw);
    memcpy(rows + (size_t)i * sizeof w, &w, sizeof w);
  }
  return QC_OK;
}

/* Rank 0: the parts (all, lens[r] bytes each) into s in plan order: plan i
 * is the next plan of rank owner[i]. */
static int unpack(qc_sweep *s, const char *all, const size_t *lens, int size, const int *owner, int nplan) {
  int rc = QC_OK, total = 0;
  const char **at = calloc((size_t)size, sizeof *at);
  int *next = calloc((size_t)size, sizeof *next), *row = calloc((size_t)size, sizeof *row);
  if (!at || !next || !row) { rc = qc_err_sys("out of memory merging contract rows"); goto done; }
  size_t off = 0;
  for (int r = 0; r < size; off += lens[r], r++) {
    part_head h;
    at[r] = all + off;
    if (lens[r] < sizeof h) { rc = qc_err_sys("rank %d sent %zu bytes of rows: fewer than a header", r, lens[r]); goto done; }
    memcpy(&h, at[r], sizeof h);
    if (lens[r] != sizeof h + (size_t)h.nplans * sizeof(int) + (size_t)h.nrows * sizeof(qc_crow)) {
      rc = qc_err_sys("rank %d sent %zu bytes for %d plan(s) and %d row(s)", r, lens[r], h.nplans, h.nrows);
      goto done;
    }
    total += h.nrows;
    s->dy_generated |= h.dy_generated;
    s->x_generated |= h.x_generated;
#define SLOWEST(f) if (h.f > s->f) s->f = h.f
    SLOWEST(t_gen); SLOWEST(t_read); SLOWEST(t_wait); SLOWEST(t_quant); SLOWEST(t_gemm); SLOWEST(t_metrics); SLOWEST(t_queue); SLOWEST(t_sync);
#undef SLOWEST
    s->gemm_flops += h.gemm_flops;
    if (h.gemm_flops > s->gemm_flops_rank_max) s->gemm_flops_rank_max = h.gemm_flops;
    if (r == 0 || h.t_total < s->t_rank_min) s->t_rank_min = h.t_total;
    if (h.t_total > s->t_rank_max) s->t_rank_max = h.t_total;
  }
  if (!(s->rows = malloc((size_t)(total > 0 ? total : 1) * sizeof *s->rows))) { rc = qc_err_sys("out of memory for %d contract rows", total); goto done; }
  s->cap = total;
  s->n = 0;
  for (int i = 0; i < nplan; i++) {
    const int r = owner[i];
    part_head h;
    memcpy(&h, at[r], sizeof h);
    if (next[r] >= h.nplans) { rc = qc_err_sys("rank %d sent rows of %d plan(s): fewer than it owns", r, h.nplans); goto done; }
    int cnt;
    memcpy(&cnt, at[r] + sizeof h + (size_t)next[r]++ * sizeof(int), sizeof cnt);
    if (cnt < 0 || row[r] + cnt > h.nrows) { rc = qc_err_sys("rank %d: a plan's %d row(s) run past its %d", r, cnt, h.nrows); goto done; }
    const char *src = at[r] + sizeof h + (size_t)h.nplans * sizeof(int) + (size_t)row[r] * sizeof(qc_crow);
    for (int k = 0; k < cnt; k++) {
      qc_crow *w = &s->rows[s->n++];
      memcpy(w, src + (size_t)k * sizeof *w, sizeof *w);
      w->tensor = (uintptr_t)w->tensor ? qc_sweep_t_dw : qc_sweep_t_dx;
    }
    row[r] += cnt;
  }
done:
  free(at);
  free(next);
  free(row);
  return rc;
}

/* The sums a rank's rows hold, per tensor (d_x, d_weight): rows, sum of
 * ||r||^2 and of ||g - r||^2. */
#define NSUMS 6
static void row_sums(const qc_crow *rows, int n, double *v) {
  memset(v, 0, NSUMS * sizeof *v);
  for (int i = 0; i < n; i++) {
    double *t = v + 3 * (rows[i].tensor == qc_sweep_t_dw);
    t[0] += 1;
    t[1] += rows[i].m.norm_r * rows[i].m.norm_r;
    t[2] += rows[i].m.norm_diff * rows[i].m.norm_diff;
  }
}

/* The metric sums of every rank's rows all-reduced on the backend (NCCL
 * on a device with collectives, MPI through the host otherwise), checked
 * on rank 0 against the same sums over the rows it gathered: a unit lost
 * or counted twice by the merge is a system error, not a report. */
static int cross_check(const qc_backend *be, const qc_sweep *s, const qc_sweep *loc) {
  double mine[NSUMS], all[NSUMS];
  void *buf = NULL;
  int rc;
  row_sums(loc->rows, loc->n, mine);
  if ((rc = be->buf_alloc(be, sizeof mine, "metric sums", &buf))) return rc;
  if (!(rc = be->upload(be, buf, mine, sizeof mine)) && !(rc = qc_dist_allreduce(be, buf, NSUMS, QC_F64)) &&
      !(rc = be->download(be, mine, buf, sizeof mine)))
    rc = be->sync(be);
  be->buf_free(be, buf);
  if (rc || qc_dist_rank() != 0) return rc;
  row_sums(s->rows, s->n, all);
  for (int k = 0; k < NSUMS; k++)
    if (fabs(all[k] - mine[k]) > 1e-9 * fmax(fabs(all[k]), 1e-300))
      return qc_err_sys("the merge of the ranks' rows: sum %d is %.17g over the gathered rows but %.17g all-reduced over the "
                        "ranks: a unit lost or counted twice", k, all[k], mine[k]);
  if (qc_verbose)
    fprintf(stderr, "qatcheck: contract: %d rank(s): d_x %g rows, rel_l2 %.6g overall; d_weight %g rows, rel_l2 %.6g overall "
            "(all-reduced%s)\n", qc_dist_size(), mine[0], sqrt(mine[2] / fmax(mine[1], 1e-300)), mine[3],
            sqrt(mine[5] / fmax(mine[4], 1e-300)), be->coll_ready && be->coll_ready(be) ? " through NCCL" : "");
  return QC_OK;
}

int qc_sweep_merge(qc_sweep *s, qc_sweep *loc, const qc_backend *be, const int *owner, int nplan, const int *plan_end,
                   int rc, long long at) {
  s->ranks = qc_dist_size();
  s->ahead = loc->ahead;
  s->in_flight = loc->in_flight;
  if (!qc_dist_active()) { /* one process: its rows are the sweep's */
    if (rc) return rc;
    if (be->coll_ready && be->coll_ready(be) && (rc = cross_check(be, loc, loc))) return rc; /* QATCHECK_NCCL=1 */
    s->rows = loc->rows;
    s->n = loc->n;
    s->cap = loc->cap;
    loc->rows = NULL;
    loc->n = loc->cap = 0;
    s->dy_generated = loc->dy_generated;
    s->x_generated = loc->x_generated;
    s->t_gen = loc->t_gen; s->t_read = loc->t_read; s->t_wait = loc->t_wait; s->t_quant = loc->t_quant;
    s->t_gemm = loc->t_gemm; s->t_metrics = loc->t_metrics; s->t_queue = loc->t_queue; s->t_sync = loc->t_sync;
    s->gemm_flops = s->gemm_flops_rank_max = loc->gemm_flops;
    s->t_rank_min = s->t_rank_max = loc->t_total;
    return QC_OK;
  }
  double t0 = qc_now_s();
  char *mine = NULL;
  void *all = NULL;
  size_t n = 0, *lens = NULL;
  int nmine = 0;
  for (int i = 0; !rc && i < nplan; i++) nmine += owner[i] == qc_dist_rank();
  if (!rc) rc = pack(loc, nmine, plan_end, &mine, &n);
  if (!rc && !(lens = calloc((size_t)s->ranks, sizeof *lens))) rc = qc_err_sys("out of memory");
  if ((rc = qc_dist_agree(rc, at))) goto done; /* every rank ran its plans, or every rank stops here */
  if ((rc = qc_dist_gather(mine, n, &all, lens))) goto done;
  if (qc_dist_rank() == 0) rc = unpack(s, all, lens, s->ranks, owner, nplan);
  /* every rank is past the gather: the all-reduce needs no agreement before it */
  int rc2 = cross_check(be, s, loc);
  if (!rc) rc = rc2;
done:
  s->t_merge = qc_now_s() - t0;
  free(mine);
  free(all);
  free(lens);
  return rc;
}
