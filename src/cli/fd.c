/* cli/fd.c: `qatcheck fd --module CLASS`: the finite-difference cross-check
 * of a class's float64 reference VJP against its float64 forward on
 * generated inputs (see src/fd.h). Exit 0 when every projection agrees
 * within the bound, 1 when one does not, 2 on bad input. */
#include <cjson/cJSON.h>
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "backend/backend.h"
#include "model/check.h"
#include "engine/fd.h"
#include "model/module.h"
#include "core/qc.h"
#include "report/tlist.h"
#include "cli/cli.h"
#include "report/report.h"

#define FD_NO_DEVICE "fd differences each class's float64 forward, which runs on the host only"

static void fd_help(void) {
  int n;
  const qc_registry_row *r = qc_registry_rows(&n);
  printf("usage: qatcheck fd --module CLASS [--shape A,B,...] [--seed S] [--set KEY=VALUE]...\n"
         "                   [--values normal|special] [--directions N] [--tol T] [options]\n\n"
         "Cross-checks the class's float64 reference VJP against finite differences of\n"
         "its float64 forward: for random u, v, <u, J^T v> (the VJP with dY = v) must\n"
         "equal <J u, v> (central 4-point differences, h = 1e-3) within\n"
         "tol * ||u|| ||J^T v|| + 1e-12 sum|y v| (tol default 1e-6), for every\n"
         "gradient tensor and direction. Discrete branches (clamp, ReLU, top-k) stay\n"
         "fixed at the unperturbed point.\n\n"
         "  --module CLASS     the class; one of:");
  for (int i = 0; i < n; i++)
    if (r[i].cls->forward) printf(" %s", r[i].cls->name);
  printf("\n  --shape A,B,...    the generate shape row (default: the class's small one)\n"
         "  --seed S           generator and direction seed (default 0)\n"
         "  --set KEY=VALUE    a contract key (repeatable): eps=1e-5, layout=interleaved\n"
         "  --values V         generated values: normal (default) or special\n"
         "  --directions N     random directions per gradient tensor (default 3)\n"
         "  --tol T            relative tolerance (default 1e-6)\n\n"
         "Reports: --json holds every projection (class, tensor, direction, the two inner\n"
         "products, relative error |diff| / (||u|| ||J^T v||), tolerance, bound, pass);\n"
         "--junit and --markdown have one testcase per projection, a disagreement a failure.\n"
         "--profile sets the contract key 'profile' (only classes with a quantizer take it).\n\n");
  qc_common_help_opts(QC_HELP_MARKDOWN | QC_HELP_PROFILE | QC_HELP_CPU_ONLY);
  printf("exit status: 0 all agree, 1 a disagreement, 2 bad input\n");
}

/* Parse "a,b,c" into a shape row. */
static int parse_shape(const char *s, qc_gen *g) {
  const char *p = s;
  g->nshape = 0;
  while (*p) {
    char *end;
    errno = 0;
    long long v = strtoll(p, &end, 10);
    if (end == p || errno || v < 1 || g->nshape == QC_MAXDIM || (*end && *end != ','))
      return qc_err("option '--shape' value '%s': expected up to %d positive integers separated by commas", s, QC_MAXDIM);
    g->shape[g->nshape++] = v;
    p = *end ? end + 1 : end;
  }
  if (!g->nshape) return qc_err("option '--shape' value '%s': expected at least one integer", s);
  return QC_OK;
}

/* Parse a whole number option value. */
static int parse_num(const char *opt, const char *s, double lo, double *out) {
  char *end;
  double v = strtod(s, &end);
  if (end == s || *end || !(v >= lo)) return qc_err("option '%s' value '%s': expected a number >= %g", opt, s, lo);
  *out = v;
  return QC_OK;
}

static double rel_err(const qc_fd_row *r) {
  double d = fabs(r->vjp - r->jvp);
  return r->scale > 0 ? d / r->scale : d > 0 ? INFINITY : 0;
}

static cJSON *num_or_null(double v) { return isfinite(v) ? cJSON_CreateNumber(v) : cJSON_CreateNull(); }

