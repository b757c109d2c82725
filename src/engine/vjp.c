/* vjp.c: layer 1 over a case: its generated instances, or every matching
 * module group of its dump (read one ahead), each with its contract (the
 * dump's attribute, the case's over it, --profile over both), its deployed
 * bytes checked and its dYs selected, then audited (audit.c). */
#include "engine/vjp.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "core/number.h"
#include "core/par.h"
#include "core/progress.h"
#include "core/qc.h"
#include "dist/dist.h"
#include "engine/ckpt_quant.h"
#include "engine/deployed.h"
#include "engine/forward.h"
#include "engine/gen.h"
#include "io/dump.h"
#include "io/prefetch.h"
#include "core/memo.h"

static const char *cand_name(qc_cand_kind k) { return k == QC_CAND_DUMP ? "dump" : k == QC_CAND_PLUGIN ? "plugin" : "builtin"; }

/* Audit m, its checks from index `first` on (a deployed-bytes check may
 * come before), and describe it with its wall time into a->info. A split
 * unit (`unit` >= 0) runs on every rank together; rank 0 describes it. */
static int audit_described(qc_audit *a, const qc_module *m, int first, double t0, const char *values, long long unit) {
  qc_modinfo *mi = NULL;
  int rc = QC_OK;
  if (a->info && !(mi = qc_malloc(sizeof *mi, "module facts"))) return QC_ESYS;
  if (mi) rc = qc_modinfo_fill(mi, m, values ? "generated" : "dump", cand_name(a->cs->cand), values);
  int empty = values == NULL && qc_vjp_is_empty(m); /* no token: zero gradients, no forward to check */
  const qc_tset *own[4] = {&m->params, &m->inputs, &m->saved, &m->grad_out};
  qc_memo_scope(own, 4); /* the forward check, the references and their variants share what they derive from m */
  if (!rc && unit < 0 && !empty) { /* the output first: a quantizer or profile mismatch shows there */
    const double tf = qc_now_s();
    rc = qc_forward_check(a, m);
    if (qc_verbose) fprintf(stderr, "qatcheck: %s: forward check %.3f s\n", m->path, qc_now_s() - tf);
  }
  if (!rc && empty) rc = qc_vjp_empty_audit(a, m);
  else if (!rc) rc = unit >= 0 ? qc_split_audit(a, m, unit) : qc_audit_module(a, m); /* a failed rank meets the others in the merge */
  qc_memo_scope(NULL, 0);
  if (unit >= 0 && !rc && qc_dist_rank() != 0) { /* the others ran it with rank 0: their checks are rank 0's */
    a->res->n = first;
    free(mi);
    return QC_OK;
  }
  if (!rc && mi) {
    mi->first = first;
    mi->nchecks = a->res->n - first;
    mi->seconds = qc_now_s() - t0;
    rc = qc_modinfos_add(a->info, mi);
  }
  free(mi);
  return rc;
}

/* Every tolerance of the case names a gradient some class can return (a
 * typo such as d_X is refused by name before any work; a case shared by
 * several dumps may hold tolerances for classes this run does not select). */
static int check_tol_names(const qc_case *cs, const qc_class *const *cls, int ncls) {
  int nrow;
  const qc_registry_row *rows = qc_registry_rows(&nrow);
  for (int t = 0; t < cs->ntol; t++) {
    int known = cs->tol[t].cls[0] != 0; /* a class's own: checked against it at case load */
    for (int i = 0; i < nrow && !known; i++) known = qc_class_has_grad(rows[i].cls, cs->tol[t].tensor);
    if (known) continue;
    char names[256] = "", grads[512] = "";
    for (int i = 0; i < ncls; i++) {
      size_t l = strlen(names), g = strlen(grads);
      snprintf(names + l, sizeof names - l, "%s'%s'", i ? ", " : "", cls[i]->name);
      snprintf(grads + g, sizeof grads - g, "%s%s: %s", i ? "; " : "", cls[i]->name, cls[i]->grads);
    }
    qc_err("case '%s': tolerances.%s: no gradient of that name: class%s %s %s none", cs->path, cs->tol[t].tensor,
           ncls > 1 ? "es" : "", names, ncls > 1 ? "have" : "has");
    qc_hint("the gradients are (names are case-sensitive) %s", grads);
    return QC_EINPUT;
  }
  return QC_OK;
}

