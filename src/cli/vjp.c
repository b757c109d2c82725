/* vjp.c: `qatcheck vjp --case CASE.json`: layer 1. Plan (the case), load
 * (generator or dump), run and compare (audit.c), report (report/). */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "engine/audit.h"
#include "backend/backend.h"
#include "model/case.h"
#include "model/check.h"
#include "io/dump.h"
#include "engine/gen.h"
#include "engine/deployed.h"
#include "core/qc.h"
#include "cli/cli.h"
#include "report/report.h"

static void help(void) {
  printf("usage: qatcheck vjp --case CASE.json [options]\n\n"
         "Layer 1: runs each module's production VJP (builtin, from a dump, or a plugin)\n"
         "and an independent float64 reference on the same inputs and the same dY, and\n"
         "judges every gradient against the tolerances the case declared in advance.\n\n"
         "  --case PATH        the case file (see README: \"Case files\")\n");
  qc_common_help();
  int n;
  const qc_registry_row *r = qc_registry_rows(&n);
  printf("\nmodule classes:\n");
  for (int i = 0; i < n; i++) {
    printf("  %-10s %s\n", r[i].cls->name, r[i].cls->summary);
    if (r[i].cls->not_checked && r[i].cls->not_checked[0]) printf("  %-10s not checked: %s\n", "", r[i].cls->not_checked);
  }
}

/* Contract for m: the dump's attribute (if any), the case's over it, the
 * --profile option over both; validated against the class's keys. */
static int set_contract(qc_module *m, const qc_case *cs, const char *dump_contract, const char *profile) {
  char where[QC_PATHLEN + 64];
  int rc;
  memset(&m->contract, 0, sizeof m->contract);
  if (dump_contract && dump_contract[0]) {
    snprintf(where, sizeof where, "module '%s'", m->path);
    if ((rc = qc_contract_parse(dump_contract, where, &m->contract))) return rc;
  }
  if (cs->has_contract && (rc = qc_contract_merge(&m->contract, &cs->contract))) return rc;
  if (profile) {
    int takes = 0;
    for (const qc_key_spec *k = m->cls->keys; k && k->key; k++) takes |= strcmp(k->key, "profile") == 0;
    if (!takes) return qc_err("--profile '%s': class '%s' has no quantizer profile", profile, m->cls->name);
    if ((rc = qc_contract_set(&m->contract, "profile", profile, 0, 0))) return rc;
  }
  snprintf(where, sizeof where, "case '%s': module '%s'", cs->path, m->path);
  return qc_contract_validate(&m->contract, m->cls->keys, where);
}

/* Deployed bytes: when m's saved/ holds weight_q, a `quantizer` check that
 * qatcheck's quantizer (contract's weight_format, profile, rounding)
 * reproduces them byte for byte. No check when there are no saved bytes. */
static int check_deployed(qc_audit *a, const qc_module *m) {
  const char *fn = qc_contract_str(&m->contract, "weight_format", "none");
  if (!qc_tset_get(&m->saved, "weight_q") || !qc_contract_has(&m->contract, "weight_format") || strcmp(fn, "none") == 0)
    return QC_OK;
  qc_qfmt f;
  qc_qprof p;
  qc_sr sr;
  qc_deployed_result r;
  int rc;
  if ((rc = qc_qfmt_parse(fn, &f)) || (rc = qc_qprof_parse(qc_contract_str(&m->contract, "profile", "vllm"), &p))) return rc;
  qc_sr_from_contract(&m->contract, m->path, &sr);
  if ((rc = qc_deployed_check(m, f, p, &sr, &r))) return rc;
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
  if (bad) qc_deployed_summary(&r, k.why, sizeof k.why);
  return qc_results_add(a->res, &k);
}

