/* reference/moe.c: float64 VJP of routed experts with fixed top-k ids, from
 * the definition. The math is per token and slot:
 *
 * For token t and slot j, e = ids[t, j] (fixed; not differentiated):
 *   h = W1_e x_t  (W1_e = w1[e], [2F, H] swiglu or [F, H] relu2)
 *   a = act(h),   y = W2_e a  (W2_e = w2[e], [H, F]),  out_t = sum_j w_tj y
 * so, with dy_t = dL/dout_t:
 *   dL/dw_tj  = <dy_t, y>
 *   dL/da     = w_tj W2_e^T dy_t,            dL/dW2_e += w_tj dy_t a^T
 *   dL/dh     = act'(h) * dL/da
 *   dL/dW1_e += dL/dh x_t^T,                 dL/dx_t  += W1_e^T dL/dh
 * The products run through the backend's float64 GEMM (gemm_f64, as
 * reference/linear.c), grouped by expert: expert e's n_e rows are the
 * (token, slot) pairs routed to it, in token order then slot order; with
 * X_e [n_e, H] their x_t and WG_e [n_e, H] their w_tj dy_t:
 *   H_e = X_e W1_e^T,  Y_e = A_e W2_e^T,  dL/dA_e = WG_e W2_e,
 *   dL/dW2_e = WG_e^T A_e,  dL/dW1_e = dL/dH_e^T X_e,
 * and the rows of dL/dH_e W1_e are added to their tokens' d_x, expert by
 * expert. The grouping is only an order of float64 sums: each element is
 * the same sum of the same terms as token by token and slot by slot, and
 * each rounding of the variants below falls on the same quantity (they are
 * elementwise on the GEMMs' operands and outputs). A row keeps its slot
 * index s = t k + j: its token and its d_topk_weights element are read
 * from s, never through an inverse permutation.
 * act: relu2 a = max(h, 0)^2, a' = 2 max(h, 0); swiglu a_f = silu(g') u' with
 * g = h_f, u = h_{F+f}, g' = min(g, L), u' = clamp(u, -L, L) (L = 0: no
 * clamp), d/dg = u' silu'(g') [g inside], d/du = silu(g') [u inside],
 * silu'(z) = sigma(z) (1 + z (1 - sigma(z))); at exactly +-L the clamp's
 * derivative is 1 under at_limit = pass, 0 under block. Each (token, slot)
 * pair is its own row, so a token routed twice to one expert counts twice;
 * an expert nobody selects has no rows and gets zero gradients. Shared
 * experts (contract shared_experts > 0, optionally gated): see ref_shared,
 * the same products over all T tokens at once.
 * The terms' scale (ctx->terms): the forward (h, a, y) as is, the backward
 * over its terms' magnitudes: |dy|, |w|, |W1|, |W2|, |x|, |a| in every
 * product, |W2 a| summed as sum_f |W2||a|, and act' as the magnitudes of
 * its terms (swiglu's silu' = sigma + z sigma (1 - sigma) cancels near
 * z = -1.28: sigma + |z| sigma (1 - sigma)); the gate's 1 - g is a
 * difference (1 + g). Under ctx->terms 2 (only ||T||_2 read) d_w1 and
 * d_w2 are each expert's block's norm, [E], and the shared ones [1]:
 * from the rows' Gram matrices (terms_norm), not the blocks.
 * Variant ctx->round_ops (the legal roundings of a grouped-GEMM backward):
 * the operands the production builds and feeds to its bf16 GEMMs rounded
 * to bf16: a (into y, dL/dW2), w dy_t (into dL/da, dL/dW2), dL/dh (into
 * dL/dW1, dL/dx); for the shared experts a, g dy_t and dL/dh alike.
 * round_ops 2: also the expert outputs y (and the shared ys) held in bf16,
 * as read by dL/dw = <dy_t, y> (and the gate's <dy_t, ys>).
 * round_ops 3: an eager pure-bf16 model under torch 2 (each op in float32,
 * rounded once): also h and dL/da held in bf16, silu(z) rounded (the saved
 * activation), d_s = b(dL/da u) before silu' (swiglu's variant 1), the
 * shared gate's logit and sigmoid rounded. round_ops 4: the same with
 * silu, silu' and the sigmoid every op in bf16 (torch 1.13's CPU, swiglu's
 * variant 2). Rounding d_s times silu', a factor just above 1 for large
 * z, gives back d_s: a systematic error in d_x (bias z -8.7 on a tiny
 * bf16 Qwen2-MoE at 2 x 4096 tokens) only these variants reproduce.
 * The forward (ref_moe_forward, outputs/y's check): out_t = sum_j w_tj y
 * (+ g_t ys), the same grouped products and the same roundings of h, a
 * and y under ctx->round_ops. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend/backend.h"
#include "model/module.h"
#include "model/sink.h"
#include "reference/ref_classes.h"
#include "core/qc.h"
#include "core/memo.h"
#include "core/par.h"
#include "numerics/decode.h"
#include "numerics/formats.h"
#include "numerics/metrics.h"
#include "numerics/quant.h"
#include "reference/ref_util.h"

static double sigma(double z) { return z >= 0 ? 1.0 / (1.0 + exp(-z)) : exp(z) / (1.0 + exp(z)); }

/* v rounded to bf16 under the round_ops variant (rb), else v. */
static double rnd(int rb, double v) { return rb ? (double)qc_round_bf16((float)v) : v; }

/* silu(z) under variant rb: exact; b(silu(z)) computed once (rb 3, a
 * bf16 model under torch 2); every op in bf16 (rb 4, torch 1.13's CPU:
 * z / b(1 + b(exp(-z)))). */
static double silu_v(int rb, double z) {
  if (rb >= 4) return rnd(1, z / rnd(1, 1.0 + rnd(1, exp(-z))));
  return rb >= 3 ? rnd(1, z * sigma(z)) : z * sigma(z);
}

/* One row of the expert MLP's activation and its derivative, from the
 * definition: h [2F swiglu | F relu2], a [F]: a = act(h); rb >= 3: silu
 * as silu_v (the caller rounds a). */
static void act_f(int relu2, double L, int rb, int64_t F, const double *h, double *a) {
  for (int64_t f = 0; f < F; f++) {
    if (relu2) {
      a[f] = h[f] > 0 ? h[f] * h[f] : 0.0;
      continue;
    }
    double z = h[f], u = h[F + f];
    if (L > 0) {
      z = z > L ? L : z;
      u = u > L ? L : (u < -L ? -L : u);
    }
    a[f] = rb >= 3 ? silu_v(rb, z) * u : z * sigma(z) * u;
  }
}

/* gh [2F | F] = act'(h)^T ga [F] for one row, the clamp's derivative at
 * exactly +-L 1 under pass, 0 otherwise; ab: the magnitudes of act''s
 * terms (the terms' scale). */