/* The scan for non-finite values of one tensor on qc_par_for's threads:
 * NaN in any float element type, +-Inf too when inf; each piece (tid)
 * counts its own and keeps its first, so the totals do not depend on the
 * thread count. */
typedef struct finite_scan {
  const qc_tensor *t;
  int inf;
  int64_t bad[QC_PAR_MAX], first[QC_PAR_MAX];
} finite_scan;

static void finite_piece(void *ctx, int64_t lo, int64_t hi, int tid) {
  finite_scan *f = ctx;
  const void *p = f->t->data;
  const int inf = f->inf;
  int64_t bad = 0, first = -1;
#define QC_SCAN(test)                  \
  for (int64_t i = lo; i < hi; i++)    \
    if (test) {                        \
      if (first < 0) first = i;        \
      bad++;                           \
    }
  switch (f->t->dtype) {
    case QC_F64: QC_SCAN(isnan(((const double *)p)[i]) || (inf && isinf(((const double *)p)[i]))) break;
    case QC_F32: QC_SCAN(isnan(((const float *)p)[i]) || (inf && isinf(((const float *)p)[i]))) break;
    case QC_F16: QC_SCAN((((const uint16_t *)p)[i] & 0x7c00) == 0x7c00 && ((((const uint16_t *)p)[i] & 0x3ff) || inf)) break;
    case QC_BF16: QC_SCAN((((const uint16_t *)p)[i] & 0x7f80) == 0x7f80 && ((((const uint16_t *)p)[i] & 0x7f) || inf)) break;
    default: break;
  }
#undef QC_SCAN
  f->bad[tid] = bad;
  f->first[tid] = first;
}

/* A module's data must be finite where a gradient depends on it: NaN in
 * inputs/, params/ or grad_out/, +-Inf in params/ or grad_out/ (inputs
 * may hold -inf, e.g. masked logits) is refused naming the dataset and
 * the first index, rather than reported later as a non-finite reference. */
static int check_finite(const qc_module *m, const char *where) {
  static const char *roles[] = {"inputs", "params", "grad_out"};
  const qc_tset *sets[] = {&m->inputs, &m->params, &m->grad_out};
  for (int r = 0; r < 3; r++)
    for (int j = 0; j < sets[r]->n; j++) {
      const qc_tensor *t = &sets[r]->t[j];
      if (t->dtype != QC_F64 && t->dtype != QC_F32 && t->dtype != QC_F16 && t->dtype != QC_BF16) continue; /* no NaN to hold */
      finite_scan f = {.t = t, .inf = r > 0};
      for (int p = 0; p < QC_PAR_MAX; p++) f.first[p] = -1;
      qc_par_for(qc_numel(t), (int64_t)1 << 16, finite_piece, &f);
      int64_t bad = 0, first = -1;
      for (int p = 0; p < QC_PAR_MAX; p++) {
        bad += f.bad[p];
        if (first < 0) first = f.first[p]; /* the pieces in index order: the lowest piece's first */
      }
      if (!bad) continue;
      char idx[160] = "";
      int64_t rest = first;
      for (int d = t->ndim - 1; d >= 0; d--) { /* the flat index as [i, j, ...] */
        char part[40];
        int64_t e = t->shape[d] ? rest % t->shape[d] : 0;
        rest = t->shape[d] ? rest / t->shape[d] : 0;
        snprintf(part, sizeof part, "%s%lld%s", d ? ", " : "[", (long long)e, d == t->ndim - 1 ? "]" : "");
        char tmp[160];
        snprintf(tmp, sizeof tmp, "%s%s", part, idx);
        snprintf(idx, sizeof idx, "%s", tmp);
      }
      qc_err("%s: dataset '%s/%s' holds %lld %s value(s), the first at %s: a gradient of non-finite data cannot be judged",
             where, roles[r], t->name, (long long)bad, r ? "non-finite" : "NaN", idx[0] ? idx : "[]");
      qc_hint("fix the dumped step (the NaN or Inf came with it), or dump a step where '%s/%s' is finite", roles[r], t->name);
      return QC_EINPUT;
    }
  return QC_OK;
}

