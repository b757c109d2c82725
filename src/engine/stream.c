/* stream.c: see stream.h. */
#include "engine/stream.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/qc.h"
#include "engine/audit_priv.h"
#include "numerics/metrics.h"

/* The most gradients of one (module, dY) taken in blocks. */
#define QC_STREAMS_MAX 8

typedef struct grad_stream {
  char name[QC_NAMELEN];
  const qc_tensor *g;   /* the candidate */
  qc_dtype held;        /* the precision its values carry (qc_values_dtype_of) */
  qc_cmp_stream *cmp;   /* NULL once finished */
  /* where the squared difference lies, block by block as the reference gave them */
  int64_t rows, blocks, worst, w0, w1; /* the view's rows; blocks so far; the worst block's index and rows */
  double sd, worst_sd;                 /* the squared difference so far, and the worst block's */
} grad_stream;

struct qc_streams {
  qc_grad_sink sink;
  const qc_case *cs;
  const qc_module *m;
  const qc_tset *cand;
  const qc_tensor *one; /* qc_streams_open_one's candidate (cand NULL) */
  qc_dtype one_held;
  int n;
  grad_stream s[QC_STREAMS_MAX];
};

static grad_stream *find(const qc_streams *ss, const char *grad) {
  for (int i = 0; i < ss->n; i++)
    if (strcmp(ss->s[i].name, grad) == 0) return (grad_stream *)&ss->s[i];
  return NULL;
}

/* A qc_grad_sink's begin: taken when the dump holds a float candidate of
 * that shape that the host's compare reads, and the case a tolerance for
 * it (otherwise the whole path judges it, or names what is missing). */
static int sink_begin(const qc_grad_sink *sk, const char *grad, int ndim, const int64_t *shape) {
  qc_streams *ss = sk->arg;
  const qc_tensor *g = ss->cand ? qc_tset_get(ss->cand, grad) : ss->one && strcmp(ss->one->name, grad) == 0 ? ss->one : NULL;
  const qc_tol *t = qc_case_tol_for(ss->cs, ss->m->cls->name, grad);
  if (ss->n == QC_STREAMS_MAX || find(ss, grad) || !g || !t || !qc_compare_host_dtype(g->dtype) || g->ndim != ndim ||
      ndim < 1 || memcmp(g->shape, shape, (size_t)ndim * sizeof *shape) != 0)
    return 0;
  const int64_t n = qc_numel(g), cols = shape[ndim - 1];
  if (n == 0 || cols == 0) return 0;
  grad_stream *s = &ss->s[ss->n];
  qc_check k; /* the precision's words are the caller's: qc_streams_finish sets them again */
  memset(&k, 0, sizeof k);
  s->held = ss->one ? ss->one_held : qc_audit_held_of(g);
  const qc_dtype dt = qc_audit_dtype(g->dtype, s->held, t, &k);
  const int bias = dt == QC_BF16 || dt == QC_F16 || dt == QC_F32 || dt == QC_F64;
  qc_err_state es; /* an offer refused, not an error: out of memory here, the whole path meets it */
  qc_err_save(&es);
  int rc = qc_cmp_open(g, n / cols, cols, dt, bias, &s->cmp);
  qc_err_restore(&es);
  if (rc) return 0;
  snprintf(s->name, sizeof s->name, "%s", grad);
  s->g = g;
  s->rows = n / cols, s->worst = -1;
  ss->n++;
  return 1;
}

static int sink_rows(const qc_grad_sink *sk, const char *grad, int64_t r0, int64_t r1, const double *blk) {
  grad_stream *s = find(sk->arg, grad);
  if (!s || !s->cmp) return qc_err("the reference handed over rows of '%s', which the audit did not take in blocks", grad);
  int rc = qc_cmp_rows(s->cmp, blk, r0, r1);
  if (rc) return rc;
  double sd, sr;
  qc_cmp_sums(s->cmp, &sd, &sr);
  if (sd - s->sd > s->worst_sd) s->worst_sd = sd - s->sd, s->worst = s->blocks, s->w0 = r0, s->w1 = r1;
  s->sd = sd, s->blocks++;
  return QC_OK;
}

int qc_streams_open(const qc_case *cs, const qc_module *m, const qc_tset *cand, qc_streams **out) {
  qc_streams *ss = qc_calloc(1, sizeof *ss, "gradient streams");
  *out = ss;
  if (!ss) return QC_ESYS;
  ss->sink = (qc_grad_sink){.begin = sink_begin, .rows = sink_rows, .arg = ss};
  ss->cs = cs, ss->m = m, ss->cand = cand;
  return QC_OK;
}

int qc_streams_open_one(const qc_case *cs, const qc_module *m, const qc_tensor *g, qc_dtype held, qc_streams **out) {
  int rc = qc_streams_open(cs, m, NULL, out);
  if (!rc) (*out)->one = g, (*out)->one_held = held;
  return rc;
}

int qc_streams_where(const qc_streams *ss, const char *grad, char *buf, size_t n) {
  const grad_stream *s = ss ? find(ss, grad) : NULL;
  if (!s || s->blocks < 2 || s->worst < 0 || !(s->sd > 0)) return 0;
  snprintf(buf, n, "rows [%lld, %lld) of its %lld (block %lld of the %lld the reference handed over) hold %.1f%% of its "
           "squared difference", (long long)s->w0, (long long)s->w1, (long long)s->rows, (long long)s->worst + 1,
           (long long)s->blocks, 100.0 * s->worst_sd / s->sd);
  return 1;
}

const qc_grad_sink *qc_streams_sink(qc_streams *s) { return &s->sink; }

int qc_streams_has(const qc_streams *ss, const char *grad, qc_dtype *held) {
  const grad_stream *s = ss ? find(ss, grad) : NULL;
  if (s && held) *held = s->held;
  return s != NULL;
}

int qc_streams_finish(qc_streams *ss, const char *grad, const qc_tol *t, qc_check *k) {
  grad_stream *s = find(ss, grad);
  if (!s || !s->cmp) return qc_err("'%s': no compare in blocks to finish", grad);
  qc_cmp_stream *c = s->cmp;
  s->cmp = NULL;
  int rc = qc_cmp_finish(c, &k->m);
  if (rc) return rc;
  const qc_dtype dt = qc_audit_dtype(s->g->dtype, s->held, t, k);
  snprintf(k->judged_dtype, sizeof k->judged_dtype, "%s", qc_dtype_name(dt));
  k->has_metrics = 1;
  return QC_OK;
}

void qc_streams_free(qc_streams *ss) {
  if (!ss) return;
  for (int i = 0; i < ss->n; i++) qc_cmp_free(ss->s[i].cmp);
  free(ss);
}
