/* gpu_linear.c: the benchmark driver of bench/gpu_linear.sh. Runs the
 * in-memory linear audit (quantize W, candidate bf16 GEMMs, float64
 * reference GEMMs, metrics) on --device cuda[:N] for one shape and prints
 * "key value" lines: the audit's median time, its parts timed alone (the
 * floor), device copy and metrics bandwidth, upload time from pinned
 * memory. --ref-fast adds the fast reference (--reference fast, the Ozaki
 * scheme on int8 tensor cores) for 3 and 4 slices: its time against the
 * DGEMMs', the whole audit with it, its error against DGEMM (max and
 * normwise, absolute and relative to the noise floor), its self-check, and
 * the metrics' difference between the two audits; and the audit under
 * --reference auto (vjp's default): its time and the GEMM it ran for each
 * gradient (refauto_ lines). --conformance instead runs CUDA's FP8 conversions over all 2^32
 * float32 bit patterns against the spec's rule (a kernel) and against
 * qatcheck's CPU encoders. Exit 2 on bad input or no device. */
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "backend/backend.h"
#include "backend/cuda/cuda.h"
#include "numerics/formats.h"
#include "core/qc.h"
#include "core/rng.h"

static double now_ms(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return t.tv_sec * 1e3 + t.tv_nsec / 1e6;
}

static int cmp_d(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return x < y ? -1 : x > y;
}

/* n bf16 values N(0, 1) * scale. */
static void fill(uint16_t *p, int64_t n, qc_rng *r, double scale) {
  for (int64_t i = 0; i < n; i++) p[i] = qc_f32_to_bf16((float)(qc_rng_normal(r) * scale));
}

/* One thread's share of a chunk: CPU encoder vs the device's bytes. */
typedef struct {
  int kind;
  uint64_t start, lo, hi;
  const uint8_t *gpu;
  unsigned long long mism;
  uint64_t first;
} conf_part;

static void *conf_cpu(void *arg) {
  conf_part *p = arg;
  p->mism = 0;
  for (uint64_t i = p->lo; i < p->hi; i++) {
    uint32_t u = (uint32_t)(p->start + i);
    float x;
    memcpy(&x, &u, 4);
    uint8_t c = p->kind ? qc_f32_to_e5m2(x) : qc_f32_to_e4m3(x);
    if (c != p->gpu[i] && !p->mism++) p->first = p->start + i;
  }
  return NULL;
}

/* All 2^32 patterns, both FP8 kinds, in 16 chunks each: CUDA's conversion
 * against the spec's rule in a kernel (on the device) and against
 * qatcheck's CPU encoders (src/numerics, 16 threads here). */
static int conformance(const qc_backend *be) {
  const char *names[2] = {"e4m3", "e5m2"};
  const uint64_t chunk = (uint64_t)1 << 28;
  enum { NT = 16 };
  uint8_t *buf = NULL;
  int rc = be->host_alloc(be, chunk, "conformance bytes", (void **)&buf);
  if (rc) return rc;
  for (int kind = 0; kind < 2 && !rc; kind++) {
    unsigned long long total = 0, cpu = 0;
    uint64_t first = 0;
    double t0 = now_ms();
    for (uint64_t c = 0; c < 16 && !rc; c++) {
      unsigned long long m = 0;
      if ((rc = qc_cuda_fp8_conformance(be, kind, buf, c * chunk, chunk, &m))) break;
      total += m;
      pthread_t th[NT];
      conf_part part[NT];
      for (int t = 0; t < NT; t++) {
        part[t] = (conf_part){kind, c * chunk, chunk * (uint64_t)t / NT, chunk * (uint64_t)(t + 1) / NT, buf, 0, 0};
        pthread_create(&th[t], NULL, conf_cpu, &part[t]);
      }
      for (int t = 0; t < NT; t++) {
        pthread_join(th[t], NULL);
        if (part[t].mism && !cpu) first = part[t].first;
        cpu += part[t].mism;
      }
    }
    printf("conformance_%s_inputs 4294967296\nconformance_%s_rule_mismatches %llu\n"
           "conformance_%s_cpu_mismatches %llu\nconformance_%s_ms %.1f\n",
           names[kind], names[kind], total, names[kind], cpu, names[kind], now_ms() - t0);
    if (cpu) printf("conformance_%s_first_cpu_mismatch 0x%08llx\n", names[kind], (unsigned long long)first);
  }
  be->host_free(be, buf);
  return rc;
}

