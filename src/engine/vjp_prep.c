/* vjp_prep.c: one module made ready for its audit, for both runs of a case
 * (vjp.c over one dump or generated instances, shard.c over a sharded
 * dump): its contract, its deployed bytes checked, its dYs selected; and,
 * after its audit, whether its failures can be told from a producer's bf16
 * GEMM sums. Below both, so neither calls the other for it. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/par.h"
#include "core/qc.h"
#include "engine/deployed.h"
#include "engine/vjp.h"

/* Does m's class take a quantizer profile? */
static int takes_profile(const qc_module *m) {
  for (const qc_key_spec *k = m->cls->keys; k && k->key; k++)
    if (strcmp(k->key, "profile") == 0) return 1;
  return 0;
}

/* Contract for m: the dump's attribute (if any), the case's over it, the
 * --profile option over both where m's class takes a profile (else left
 * out, said under --verbose); validated against the class's keys. A profile
 * none of them names is auto (check_deployed resolves it). */
int qc_vjp_set_contract(qc_module *m, const qc_case *cs, const char *dump_contract, const char *profile) {
  char where[QC_PATHLEN + 64];
  int rc;
  memset(&m->contract, 0, sizeof m->contract);
  if (dump_contract && dump_contract[0]) {
    snprintf(where, sizeof where, "module '%s'", m->path);
    if ((rc = qc_contract_parse(dump_contract, where, &m->contract))) return rc;
  }
  if (cs->has_contract && (rc = qc_contract_merge(&m->contract, &cs->contract))) return rc;
  /* --profile applies to the classes with a quantizer; a mixed case's
   * others (a norm beside its linears) are left as they are */
  if (profile && !takes_profile(m) && qc_verbose)
    fprintf(stderr, "qatcheck: %s: --profile '%s' not applied: class '%s' has no quantizer profile\n", m->path, profile,
            m->cls->name);
  if (profile && takes_profile(m) && (rc = qc_contract_set(&m->contract, "profile", profile, 0, 0))) return rc;
  snprintf(where, sizeof where, "case '%s': module '%s'", cs->path, m->path);
  int explicit_profile = qc_contract_has(&m->contract, "profile");
  if ((rc = qc_contract_validate(&m->contract, m->cls->keys, where))) return rc;
  /* no profile named anywhere: auto (the deployed bytes decide; vllm without them) */
  return !explicit_profile && takes_profile(m) ? qc_contract_set(&m->contract, "profile", "auto", 0, 0) : QC_OK;
}

/* Every expert's deployed bytes of one stacked parameter, checked on
 * qc_par_for's threads (an expert's check is serial in its comparisons: a
 * 256-expert layer's took minutes on one core), each expert into its own
 * r[e], so the results do not depend on the thread count. At most
 * EXPERT_PIECES experts at once: each holds about 270 MB at DeepSeek-V3's
 * expert size, and its quantizer runs on threads of its own. */
#define EXPERT_PIECES 8
typedef struct expert_checks {
  const qc_module *m;
  const char *param;
  qc_qfmt f;
  qc_qprof prof;
  qc_deployed_result *r; /* [E] */
  int *rc;               /* [E]: 0, or the status of the piece's first failed expert (the rest of its piece not run) */
  qc_err_state *es;      /* [E]: that expert's error, taken from its thread */
} expert_checks;

static void experts_piece(void *ctx, int64_t lo, int64_t hi, int tid) {
  (void)tid;
  expert_checks *c = ctx;
  for (int64_t e = lo; e < hi; e++)
    if ((c->rc[e] = qc_deployed_check_expert(c->m, c->param, e, c->f, c->prof, &c->r[e]))) {
      qc_err_save(&c->es[e]);
      return;
    }
}

/* Fill c->r [E] (the caller frees it); the lowest failed expert's status
 * and message, as a loop over the experts in order would give. */
static int experts_checked(expert_checks *c, int64_t E) {
  int rc = QC_ESYS;
  c->r = qc_calloc((size_t)E, sizeof *c->r, "deployed checks");
  c->rc = qc_calloc((size_t)E, sizeof *c->rc, "deployed checks");
  c->es = qc_calloc((size_t)E, sizeof *c->es, "deployed checks");
  if (c->r && c->rc && c->es) {
    qc_err_state pre; /* an earlier message stays first, whichever thread ran the failed expert */
    qc_err_save(&pre);
    qc_par_for(E, (E + EXPERT_PIECES - 1) / EXPERT_PIECES, experts_piece, c);
    rc = QC_OK;
    for (int64_t e = 0; e < E && !rc; e++)
      if ((rc = c->rc[e])) qc_err_restore(&c->es[e]);
    if (rc) qc_err_keep(&pre);
    else qc_err_restore(&pre);
  }
  free(c->rc);
  free(c->es);
  if (rc) {
    free(c->r);
    c->r = NULL;
  }
  return rc;
}