/* Keep only the dYs the case names (all when it names none). */
static int select_dy(qc_module *m, const qc_case *cs, const char *dump_path) {
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

static const qc_registry_row *find_class(const char *name, const char *where) {
  const qc_registry_row *row = qc_registry_find(name);
  if (!row) {
    int n;
    const qc_registry_row *r = qc_registry_rows(&n);
    char list[512] = "";
    for (int i = 0; i < n; i++) {
      strncat(list, i ? ", " : "", sizeof list - strlen(list) - 1);
      strncat(list, r[i].cls->name, sizeof list - strlen(list) - 1);
    }
    qc_err("%s: module class '%s' is not known", where, name);
    qc_hint("known classes: %s", list);
  }
  return row;
}

static int run_generated(qc_audit *a, const qc_case *cs, const char *profile) {
  char where[1100];
  snprintf(where, sizeof where, "case '%s'", cs->path);
  const qc_registry_row *row = find_class(cs->module, where);
  if (!row) return QC_EINPUT;
  static const char kinds_default[4][QC_NAMELEN] = {"random", "zero", "sparse", "ones"};
  const char (*kinds)[QC_NAMELEN] = cs->ndy ? cs->dy : kinds_default;
  int nk = cs->ndy ? cs->ndy : 4;
  for (int i = 0; i < cs->nshapes; i++) {
    qc_module m;
    memset(&m, 0, sizeof m);
    m.cls = row->cls;
    snprintf(m.path, sizeof m.path, "%s", row->cls->name);
    int rc = set_contract(&m, cs, NULL, profile);
    clock_t c0 = clock();
    if (!rc) rc = qc_gen_module(row, cs->shape_n[i], cs->shapes[i], cs->seed, i, cs->values, kinds, nk, &m);
    if (!rc) {
      if (qc_verbose) fprintf(stderr, "qatcheck: generated %s in %.3f s cpu\n", m.path, (double)(clock() - c0) / CLOCKS_PER_SEC);
      rc = qc_audit_module(a, &m);
    }
    qc_module_free(&m);
    if (rc) return rc;
  }
  return QC_OK;
}

/* One module read from the dump, with what the reader learned. */
typedef struct load_slot {
  qc_dump *d;
  const qc_dump_entry *ent;
  int with_grads;
  qc_module m;
  char contract[4096];
  char frozen[1024];      /* "/d_weight/d_bias/": gradients of parameters marked frozen="1" */
  int rc, loaded;
  char msg[1024], hint[512];
} load_slot;

/* Read module ent into the slot: every HDF5 call of the audit of a module
 * happens here, so a reader thread can run it while the main thread audits
 * the module before (HDF5 itself is used by one thread at a time). */
static void load_entry(load_slot *s) {
  qc_err_clear();
  s->rc = qc_dump_load_module(s->d, s->ent->path, s->with_grads, &s->m, s->contract, sizeof s->contract);
  s->loaded = s->rc == QC_OK;
  s->frozen[0] = 0;
  for (int j = 0; !s->rc && j < s->m.params.n; j++) { /* qatdump marks frozen parameters */
    char ds[QC_PATHLEN + QC_NAMELEN + 16], v[8];
    snprintf(ds, sizeof ds, "%s/params/%s", s->ent->path, s->m.params.t[j].name);
    if (qc_dump_get_attr(s->d, ds, "frozen", v, sizeof v) == QC_OK && strcmp(v, "1") == 0) {
      size_t l = strlen(s->frozen);
      snprintf(s->frozen + l, sizeof s->frozen - l, "%sd_%s/", l ? "" : "/", s->m.params.t[j].name);
    }
  }
  snprintf(s->msg, sizeof s->msg, "%s", qc_err_msg());
  snprintf(s->hint, sizeof s->hint, "%s", qc_err_hint());
}

static void *load_thread(void *arg) {
  load_slot *s = arg;
  load_entry(s);
  return NULL;
}

/* Audit every matching module group of the dump, one module in memory at a
 * time plus the next one, whose read overlaps the current audit. */
static int run_dump(qc_audit *a, const qc_case *cs, const char *profile) {
  qc_dump *d = NULL;
  qc_dump_entry *ents = NULL;
  int n = 0, rc;
  load_slot *slot = NULL;
  pthread_t th;
  int pending = 0;
  if ((rc = qc_dump_open(cs->dump, &d))) return rc;
  if ((rc = qc_dump_modules(d, cs->modules_re, &ents, &n))) goto done;
  if (n == 0) {
    rc = qc_err("dump '%s': no module group matches '%s': nothing to check", cs->dump, cs->modules_re[0] ? cs->modules_re : ".*");
    qc_hint("a module group is a group with a string attribute 'class'");
    goto done;
  }
  /* classes first: a bad one stops the run before any data is read */
  for (int i = 0; i < n; i++) {
    char where[QC_PATHLEN + 1100];
    snprintf(where, sizeof where, "dump '%s': module '%s'", cs->dump, ents[i].path);
    if (!find_class(ents[i].cls, where)) { rc = QC_EINPUT; goto done; }
    if (cs->module[0] && strcmp(cs->module, ents[i].cls) != 0) {
      rc = qc_err("%s: has class '%s' but the case declares module '%s'", where, ents[i].cls, cs->module);
      qc_hint("narrow data.modules to the groups of class '%s', or drop 'module' to use each group's class", cs->module);
      goto done;
    }
  }
  slot = qc_calloc(2, sizeof *slot, "module read slots");
  if (!slot) { rc = QC_ESYS; goto done; }
  for (int k = 0; k < 2; k++) {
    slot[k].d = d;
    slot[k].with_grads = cs->cand == QC_CAND_DUMP;
  }
  slot[0].ent = &ents[0];
  load_entry(&slot[0]);
  for (int i = 0; i < n && !rc; i++) {
    load_slot *cur = &slot[i % 2], *next = &slot[(i + 1) % 2];
    if (cur->rc) {
      qc_err("%s", cur->msg[0] ? cur->msg : "cannot read a module");
      if (cur->hint[0]) qc_hint("%s", cur->hint);
      rc = cur->rc;
      break;
    }
    if (i + 1 < n) { /* read the next module while this one is audited */
      next->ent = &ents[i + 1];
      if (pthread_create(&th, NULL, load_thread, next) == 0) pending = 1;
      else load_entry(next);
    }
    char where[QC_PATHLEN + 1100];
    snprintf(where, sizeof where, "dump '%s': module '%s'", cs->dump, ents[i].path);
    qc_module *m = &cur->m;
    m->cls = qc_registry_find(ents[i].cls)->cls;
    rc = set_contract(m, cs, cur->contract, profile);
    if (!rc) rc = check_deployed(a, m);
    if (!rc) rc = select_dy(m, cs, cs->dump);
    if (!rc && m->grad_out.n == 0)
      rc = qc_err("%s: has no upstream gradient: expected at least one dataset under 'grad_out/'", where);
    if (!rc) {
      a->frozen = cur->frozen;
      if (qc_verbose) fprintf(stderr, "qatcheck: auditing %s\n", m->path);
      rc = qc_audit_module(a, m);
      a->frozen = NULL;
    }
    qc_module_free(m);
    cur->loaded = 0;
    if (pending) {
      pthread_join(th, NULL);
      pending = 0;
    }
  }
done:
  if (pending) pthread_join(th, NULL);
  if (slot)
    for (int k = 0; k < 2; k++)
      if (slot[k].loaded) qc_module_free(&slot[k].m);
  free(slot);
  free(ents);
  qc_dump_close(d);
  return rc;
}

int qc_cmd_vjp(int argc, char **argv) {
  qc_common_opts o = {0};
  const char *case_path = NULL;
  for (int i = 1; i < argc; i++) {
    int r;
    if (qc_opt_help(argv[i])) { help(); return 0; }
    if ((r = qc_opt_common(argc, argv, &i, &o))) { if (r < 0) return QC_EINPUT; continue; }
    if ((r = qc_opt_value(argc, argv, &i, "--case", &case_path))) { if (r < 0) return QC_EINPUT; continue; }
    qc_err("vjp: unknown option '%s'", argv[i]);
    qc_hint("run 'qatcheck vjp --help'");
    return QC_EINPUT;
  }
  if (!case_path) {
    qc_err("vjp: option '--case' is required");
    qc_hint("qatcheck vjp --case cases/linear_bf16.json");
    return QC_EINPUT;
  }
  qc_case *cs = qc_calloc(1, sizeof *cs, "case");
  if (!cs) return QC_ESYS;
  qc_results res = {0};
  const qc_backend *be = NULL;
  qc_plugin *plugin = NULL;
  int rc;
  if ((rc = qc_case_load(case_path, cs))) goto done;
  if ((rc = qc_backend_open(o.device, &be))) goto done;
  if (cs->cand == QC_CAND_PLUGIN && (rc = qc_plugin_open(cs->plugin, cs->symbol, &plugin))) goto done;
  qc_ctx ctx = {.be = be, .profile = o.profile ? o.profile : "vllm"};
  qc_audit a = {.ctx = &ctx, .cs = cs, .plugin = plugin, .res = &res};
  rc = cs->data == QC_DATA_GENERATE ? run_generated(&a, cs, o.profile) : run_dump(&a, cs, o.profile);
  if (rc) goto done;
  if (res.n == 0) {
    rc = qc_err("case '%s': nothing was checked", case_path);
    goto done;
  }
  qc_report_info info = {"vjp", cs->name, case_path, cs->sha256, be->name, o.profile};
  /* all reports or none: a later one that cannot be written takes the
   * earlier ones back, so no report of an exit-2 run is left behind */
  if (o.json && (rc = qc_report_json(o.json, &info, &res))) goto done;
  if (o.junit && (rc = qc_report_junit(o.junit, &info, &res))) {
    if (o.json) unlink(o.json);
    goto done;
  }
  if (o.markdown && (rc = qc_report_markdown(o.markdown, &info, &res))) {
    if (o.json) unlink(o.json);
    if (o.junit) unlink(o.junit);
    goto done;
  }
  qc_report_table(&info, &res);
  rc = qc_results_verdict(&res);
done:
  qc_plugin_close(plugin);
  qc_backend_close(be);
  qc_results_free(&res);
  free(cs);
  return rc;
}
