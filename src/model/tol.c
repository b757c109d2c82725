/* tol.c: tolerance derivation and the noise floor (see tol.h). */
#include "model/tol.h"

#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "numerics/decode.h"
#include "numerics/quant.h"
#include "core/qc.h"

/* The element type of each accepted name, whose unit roundoff
 * (qc_dtype_unit) it has; tf32 rounds to float16's significand (10 bits)
 * in float32's range, so it has float16's. */
static const struct {
  const char *names; /* '|'-separated, the first is the canonical one */
  qc_dtype dt;
} g_u[] = {
    {"float64|fp64|f64|double", QC_F64}, {"float32|fp32|f32|float", QC_F32}, {"tf32", QC_F16},
    {"float16|fp16|f16|half", QC_F16},   {"bfloat16|bf16", QC_BF16},         {"float8_e4m3fn|e4m3|fp8_e4m3", QC_E4M3},
    {"float8_e5m2|e5m2|fp8_e5m2", QC_E5M2}, {"float4_e2m1fn_x2|e2m1|fp4", QC_E2M1X2},
};

/* 1 when `name` is one of the '|'-separated words of `list`. */
static int in_list(const char *list, const char *name) {
  size_t n = strlen(name);
  for (const char *p = list; *p;) {
    const char *e = strchr(p, '|');
    size_t l = e ? (size_t)(e - p) : strlen(p);
    if (l == n && strncmp(p, name, n) == 0) return 1;
    if (!e) break;
    p = e + 1;
  }
  return 0;
}

int qc_tol_unit_roundoff(const char *name, const char *what, int allow_format, double *u) {
  for (size_t i = 0; i < sizeof g_u / sizeof g_u[0]; i++)
    if (in_list(g_u[i].names, name)) {
      *u = qc_dtype_unit(g_u[i].dt);
      return QC_OK;
    }
  if (allow_format && strcmp(name, "none") == 0) { *u = 0; return QC_OK; }
  if (allow_format && in_list(QC_WEIGHT_FORMATS "|" QC_ACT_FORMATS, name)) {
    /* the element format's roundoff: the scale only places the block */
    int fp4 = strcmp(name, "nvfp4") == 0 || strcmp(name, "mxfp4") == 0;
    *u = qc_dtype_unit(fp4 ? QC_E2M1X2 : QC_E4M3);
    return QC_OK;
  }
  if (allow_format)
    qc_err("%s '%s' is not a known format: expected an element dtype (e4m3, e5m2, e2m1) or a format (%s|%s)", what,
           name, QC_WEIGHT_FORMATS, QC_ACT_FORMATS + 5);
  else
    qc_err("%s '%s' is not a known dtype: expected float64, float32, tf32, float16, bfloat16, float8_e4m3fn, "
           "float8_e5m2, float4_e2m1fn_x2 (or fp64, fp32, fp16, bf16, e4m3, e5m2, e2m1)", what, name);
  return QC_EINPUT;
}

double qc_tol_round(double x, int digits, int dir) {
  if (!(x > 0) || !isfinite(x)) return x;
  int e = (int)floor(log10(x)) - (digits - 1);
  double m = x / pow(10.0, e);
  double r = dir > 0 ? ceil(m * (1 - 1e-12)) : floor(m * (1 + 1e-12));
  for (int i = 0; i < 3; i++) {
    char s[48];
    snprintf(s, sizeof s, "%.0fe%d", r, e);
    double v = strtod(s, NULL);
    if (dir > 0 ? v >= x : v <= x) return v;
    r += dir > 0 ? 1 : -1;
  }
  return x;
}

/* 1 - slack rounded down, printed short: slack rounded up to 3 digits. */
static double one_minus_up(double slack) {
  double s = qc_tol_round(slack, 3, +1);
  if (!(s > 0)) return 1.0;
  if (s >= 1) return 0.0;
  char buf[48];
  int dec = (int)ceil(-log10(s)) + 3;
  snprintf(buf, sizeof buf, "%.*f", dec, 1.0 - s);
  double v = strtod(buf, NULL);
  return v > 1.0 - s ? 1.0 - s : v;
}

