/* ckpt_quant.c: `quant` over many modules (see ckpt_quant.h): deployed
 * checkpoints read by their producers' naming conventions, each module
 * assembled from its tensors as stored and compared by qc_deployed_check;
 * every module of a dump; params/ of a vjp module from a checkpoint. */
#include "engine/ckpt_quant.h"

#include <cjson/cJSON.h>
#include <math.h>
#include <regex.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "core/pattern.h"
#include "core/qc.h"
#include "engine/deployed.h"
#include "model/case.h"

/* A tensor of checkpoint st, whole (e < 0) or its slice e, named `as`. */
static int load(const qc_st *st, const char *name, int e, const char *as, qc_tensor *out) {
  if (e < 0) return qc_st_load(st, name, as, out);
  const qc_st_tensor *t = qc_st_find(st, name);
  memset(out, 0, sizeof *out);
  if (!t) return qc_err("checkpoint '%s': tensor '%s' is missing", qc_st_path(st), name);
  if (t->dtype < 0 || t->ndim < 1)
    return qc_err("checkpoint '%s': tensor '%s' (%s, rank %d) cannot be sliced per expert", qc_st_path(st), name, t->st_dtype, t->ndim);
  int rc = qc_tensor_alloc(out, as, (qc_dtype)t->dtype, t->ndim - 1, t->shape + 1);
  if (!rc) rc = qc_st_read(st, t, e, out->data, out->nbytes);
  if (rc) qc_tensor_free(out);
  return rc;
}

/* Every scale of a float32 tensor a power of two (or zero)? */
static int all_pow2(const qc_tensor *s) {
  for (int64_t i = 0; i < qc_numel(s); i++) {
    float v = ((const float *)s->data)[i];
    int ex;
    if (v != 0 && frexpf(v, &ex) != 0.5f) return 0;
  }
  return 1;
}

/* scale_fmt of the deployed checkpoint's config.json quantization_config
 * ("ue8m0" for DeepSeek V3.1-style power-of-two block scales), "" if none. */
static void config_scale_fmt(const char *config, char *out, size_t n) {
  struct stat sb;
  out[0] = 0;
  if (!config || stat(config, &sb) != 0 || !S_ISREG(sb.st_mode)) return; /* a FIFO would block fopen */
  FILE *f = fopen(config, "rb");
  if (!f) return;
  char buf[1 << 16];
  size_t got = fread(buf, 1, sizeof buf - 1, f);
  fclose(f);
  buf[got] = 0;
  cJSON *root = cJSON_Parse(buf);
  const cJSON *qc = cJSON_GetObjectItemCaseSensitive(root, "quantization_config");
  const cJSON *sf = cJSON_GetObjectItemCaseSensitive(qc, "scale_fmt");
  if (cJSON_IsString(sf)) snprintf(out, n, "%s", sf->valuestring);
  cJSON_Delete(root);
}

/* One deployed module: its tensors by convention. */
typedef struct dep_mod {
  char base[QC_ST_NAMELEN];       /* "model.layers.0.mlp.down_proj" */
  const qc_st_tensor *q, *s, *g;  /* payload, scale, global scale (NULL: none) */
  const char *convention;
} dep_mod;

/* The format of module dm from its payload and scale, for master [N, K];
 * "" with why set when none fits. */
