/* cli/fd.c: `qatcheck fd --module CLASS`: the finite-difference cross-check
 * of a class's float64 reference VJP against its float64 forward on
 * generated inputs (see src/engine/fd.h). Exit 0 when every projection agrees
 * within the bound, 1 when one does not, 2 on bad input. */
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
#include "cli/cli.h"
#include "report/report.h"
#include "report/run.h"

#define FD_NO_DEVICE "fd differences each class's float64 forward, which runs on the host only"

/* The verb's --help: what it does and its options (p's table). */
static void fd_help(const qc_opts *p) {
  printf("usage: qatcheck fd --module CLASS [--shape A,B,...] [--seed S] [--set KEY=VALUE]...\n"
         "                   [--values normal|special] [--directions N] [--tol T] [options]\n\n"
         "Cross-checks the class's float64 reference VJP against finite differences of\n"
         "its float64 forward: for random u, v, <u, J^T v> (the VJP with dY = v) must\n"
         "equal <J u, v> (central 4-point differences, h = 1e-3) within\n"
         "tol * ||u|| ||J^T v|| + 1e-12 sum|y v| (tol default 1e-6), for every\n"
         "gradient tensor and direction. Discrete branches (clamp, ReLU, top-k) stay\n"
         "fixed at the unperturbed point.\n\n");
  qc_opts_help(p->opt, 21);
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

/* fd's values, for its option handlers. */
typedef struct fd_args {
  qc_gen *g;
  qc_contract *c;
  qc_fd_opts *o;
} fd_args;

/* --values: normal or special. */
static int opt_values(const qc_opt *o, const char *v) {
  fd_args *a = o->value;
  if (strcmp(v, "normal") && strcmp(v, "special")) return qc_err("option '--values' value '%s': expected normal or special", v);
  a->g->values = v;
  return QC_OK;
}

/* --set KEY=VALUE: one contract key more. */
static int opt_set(const qc_opt *o, const char *v) { return qc_fd_parse_set(((fd_args *)o->value)->c, v) ? QC_EINPUT : QC_OK; }

/* --seed S: the generator's and the directions' seed (the ranges of the numbers: the table's). */
static int opt_seed(const qc_opt *o, double v) {
  fd_args *a = o->value;
  a->o->seed = a->g->seed = (uint64_t)v;
  return QC_OK;
}

/* --directions N. */
static int opt_directions(const qc_opt *o, double v) {
  ((fd_args *)o->value)->o->directions = (int)v;
  return QC_OK;
}

/* --tol T. */
static int opt_tol(const qc_opt *o, double v) {
  ((fd_args *)o->value)->o->tol = v;
  return QC_OK;
}

int qc_cmd_fd(qc_run *run, int argc, char **argv) {
  qc_common_opts co = {.run = run};
  const char *cls_name = NULL, *shape = NULL;
  qc_gen g = {0};
  qc_contract c = {0};
  qc_fd_opts o;
  qc_fd_defaults(&o);
  g.values = "normal";
  fd_args fa = {.g = &g, .c = &c, .o = &o};
  int n;
  const qc_registry_row *r = qc_registry_rows(&n);
  char classes[1024];
  size_t k = (size_t)snprintf(classes, sizeof classes, "the class; one of:");
  for (int i = 0; i < n && k < sizeof classes; i++)
    if (r[i].cls->forward) k += (size_t)snprintf(classes + k, sizeof classes - k, " %s", r[i].cls->name);
  qc_opt opts[] = {
      QC_OPT_STRING("module", &cls_name, "CLASS", classes),
      QC_OPT_STRING("shape", &shape, "A,B,...", "the generate shape row (default: the class's small one)"),
      {.type = QC_OT_NUMBER, .name = "seed", .value = &fa, .argh = "S", .num = opt_seed, .lo = 0, .hi = 9007199254740992.0,
       .flags = QC_OPT_WHOLE, .help = "generator and direction seed (default 0)"},
      QC_OPT_CALLBACK("set", &fa, "KEY=VALUE", opt_set, "a contract key (repeatable): eps=1e-5, layout=interleaved"),
      QC_OPT_CALLBACK("values", &fa, "V", opt_values, "generated values: normal (default) or special"),
      {.type = QC_OT_NUMBER, .name = "directions", .value = &fa, .argh = "N", .num = opt_directions, .lo = 1, .hi = 100,
       .flags = QC_OPT_WHOLE, .help = "random directions per gradient tensor (default 3, at most 100)"},
      {.type = QC_OT_NUMBER, .name = "tol", .value = &fa, .argh = "T", .num = opt_tol, .lo = 0, .hi = 1,
       .help = "relative tolerance (default 1e-6)"},
      QC_OPT_TEXT("\nReports: --json holds every projection (class, tensor, direction, the two inner\n"
                  "products, relative error |diff| / (||u|| ||J^T v||), tolerance, bound, pass);\n"
                  "--junit and --markdown have one testcase per projection, a disagreement a failure.\n"
                  "--profile sets the contract key 'profile' (only classes with a quantizer take it).\n"),
      QC_OPTS_COMMON(&co, QC_HELP_MARKDOWN | QC_HELP_PROFILE | QC_HELP_CPU_ONLY),
      QC_OPT_END(),
  };
  qc_opts p = {.verb = "fd", .opt = opts, .help = fd_help, .run = run};
  int prc = qc_opts_parse(&p, argc, argv);
  qc_opts_free(&p);
  if (prc || p.done) return prc;
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
  qc_report_out out;
  int nrows = 0, bad = 0;
  qc_run_out(run, &out, co.json, co.junit, co.markdown);
  qc_ctx ctx = {.be = qc_backend_cpu(), .profile = co.profile ? co.profile : "vllm"};
  double t0 = qc_now_s();
  int rc = qc_fd_instance(row->cls, &g, &c, &m);
  if (rc) return rc;
  rc = qc_fd_check(&ctx, &m, row->cls->forward, row->reference, &o, &rows, &nrows);
  if (rc) goto done;
  for (int i = 0; i < nrows; i++) bad += !rows[i].pass;
  if (qc_verbose) fprintf(stderr, "fd: %d projection(s) in %.3f s\n", nrows, qc_now_s() - t0);
  qc_fd_info fi = {.cls = cls_name, .module = m.path, .shape = shape, .values = g.values, .o = &o, .rows = rows,
                   .n = nrows, .bad = bad, .seconds = qc_now_s() - t0};
  if ((rc = qc_report_fd(&out, &fi)) || (rc = qc_report_commit(&out))) goto done; /* all reports or none */
  if (!qc_quiet) qc_report_fd_table(&fi);
  rc = bad ? QC_FAIL : QC_OK;
done:
  free(rows);
  qc_report_out_free(&out);
  qc_module_free(&m);
  return rc;
}
