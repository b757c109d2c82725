/* quant.c: the quantizers' API (see quant.h): names and profiles, the
 * deployed layout, quantize, dequantize, fake-quant. The machinery is
 * qpass.c; the fused float64 fake-quant fakequant.c. */
#include "numerics/quant.h"

#include <float.h>
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/par.h"
#include "core/qc.h"
#include "numerics/formats.h"
#include "numerics/minifloat.h"
#include "numerics/qpass.h"

static const char *const g_fmt_names[QC_QF_COUNT] = {
    "none", "fp8_tensor", "fp8_token", "fp8_channel", "fp8_group128", "fp8_group128_ue8m0",
    "fp8_block128", "fp8_block128_ue8m0", "nvfp4", "mxfp8", "mxfp4"};
static const char *const g_prof_names[QC_QP_COUNT] = {"vllm", "vllm_native", "vllm_triton", "vllm_cuda", "vllm_cuda_nvfp4", "torch", "deepgemm",
                                                       "modelopt", "compressed_tensors", "te", "ocp", "exact"};

const char *qc_qfmt_name(qc_qfmt f) { return (unsigned)f < QC_QF_COUNT ? g_fmt_names[f] : "?"; }
const char *qc_qprof_name(qc_qprof p) { return (unsigned)p < QC_QP_COUNT ? g_prof_names[p] : "?"; }

int qc_qfmt_parse(const char *name, qc_qfmt *out) {
  for (int i = 0; i < QC_QF_COUNT; i++)
    if (strcmp(name, g_fmt_names[i]) == 0) { *out = (qc_qfmt)i; return QC_OK; }
  qc_hint("known formats: none, fp8_tensor, fp8_token, fp8_channel, fp8_group128, fp8_group128_ue8m0, "
          "fp8_block128, fp8_block128_ue8m0, nvfp4, mxfp8, mxfp4");
  return qc_err("format '%s': unknown quantization format", name);
}

int qc_qprof_parse(const char *name, qc_qprof *out) {
  for (int i = 0; i < QC_QP_COUNT; i++)
    if (strcmp(name, g_prof_names[i]) == 0) { *out = (qc_qprof)i; return QC_OK; }
  qc_hint("known profiles: %s", QC_PROFILES);
  return qc_err("profile '%s': unknown quantizer profile", name);
}

int qc_quant_known(const char *fmt) {
  for (int i = 0; i < QC_QF_COUNT; i++)
    if (strcmp(fmt, g_fmt_names[i]) == 0) return 1;
  return 0;
}

void qc_quant_layout(qc_qfmt fmt, qc_qprof prof, int64_t rows, int64_t cols, qc_dtype *q_dt, int64_t q_shape[2],
                     qc_dtype *s_dt, int *s_ndim, int64_t s_shape[2], int *g_ndim) {
  plan_t pl = qq_make_plan(fmt, prof);
  int64_t gr, gc;
  qq_grid(&pl, rows, cols, &gr, &gc);
  *q_dt = pl.fp4 ? QC_E2M1X2 : QC_E4M3;
  q_shape[0] = rows;
  q_shape[1] = pl.fp4 ? (cols + 1) / 2 : cols;
  *s_dt = pl.sdt;
  if (fmt == QC_QF_FP8_TENSOR) {
    *s_ndim = 1;
    s_shape[0] = 1;
    s_shape[1] = 1;
  } else {
    *s_ndim = 2;
    s_shape[0] = gr;
    s_shape[1] = gc;
  }
  *g_ndim = fmt == QC_QF_NVFP4 ? 1 : 0;
}

void qc_quantized_free(qc_quantized *z) {
  qc_tensor_free(&z->q);
  qc_tensor_free(&z->scale);
  qc_tensor_free(&z->gscale);
}

int qc_quantize(qc_qfmt fmt, qc_qprof prof, int64_t rows, int64_t cols, const float *in, const qc_sr *sr,
                qc_quantized *out, const char *what) {
  return qc_quantize_st(fmt, prof, rows, cols, in, sr, NULL, out, what);
}

