/* tol_dump.c: `qatcheck tol --dump F --module PATH` (the branch qc_cmd_tol
 * takes for it, its options parsed): every gradient of the module, of any
 * class, gets exactly the tolerance {"derive": true} gives it in `vjp`
 * (qc_audit_derive: the class's tol_model under the module's first dY, the
 * candidate's dtype as dumped), and the whole case-file "tolerances" member
 * is printed, every reasoning saying what the bounds were derived from. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli/cli.h"
#include "core/qc.h"
#include "engine/audit.h"
#include "io/dump.h"
#include "model/case.h"
#include "model/module.h"
#include "model/tol.h"
#include "report/report.h"
#include "report/run.h"

#define TOL_NO_DEVICE "tol derives its bounds arithmetically on the host and has no device work"
#define MAXG 16

/* The tensor gradient `grad` ("d_x") is taken with respect to: inputs/x or
 * params/x of m (NULL: neither exists). */
static const qc_tensor *grad_input(const qc_module *m, const char *grad) {
  if (strncmp(grad, "d_", 2) != 0) return NULL;
  const qc_tensor *t = qc_tset_get(&m->inputs, grad + 2);
  return t ? t : qc_tset_get(&m->params, grad + 2);
}

/* The gradients of m that vjp would judge, into names[0 .. *n): every
 * gradient of the class whose input or parameter the module has (the
 * reference returns it, so vjp needs its tolerance even when the dump
 * holds no candidate for it), and any the dump holds a candidate for
 * (grads/ of the first dY). QC_OK, or QC_EINPUT when there is none. */
static int module_grads(const qc_module *m, char (*names)[QC_NAMELEN], int max, int *n) {
  const char *p = m->cls->grads;
  *n = 0;
  int cand = m->cand && m->grad_out.n && m->cand[0].n;
  while (p && *p && *n < max) {
    size_t l = strcspn(p, " ");
    if (l > 0 && l < QC_NAMELEN) {
      char g[QC_NAMELEN];
      memcpy(g, p, l);
      g[l] = 0;
      if ((cand && qc_tset_get(&m->cand[0], g)) || grad_input(m, g)) snprintf(names[(*n)++], QC_NAMELEN, "%s", g);
    }
    p += l;
    p += strspn(p, " ");
  }
  if (*n) return QC_OK;
  return qc_err("%s: no gradient of class %s to derive: the dump holds no candidate under grads/ and none of its "
                "inputs (%s)", m->path, m->cls->name, m->cls->grads);
}