/* The error for a modules regex that matches no group: it names (some of)
 * the module groups the dump has. */
static int no_match(qc_dump *d, const qc_case *cs) {
  qc_dump_entry *all = NULL;
  int n = 0;
  qc_err("dump '%s': no module group matches '%s': nothing to check", cs->dump, cs->modules_re[0] ? cs->modules_re : ".*");
  if (qc_dump_modules(d, NULL, &all, &n) != QC_OK || n == 0) {
    qc_hint("the dump has no module group: a module group is a group with a string attribute 'class'");
  } else {
    char list[600] = "";
    for (int i = 0; i < n && i < 6; i++) {
      size_t l = strlen(list);
      snprintf(list + l, sizeof list - l, "%s%s (%s)", i ? ", " : "", all[i].path, all[i].cls);
    }
    qc_hint("data.modules is a POSIX extended regex on the group path; the dump's %d module group(s): %s%s", n, list,
            n > 6 ? ", ..." : "");
  }
  free(all);
  return QC_EINPUT;
}

/* The refusal of a modules regex that selects no module group but
 * groups that look like one without a `class` (unc[0..n)): it names them. */
static int only_unclassed(const qc_case *cs, const qc_dump_entry *unc, int n) {
  qc_hint("a module group is a group with a string attribute 'class' (docs/interfaces.md section 2): set it (h5py: "
          "g.attrs['class'] = 'linear'), or narrow data.modules to the module groups");
  return qc_err("dump '%s': group '%s'%s holds a module's datasets (inputs/, grad_out/ or grads/) but no attribute "
                "'class': it cannot be judged, and data.modules '%s' selects no other", cs->dump, unc[0].path,
                n > 1 ? " (and others)" : "", cs->modules_re[0] ? cs->modules_re : ".*");
}

/* One failed check per group of unc[0..n) that looks like a module group
 * but has no `class`: "not judged", so a whole-model run over them does
 * not pass (a defect in such a group would otherwise hide there). */
static int add_unclassed(qc_audit *a, const qc_dump_entry *unc, int n) {
  for (int i = 0; i < n; i++) {
    qc_check k;
    memset(&k, 0, sizeof k);
    snprintf(k.module, sizeof k.module, "%s", unc[i].path);
    snprintf(k.dy, sizeof k.dy, "-");
    snprintf(k.tensor, sizeof k.tensor, "module");
    k.m.noise_multiple = k.m.noise_floor = NAN;
    k.m.e_par = k.m.bias_sd = k.m.bias_allow = k.m.bias_z_raw = k.m.bias_z = NAN;
    k.verdict = QC_V_FAIL;
    snprintf(k.why, sizeof k.why, "not judged: the group holds a module's datasets (inputs/, grad_out/ or grads/) but no "
             "attribute 'class'");
    if (qc_verbose) fprintf(stderr, "qatcheck: %s: not judged: no attribute 'class'\n", unc[i].path);
    int rc = qc_results_add(a->res, &k);
    if (rc) return rc;
  }
  return QC_OK;
}

/* This rank's instances (own[i]: 1 when instance i is its; all of them in
 * one process), *at the instance it failed on. */