static void act_b(int relu2, double L, int pass, int ab, int rb, int64_t F, const double *h, const double *ga, double *gh) {
  for (int64_t f = 0; f < F; f++) {
    if (relu2) {
      gh[f] = h[f] > 0 ? ga[f] * 2.0 * h[f] : 0.0; /* one product: its own magnitude under ab (ga >= 0) */
      continue;
    }
    double z = h[f], u = h[F + f], dz = 1.0, du = 1.0;
    if (L > 0) {
      if (z > L || (z == L && !pass)) dz = 0.0;
      if (fabs(u) > L || (fabs(u) == L && !pass)) du = 0.0;
      z = z > L ? L : z;
      u = u > L ? L : (u < -L ? -L : u);
    }
    if (rb >= 3 && !ab) { /* a bf16 model's ops: d_s = b(ga u) first, as its autograd rounds it (swiglu's variants) */
      const double ds = rnd(1, ga[f] * u);
      if (rb >= 4) {
        const double sgb = rnd(1, 1.0 / rnd(1, 1.0 + rnd(1, exp(-z))));
        gh[f] = dz == 0.0 ? 0.0 : rnd(1, rnd(1, ds * sgb) * rnd(1, 1.0 + rnd(1, z * rnd(1, 1.0 - sgb))));
      } else {
        const double sg = sigma(z);
        gh[f] = dz == 0.0 ? 0.0 : rnd(1, ds * sg * (1.0 + z * (1.0 - sg)));
      }
      gh[F + f] = du == 0.0 ? 0.0 : rnd(1, ga[f] * silu_v(rb, z));
      continue;
    }
    const double sg = sigma(z);
    gh[f] = dz == 0.0 ? 0.0 : ab ? ga[f] * fabs(u) * (sg + fabs(z) * sg * (1.0 - sg)) : ga[f] * u * (sg + z * sg * (1.0 - sg));
    gh[F + f] = du == 0.0 ? 0.0 : ab ? ga[f] * fabs(z * sg) : ga[f] * z * sg;
  }
}

/* The expert MLP over n rows (routed: one expert's slots; shared: every
 * token), its rounding points those of the variant rb and its operands
 * the terms' magnitudes under ab, as the file's top comment says. */
typedef struct mlp {
  const qc_backend *be;
  int relu2, pass, ab, rb;
  double L;
  /* the experts' quantization (routed only; NULL: none): the activation
   * format of a's rows into W2, and its profile */
  const char *afmt, *prof;
  const char *wfmt; /* each routed expert's w1[e], w2[e] (NULL: none) */
  int tn;           /* the terms' norms (ctx->terms 2, under ab): D1 and D2 of mlp_bwd are each one
                     * double, ||T||_2 of the block (terms_norm), not the [R, H] and [H, F] blocks */
  int dx_master;    /* d_x's chain through the master weights, not the dequantized ones */
  int64_t master_e; /* e + 1: expert e's alone so (ctx->master_expert, a diagnosis variant); 0: none */
  const qc_grad_sink *sk; /* st1, st2: d_w1, d_w2 handed to sk an expert's block at a time (model/sink.h),
                           * not stored (ref_routed's dw1, dw2 NULL then) */
  int st1, st2;
  int64_t H, F, R; /* R = 2F swiglu, F relu2 */
  /* buffers for up to the rows they were made for */
  double *h;   /* [n, R] h, then dL/dh */
  double *a;   /* [n, F] a, then dL/da */
  double *y;   /* [n, H] y = W2 a, then the rows' W1^T dL/dh (d_x's terms) */
  double *wg;  /* [n, H] the caller's scaled dy rows (w_tj dy_t, g_t dy_t) */
  double *tmp; /* [QC_PAR_MAX, R] one row of dL/dh per piece (qc_par_for's tid) */
  double *aq;  /* [n, F] dequant(quant(a)) under afmt, the operand of y = W2 a */
} mlp;

/* The memo's tag of expert e's dequant(quant(.)) under fmt and prof. */
static void fq_tag(char *tag, size_t cap, const char *fmt, const char *prof, int64_t e) {
  snprintf(tag, cap, "moe fake_quant %s %s %lld", fmt, prof ? prof : "", (long long)e);
}

/* dequant(quant(a)) in place for [rows, cols] under fmt (NULL or "none":
 * unchanged), round to nearest: the numerics library's quantizer, which
 * takes float32 (a float64 value is narrowed to float32 first, as a
 * trainer's bf16 or float32 tensor is exactly). Returns a status. */
/* fq of a = src's values widened (expert e's slice of a stacked weight,
 * or e < 0: the whole tensor), the result kept in the audit's memo
 * (core/memo.h) for the module's other references: its forward check,
 * the terms' run and the variants quantize each expert once. src NULL: a
 * is anything else, nothing kept. */
static int fq_of(const qc_tensor *src, int64_t e, const char *fmt, const char *prof, int64_t rows, int64_t cols, double *a,
                 const char *what) {
  if (!fmt || strcmp(fmt, "none") == 0 || rows * cols == 0) return QC_OK;
  const int64_t n = rows * cols;
  char tag[96];
  fq_tag(tag, sizeof tag, fmt, prof, e);
  const float *kept = src ? qc_memo_get(src, tag, n) : NULL;
  if (kept) return qc_float_to_f64(QC_F32, kept, n, a);
  float *f = qc_malloc((size_t)n * sizeof *f, what);
  if (!f) return QC_ESYS;
  qc_f64_to_f32s(a, n, f);
  int rc = qc_fake_quant(fmt, prof, rows, cols, f, f, what);
  if (!rc) rc = qc_float_to_f64(QC_F32, f, n, a);
  if (rc || !src || !qc_memo_take(src, tag, f, n)) free(f);
  return rc;
}

static int fq(const char *fmt, const char *prof, int64_t rows, int64_t cols, double *a, const char *what) {
  return fq_of(NULL, -1, fmt, prof, rows, cols, a, what);
}

/* Allocate p's buffers for up to n rows. Returns a status. */
static int mlp_alloc(mlp *p, int64_t n) {
  if (!(p->h = qc_malloc((size_t)(n * p->R) * sizeof *p->h, "reference moe h")) ||
      !(p->a = qc_malloc((size_t)(n * p->F) * sizeof *p->a, "reference moe a")) ||
      !(p->y = qc_malloc((size_t)(n * p->H) * sizeof *p->y, "reference moe y")) ||
      !(p->wg = qc_malloc((size_t)(n * p->H) * sizeof *p->wg, "reference moe w dy")) ||
      !(p->tmp = qc_malloc((size_t)(QC_PAR_MAX * p->R) * sizeof *p->tmp, "reference moe dL/dh")) ||
      !(p->aq = qc_malloc((size_t)(n * p->F + 1) * sizeof *p->aq, "reference moe quantized a")))
    return QC_ESYS;
  return QC_OK;
}

static void mlp_free(mlp *p) {
  free(p->h); free(p->a); free(p->y); free(p->wg); free(p->tmp); free(p->aq);
  p->h = p->a = p->y = p->wg = p->tmp = p->aq = NULL;
}

/* v[i] = rnd(rb, v[i]) for n elements (on qc_par_for's threads, each alone). */
static void rnd_all(int rb, double *v, int64_t n) {
  if (rb) qc_round_all(v, QC_F64, n, QC_BF16);
}


/* The activation's rows [lo, hi) of mlp p, forward (act_f: a from h) or
 * backward (act_b: dL/dh from h and dL/da, through the thread's own row of
 * p->tmp, into h's row); each row alone, so any thread count gives the
 * same values. */
static void act_f_rows(void *ctx, int64_t lo, int64_t hi, int tid);
static void act_b_rows(void *ctx, int64_t lo, int64_t hi, int tid);

static void act_f_rows(void *ctx, int64_t lo, int64_t hi, int tid) {
  (void)tid;
  const mlp *p = ctx;
  for (int64_t i = lo; i < hi; i++) act_f(p->relu2, p->L, p->rb, p->F, p->h + i * p->R, p->a + i * p->F);
}