/* --ref-fast: the fast reference for S = 3 and 4 against a float64 audit
 * of the same inputs, run here unfused (QC_CUDA_UNFUSED=1: at decode
 * shapes the fused audit never writes W_ref in float64, which the fast
 * reference's d_x and the comparison need); the fast audits are timed as
 * the audit runs (fused where it fuses). t: reps doubles of scratch. */
static int audit_unfused(const qc_backend *be, qc_linear_audit *a, qc_linear_audit_out *fo) {
  const char *env = getenv("QC_CUDA_UNFUSED"); /* as the backend read it at open */
  const int keep = env && strcmp(env, "1") == 0;
  memset(fo, 0, sizeof *fo);
  a->ref_slices = 0;
  int rc = qc_cuda_switch(be, "QC_CUDA_UNFUSED", 1);
  if (!rc) rc = be->audit_linear(be, a, fo);
  if (qc_cuda_switch(be, "QC_CUDA_UNFUSED", keep) && !rc) rc = QC_EINPUT;
  return rc;
}

/* The audit timed with the backend's switch env on (reps calls, median; off
 * after): "audit_TAG_ms",
 * its quantizer stage and its rel_l2s' relative difference from o's. */
static int side_by_side(const qc_backend *be, const qc_linear_audit *a, const qc_linear_audit_out *o, int reps, double *t,
                        const char *env, const char *tag) {
  qc_linear_audit_out os;
  int rc = QC_OK;
  memset(&os, 0, sizeof os);
  if ((rc = qc_cuda_switch(be, env, 1))) return rc;
  for (int i = 0; i < reps && !rc; i++) {
    double t0 = now_ms();
    rc = be->audit_linear(be, a, &os);
    t[i] = now_ms() - t0;
  }
  if (qc_cuda_switch(be, env, 0) && !rc) rc = QC_EINPUT;
  if (rc) return rc;
  qsort(t, (size_t)reps, sizeof *t, cmp_d);
  printf("audit_%s_ms %.4f\nstage_quant_%s_ms %.4f\n", tag, t[reps / 2], tag, os.ms_quant);
  printf("%s_dx_rel_l2_diff %.3g\n%s_dw_rel_l2_diff %.3g\n", tag, fabs(os.dx.rel_l2 - o->dx.rel_l2) / o->dx.rel_l2, tag,
         fabs(os.dw.rel_l2 - o->dw.rel_l2) / o->dw.rel_l2);
  return QC_OK;
}

