/* reference/rope.c: the float64 RoPE VJP and forward, from the math.
 *
 * The forward multiplies each feature pair (a, b) of token t by the rotation
 * matrix k Q(phi), Q(phi) = [[cos, -sin], [sin, cos]], phi = s (p_t + offset)
 * f_j (s = -1 for the inverse rotation), f_j = theta^(-2j/R) or, when the
 * dump has inputs/inv_freq [R/2], its f_j (a scaled RoPE's table: llama3,
 * YaRN, linear, dynamic NTK), k the contract's scale (YaRN's attention
 * scaling multiplies cos and sin; 1). Its VJP is k Q(phi)^T dy = k Q(-phi) dy. Pairs: half layout (j, j + R/2), interleaved (2j, 2j+1);
 * features from R on pass through (d_x = dy). Angles in float64.
 * The terms' scale (ctx->terms): each output sums two products, |cos g_a|
 * + |sin g_b|; a float32 angle errs by u |phi|, moving the output by |phi|
 * times the other pair (|sin g_a| + |cos g_b|), so that term is added.
 * Variants: ctx->round_ops 1, cos and sin rounded to bf16 before they
 * multiply (the library casts its tables to x's dtype); 2, each product
 * and the pair's sum rounded to bf16 as well (a pure-bf16 model's ops,
 * forward and autograd alike). Rounding x cos with cos a bf16 value just
 * below 1 shrinks the product by a fixed part of an ulp: a systematic
 * error (bias z -3 on 16K elements) that only the rounded arithmetic
 * itself reproduces. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "model/module.h"
#include "reference/ref_classes.h"
#include "core/par.h"
#include "core/qc.h"
#include "numerics/formats.h"
#include "reference/ref_dev.h"
#include "reference/ref_util.h"

/* One rotation over v [T, H, D] into out: rope_apply's settings. */
typedef struct rope_job {
  const double *v, *f; /* f [R/2]: inputs/inv_freq, or theta^(-2j/R) */
  double *out;
  const int64_t *p;    /* [T] positions */
  int64_t H, D, R;
  int inter, fwd, ab, rnd;
  double s, off, k;
  int nomem[QC_PAR_MAX]; /* piece tid could not allocate its angles */
} rope_job;

/* Tokens [lo, hi): each token's angles once (the same for its H heads),
 * then its heads, each element alone: any thread count gives the same
 * values. */
static void rope_rows(void *ctx, int64_t lo, int64_t hi, int tid) {
  rope_job *J = ctx;
  const int64_t H = J->H, D = J->D, R = J->R;
  const int ab = J->ab, rnd = J->rnd, inter = J->inter;
  double *cs = malloc((size_t)(R + 2) * sizeof *cs), *ph = malloc((size_t)(R / 2 + 1) * sizeof *ph);
  if (!cs || !ph) {
    J->nomem[tid] = 1;
    free(cs);
    free(ph);
    return;
  }
  for (int64_t t = lo; t < hi; t++) {
    for (int64_t j = 0; j < R / 2; j++) {
      const double phi = J->s * ((double)J->p[t] + J->off) * J->f[j];
      double co = J->k * cos(phi), si = J->k * sin(phi);
      if (rnd) {
        co = qc_round_bf16((float)co);
        si = qc_round_bf16((float)si);
      }
      if (J->fwd) si = -si; /* Q(phi) = Q(-phi)^T */
      ph[j] = phi;
      cs[2 * j] = co;
      cs[2 * j + 1] = si;
    }
    for (int64_t h = 0; h < H; h++) {
      const double *g = J->v + (t * H + h) * D;
      double *d = J->out + (t * H + h) * D;
      for (int64_t i = R; i < D; i++) d[i] = ab ? fabs(g[i]) : g[i];
      for (int64_t j = 0; j < R / 2; j++) {
        const int64_t a = inter ? 2 * j : j, b = inter ? 2 * j + 1 : j + R / 2;
        const double co = cs[2 * j], si = cs[2 * j + 1], phi = ph[j];
        if (ab) {
          d[a] = fabs(co * g[a]) + fabs(si * g[b]) + fabs(phi) * (fabs(si * g[a]) + fabs(co * g[b]));
          d[b] = fabs(si * g[a]) + fabs(co * g[b]) + fabs(phi) * (fabs(co * g[a]) + fabs(si * g[b]));
          continue;
        }
        /* Q(-phi) [g_a, g_b] */
        if (rnd >= 2) { /* each product and the sum rounded to bf16, as a bf16 model's ops do */
          d[a] = qc_round_bf16((float)((double)qc_round_bf16((float)(co * g[a])) + qc_round_bf16((float)(si * g[b]))));
          d[b] = qc_round_bf16((float)((double)qc_round_bf16((float)(-si * g[a])) + qc_round_bf16((float)(co * g[b]))));
          continue;
        }
        d[a] = co * g[a] + si * g[b];
        d[b] = -si * g[a] + co * g[b];
      }
    }
  }
  free(cs);
  free(ph);
}

