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
 * |dy b| (sigma + |z| sigma (1 - sigma)); d_up's one product |dy a|. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "model/module.h"
#include "reference/ref_classes.h"
#include "core/qc.h"
#include "reference/ref_util.h"

static double sigma(double z) { return z >= 0 ? 1.0 / (1.0 + exp(-z)) : exp(z) / (1.0 + exp(z)); }

int qc_ref_swiglu(const qc_ctx *ctx, const qc_module *m, const qc_tensor *dy, qc_tset *grads) {
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
  double *G = qc_refu_load(gt, "reference gate"), *U = qc_refu_load(ut, "reference up");
  double *D = qc_refu_load(dy, "reference swiglu dY"), *dg, *du;
  rc = QC_ESYS;
  if (!G || !U || !D) goto done;
  if ((rc = qc_refu_out(grads, "d_gate", gt->ndim, gt->shape, &dg))) goto done;
  if ((rc = qc_refu_out(grads, "d_up", ut->ndim, ut->shape, &du))) goto done;
  for (int64_t i = 0; i < qc_numel(gt); i++) {
    double z = G[i], w = U[i], da = 1.0, db = 1.0;
    if (L > 0) {
      if (z > L || (z == L && !pass)) da = 0.0;
      if (fabs(w) > L || (fabs(w) == L && !pass)) db = 0.0;
      z = z > L ? L : z;
      w = w > L ? L : (w < -L ? -L : w);
    }
    const double sg = sigma(z);
    dg[i] = da == 0.0 ? 0.0 : ab ? fabs(D[i] * w) * (sg + fabs(z) * sg * (1.0 - sg)) : D[i] * w * (sg + z * sg * (1.0 - sg));
    du[i] = db == 0.0 ? 0.0 : ab ? fabs(D[i] * z * sg) : D[i] * z * sg;
  }
  rc = QC_OK;
done:
  free(G); free(U); free(D);
  return rc;
}