static void act_b_rows(void *ctx, int64_t lo, int64_t hi, int tid) {
  const mlp *p = ctx;
  double *tmp = p->tmp + (int64_t)tid * p->R;
  for (int64_t i = lo; i < hi; i++) {
    act_b(p->relu2, p->L, p->pass, p->ab, p->rb, p->F, p->h + i * p->R, p->a + i * p->F, tmp);
    memcpy(p->h + i * p->R, tmp, (size_t)p->R * sizeof *tmp); /* h's row no longer needed: dL/dh */
  }
}

/* A float64 host matrix as a gemm_f64_x operand (leading dimension ld). */
static qc_gemm_x f64op(const double *a, int64_t ld) { return (qc_gemm_x){a, QC_F64, ld, 0}; }

/* C [m, n] = op(A) op(B) through the backend's gemm_f64_x (C's rows n
 * apart): A a float64 matrix's operand (f64op), B any. */
static int gx(const qc_backend *be, qc_op ta, qc_op tb, int64_t m, int64_t n, int64_t k, qc_gemm_x A, const qc_gemm_x *B,
              double *C) {
  return be->gemm_f64_x(be, ta, tb, m, n, k, &A, B, C, n);
}

/* The forward of n rows through the weights the forward used, W1f [R, H]
 * and W2f [H, F], from its input rows Xf [n, H] (dequant(quant(x)) under
 * the activation format): p->h = Xf W1f^T (held in bf16 when rb >= 3),
 * p->a = act(h) (rounded when rb), p->y = W2f aq with aq = dequant(quant(a))
 * under p->afmt (a itself otherwise; rounded when rb: the production's bf16
 * operand), p->y rounded when rb >= 2 (the y that dL/dw reads). Xb, W1b,
 * W2b are the backward's operands (x, and the weights of d_x's chain:
 * the same ones as the forward's where the contract says so; the weights
 * as gemm_f64_x operands). Under ab Xb and p->a are replaced by their
 * magnitudes once h is made, and W1b, W2b and W2f read as theirs (y =
 * sum |W2f||aq|). Returns a status. */
static int mlp_fwd(mlp *p, int64_t n, const double *Xf, const qc_gemm_x *W1f, qc_gemm_x *W2f, double *Xb, qc_gemm_x *W1b,
                   qc_gemm_x *W2b) {
  const int64_t H = p->H, F = p->F, R = p->R;
  int rc;
  if ((rc = gx(p->be, QC_OP_N, QC_OP_T, n, R, H, f64op(Xf, H), W1f, p->h))) return rc;
  if (p->rb >= 3) rnd_all(p->rb, p->h, n * R); /* rb >= 3: the GEMM's output held in bf16 */
  qc_par_for(n, qc_refu_row_grain(R), act_f_rows, p);
  rnd_all(p->rb, p->a, n * F);
  if (p->ab) {
    qc_abs_all(Xb, n * H);
    W1b->flags |= QC_GX_ABS; /* the weights read as |W| from here on */
    W2b->flags |= QC_GX_ABS;
    W2f->flags |= QC_GX_ABS;
    qc_abs_all(p->a, n * F);
  }
  const double *A = p->a;
  if (p->afmt && strcmp(p->afmt, "none") != 0) {
    memcpy(p->aq, p->a, (size_t)(n * F) * sizeof *p->aq);
    if ((rc = fq(p->afmt, p->prof, n, F, p->aq, "reference moe: the activation rows into w2"))) return rc;
    rnd_all(p->rb, p->aq, n * F);
    A = p->aq;
  }
  if ((rc = gx(p->be, QC_OP_N, QC_OP_T, n, H, F, f64op(A, F), W2f, p->y))) return rc;
  if (p->rb >= 2) rnd_all(p->rb, p->y, n * H);
  return QC_OK;
}

/* *out = ||A^T B||_F for A [n, ka] and B [n, kb], both the terms'
 * magnitudes (>= 0): sqrt(<A A^T, B B^T>), the sum over row pairs of
 * their two [n, n] Gram matrices, where those cost fewer products than
 * A^T B itself (n (ka + kb) < ka kb: an expert's few rows against its
 * [R, H] block), else A^T B into a scratch block and its finite squares
 * summed. Equal in exact arithmetic; the Gram sum has no cancellation (no
 * negative term), so it agrees to rounding. A non-finite Gram sum (an
 * overflow the block's finite squares would have skipped) takes the
 * block. Sums in a fixed order. Returns a status. */
static int terms_norm(const qc_backend *be, int64_t n, int64_t ka, const double *A, int64_t kb, const double *B, double *out) {
  *out = 0.0;
  if (n < 1 || ka < 1 || kb < 1) return QC_OK;
  double ss = NAN;
  int rc;
  if ((double)n * (double)(ka + kb) < (double)ka * (double)kb) {
    double *g = qc_malloc((size_t)(2 * n * n) * sizeof *g, "reference moe terms' Gram matrices");
    if (!g) return QC_ESYS;
    rc = qc_refu_gemm(be, QC_OP_N, QC_OP_T, n, n, ka, A, A, g);
    if (!rc) rc = qc_refu_gemm(be, QC_OP_N, QC_OP_T, n, n, kb, B, B, g + n * n);
    ss = 0.0;
    for (int64_t i = 0; !rc && i < n * n; i++) ss += g[i] * g[n * n + i];
    free(g);
    if (rc) return rc;
  }
  if (!isfinite(ss)) {
    double *d = qc_malloc((size_t)(ka * kb) * sizeof *d, "reference moe terms' block");
    if (!d) return QC_ESYS;
    rc = qc_refu_gemm(be, QC_OP_T, QC_OP_N, ka, kb, n, A, B, d);
    ss = 0.0;
    for (int64_t i = 0; !rc && i < ka * kb; i++) ss += isfinite(d[i]) ? d[i] * d[i] : 0.0;
    free(d);
    if (rc) return rc;
  }
  *out = sqrt(ss);
  return QC_OK;
}

/* The backward of the n rows mlp_fwd made, from p->wg [n, H] (the caller's
 * scaled dy, rounded as it says): D2 [H, F] = WG^T A, dL/dA = WG W2 (held
 * in bf16 when rb >= 3), dL/dH = act'(h) dL/dA (rounded when rb), D1 [R, H]
 * = dL/dH^T X, and p->y [n, H] = dL/dH W1 (each row's d_x terms). D1 and D2
 * are overwritten (NULL: not computed). Returns a status. */
static int mlp_bwd(mlp *p, int64_t n, const double *X, const qc_gemm_x *W1, const qc_gemm_x *W2, double *D1, double *D2) {
  const int64_t H = p->H, F = p->F, R = p->R;
  int rc;
  if (D2 && (rc = p->tn ? terms_norm(p->be, n, H, p->wg, F, p->a, D2) : qc_refu_gemm(p->be, QC_OP_T, QC_OP_N, H, F, n, p->wg, p->a, D2)))
    return rc;
  if ((rc = gx(p->be, QC_OP_N, QC_OP_N, n, F, H, f64op(p->wg, H), W2, p->a))) return rc; /* a no longer needed: dL/da */
  if (p->rb >= 3) rnd_all(p->rb, p->a, n * F); /* dL/da: a GEMM's output held in bf16 */
  qc_par_for(n, qc_refu_row_grain(R), act_b_rows, p);
  rnd_all(p->rb, p->h, n * R);
  if (D1 && (rc = p->tn ? terms_norm(p->be, n, R, p->h, H, X, D1) : qc_refu_gemm(p->be, QC_OP_T, QC_OP_N, R, H, n, p->h, X, D1)))
    return rc;
  return gx(p->be, QC_OP_N, QC_OP_N, n, H, R, f64op(p->h, R), W1, p->y);
}