static const char *infer_format(const dep_mod *dm, const qc_tensor *q, const qc_tensor *s, int64_t N, int64_t K,
                                const char *scale_fmt, char *why, size_t wn) {
  int fp4 = q->dtype == QC_E2M1X2 || q->dtype == QC_U8;
  int64_t sn = qc_numel(s), s0 = s->ndim ? s->shape[0] : 1, s1 = s->ndim > 1 ? s->shape[1] : 1;
  int e8 = s->dtype == QC_E8M0 || s->dtype == QC_U8;
  why[0] = 0;
  if (!fp4 && q->dtype == QC_E4M3) {
    if (s->dtype == QC_F32 && sn == 1) return "fp8_tensor";
    if (s->dtype == QC_F32 && s0 == N && sn == N) return "fp8_channel";
    if (s->dtype == QC_F32 && s->ndim == 2 && s0 == (N + 127) / 128 && s1 == (K + 127) / 128)
      return strcmp(scale_fmt, "ue8m0") == 0 || all_pow2(s) ? "fp8_block128_ue8m0" : "fp8_block128";
    if (e8 && s->ndim == 2 && s0 == N && s1 == (K + 31) / 32) return "mxfp8";
  } else if (fp4) {
    if (s->dtype == QC_E4M3 && s->ndim == 2 && s0 == N && s1 == (K + 15) / 16) return "nvfp4";
    if (e8 && s->ndim == 2 && s0 == N && s1 == (K + 31) / 32) return "mxfp4";
  }
  char a[64], b[64];
  snprintf(why, wn, "'%s' %s %s with '%s' %s %s fits no format for a [%lld, %lld] master", dm->q->name, dm->q->st_dtype,
           qc_shape_str(q->ndim, q->shape, a, sizeof a), dm->s->name, dm->s->st_dtype, qc_shape_str(s->ndim, s->shape, b, sizeof b),
           (long long)N, (long long)K);
  return "";
}

/* A row of out for module m: its deployed bytes compared under f and
 * profile `prof` by the one deployed-bytes check; "auto": every profile is
 * tried (qc_deployed_identify_module) and the row takes the first that
 * reproduces the bytes, else the closest, and says which and why. */
static int add_row(qc_quant_rows *out, const qc_module *m, qc_qfmt f, const char *prof, const qc_sr *sr,
                   const char *convention, const char *tensors) {
  qc_quant_row *row;
  qc_qprof p = QC_QP_VLLM;
  int autop = strcmp(prof, "auto") == 0;
  int rc = autop ? QC_OK : qc_qprof_parse(prof, &p);
  if (rc || (rc = qc_quant_rows_add(out, &row))) return rc;
  snprintf(row->module, sizeof row->module, "%s", m->path);
  snprintf(row->format, sizeof row->format, "%s", qc_qfmt_name(f));
  snprintf(row->convention, sizeof row->convention, "%s", convention);
  snprintf(row->tensors, sizeof row->tensors, "%s", tensors);
  if (autop) {
    qc_identify *idf = qc_calloc(1, sizeof *idf, "profile identification");
    if (!idf || (rc = qc_deployed_identify_module(m, f, sr, idf))) {
      free(idf);
      out->n--;
      return idf ? rc : QC_ESYS;
    }
    p = (qc_qprof)idf->chosen;
    row->c = idf->c[idf->chosen];
    row->c.ok = idf->any;
    qc_deployed_summary(&row->c.r, row->c.line, sizeof row->c.line);
    size_t l = strlen(row->c.line);
    snprintf(row->c.line + l, sizeof row->c.line - l, "; profile auto: %s", idf->why);
    free(idf);
  } else {
    if ((rc = qc_deployed_check(m, f, p, sr, &row->c.r))) {
      out->n--;
      return rc;
    }
    qc_deployed_summary(&row->c.r, row->c.line, sizeof row->c.line);
    row->c.ok = !(row->c.r.n_payload || row->c.r.n_scale || row->c.r.n_global || row->c.r.n_decoded);
  }
  row->c.prof = p;
  return QC_OK;
}

/* Compare one (expert of a) deployed module against its master. e < 0: the
 * whole module; else expert e of stacked [E, ...] tensors. */