static int run_generated(qc_audit *a, const qc_case *cs, const char *profile, const char *own, const char *split,
                         long long *at) {
  char where[1100];
  snprintf(where, sizeof where, "case '%s'", cs->path);
  const qc_registry_row *row = qc_registry_need(cs->module, where);
  if (!row) return QC_EINPUT;
  if (check_tol_names(cs, &row->cls, 1)) return QC_EINPUT;
  static const char kinds_default[4][QC_NAMELEN] = {"random", "zero", "sparse", "ones"};
  const char (*kinds)[QC_NAMELEN] = cs->ndy ? cs->dy : kinds_default;
  int nk = cs->ndy ? cs->ndy : 4;
  qc_progress pg;
  qc_progress_start(&pg, "vjp", "instances", cs->nshapes);
  for (int i = 0; i < cs->nshapes; i++) {
    if (!own[i]) continue;
    qc_module m;
    memset(&m, 0, sizeof m);
    m.cls = row->cls;
    snprintf(m.path, sizeof m.path, "%s", row->cls->name);
    int rc = qc_vjp_set_contract(&m, cs, NULL, profile), first = a->res->n;
    double t0 = qc_now_s();
    /* generated: no bytes (a contract names a profile only where the class takes one) */
    if (!rc && strcmp(qc_contract_str(&m.contract, "profile", "vllm"), "auto") == 0)
      rc = qc_contract_set(&m.contract, "profile", "vllm", 0, 0);
    clock_t c0 = clock();
    if (!rc) rc = qc_gen_module(row, cs->shape_n[i], cs->shapes[i], cs->seed, i, cs->values, kinds, nk, &m);
    if (!rc) rc = qc_module_validate(&m, m.path); /* a generator makes only what its class declares and reads */
    if (!rc) {
      if (qc_verbose) fprintf(stderr, "qatcheck: generated %s in %.3f s cpu\n", m.path, (double)(clock() - c0) / CLOCKS_PER_SEC);
      rc = audit_described(a, &m, first, t0, cs->values[0] ? cs->values : "normal", split[i] ? i : -1);
    }
    qc_progress_step(&pg, i + 1, m.path);
    qc_module_free(&m);
    if (rc) {
      qc_progress_end(&pg);
      *at = i;
      return rc;
    }
  }
  qc_progress_end(&pg);
  return QC_OK;
}

/* One module read from the dump, with what the reader learned. */
typedef struct load_slot {
  qc_module m;
  char contract[4096];
  char frozen[1024];      /* "/d_weight/d_bias/": gradients of parameters marked frozen="1" */
  char autocast[32];      /* the group's attribute autocast ("off", a dtype; "": not recorded) */
  char gemm_acc[32];      /* the group's attribute cpu_bf16_gemm_acc ("": not recorded) */
  int loaded;
} load_slot;

typedef struct loader {
  qc_dump *d;
  const qc_st *ckpt;       /* params/ from here when the case names a checkpoint */
  const char *prefix;
  const qc_dump_entry *ents;
  int with_grads;
  pthread_mutex_t read;    /* one load_entry at a time: HDF5 is used by one thread at a time */
  int nslot;               /* qc_prefetch's slots: vjp_ahead() + 1 */
  load_slot *slot;         /* [nslot] */
} loader;

/* How many module groups are read ahead while one is audited: 1 on the
 * CPU, whose GEMMs dwarf a read; 2 on a device, where a large group (a MoE
 * layer's experts) read behind a small one (the norm before it) was waited
 * for; QATCHECK_AHEAD=N (0 .. 8) overrides. At most ahead + 1 groups are in
 * memory. */
static int vjp_ahead(const qc_backend *be) {
  double v = qc_env_value("QATCHECK_AHEAD", -1);
  if (v >= 0) return (int)v;
  return be && be->host_memory ? 1 : 2; /* NULL: a device's, opened late (qc_audit.be_open) */
}

/* Read module `item` into slot `k` (qc_fetch_fn): every HDF5 call of the
 * audit of a module happens here, so the read-ahead can run it while the
 * main thread audits the module before (one read at a time: HDF5 is used
 * by one thread at a time). */