/* Q(s phi) (fwd = 1) or Q(-s phi) (the VJP) applied to every token and
 * head of vt [T, H, D] (dY or x; `what` names it) into out (ctx->terms: the
 * terms' scale; ctx->round_ops: the bf16 variants), on be's device where
 * it takes it (reference/rope_dev.c), else on the host's threads. A
 * status. */
static int rope_apply(const qc_ctx *ctx, const qc_backend *be, const qc_module *m, const qc_tensor *vt, const char *what, int fwd,
                      double *out) {
  const qc_tensor *xt, *pt;
  int rc;
  if ((rc = qc_module_need(m, "inputs", "x", 2, 3, &xt))) return rc;
  if ((rc = qc_module_need(m, "inputs", "positions", 1, 1, &pt))) return rc;
  const int ab = ctx && ctx->terms, rnd = ctx ? ctx->round_ops : 0;
  const int64_t T = xt->shape[0], D = xt->shape[xt->ndim - 1], H = qc_numel(xt) / (T * D);
  const qc_contract *c = &m->contract;
  const double rdim = qc_contract_num(c, "rotary_dim", 0), theta = qc_contract_num(c, "theta", 10000);
  const int64_t R = rdim == 0 ? D : (int64_t)rdim;
  const int inter = strcmp(qc_contract_str(c, "layout", "half"), "interleaved") == 0;
  const double s = strcmp(qc_contract_str(c, "inverse", "no"), "yes") == 0 ? -1.0 : 1.0;
  const double off = qc_contract_num(c, "position_offset", 0), k = qc_contract_num(c, "scale", 1);
  const qc_tensor *ft = qc_tset_get(&m->inputs, "inv_freq");
  int64_t *p = NULL;
  double *f = ft ? qc_refu_load(ft, "reference rope inv_freq") : malloc((size_t)(R / 2 + 1) * sizeof *f);
  if (!f) return ft ? QC_ESYS : qc_err_sys("out of memory: the frequencies (reference rope)");
  for (int64_t i = 0; !ft && i < R / 2; i++) f[i] = exp(-2.0 * (double)i / (double)R * log(theta)); /* theta's, once for both paths */
  if ((rc = qc_refu_ids(m, pt, "inputs/positions", &p))) {
    free(f);
    return rc;
  }
  const qc_rope_rows dj = {.inter = inter, .fwd = fwd, .ab = ab, .rnd = rnd, .T = T, .H = H, .D = D, .R = R, .s = s, .off = off,
                           .k = k, .theta = theta};
  double *v = NULL;
  if ((rc = qc_ref_rope_dev(be, dj, vt, p, f, out)) != QC_NA) goto done;
  rc = QC_OK;
  if (!(v = qc_refu_load(vt, what))) {
    rc = QC_ESYS;
    goto done;
  }
  rope_job j = {.v = v, .out = out, .p = p, .f = f, .H = H, .D = D, .R = R, .inter = inter, .fwd = fwd, .ab = ab, .rnd = rnd,
                .s = s, .off = off, .k = k};
  qc_par_for(T, 1 + ((int64_t)1 << 14) / (H * D + 1), rope_rows, &j);
  for (int i = 0; i < QC_PAR_MAX; i++)
    if (j.nomem[i]) rc = qc_err_sys("out of memory: the rotation of a token (reference rope)");
done:
  free(v);
  free(p);
  free(f);
  return rc;
}