int qc_quantize_st(qc_qfmt fmt, qc_qprof prof, int64_t rows, int64_t cols, const float *in, const qc_sr *sr,
                   const qc_qstored *st, qc_quantized *out, const char *what) {
  memset(out, 0, sizeof *out);
  if (fmt == QC_QF_NONE || (unsigned)fmt >= QC_QF_COUNT) return qc_err("%s: format '%s' has no deployed form", what, qc_qfmt_name(fmt));
  if (rows < 1 || cols < 1) return qc_err("%s: cannot quantize an empty [%lld, %lld] matrix", what, (long long)rows, (long long)cols);
  qc_dtype qdt, sdt;
  int64_t qs[2], ss[2], one = 1, gr, gc;
  int sn, gn;
  qc_quant_layout(fmt, prof, rows, cols, &qdt, qs, &sdt, &sn, ss, &gn);
  plan_t pl = qq_make_plan(fmt, prof);
  qq_grid(&pl, rows, cols, &gr, &gc);
  uint8_t *codes = NULL;
  float *deq = qc_malloc((size_t)(gr * gc) * sizeof *deq, "block scales");
  uint8_t *sb = qc_malloc((size_t)(gr * gc), "block scale bytes");
  float g = 0.0f;
  int rc = QC_ESYS;
  if (!deq || !sb) goto done;
  if ((rc = qc_tensor_alloc(&out->q, "weight_q", qdt, 2, qs))) goto done;
  if ((rc = qc_tensor_alloc(&out->scale, "weight_scale", sdt, sn, ss))) goto done;
  /* e4m3 codes go straight into the payload; e2m1 codes are packed after */
  rc = QC_ESYS;
  if (pl.fp4 && !(codes = qc_malloc((size_t)(rows * cols), "quantized codes"))) goto done;
  uint8_t *qp = out->q.data;
  if ((rc = qq_quant_core(fmt, prof, rows, cols, in, sr, st, pl.fp4 ? codes : qp, deq, sb, &g, what)))
    goto done;
  if (pl.fp4)
    for (int64_t r = 0; r < rows; r++) {
      const uint8_t *c8 = codes + r * cols;
      uint8_t *o = qp + r * qs[1];
      for (int64_t c = 0; c + 1 < cols; c += 2) o[c / 2] = (uint8_t)((c8[c] & 0xf) | (c8[c + 1] << 4));
      if (cols & 1) o[cols / 2] = c8[cols - 1] & 0xf;
    }
  if (sdt == QC_F32) memcpy(out->scale.data, deq, (size_t)(gr * gc) * sizeof *deq);
  else memcpy(out->scale.data, sb, (size_t)(gr * gc));
  if (gn) {
    if ((rc = qc_tensor_alloc(&out->gscale, "weight_global_scale", QC_F32, 1, &one))) goto done;
    *(float *)out->gscale.data = g;
  }
  rc = QC_OK;
done:
  if (rc) qc_quantized_free(out);
  free(codes); free(deq); free(sb);
  return rc;
}

/* Check one part's dtype and shape against the expected layout. */
static int check_part(const qc_tensor *t, const char *part, qc_dtype dt, int ndim, const int64_t *shape, const char *what) {
  char a[64], b[64];
  if (t->dtype != dt)
    return qc_err("%s: %s '%s' has dtype %s: expected %s", what, part, t->name, qc_dtype_name(t->dtype), qc_dtype_name(dt));
  int64_t n = qc_shape_numel(ndim, shape);
  int ok = ndim == 1 && n == 1 ? qc_numel(t) == 1 : t->ndim == ndim && memcmp(t->shape, shape, (size_t)ndim * 8) == 0;
  if (!ok)
    return qc_err("%s: %s '%s' has shape %s: expected %s", what, part, t->name, qc_shape_str(t->ndim, t->shape, a, sizeof a),
                  qc_shape_str(ndim, shape, b, sizeof b));
  return QC_OK;
}