/* The stacked parameters' deployed bytes (m's class row stacked_deployed,
 * "KEY P1 P2 ..."): every expert of each P with saved/<P>_q compared byte
 * for byte under the format KEY names and m's profile (auto: identified on
 * the first expert with bytes, then used for all), one `quantizer/<P>`
 * check per parameter naming the experts whose bytes differ (global ids:
 * the index along the stacked dimension of the whole module). Bytes the
 * contract leaves without a format, or scales without their payload, are
 * refused. *handled = 1 when m's class has stacked parameters. */
static int check_stacked(qc_audit *a, qc_module *m, int *handled) {
  const char *spec = m->cls->stacked_deployed;
  *handled = spec != NULL;
  if (!spec) return QC_OK;
  char key[64], params[8][QC_NAMELEN];
  int np = 0, rc;
  const char *p = spec;
  size_t l = strcspn(p, " ");
  snprintf(key, sizeof key, "%.*s", (int)l, p);
  for (p += l; *p == ' ' && np < 8;) {
    p++;
    l = strcspn(p, " ");
    snprintf(params[np++], QC_NAMELEN, "%.*s", (int)l, p);
    p += l;
  }
  const char *fn = qc_contract_str(&m->contract, key, "none");
  const char *pn = qc_contract_str(&m->contract, "profile", "auto");
  int autop = strcmp(pn, "auto") == 0, any = 0;
  static const char *suffix[] = {"_scale", "_scale_inv", "_scale_2", "_global_scale"};
  for (int i = 0; i < np; i++) {
    char nq[QC_NAMELEN + 16], ns[QC_NAMELEN + 24];
    snprintf(nq, sizeof nq, "%s_q", params[i]);
    if (qc_tset_get(&m->saved, nq)) {
      any = 1;
      if (strcmp(fn, "none") == 0) {
        qc_hint("set the contract's %s to the bytes' format (docs/numerics.md), or leave saved/%s out of the dump", key, nq);
        return qc_err("module '%s': dataset 'saved/%s' (deployed bytes) is present but the contract's %s is '%s': they would be "
                      "ignored", m->path, nq, key, fn);
      }
      continue;
    }
    for (int j = 0; j < 4; j++) {
      snprintf(ns, sizeof ns, "%s%s", params[i], suffix[j]);
      if (qc_tset_get(&m->saved, ns))
        return qc_err("module '%s': dataset 'saved/%s' is present without 'saved/%s': scales without their bytes would be ignored",
                      m->path, ns, nq);
    }
  }
  if (!any) return autop ? qc_contract_set(&m->contract, "profile", "vllm", 0, 0) : QC_OK;
  qc_qfmt f;
  qc_qprof prof = QC_QP_VLLM;
  char note[640] = "";
  if ((rc = qc_qfmt_parse(fn, &f)) || (!autop && (rc = qc_qprof_parse(pn, &prof)))) return rc;
  for (int i = 0; i < np; i++) {
    char nq[QC_NAMELEN + 16];
    snprintf(nq, sizeof nq, "%s_q", params[i]);
    const qc_tensor *wq = qc_tset_get(&m->saved, nq);
    if (wq && wq->dtype == QC_U8) {
      int fp4 = f == QC_QF_NVFP4 || f == QC_QF_MXFP4;
      qc_hint("scripts/qatdump.py writes it from the contract's %s or the module's qatcheck_dtypes; with h5py: ds.attrs['dtype'] = '%s'", key,
              fp4 ? "float4_e2m1fn_x2" : "float8_e4m3fn");
      return qc_err("module '%s': saved/%s is uint8 without a 'dtype' attribute: expected %s bytes for %s %s", m->path, nq,
                    fp4 ? "float4_e2m1fn_x2" : "float8_e4m3fn", key, fn);
    }
  }
  if (autop) { /* the producer, from the first expert's bytes */
    qc_identify *idf = qc_calloc(1, sizeof *idf, "profile identification");
    if (!idf) return QC_ESYS;
    for (int i = 0; i < np && !idf->n; i++)
      if ((rc = qc_deployed_identify_expert(m, params[i], 0, f, idf))) { free(idf); return rc; }
    prof = idf->any ? (qc_qprof)idf->chosen : QC_QP_VLLM;
    snprintf(note, sizeof note, "profile %s (auto, from expert 0: %s)", qc_qprof_name(prof), idf->why);
    free(idf);
    if ((rc = qc_contract_set(&m->contract, "profile", qc_qprof_name(prof), 0, 0))) return rc;
    if (qc_verbose) fprintf(stderr, "qatcheck: %s: %s\n", m->path, note);
  }
  for (int i = 0; i < np; i++) {
    char nq[QC_NAMELEN + 16];
    snprintf(nq, sizeof nq, "%s_q", params[i]);
    const qc_tensor *wq = qc_tset_get(&m->saved, nq), *w;
    if (!wq) continue;
    if ((rc = qc_module_need(m, "params", params[i], 3, 3, &w))) return rc;
    qc_check k;
    memset(&k, 0, sizeof k);
    snprintf(k.module, sizeof k.module, "%s", m->path);
    snprintf(k.cls, sizeof k.cls, "%s", m->cls->name);
    snprintf(k.dy, sizeof k.dy, "-");
    snprintf(k.tensor, sizeof k.tensor, "quantizer/%s", params[i]);
    k.ndim = w->ndim;
    memcpy(k.shape, w->shape, sizeof k.shape);
    snprintf(k.cand_dtype, sizeof k.cand_dtype, "%s", qc_dtype_name(wq->dtype));
    int64_t nbad = 0, first = -1;
    char line[2048] = "", head[192];
    size_t hl = 0;
    expert_checks ec = {.m = m, .param = params[i], .f = f, .prof = prof};
    if ((rc = experts_checked(&ec, w->shape[0]))) return rc;
    for (int64_t e = 0; e < w->shape[0]; e++) {
      const qc_deployed_result r = ec.r[e];
      if (!(r.n_payload || r.n_scale || r.n_global || r.n_decoded)) continue;
      if (nbad++ == 0) { /* the first expert's mismatches in full */
        first = e;
        qc_deployed_summary(&r, line, sizeof line);
      }
      if (hl < sizeof head - 24) hl += (size_t)snprintf(head + hl, sizeof head - hl, "%s%lld", nbad > 1 ? ", " : "", (long long)e);
      else if (hl < sizeof head - 4) hl += (size_t)snprintf(head + hl, sizeof head - hl, " ...");
    }
    free(ec.r);
    k.verdict = nbad ? QC_V_FAIL : QC_V_PASS;
    if (nbad)
      snprintf(k.why, sizeof k.why, "expert %lld: %lld of %lld experts differ (%s); expert %lld: %s", (long long)first, (long long)nbad,
               (long long)w->shape[0], head, (long long)first, line);
    if (!nbad && autop) snprintf(k.why, sizeof k.why, "%s", note);
    if ((rc = qc_results_add(a->res, &k))) return rc;
  }
  return QC_OK;
}

