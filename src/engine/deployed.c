/* deployed.c: deployed bytes against qatcheck's quantizers, one profile or
 * every profile (see deployed.h). */
#include "engine/deployed.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/par.h"
#include "core/qc.h"
#include "numerics/decode.h"
#include "numerics/formats.h"

/* A master weight and the deployed bytes found for it. */
typedef struct qc_deployed_input {
  int64_t N, K;
  float *W;            /* [N, K] float32 (bf16 / f16 / f32 masters exactly; float64 rounded) */
  qc_quantized got;    /* payload, scales and (nvfp4) global scale as found; gscale empty if none */
  int g_mult;          /* the global scale is a multiplier (saved/weight_scale_2) */
  const char *where;   /* names the source in messages ("/model.layers.0.mlp.down_proj: saved") */
} qc_deployed_input;

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

/* Free what in holds (in itself is the caller's). */
static void qc_deployed_input_free(qc_deployed_input *in) {
  free(in->W);
  qc_quantized_free(&in->got);
  memset(in, 0, sizeof *in);
}

/* Read a master w [N, K] and its deployed bytes (payload wq, block scales
 * ws, the global scale wg or NULL, a multiplier when g_mult) into *in
 * (copies; free with qc_deployed_input_free), `where` naming the source. */
static int read_parts(const char *where, const qc_tensor *w, const qc_tensor *wq, const qc_tensor *ws, const qc_tensor *wg, int g_mult,
                      qc_qfmt fmt, qc_deployed_input *in) {
  int rc;
  in->where = where;
  in->g_mult = wg ? g_mult : 0;
  in->N = w->shape[0];
  in->K = w->shape[1];
  int64_t n = in->N * in->K;
  /* through float64 a chunk at a time: a whole float64 copy of a 16384 x 7168 master is 0.9 GB of fresh pages */
  const int fl = w->dtype == QC_F64 || w->dtype == QC_F32 || w->dtype == QC_F16 || w->dtype == QC_BF16;
  const int64_t chunk = fl ? (int64_t)1 << 22 : n;
  double *w64 = qc_malloc((size_t)(n < chunk ? n : chunk) * 8 + 8, "deployed master");
  in->W = qc_malloc((size_t)n * 4 + 4, "deployed master");
  rc = QC_ESYS;
  if (!w64 || !in->W) goto done;
  if (!fl && (rc = qc_tensor_to_f64(w, w64))) goto done;
  for (int64_t o = 0; o < n; o += chunk) {
    const int64_t len = n - o < chunk ? n - o : chunk;
    if (fl && (rc = qc_float_to_f64(w->dtype, (const char *)w->data + (size_t)o * qc_dtype_size(w->dtype), len, w64))) goto done;
    qc_f64_to_f32s(w64, len, in->W + o);
  }
  if ((rc = qc_tensor_copy(&in->got.q, wq)) || (rc = qc_tensor_copy(&in->got.scale, ws))) goto done;
  if (wg && fmt == QC_QF_NVFP4 && (rc = qc_tensor_copy(&in->got.gscale, wg))) goto done;
  rc = QC_OK;
done:
  free(w64);
  if (rc) qc_deployed_input_free(in);
  return rc;
}

/* Read m's master and deployed bytes into *in (copies; free with
 * qc_deployed_input_free). Absent saved/weight_q: QC_OK with in->got.q
 * empty. A missing scale (or global scale for nvfp4), a master that is not
 * 2-D: QC_EINPUT naming the dataset. */