int qc_dequantize(qc_qfmt fmt, qc_qprof prof, int64_t rows, int64_t cols, const qc_quantized *z, float *out,
                  const char *what) {
  qc_dtype qdt, sdt;
  int64_t qs[2], ss[2], one = 1, gr, gc;
  int sn, gn, rc;
  if (fmt == QC_QF_NONE || (unsigned)fmt >= QC_QF_COUNT) return qc_err("%s: format '%s' has no deployed form", what, qc_qfmt_name(fmt));
  qc_quant_layout(fmt, prof, rows, cols, &qdt, qs, &sdt, &sn, ss, &gn);
  if ((rc = check_part(&z->q, "payload", qdt, 2, qs, what))) return rc;
  if ((rc = check_part(&z->scale, "scale", sdt, sn, ss, what))) return rc;
  if (gn && (rc = check_part(&z->gscale, "global scale", QC_F32, 1, &one, what))) return rc;
  qq_tables_init();
  plan_t pl = qq_make_plan(fmt, prof);
  qq_grid(&pl, rows, cols, &gr, &gc);
  /* e4m3 payloads are the codes as they are; e2m1 pairs are unpacked */
  uint8_t *codes = pl.fp4 ? qc_malloc((size_t)(rows * cols), "dequant codes") : NULL;
  float *deq = qc_malloc((size_t)(gr * gc) * sizeof *deq, "dequant scales");
  rc = QC_ESYS;
  if ((pl.fp4 && !codes) || !deq) goto done;
  const uint8_t *qp = z->q.data;
  for (int64_t r = 0; pl.fp4 && r < rows; r++)
    for (int64_t c = 0; c < cols; c++) codes[r * cols + c] = (uint8_t)((qp[r * qs[1] + c / 2] >> (4 * (c & 1))) & 0xf);
  float g = gn ? *(const float *)z->gscale.data : 0.0f;
  for (int64_t i = 0; i < gr * gc; i++) {
    if (sdt == QC_F32) deq[i] = ((const float *)z->scale.data)[i];
    else if (sdt == QC_E8M0) deq[i] = qc_e8m0_to_f32(((const uint8_t *)z->scale.data)[i]);
    else {
      float sf = qc_e4m3_to_f32(((const uint8_t *)z->scale.data)[i]);
      deq[i] = pl.rc.nop == QN_DIVM ? sf * g : sf / g;
    }
  }
  qq_dequant_pass(&pl, rows, cols, pl.fp4 ? codes : qp, deq, out);
  rc = QC_OK;
done:
  free(codes); free(deq);
  return rc;
}

int qc_fake_quant_sr(const char *fmt, const char *profile, int64_t rows, int64_t cols, const float *in, float *out,
                     const qc_sr *sr, const char *what) {
  qc_qfmt f = QC_QF_NONE;
  qc_qprof p = QC_QP_VLLM;
  int rc;
  if ((rc = qc_qfmt_parse(fmt, &f))) return rc;
  if (profile && (rc = qc_qprof_parse(profile, &p))) return rc;
  if (f == QC_QF_NONE) {
    if ((rc = qq_check_finite(in, rows * cols, what))) return rc;
    if (out != in) memmove(out, in, (size_t)(rows * cols) * sizeof *out);
    return QC_OK;
  }
  if (rows < 1 || cols < 1) return QC_OK;
  plan_t pl = qq_make_plan(f, p);
  int64_t gr, gc;
  qq_grid(&pl, rows, cols, &gr, &gc);
  uint8_t *codes = qc_malloc((size_t)(rows * cols), "fake-quant codes");
  float *deq = qc_malloc((size_t)(gr * gc) * sizeof *deq, "fake-quant scales");
  uint8_t *sb = qc_malloc((size_t)(gr * gc), "fake-quant scale bytes");
  rc = QC_ESYS;
  if (codes && deq && sb && !(rc = qq_quant_core(f, p, rows, cols, in, sr, NULL, codes, deq, sb, NULL, what)))
    qq_dequant_pass(&pl, rows, cols, codes, deq, out);
  free(codes); free(deq); free(sb);
  return rc;
}

int qc_fake_quant(const char *fmt, const char *profile, int64_t rows, int64_t cols, const float *in, float *out,
                  const char *what) {
  return qc_fake_quant_sr(fmt, profile, rows, cols, in, out, NULL, what);
}

/* ---- producer paths in words (reports, --identify) ------------------------ */

static const char *const g_prof_labels[QC_QP_COUNT] = {
    "vLLM on Hopper", "vLLM's torch-native quantizer under Inductor", "vLLM's Triton kernel", "vLLM's CUDA kernel",
    "vLLM's CUDA nvfp4 kernel",
    "eager PyTorch", "DeepGEMM", "ModelOpt export", "compressed-tensors", "Transformer Engine", "OCP MX", "exact division"};