static int load_entry(void *arg, int item, int k) {
  loader *L = arg;
  load_slot *s = &L->slot[k];
  const char *path = L->ents[item].path;
  pthread_mutex_lock(&L->read);
  int rc = qc_dump_load_module(L->d, path, L->with_grads, &s->m, s->contract, sizeof s->contract);
  s->loaded = rc == QC_OK;
  if (!rc && L->ckpt) rc = qc_ckpt_params(L->ckpt, L->prefix, &s->m);
  s->frozen[0] = s->autocast[0] = s->gemm_acc[0] = 0;
  if (!rc) { /* qatdump records whether autocast was on at the module's call: evidence for engine/variants.c */
    qc_err_state es;
    qc_err_save(&es);
    if (qc_dump_get_attr(L->d, path, "autocast", s->autocast, sizeof s->autocast) != QC_OK) s->autocast[0] = 0;
    qc_err_restore(&es);
    /* and how its producer summed bf16 GEMMs on the CPU (qc_vjp_check_gemm_acc): a value too long for the
     * field is kept cut, which is neither float32 nor bfloat16 and is refused there */
    const char *ga = qc_dump_attr_text(L->d, path, "cpu_bf16_gemm_acc");
    snprintf(s->gemm_acc, sizeof s->gemm_acc, "%.*s", (int)sizeof s->gemm_acc - 1, ga ? ga : "");
  }
  for (int j = 0; !rc && j < s->m.params.n; j++) { /* qatdump marks frozen parameters */
    char ds[QC_PATHLEN + QC_NAMELEN + 16], v[8];
    snprintf(ds, sizeof ds, "%s/params/%s", path, s->m.params.t[j].name);
    if (qc_dump_get_attr(L->d, ds, "frozen", v, sizeof v) == QC_OK && strcmp(v, "1") == 0) {
      size_t l = strlen(s->frozen);
      snprintf(s->frozen + l, sizeof s->frozen - l, "%sd_%s/", l ? "" : "/", s->m.params.t[j].name);
    }
  }
  pthread_mutex_unlock(&L->read);
  return rc;
}

/* Audit every matching module group of the dump, one module in memory at a
 * time plus those read ahead (vjp_ahead), whose reads overlap the audit. */