/* Deployed bytes: when m's saved/ holds weight_q, a `quantizer` check that
 * qatcheck's quantizer (contract's weight_format, profile, rounding)
 * reproduces them byte for byte. The profile is the contract's (the case's,
 * --profile's); absent or auto, every profile is tried and the first that
 * reproduces the bytes becomes the module's (the check says which and why;
 * none: the check fails naming the closest, and vllm is used). No check
 * when there are no saved bytes; then auto means vllm. */
int qc_vjp_check_deployed(qc_audit *a, qc_module *m) {
  int handled, rc = check_stacked(a, m, &handled);
  if (rc || handled) return rc;
  const char *fn = qc_contract_str(&m->contract, "weight_format", "none");
  const char *pn = qc_contract_str(&m->contract, "profile", "auto");
  int autop = strcmp(pn, "auto") == 0;
  if (qc_tset_get(&m->saved, "weight_q") && (!qc_contract_has(&m->contract, "weight_format") || strcmp(fn, "none") == 0)) {
    /* deployed bytes no format can check would be ignored: refused instead */
    qc_hint("set the contract's weight_format to the bytes' format (docs/numerics.md), or leave saved/weight_q out of the dump");
    return qc_err("module '%s': dataset 'saved/weight_q' (deployed bytes) is present but the contract's weight_format is '%s': "
                  "they would be ignored", m->path, fn);
  }
  static const char *scales[] = {"weight_scale", "weight_scale_inv", "weight_scale_2", "weight_global_scale"};
  for (int i = 0; i < 4 && !qc_tset_get(&m->saved, "weight_q"); i++)
    if (qc_tset_get(&m->saved, scales[i]))
      return qc_err("module '%s': dataset 'saved/%s' is present without 'saved/weight_q': scales without their bytes would be ignored",
                    m->path, scales[i]);
  if (!qc_tset_get(&m->saved, "weight_q"))
    return autop && takes_profile(m) ? qc_contract_set(&m->contract, "profile", "vllm", 0, 0) : QC_OK;
  qc_qfmt f;
  qc_qprof p = QC_QP_VLLM;
  qc_sr sr;
  qc_deployed_result r;
  char note[512] = "";
  if ((rc = qc_qfmt_parse(fn, &f)) || (!autop && (rc = qc_qprof_parse(pn, &p)))) return rc;
  if (qc_tset_get(&m->saved, "weight_q")->dtype == QC_U8) { /* float8 bytes from torch < 2.1 */
    int fp4 = f == QC_QF_NVFP4 || f == QC_QF_MXFP4;
    qc_hint("scripts/qatdump.py writes it from the contract's weight_format or the module's qatcheck_dtypes; with h5py: "
            "ds.attrs['dtype'] = '%s'", fp4 ? "float4_e2m1fn_x2" : "float8_e4m3fn");
    return qc_err("module '%s': saved/weight_q is uint8 without a 'dtype' attribute: expected %s bytes for weight_format %s",
                  m->path, fp4 ? "float4_e2m1fn_x2" : "float8_e4m3fn", fn);
  }
  if ((rc = qc_sr_from_contract(&m->contract, m->path, &sr))) return rc;
  if (autop) {
    qc_identify *idf = qc_calloc(1, sizeof *idf, "profile identification");
    if (!idf) return QC_ESYS;
    if ((rc = qc_deployed_identify_module(m, f, &sr, idf))) { free(idf); return rc; }
    p = idf->any ? (qc_qprof)idf->chosen : QC_QP_VLLM;
    r = idf->c[idf->chosen].r; /* the reproducing profile, or the closest */
    snprintf(note, sizeof note, "profile %s (auto: %s)", qc_qprof_name(p), idf->why);
    free(idf);
    if ((rc = qc_contract_set(&m->contract, "profile", qc_qprof_name(p), 0, 0))) return rc;
  } else if ((rc = qc_deployed_check(m, f, p, &sr, &r))) {
    return rc;
  }
  qc_check k;
  memset(&k, 0, sizeof k);
  snprintf(k.module, sizeof k.module, "%s", m->path);
  snprintf(k.cls, sizeof k.cls, "%s", m->cls->name);
  snprintf(k.dy, sizeof k.dy, "-");
  snprintf(k.tensor, sizeof k.tensor, "quantizer");
  const qc_tensor *w = qc_tset_get(&m->params, "weight");
  k.ndim = w->ndim;
  memcpy(k.shape, w->shape, sizeof k.shape);
  snprintf(k.cand_dtype, sizeof k.cand_dtype, "%s", qc_dtype_name(qc_tset_get(&m->saved, "weight_q")->dtype));
  int bad = r.n_payload || r.n_scale || r.n_global || r.n_decoded;
  k.verdict = bad ? QC_V_FAIL : QC_V_PASS;
  if (bad && !autop) qc_deployed_summary(&r, k.why, sizeof k.why);
  else snprintf(k.why, sizeof k.why, "%s", autop ? note : "");
  if (qc_verbose && autop) fprintf(stderr, "qatcheck: %s: %s\n", m->path, note);
  return qc_results_add(a->res, &k);
}