/* One recipe's scale and element rule, appended to buf at *k. */
static void recipe_words(const qc_recipe *r, char *buf, int n, int *k) {
#define PUT(...) (*k += *k < n ? snprintf(buf + *k, (size_t)(n - *k), __VA_ARGS__) : 0)
  static const char *const el[] = {"x / s", "x * rcp(s)", "x * rcp.approx(s)"};
  switch (r->kind) {
    case QR_FP8: {
      char a[48], s[96];
      if (r->afloor > 0) snprintf(a, sizeof a, "max(amax, %g)", (double)r->afloor);
      else snprintf(a, sizeof a, "amax");
      snprintf(s, sizeof s, r->sop == QS_MUL ? "%s * RN(1/448)" : "%s / 448", a);
      if (r->pfloor > 0) {
        char t[96];
        snprintf(t, sizeof t, "max(%s, %g)", s, (double)r->pfloor);
        snprintf(s, sizeof s, "%s", t);
      }
      PUT("s = ");
      if (r->sfloor > 0) PUT("max(");
      if (r->pow2 == QP_CEIL2) PUT("ceil2(%s)", s);
      else if (r->pow2 == QP_CEIL2_LOG) PUT("exp2(ceil(log2(%s)))", s);
      else PUT("%s", s);
      if (r->sfloor > 0) PUT(", RN(1/229376))");
      PUT(", %s", el[r->eop]);
      break;
    }
    case QR_TE: PUT("scale = 448 / amax%s, x * scale, s = rcp(scale)", r->pow2 == QP_TRUNC ? " truncated to a power of two" : ""); break;
    case QR_NVFP4: {
      /* one text per QG_, QF_ and QN_ value of recipe.h, in its order */
      static const char *const g[] = {"g = 2688 / amax", "g = RN(1/amax) * 2688", "w = amax * RN(1/2688)",
                                      "g = min(2688 / amax, FLT_MAX)",
                                      "g = RN(1/max(amax, FLT_MIN)) * 2688, a non-finite g 1"};
      static const char *const sf[] = {"sf = e4m3(min(g * (bmax * RN(1/6)), 448))", "sf = e4m3(bmax * (g * RN(1/6)))",
                                       "sf = e4m3(min(bmax / (6 * w), 448)), a zero block 1.0",
                                       "sf = e4m3(min(g * (bmax / 6), 448))",
                                       "sf = e4m3(min(g * (bmax * RN(1/6)), 448)), a zero byte 0x20 (0.125)"};
      static const char *const e[] = {"x * rcp(sf * rcp(g))", "x * rcp.approx(sf * rcp.approx(g))", "x / (sf / g)", "x / (sf * w)",
                                      "x * min(rcp(sf * rcp(g)), FLT_MAX)"};
      if (r->gop >= sizeof g / sizeof *g || r->sfop >= sizeof sf / sizeof *sf || r->nop >= sizeof e / sizeof *e) {
        PUT("nvfp4 recipe %d/%d/%d (no text)", r->gop, r->sfop, r->nop);
        break;
      }
      PUT("%s, %s, %s", g[r->gop], sf[r->sfop], e[r->nop]);
      break;
    }
    case QR_MX: {
      static const char *const m[] = {"e = ceil2(amax / %s) (bit rule)", "e = ceil(log2(amax * RN(1/%s)))",
                                      "e = exponent of amax rounded up at 1.75 - %s", "e = floor(log2(amax)) - %s"};
      const char *v = r->mop == QM_EVEN || r->mop == QM_OCP ? (r->fp4 ? "2" : "8") : (r->fp4 ? "6" : "448");
      PUT(m[r->mop], v);
      PUT(", x * 2^-e");
      break;
    }
    default: break;
  }
#undef PUT
}

void qc_qpath_desc(qc_qfmt fmt, qc_qprof prof, char *buf, int n) {
  qc_recipe r1, r2;
  int k = 0, two = qc_qrecipe(fmt, prof, &r1, &r2);
  buf[0] = 0;
  if ((unsigned)prof >= QC_QP_COUNT) return;
  k += snprintf(buf, (size_t)n, "%s: ", g_prof_labels[prof]);
  if (two && k < n) k += snprintf(buf + k, (size_t)(n - k), "stage 1 ");
  recipe_words(&r1, buf, n, &k);
  if (two && k < n) {
    k += snprintf(buf + k, (size_t)(n - k), "; stage 2 ");
    recipe_words(&r2, buf, n, &k);
  }
}