/* The contract's checks shared by the VJP and the forward. */
static int rope_check(const qc_module *m, const qc_tensor **xt) {
  const qc_tensor *pt;
  int rc;
  if ((rc = qc_module_need(m, "inputs", "x", 2, 3, xt))) return rc;
  if ((rc = qc_module_need(m, "inputs", "positions", 1, 1, &pt))) return rc;
  const int64_t T = (*xt)->shape[0], D = (*xt)->shape[(*xt)->ndim - 1];
  const double rdim = qc_contract_num(&m->contract, "rotary_dim", 0), theta = qc_contract_num(&m->contract, "theta", 10000);
  if (pt->shape[0] != T) return qc_err("%s: 'inputs/positions': expected [%lld], one per token", m->path, (long long)T);
  const int64_t R = rdim == 0 ? D : (int64_t)rdim;
  if (rdim != floor(rdim) || R % 2 || R < 2 || R > D)
    return qc_err("%s: contract key 'rotary_dim' = %g: expected even, 2..%lld, or 0", m->path, rdim, (long long)D);
  if (!(theta > 1)) return qc_err("%s: contract key 'theta' = %g: expected > 1", m->path, theta);
  const double k = qc_contract_num(&m->contract, "scale", 1);
  if (!(k > 0) || !isfinite(k)) return qc_err("%s: contract key 'scale' = %g: expected > 0", m->path, k);
  const qc_tensor *ft = qc_tset_get(&m->inputs, "inv_freq");
  if (!ft) return QC_OK;
  if (ft->ndim != 1 || ft->shape[0] != R / 2 || !qc_dtype_is_float(ft->dtype) || ft->dtype == QC_E2M1X2)
    return qc_err("%s: 'inputs/inv_freq': expected a float vector [%lld], one frequency a rotary pair", m->path, (long long)(R / 2));
  double *f = qc_refu_load(ft, "reference rope inv_freq");
  if (!f) return QC_ESYS;
  for (int64_t j = 0; j < R / 2 && rc == QC_OK; j++)
    if (!(f[j] >= 0) || !isfinite(f[j])) rc = qc_err("%s: 'inputs/inv_freq'[%lld] = %g: expected finite, >= 0", m->path, (long long)j, f[j]);
  free(f);
  return rc;
}

/* The float64 VJP from the math above (a qc_vjp_fn): every gradient the contract makes
 * differentiable into grads; QC_EINPUT naming what is wrong with bad input. */
static int ref_rope(const qc_ctx *ctx, const qc_module *m, const qc_tensor *dy, qc_tset *grads) {
  const qc_tensor *xt;
  int rc;
  if ((rc = rope_check(m, &xt))) return rc;
  if ((rc = qc_module_check_dy(m, dy, qc_numel(xt), xt->shape[xt->ndim - 1], "the shape of inputs/x"))) return rc;
  double *dx;
  if ((rc = qc_refu_out(grads, "d_x", xt->ndim, xt->shape, &dx))) return rc;
  return rope_apply(ctx, ctx ? ctx->be : NULL, m, dy, "reference rope dY", 0, dx);
}

/* The forward y = Q(phi) x in float64 (a qc_fwd_ref_fn): tm left zero, so
 * the engine takes the class's own error model (its float32 angles). */
static int ref_rope_forward(const qc_ctx *ctx, const qc_module *m, qc_tensor *y, qc_tol_model *tm) {
  const qc_tensor *xt;
  int rc;
  memset(tm, 0, sizeof *tm);
  if ((rc = rope_check(m, &xt))) return rc;
  if ((rc = qc_tensor_alloc(y, "y", QC_F64, xt->ndim, xt->shape))) return rc;
  return rope_apply(ctx && ctx->terms ? NULL : ctx, ctx ? ctx->be : NULL, m, xt, "reference rope x", 1, (double *)y->data);
}

/* The class's reference, its one export (src/classes/registry.c pairs it
 * with src/modules/rope.c). */
const qc_reference qc_reference_rope = {.vjp = ref_rope, .forward = ref_rope_forward, .terms = 1};