/* Expert e's [rows, cols] of the [E, rows, cols] tensor t, decoded into d. */
static int load_expert(const qc_tensor *t, int64_t e, double *d) {
  qc_tensor v = *t;
  const int64_t n = t->shape[1] * t->shape[2];
  v.ndim = 2;
  v.shape[0] = t->shape[1];
  v.shape[1] = t->shape[2];
  v.data = (char *)t->data + (size_t)(e * n) * qc_dtype_size(t->dtype);
  v.nbytes = (size_t)n * qc_dtype_size(t->dtype);
  return qc_tensor_to_f64(&v, d);
}

/* Expert e's matrix of the [E, rows, cols] tensor t, or dequant(quant(it))
 * under fmt (NULL: none), as a gemm_f64_x operand *op: the master's own
 * slice as stored (decoded into d where gemm_f64_x does not take its
 * dtype); the quantized one from the audit's memo where an earlier pass of
 * this module made it (the master is not read then), else made from the
 * master into d and kept (the operand then the memo's float32, else d).
 * Either way a device keeps its copy for the module's other passes
 * (backend.h, gemm_f64_x). d: rows x cols doubles. Returns a status. */
static int expert_op(const qc_tensor *t, int64_t e, const char *fmt, const char *prof, int64_t rows, int64_t cols, double *d,
                     const char *name, qc_gemm_x *op) {
  const int64_t n = rows * cols;
  if (!fmt && qc_gemm_x_dtype(t->dtype)) {
    *op = (qc_gemm_x){(const char *)t->data + (size_t)(e * n) * qc_dtype_size(t->dtype), t->dtype, cols, 0};
    return QC_OK;
  }
  *op = f64op(d, cols);
  if (!fmt) return load_expert(t, e, d);
  char tag[96], what[96];
  fq_tag(tag, sizeof tag, fmt, prof, e);
  const float *kept = qc_memo_get(t, tag, n);
  int rc = QC_OK;
  snprintf(what, sizeof what, "reference moe: params/%s expert %lld", name, (long long)e);
  if (!kept && strcmp(fmt, "none") != 0 && n > 0 && (t->dtype == QC_BF16 || t->dtype == QC_F16 || t->dtype == QC_F32)) {
    /* a master that widens to float32 exactly: quantized from there, as fq_of's narrowing of its float64 gives it,
     * without the float64 passes (the operand is the memo's float32) */
    float *f = qc_malloc((size_t)n * sizeof *f, what);
    if (!f) return QC_ESYS;
    rc = qc_float_to_f32(t->dtype, (const char *)t->data + (size_t)(e * n) * qc_dtype_size(t->dtype), n, f);
    if (!rc) rc = qc_fake_quant(fmt, prof, rows, cols, f, f, what);
    if (!rc && qc_memo_take(t, tag, f, n)) {
      *op = (qc_gemm_x){qc_memo_get(t, tag, n), QC_F32, cols, 0};
      return QC_OK;
    }
    if (!rc) rc = qc_float_to_f64(QC_F32, f, n, d); /* the memo keeps nothing (QATCHECK_MEMO=0): d is the operand */
    free(f);
    return rc;
  }
  if (!kept) {
    if ((rc = load_expert(t, e, d)) || (rc = fq_of(t, e, fmt, prof, rows, cols, d, what))) return rc;
    kept = qc_memo_get(t, tag, n); /* what fq_of left there, if the memo took it */
  }
  if (kept) *op = (qc_gemm_x){kept, QC_F32, cols, 0};
  return QC_OK;
}

/* The shared experts (contract shared_experts = S > 0), from the math: a
 * dense MLP every token passes through, out_t += g_t Ws2 act(Ws1 x_t), with
 * g_t = sigmoid(<x_t, sg>) under shared_gate = true (1 otherwise). So
 *   dL/dys = g dy_t,  dL/dWs2 += g dy_t a^T,  dL/da = g Ws2^T dy_t,
 *   dL/dh = act'(h) dL/da,  dL/dWs1 += dL/dh x_t^T,
 *   dL/dz = g (1 - g) <dy_t, ys>,  dL/dsg += dL/dz x_t,
 *   dL/dx_t += Ws1^T dL/dh + dL/dz sg.
 * The products run over all T tokens at once (mlp_fwd, mlp_bwd). X, G
 * [T, H] are x and dY (|dY| under the terms' scale); X is overwritten
 * (|x| under p.ab: the caller has no more use for it); dx [T, H] is added
 * to. Checks and refuses the shared tensors (a shared tensor the contract
 * does not use is refused). p: the activation, variants and H (its F, R
 * and buffers are set here). out [T, H] non-NULL: the forward only,
 * out_t += g_t ys_t (G, dx and grads unused). Returns a status. */