int qc_tol_derive(const qc_tol_spec *s, qc_tol_terms *t) {
  int rc;
  memset(t, 0, sizeof *t);
  if (!s->out_dtype) return qc_err("tol: '--out-dtype' is required: expected the dtype the gradient is stored in");
  if (s->k < 1) return qc_err("tol: '--k' is %lld: expected the reduction length, at least 1", (long long)s->k);
  /* up to 2 a GEMM's operands, and 3 more a bf16-computing module's own
   * roundings (compute_dtype, engine/audit.h) */
  if (s->rounded_operands < 0 || s->rounded_operands > 5)
    return qc_err("tol: '--rounded-operands' is %d: expected 0 to 5", s->rounded_operands);
  if ((rc = qc_tol_unit_roundoff(s->out_dtype, "--out-dtype", 0, &t->u_out))) return rc;
  if ((rc = qc_tol_unit_roundoff(s->operand_dtype ? s->operand_dtype : s->out_dtype, "--operand-dtype", 0, &t->u_op)))
    return rc;
  if ((rc = qc_tol_unit_roundoff(s->acc_dtype ? s->acc_dtype : "float32", "--acc-dtype", 0, &t->u_acc))) return rc;
  if (s->format && (rc = qc_tol_unit_roundoff(s->format, "--format", 1, &t->u_fmt))) return rc;
  t->lambda = s->lambda > 0 ? s->lambda : QC_TOL_LAMBDA;
  t->margin = s->margin > 0 ? s->margin : QC_TOL_MARGIN;
  if (t->margin < 1) return qc_err("tol: '--margin' is %g: expected a safety factor of at least 1", t->margin);
  double r3 = sqrt(3.0), k = (double)s->k;
  t->e_out = t->u_out / r3;
  t->e_acc = t->lambda * sqrt(k) * t->u_acc;
  t->e_op = sqrt((double)s->rounded_operands) * t->u_op / r3;
  t->e_fmt = t->u_fmt / r3;
  double e = t->margin * sqrt(t->e_out * t->e_out + t->e_acc * t->e_acc + t->e_op * t->e_op + t->e_fmt * t->e_fmt);
  t->rel_l2 = qc_tol_round(e, 3, +1);
  e = t->rel_l2;
  if (e >= 1)
    return qc_err("tol: the derived rel_l2 is %.3g: expected below 1 (at this precision and K the result carries no "
                  "digits; use a wider accumulator)", e);
  /* 1 - cosine is resolved to ~1e-16 absolute (metrics.c); keep 1e-12 of room */
  t->cosine_min = one_minus_up(fmax(1.0 - sqrt(1.0 - e * e), 1e-12));
  t->norm_lo = one_minus_up(e);
  t->norm_hi = 1.0 + e;
  /* A correct candidate rounds c = r + d, d its pre-rounding error, to the
   * same grid the floor rounds r to: E (round(c) - r)^2 = ulp^2/12 + d^2, so
   * the multiple is sqrt(1 + (|d| / floor)^2); the floor of real data is at
   * least e_out / 2 (every mantissa at the top of its binade). */
  double pre = t->margin * sqrt(t->e_acc * t->e_acc + t->e_op * t->e_op + t->e_fmt * t->e_fmt);
  t->noise_multiple = qc_tol_round(sqrt(1.0 + pow(2.0 * pre / t->e_out, 2)), 3, +1);
  if (s->scale > 0) {
    t->has_max_abs = 1;
    t->max_abs = qc_tol_round(t->margin * s->scale *
                                  (t->u_out + t->lambda * sqrt(k) * t->u_acc + s->rounded_operands * t->u_op + t->u_fmt),
                              3, +1);
  }
  return QC_OK;
}

/* Append printf output at *o within buf[n] (truncating safely). */
static void app(char *buf, size_t n, size_t *o, const char *fmt, ...) __attribute__((format(printf, 4, 5)));
static void app(char *buf, size_t n, size_t *o, const char *fmt, ...) {
  if (*o >= n) return;
  va_list ap;
  va_start(ap, fmt);
  int w = vsnprintf(buf + *o, n - *o, fmt, ap);
  va_end(ap);
  if (w > 0) *o += (size_t)w;
  if (*o >= n) *o = n - 1;
}

void qc_tol_reasoning(const qc_tol_spec *s, const qc_tol_terms *t, const char *cmdline, char *buf, size_t n) {
  size_t o = 0;
  const char *op = s->operand_dtype ? s->operand_dtype : s->out_dtype;
  const char *acc = s->acc_dtype ? s->acc_dtype : "float32";
  buf[0] = 0;
  app(buf, n, &o, "%s output rounding u/sqrt(3) = %.3g", s->out_dtype, t->e_out);
  app(buf, n, &o, "; %s accumulation over K=%lld, Higham-Mary lambda*sqrt(K)*u = %.3g (lambda=%g)", acc,
      (long long)s->k, t->e_acc, t->lambda);
  if (s->rounded_operands)
    app(buf, n, &o, "; %d operand(s) rounded to %s sqrt(n)*u/sqrt(3) = %.3g", s->rounded_operands, op, t->e_op);
  else
    app(buf, n, &o, "; %s operands as the reference sees them (none rounded)", op);
  if (t->u_fmt > 0) app(buf, n, &o, "; one operand quantized to %s u/sqrt(3) = %.3g", s->format, t->e_fmt);
  app(buf, n, &o, "; rel_l2 = %.4g x root-sum-square = %.3g (margin %s); cosine >= sqrt(1-e^2), norm ratio in [1-e, 1+e]; "
      "noise_multiple = sqrt(1 + (2 d/(u/sqrt(3)))^2), d = margin x the non-output terms = %.3g", t->margin, t->rel_l2,
      t->margin == QC_TOL_MARGIN ? "sqrt(3): the output term becomes u, RNE's worst case" : "as given",
      t->margin * sqrt(t->e_acc * t->e_acc + t->e_op * t->e_op + t->e_fmt * t->e_fmt));
  if (t->has_max_abs)
    app(buf, n, &o, "; max_abs = %.4g x %g x (u_out + lambda*sqrt(K)*u_acc + n*u_op + u_fmt)", t->margin, s->scale);
  if (cmdline) app(buf, n, &o, "; derived by: %s", cmdline);
}