static int check_one(const qc_st *dep, const qc_st *mst, const dep_mod *dm, int e, const qc_quant_many_opts *o,
                     const char *scale_fmt, qc_quant_rows *out) {
  qc_module m;
  qc_tensor w = {0}, q = {0}, s = {0}, g = {0};
  char mname[QC_ST_NAMELEN + 16], why[512], a[64], b[64];
  int rc;
  memset(&m, 0, sizeof m);
  snprintf(mname, sizeof mname, "%s.weight", dm->base);
  if (e < 0) snprintf(m.path, sizeof m.path, "/%s", dm->base);
  else snprintf(m.path, sizeof m.path, "/%s[%d]", dm->base, e);
  if (!qc_st_find(mst, mname)) {
    qc_hint("the master is the checkpoint the deployed one was quantized from (the same tensor names, BF16/F16/F32)");
    return qc_err("--master '%s': tensor '%s' is missing (the master of deployed '%s')", qc_st_path(mst), mname, dm->q->name);
  }
  if ((rc = load(mst, mname, e, "weight", &w)) || (rc = load(dep, dm->q->name, e, "weight_q", &q)) ||
      (rc = load(dep, dm->s->name, e, "weight_scale", &s)))
    goto done;
  if (dm->g) {
    const qc_st_tensor *gt = dm->g;
    int per_expert = e >= 0 && gt->ndim >= 1 && gt->shape[0] > 1;
    /* ModelOpt's weight_scale_2 multiplies (amax / 2688); compressed-tensors'
     * weight_global_scale divides (2688 / amax): the name tells the check which */
    const char *gname = strcmp(dm->convention, "modelopt") == 0 ? "weight_scale_2" : "weight_global_scale";
    if ((rc = load(dep, gt->name, per_expert ? e : -1, gname, &g))) goto done;
  }
  if (w.ndim != 2 || !qc_dtype_is_float(w.dtype) || w.dtype == QC_E4M3 || w.dtype == QC_E5M2 || w.dtype == QC_E8M0 ||
      w.dtype == QC_E2M1X2) {
    rc = qc_err("--master '%s': tensor '%s' is %s %s: expected a [N, K] master weight of BF16, F16, F32 or F64",
                qc_st_path(mst), mname, qc_dtype_name(w.dtype), qc_shape_str(w.ndim, w.shape, a, sizeof a));
    goto done;
  }
  const int64_t N = w.shape[0], K = w.shape[1];
  int fp4_store = q.dtype == QC_E2M1X2 || q.dtype == QC_U8;
  int64_t qk = fp4_store ? (K + 1) / 2 : K;
  if (q.ndim != 2 || q.shape[0] != N || q.shape[1] != qk) {
    rc = qc_err("deployed '%s' is %s %s but its master '%s' is [%lld, %lld]: expected [%lld, %lld]", dm->q->name,
                dm->q->st_dtype, qc_shape_str(q.ndim, q.shape, a, sizeof a), mname, (long long)N, (long long)K,
                (long long)N, (long long)qk);
    goto done;
  }
  const char *fmt = o->format ? o->format : infer_format(dm, &q, &s, N, K, scale_fmt, why, sizeof why);
  if (!fmt[0]) {
    qc_hint("pass --format to name it");
    rc = qc_err("deployed module '%s': %s", dm->base, why);
    goto done;
  }
  qc_qfmt f;
  const char *prof = o->profile ? o->profile : "auto";
  if ((rc = qc_qfmt_parse(fmt, &f))) goto done;
  /* the stored types, as qatcheck names them: packed bytes are e2m1 pairs,
   * uint8 scales of the mx formats e8m0, a scalar scale one element */
  if (q.dtype == QC_U8) q.dtype = QC_E2M1X2;
  if (s.dtype == QC_U8 && (f == QC_QF_MXFP8 || f == QC_QF_MXFP4)) s.dtype = QC_E8M0;
  if (s.ndim == 0 || (f == QC_QF_FP8_TENSOR && qc_numel(&s) == 1)) { s.ndim = 1; s.shape[0] = 1; }
  if (f == QC_QF_FP8_CHANNEL && s.ndim == 1) { s.ndim = 2; s.shape[1] = 1; }
  if (g.data) {
    if (g.dtype != QC_F32 || qc_numel(&g) != 1) {
      rc = qc_err("deployed '%s' is %s %s: expected one float32 global scale", dm->g->name, dm->g->st_dtype,
                  qc_shape_str(g.ndim, g.shape, b, sizeof b));
      goto done;
    }
    g.ndim = 1;
    g.shape[0] = 1;
  }
  if ((rc = qc_tset_add(&m.params, &w)) || (rc = qc_tset_add(&m.saved, &q)) || (rc = qc_tset_add(&m.saved, &s))) goto done;
  if (g.data && (rc = qc_tset_add(&m.saved, &g))) goto done;
  char tensors[256];
  snprintf(tensors, sizeof tensors, "%s %s, %s %s%s%s", strrchr(dm->q->name, '.') + 1, dm->q->st_dtype,
           strrchr(dm->s->name, '.') + 1, dm->s->st_dtype, dm->g ? ", " : "", dm->g ? strrchr(dm->g->name, '.') + 1 : "");
  qc_sr sr;
  memset(&sr, 0, sizeof sr); /* a checkpoint's bytes are rounded to nearest */
  rc = add_row(out, &m, f, prof, &sr, dm->convention, tensors);
done:
  qc_tensor_free(&w);
  qc_tensor_free(&q);
  qc_tensor_free(&s);
  qc_tensor_free(&g);
  qc_module_free(&m);
  return rc;
}

