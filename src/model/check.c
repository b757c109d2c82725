/* check.c: the verdict and the result list (see check.h). */
#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "model/check.h"
#include "core/qc.h"

int qc_results_add(qc_results *r, const qc_check *c) {
  if (r->n == r->cap) {
    int cap = r->cap ? 2 * r->cap : 32;
    qc_check *nv = realloc(r->v, (size_t)cap * sizeof *nv);
    if (!nv) return qc_err_sys("out of memory recording checks");
    r->v = nv;
    r->cap = cap;
  }
  r->v[r->n++] = *c;
  return QC_OK;
}

void qc_results_free(qc_results *r) {
  free(r->v);
  memset(r, 0, sizeof *r);
}

static const char *const g_var_names[] = {"bf16_dy", "bf16_inputs", "bf16_params", "round_ops"};

unsigned qc_variant_part(const char *name) {
  for (unsigned i = 0; i < sizeof g_var_names / sizeof g_var_names[0]; i++)
    if (strcmp(name, g_var_names[i]) == 0) return 1u << i;
  return 0;
}

const char *qc_variant_part_name(unsigned bit) {
  for (unsigned i = 0; i < sizeof g_var_names / sizeof g_var_names[0]; i++)
    if (bit == 1u << i) return g_var_names[i];
  return NULL;
}

const char *qc_variant_part_names(void) { return "bf16_dy, bf16_inputs, bf16_params, round_ops"; }

int qc_results_verdict(const qc_results *r) {
  if (r->n == 0) return 2;
  for (int i = 0; i < r->n; i++)
    if (r->v[i].verdict != QC_V_PASS) return 1;
  return 0;
}

/* Append one crossed bound to why ("; "-separated: every crossed bound is named). */
static void crossed(char *why, int whylen, int *bad, const char *fmt, ...) __attribute__((format(printf, 4, 5)));
static void crossed(char *why, int whylen, int *bad, const char *fmt, ...) {
  size_t l = strlen(why);
  va_list ap;
  *bad = 1;
  if (l && l + 2 < (size_t)whylen) l += (size_t)snprintf(why + l, (size_t)whylen - l, "; ");
  if (l + 1 >= (size_t)whylen) return;
  va_start(ap, fmt);
  vsnprintf(why + l, (size_t)whylen - l, fmt, ap);
  va_end(ap);
}

