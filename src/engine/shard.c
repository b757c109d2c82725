/* shard.c: layer 1 over a sharded dump (vjp.h; docs/interfaces.md,
 * "Sharded dumps"). A tensor-, vocab-, expert-, sequence-parallel or FSDP
 * run dumps one file per rank. Each module is assembled whole from the
 * ranks' pieces (shard_layout.c: a dataset's shard_dim says along which
 * dimension, shard_flat that it is an FSDP1 flat piece; none: every rank
 * holds it whole, and they must agree), the reference runs once on the
 * whole module, and each rank's gradients are judged against the
 * reference's piece for that rank: a slice along the same dimension as the
 * tensor it differentiates, the same flat piece, or the whole reference
 * for a tensor every rank holds whole (the trainer's all-reduce must have
 * summed the ranks' partial gradients into it); parameter gradients are
 * scaled by 1/W where the module declares grad_reduce "mean". Checks are
 * named "d_x@rank2", so a missing, doubled or mis-scaled reduction, or a
 * shard in the wrong place, fails on its tensor and rank; a failed check
 * says which of these it looks like (shard_diag.c). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/qc.h"
#include "dist/dist.h"
#include "engine/shard_priv.h"
#include "engine/vjp.h"
#include "io/dump.h"
#include "numerics/decode.h"

int qc_shard_pattern(const char *dump) { return strpbrk(dump, "*?[") != NULL; }

/* Rank r's piece of whole float64 tensor t (split along d at off/len, or
 * flattened when flat), as out. */
static int piece(const qc_tensor *t, int flat, int d, const int64_t *off, const int64_t *len, int r, qc_tensor *out) {
  qc_tensor v = *t; /* a flat view of the same data */
  if (flat) {
    v.ndim = 1;
    v.shape[0] = qc_numel(t);
  }
  if (d >= v.ndim) return qc_err("gradient '%s' has %d dimension(s), its tensor is split along %d", t->name, v.ndim, d);
  return qc_shard_slice(&v, d, off[r], len[r], out);
}

/* The reference on whole module w with the split tensors of the parameters
 * (params = 1) or of the other roles (params = 0) zeroed outside rank r's
 * piece: what rank r computes from its own pieces alone, before a reduction
 * over the ranks. *any = 0 (and out left empty) when no such tensor is
 * split. */
static int own_share(const qc_ctx *ctx, const qc_registry_row *row, qc_module *w, qc_rankfile *rf, int W, int r, int j,
                     int params, qc_tset *out, int *any) {
  static const char *roles[] = {"inputs", "params", "saved", "grad_out"};
  qc_module m;
  int rc = QC_OK;
  int64_t off[256], len[256], L;
  memset(&m, 0, sizeof m);
  memcpy(m.path, w->path, sizeof m.path);
  m.cls = w->cls;
  m.contract = w->contract; /* borrowed: not freed here */
  *any = 0;
  for (int ri = 0; ri < 4 && !rc; ri++) {
    const qc_tset *src = qc_shard_role(w, roles[ri]);
    const int mask = params == !strcmp(roles[ri], "params");
    for (int i = 0; i < src->n && !rc; i++) {
      const qc_tensor *t = &src->t[i];
      qc_tensor c;
      int d = -1, flat = 0;
      if (mask && (rc = qc_shard_split(rf, W, w->path, roles[ri], t->name, &d, &flat, &L, off, len))) break;
      const size_t es = qc_dtype_size(t->dtype);
      if ((rc = qc_tensor_alloc(&c, t->name, t->dtype, t->ndim, t->shape))) break;
      if (d < 0) {
        memcpy(c.data, t->data, t->nbytes);
      } else if (flat) { /* rank r's real elements only */
        if (len[r] > 0) memcpy((char *)c.data + (size_t)off[r] * es, (const char *)t->data + (size_t)off[r] * es, (size_t)len[r] * es);
      } else { /* rank r's run of every row along d */
        const int64_t outer = qc_shape_numel(d, t->shape), inner = qc_shape_numel(t->ndim - d - 1, t->shape + d + 1);
        const size_t run = (size_t)(len[r] * inner) * es;
        for (int64_t o = 0; o < outer; o++) {
          const size_t at = (size_t)((o * t->shape[d] + off[r]) * inner) * es;
          memcpy((char *)c.data + at, (const char *)t->data + at, run);
        }
      }
      *any |= d >= 0;
      if ((rc = qc_tset_add(qc_shard_role(&m, roles[ri]), &c))) qc_tensor_free(&c);
    }
  }
  if (!rc && *any && (rc = row->reference(ctx, &m, &m.grad_out.t[j], out))) qc_tset_free(out); /* nothing half made is read */
  qc_tset_free(&m.inputs);
  qc_tset_free(&m.params);
  qc_tset_free(&m.saved);
  qc_tset_free(&m.grad_out);
  return rc;
}

