/* reference/swiglu.c: the float64 SwiGLU VJP, from the math.
 *
 * y = a(gate) * b(up) with a(z) = silu(min(z, L)), b(z) = clamp(z, -L, L)
 * (L = 0: no clamp, a = silu, b = identity).
 *   d_gate = dy * b(up) * a'(gate),  a'(z) = sigma(z) + z sigma(z) (1 - sigma(z))
 *            for z inside the limit, 0 beyond it
 *   d_up   = dy * a(gate) * b'(up),   b' = 1 inside [-L, L], 0 outside
 * At exactly +-L the derivative is the contract's at_limit: 1 (pass) or 0
 * (block).
 * The terms' scale (ctx->terms): a'(z) is a sum, sigma(z) + z sigma(z)
 * (1 - sigma(z)), that cancels near z = -1.28, so d_gate's terms are
 * |dy b| (sigma + |z| sigma (1 - sigma)); d_up's one product |dy a|.
 * Variants (a bf16 model's arithmetic; every value below rounded to bf16
 * where marked b()): ctx->round_ops 1, each op computed in float32 and
 * rounded once, as torch 2's CUDA and CPU kernels do: s = b(silu(z)) is
 * the saved activation, d_s = b(dy u), d_gate = b(d_s a'(z)), d_up =
 * b(dy s), y = b(s u); 2, every op rounded, as torch 1.13's CPU kernels
 * do for bf16 (measured: all of 2^18 elements equal): e = b(exp(-z)),
 * q = b(1 + e), sigma = b(1 / q), s = b(z / q), d_gate = b(b(d_s sigma)
 * b(1 + b(z b(1 - sigma)))). Rounding d_s times a factor just above 1
 * (a'(z) for large z) gives back d_s: a systematic error (bias z -5.5 on
 * 196K elements of a tiny bf16 Llama) that only the rounded arithmetic
 * reproduces. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "model/module.h"
#include "reference/ref_classes.h"
#include "core/qc.h"
#include "numerics/formats.h"
#include "core/par.h"
#include "reference/ref_dev.h"
#include "reference/ref_util.h"

static double sigma(double z) { return z >= 0 ? 1.0 / (1.0 + exp(-z)) : exp(z) / (1.0 + exp(z)); }
static double bfr(double x) { return (double)qc_round_bf16((float)x); }

/* One element of the VJP (ab: the terms' scale) under variant rnd: the
 * clamped gate z and up w, dy, and the clamp's derivatives da, db. */
static void swiglu_elem(int ab, int rnd, double z, double w, double dy, double da, double db, double *dg, double *du) {
  if (ab || rnd == 0) {
    const double sg = sigma(z);
    *dg = da == 0.0 ? 0.0 : ab ? fabs(dy * w) * (sg + fabs(z) * sg * (1.0 - sg)) : dy * w * (sg + z * sg * (1.0 - sg));
    *du = db == 0.0 ? 0.0 : ab ? fabs(dy * z * sg) : dy * z * sg;
    return;
  }
  const double ds = bfr(dy * w);
  if (rnd == 1) {
    const double sg = sigma(z);
    *dg = da == 0.0 ? 0.0 : bfr(ds * sg * (1.0 + z * (1.0 - sg)));
    *du = db == 0.0 ? 0.0 : bfr(dy * bfr(z * sg));
    return;
  }
  const double q = bfr(1.0 + bfr(exp(-z))), sg = bfr(1.0 / q);
  *dg = da == 0.0 ? 0.0 : bfr(bfr(ds * sg) * bfr(1.0 + bfr(z * bfr(1.0 - sg))));
  *du = db == 0.0 ? 0.0 : bfr(dy * bfr(z / q));
}

/* The clamp (limit L, at_limit pass): z and w clamped in place, the
 * derivatives' factors. */
static void swiglu_clamp(double L, int pass, double *z, double *w, double *da, double *db) {
  *da = *db = 1.0;
  if (L > 0) {
    if (*z > L || (*z == L && !pass)) *da = 0.0;
    if (fabs(*w) > L || (fabs(*w) == L && !pass)) *db = 0.0;
    *z = *z > L ? L : *z;
    *w = *w > L ? L : (*w < -L ? -L : *w);
  }
}

typedef struct swiglu_job {
  const double *G, *U, *D;
  double *dg, *du;
  double L;
  int pass, ab, rnd;
} swiglu_job;

/* Elements [lo, hi) of the VJP (each alone: any thread count gives the
 * same values). */
static void swiglu_piece(void *ctx, int64_t lo, int64_t hi, int tid) {
  (void)tid;
  const swiglu_job *j = ctx;
  for (int64_t i = lo; i < hi; i++) {
    double z = j->G[i], w = j->U[i], da, db;
    swiglu_clamp(j->L, j->pass, &z, &w, &da, &db);
    swiglu_elem(j->ab, j->rnd, z, w, j->D[i], da, db, &j->dg[i], &j->du[i]);
  }
}