/* This rank's module groups; *nunits all of them, *at the group it failed on. */
static int run_dump(qc_audit *a, const qc_case *cs, const char *profile, long long *at, int *nunits, char **splitp,
                    qc_dump_entry **uncp, int *nuncp) {
  qc_dump *d = NULL;
  char *split = NULL;
  int *gidx = NULL;
  qc_st *ck = NULL;
  qc_dump_entry *ents = NULL;
  const qc_class **classes = NULL;
  int n = 0, ncls = 0, rc;
  loader *L = NULL;
  const qc_ctx *ctx0 = NULL;
  qc_ctx wctx;
  qc_prefetch pf;
  qc_progress pg;
  memset(&pf, 0, sizeof pf);
  memset(&pg, 0, sizeof pg);
  if (qc_shard_pattern(cs->dump) && cs->has_split) {
    qc_hint("a sharded dump is checked rank file by rank file; drop the case's 'split'");
    return qc_err("case '%s': key 'split' with a sharded dump pattern '%s': not supported", cs->path, cs->dump);
  }
  if (qc_shard_pattern(cs->dump)) return qc_vjp_sharded(a, cs, profile, at, nunits); /* one file per rank */
  if ((rc = qc_dump_open(cs->dump, &d))) return rc;
  if ((rc = qc_dump_modules(d, cs->modules_re, &ents, &n))) goto done;
  /* groups that look like modules but have no class: reported not judged (added after the merge), or,
   * when nothing else is selected, refused */
  if ((rc = qc_dump_unclassed(d, cs->modules_re, uncp, nuncp))) goto done;
  if (n == 0) {
    rc = *nuncp ? only_unclassed(cs, *uncp, *nuncp) : no_match(d, cs);
    goto done;
  }
  /* classes and tolerance names first: a bad one stops the run before any data is read */
  if (!(classes = qc_calloc((size_t)n, sizeof *classes, "module classes"))) { rc = QC_ESYS; goto done; }
  for (int i = 0; i < n; i++) {
    char where[QC_PATHLEN + 1100];
    snprintf(where, sizeof where, "dump '%s': module '%s'", cs->dump, ents[i].path);
    const qc_registry_row *row = qc_registry_need(ents[i].cls, where);
    if (!row) { rc = QC_EINPUT; goto done; }
    int seen = 0;
    for (int j = 0; j < ncls; j++) seen |= classes[j] == row->cls;
    if (!seen) classes[ncls++] = row->cls;
    if (cs->module[0] && strcmp(cs->module, ents[i].cls) != 0) {
      rc = qc_err("%s: has class '%s' but the case declares module '%s'", where, ents[i].cls, cs->module);
      qc_hint("narrow data.modules to the groups of class '%s', or drop 'module' to use each group's class", cs->module);
      goto done;
    }
  }
  if ((rc = check_tol_names(cs, classes, ncls))) goto done;
  /* this rank's groups (all of them in one process), in dump order */
  *nunits = n;
  if (!(split = qc_calloc((size_t)n, 1, "split units"))) { rc = QC_ESYS; goto done; }
  for (int i = 0; i < n; i++) split[i] = (char)qc_split_wanted(cs, ents[i].path);
  a->split = split;
  if (cs->cand != QC_CAND_PLUGIN && (rc = qc_split_auto(a, d, ents, n, split))) goto done;
  if ((rc = qc_vjp_units_split(n, split, &gidx))) goto done;
  int nloc = 0;
  for (int i = 0; i < n; i++)
    if (gidx[i] == qc_dist_rank() || gidx[i] < 0) ents[nloc] = ents[i], gidx[nloc++] = i;
  n = nloc;
  const int ahead = vjp_ahead(a->ctx->be);
  L = qc_calloc(1, sizeof *L, "module read slots");
  if (!L || !(L->slot = qc_calloc((size_t)ahead + 1, sizeof *L->slot, "module read slots"))) { rc = QC_ESYS; goto done; }
  L->nslot = ahead + 1;
  pthread_mutex_init(&L->read, NULL);
  L->d = d;
  L->ents = ents;
  if (cs->checkpoint[0] && (rc = qc_st_open(cs->checkpoint, &ck))) goto done;
  L->ckpt = ck;
  L->prefix = cs->ckpt_prefix;
  L->with_grads = cs->cand == QC_CAND_DUMP;
  long long world = 1;
  qc_err_state es;
  qc_err_save(&es); /* absent or unreadable: one process */
  if (qc_dump_get_int_attr(d, "/", "world_size", &world) != QC_OK) world = 1;
  qc_err_restore(&es);
  wctx = *a->ctx; /* the diagnosis names data-parallel causes only for a dump of several processes */
  wctx.world_size = world > 1 ? (int)(world < 1 << 20 ? world : 1 << 20) : 1;
  ctx0 = a->ctx;
  a->ctx = &wctx;
  if ((rc = qc_prefetch_start(&pf, n, ahead, load_entry, L))) goto done;
  int (*be_open)(void *) = a->be_open; /* a device opened late: it starts while the first modules are read */
  a->be_open = NULL;
  if (be_open && (rc = be_open(a->be_arg))) goto done;
  wctx.be = ctx0->be;
  qc_progress_start(&pg, "vjp", "modules", n);
  for (int i = 0; i < n && !rc; i++) {
    int k, first = a->res->n;
    double t0 = qc_now_s();
    if ((rc = qc_prefetch_wait(&pf, i, &k))) {
      *at = gidx[i];
      break;
    }
    const double t_read = qc_now_s(); /* the wait for the read-ahead ends */
    load_slot *cur = &L->slot[k];
    char where[QC_PATHLEN + 1100];
    snprintf(where, sizeof where, "dump '%s': module '%s'", cs->dump, ents[i].path);
    qc_module *m = &cur->m;
    m->cls = qc_registry_find(ents[i].cls)->cls;
    rc = qc_module_check_known(m, where); /* what the class does not model is refused, never ignored */
    if (!rc) rc = qc_vjp_set_contract(m, cs, cur->contract, profile);
    if (!rc) rc = qc_vjp_check_deployed(a, m);
    if (!rc) rc = qc_vjp_select_dy(m, cs, cs->dump);
    if (!rc) rc = check_finite(m, where); /* the selected dYs only */
    if (!rc && m->grad_out.n == 0)
      rc = qc_err("%s: has no upstream gradient: expected at least one dataset under 'grad_out/'", where);
    /* the class's reading, whatever the tolerances; an empty call (no token)
     * has no shapes to read: its names were checked, its gradients must be 0 */
    if (!rc && !qc_vjp_is_empty(m)) rc = qc_module_validate(m, where);
    const double t_in = qc_now_s(); /* its inputs checked: the contract, the deployed bytes, finiteness, shapes */
    if (!rc) {
      a->frozen = cur->frozen;
      a->autocast = cur->autocast;
      if (qc_verbose) fprintf(stderr, "qatcheck: auditing %s\n", m->path);
      rc = audit_described(a, m, first, t0, NULL, a->split && a->split[gidx[i]] ? gidx[i] : -1);
      if (!rc) rc = qc_vjp_check_gemm_acc(m, cur->gemm_acc, a->res, first, where);
      a->frozen = a->autocast = NULL;
      if (qc_verbose) /* where a module's time went besides its gradients' lines: the read, the forward checks */
        fprintf(stderr, "qatcheck: %s: %.3f s in all, %.3f s of it waiting for its read, %.3f s checking its inputs\n", m->path,
                qc_now_s() - t0, t_read - t0, t_in - t_read);
    }
    qc_progress_step(&pg, i + 1, m->path);
    qc_module_free(m);
    cur->loaded = 0;
    if (!rc) rc = qc_prefetch_release(&pf, i);
    if (rc) *at = gidx[i];
  }
  if (rc && *at < 0 && n > 0) *at = gidx[0]; /* the read-ahead's start */
done:
  if (ctx0) a->ctx = ctx0;
  qc_progress_end(&pg);
  qc_prefetch_stop(&pf);
  if (L && L->slot) {
    for (int k = 0; k < L->nslot; k++)
      if (L->slot[k].loaded) qc_module_free(&L->slot[k].m);
    pthread_mutex_destroy(&L->read);
    free(L->slot);
  }
  free(L);
  free(ents);
  free(gidx);
  free(classes);
  *splitp = split; /* a->split points to it until the merge */
  qc_dump_close(d);
  qc_st_close(ck);
  return rc;
}