int qc_tol_dump(const qc_common_opts *cop, const char *dump, const char *path, const qc_tol_dump_opts *dopt) {
  const qc_common_opts co = *cop;
  int rc;
  if (!path) {
    qc_hint("qatcheck tol --dump step.h5 --module /model.layers.0.mlp.down_proj");
    return qc_err("tol: --dump needs --module PATH (the module group whose tolerances to derive)");
  }
  if ((rc = qc_opt_cpu_only("tol", co.device, TOL_NO_DEVICE))) return rc;
  if (co.profile) return qc_err("tol: --profile is not supported: the bounds do not depend on a quantizer profile");
  qc_dump *d = NULL;
  qc_module m;
  qc_report_out out;
  qc_tol decl;
  qc_audit_model am[MAXG];
  qc_tol_terms terms[MAXG];
  qc_tol_info ti[MAXG];
  char names[MAXG][QC_NAMELEN], cmd[640], why[MAXG][1600], cls[64], cj[4096], where[QC_PATHLEN + 64];
  char *txt = NULL;
  int n = 0;
  memset(&m, 0, sizeof m);
  qc_run_out(co.run, &out, co.json, co.junit, co.markdown);
  if ((rc = qc_dump_open(dump, &d))) goto done;
  if (qc_dump_get_attr(d, path, "class", cls, sizeof cls) != QC_OK) {
    rc = qc_err("dump '%s': '%s' is not a module group (no string attribute 'class')", dump, path);
    goto done;
  }
  const qc_registry_row *row = qc_registry_find(cls);
  if (!row) { rc = qc_err("dump '%s': module '%s' has class '%s', which is not known", dump, path, cls); goto done; }
  if (!row->cls->tol_model) {
    qc_hint("derive each gradient with 'qatcheck tol --out-dtype D --k K --tensor NAME' (docs/tolerances.md: K per class)");
    rc = qc_err("tol --dump: class '%s' has no error model: its tolerances cannot be derived", cls);
    goto done;
  }
  if ((rc = qc_dump_load_module(d, path, 1, &m, cj, sizeof cj))) goto done;
  m.cls = row->cls;
  snprintf(where, sizeof where, "module '%s'", path);
  if ((rc = qc_module_check_known(&m, where))) goto done;
  if (cj[0] && (rc = qc_contract_parse(cj, where, &m.contract))) goto done;
  if ((rc = qc_contract_validate(&m.contract, m.cls->keys, where))) goto done;
  if (m.grad_out.n == 0) { rc = qc_err("%s: no dataset under grad_out/: the error model reads dY", path); goto done; }
  if ((rc = qc_module_validate(&m, where))) goto done;
  if ((rc = module_grads(&m, names, MAXG, &n))) goto done;
  /* the declared {"derive": true, ...} the options stand for */
  memset(&decl, 0, sizeof decl);
  decl.derive = 1;
  decl.derive_rounded_operands = dopt->rounded_operands;
  decl.derive_margin = dopt->margin;
  if (dopt->format) snprintf(decl.derive_format, sizeof decl.derive_format, "%s", dopt->format);
  int k = snprintf(cmd, sizeof cmd, "qatcheck tol --dump %s --module %s", dump, path);
  if (dopt->margin > 0) k += snprintf(cmd + k, sizeof cmd - (size_t)k, " --margin %g", dopt->margin);
  if (dopt->rounded_operands >= 0) k += snprintf(cmd + k, sizeof cmd - (size_t)k, " --rounded-operands %d", dopt->rounded_operands);
  if (dopt->format) snprintf(cmd + k, sizeof cmd - (size_t)k, " --format %s", dopt->format);
  for (int i = 0; i < n; i++) {
    const qc_tensor *c = m.cand ? qc_tset_get(&m.cand[0], names[i]) : NULL, *in = grad_input(&m, names[i]);
    qc_dtype dt = c ? qc_audit_cand_dtype(c, &decl, NULL) : in ? in->dtype : QC_F32;
    char src[160];
    if (c && dt != c->dtype)
      snprintf(src, sizeof src, "grads/%s is stored as %s and every value is a %s value", names[i], qc_dtype_name(c->dtype), qc_dtype_name(dt));
    else if (c) snprintf(src, sizeof src, "grads/%s as dumped", names[i]);
    else snprintf(src, sizeof src, "no candidate in the dump: the dtype of %s", in ? in->name : "float32 by default");
    qc_tol use;
    if ((rc = qc_audit_derive(&m, &m.grad_out.t[0], names[i], dt, &decl, 0, &am[i], &use))) goto done;
    /* the member prints the tolerance vjp uses (floors included) */
    terms[i] = am[i].terms;
    terms[i].rel_l2 = use.rel_l2;
    terms[i].cosine_min = use.cosine_min;
    terms[i].norm_lo = use.norm_lo;
    terms[i].norm_hi = use.norm_hi;
    terms[i].noise_multiple = use.noise_multiple;
    terms[i].has_max_abs = use.has_max_abs;
    terms[i].max_abs = use.max_abs;
    snprintf(why[i], sizeof why[i], "%s; judged at %s (%s; dY grad_out/%s); where the reference is exactly zero, vjp judges "
             "max_abs instead; derived by: %s", use.reasoning, qc_dtype_name(dt), src, m.grad_out.t[0].name, cmd);
    ti[i] = (qc_tol_info){.tensor = names[i], .command = cmd, .reasoning = why[i], .s = &am[i].spec, .t = &terms[i]};
  }
  if (!(txt = qc_report_tol_members(ti, n))) { rc = qc_err_sys("tol: out of memory building the JSON"); goto done; }
  if ((rc = qc_report_tol_module(&out, ti, n, dump, path)) || (rc = qc_report_commit(&out))) goto done;
  if (!qc_quiet) printf("%s\n", txt);
  rc = QC_OK;
done:
  free(txt);
  qc_report_out_free(&out);
  qc_module_free(&m);
  qc_dump_close(d);
  return rc;
}