static int bench_ref_fast(const qc_backend *be, qc_linear_audit *a, int reps, double *t) {
  int rc = QC_OK;
  qc_linear_audit_out fo;
  const qc_linear_audit_out *f = &fo;
  if ((rc = audit_unfused(be, a, &fo))) return rc;
  const double nf[2] = {f->dx.noise_floor, f->dw.noise_floor};
  const double cnt[2] = {(double)a->M * a->K, (double)a->N * a->K};
  const char *g[2] = {"dx", "dw"};
  for (int S = 3; S <= 4; S++) {
    qc_cuda_ref_bench r;
    qc_linear_audit_out o;
    if ((S > 3 && (rc = audit_unfused(be, a, &fo))) || (rc = qc_cuda_bench_ref(be, a, S, reps, &r))) return rc;
    printf("ref%d_dgemm2_ms %.4f\nref%d_fast2_ms %.4f\nref%d_check2_ms %.4f\nref%d_speedup %.3f\nref%d_fast_tflops %.1f\n", S,
           r.ms_dgemm2, S, r.ms_fast2, S, r.ms_check2, S, r.ms_dgemm2 / (r.ms_fast2 + r.ms_check2), S, r.fast_tops);
    for (int s = 0; s < 2; s++) {
      double rms = r.norm_ref[s] / sqrt(cnt[s]);
      printf("ref%d_%s_err_max_abs %.6g\nref%d_%s_err_max_of_nf_rms %.6g\nref%d_%s_err_rel_l2 %.6g\nref%d_%s_err_rel_l2_of_nf %.6g\n"
             "ref%d_%s_check_err %.6g\nref%d_%s_check_err_norm %.6g\nref%d_%s_check_gate %.6g\nref%d_%s_nonfinite %u\n",
             S, g[s], r.max_abs[s], S, g[s], r.max_abs[s] / (nf[s] * rms), S, g[s], r.rel_l2[s], S, g[s], r.rel_l2[s] / nf[s],
             S, g[s], r.check_err[s], S, g[s], r.check_err_norm[s], S, g[s], 1e-3 * r.check_noise_floor[s], S, g[s], r.nonfinite[s]);
    }
    /* the whole audit with the fast reference */
    a->ref_slices = S;
    memset(&o, 0, sizeof o);
    if ((rc = be->audit_linear(be, a, &o))) goto out; /* warm-up: the slices' buffer, the int8 plans */
    for (int i = 0; i < reps; i++) {
      double t0 = now_ms();
      if ((rc = be->audit_linear(be, a, &o))) goto out;
      t[i] = now_ms() - t0;
    }
    qsort(t, (size_t)reps, sizeof *t, cmp_d);
    printf("ref%d_audit_ms %.4f\nref%d_stage_ref_ms %.4f\nref%d_kept %d %d\nref%d_pairs %d %d\n", S, t[reps / 2], S, o.ms_ref, S,
           o.ref_fast[0], o.ref_fast[1], S, o.ref_pairs[0], o.ref_pairs[1]);
    const qc_metrics *q[2] = {&o.dx, &o.dw}, *p[2] = {&f->dx, &f->dw};
    for (int s = 0; s < 2; s++)
      printf("ref%d_%s_rel_l2 %.9g\nref%d_%s_rel_l2_float64 %.9g\nref%d_%s_rel_l2_diff %.3g\nref%d_%s_noise_floor_diff %.3g\n"
             "ref%d_%s_bias_z_diff %.3g\nref%d_%s_max_abs_diff %.3g\n",
             S, g[s], q[s]->rel_l2, S, g[s], p[s]->rel_l2, S, g[s], q[s]->rel_l2 - p[s]->rel_l2, S, g[s],
             q[s]->noise_floor - p[s]->noise_floor, S, g[s], q[s]->bias_z - p[s]->bias_z, S, g[s], q[s]->max_abs - p[s]->max_abs);
  }
  /* --reference auto (vjp's default): the whole audit, timed as above; which GEMM it ran for each
   * gradient (0: DGEMM, S: the fast reference) and whether it was kept. Its warm-up runs the probe. */
  {
    qc_linear_audit_out o;
    a->ref_slices = QC_REF_AUTO;
    memset(&o, 0, sizeof o);
    /* the warm-up says (stderr) the probed rates and each GEMM's predicted times */
    qc_verbose = 1;
    rc = be->audit_linear(be, a, &o);
    qc_verbose = 0;
    if (rc) goto out;
    for (int i = 0; i < reps; i++) {
      double t0 = now_ms();
      if ((rc = be->audit_linear(be, a, &o))) goto out;
      t[i] = now_ms() - t0;
    }
    qsort(t, (size_t)reps, sizeof *t, cmp_d);
    printf("refauto_audit_ms %.4f\nrefauto_ran %d %d\nrefauto_kept %d %d\nrefauto_pairs %d %d\n", t[reps / 2], o.ref_ran[0],
           o.ref_ran[1], o.ref_fast[0], o.ref_fast[1], o.ref_pairs[0], o.ref_pairs[1]);
    for (int s = 0; s < 2; s++)
      printf("refauto_%s_rel_l2_diff %.3g\n", g[s], (s ? o.dw.rel_l2 : o.dx.rel_l2) - (s ? f->dw.rel_l2 : f->dx.rel_l2));
  }
out:
  a->ref_slices = 0;
  return rc;
}