static int qc_deployed_read_module(const qc_module *m, qc_qfmt fmt, qc_deployed_input *in) {
  memset(in, 0, sizeof *in);
  in->where = m->path;
  const qc_tensor *wq = qc_tset_get(&m->saved, "weight_q");
  if (!wq) return QC_OK;
  const qc_tensor *w, *ws = qc_tset_get(&m->saved, "weight_scale"), *wg = qc_tset_get(&m->saved, "weight_global_scale");
  int rc, g_mult = 0;
  if ((rc = qc_module_need(m, "params", "weight", 2, 2, &w))) return rc;
  if (!ws) ws = qc_tset_get(&m->saved, "weight_scale_inv"); /* DeepSeek's name for the same multiplier */
  if (!ws && (rc = qc_module_need(m, "saved", "weight_scale", 0, 2, &ws))) return rc;
  if (!wg && (wg = qc_tset_get(&m->saved, "weight_scale_2"))) g_mult = 1;
  if (fmt == QC_QF_NVFP4 && !wg)
    return qc_err("%s: saved/weight_global_scale (or weight_scale_2) is missing: nvfp4 deploys a float32 global scale", m->path);
  return read_parts(m->path, w, wq, ws, wg, g_mult, fmt, in);
}

/* t's slice e along dimension 0 as a tensor of one dimension less (a view
 * of t's data; a 1-D t gives one element, shape [1]). */
static qc_tensor slice0(const qc_tensor *t, int64_t e) {
  qc_tensor v = *t;
  const int64_t n = t->shape[0] ? qc_numel(t) / t->shape[0] : 0;
  v.ndim = t->ndim > 1 ? t->ndim - 1 : 1;
  if (t->ndim > 1) memmove(v.shape, t->shape + 1, (size_t)(t->ndim - 1) * sizeof *v.shape);
  else v.shape[0] = 1;
  v.data = (char *)t->data + (size_t)(e * n) * qc_dtype_size(t->dtype);
  v.nbytes = (size_t)n * qc_dtype_size(t->dtype);
  return v;
}

/* Expert e's master and deployed bytes of the stacked parameter p: params/<p>
 * [E, N, K], saved/<p>_q, saved/<p>_scale (or _scale_inv) with E leading,
 * and for nvfp4 saved/<p>_global_scale (or the multiplier _scale_2), [E]
 * or [E, 1]. Absent saved/<p>_q: QC_OK with in->got.q empty. */
