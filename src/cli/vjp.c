/* vjp.c: `qatcheck vjp --case CASE.json`: layer 1. Options, the plan (the
 * case), the run (engine/vjp.c: load, run and compare), the reports. */
#include <glob.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "backend/backend.h"
#include "cli/cli.h"
#include "core/number.h"
#include "core/qc.h"
#include "dist/dist.h"
#include "engine/modes.h"
#include "engine/vjp.h"
#include "io/plugin.h"
#include "model/case.h"
#include "model/check.h"
#include "report/report.h"
#include "report/run.h"

/* The verb's --help: what it does, its options (p's table), the module classes. */
static void help(const qc_opts *p) {
  printf("usage: qatcheck vjp --case CASE.json [options]\n\n"
         "Layer 1: runs each module's production VJP (builtin, from a dump, or a plugin)\n"
         "and an independent float64 reference on the same inputs and the same dY, and\n"
         "judges every gradient against the tolerances the case declared in advance.\n\n");
  qc_opts_help(p->opt, 21);
  fputs(QC_HELP_EXIT, stdout);
  int n;
  const qc_registry_row *r = qc_registry_rows(&n);
  printf("\nmodule classes:\n");
  for (int i = 0; i < n; i++) {
    printf("  %-10s %s\n", r[i].cls->name, r[i].cls->summary);
    if (r[i].cls->not_checked && r[i].cls->not_checked[0]) printf("  %-10s not checked: %s\n", "", r[i].cls->not_checked);
  }
}

/* The case's dump as the run's input: its one file, or every file of a
 * sharded dump's pattern (none matching: the engine says so). */
static int dump_inputs(qc_run *run, const char *dump) {
  if (!qc_shard_pattern(dump)) return qc_run_input(run, "dump", dump);
  glob_t g;
  int rc = QC_OK;
  if (glob(dump, 0, NULL, &g) != 0) return QC_OK;
  for (size_t i = 0; i < g.gl_pathc && !rc; i++) rc = qc_run_input(run, "dump", g.gl_pathv[i]);
  globfree(&g);
  return rc;
}

/* --verbose: how long the phase that ends now took, from *t (then now). */
static void phase(const char *what, double *t) {
  const double now = qc_now_s();
  if (qc_verbose) fprintf(stderr, "qatcheck: %s in %.3f s\n", what, now - *t);
  *t = now;
}

/* --reference auto | float64 | fast | fast:S into the number of slices
 * (o->value, an int; 0: float64, QC_REF_AUTO: auto); S in the entry's range. */
static int opt_reference(const qc_opt *o, const char *v) {
  int *slices = o->value;
  double s;
  if (!strcmp(v, "auto")) *slices = QC_REF_AUTO;
  else if (!strcmp(v, "float64")) *slices = 0;
  else if (!strcmp(v, "fast")) *slices = QC_REF_FAST_SLICES;
  else if (!strncmp(v, "fast:", 5) && qc_num_read(v + 5, o->lo, o->hi, QC_NUM_WHOLE, &s)) *slices = (int)s;
  else return qc_err("vjp: --reference '%s': expected auto, float64, fast or fast:S (S slices, %g to %g)", v, o->lo, o->hi);
  return QC_OK;
}

/* The backend opened late (qc_audit.be_open): a device's start (the CUDA
 * context, the libraries: 0.3 to 0.7 s on the H100 hosts) overlaps the
 * dump's first modules being read. */
typedef struct late_open {
  const char *device;
  qc_ctx *ctx;
  const qc_backend **be;
  int ref_slices;
} late_open;

/* Open the backend into *o->be and o->ctx->be; the phase line as before. */
static int open_backend(void *arg) {
  late_open *o = arg;
  double tp = qc_now_s();
  int rc = qc_backend_open(o->device, o->be);
  if (rc) return rc;
  o->ctx->be = *o->be;
  phase("the backend opened", &tp);
  if (o->ref_slices > 0 && !(*o->be)->audit_linear && qc_verbose)
    fprintf(stderr, "qatcheck: --reference fast: %s has no tensor-core reference; the reference stays float64\n", (*o->be)->name);
  return QC_OK;
}