static int write_json(const char *path, const qc_module *m, const char *shape, const qc_gen *g, const qc_fd_opts *o,
                      const qc_fd_row *rows, int n, int bad) {
  cJSON *root = qc_report_envelope("fd", bad ? 1 : 0);
  if (!root) return qc_err_sys("fd: out of memory building the report");
  cJSON_AddStringToObject(root, "class", m->cls->name);
  cJSON_AddStringToObject(root, "module", m->path);
  cJSON_AddStringToObject(root, "shape", shape);
  cJSON_AddStringToObject(root, "values", g->values);
  cJSON_AddNumberToObject(root, "seed", (double)o->seed);
  cJSON_AddNumberToObject(root, "directions", o->directions);
  cJSON_AddNumberToObject(root, "h", o->h);
  cJSON_AddNumberToObject(root, "tol", o->tol);
  cJSON_AddStringToObject(root, "bound_rule", "|<u, J^T v> - <J u, v>| <= tol * ||u|| ||J^T v|| + 1e-12 sum |y v|");
  cJSON *rs = cJSON_AddArrayToObject(root, "rows");
  for (int i = 0; i < n; i++) {
    const qc_fd_row *r = &rows[i];
    cJSON *x = cJSON_CreateObject();
    cJSON_AddStringToObject(x, "class", m->cls->name);
    cJSON_AddStringToObject(x, "tensor", r->tensor);
    cJSON_AddNumberToObject(x, "direction", r->dir);
    cJSON_AddItemToObject(x, "vjp", num_or_null(r->vjp));
    cJSON_AddItemToObject(x, "jvp", num_or_null(r->jvp));
    cJSON_AddItemToObject(x, "abs_diff", num_or_null(fabs(r->vjp - r->jvp)));
    cJSON_AddItemToObject(x, "rel_err", num_or_null(rel_err(r)));
    cJSON_AddNumberToObject(x, "tol", o->tol);
    cJSON_AddItemToObject(x, "bound", num_or_null(r->bound));
    cJSON_AddBoolToObject(x, "pass", r->pass);
    cJSON_AddItemToArray(rs, x);
  }
  return qc_report_json_write(path, root);
}

/* JUnit/Markdown: one testcase per projection. */
static int make_list(qc_tlist *l, const qc_module *m, const qc_fd_row *rows, int n) {
  for (int i = 0; i < n; i++) {
    const qc_fd_row *r = &rows[i];
    char name[QC_NAMELEN + 32], msg[320];
    snprintf(name, sizeof name, "%s/dir%d", r->tensor, r->dir);
    snprintf(msg, sizeof msg, "<u, J^T v> = %.12e, <J u, v> = %.12e: |diff| %.2e %s bound %.2e (relative error %.2e)",
             r->vjp, r->jvp, fabs(r->vjp - r->jvp), r->pass ? "<=" : "exceeds", r->bound, rel_err(r));
    int rc = qc_tlist_add(l, m->path, m->cls->name, name, r->pass ? NULL : msg, r->pass ? msg : NULL);
    if (rc) return rc;
  }
  return QC_OK;
}