/* Rank r's candidate g of a flat piece [L] trimmed to its len real
 * elements (out); *pad: the largest |value| in its padding. */
static int flat_candidate(const qc_tensor *g, int64_t L, int64_t len, qc_tensor *out, double *pad) {
  int rc;
  double *v = qc_malloc((size_t)L * sizeof *v, "flat gradient piece (float64)");
  *pad = 0;
  if (!v) return QC_ESYS;
  if (!(rc = qc_tensor_to_f64(g, v)))
    for (int64_t i = len; i < L; i++) *pad = fmax(*pad, fabs(v[i]));
  free(v);
  if (!rc && !(rc = qc_tensor_alloc(out, g->name, g->dtype, 1, &len)))
    memcpy(out->data, g->data, (size_t)len * qc_dtype_size(g->dtype));
  return rc;
}

/* What the diagnoses of one rank and dY compute once: the reference on
 * the rank's own pieces (its partial gradient) and on the whole module with
 * the other ranks' pieces of the parameters / of the rest zeroed. */
typedef struct rank_cache {
  qc_tset partial, ownp, owni;
  int have_partial, have_own, anyp, anyi;
} rank_cache;

/* The diagnosis of failed check k (candidate g, rank r, dY j): the
 * hypotheses of qc_shard_diagnose, with rank r's partial gradient and the
 * ranks' sum (whole gradients) or rank r's own shares (split ones); scale:
 * what the expected piece was multiplied by (1/W under grad_reduce mean). */

static int diagnose_check(qc_audit *a, const qc_registry_row *row, qc_module *w, qc_rankfile *rf, int W, int r, int j,
                          const qc_tensor *rg, const qc_tensor *refv, const qc_tensor *g, int flat, int d,
                          const int64_t *off, const int64_t *len, int64_t n, double scale, rank_cache *c, qc_check *k) {
  qc_module *mr = &rf[r].m;
  qc_tensor pp, pi, full;
  double *sum = NULL;
  int rc;
  char sp[200], si[200];
  memset(&pp, 0, sizeof pp);
  memset(&pi, 0, sizeof pi);
  memset(&full, 0, sizeof full);
  double *gd = qc_malloc((size_t)n * sizeof *gd, "candidate gradient (float64)");
  if (!gd) return QC_ESYS;
  if ((rc = qc_tensor_to_f64(g, gd))) goto done;
  qc_err_state es; /* a diagnosis that cannot be made is no error: each prediction below may fail */
  qc_err_save(&es);
  if (d < 0 && !c->have_partial) { /* the reference on this rank's pieces alone: its partial gradient */
    c->have_partial = 1;
    if (row->reference(a->ctx, mr, &mr->grad_out.t[j], &c->partial)) qc_tset_free(&c->partial); /* not every class has one */
  }
  if (d >= 0 && !c->have_own) { /* what this rank computes from its own pieces: a share not reduced */
    c->have_own = 1;
    (void)own_share(a->ctx, row, w, rf, W, r, j, 1, &c->ownp, &c->anyp);
    (void)own_share(a->ctx, row, w, rf, W, r, j, 0, &c->owni, &c->anyi);
  }
  if (d < 0 && (sum = qc_calloc((size_t)n, sizeof *sum, "the ranks' gradients summed"))) {
    for (int s = 0; s < W && sum; s++) { /* every rank's candidate of this gradient, summed */
      const qc_tensor *gs = rf[s].m.cand ? qc_tset_get(&rf[s].m.cand[j], rg->name) : NULL;
      double *tmp = gs && qc_numel(gs) == n ? qc_malloc((size_t)n * sizeof *tmp, "a rank's gradient") : NULL;
      if (!tmp || qc_tensor_to_f64(gs, tmp)) {
        free(sum);
        sum = NULL;
      } else {
        for (int64_t e = 0; e < n; e++) sum[e] += tmp[e];
      }
      free(tmp);
    }
  }
  const qc_tensor *op = qc_tset_get(&c->ownp, rg->name), *oi = qc_tset_get(&c->owni, rg->name);
  if (op && piece(op, flat, d, off, len, r, &pp)) memset(&pp, 0, sizeof pp);
  if (oi && piece(oi, flat, d, off, len, r, &pi)) memset(&pi, 0, sizeof pi);
  if (d >= 0 && !piece(refv, 0, d, off, len, r, &full)) { /* a share equal to the unreduced whole is no partial sum */
    for (int64_t e = 0; e < n; e++) ((double *)full.data)[e] /= scale;
    if (pp.data && qc_numel(&pp) == n && qc_rel_l2(pp.data, full.data, n) < 1e-9) qc_tensor_free(&pp);
    if (pi.data && qc_numel(&pi) == n && qc_rel_l2(pi.data, full.data, n) < 1e-9) qc_tensor_free(&pi);
  }
  qc_err_restore(&es);
  snprintf(sp, sizeof sp, "rank %d's own parameter pieces' share only (a partial sum): the reduction of the %d ranks' "
                          "contributions is missing", r, W);
  snprintf(si, sizeof si, "rank %d's local gradient from its own pieces of the inputs only (a partial sum): the reduction "
                          "over the %d ranks is missing", r, W);
  qc_shard_own own[2] = {{pp.data && qc_numel(&pp) == n ? pp.data : NULL, sp},
                         {pi.data && qc_numel(&pi) == n ? pi.data : NULL, si}};
  qc_shard_diagnose(k, gd, refv, d, off, len, r, W, scale != 1.0, qc_tset_get(&c->partial, rg->name), sum, own, 2);
done:
  qc_tensor_free(&pp);
  qc_tensor_free(&pi);
  qc_tensor_free(&full);
  free(sum);
  free(gd);
  return rc;
}