/* name minus `suffix` into base when name ends with it. */
static int strip(const char *name, const char *suffix, char *base, size_t n) {
  size_t a = strlen(name), b = strlen(suffix);
  if (a <= b || strcmp(name + a - b, suffix) != 0 || a - b >= n) return 0;
  snprintf(base, n, "%.*s", (int)(a - b), name);
  return 1;
}

static const qc_st_tensor *sibling(const qc_st *st, const char *base, const char *suffix) {
  char nm[QC_ST_NAMELEN + 32];
  snprintf(nm, sizeof nm, "%s%s", base, suffix);
  return qc_st_find(st, nm);
}

int qc_quant_checkpoint(const qc_st *dep, const qc_st *mst, const qc_quant_many_opts *o, qc_quant_rows *out) {
  regex_t re;
  int use_re = 0, rc = QC_OK;
  char scale_fmt[32], path[QC_ST_NAMELEN + 2], note[160];
  memset(out, 0, sizeof *out);
  if (o->modules && o->modules[0]) {
    if ((rc = qc_pattern_compile(&re, o->modules, "--modules"))) return rc;
    use_re = 1;
  }
  config_scale_fmt(o->config, scale_fmt, sizeof scale_fmt);
  for (int i = 0; i < qc_st_count(dep) && !rc; i++) {
    const qc_st_tensor *t = qc_st_at(dep, i);
    dep_mod dm;
    memset(&dm, 0, sizeof dm);
    int packed = strip(t->name, ".weight_packed", dm.base, sizeof dm.base);
    if (!packed && !strip(t->name, ".weight", dm.base, sizeof dm.base)) continue;
    snprintf(path, sizeof path, "/%s", dm.base);
    if (use_re && regexec(&re, path, 0, NULL, 0) != 0) continue;
    int stored_q = t->dtype == QC_E4M3 || t->dtype == QC_E5M2 || t->dtype == QC_U8 || t->dtype == QC_E2M1X2 || t->dtype == QC_I8;
    if (!stored_q) {
      if (t->ndim >= 2 && qc_st_find(mst, t->name)) rc = qc_quant_rows_skip(out, path, "not quantized (a master-dtype weight)");
      continue;
    }
    dm.q = t;
    if ((dm.s = sibling(dep, dm.base, ".weight_scale_inv"))) {
      dm.convention = "deepseek_fp8";
    } else if ((dm.s = sibling(dep, dm.base, ".weight_scale"))) {
      if ((dm.g = sibling(dep, dm.base, ".weight_scale_2"))) {
        dm.convention = "modelopt";
      } else {
        dm.g = sibling(dep, dm.base, ".weight_global_scale");
        dm.convention = "compressed_tensors";
      }
    } else {
      rc = qc_quant_rows_skip(out, path, "a stored-quantized weight without weight_scale or weight_scale_inv");
      continue;
    }
    if (t->dtype == QC_I8 || t->dtype == QC_E5M2) {
      snprintf(note, sizeof note, "%s weights: no qatcheck format", t->st_dtype);
      rc = qc_quant_rows_skip(out, path, note);
      continue;
    }
    if (t->ndim == 3) { /* stacked experts [E, ...]: one row per expert */
      for (int e = 0; e < (int)t->shape[0] && !rc; e++) rc = check_one(dep, mst, &dm, e, o, scale_fmt, out);
    } else {
      rc = check_one(dep, mst, &dm, -1, o, scale_fmt, out);
    }
  }
  if (use_re) regfree(&re);
  if (!rc && out->n == 0) {
    rc = qc_err("--checkpoint '%s': no quantized module%s%s%s: expected '<module>.weight' (F8_E4M3, F4 or packed U8) or "
                "'<module>.weight_packed' beside '<module>.weight_scale' or '<module>.weight_scale_inv'",
                qc_st_path(dep), use_re ? " matches --modules '" : "", use_re ? o->modules : "", use_re ? "'" : "");
  }
  if (rc) qc_quant_rows_free(out);
  return rc;
}

