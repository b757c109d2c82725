/* deployed.c: deployed-byte comparison (see deployed.h). */
#include "engine/deployed.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/qc.h"
#include "numerics/formats.h"
#include "numerics/decode.h"

static void note(qc_deployed_result *r, const char *part, int64_t i, double master, uint32_t e, uint32_t f) {
  if (r->nfirst >= QC_DEPLOYED_FIRST) return;
  qc_qmismatch *q = &r->first[r->nfirst++];
  q->part = part;
  q->index = i;
  q->master = master;
  q->expected = e;
  q->found = f;
}

/* Element code i of a payload tensor (e4m3 byte or e2m1 nibble). */
static uint32_t code_at(const qc_tensor *q, int64_t cols, int64_t i) {
  const uint8_t *p = q->data;
  if (q->dtype != QC_E2M1X2) return p[i];
  int64_t r = i / cols, c = i % cols;
  return (uint32_t)(p[r * q->shape[1] + c / 2] >> (4 * (c & 1))) & 0xfu;
}

/* A power-of-two scale format may be stored as e8m0 bytes (Blackwell)
 * instead of float32 values: compare those bytes with the expected scales'
 * exponents, then replace *found by its float32 decoding. */
static int e8m0_scales(const qc_tensor *exp, qc_tensor *found, qc_deployed_result *r) {
  qc_tensor f32 = {0};
  int rc = qc_tensor_alloc(&f32, found->name, QC_F32, found->ndim, found->shape);
  if (rc) return rc;
  int64_t n = qc_numel(found) < qc_numel(exp) ? qc_numel(found) : qc_numel(exp);
  for (int64_t i = 0; i < n; i++) {
    uint8_t e = qc_ue8m0_of_pow2(((const float *)exp->data)[i]), f = ((const uint8_t *)found->data)[i];
    if (e != f) { r->n_scale++; note(r, "scale", i, NAN, e, f); }
  }
  for (int64_t i = 0; i < qc_numel(found); i++) ((float *)f32.data)[i] = qc_e8m0_to_f32(((const uint8_t *)found->data)[i]);
  qc_tensor_free(found);
  *found = f32;
  return QC_OK;
}

int qc_deployed_check(const qc_module *m, qc_qfmt fmt, qc_qprof prof, const qc_sr *sr, qc_deployed_result *out) {
  memset(out, 0, sizeof *out);
  const qc_tensor *wq = qc_tset_get(&m->saved, "weight_q");
  if (!wq) return QC_OK;
  out->present = 1;
  const qc_tensor *w, *ws, *wg = qc_tset_get(&m->saved, "weight_global_scale");
  int rc;
  if ((rc = qc_module_need(m, "params", "weight", 2, 2, &w))) return rc;
  if ((rc = qc_module_need(m, "saved", "weight_scale", 0, 2, &ws))) return rc;
  if (fmt == QC_QF_NVFP4 && !wg)
    return qc_err("%s: saved/weight_global_scale is missing: nvfp4 deploys a float32 global scale", m->path);
  int64_t N = w->shape[0], K = w->shape[1], n = N * K;
  char where[QC_PATHLEN + 32];
  float *W = NULL, *de = NULL, *df = NULL;
  double *W64 = NULL;
  qc_quantized exp = {0}, got = {0};
  rc = QC_ESYS;
  if (!(W = qc_malloc((size_t)n * 4 + 4, "deployed master")) || !(W64 = qc_malloc((size_t)n * 8 + 8, "deployed master")) ||
      !(de = qc_malloc((size_t)n * 4 + 4, "deployed decode")) || !(df = qc_malloc((size_t)n * 4 + 4, "deployed decode")))
    goto done;
  if ((rc = qc_tensor_to_f64(w, W64))) goto done;
  for (int64_t i = 0; i < n; i++) W[i] = (float)W64[i];
  snprintf(where, sizeof where, "%s: params/weight", m->path);
  if ((rc = qc_quantize(fmt, prof, N, K, W, sr, &exp, where))) goto done;
  snprintf(where, sizeof where, "%s: saved", m->path);
  /* the found tensors, viewed in the expected layout (checks dtype/shape) */
  if ((rc = qc_tensor_copy(&got.q, wq)) || (rc = qc_tensor_copy(&got.scale, ws))) goto done;
  if (wg && fmt == QC_QF_NVFP4 && (rc = qc_tensor_copy(&got.gscale, wg))) goto done;
  int ue8m0_bytes = (fmt == QC_QF_FP8_GROUP128_UE8M0 || fmt == QC_QF_FP8_BLOCK128_UE8M0) && got.scale.dtype == QC_E8M0;
  if (ue8m0_bytes && (rc = e8m0_scales(&exp.scale, &got.scale, out))) goto done;
  if ((rc = qc_dequantize(fmt, prof, N, K, &exp, de, "expected"))) goto done;
  if ((rc = qc_dequantize(fmt, prof, N, K, &got, df, where))) goto done;
  /* payload, element by element */
  out->total_payload = n;
  for (int64_t i = 0; i < n; i++) {
    uint32_t e = code_at(&exp.q, K, i), f = code_at(&got.q, K, i);
    if (e != f) { out->n_payload++; note(out, "payload", i, W[i], e, f); }
  }
  /* scales: raw bytes (an e8m0 view was compared above) */
  if (!ue8m0_bytes) {
    size_t es = qc_dtype_size(exp.scale.dtype);
    int64_t ns = qc_numel(&exp.scale);
    for (int64_t i = 0; i < ns; i++)
      if (memcmp((char *)exp.scale.data + i * es, (char *)got.scale.data + i * es, es)) {
        uint32_t e = 0, f = 0;
        memcpy(&e, (char *)exp.scale.data + i * es, es);
        memcpy(&f, (char *)got.scale.data + i * es, es);
        out->n_scale++;
        note(out, "scale", i, NAN, e, f);
      }
  }
  if (exp.gscale.data && memcmp(exp.gscale.data, got.gscale.data, 4)) {
    uint32_t e, f;
    memcpy(&e, exp.gscale.data, 4);
    memcpy(&f, got.gscale.data, 4);
    out->n_global++;
    note(out, "global", 0, NAN, e, f);
  }
  for (int64_t i = 0; i < n; i++) {
    uint16_t e = qc_f32_to_bf16(de[i]), f = qc_f32_to_bf16(df[i]);
    if (e != f) { out->n_decoded++; note(out, "decoded", i, W[i], e, f); }
  }
  rc = QC_OK;
done:
  qc_quantized_free(&exp);
  qc_quantized_free(&got);
  free(W); free(W64); free(de); free(df);
  return rc;
}