/* Judge rank r's gradients for dY j against the whole reference grads:
 * each the reference's piece of the tensor it differentiates (a slice, a
 * flat piece, or the whole). */
static int judge_rank(qc_audit *a, const qc_registry_row *row, qc_module *w, qc_rankfile *rf, int W, int r, int j,
                      const qc_tset *ref, int mean) {
  qc_module *mr = &rf[r].m;
  const char *dyn = w->grad_out.t[j].name;
  int rc = QC_OK;
  rank_cache cache;
  memset(&cache, 0, sizeof cache);
  for (int i = 0; i < ref->n && !rc; i++) {
    const qc_tensor *rg = &ref->t[i];
    const char *base = strncmp(rg->name, "d_", 2) == 0 ? rg->name + 2 : rg->name;
    const char *role = qc_tset_get(&mr->inputs, base) ? "inputs" : qc_tset_get(&mr->params, base) ? "params" : NULL;
    const qc_tol *tol = qc_audit_tol(a, w, rg->name);
    if (!tol) { rc = QC_EINPUT; break; }
    char tname[QC_NAMELEN];
    snprintf(tname, sizeof tname, "%s@rank%d", rg->name, r);
    int d = -1, flat = 0;
    int64_t off[256], len[256], L = 0;
    if (role && (rc = qc_shard_split(rf, W, w->path, role, base, &d, &flat, &L, off, len))) break;
    if ((flat || d >= 0) && len[r] == 0) { /* a piece of padding only, or none: nothing to judge, unless it holds a gradient */
      const qc_tensor *g0 = mr->cand ? qc_tset_get(&mr->cand[j], rg->name) : NULL;
      double held = 0;
      if (g0 && flat && g0->ndim == 1 && g0->shape[0] == L) {
        qc_tensor tmp;
        memset(&tmp, 0, sizeof tmp);
        rc = flat_candidate(g0, L, 0, &tmp, &held);
        qc_tensor_free(&tmp);
        if (rc) break;
      } else if (g0) {
        held = qc_numel(g0) != 0 ? INFINITY : 0; /* a split tensor's empty piece: its gradient has no element either */
      }
      if (!g0 || held == 0) continue; /* a missing dataset is said where the candidates are read */
      int64_t eshape[QC_MAXDIM];
      memcpy(eshape, rg->shape, sizeof eshape);
      if (!flat) eshape[d] = 0;
      qc_check k;
      qc_check_init(&k, w, dyn, tname, flat ? 1 : rg->ndim, eshape, tol);
      snprintf(k.cand_dtype, sizeof k.cand_dtype, "%s", qc_dtype_name(g0->dtype));
      k.verdict = QC_V_FAIL;
      if (flat) snprintf(k.why, sizeof k.why, "rank %d's flat piece is padding only, but holds a gradient up to |%.3g|: expected zero", r, held);
      else snprintf(k.why, sizeof k.why, "rank %d holds no piece of '%s', but its gradient has %lld element(s): expected none", r, base,
                    (long long)qc_numel(g0));
      if ((rc = qc_results_add(a->res, &k))) break;
      continue;
    }
    qc_tensor want, gt;
    memset(&want, 0, sizeof want);
    memset(&gt, 0, sizeof gt);
    qc_tensor refv = *rg; /* the reference as the pieces are cut from it */
    if (flat) {
      refv.ndim = 1;
      refv.shape[0] = qc_numel(rg);
    }
    if (d >= 0 && !flat && d >= rg->ndim) {
      rc = qc_err("module '%s': gradient '%s' has %d dimension(s), its tensor is split along %d", w->path, rg->name,
                  rg->ndim, d);
      break;
    }
    if (d >= 0 && (rc = piece(rg, flat, d, off, len, r, &want))) break;
    const qc_tensor *exp = d >= 0 ? &want : rg;
    qc_check k;
    qc_check_init(&k, w, dyn, tname, exp->ndim, exp->shape, tol);
    const qc_tensor *g = mr->cand ? qc_tset_get(&mr->cand[j], rg->name) : NULL;
    double pad = 0;
    if (!g) {
      rc = qc_err("dump '%s': module '%s' has no dataset 'grads/%s/%s' for rank %d", qc_dump_path(rf[r].d), w->path, dyn,
                  rg->name, r);
    } else if (flat ? g->ndim != 1 || g->shape[0] != L : !qc_shape_eq(g, exp) && qc_numel(g) != qc_numel(exp)) {
      char s1[96], s2[96];
      int64_t lshape[1] = {L};
      snprintf(k.cand_dtype, sizeof k.cand_dtype, "%s", qc_dtype_name(g->dtype));
      k.verdict = QC_V_FAIL;
      snprintf(k.why, sizeof k.why, "shape %s, expected the reference's piece %s", qc_shape_str(g->ndim, g->shape, s1, sizeof s1),
               flat ? qc_shape_str(1, lshape, s2, sizeof s2) : qc_shape_str(exp->ndim, exp->shape, s2, sizeof s2));
      rc = qc_results_add(a->res, &k);
    } else {
      if (flat && !(rc = flat_candidate(g, L, len[r], &gt, &pad))) g = &gt;
      snprintf(k.cand_dtype, sizeof k.cand_dtype, "%s", qc_dtype_name(g->dtype));
      if (!rc) rc = qc_audit_compare(a->ctx, g, exp, tol, &k);
      if (!rc) rc = qc_audit_judge(w, &w->grad_out.t[j], tol, &k);
      if (!rc && !flat && g->ndim == rg->ndim) /* an expert no token selects: zero in the piece that holds it */
        rc = qc_audit_exact_zeros(w, g, d == 0 ? off[r] : 0, rg->shape[0], &k);
      if (!rc && pad > 0) { /* the padding's gradient is zero: anything else is a misplaced piece */
        k.verdict = QC_V_FAIL;
        snprintf(k.why, sizeof k.why, "the padding of the flat piece (elements %lld .. %lld) holds a gradient up to |%.3g|: "
                 "expected zero", (long long)len[r], (long long)(L - 1), pad);
      }
      if (!rc && k.verdict != QC_V_PASS)
        rc = diagnose_check(a, row, w, rf, W, r, j, rg, &refv, g, flat, d, off, len, qc_numel(exp),
                            mean && !strcmp(role ? role : "", "params") ? 1.0 / W : 1.0, &cache, &k);
      if (!rc) rc = qc_results_add(a->res, &k);
    }
    qc_tensor_free(&want);
    qc_tensor_free(&gt);
  }
  qc_tset_free(&cache.partial);
  qc_tset_free(&cache.ownp);
  qc_tset_free(&cache.owni);
  return rc;
}