static int ref_shared(const qc_module *m, mlp p, double *X, const double *G, int64_t T, double *dx, qc_tset *grads, double *out) {
  const int64_t H = p.H;
  const int ab = p.ab, rb = p.rb;
  const double S = qc_contract_num(&m->contract, "shared_experts", 0);
  const char *gk = qc_contract_str(&m->contract, "shared_gate", "false");
  const int gated = strcmp(gk, "true") == 0;
  const qc_tensor *t1, *t2, *tg = NULL;
  int rc;
  if (!(S >= 0) || S != floor(S)) return qc_err("%s: contract key 'shared_experts' = %g: expected a whole number >= 0", m->path, S);
  if (!gated && strcmp(gk, "false") != 0) return qc_err("%s: contract key 'shared_gate' = '%s': expected true or false", m->path, gk);
  if (S == 0) {
    static const char *const names[] = {"shared_w1", "shared_w2", "shared_gate"};
    for (int i = 0; i < 3; i++)
      if (qc_tset_get(&m->params, names[i]))
        return qc_err("%s: dataset 'params/%s' is present but the contract's shared_experts is 0", m->path, names[i]);
    if (gated) return qc_err("%s: contract key 'shared_gate' is true but shared_experts is 0", m->path);
    return QC_OK;
  }
  if ((rc = qc_module_need(m, "params", "shared_w1", 2, 2, &t1))) return rc;
  if ((rc = qc_module_need(m, "params", "shared_w2", 2, 2, &t2))) return rc;
  if (gated && (rc = qc_module_need(m, "params", "shared_gate", 1, 2, &tg))) return rc;
  if (!gated && qc_tset_get(&m->params, "shared_gate"))
    return qc_err("%s: dataset 'params/shared_gate' is present but the contract's shared_gate is false", m->path);
  const int64_t Fs = t2->shape[1], Rs = p.relu2 ? Fs : 2 * Fs;
  if (t2->shape[0] != H || Fs < 1 || Fs % (int64_t)S != 0)
    return qc_err("%s: 'params/shared_w2': expected [H, Fs] with H = %lld, Fs a multiple of %g", m->path, (long long)H, S);
  if (t1->shape[0] != Rs || t1->shape[1] != H)
    return qc_err("%s: 'params/shared_w1': expected [%lld, %lld]", m->path, (long long)Rs, (long long)H);
  if (tg && (qc_numel(tg) != H || tg->shape[tg->ndim - 1] != H))
    return qc_err("%s: 'params/shared_gate': expected [1, H] or [H] with H = %lld", m->path, (long long)H);
  double *W1 = NULL, *W2 = NULL, *SG = NULL, *gs = NULL, *d1, *d2, *dg = NULL;
  p.F = Fs;
  p.R = Rs;
  p.afmt = p.wfmt = NULL; /* the expert formats are the routed experts' */
  p.h = p.a = p.y = p.wg = p.tmp = p.aq = NULL;
  rc = QC_ESYS;
  /* the weights as stored (a device keeps them for the module's other passes); decoded once on the host's
   * backend (its GEMMs read them twice) and where gemm_f64_x takes not their dtype */
  const int wide = p.be->host_memory;
  if (((wide || !qc_gemm_x_dtype(t1->dtype)) && !(W1 = qc_refu_load(t1, "reference moe shared_w1"))) ||
      ((wide || !qc_gemm_x_dtype(t2->dtype)) && !(W2 = qc_refu_load(t2, "reference moe shared_w2"))) ||
      (tg && !(SG = qc_refu_load(tg, "reference moe shared_gate"))) ||
      !(gs = qc_malloc((size_t)T * sizeof *gs, "reference moe shared gate")) || (rc = mlp_alloc(&p, T)))
    goto done;
  /* d_shared_w1, d_shared_w2: mlp_bwd's GEMM outputs, every element written when there are tokens (under
   * p.tn each one norm) */
  static const int64_t one = 1;
  if (!out && ((rc = qc_refu_out_z(grads, "d_shared_w1", p.tn ? 1 : 2, p.tn ? &one : t1->shape, T == 0, &d1)) ||
               (rc = qc_refu_out_z(grads, "d_shared_w2", p.tn ? 1 : 2, p.tn ? &one : t2->shape, T == 0, &d2)) ||
               (tg && (rc = qc_refu_out(grads, "d_shared_gate", tg->ndim, tg->shape, &dg)))))
    goto done;
  /* the gate from the signed x and sg (the forward), before mlp_fwd makes X |x| under ab */
  for (int64_t t = 0; t < T; t++) {
    double z = 0;
    for (int64_t c = 0; SG && c < H; c++) z += X[t * H + c] * SG[c];
    if (rb >= 3) z = rnd(rb, z); /* the gate's GEMM output, then its sigmoid rounded (every op under rb 4) */
    gs[t] = !SG ? 1.0 : rb >= 4 ? rnd(1, 1.0 / rnd(1, 1.0 + rnd(1, exp(-z)))) : rb >= 3 ? rnd(1, sigma(z)) : sigma(z);
  }
  /* forward and backward: the same operands (|.| under ab once h is made) */
  qc_gemm_x w1 = W1 ? f64op(W1, H) : (qc_gemm_x){t1->data, t1->dtype, H, 0}, w2 = W2 ? f64op(W2, Fs) : (qc_gemm_x){t2->data, t2->dtype, Fs, 0};
  if ((rc = mlp_fwd(&p, T, X, &w1, &w2, X, &w1, &w2))) goto done;
  if (out) { /* the forward: out_t += g_t ys_t */
    for (int64_t t = 0; t < T; t++)
      for (int64_t c = 0; c < H; c++) out[t * H + c] += gs[t] * p.y[t * H + c];
    rc = QC_OK;
    goto done;
  }
  /* dL/dz_t = g (1 - g) <dy_t, ys> (gs[t] becomes it once read); dL/dys = g dy_t */
  for (int64_t t = 0; t < T; t++) {
    const double *g = G + t * H;
    double dot = 0;
    for (int64_t c = 0; c < H; c++) dot += g[c] * p.y[t * H + c];
    for (int64_t c = 0; c < H; c++) p.wg[t * H + c] = SG ? rnd(rb, gs[t] * g[c]) : g[c];
    gs[t] = SG ? gs[t] * (ab ? 1.0 + gs[t] : 1.0 - gs[t]) * dot : 0.0;
  }
  if ((rc = mlp_bwd(&p, T, X, &w1, &w2, d1, d2))) goto done;
  if (ab && SG) qc_abs_all(SG, H);
  for (int64_t t = 0; t < T; t++)
    for (int64_t c = 0; c < H; c++) {
      dx[t * H + c] += p.y[t * H + c];
      if (SG) {
        dg[c] += gs[t] * X[t * H + c];
        dx[t * H + c] += gs[t] * SG[c];
      }
    }
  rc = QC_OK;
done:
  free(W1); free(W2); free(SG); free(gs);
  mlp_free(&p);
  return rc;
}

/* One expert's rows on qc_par_for's threads: gathered by row, reduced by
 * row, or added into their tokens by feature (every token's element takes
 * its rows' terms in row order, a token routed twice to the expert
 * twice), so any thread count gives the same values. */
typedef struct slot_rows {
  const int64_t *sl;  /* [n] the expert's slots s = t k + j */
  int64_t n, k, H;
  int rb, scaled;     /* scaled: acc += w y (the forward), else acc += y (d_x) */
  const double *X, *XQ, *G, *Wt, *y;
  double *Xe, *Xq, *wg, *dwt, *acc;
} slot_rows;

static void gather_rows(void *ctx, int64_t lo, int64_t hi, int tid) {
  (void)tid;
  const slot_rows *r = ctx;
  for (int64_t i = lo; i < hi; i++) {
    memcpy(r->Xe + i * r->H, r->X + r->sl[i] / r->k * r->H, (size_t)r->H * sizeof *r->Xe);
    memcpy(r->Xq + i * r->H, r->XQ + r->sl[i] / r->k * r->H, (size_t)r->H * sizeof *r->Xq);
  }
}

static void dot_rows(void *ctx, int64_t lo, int64_t hi, int tid) {
  (void)tid;
  const slot_rows *r = ctx;
  const int64_t H = r->H;
  for (int64_t i = lo; i < hi; i++) {
    const double *g = r->G + r->sl[i] / r->k * H, w = r->Wt[r->sl[i]];
    double dot = 0;
    for (int64_t c = 0; c < H; c++) dot += g[c] * r->y[i * H + c];
    r->dwt[r->sl[i]] = dot;
    for (int64_t c = 0; c < H; c++) r->wg[i * H + c] = rnd(r->rb, w * g[c]);
  }
}

static void add_rows(void *ctx, int64_t lo, int64_t hi, int tid) {
  (void)tid;
  const slot_rows *r = ctx;
  const int64_t H = r->H;
  for (int64_t i = 0; i < r->n; i++) {
    double *o = r->acc + r->sl[i] / r->k * H;
    const double w = r->scaled ? r->Wt[r->sl[i]] : 1.0, *y = r->y + i * H;
    if (r->scaled)
      for (int64_t c = lo; c < hi; c++) o[c] += w * y[c];
    else
      for (int64_t c = lo; c < hi; c++) o[c] += y[c];
  }
}

/* Expert e's blocks of the streamed gradients, B1 [R, H] of d_w1 and B2
 * [H, F] of d_w2, handed to p->sk (its rows e R .. and e H ..). */
static int put_expert(const mlp *p, int64_t e, const double *B1, const double *B2) {
  int rc = QC_OK;
  if (p->st1) rc = p->sk->rows(p->sk, "d_w1", e * p->R, (e + 1) * p->R, B1);
  if (!rc && p->st2) rc = p->sk->rows(p->sk, "d_w2", e * p->H, (e + 1) * p->H, B2);
  return rc;
}