int qc_cmd_fd(int argc, char **argv) {
  qc_common_opts co = {0};
  const char *cls_name = NULL, *shape = NULL, *val;
  qc_gen g = {0};
  qc_contract c = {0};
  qc_fd_opts o;
  qc_fd_defaults(&o);
  g.values = "normal";
  for (int i = 1; i < argc; i++) {
    int r;
    double num = 0;
    if (qc_opt_help(argv[i])) { fd_help(); return 0; }
    if ((r = qc_opt_common(argc, argv, &i, &co))) { if (r < 0) return QC_EINPUT; continue; }
    if ((r = qc_opt_value(argc, argv, &i, "--module", &cls_name))) { if (r < 0) return QC_EINPUT; continue; }
    if ((r = qc_opt_value(argc, argv, &i, "--shape", &shape))) { if (r < 0) return QC_EINPUT; continue; }
    if ((r = qc_opt_value(argc, argv, &i, "--values", &g.values))) {
      if (r < 0) return QC_EINPUT;
      if (strcmp(g.values, "normal") && strcmp(g.values, "special"))
        return qc_err("option '--values' value '%s': expected normal or special", g.values);
      continue;
    }
    if ((r = qc_opt_value(argc, argv, &i, "--set", &val))) {
      if (r < 0 || qc_fd_parse_set(&c, val)) return QC_EINPUT;
      continue;
    }
    if ((r = qc_opt_value(argc, argv, &i, "--seed", &val))) {
      if (r < 0 || parse_num("--seed", val, 0, &num)) return QC_EINPUT;
      o.seed = g.seed = (uint64_t)num;
      continue;
    }
    if ((r = qc_opt_value(argc, argv, &i, "--directions", &val))) {
      if (r < 0 || parse_num("--directions", val, 1, &num)) return QC_EINPUT;
      o.directions = (int)(num > 100 ? 100 : num);
      continue;
    }
    if ((r = qc_opt_value(argc, argv, &i, "--tol", &val))) {
      if (r < 0 || parse_num("--tol", val, 0, &o.tol)) return QC_EINPUT;
      continue;
    }
    qc_err("fd: unknown option '%s'", argv[i]);
    qc_hint("run 'qatcheck fd --help'");
    return QC_EINPUT;
  }
  if (!cls_name) {
    qc_err("fd: option '--module' is required");
    qc_hint("run 'qatcheck fd --help' for the classes");
    return QC_EINPUT;
  }
  const qc_registry_row *row = qc_registry_find(cls_name);
  if (!row) {
    qc_err("fd: unknown module class '%s'", cls_name);
    qc_hint("run 'qatcheck fd --help' for the classes");
    return QC_EINPUT;
  }
  if (!row->cls->forward) return qc_err("fd: class '%s' has no float64 forward to difference", cls_name);
  if (qc_opt_cpu_only("fd", co.device, FD_NO_DEVICE)) return QC_EINPUT;
  if (co.profile) {
    int takes = 0;
    for (const qc_key_spec *k = row->cls->keys; k && k->key; k++) takes |= strcmp(k->key, "profile") == 0;
    if (!takes) return qc_err("--profile '%s': class '%s' has no quantizer profile", co.profile, cls_name);
    if (qc_contract_set(&c, "profile", co.profile, 0, 0)) return QC_EINPUT;
  }
  if (!shape) shape = row->cls->fd_shape ? row->cls->fd_shape : "";
  if (parse_shape(shape, &g)) return QC_EINPUT;

  qc_module m;
  qc_fd_row *rows = NULL;
  qc_tlist tl = {0};
  int nrows = 0, bad = 0;
  qc_ctx ctx = {.be = qc_backend_cpu(), .profile = co.profile ? co.profile : "vllm"};
  double t0 = qc_now_s();
  int rc = qc_fd_instance(row->cls, &g, &c, &m);
  if (rc) return rc;
  rc = qc_fd_check(&ctx, &m, row->cls->forward, row->reference, &o, &rows, &nrows);
  if (rc) goto done;
  for (int i = 0; i < nrows; i++) bad += !rows[i].pass;
  if (qc_verbose) fprintf(stderr, "fd: %d projection(s) in %.3f s\n", nrows, qc_now_s() - t0);
  /* all reports or none: a later one that cannot be written takes the earlier ones back */
  if ((co.junit || co.markdown) && (rc = make_list(&tl, &m, rows, nrows))) goto done;
  if (co.json && (rc = write_json(co.json, &m, shape, &g, &o, rows, nrows, bad))) goto done;
  if (co.junit && (rc = qc_tlist_junit(&tl, co.junit, "fd"))) {
    if (co.json) unlink(co.json);
    goto done;
  }
  if (co.markdown) {
    char pre[QC_PATHLEN + 256];
    snprintf(pre, sizeof pre, "- module: `%s` (seed %llu, %d direction(s), tol %g, h %g)", m.path,
             (unsigned long long)o.seed, o.directions, o.tol, o.h);
    if ((rc = qc_tlist_markdown(&tl, co.markdown, "fd", pre))) {
      if (co.json) unlink(co.json);
      if (co.junit) unlink(co.junit);
      goto done;
    }
  }
  if (!qc_quiet) {
    for (int i = 0; i < nrows; i++)
      printf("%s %-10s dir %d: <u, J^T v> = % .12e  <J u, v> = % .12e  |diff| %.2e  bound %.2e  %s\n", m.path,
             rows[i].tensor, rows[i].dir, rows[i].vjp, rows[i].jvp, fabs(rows[i].vjp - rows[i].jvp), rows[i].bound,
             rows[i].pass ? "agree" : "DISAGREE");
    printf("fd %s: %d of %d projections agree (tol %g, h %g): %s\n", cls_name, nrows - bad, nrows, o.tol, o.h,
           bad ? "fail" : "pass");
  }
  rc = bad ? QC_FAIL : QC_OK;
done:
  free(rows);
  qc_tlist_free(&tl);
  qc_module_free(&m);
  return rc;
}