/* Audit module `path` (class row) over the W rank files: assemble, run the
 * reference once per dY, judge every rank. */
static int audit_sharded(qc_audit *a, const qc_case *cs, const char *profile, qc_rankfile *rf, int W, const qc_dump_entry *e,
                         const qc_registry_row *row) {
  qc_module w;
  qc_modinfo *mi = NULL;
  char contract[4096] = "", kind[32] = "";
  int rc = QC_OK, first = a->res->n, mean = 0;
  double t0 = qc_now_s();
  memset(&w, 0, sizeof w);
  for (int r = 0; r < W && !rc; r++) {
    char c[4096];
    rc = qc_dump_load_module(rf[r].d, e->path, 1, &rf[r].m, r ? c : contract, r ? sizeof c : sizeof contract);
    rf[r].loaded = !rc;
    if (!rc) rf[r].m.cls = row->cls;
    if (!rc) {
      char where[QC_PATHLEN + 1100];
      snprintf(where, sizeof where, "dump '%s': module '%s'", qc_dump_path(rf[r].d), e->path);
      if ((rc = qc_module_check_known(&rf[r].m, where))) break;
    }
    if (!rc && (rc = qc_vjp_set_contract(&rf[r].m, cs, r ? c : contract, profile))) break;
    if (!rc && (rc = qc_vjp_select_dy(&rf[r].m, cs, qc_dump_path(rf[r].d)))) break;
  }
  if (rc) goto done;
  for (int r = 0; r < W; r++) { /* every rank's layout a known kind, the same as rank 0's */
    char kr[sizeof kind] = "", bar[sizeof kind + 2];
    qc_err_state es; /* absent or unreadable: no layout declared */
    qc_err_save(&es);
    int has = qc_dump_get_attr(rf[r].d, e->path, "parallel", kr, sizeof kr) == QC_OK;
    qc_err_restore(&es);
    if (has && (snprintf(bar, sizeof bar, "|%s|", kr), !strstr("|tp_column|tp_row|vocab|expert|sequence|fsdp_flat|fsdp|", bar))) {
      /* the kinds docs/interfaces.md describes */
      rc = qc_err("dump '%s': module '%s': attribute parallel '%s': expected tp_column, tp_row, vocab, expert, sequence, "
                  "fsdp_flat or fsdp",
                  qc_dump_path(rf[r].d), e->path, kr);
      goto done;
    }
    if (r == 0) memcpy(kind, kr, sizeof kind);
    else if (strcmp(kr, kind) != 0) {
      rc = qc_err("dump '%s': module '%s': attribute parallel '%s' where rank 0's is '%s': the ranks disagree",
                  qc_dump_path(rf[r].d), e->path, kr[0] ? kr : "(none)", kind[0] ? kind : "(none)");
      goto done;
    }
  }
  /* no deployed-bytes check on shards but a class's per-expert bytes (checked on the whole, below): a
   * profile left to "auto" is vllm's, as for a dump without bytes */
  const int stacked = row->cls->stacked_deployed != NULL;
  for (int r = 0; r < W && !rc && !stacked; r++)
    if (!strcmp(qc_contract_str(&rf[r].m.contract, "profile", "-"), "auto"))
      rc = qc_contract_set(&rf[r].m.contract, "profile", "vllm", 0, 0);
  if (rc) goto done;
  snprintf(w.path, sizeof w.path, "%s", e->path);
  w.cls = row->cls;
  w.contract = rf[0].m.contract;
  if ((rc = qc_shard_assemble(rf, W, e->path, "inputs", &w)) || (rc = qc_shard_assemble(rf, W, e->path, "params", &w)) ||
      (rc = qc_shard_assemble(rf, W, e->path, "saved", &w)) || (rc = qc_shard_assemble(rf, W, e->path, "grad_out", &w)))
    goto done;
  if (w.grad_out.n == 0) {
    rc = qc_err("dump '%s': module '%s': has no upstream gradient: expected at least one dataset under 'grad_out/'",
                qc_dump_path(rf[0].d), e->path);
    goto done;
  }
  if ((rc = qc_module_validate(&w, e->path))) goto done; /* the class's reading of the whole, whatever the tolerances */
  /* the experts' deployed bytes, assembled whole: each expert by its global id (its index in the whole) */
  if (stacked && (rc = qc_vjp_check_deployed(a, &w))) goto done;
  if ((rc = qc_shard_grad_reduce(rf, W, e->path, &mean))) goto done;
  for (int j = 0; j < w.grad_out.n && !rc; j++) {
    qc_tset ref = {0};
    rc = row->reference(a->ctx, &w, &w.grad_out.t[j], &ref);
    for (int i = 0; i < ref.n && !rc && mean; i++) { /* the trainer averages parameter gradients over the ranks */
      qc_tensor *t = &ref.t[i];
      if (strncmp(t->name, "d_", 2) != 0 || !qc_tset_get(&w.params, t->name + 2)) continue;
      for (int64_t e2 = 0; e2 < qc_numel(t); e2++) ((double *)t->data)[e2] /= W;
    }
    for (int r = 0; r < W && !rc; r++) rc = judge_rank(a, row, &w, rf, W, r, j, &ref, mean);
    qc_tset_free(&ref);
  }
  for (int r = 0; r < W && !rc; r++) { /* any rank's producer summing bf16 GEMMs in bf16 (qc_vjp_check_gemm_acc) */
    char acc[32], where[QC_PATHLEN + 1100];
    const char *ga = qc_dump_attr_text(rf[r].d, e->path, "cpu_bf16_gemm_acc"); /* NULL: not recorded */
    snprintf(acc, sizeof acc, "%.*s", (int)sizeof acc - 1, ga ? ga : ""); /* a cut value is refused there */
    snprintf(where, sizeof where, "dump '%s': module '%s'", qc_dump_path(rf[r].d), e->path);
    rc = qc_vjp_check_gemm_acc(&w, acc, a->res, first, where);
  }
  if (!rc && a->info) {
    if (!(mi = qc_malloc(sizeof *mi, "module facts"))) { rc = QC_ESYS; goto done; }
    if (!(rc = qc_modinfo_fill(mi, &w, "dump", "dump", NULL))) {
      mi->cover |= 1u << QC_COV_PARALLEL; /* the trainer's own reduction across the ranks, judged per rank */
      mi->first = first;
      mi->nchecks = a->res->n - first;
      mi->seconds = qc_now_s() - t0;
      rc = qc_modinfos_add(a->info, mi);
    }
  }
done:
  free(mi);
  qc_module_free(&w);
  for (int r = 0; r < W; r++)
    if (rf[r].loaded) {
      qc_module_free(&rf[r].m);
      rf[r].loaded = 0;
    }
  return rc;
}