/* The routed experts, grouped by expert (the file's top comment): X, G
 * [T, H] (x and dY), XQ [T, H] (dequant(quant(x)) under the activation
 * format, the forward's input rows; X itself without one), Wt [T, k] (the
 * weights; |.| under ab), id [T, k]; the gradients' storage dx, dwt, dw1,
 * dw2 (zeroed). p: the activation, quantization, variants and sizes (its
 * buffers are made here). Expert e's forward weights are
 * dequant(quant(W1_e)), dequant(quant(W2_e)) under p.wfmt (each [rows,
 * cols] matrix on its own, as a linear's weight), rounded to bf16 under
 * the variants (the production's GEMM operands); its backward's (d_a =
 * W2^T w dy, d_x += W1^T d_h) the same, or the masters under dx_master;
 * d_W1, d_W2 take x and a unquantized (the straight-through estimator).
 * out [T, H] non-NULL: the forward only, out_t += w_tj y for each slot (G
 * and the gradients unused); fc1 [T k, R] non-NULL: the forward's h of
 * each slot s = t k + j instead (out NULL). Returns a status. */
static int ref_routed(mlp p, const qc_tensor *w1t, const qc_tensor *w2t, const double *X, const double *XQ, const double *G,
                      const double *Wt, const int64_t *id, int64_t T, int64_t k, int64_t E, double *dx, double *dwt, double *dw1,
                      double *dw2, double *out, double *fc1) {
  const int64_t H = p.H, F = p.F, R = p.R, s1 = p.tn ? 1 : R * H, s2 = p.tn ? 1 : H * F; /* an expert's block */
  int64_t *off = NULL, *ord = NULL, nmax = 0;
  double *W1 = NULL, *W2 = NULL, *W1q = NULL, *W2q = NULL, *Xe = NULL, *Xq = NULL, *B1 = NULL, *B2 = NULL;
  const int wq = p.wfmt && strcmp(p.wfmt, "none") != 0;
  int rc = QC_ESYS;
  p.h = p.a = p.y = p.wg = p.tmp = p.aq = NULL;
  /* ord[off[e] .. off[e+1]) = the slots s = t k + j routed to e, s increasing */
  if (!(off = qc_malloc((size_t)(E + 1) * sizeof *off, "reference moe groups")) ||
      !(ord = qc_malloc((size_t)(T * k) * sizeof *ord, "reference moe groups")))
    goto done;
  memset(off, 0, (size_t)(E + 1) * sizeof *off);
  for (int64_t s = 0; s < T * k; s++) off[id[s] + 1]++;
  for (int64_t e = 0; e < E; e++) {
    nmax = off[e + 1] > nmax ? off[e + 1] : nmax;
    off[e + 1] += off[e];
  }
  for (int64_t s = 0; s < T * k; s++) ord[off[id[s]]++] = s; /* off[e] moves to e's end ... */
  for (int64_t e = E; e > 0; e--) off[e] = off[e - 1];        /* ... and back to e's start */
  off[0] = 0;
  if (!(W1 = qc_malloc((size_t)(R * H) * sizeof *W1, "reference moe w1")) ||
      !(W2 = qc_malloc((size_t)(H * F) * sizeof *W2, "reference moe w2")) ||
      !(W1q = qc_malloc((size_t)(R * H) * sizeof *W1q, "reference moe w1 dequantized")) ||
      !(W2q = qc_malloc((size_t)(H * F) * sizeof *W2q, "reference moe w2 dequantized")) ||
      !(Xe = qc_malloc((size_t)(nmax * H + 1) * sizeof *Xe, "reference moe x rows")) ||
      !(Xq = qc_malloc((size_t)(nmax * H + 1) * sizeof *Xq, "reference moe x rows")) ||
      (p.st1 && !(B1 = qc_malloc((size_t)s1 * sizeof *B1, "reference moe d_w1 of an expert"))) ||
      (p.st2 && !(B2 = qc_malloc((size_t)s2 * sizeof *B2, "reference moe d_w2 of an expert"))) || (rc = mlp_alloc(&p, nmax)))
    goto done;
  for (int64_t e = 0; e < E; e++) {
    const int64_t n = off[e + 1] - off[e], *sl = ord + off[e];
    double *d1 = p.st1 ? B1 : dw1 ? dw1 + e * s1 : NULL, *d2 = p.st2 ? B2 : dw2 ? dw2 + e * s2 : NULL;
    if (n == 0) { /* nobody selects e: its gradients are zero */
      if (d1) memset(d1, 0, (size_t)s1 * sizeof *d1);
      if (d2) memset(d2, 0, (size_t)s2 * sizeof *d2);
      if ((rc = put_expert(&p, e, B1, B2))) goto done;
      continue;
    }
    /* the forward's weights, and the backward's: dequantized, or the masters (read only where the backward
     * takes them: a forward pass, or the dequantized chain, never reads them) */
    const int dxm = !out && !fc1 && (p.dx_master || p.master_e == e + 1);
    qc_gemm_x w1m, w2m, w1q, w2q;
    if (dxm && ((rc = expert_op(w1t, e, NULL, p.prof, R, H, W1, "w1", &w1m)) ||
                (rc = expert_op(w2t, e, NULL, p.prof, H, F, W2, "w2", &w2m))))
      goto done;
    if ((rc = expert_op(w1t, e, wq ? p.wfmt : NULL, p.prof, R, H, W1q, "w1", &w1q)) ||
        (rc = expert_op(w2t, e, wq ? p.wfmt : NULL, p.prof, H, F, W2q, "w2", &w2q)))
      goto done;
    if (p.rb) w1q.flags |= QC_GX_BF16, w2q.flags |= QC_GX_BF16; /* the variants: the production's bf16 operands */
    if ((rc = qc_refu_hold(p.be, &w1q, R, H, W1q)) || (rc = qc_refu_hold(p.be, &w2q, H, F, W2q)) ||
        (dxm && ((rc = qc_refu_hold(p.be, &w1m, R, H, W1)) || (rc = qc_refu_hold(p.be, &w2m, H, F, W2)))))
      goto done;
    qc_gemm_x *W1b = dxm ? &w1m : &w1q, *W2b = dxm ? &w2m : &w2q;
    slot_rows sr = {.sl = sl, .k = k, .H = H, .rb = p.rb, .X = X, .XQ = XQ, .Xe = Xe, .Xq = Xq, .G = G, .Wt = Wt, .y = p.y,
                    .wg = p.wg, .dwt = dwt, .acc = out ? out : dx};
    qc_par_for(n, qc_refu_row_grain(H), gather_rows, &sr);
    if ((rc = mlp_fwd(&p, n, Xq, &w1q, &w2q, Xe, W1b, W2b))) goto done;
    if (fc1) { /* the saved FC1 output: each slot's h */
      for (int64_t i = 0; i < n; i++) memcpy(fc1 + sl[i] * R, p.h + i * R, (size_t)R * sizeof *fc1);
      continue;
    }
    sr.n = n;
    if (out) { /* the forward: each slot's w_tj y added to its token, expert by expert */
      sr.scaled = 1;
      qc_par_for(H, 64, add_rows, &sr);
      continue;
    }
    /* dL/dw = <dy_t, y>;  the rows' w dy_t, rounded as the GEMMs' operand */
    qc_par_for(n, qc_refu_row_grain(H), dot_rows, &sr);
    if ((rc = mlp_bwd(&p, n, Xe, W1b, W2b, d1, d2)) || (rc = put_expert(&p, e, B1, B2))) goto done;
    sr.scaled = 0;
    qc_par_for(H, 64, add_rows, &sr); /* the rows' W1^T dL/dh into their tokens' d_x */
  }
  rc = QC_OK;
done:
  free(off); free(ord); free(W1); free(W2); free(W1q); free(W2q); free(Xe); free(Xq); free(B1); free(B2);
  mlp_free(&p);
  return rc;
}