/* Keep only the dYs the case names (all when it names none). */
int qc_vjp_select_dy(qc_module *m, const qc_case *cs, const char *dump_path) {
  if (cs->ndy == 0) return QC_OK;
  for (int k = 0; k < cs->ndy; k++)
    if (!qc_tset_get(&m->grad_out, cs->dy[k]))
      return qc_err("dump '%s': module '%s' has no dataset 'grad_out/%s' (named in the case's dy)", dump_path, m->path,
                    cs->dy[k]);
  int w = 0;
  for (int i = 0; i < m->grad_out.n; i++) {
    int keep = 0;
    for (int k = 0; k < cs->ndy; k++) keep |= strcmp(m->grad_out.t[i].name, cs->dy[k]) == 0;
    if (!keep) {
      qc_tensor_free(&m->grad_out.t[i]);
      if (m->cand) qc_tset_free(&m->cand[i]);
      continue;
    }
    m->grad_out.t[w] = m->grad_out.t[i];
    if (m->cand) m->cand[w] = m->cand[i];
    w++;
  }
  m->grad_out.n = w;
  return QC_OK;
}

/* The length of the sum behind check c of m: its gradient's error model's
 * k (a sharded check's "@rankN" dropped), else, for the forward check or a
 * gradient the model does not name, the longest any of m's gradients
 * names (1 when none does). Speculative calls: the error state is kept. */