int qc_vjp_sharded(qc_audit *a, const qc_case *cs, const char *profile, long long *at, int *nunits) {
  qc_rankfile *rf = NULL;
  qc_dump_entry *ents = NULL;
  int *owner = NULL, W = 0, n = 0, rc;
  if ((rc = qc_shard_open(cs->dump, &rf, &W))) return rc;
  if (cs->cand != QC_CAND_DUMP) {
    rc = qc_err("case '%s': a sharded dump (data.dump '%s') is audited rank by rank against the trainer's own gradients: "
                "expected \"candidate\": \"dump\"", cs->path, cs->dump);
    goto done;
  }
  if ((rc = qc_dump_modules(rf[0].d, cs->modules_re, &ents, &n))) goto done;
  if (n == 0) {
    rc = qc_err("dump '%s': no module group matches '%s': nothing to check", qc_dump_path(rf[0].d),
                cs->modules_re[0] ? cs->modules_re : ".*");
    goto done;
  }
  for (int i = 0; i < n; i++) {
    if (!qc_registry_find(ents[i].cls)) {
      rc = qc_err("dump '%s': module '%s': module class '%s' is not known", qc_dump_path(rf[0].d), ents[i].path, ents[i].cls);
      goto done;
    }
    for (int r = 1; r < W; r++)
      if (!qc_dump_exists(rf[r].d, ents[i].path)) {
        rc = qc_err("dump '%s': module '%s' is missing (rank 0's dump has it)", qc_dump_path(rf[r].d), ents[i].path);
        goto done;
      }
  }
  *nunits = n;
  if ((rc = qc_vjp_units(n, &owner))) goto done;
  qc_ctx wctx = *a->ctx; /* W processes: the diagnosis may name data-parallel causes */
  const qc_ctx *ctx0 = a->ctx;
  wctx.world_size = W;
  a->ctx = &wctx;
  for (int i = 0; i < n && !rc; i++) {
    if (owner[i] != qc_dist_rank()) continue;
    if ((rc = audit_sharded(a, cs, profile, rf, W, &ents[i], qc_registry_find(ents[i].cls)))) *at = i;
  }
  a->ctx = ctx0;
done:
  free(owner);
  free(ents);
  for (int r = 0; rf && r < W; r++) qc_dump_close(rf[r].d);
  free(rf);
  return rc;
}