static int read_expert(const qc_module *m, const char *p, int64_t e, qc_qfmt fmt, char *where, size_t wn, qc_deployed_input *in) {
  char nq[QC_NAMELEN + 16], ns[QC_NAMELEN + 16], ng[QC_NAMELEN + 24], s1[64];
  memset(in, 0, sizeof *in);
  snprintf(nq, sizeof nq, "%s_q", p);
  const qc_tensor *wq = qc_tset_get(&m->saved, nq), *w, *ws, *wg;
  if (!wq) return QC_OK;
  int rc, g_mult = 0;
  if ((rc = qc_module_need(m, "params", p, 3, 3, &w))) return rc;
  snprintf(ns, sizeof ns, "%s_scale", p);
  if (!(ws = qc_tset_get(&m->saved, ns))) {
    snprintf(ns, sizeof ns, "%s_scale_inv", p);
    ws = qc_tset_get(&m->saved, ns);
  }
  if (!ws) return qc_err("%s: saved/%s_scale (or %s_scale_inv) is missing: the block scales of saved/%s", m->path, p, p, nq);
  snprintf(ng, sizeof ng, "%s_global_scale", p);
  if (!(wg = qc_tset_get(&m->saved, ng))) {
    snprintf(ng, sizeof ng, "%s_scale_2", p);
    if ((wg = qc_tset_get(&m->saved, ng))) g_mult = 1;
  }
  if (fmt == QC_QF_NVFP4 && !wg)
    return qc_err("%s: saved/%s_global_scale (or %s_scale_2) is missing: nvfp4 deploys a float32 global scale per expert", m->path, p, p);
  const qc_tensor *parts[3] = {wq, ws, wg};
  const char *names[3] = {nq, ns, ng};
  for (int i = 0; i < 3; i++)
    if (parts[i] && (parts[i]->ndim < 1 || parts[i]->shape[0] != w->shape[0] || (i < 2 && parts[i]->ndim != 3) ||
                     (i == 2 && qc_numel(parts[i]) != w->shape[0])))
      return qc_err("%s: saved/%s is %s: expected one %s per expert of params/%s, [%lld, ...]", m->path, names[i],
                    qc_shape_str(parts[i]->ndim, parts[i]->shape, s1, sizeof s1), i == 0 ? "payload" : i == 1 ? "scale grid" : "global scale",
                    p, (long long)w->shape[0]);
  qc_tensor vw = slice0(w, e), vq = slice0(wq, e), vs = slice0(ws, e), vg;
  if (wg) {
    vg = *wg;
    vg.ndim = 1;
    vg.shape[0] = 1;
    vg.data = (char *)wg->data + (size_t)e * qc_dtype_size(wg->dtype);
    vg.nbytes = qc_dtype_size(wg->dtype);
  }
  snprintf(where, wn, "%s: expert %lld of %s", m->path, (long long)e, p);
  return read_parts(where, &vw, &vq, &vs, wg ? &vg : NULL, g_mult, fmt, in);
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

/* Distance of two non-negative float32 values in ulps (their bit patterns). */
static int ulps(uint32_t a, uint32_t b) {
  int64_t d = (int64_t)(a & 0x7fffffffu) - (int64_t)(b & 0x7fffffffu);
  d = d < 0 ? -d : d;
  return d > 1000000 ? 1000000 : (int)d;
}

/* The element comparisons of a check, counted on qc_par_for's threads
 * (each piece its own count: the total does not depend on the thread
 * count). Only a count that is not zero sends the caller to its serial
 * loop, which notes the first mismatches in index order: a layer's bytes
 * all match when the deployment is right, and a 16384 x 7168 weight's
 * serial comparisons took over a second. */
typedef struct diff_count {
  const qc_tensor *exp, *got; /* payloads (payload_count), or NULL: de and df decoded (decoded_count) */
  const float *de, *df;
  int64_t K;
  int64_t bad[QC_PAR_MAX];
} diff_count;

static void count_piece(void *ctx, int64_t lo, int64_t hi, int tid) {
  diff_count *c = ctx;
  int64_t bad = 0;
  if (c->exp)
    for (int64_t i = lo; i < hi; i++) bad += code_at(c->exp, c->K, i) != code_at(c->got, c->K, i);
  else
    for (int64_t i = lo; i < hi; i++) bad += qc_f32_to_bf16(c->de[i]) != qc_f32_to_bf16(c->df[i]);
  c->bad[tid] = bad;
}

static int64_t diff_total(diff_count *c, int64_t n) {
  memset(c->bad, 0, sizeof c->bad);
  qc_par_for(n, 1 << 20, count_piece, c);
  int64_t t = 0;
  for (int i = 0; i < QC_PAR_MAX; i++) t += c->bad[i];
  return t;
}

/* Payload element mismatches of exp against got. */
static int64_t payload_diff(const qc_tensor *exp, const qc_tensor *got, int64_t n, int64_t K, const float *W,
                            qc_deployed_result *r) {
  diff_count c = {.exp = exp, .got = got, .K = K};
  if (diff_total(&c, n) == 0) return 0;
  int64_t bad = 0;
  for (int64_t i = 0; i < n; i++) {
    uint32_t e = code_at(exp, K, i), f = code_at(got, K, i);
    if (e != f) {
      bad++;
      if (r) note(r, "payload", i, W[i], e, f);
    }
  }
  return bad;
}

/* Compare in's bytes with qatcheck's quantization of in->W under fmt/prof
 * (round to nearest, or sr). Wrong dtypes or shapes, a non-finite master:
 * QC_EINPUT with a message; mismatching bytes are a result (counts, the
 * first QC_DEPLOYED_FIRST mismatches, the payload under the stored scales). */
static int qc_deployed_compare(qc_qfmt fmt, qc_qprof prof, const qc_deployed_input *in, const qc_sr *sr, qc_deployed_result *out) {
  memset(out, 0, sizeof *out);
  out->n_payload_given = -1;
  if (!in->got.q.data) return QC_OK;
  out->present = 1;
  const int64_t N = in->N, K = in->K, n = N * K;
  char where[QC_PATHLEN + 32];
  float *de = NULL, *df = NULL;
  qc_quantized exp = {0}, got = {0}, given = {0};
  qc_recipe r1, r2;
  qc_qrecipe(fmt, prof, &r1, &r2);
  int rc = QC_ESYS;
  if (!(de = qc_malloc((size_t)n * 4 + 4, "deployed decode")) || !(df = qc_malloc((size_t)n * 4 + 4, "deployed decode")))
    goto done;
  snprintf(where, sizeof where, "%s: params/weight", in->where);
  /* a stored global scale is taken as stored for the blocks when it means
   * what the profile's does; the profile re-derives it only to check it */
  const int g_div = r1.nop != QN_DIVM;
  const float *gst = in->got.gscale.data && qc_numel(&in->got.gscale) == 1 && in->g_mult != g_div ? in->got.gscale.data : NULL;
  qc_qstored st = {gst, NULL, NULL};
  if ((rc = qc_quantize_st(fmt, prof, N, K, in->W, sr, gst ? &st : NULL, &exp, where))) goto done;
  snprintf(where, sizeof where, "%s: saved", in->where);
  if ((rc = qc_tensor_copy(&got.q, &in->got.q)) || (rc = qc_tensor_copy(&got.scale, &in->got.scale))) goto done;
  if (fmt == QC_QF_NVFP4 && (rc = qc_tensor_copy(&got.gscale, gst ? &in->got.gscale : &exp.gscale))) goto done;
  int ue8m0_bytes = (fmt == QC_QF_FP8_GROUP128_UE8M0 || fmt == QC_QF_FP8_BLOCK128_UE8M0) && got.scale.dtype == QC_E8M0;
  if (ue8m0_bytes && (rc = e8m0_scales(&exp.scale, &got.scale, out))) goto done;
  if ((rc = qc_dequantize(fmt, prof, N, K, &exp, de, "expected"))) goto done;
  if ((rc = qc_dequantize(fmt, prof, N, K, &got, df, where))) goto done;
  /* the global scale: the profile's own derivation against the stored one */
  if (fmt == QC_QF_NVFP4 && in->got.gscale.data) {
    qc_quantized d = {0};
    uint32_t e, f;
    if (gst) {
      snprintf(where, sizeof where, "%s: params/weight", in->where);
      if ((rc = qc_quantize(fmt, prof, N, K, in->W, sr, &d, where))) goto done;
      memcpy(&e, d.gscale.data, 4);
      qc_quantized_free(&d);
    } else {
      memcpy(&e, exp.gscale.data, 4);
      out->g_kind_differs = 1;
    }
    memcpy(&f, in->got.gscale.data, 4);
    if (e != f || out->g_kind_differs) {
      out->n_global++;
      note(out, "global", 0, NAN, e, f);
    }
  }
  out->total_payload = n;
  out->n_payload = payload_diff(&exp.q, &got.q, n, K, in->W, out);
  /* scales: raw bytes (an e8m0 view was compared above), float32 distances in ulps */
  if (!ue8m0_bytes) {
    size_t es = qc_dtype_size(exp.scale.dtype);
    for (int64_t i = 0; i < qc_numel(&exp.scale); i++)
      if (memcmp((char *)exp.scale.data + i * es, (char *)got.scale.data + i * es, es)) {
        uint32_t e = 0, f = 0;
        memcpy(&e, (char *)exp.scale.data + i * es, es);
        memcpy(&f, (char *)got.scale.data + i * es, es);
        out->n_scale++;
        if (exp.scale.dtype == QC_F32 && ulps(e, f) > out->scale_ulps) out->scale_ulps = ulps(e, f);
        note(out, "scale", i, NAN, e, f);
      }
  }
  diff_count dc = {.de = de, .df = df};
  const int64_t nd = diff_total(&dc, n) ? n : 0;
  for (int64_t i = 0; i < nd; i++) {
    uint16_t e = qc_f32_to_bf16(de[i]), f = qc_f32_to_bf16(df[i]);
    if (e != f) { out->n_decoded++; note(out, "decoded", i, in->W[i], e, f); }
  }
  /* the payload under the stored scales: the element rule alone */
  if (out->n_scale || out->n_global) {
    qc_qstored gs = {gst, got.scale.dtype == QC_F32 ? got.scale.data : NULL, got.scale.dtype != QC_F32 ? got.scale.data : NULL};
    snprintf(where, sizeof where, "%s: params/weight", in->where);
    if ((rc = qc_quantize_st(fmt, prof, N, K, in->W, sr, &gs, &given, where))) goto done;
    out->n_payload_given = payload_diff(&given.q, &got.q, n, K, in->W, NULL);
  } else {
    out->n_payload_given = out->n_payload;
  }
  rc = QC_OK;
done:
  qc_quantized_free(&exp);
  qc_quantized_free(&got);
  qc_quantized_free(&given);
  free(de);
  free(df);
  return rc;
}

/* Append the names of the profiles whose flag is set ("a, b and c"). */
static int list_profiles(char *buf, int n, const int *flag) {
  int k = 0, cnt = 0, tot = 0;
  for (int p = 0; p < QC_QP_COUNT; p++) tot += flag[p] != 0;
  for (int p = 0; p < QC_QP_COUNT && k < n; p++)
    if (flag[p]) {
      cnt++;
      k += snprintf(buf + k, (size_t)(n - k), "%s%s", cnt == 1 ? "" : cnt == tot ? " or " : ", ", qc_qprof_name((qc_qprof)p));
    }
  return k;
}

/* Every profile against in's bytes (*out: which reproduce them, the chosen
 * one, the reason in words). */
static int qc_deployed_identify(qc_qfmt fmt, const qc_deployed_input *in, const qc_sr *sr, qc_identify *out) {
  memset(out, 0, sizeof *out);
  out->chosen = -1;
  if (!in->got.q.data) return QC_OK;
  out->n = QC_QP_COUNT;
  int rc, best = -1;
  int64_t best_cost = -1;
  for (int p = 0; p < QC_QP_COUNT; p++) {
    qc_quant_cmp *c = &out->c[p];
    c->prof = (qc_qprof)p;
    if (!qc_qprof_makes(fmt, (qc_qprof)p)) { /* not a producer of this format */
      c->r.n_payload_given = -1;
      snprintf(c->line, sizeof c->line, "%s does not make %s", qc_qprof_name((qc_qprof)p), qc_qfmt_name(fmt));
      continue;
    }
    /* a profile running the same operations as an earlier one gives its result */
    int same = -1;
    for (int q = 0; q < p && same < 0; q++)
      if (qc_qprof_makes(fmt, (qc_qprof)q) && qc_qprof_same(fmt, (qc_qprof)p, (qc_qprof)q)) same = q;
    if (same >= 0) c->r = out->c[same].r;
    else if ((rc = qc_deployed_compare(fmt, (qc_qprof)p, in, sr, &c->r))) return rc;
    qc_deployed_summary(&c->r, c->line, sizeof c->line);
    c->ok = !(c->r.n_payload || c->r.n_scale || c->r.n_global || c->r.n_decoded);
    if (c->ok && !out->any) { out->any = 1; out->chosen = p; }
    int64_t cost = c->r.n_scale + c->r.n_global + c->r.n_payload;
    if (best < 0 || cost < best_cost) { best = p; best_cost = cost; }
  }
  char *w = out->why;
  int n = (int)sizeof out->why, k = 0;
  int flag[QC_QP_COUNT];
  if (out->any) {
    for (int p = 0; p < QC_QP_COUNT; p++) flag[p] = out->c[p].ok;
    k += snprintf(w, (size_t)n, "reproduced by ");
    list_profiles(w + k, n - k, flag);
    return QC_OK;
  }
  out->chosen = best;
  const qc_deployed_result *r = &out->c[best].r;
  k += snprintf(w + k, (size_t)(n - k), "no profile reproduces the bytes; closest %s/%s: ", qc_qfmt_name(fmt), qc_qprof_name((qc_qprof)best));
  if (r->n_scale && k < n)
    k += r->scale_ulps ? snprintf(w + k, (size_t)(n - k), "%lld scale(s) differ by up to %d ulp, ", (long long)r->n_scale, r->scale_ulps)
                       : snprintf(w + k, (size_t)(n - k), "%lld scale byte(s) differ, ", (long long)r->n_scale);
  if (r->n_global && k < n)
    k += snprintf(w + k, (size_t)(n - k), r->g_kind_differs ? "the global scale is stored as the other kind (multiplier / divisor), "
                                                            : "the global scale differs, ");
  if (k < n) k += snprintf(w + k, (size_t)(n - k), "%lld payload element(s) differ", (long long)r->n_payload);
  /* which rules the stored bytes fit */
  int any_s = 0, any_e = 0;
  for (int p = 0; p < QC_QP_COUNT; p++)
    any_s |= flag[p] = qc_qprof_makes(fmt, (qc_qprof)p) && !out->c[p].r.n_scale && !out->c[p].r.n_global;
  if (k < n) k += snprintf(w + k, (size_t)(n - k), any_s ? "; the scales fit " : "; no profile's scale rule gives the stored scales");
  if (any_s && k < n) k += list_profiles(w + k, n - k, flag);
  for (int p = 0; p < QC_QP_COUNT; p++) any_e |= flag[p] = out->c[p].r.n_payload_given == 0;
  if (k < n)
    k += snprintf(w + k, (size_t)(n - k), any_e ? "; under the stored scales the payload fits "
                                                : "; under the stored scales no profile's element rule gives the payload");
  if (any_e && k < n) list_profiles(w + k, n - k, flag);
  return QC_OK;
}

int qc_deployed_check(const qc_module *m, qc_qfmt fmt, qc_qprof prof, const qc_sr *sr, qc_deployed_result *out) {
  qc_deployed_input in;
  memset(out, 0, sizeof *out);
  int rc = qc_deployed_read_module(m, fmt, &in);
  if (!rc) rc = qc_deployed_compare(fmt, prof, &in, sr, out);
  qc_deployed_input_free(&in);
  return rc;
}

int qc_deployed_identify_module(const qc_module *m, qc_qfmt fmt, const qc_sr *sr, qc_identify *out) {
  qc_deployed_input in;
  memset(out, 0, sizeof *out);
  int rc = qc_deployed_read_module(m, fmt, &in);
  if (!rc) rc = qc_deployed_identify(fmt, &in, sr, out);
  qc_deployed_input_free(&in);
  return rc;
}

int qc_deployed_check_expert(const qc_module *m, const char *param, int64_t e, qc_qfmt fmt, qc_qprof prof, qc_deployed_result *out) {
  qc_deployed_input in;
  char where[QC_PATHLEN + QC_NAMELEN + 48];
  memset(out, 0, sizeof *out);
  int rc = read_expert(m, param, e, fmt, where, sizeof where, &in);
  if (!rc) rc = qc_deployed_compare(fmt, prof, &in, NULL, out);
  qc_deployed_input_free(&in);
  return rc;
}

int qc_deployed_identify_expert(const qc_module *m, const char *param, int64_t e, qc_qfmt fmt, qc_identify *out) {
  qc_deployed_input in;
  char where[QC_PATHLEN + QC_NAMELEN + 48];
  memset(out, 0, sizeof *out);
  int rc = read_expert(m, param, e, fmt, where, sizeof where, &in);
  if (!rc) rc = qc_deployed_identify(fmt, &in, NULL, out);
  qc_deployed_input_free(&in);
  return rc;
}