int main(int argc, char **argv) {
  const char *device = "cuda:0", *fmt = "fp8_block128";
  int64_t M = 8192, K = 7168, N = 4096;
  int reps = 7, conf = 0, ref_fast = 0, rc;
  double plant = 0; /* --plant-slowdown: each timed audit made this fraction longer */
  for (int i = 1; i < argc; i++) {
    if (!strcmp(argv[i], "--device") && i + 1 < argc) device = argv[++i];
    else if (!strcmp(argv[i], "--M") && i + 1 < argc) M = atoll(argv[++i]);
    else if (!strcmp(argv[i], "--K") && i + 1 < argc) K = atoll(argv[++i]);
    else if (!strcmp(argv[i], "--N") && i + 1 < argc) N = atoll(argv[++i]);
    else if (!strcmp(argv[i], "--fmt") && i + 1 < argc) fmt = argv[++i];
    else if (!strcmp(argv[i], "--reps") && i + 1 < argc) reps = atoi(argv[++i]);
    else if (!strcmp(argv[i], "--conformance")) conf = 1;
    else if (!strcmp(argv[i], "--ref-fast")) ref_fast = 1;
    else if (!strcmp(argv[i], "--plant-slowdown") && i + 1 < argc) plant = atof(argv[++i]);
    else {
      fprintf(stderr, "qatcheck: error: gpu_linear: unknown argument '%s'\n"
                      "usage: gpu_linear [--device cuda:N] [--M m --K k --N n] [--fmt F] [--reps R] [--conformance] [--ref-fast]\n"
                      "                  [--plant-slowdown F]\n", argv[i]);
      return 2;
    }
  }
  if (M < 1 || K < 1 || N < 1 || reps < 1 || reps > 64) {
    fprintf(stderr, "qatcheck: error: gpu_linear: M, K, N must be >= 1 and reps in 1..64\n");
    return 2;
  }
  const qc_backend *be = NULL;
  if ((rc = qc_backend_open(device, &be)) != QC_OK) {
    qc_err_print();
    return 2;
  }
  char name[160];
  printf("device %s\n", qc_cuda_device_name(be, name, sizeof name));
  if (conf) {
    rc = conformance(be);
    if (rc) qc_err_print();
    qc_backend_close(be);
    return rc ? 2 : 0;
  }
  size_t nx = (size_t)(M * K) * 2, nw = (size_t)(N * K) * 2, ny = (size_t)(M * N) * 2;
  uint16_t *hx = NULL, *hw = NULL, *hy = NULL;
  void *dx = NULL, *dw = NULL, *dy = NULL;
  double *t = calloc((size_t)reps, sizeof *t);
  qc_linear_audit_out o;
  qc_cuda_bench b;
  memset(&o, 0, sizeof o);
  memset(&b, 0, sizeof b);
  if ((rc = be->host_alloc(be, nx, "X", (void **)&hx)) || (rc = be->host_alloc(be, nw, "W", (void **)&hw)) ||
      (rc = be->host_alloc(be, ny, "dY", (void **)&hy)) || (rc = be->buf_alloc(be, nx, "X", &dx)) ||
      (rc = be->buf_alloc(be, nw, "W", &dw)) || (rc = be->buf_alloc(be, ny, "dY", &dy)))
    goto done;
  {
    qc_rng r;
    qc_rng_seed(&r, 20261129);
    fill(hx, M * K, &r, 1.0);
    fill(hw, N * K, &r, 1.0 / 84.66); /* 1/sqrt(K) at K = 7168 */
    fill(hy, M * N, &r, 1.0);
  }
  double t0 = now_ms();
  uint16_t probe;
  if ((rc = be->upload(be, dx, hx, nx)) || (rc = be->upload(be, dw, hw, nw)) || (rc = be->upload(be, dy, hy, ny)) ||
      (rc = be->download(be, &probe, dy, 2)))
    goto done;
  double up = now_ms() - t0;
  qc_linear_audit a = {.M = M, .K = K, .N = N, .x = dx, .w = dw, .dy = dy, .weight_format = fmt, .profile = "vllm"};
  if ((rc = be->audit_linear(be, &a, &o))) goto done; /* warm-up */
  for (int i = 0; i < reps; i++) {
    t0 = now_ms();
    if ((rc = be->audit_linear(be, &a, &o))) goto done;
    if (plant > 0) { /* a planted slowdown for the --check test: each call F longer */
      double el = now_ms() - t0;
      while (now_ms() - t0 < el * (1 + plant)) {}
    }
    t[i] = now_ms() - t0;
  }
  qsort(t, (size_t)reps, sizeof *t, cmp_d);
  if ((rc = qc_cuda_bench_parts(be, &a, reps, &b))) goto done;
  printf("shape %lld %lld %lld\nformat %s\nreps %d\n", (long long)M, (long long)K, (long long)N, fmt, reps);
  printf("audit_ms %.4f\naudit_min_ms %.4f\n", t[reps / 2], t[0]);
  printf("stage_quant_ms %.4f\nstage_cand_ms %.4f\nstage_ref_ms %.4f\nstage_metrics_ms %.4f\n", o.ms_quant, o.ms_cand,
         o.ms_ref, o.ms_metrics);
  printf("floor_dgemm2_ms %.4f\nfloor_bf16x2_ms %.4f\nfloor_ms %.4f\n", b.ms_dgemm2, b.ms_bf16x2, b.ms_dgemm2 + b.ms_bf16x2);
  {
    /* bytes the audit moves outside the GEMMs (quantize W, widen X and dY,
     * two metrics passes), at the measured copy bandwidth */
    double mk = (double)M * K, nk = (double)N * K, mn = (double)M * N;
    double bytes = nk * (2 + 8 + 2) + (mk + mn) * (2 + 8) + (mk + nk) * (2 + 8);
    printf("mem_bytes %.0f\nfloor_mem_ms %.4f\n", bytes, bytes / (b.copy_gbs * 1e6));
  }
  printf("dgemm_tflops %.2f\nbf16_tflops %.2f\n", b.dgemm_tflops, b.bf16_tflops);
  printf("copy_gbs %.1f\nmetrics_gbs %.1f\nmetrics_ms %.4f\n", b.copy_gbs, b.metrics_gbs, b.ms_metrics);
  printf("upload_ms %.3f\nupload_gbs %.1f\ndevice_gib %.3f\n", up, (nx + nw + ny) / (up * 1e6), o.device_bytes / 1073741824.0);
  printf("dx_rel_l2 %.6g\ndw_rel_l2 %.6g\ndx_noise_floor %.6g\ndw_noise_floor %.6g\n", o.dx.rel_l2, o.dw.rel_l2,
         o.dx.noise_floor, o.dw.noise_floor);
  /* side by side, each with an environment switch of the CUDA backend:
   * the element-wise block128 quantizer, d_weight's metrics on the
   * second stream */
  if ((rc = side_by_side(be, &a, &o, reps, t, "QC_CUDA_QK_SCALAR", "qscalar")) ||
      (rc = side_by_side(be, &a, &o, reps, t, "QC_CUDA_DW_EARLY", "dwearly")))
    goto done;
  if (ref_fast && (rc = bench_ref_fast(be, &a, reps, t))) goto done;
done:
  if (rc) qc_err_print();
  if (hx) be->host_free(be, hx);
  if (hw) be->host_free(be, hw);
  if (hy) be->host_free(be, hy);
  be->buf_free(be, dx);
  be->buf_free(be, dw);
  be->buf_free(be, dy);
  free(t);
  qc_backend_close(be);
  return rc ? 2 : 0;
}