/* The float64 VJP from the math above (a qc_vjp_fn), on ctx's device where
 * its backend has the pass (reference/pointwise_dev.c), else on
 * qc_par_for's threads: every gradient the contract makes differentiable
 * into grads; QC_EINPUT naming what is wrong with bad input. */
static int ref_swiglu(const qc_ctx *ctx, const qc_module *m, const qc_tensor *dy, qc_tset *grads) {
  const int ab = ctx && ctx->terms;
  const qc_tensor *gt, *ut;
  int rc;
  if ((rc = qc_module_need(m, "inputs", "gate", 1, QC_MAXDIM, &gt))) return rc;
  if ((rc = qc_module_need(m, "inputs", "up", 1, QC_MAXDIM, &ut))) return rc;
  if (!qc_shape_eq(gt, ut)) return qc_err("%s: 'inputs/up': expected the shape of 'inputs/gate'", m->path);
  if ((rc = qc_module_check_dy(m, dy, qc_numel(gt), gt->shape[gt->ndim - 1], "the shape of inputs/gate"))) return rc;
  const double L = qc_contract_num(&m->contract, "limit", 0);
  const int pass = strcmp(qc_contract_str(&m->contract, "at_limit", "pass"), "pass") == 0;
  if (!(L >= 0)) return qc_err("%s: contract key 'limit' = %g: expected >= 0", m->path, L);
  double *G = NULL, *U = NULL, *D = NULL, *dg, *du;
  if ((rc = qc_refu_out_z(grads, "d_gate", gt->ndim, gt->shape, 0, &dg))) return rc;
  if ((rc = qc_refu_out_z(grads, "d_up", ut->ndim, ut->shape, 0, &du))) return rc;
  const int rnd = ctx && !ab ? ctx->round_ops : 0;
  const qc_pw pj = {.op = QC_PW_SWIGLU, .mode = ab ? 1 : rnd ? rnd + 1 : 0, .limit = L, .pass = pass};
  if ((rc = qc_ref_pw_dev(ctx ? ctx->be : NULL, pj, gt, ut, dy, dg, du)) != QC_NA) return rc;
  G = qc_refu_load(gt, "reference gate");
  U = qc_refu_load(ut, "reference up");
  D = qc_refu_load(dy, "reference swiglu dY");
  rc = QC_ESYS;
  if (G && U && D) {
    swiglu_job j = {G, U, D, dg, du, L, pass, ab, rnd};
    qc_par_for(qc_numel(gt), (int64_t)1 << 14, swiglu_piece, &j);
    rc = QC_OK;
  }
  free(G); free(U); free(D);
  return rc;
}

/* The forward y = a(gate) b(up) in float64 (a qc_fwd_ref_fn), under the
 * variants above; tm left zero: the engine takes the class's error model. */
static int ref_swiglu_forward(const qc_ctx *ctx, const qc_module *m, qc_tensor *y, qc_tol_model *tm) {
  const qc_tensor *gt, *ut;
  int rc;
  memset(tm, 0, sizeof *tm);
  if ((rc = qc_module_need(m, "inputs", "gate", 1, QC_MAXDIM, &gt))) return rc;
  if ((rc = qc_module_need(m, "inputs", "up", 1, QC_MAXDIM, &ut))) return rc;
  if (!qc_shape_eq(gt, ut)) return qc_err("%s: 'inputs/up': expected the shape of 'inputs/gate'", m->path);
  const double L = qc_contract_num(&m->contract, "limit", 0);
  if (!(L >= 0)) return qc_err("%s: contract key 'limit' = %g: expected >= 0", m->path, L);
  const int rnd = ctx && !ctx->terms ? ctx->round_ops : 0;
  double *G = qc_refu_load(gt, "reference gate"), *U = qc_refu_load(ut, "reference up");
  rc = QC_ESYS;
  if (!G || !U) goto done;
  if ((rc = qc_tensor_alloc(y, "y", QC_F64, gt->ndim, gt->shape))) goto done;
  for (int64_t i = 0; i < qc_numel(gt); i++) {
    double z = G[i], w = U[i], da, db, s;
    swiglu_clamp(L, 1, &z, &w, &da, &db);
    s = rnd == 0 ? z * sigma(z) : rnd == 1 ? bfr(z * sigma(z)) : bfr(z / bfr(1.0 + bfr(exp(-z))));
    ((double *)y->data)[i] = rnd ? bfr(s * w) : s * w;
  }
  rc = QC_OK;
done:
  free(G); free(U);
  return rc;
}

/* The class's reference, its one export (src/classes/registry.c pairs it
 * with src/modules/swiglu.c). */
const qc_reference qc_reference_swiglu = {.vjp = ref_swiglu, .forward = ref_swiglu_forward, .terms = 1};