void qc_tol_fill(const qc_tol_terms *t, const char *reasoning, qc_tol *out) {
  memset(out, 0, sizeof *out);
  out->has_rel_l2 = out->has_cosine_min = out->has_norm_ratio = out->has_noise_multiple = 1;
  out->rel_l2 = t->rel_l2;
  out->cosine_min = t->cosine_min;
  out->norm_lo = t->norm_lo;
  out->norm_hi = t->norm_hi;
  out->noise_multiple = t->noise_multiple;
  out->has_max_abs = t->has_max_abs;
  out->max_abs = t->max_abs;
  snprintf(out->reasoning, sizeof out->reasoning, "%s", reasoning ? reasoning : "");
}

int qc_tol_from_model(const qc_tol_model *tm, const qc_tol *decl, const char *out_dtype, qc_tol_spec *spec,
                      qc_tol_terms *terms, double *pre) {
  memset(spec, 0, sizeof *spec);
  spec->out_dtype = out_dtype;
  spec->operand_dtype = "bfloat16"; /* what a trainer rounds GEMM operands to; only e_op reads it */
  spec->k = tm->k;
  spec->lambda = tm->lambda;
  spec->margin = tm->margin;
  spec->rounded_operands = tm->rounded_operands;
  if (decl && decl->derive) {
    if (decl->derive_rounded_operands >= 0) spec->rounded_operands = decl->derive_rounded_operands;
    if (decl->derive_margin > 0) spec->margin = decl->derive_margin;
    if (decl->derive_format[0]) spec->format = decl->derive_format;
  }
  int rc = qc_tol_derive(spec, terms);
  if (rc) return rc;
  /* the bias allowance: accumulation and a declared unreproduced format;
   * not rounded operands, which the engine reproduces as reference
   * variants (a candidate is judged against the one it fits) */
  *pre = terms->margin * sqrt(terms->e_acc * terms->e_acc + terms->e_fmt * terms->e_fmt);
  return QC_OK;
}

void qc_tol_fill_derived(const qc_tol_model *tm, const qc_tol_spec *spec, const qc_tol_terms *terms, const qc_tol *decl,
                         int ref_zero, qc_tol *out) {
  char r[1024];
  size_t o = 0;
  memset(out, 0, sizeof *out);
  r[0] = 0;
  if (decl && decl->reasoning[0]) app(r, sizeof r, &o, "%s; ", decl->reasoning);
  if (ref_zero) {
    double u = terms->u_out + terms->lambda * sqrt((double)spec->k) * terms->u_acc + spec->rounded_operands * terms->u_op + terms->u_fmt;
    out->has_max_abs = 1;
    out->max_abs = tm->scale > 0 ? qc_tol_round(terms->margin * tm->scale * u, 3, +1) : 0.0;
    app(r, sizeof r, &o, "derived: the reference is exactly zero, so rel_l2, cosine, norm_ratio, noise_multiple and bias_z "
        "are undefined and skipped; ");
    if (tm->scale > 0)
      app(r, sizeof r, &o, "max_abs = margin %.4g x S %.4g x (u_out + lambda sqrt(K) u_acc + n u_op + u_fmt) = %.3g, S bounding "
          "the summed |products| from the inputs' magnitudes; %s", terms->margin, tm->scale, out->max_abs, tm->why);
    else
      app(r, sizeof r, &o, "the class has no magnitude bound for this gradient: max_abs 0 (the candidate must be exactly "
          "zero); %s", tm->why);
  } else {
    qc_tol_fill(terms, NULL, out);
    if (1.0 - out->cosine_min < 1e-10) out->cosine_min = 0.9999999999;
    app(r, sizeof r, &o, "derived: %s; ", tm->why);
    qc_tol_reasoning(spec, terms, NULL, r + o, sizeof r - o);
    o = strlen(r);
    if (out->cosine_min == 0.9999999999) app(r, sizeof r, &o, "; cosine_min floored at 1 - 1e-10, the float64 cosine's resolution");
  }
  snprintf(out->reasoning, sizeof out->reasoning, "%s", r);
  if (decl) {
    out->has_bias_z = decl->has_bias_z;
    out->bias_z = decl->bias_z;
    out->has_bias_allow = decl->has_bias_allow;
    out->bias_allow = decl->bias_allow;
    snprintf(out->dtype, sizeof out->dtype, "%s", decl->dtype);
  }
  if (ref_zero) { /* nothing to project on */
    out->has_bias_z = 1;
    out->bias_z = 0;
  }
}