int qc_cmd_vjp(qc_run *run, int argc, char **argv) {
  qc_common_opts o = {.run = run};
  const char *case_path = NULL, *eager = NULL;
  int allow_weak = 0, ref_slices = QC_REF_AUTO;
  qc_opt opts[] = {
      QC_OPT_STRING("case", &case_path, "PATH",
                    "the case file (docs/interfaces.md section 3); its data.dump may be a\n"
                    "pattern of per-rank files of a sharded run (\"step.rank*.h5\")"),
      QC_OPT_STRING("eager", &eager, "DUMP",
                    "the eager dump of the same step: the case's dump, written in an\n"
                    "execution mode (root attribute mode: recompute, cuda_graph,\n"
                    "grad_accum, ...), is also judged against it (docs/audit.md)"),
      QC_OPT_BOOL("allow-weak-tolerances", &allow_weak,
                  "run a case whose bounds cannot see a scale error or a sign\n"
                  "flip, with a warning in every report (refused otherwise)"),
      {.type = QC_OT_CALLBACK, .name = "reference", .value = &ref_slices, .argh = "KIND", .fn = opt_reference,
       .lo = QC_REF_SLICES_MIN, .hi = QC_REF_SLICES_MAX, .flags = QC_OPT_WHOLE,
       .help = "auto (default): on --device cuda, per reference GEMM of the fused\n"
               "linear audit, fast where this device's measured rates predict it\n"
               "at least 10% faster than DGEMM, float64 otherwise; cpu: float64.\n"
               "float64: the reference GEMMs in float64 (DGEMM); fast: on cuda,\n"
               "the fused linear audit's reference on int8 tensor cores (Ozaki\n"
               "scheme, fast:S for S slices, 2 to 5), self-checked, float64\n"
               "wherever the check fails. Each check's report names which ran"},
      QC_OPT_TEXT("\nUnder mpirun -np N the module groups are split among the N processes; rank 0\n"
                  "reports (docs/distributed.md).\n"),
      QC_OPTS_COMMON(&o, QC_HELP_MARKDOWN | QC_HELP_PROFILE),
      QC_OPT_END(),
  };
  qc_opts p = {.verb = "vjp", .opt = opts, .help = help, .run = run};
  int rc = qc_opts_parse(&p, argc, argv);
  qc_opts_free(&p);
  if (rc || p.done) return rc;
  if (!case_path) {
    qc_err("vjp: option '--case' is required");
    qc_hint("qatcheck vjp --case cases/linear_bf16.json");
    return QC_EINPUT;
  }
  qc_case *cs = qc_calloc(1, sizeof *cs, "case");
  if (!cs) return QC_ESYS;
  qc_results res = {0};
  qc_modinfos mods = {0};
  const qc_backend *be = NULL;
  char devbuf[32];
  qc_plugin *plugin = NULL;
  qc_report_out out;
  qc_run_out(run, &out, o.json, o.junit, o.markdown);
  if ((rc = qc_case_load(case_path, cs)) || (rc = qc_case_weak(cs, allow_weak))) goto done;
  /* the inputs, hashed for the report while the run goes on */
  if ((rc = qc_run_input(run, "case", case_path))) goto done;
  if (cs->data == QC_DATA_DUMP && (rc = dump_inputs(run, cs->dump))) goto done;
  if (cs->cand == QC_CAND_PLUGIN && (rc = qc_run_input(run, "plugin", cs->plugin))) goto done;
  if (eager && (cs->data != QC_DATA_DUMP || qc_shard_pattern(cs->dump))) {
    rc = qc_err("vjp: --eager '%s': case '%s' %s: --eager compares a dump written in an execution mode with the eager one",
                eager, case_path, cs->data != QC_DATA_DUMP ? "generates its data" : "reads a sharded dump");
    goto done;
  }
  if (eager && (rc = qc_run_input(run, "eager", eager))) goto done;
  /* --eager and the dump's mode are checked before the audit, so a wrong pair is refused at once (without
   * --eager the mode is checked after it, without opening the dump twice) */
  if (eager && (rc = qc_modes_check(cs->dump, eager))) goto done;
  const char *device = qc_opt_rank_device(o.device, devbuf, sizeof devbuf);
  qc_ctx ctx = {.profile = o.profile ? o.profile : "vllm", .ref_slices = ref_slices};
  late_open lo = {.device = device, .ctx = &ctx, .be = &be, .ref_slices = ref_slices};
  /* late where the audit reads one dump in one process with no split module, on a device; else here */
  const int late = device && strcmp(device, "cpu") != 0 && cs->data == QC_DATA_DUMP && !qc_shard_pattern(cs->dump) &&
                   !cs->has_split && qc_dist_size() < 2;
  if (!late && (rc = open_backend(&lo))) goto done;
  if (cs->has_split && (rc = qc_dist_device_begin(be))) goto done; /* split modules reduce through NCCL on a device */
  if (cs->cand == QC_CAND_PLUGIN && (rc = qc_plugin_open(cs->plugin, cs->symbol, &plugin))) goto done;
  qc_audit a = {.ctx = &ctx, .cs = cs, .plugin = plugin, .res = &res, .info = &mods};
  if (late) a.be_open = open_backend, a.be_arg = &lo;
  double tp = qc_now_s();
  rc = qc_vjp_case(&a, o.profile);
  if (!rc && !be) rc = open_backend(&lo); /* the loop never needed it: the report names the device all the same */
  if (rc || qc_dist_rank() != 0) goto done; /* rank 0 alone holds the merged results and reports them */
  phase("every module audited", &tp);
  /* the dump's execution mode, from its evidence and against the eager step (an eager dump: nothing to judge,
   * unless it holds a mode's evidence, which modes.c refuses) */
  if (cs->data == QC_DATA_DUMP && !qc_shard_pattern(cs->dump)) {
    if ((rc = qc_modes_audit(cs->dump, cs->modules_re, eager, &res, &mods))) goto done;
    phase("the execution mode judged", &tp);
  }
  if (res.n == 0) {
    rc = qc_err("case '%s': nothing was checked", case_path);
    goto done;
  }
  qc_report_info info = {.verb = "vjp", .case_name = cs->name, .case_path = case_path, .case_sha256 = cs->sha256,
                         .device = be->name, .profile = o.profile, .warnings = cs->nweak ? cs->weak : NULL,
                         .modules = &mods};
  if ((rc = qc_report_vjp(&out, &info, &res)) || (rc = qc_report_commit(&out))) goto done; /* all reports or none */
  phase("the reports written", &tp);
  qc_report_table(&info, &res);
  rc = qc_results_verdict(&res);
done:
  qc_report_out_free(&out);
  qc_plugin_close(plugin);
  qc_backend_close(be);
  qc_results_free(&res);
  qc_modinfos_free(&mods);
  free(cs);
  return rc;
}
