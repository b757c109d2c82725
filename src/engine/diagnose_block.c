/* diagnose_block.c: one block of a weight quantized with a scale per
 * 128 x 128 block (weight_format fp8_block128 or fp8_block128_ue8m0) off
 * by a factor k: a stale or misplaced scale of that block. The reference
 * is linear in each block of the weight it dequantizes, and doubling a
 * block of the master weight doubles its quantized block exactly (its
 * scale is its amax over the format's maximum, or that rounded to a power
 * of two): the reference run with block (i, j) doubled gives that block's
 * share D_ij of the gradient, and the candidate is fitted as
 * r + (k - 1) D_ij, block by block; the best fit is recorded. No class is
 * named: a class whose contract has such a format and a 2-D params/weight. */
#include "engine/diagnose_priv.h"

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/qc.h"
#include "numerics/metrics.h"

#define BLK 128
#define MAX_BLOCKS 256

/* 1 when m's contract quantizes its weight with a scale per 128 x 128 block. */
static int block_scaled(const qc_module *m) {
  for (const qc_key_spec *ks = m->cls->keys; ks && ks->key; ks++) {
    size_t l = strlen(ks->key);
    if (l <= 7 || strcmp(ks->key + l - 7, "_format") != 0) continue;
    const char *v = qc_contract_str(&m->contract, ks->key, ks->dflt);
    if (strcmp(v, "fp8_block128") == 0 || strcmp(v, "fp8_block128_ue8m0") == 0) return 1;
  }
  return 0;
}

/* Multiply block (bi, bj) of the [R, C] weight w (float32, float64, bfloat16) by f (2 or 1/2: exact). */
static void scale_block(qc_tensor *w, int64_t bi, int64_t bj, double f) {
  const int64_t R = w->shape[0], C = w->shape[1];
  for (int64_t i = bi * BLK; i < R && i < (bi + 1) * BLK; i++)
    for (int64_t j = bj * BLK; j < C && j < (bj + 1) * BLK; j++) {
      if (w->dtype == QC_F32) ((float *)w->data)[i * C + j] *= (float)f;
      else if (w->dtype == QC_F64) ((double *)w->data)[i * C + j] *= f;
      else { /* bfloat16: the top half of a float32, scaled exactly by a power of two */
        uint16_t *h = (uint16_t *)w->data + i * C + j;
        uint32_t u = (uint32_t)*h << 16;
        float x;
        memcpy(&x, &u, sizeof x);
        x *= (float)f;
        memcpy(&u, &x, sizeof u);
        *h = (uint16_t)(u >> 16);
      }
    }
}

int qc_dg_block_scale(dg *d, double work) {
  const qc_registry_row *row = qc_registry_find(d->m->cls->name);
  const qc_tensor *w0 = qc_tset_get(&d->m->params, "weight");
  if (!row || !w0 || w0->ndim != 2 || (w0->dtype != QC_F32 && w0->dtype != QC_F64 && w0->dtype != QC_BF16) || !block_scaled(d->m)) return QC_OK;
  const int64_t nbi = (w0->shape[0] + BLK - 1) / BLK, nbj = (w0->shape[1] + BLK - 1) / BLK;
  if (nbi * nbj < 2 || nbi * nbj > MAX_BLOCKS || work * (double)(nbi * nbj) > 4e9) return QC_OK; /* one block: the factor's */
  qc_module alt = *d->m;
  memset(&alt.params, 0, sizeof alt.params);
  double *best = malloc((size_t)(d->n + 1) * sizeof *best), be = INFINITY, bk = 1, bse = INFINITY;
  int64_t bbi = -1, bbj = -1;
  int rc = best ? qc_tset_clone(&alt.params, &d->m->params) : qc_err_sys("out of memory diagnosing %s", d->k->tensor);
  qc_tensor *w = rc ? NULL : (qc_tensor *)qc_tset_get(&alt.params, "weight");
  qc_err_state es; /* a fit that cannot be made is no error */
  qc_err_save(&es);
  for (int64_t b = 0; w && b < nbi * nbj; b++) {
    const int64_t bi = b / nbj, bj = b % nbj;
    scale_block(w, bi, bj, 2.0);
    int r2 = qc_dg_run_for(d, row->reference, &alt, d->dy);
    scale_block(w, bi, bj, 0.5);
    if (r2) break;
    double dd = 0, gd = 0;
    for (int64_t i = 0; i < d->n; i++) { /* D_ij = p - r, fitted to g - r */
      d->p[i] -= d->rd[i];
      dd += d->p[i] * d->p[i];
      gd += (d->g[i] - d->rd[i]) * d->p[i];
    }
    if (!(dd > 0)) continue; /* this gradient does not see the block */
    const double kk = gd / dd;
    for (int64_t i = 0; i < d->n; i++) d->p[i] = d->rd[i] + kk * d->p[i];
    const double e = qc_rel_l2(d->g, d->p, d->n);
    if (e < be) {
      double rr = 0; /* the fitted k's standard error: the residual's rms over |D_ij| */
      for (int64_t i = 0; i < d->n; i++) rr += (d->g[i] - d->p[i]) * (d->g[i] - d->p[i]);
      be = e, bk = 1 + kk, bbi = bi, bbj = bj, bse = sqrt(rr / (double)d->n / dd);
      memcpy(best, d->p, (size_t)d->n * sizeof *best);
    }
  }
  qc_err_restore(&es);
  if (bbi >= 0) {
    char says[256];
    memcpy(d->p, best, (size_t)d->n * sizeof *best);
    snprintf(says, sizeof says, "block (%lld, %lld) of 128 x 128 of the weight scaled by k = %.5g (that block's scale stale or "
             "misplaced: the rows %lld..%lld, columns %lld..%lld of the dequantized weight)", (long long)bbi, (long long)bbj, bk,
             (long long)(bbi * BLK), (long long)(bbi * BLK + BLK - 1), (long long)(bbj * BLK), (long long)(bbj * BLK + BLK - 1));
    qc_dg_judge(d, "block_scale", says, d->level);
    /* told from the reference by its fitted k, 5 standard errors off 1 (the
     * check failed already; the block may move the whole by less than the
     * level), and from a constant factor by fitting better than one */
    double sgr = 0, srr = 0;
    for (int64_t i = 0; i < d->n; i++) sgr += d->g[i] * d->rd[i], srr += d->rd[i] * d->rd[i];
    for (int64_t i = 0; srr > 0 && i < d->n; i++) d->p[i] = sgr / srr * d->rd[i];
    const double ef = srr > 0 ? qc_rel_l2(d->g, d->p, d->n) : INFINITY;
    if (fabs(bk - 1) > 5 * bse && be <= d->level && be < d->e0 && be < ef) d->k->hyp[d->k->nhyp - 1].consistent = 1;
  }
  qc_module_variant_free(&alt, d->m);
  free(best);
  return rc == QC_ESYS ? rc : QC_OK;
}