static int64_t sum_length(const qc_module *m, const qc_check *c) {
  int64_t k = 1;
  if (!m->cls->tol_model || m->grad_out.n == 0 || !m->cls->grads) return k;
  qc_err_state es;
  qc_err_save(&es);
  char g[QC_NAMELEN];
  snprintf(g, sizeof g, "%s", c->tensor);
  g[strcspn(g, "@")] = 0;
  qc_tol_model tm;
  memset(&tm, 0, sizeof tm);
  if (strcmp(c->kind, "forward") != 0 && m->cls->tol_model(m, &m->grad_out.t[0], g, &tm) == QC_OK && tm.k >= 1) {
    qc_err_restore(&es);
    return tm.k;
  }
  char names[256];
  snprintf(names, sizeof names, "%s", m->cls->grads);
  for (char *sv = NULL, *n = strtok_r(names, " ", &sv); n; n = strtok_r(NULL, " ", &sv)) {
    memset(&tm, 0, sizeof tm);
    if (m->cls->tol_model(m, &m->grad_out.t[0], n, &tm) == QC_OK && tm.k > k) k = tm.k;
  }
  qc_err_restore(&es);
  return k;
}

/* The most a bf16 sum of k products can err, relative: sqrt(3) (sqrt(k) +
 * 1) 2^-8 (the margin of derived tolerances; the sum's and the output's
 * rounding). */
static double bf16_sum_reach(int64_t k) { return sqrt(3.0) * (sqrt((double)k) + 1.0) * ldexp(1.0, -8); }

/* m's failed checks attributable (vjp.h). A bf16 sum of K products has a
 * relative error near sqrt(K) 2^-8 (docs/tolerances.md: `tol --acc-dtype
 * bfloat16` refuses it), and torch 1.13's own CPU kernels sum that way
 * where oneDNN is off. The attribute says what qatdump measured of the
 * producer's kernels, not whether this module called them (a custom
 * Function may compute in float32), so:
 *   - a check that passed met a tighter bound than any bf16 sum allows:
 *     it stands;
 *   - a failed check farther off than a bf16 sum of its K products can
 *     err (bf16_sum_reach), not finite, or without metrics (the deployed
 *     bytes), is a defect whatever the sums: it stands, and with it every
 *     verdict of the module;
 *   - only when every failed check is within that reach can the module not
 *     be told from a correct one summed in bf16: cannot judge.
 * A class without GEMMs is judged whatever the attribute says. */
int qc_vjp_check_gemm_acc(const qc_module *m, const char *acc, const qc_results *res, int first, const char *where) {
  if (!acc[0] || strcmp(acc, "float32") == 0) return QC_OK;
  if (strcmp(acc, "bfloat16") != 0)
    return qc_err("%s: attribute 'cpu_bf16_gemm_acc' is '%.32s': expected float32 or bfloat16", where, acc);
  if (!m->cls->bf16_gemm) return QC_OK;
  const qc_check *within = NULL;
  int64_t wk = 0;
  for (int i = first; i < res->n; i++) {
    const qc_check *c = &res->v[i];
    if (c->verdict != QC_V_FAIL) continue;
    if (!c->has_metrics) return QC_OK; /* the deployed bytes do not depend on a GEMM: the failure stands */
    const int64_t k = sum_length(m, c);
    if (!(c->m.rel_l2 <= bf16_sum_reach(k))) return QC_OK; /* beyond any bf16 sum's reach, or not finite */
    if (!within) within = c, wk = k;
  }
  if (!within) return QC_OK;
  qc_hint("a bf16 accumulator leaves no reliable digits; dump the step under torch 2 (its CPU GEMMs accumulate "
          "bf16 in float32), on a CPU with AVX-512, or on the GPU, or leave this module out of data.modules");
  return qc_err("%s: cannot judge: its %s check %s failed at rel_l2 %.3g, within the %.3g a bf16 sum of %lld "
                "products can err, and attribute 'cpu_bf16_gemm_acc' is 'bfloat16': its producer adds bf16 GEMM "
                "products into a bf16 sum (torch 1.13 on a CPU without AVX-512), which qatcheck does not model",
                where, within->kind[0] ? within->kind : within->dy, within->tensor, within->m.rel_l2,
                bf16_sum_reach(wk), (long long)wk);
}