int qc_judge(const qc_metrics *m, const qc_tol *t, char *why, int whylen) {
  int bad = 0;
  why[0] = 0;
  if (m->ref_nonfinite > 0) {
    snprintf(why, (size_t)whylen, "%lld non-finite value(s) in the reference", (long long)m->ref_nonfinite);
    return QC_V_FAIL;
  }
  if (m->nonfinite > 0) {
    snprintf(why, (size_t)whylen, "%lld non-finite value(s) in the candidate", (long long)m->nonfinite);
    return QC_V_FAIL;
  }
  /* the scale of the terms (m->term_floor, absolute) widens every relative
   * bound by te = term_floor / ||r||: a cancelling sum's error is judged
   * against what its arithmetic can make, not against the small result */
  double te = m->norm_r > 0 && m->term_floor > 0 ? m->term_floor / m->norm_r : 0.0;
  if (!isfinite(te)) te = 0.0; /* a quotient that overflows (||r|| near the smallest double) widens
                                  nothing: an infinite bound would pass any metric */
  /* a NaN metric never satisfies a bound: every test below is written so
   * that NaN falls on the failing side */
  if (t->has_rel_l2 && !(m->rel_l2 <= t->rel_l2 + te)) {
    if (te > 0) crossed(why, whylen, &bad, "rel_l2 %.3g > %.3g (+ %.3g from the terms' scale)", m->rel_l2, t->rel_l2, te);
    else crossed(why, whylen, &bad, "rel_l2 %.3g > %.3g", m->rel_l2, t->rel_l2);
  }
  if (t->has_max_abs && !(m->max_abs <= t->max_abs)) {
    crossed(why, whylen, &bad, "max_abs %.3g > %.3g", m->max_abs, t->max_abs);
  }
  /* cosine is undefined when a norm is zero: then max_abs decides (spec);
   * with no max_abs declared, a zero against a non-zero fails */
  int one_zero = m->cosine_null && (m->norm_g > 0 || m->norm_r > 0);
  double cmin = t->cosine_min;
  if (te > 0 && cmin > -1) { /* the bound's angle widened: sin grows by te */
    double s = sqrt(fmax(1.0 - cmin * cmin, 0.0)) + te;
    cmin = cmin < 0 || s >= 1 ? -1.0 : sqrt(1.0 - s * s);
  }
  if (t->has_cosine_min && (one_zero ? !t->has_max_abs : (!m->cosine_null && !(m->cosine >= cmin)))) {
    if (one_zero)
      crossed(why, whylen, &bad, "cosine undefined (%s is zero, %s is not) and no max_abs declared",
               m->norm_g > 0 ? "reference" : "candidate", m->norm_g > 0 ? "candidate" : "reference");
    else if (m->cosine > 0.999 && cmin > 0.999) /* both print as 1 at 9 digits: print 1 - cosine */
      crossed(why, whylen, &bad, "cosine 1 - %.3g < 1 - %.3g", 1.0 - m->cosine, 1.0 - cmin);
    else
      crossed(why, whylen, &bad, "cosine %.9g < %.9g", m->cosine, cmin);
  }
  /* the norm ratio of two zero tensors is 1; over a zero reference it is
   * undefined, and max_abs decides as for the cosine */
  int ratio_undef = m->norm_r == 0 && m->norm_g > 0;
  if (t->has_norm_ratio && !(m->norm_r == 0 && m->norm_g == 0) &&
      (ratio_undef ? !t->has_max_abs : !(m->norm_ratio >= t->norm_lo - te && m->norm_ratio <= t->norm_hi + te))) {
    crossed(why, whylen, &bad, "norm_ratio %.9g outside [%.9g, %.9g]", m->norm_ratio, t->norm_lo - te, t->norm_hi + te);
  }
  if (t->has_noise_multiple && !(m->noise_multiple <= t->noise_multiple)) {
    crossed(why, whylen, &bad, "noise_multiple %.3g > %.3g", m->noise_multiple, t->noise_multiple);
  }
  /* the bias test: on by default where it was computed, off when declared 0 */
  double bz = t->has_bias_z ? t->bias_z : QC_BIAS_Z_DEFAULT;
  if (bz > 0 && (t->has_bias_z || !isnan(m->bias_z)) && !(fabs(m->bias_z) <= bz)) {
    crossed(why, whylen, &bad, "bias_z %.3g beyond +-%.3g (a systematic error of %+.3g along the reference)", m->bias_z, bz,
            m->e_par);
  }
  /* With a zero reference, only exact agreement (or a declared max_abs) passes:
   * cosine and norm ratio are undefined there and rel_l2 degenerates. */
  if (m->norm_r == 0 && !t->has_max_abs && m->max_abs != 0) {
    crossed(why, whylen, &bad, "reference is zero but candidate is not (max_abs %.3g) and no max_abs declared", m->max_abs);
  }
  return bad ? QC_V_FAIL : QC_V_PASS;
}

qc_dtype qc_audit_dtype(qc_dtype stored, qc_dtype values, const qc_tol *t, qc_check *k) {
  qc_dtype dt = stored, d;
  if (t->dtype[0] && qc_dtype_from_name(t->dtype, &d) == QC_OK) {
    snprintf(k->precision, sizeof k->precision, "judged at %s as the case declares (stored as %s)", t->dtype,
             qc_dtype_name(stored));
    return d;
  }
  if (stored == QC_F32 || stored == QC_F64) dt = values;
  if (dt != stored)
    snprintf(k->precision, sizeof k->precision, "every value is a %s value: judged at %s precision (stored as %s)",
             qc_dtype_name(dt), qc_dtype_name(dt), qc_dtype_name(stored));
  return dt;
}