/* A moe module's tensors and settings, checked: x [T, H], w1 [E, R, H],
 * w2 [E, H, F], topk_ids [T, k] (ids[] decoded, each in [0, E)),
 * topk_weights [T, k] (inputs/ or saved/), the activation, its clamp. */
typedef struct {
  const qc_tensor *xt, *w1t, *w2t, *wtt;
  int64_t T, H, E, F, k, R;
  int relu2, pass;
  double L;
  const char *wfmt, *afmt, *prof; /* expert_weight_format, expert_act_format, profile */
  int dx_master;                  /* dx_weight = master */
  int64_t *id; /* [T k], the caller frees it */
} moe_in;

/* Read and check m's tensors and contract into *in. Returns a status
 * (in->id NULL unless QC_OK). */
static int moe_in_get(const qc_module *m, moe_in *in) {
  const qc_tensor *it;
  int rc;
  memset(in, 0, sizeof *in);
  if ((rc = qc_module_need(m, "inputs", "x", 2, 2, &in->xt))) return rc;
  if ((rc = qc_module_need(m, "params", "w1", 3, 3, &in->w1t))) return rc;
  if ((rc = qc_module_need(m, "params", "w2", 3, 3, &in->w2t))) return rc;
  if ((rc = qc_module_need(m, "saved", "topk_ids", 2, 2, &it))) return rc;
  const char *role = qc_tset_get(&m->inputs, "topk_weights") ? "inputs" : "saved";
  if ((rc = qc_module_need(m, role, "topk_weights", 1, QC_MAXDIM, &in->wtt))) return rc;
  const char *act = qc_contract_str(&m->contract, "activation", "swiglu");
  in->relu2 = strcmp(act, "relu2") == 0;
  if (!in->relu2 && strcmp(act, "swiglu") != 0)
    return qc_err("%s: contract key 'activation' = '%s': expected swiglu or relu2", m->path, act);
  in->L = qc_contract_num(&m->contract, "limit", 0);
  in->pass = strcmp(qc_contract_str(&m->contract, "at_limit", "pass"), "pass") == 0;
  in->wfmt = qc_contract_str(&m->contract, "expert_weight_format", "none");
  in->afmt = qc_contract_str(&m->contract, "expert_act_format", "none");
  in->prof = qc_contract_str(&m->contract, "profile", "vllm"); /* --profile and the deployed bytes' are merged into it */
  if (strcmp(in->prof, "auto") == 0) in->prof = "vllm";        /* left unresolved (no bytes read): vllm's, as the engine's */
  in->dx_master = strcmp(qc_contract_str(&m->contract, "dx_weight", "dequant"), "master") == 0;
  if (strcmp(in->wfmt, "none") != 0 && !qc_quant_known(in->wfmt))
    return qc_err("%s: contract key 'expert_weight_format' = '%s': not a weight format", m->path, in->wfmt);
  if (strcmp(in->afmt, "none") != 0 && !qc_quant_known(in->afmt))
    return qc_err("%s: contract key 'expert_act_format' = '%s': not an activation format", m->path, in->afmt);
  if (!(in->L >= 0)) return qc_err("%s: contract key 'limit' = %g: expected >= 0", m->path, in->L);
  if (in->L > 0 && in->relu2) return qc_err("%s: contract key 'limit' = %g: only activation swiglu has a clamp", m->path, in->L);
  const qc_tensor *w1t = in->w1t, *w2t = in->w2t, *wtt = in->wtt;
  const int64_t T = in->xt->shape[0], H = in->xt->shape[1], E = w2t->shape[0], F = w2t->shape[2], k = it->shape[1];
  const int64_t R = in->relu2 ? F : 2 * F;
  if (w2t->shape[1] != H || F < 1 || E < 1) return qc_err("%s: 'params/w2': expected [E, H, F] with H = %lld", m->path, (long long)H);
  if (w1t->shape[0] != E || w1t->shape[1] != R || w1t->shape[2] != H)
    return qc_err("%s: 'params/w1' is [%lld, %lld, %lld]: expected [%lld, %lld, %lld] for activation %s", m->path,
                  (long long)w1t->shape[0], (long long)w1t->shape[1], (long long)w1t->shape[2], (long long)E, (long long)R,
                  (long long)H, act);
  if (it->shape[0] != T) return qc_err("%s: 'saved/topk_ids': expected [%lld, k]", m->path, (long long)T);
  if (wtt->ndim != 2 || wtt->shape[0] != T || wtt->shape[1] != k)
    return qc_err("%s: '%s/topk_weights': expected [T, k] = [%lld, %lld]", m->path, role, (long long)T, (long long)k);
  in->T = T, in->H = H, in->E = E, in->F = F, in->k = k, in->R = R;
  if ((rc = qc_refu_ids(m, it, "saved/topk_ids", &in->id))) return rc;
  for (int64_t i = 0; i < T * k; i++)
    if (in->id[i] < 0 || in->id[i] >= E) {
      rc = qc_err("%s: 'saved/topk_ids'[%lld, %lld] = %lld: expected 0..%lld", m->path, (long long)(i / k), (long long)(i % k),
                  (long long)in->id[i], (long long)(E - 1));
      free(in->id);
      in->id = NULL;
      return rc;
    }
  return QC_OK;
}

/* *XQ [T, H] = dequant(quant(x)) under the activation format, each token's
 * row on its own (the forward's input rows into w1), rounded to bf16 under
 * the variants (the production's GEMM operand); a copy of X without one.
 * Returns a status. */
static int x_quantized(const moe_in *in, int rb, const double *X, double **XQ) {
  const int64_t n = in->T * in->H;
  if (!(*XQ = qc_malloc((size_t)n * sizeof **XQ + 8, "reference moe quantized x"))) return QC_ESYS;
  memcpy(*XQ, X, (size_t)n * sizeof **XQ);
  if (strcmp(in->afmt, "none") == 0) return QC_OK;
  int rc = fq(in->afmt, in->prof, in->T, in->H, *XQ, "reference moe: inputs/x");
  rnd_all(rb, *XQ, n);
  return rc;
}

/* The float64 VJP from the math above (a qc_vjp_fn): every gradient the contract makes
 * differentiable into grads; QC_EINPUT naming what is wrong with bad input. */