int qc_vjp_case(qc_audit *a, const char *profile) {
  long long at = -1;
  int rc, nunits = 0, nunc = 0;
  char *split = NULL;
  qc_dump_entry *unc = NULL;
  if (a->cs->data == QC_DATA_GENERATE) {
    int *owner = NULL;
    char *own = NULL;
    const int n = nunits = a->cs->nshapes;
    rc = QC_ESYS;
    if ((own = qc_calloc((size_t)(n > 0 ? n : 1), 1, "instance owners")) && (split = qc_calloc((size_t)(n > 0 ? n : 1), 1, "split units")))
      rc = QC_OK;
    for (int i = 0; !rc && i < n; i++) split[i] = (char)qc_split_wanted(a->cs, a->cs->module); /* an instance's path is its class */
    a->split = split;
    if (!rc) rc = qc_vjp_units_split(n, split, &owner);
    for (int i = 0; !rc && i < n; i++) own[i] = owner[i] == qc_dist_rank() || owner[i] < 0;
    if (!rc) rc = run_generated(a, a->cs, profile, own, split, &at);
    free(owner);
    free(own);
  } else {
    rc = run_dump(a, a->cs, profile, &at, &nunits, &split, &unc, &nunc);
  }
  rc = qc_vjp_merge(a, rc, at, nunits);
  if (!rc && qc_dist_rank() == 0) rc = add_unclassed(a, unc, nunc); /* after the merge: rank 0's reports hold them once */
  free(unc);
  a->split = NULL;
  free(split);
  return rc;
}
