/* forward_ref.c: see forward_priv.h. The forward the contract defines,
 * with the error model its check derives a tolerance from, and the saved
 * tensors a class recomputes; below the check (forward.c) and its
 * diagnosis (forward_diag.c). No class is named. */
#include "engine/forward_priv.h"

#include <math.h>
#include <stdio.h>
#include <string.h>

#include "core/qc.h"
#include "engine/audit.h"
#include "engine/variants.h"

static void default_model(const qc_module *m, qc_tol_model *tm);

/* The forward the contract defines (forward_priv.h). */
int qc_fwd_reference(const qc_ctx *ctx, const qc_module *m, qc_fwd_ref_fn fwd, qc_tensor *r, qc_tol_model *tm) {
  memset(tm, 0, sizeof *tm);
  int rc;
  if (fwd) { /* the class's reference forward; its model, or (k = 0) the one below */
    if ((rc = fwd(ctx, m, r, tm))) return rc;
    if (tm->k > 0) {
      qc_audit_bf16_compute(m, tm);
      return QC_OK;
    }
  } else {
    if (!m->cls->forward || qc_quantizes(m) || ctx->round_ops || ctx->wscale > 0) return QC_NA;
    if ((rc = m->cls->forward(m, m, r))) return rc;
  }
  default_model(m, tm);
  return QC_OK;
}

/* The forward's default error model of m into *tm: the reduction over the
 * last dimension of the input of the class's first gradient, or the class's
 * model of that gradient run forward where its accumulation term is the
 * larger; bf16 compute roundings added where the contract says so. */
static void default_model(const qc_module *m, qc_tol_model *tm) {
  /* the input of the class's first gradient that m holds as floats (d_x: x; d_q: q), not whichever
   * the dump lists first (moe's topk_weights, rope's inv_freq table); else the first floating input
   * (rope's positions are ids) */
  const qc_tensor *x = NULL;
  for (int j = 0, best = 0; j < m->inputs.n; j++) {
    const int k = qc_module_input_grad(m, m->inputs.t[j].name);
    if (k > 0 && (best == 0 || k < best) && qc_dtype_is_float(m->inputs.t[j].dtype)) {
      best = k;
      x = &m->inputs.t[j];
    }
  }
  for (int j = 0; j < m->inputs.n && !x; j++)
    if (qc_dtype_is_float(m->inputs.t[j].dtype)) x = &m->inputs.t[j];
  if (!x && m->inputs.n) x = &m->inputs.t[0];
  tm->k = x && x->ndim ? x->shape[x->ndim - 1] : 1;
  if (tm->k < 1) tm->k = 1;
  tm->lambda = 1;
  snprintf(tm->why, sizeof tm->why, "the %s forward, each output reducing over at most %lld values (the last dimension of "
           "inputs/%s)", m->cls->name, (long long)tm->k, x ? x->name : "-");
  /* A chain (an expert's three GEMMs, a scan) rounds in more steps than one
   * reduction, and rope's float32 angles err by ~u p inv_freq: the class's
   * error model of d_<first input>, the same chain run backward, when its
   * accumulation term lambda sqrt(K) u is the larger (its terms are the
   * gradient's, not the output's: not used) */
  const qc_tensor *y = qc_tset_get(&m->outputs, "y");
  char g[80];
  qc_tol_model gm;
  memset(&gm, 0, sizeof gm);
  qc_err_state es; /* the class may have no model of that gradient: the reduction's model then */
  qc_err_save(&es);
  const int have = x && y && m->cls->tol_model && snprintf(g, sizeof g, "d_%s", x->name) < (int)sizeof g &&
                   m->cls->tol_model(m, y, g, &gm) == QC_OK;
  qc_err_restore(&es);
  if (have && (gm.lambda > 0 ? gm.lambda : 1) * sqrt((double)gm.k) > tm->lambda * sqrt((double)tm->k)) {
    tm->k = gm.k;
    tm->lambda = gm.lambda > 0 ? gm.lambda : 1;
    tm->margin = gm.margin;
    snprintf(tm->why, sizeof tm->why, "the %s forward, modelled as its %s chain run forward: %s", m->cls->name, g, gm.why);
  }
  qc_audit_bf16_compute(m, tm);
}

/* A saved tensor recomputed by its class (forward_priv.h). */
int qc_fwd_saved(const qc_ctx *ctx, const qc_module *m, qc_saved_ref_fn fn, const char *name, qc_tensor *r,
                 qc_tol_model *tm) {
  int rc = fn(ctx, m, name, r, tm);
  if (rc) return rc;
  if (tm->k > 0) qc_audit_bf16_compute(m, tm);
  else default_model(m, tm);
  return QC_OK;
}