static int ref_moe(const qc_ctx *ctx, const qc_module *m, const qc_tensor *dy, qc_tset *grads) {
  const int ab = ctx && ctx->terms, rb = ctx && !ab ? ctx->round_ops : 0;
  moe_in in;
  int rc;
  if ((rc = moe_in_get(m, &in))) return rc;
  const int64_t T = in.T, H = in.H, k = in.k;
  double *X = NULL, *XQ = NULL, *Wt = NULL, *G = NULL;
  double *dx, *dw1, *dw2, *dwt;
  if ((rc = qc_module_check_dy(m, dy, T * H, H, "the shape of inputs/x [T, H]"))) goto done;
  /* the terms' scale runs with a bare ctx (engine/audit.c): the CPU's float64 GEMM then */
  mlp p = {.be = ctx && ctx->be ? ctx->be : qc_backend_cpu(), .relu2 = in.relu2, .pass = in.pass, .ab = ab, .rb = rb,
                 .tn = ab && ctx->terms >= 2,
                 .L = in.L, .H = H, .F = in.F, .R = in.R, .afmt = in.afmt, .prof = in.prof, .wfmt = in.wfmt,
                 .dx_master = in.dx_master, .master_e = ctx ? ctx->master_expert : 0};
  rc = QC_ESYS;
  if (!(X = qc_refu_load(in.xt, "reference moe x")) || !(Wt = qc_refu_load(in.wtt, "reference moe topk_weights")) ||
      !(G = qc_refu_load(dy, "reference moe dY")) || (rc = x_quantized(&in, rb, X, &XQ)))
    goto done;
  for (int64_t i = 0; ab && i < T * H; i++) G[i] = fabs(G[i]); /* the terms' scale: |dY|, |w| */
  for (int64_t i = 0; ab && i < T * k; i++) Wt[i] = fabs(Wt[i]);
  int64_t ws[2] = {T, k};
  /* d_w1, d_w2: each expert's block is a GEMM's output, or zeroed by ref_routed when nobody selects it;
   * under p.tn each expert's block one norm, [E]; or each block handed to the engine's sink */
  const int want1 = qc_ctx_wants(ctx, "d_w1"), want2 = qc_ctx_wants(ctx, "d_w2"); /* a variant run for another leaves them out */
  dw1 = dw2 = NULL;
  if ((rc = qc_refu_out(grads, "d_x", 2, in.xt->shape, &dx)) ||
      (want1 && (rc = p.tn ? qc_refu_out_z(grads, "d_w1", 1, &in.E, 0, &dw1)
                           : qc_refu_out_s(ctx, grads, "d_w1", 3, in.w1t->shape, 0, &dw1))) ||
      (want2 && (rc = p.tn ? qc_refu_out_z(grads, "d_w2", 1, &in.E, 0, &dw2)
                           : qc_refu_out_s(ctx, grads, "d_w2", 3, in.w2t->shape, 0, &dw2))) ||
      (rc = qc_refu_out(grads, "d_topk_weights", 2, ws, &dwt)))
    goto done;
  p.sk = ctx ? ctx->sink : NULL, p.st1 = want1 && !dw1, p.st2 = want2 && !dw2;
  if ((rc = ref_routed(p, in.w1t, in.w2t, X, XQ, G, Wt, in.id, T, k, in.E, dx, dwt, dw1, dw2, NULL, NULL))) goto done;
  rc = ref_shared(m, p, X, G, T, dx, grads, NULL);
done:
  free(in.id); free(X); free(XQ); free(Wt); free(G);
  return rc;
}

/* The forward the contract defines, in float64: outputs/y [T, H] (y
 * non-NULL, fc1 NULL) or the FC1 output of every slot, saved/fc1_out
 * [T k, R] (fc1 non-NULL). Returns a status. */
static int moe_fwd(const qc_ctx *ctx, const qc_module *m, qc_tensor *y, double **fc1) {
  if (ctx && ctx->wscale > 0) return QC_NA; /* a stale per-tensor scale is linear's variant, not one of an expert's */
  moe_in in;
  int rc;
  if ((rc = moe_in_get(m, &in))) return rc;
  const int64_t T = in.T, H = in.H;
  const int rb = ctx ? ctx->round_ops : 0;
  double *X = NULL, *XQ = NULL, *Wt = NULL;
  const mlp p = {.be = ctx && ctx->be ? ctx->be : qc_backend_cpu(), .relu2 = in.relu2, .pass = in.pass, .rb = rb, .L = in.L,
                 .H = H, .F = in.F, .R = in.R, .afmt = in.afmt, .prof = in.prof, .wfmt = in.wfmt, .dx_master = in.dx_master};
  rc = QC_ESYS;
  if (!(X = qc_refu_load(in.xt, "reference moe x")) || !(Wt = qc_refu_load(in.wtt, "reference moe topk_weights")) ||
      (rc = x_quantized(&in, rb, X, &XQ)))
    goto done;
  if (fc1) {
    rc = QC_ESYS;
    if (!(*fc1 = qc_calloc((size_t)(T * in.k * in.R) + 1, sizeof **fc1, "reference moe fc1_out"))) goto done;
    rc = ref_routed(p, in.w1t, in.w2t, X, XQ, NULL, Wt, in.id, T, in.k, in.E, NULL, NULL, NULL, NULL, NULL, *fc1);
    goto done;
  }
  if ((rc = qc_tensor_alloc(y, "y", QC_F64, 2, in.xt->shape))) goto done;
  memset(y->data, 0, (size_t)(T * H) * sizeof(double));
  if ((rc = ref_routed(p, in.w1t, in.w2t, X, XQ, NULL, Wt, in.id, T, in.k, in.E, NULL, NULL, NULL, NULL, y->data, NULL))) goto done;
  rc = ref_shared(m, p, X, NULL, T, NULL, NULL, y->data);
done:
  if (rc && y) qc_tensor_free(y);
  if (rc && fc1) { free(*fc1); *fc1 = NULL; }
  free(in.id); free(X); free(XQ); free(Wt);
  return rc;
}

/* The forward the contract defines, in float64 (a qc_fwd_ref_fn). */
static int ref_moe_forward(const qc_ctx *ctx, const qc_module *m, qc_tensor *y, qc_tol_model *tm) {
  (void)tm; /* left zero: engine/forward.c models the forward as the d_x chain run forward */
  return moe_fwd(ctx, m, y, NULL);
}

/* The saved tensor the backward reuses, recomputed (a qc_saved_ref_fn):
 * saved/fc1_out, the FC1 output h = dequant(quant(W1_e)) dequant(quant(x_t))
 * of each (token, slot) pair, [T, k, R] (or [T k, R]: the dump's layout is
 * kept by the caller); QC_NA for every other saved tensor (the ids, the
 * deployed bytes: checked elsewhere). Its error model: one length-H dot
 * per element (terms |x_q| |W1_q|). */
static int ref_moe_saved(const qc_ctx *ctx, const qc_module *m, const char *name, qc_tensor *r, qc_tol_model *tm) {
  if (strcmp(name, "fc1_out") != 0) return QC_NA;
  double *h = NULL;
  int rc = moe_fwd(ctx, m, NULL, &h);
  if (rc) return rc;
  moe_in in;
  if ((rc = moe_in_get(m, &in))) { free(h); return rc; }
  free(in.id);
  int64_t shape[3] = {in.T, in.k, in.R};
  if ((rc = qc_tensor_alloc(r, name, QC_F64, 3, shape))) { free(h); return rc; }
  memcpy(r->data, h, (size_t)(in.T * in.k * in.R) * sizeof *h);
  free(h);
  memset(tm, 0, sizeof *tm);
  tm->k = in.H;
  tm->lambda = 1;
  snprintf(tm->why, sizeof tm->why, "fc1_out = W1_e x_t per (token, slot) pair sums over the H = %lld hidden features", (long long)in.H);
  return QC_OK;
}

/* The class's reference, its one export (src/classes/registry.c pairs it
 * with src/modules/moe.c). */
const qc_reference qc_reference_moe = {.vjp = ref_moe, .forward = ref_moe_forward, .saved = ref_moe_saved, .terms = 1};