int qc_quant_dump_all(qc_dump *d, const qc_quant_many_opts *o, qc_quant_rows *out) {
  qc_dump_entry *ents = NULL;
  int n = 0, rc;
  char where[QC_PATHLEN + 64], cj[4096];
  memset(out, 0, sizeof *out);
  if ((rc = qc_dump_modules(d, o->modules, &ents, &n))) return rc;
  for (int i = 0; i < n && !rc; i++) {
    char ds[QC_PATHLEN + 32];
    snprintf(ds, sizeof ds, "%s/saved/weight_q", ents[i].path);
    if (!qc_dump_exists(d, ds)) continue;
    qc_module m;
    if ((rc = qc_dump_load_module(d, ents[i].path, 0, &m, cj, sizeof cj))) break;
    snprintf(where, sizeof where, "module '%s'", ents[i].path);
    const char *fmt = o->format, *prof = o->profile;
    if (cj[0] && (rc = qc_contract_parse(cj, where, &m.contract))) goto next;
    if (!fmt) fmt = qc_contract_str(&m.contract, "weight_format", NULL);
    if (!fmt || strcmp(fmt, "none") == 0) {
      rc = qc_quant_rows_skip(out, m.path, "deployed bytes but no contract weight_format (pass --format)");
      goto next;
    }
    if (!prof) prof = qc_contract_str(&m.contract, "profile", "auto");
    qc_qfmt f;
    qc_sr sr;
    if ((rc = qc_qfmt_parse(fmt, &f))) goto next;
    if ((rc = qc_sr_from_contract(&m.contract, m.path, &sr))) goto next;
    rc = add_row(out, &m, f, prof, &sr, "dump",
                 qc_tset_get(&m.saved, "weight_global_scale") ? "saved/weight_q, saved/weight_scale, saved/weight_global_scale"
                                                               : "saved/weight_q, saved/weight_scale");
  next:
    qc_module_free(&m);
  }
  if (!rc && out->n == 0) {
    rc = qc_err("dump '%s': no module group%s%s%s has deployed bytes (saved/weight_q) with a weight_format: nothing to check",
                qc_dump_path(d), o->modules ? " matching '" : "", o->modules ? o->modules : "", o->modules ? "'" : "");
  }
  free(ents);
  if (rc) qc_quant_rows_free(out);
  return rc;
}

int qc_ckpt_params(const qc_st *st, const char *prefix, qc_module *m) {
  char want[QC_ST_NAMELEN];
  const char *mod = m->path[0] == '/' ? m->path + 1 : m->path;
  int w = snprintf(want, sizeof want, "%s%s.", prefix ? prefix : "", mod), found = 0, rc = QC_OK;
  if (w >= (int)sizeof want) return qc_err("module '%s': name too long for a checkpoint tensor", m->path);
  for (int i = 0; i < qc_st_count(st) && !rc; i++) {
    const qc_st_tensor *t = qc_st_at(st, i);
    const char *pn = t->name + w;
    if (strncmp(t->name, want, (size_t)w) || !*pn || strchr(pn, '.') || strlen(pn) >= QC_NAMELEN) continue;
    qc_tensor tt;
    if ((rc = qc_st_load(st, t->name, pn, &tt))) break;
    qc_tensor *old = qc_tset_get_mut(&m->params, pn);
    if (old) {
      qc_tensor_free(old);
      *old = tt;
    } else if ((rc = qc_tset_add(&m->params, &tt))) {
      qc_tensor_free(&tt);
    }
    found++;
  }
  if (!rc && !found) {
    qc_hint("set data.checkpoint_prefix when the checkpoint's names carry a prefix the dump's group paths do not");
    rc = qc_err("checkpoint '%s': no tensor '%s<param>' for module '%s'", qc_st_path(st), want, m->path);
  }
  return rc;
}
