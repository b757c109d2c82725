/* contract.c: the `contract` verb, layer 2 (docs/contract.md):
 * `qatcheck contract --master-vs-dequant --dump CKPT.h5 [...]`, or
 * `--checkpoint FILE|DIR|INDEX.json [--dy DUMP.h5]` (safetensors). Parses the
 * options, runs the sweep (src/sweep/), writes the reports (all or none) and
 * prints the per-class table (report/contract.c), returns the verdict. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "backend/backend.h"
#include "cli/cli.h"
#include "core/qc.h"
#include "dist/dist.h"
#include "io/dump.h"
#include "io/safetensors.h"
#include "numerics/quant.h"
#include "report/report.h"
#include "report/run.h"
#include "sweep/sweep.h"

#define DEFAULT_WFMT "nvfp4,fp8_block128,mxfp8"
#define DEFAULT_TOKENS 512

/* The verb's --help: what it does and its options (p's table). */
static void help(const qc_opts *p) {
  printf("usage: qatcheck contract --master-vs-dequant --dump CKPT.h5 [options]\n"
         "       qatcheck contract --master-vs-dequant --checkpoint FILE|DIR|INDEX.json [--dy DUMP.h5] [options]\n\n"
         "Layer 2: for every linear module group of the dump (routed experts [E, N, K]: every expert),\n"
         "every dY and every precision combination, compares dX = dY W (master weight) with\n"
         "dX = dY dequant(quant(W)) (the weight the forward used), both in float64, and reports\n"
         "cosine, norm ratio and rel-L2 per layer and per class (layer index replaced by *).\n\n");
  qc_opts_help(p->opt, 28);
  fputs(QC_HELP_EXIT, stdout);
}

/* Is name one of the '|'-separated words of list? */
static int in_list(const char *name, const char *list) {
  size_t n = strlen(name);
  for (const char *p = list; *p;) {
    size_t w = strcspn(p, "|");
    if (w == n && strncmp(p, name, n) == 0) return 1;
    p += w + (p[w] == '|');
  }
  return 0;
}

/* Split a comma list of formats into names (pointing into buf, a copy of
 * val), each in `allowed` and implemented by the quantizer library. */
static int parse_formats(const char *opt, const char *val, const char *allowed, char *buf, size_t buflen,
                         const char **out, int *n) {
  if (snprintf(buf, buflen, "%s", val) >= (int)buflen) return qc_err("%s: list too long", opt);
  *n = 0;
  for (char *save = NULL, *t = strtok_r(buf, ",", &save); t; t = strtok_r(NULL, ",", &save)) {
    while (*t == ' ') t++;
    if (!in_list(t, allowed)) {
      qc_err("%s: unknown format '%s': expected a comma list of %s", opt, t, allowed);
      return QC_EINPUT;
    }
    if (!qc_quant_known(t)) return qc_err("%s: format '%s' is not implemented by this build's quantizer library", opt, t);
    for (int i = 0; i < *n; i++)
      if (strcmp(out[i], t) == 0) return qc_err("%s: format '%s' named twice", opt, t);
    if (*n == QC_SWEEP_MAXFMT) return qc_err("%s: more than %d formats", opt, QC_SWEEP_MAXFMT);
    out[(*n)++] = t;
  }
  if (*n == 0) return qc_err("%s: '%s': expected at least one format", opt, val);
  return QC_OK;
}

/* --tokens M: a generated dY's tokens (the range: the table's). */
static int opt_tokens(const qc_opt *o, double v) {
  ((qc_sweep_opts *)o->value)->tokens = (int64_t)v;
  return QC_OK;
}

/* --seed S: at most 2^53 (the table's range), as the report records the seed as a JSON number, exactly. */
static int opt_seed(const qc_opt *o, double v) {
  ((qc_sweep_opts *)o->value)->seed = (uint64_t)v;
  return QC_OK;
}

/* --cosine-min X: in [-1, 1] (the table's range). */
static int opt_cos_min(const qc_opt *o, double v) {
  qc_sweep_opts *s = o->value;
  s->cos_min = v;
  s->has_cos_min = 1;
  return QC_OK;
}

/* --norm-ratio LO,HI: each in the entry's range (above 0), LO <= HI. */
static int opt_norm_ratio(const qc_opt *o, const char *v) {
  qc_sweep_opts *s = o->value;
  char lo[64];
  const char *comma = strchr(v, ',');
  if (!comma || comma - v >= (int)sizeof lo) return qc_err("--norm-ratio '%s': expected LOW,HIGH", v);
  snprintf(lo, sizeof lo, "%.*s", (int)(comma - v), v);
  if (qc_opt_number(o, lo, &s->norm_lo) || qc_opt_number(o, comma + 1, &s->norm_hi)) return QC_EINPUT;
  if (!(s->norm_lo <= s->norm_hi)) return qc_err("--norm-ratio '%s': expected 0 < LOW <= HIGH", v);
  s->has_norm = 1;
  return QC_OK;
}

int qc_cmd_contract(qc_run *run, int argc, char **argv) {
  qc_common_opts co = {.run = run};
  const char *dump_path = NULL, *ckpt_path = NULL, *dy_path = NULL, *wlist = NULL, *alist = "none", *qcfg = NULL;
  int mvd = 0, rc;
  qc_sweep_opts o;
  memset(&o, 0, sizeof o);
  o.tokens = DEFAULT_TOKENS;
  qc_opt opts[] = {
      QC_OPT_GROUP("options:", 28),
      QC_OPT_BOOL("master-vs-dequant", &mvd, "the comparison to run (required; the only one so far)"),
      QC_OPT_STRING("dump", &dump_path, "PATH", "the checkpoint dump (HDF5, docs/interfaces.md section 2)"),
      QC_OPT_STRING("checkpoint", &ckpt_path, "PATH",
                    "a safetensors master checkpoint instead: a .safetensors file, a\n"
                    "folder, or a model.safetensors.index.json with its shards; every\n"
                    "'<module>.weight' [N, K] (and [E, N, K] under 'experts') of\n"
                    "BF16/F16/F32/F64, embeddings left out, is module '/<module>'"),
      QC_OPT_STRING("dy", &dy_path, "DUMP.h5",
                    "with --checkpoint: dY (grad_out/) and X (inputs/x) from the dump's\n"
                    "group of the module's path (one real batch: every module needs one)"),
      QC_OPT_STRING("quant-config", &qcfg, "FILE",
                    "with --checkpoint: the config.json whose quantization_config gives\n"
                    "each layer's deployed format (default: the checkpoint's own config.json)"),
      QC_OPT_STRING("modules", &o.modules, "REGEX", "only module groups whose path matches (POSIX extended)"),
      QC_OPT_STRING("weight-format", &wlist, "LIST",
                    "every layer under each of these weight formats instead of its own\n"
                    "deployed one (the contract's weight_format, the checkpoint's\n"
                    "quantization_config; where none is declared: " DEFAULT_WFMT ")\n"
                    "of: " QC_WEIGHT_FORMATS),
      QC_OPT_STRING("activation-format", &alist, "LIST",
                    "adds d_weight rows: dY^T X against dY^T dequant(quant(X)),\n"
                    "X from inputs/x or generated (default none); with deployed formats\n"
                    "each is crossed with each layer's weight format; of: " QC_ACT_FORMATS),
      {.type = QC_OT_NUMBER, .name = "tokens", .value = &o, .argh = "M", .num = opt_tokens, .lo = 1, .hi = 1 << 24,
       .flags = QC_OPT_HELPNUM | QC_OPT_WHOLE, .help_num = DEFAULT_TOKENS,
       .help = "tokens of a generated dY (modules without grad_out/; default %.0f);\n"
               "a dumped dY's (and X's) leading dimensions are its tokens"},
      {.type = QC_OT_NUMBER, .name = "seed", .value = &o, .argh = "S", .num = opt_seed, .lo = 0, .hi = 9007199254740992.0,
       .flags = QC_OPT_WHOLE, .help = "seed of generated dY and X (default 0)"},
      {.type = QC_OT_NUMBER, .name = "cosine-min", .value = &o, .argh = "X", .num = opt_cos_min, .lo = -1, .hi = 1,
       .help = "a row with cosine below X fails (exit 1)"},
      {.type = QC_OT_CALLBACK, .name = "norm-ratio", .value = &o, .argh = "LO,HI", .fn = opt_norm_ratio, .lo = 0,
       .hi = QC_NUM_HUGE, .flags = QC_OPT_ABOVE, .help = "a row with norm ratio outside [LO, HI] fails (exit 1)"},
      QC_OPT_TEXT("\nWithout thresholds the verb reports and exits 0. Outliers (docs/contract.md) are marked,\n"
                  "never failed.\n\n"
                  "Under mpirun -np N the module groups are split among the N processes by their GEMM\n"
                  "work (one GPU each with --device cuda); rank 0 reports (docs/distributed.md).\n"),
      QC_OPTS_COMMON(&co, QC_HELP_MARKDOWN | QC_HELP_PROFILE),
      QC_OPT_END(),
  };
  qc_opts p = {.verb = "contract", .opt = opts, .help = help, .run = run};
  rc = qc_opts_parse(&p, argc, argv);
  qc_opts_free(&p);
  if (rc || p.done) return rc;
  if (!mvd) {
    qc_err("contract: expected --master-vs-dequant (the comparison to run)");
    qc_hint("qatcheck contract --master-vs-dequant --dump CKPT.h5");
    return QC_EINPUT;
  }
  if (!dump_path == !ckpt_path) {
    qc_hint("qatcheck contract --master-vs-dequant --checkpoint model.safetensors.index.json");
    return qc_err("contract: expected --dump CKPT.h5 (HDF5) or --checkpoint PATH (safetensors)%s",
                  dump_path ? ", not both" : "");
  }
  if (dy_path && !ckpt_path) return qc_err("contract: --dy goes with --checkpoint (a --dump holds its own grad_out/)");
  if (qcfg && !ckpt_path) return qc_err("contract: --quant-config goes with --checkpoint (a --dump's modules declare their contract)");
  if (qcfg && wlist)
    return qc_err("contract: --quant-config and --weight-format both choose the weight formats: expected one of them");
  if (co.profile && !in_list(co.profile, QC_PROFILE_CHOICES))
    return qc_err("--profile '%s': unknown profile: expected one of %s", co.profile, QC_PROFILE_CHOICES);
  char wbuf[512], abuf[512];
  const int wgiven = wlist != NULL;
  if (!wlist) wlist = DEFAULT_WFMT;
  if ((rc = parse_formats("--weight-format", wlist, QC_WEIGHT_FORMATS, wbuf, sizeof wbuf, o.wfmt, &o.nw))) return rc;
  if ((rc = parse_formats("--activation-format", alist, QC_ACT_FORMATS, abuf, sizeof abuf, o.afmt, &o.na))) return rc;
  o.profile = co.profile; /* NULL: per module (its contract, its deployed bytes, else vllm) */
  o.deployed = wgiven ? 0 : -1; /* no --weight-format: each layer's deployed format where declared */
  char cfgbuf[4096];
  if (ckpt_path && !qcfg) qcfg = qc_st_config_of(ckpt_path, cfgbuf, sizeof cfgbuf);
  if (qcfg && access(qcfg, R_OK) != 0) return qc_err("--quant-config '%s': cannot read: %s", qcfg, strerror(errno));
  o.qconfig = qcfg;
  o.progress = !qc_quiet && isatty(2);

  const qc_backend *be = NULL;
  char devbuf[32];
  qc_dump *d = NULL;
  qc_st *st = NULL;
  qc_sweep s;
  qc_report_out out;
  memset(&s, 0, sizeof s);
  qc_run_out(run, &out, co.json, co.junit, co.markdown);
  if ((rc = qc_backend_open(qc_opt_rank_device(co.device, devbuf, sizeof devbuf), &be))) return rc;
  if ((rc = qc_dist_device_begin(be))) goto done; /* NCCL on a device, over the job's ranks */
  const char *hdf5 = ckpt_path ? dy_path : dump_path;
  if (hdf5 && access(hdf5, R_OK) != 0) {
    rc = qc_err("%s '%s': cannot read: %s", ckpt_path ? "--dy" : "--dump", hdf5, strerror(errno));
    goto done;
  }
  if (hdf5 && (rc = qc_dump_open(hdf5, &d))) goto done;
  if (hdf5 && (rc = qc_run_input(run, ckpt_path ? "dy" : "dump", hdf5))) goto done;
  if (ckpt_path && (rc = qc_st_open(ckpt_path, &st))) goto done;
  if ((rc = ckpt_path ? qc_contract_sweep_ckpt(st, d, be, &o, &s) : qc_contract_sweep(d, be, &o, &s))) goto done;
  if (qc_dist_rank() != 0) goto done; /* rank 0 alone holds every row and reports them */

  qc_contract_info ri = {.dump = ckpt_path ? ckpt_path : dump_path, .device = be->name, .profile = o.profile ? o.profile : "auto",
                         .modules = o.modules,
                 .wlist = wlist, .alist = alist, .o = &o};
  for (int i = 0; i < s.n; i++) {
    ri.fails += s.rows[i].fail;
    ri.outliers += s.rows[i].outlier;
  }
  if ((rc = qc_report_contract(&out, &ri, &s)) || (rc = qc_report_commit(&out))) goto done; /* every report or none */
  if (!qc_quiet) qc_report_contract_table(&ri, &s);
  if (qc_verbose)
    fprintf(stderr,
            "contract: %.3f s total: generate %.3f, read %.3f (waited %.3f), quantize %.3f, gemm %.3f (%.3g GFLOP), "
            "metrics %.3f (queueing %.3f), sync %.3f; %d unit(s) in flight\n",
            s.t_total, s.t_gen, s.t_read, s.t_wait, s.t_quant, s.t_gemm, s.gemm_flops * 1e-9, s.t_metrics, s.t_queue,
            s.t_sync, s.in_flight);
  rc = ri.fails ? QC_FAIL : QC_OK;
done:
  qc_report_out_free(&out);
  qc_sweep_free(&s);
  if (d) qc_dump_close(d);
  qc_st_close(st);
  qc_backend_close(be);
  return rc;
}
