/* test_gpu_linear.c: the linear audit on the GPU against the CPU path on
 * generated cases: the fused audit_linear op against the class pair
 * (production + reference on the CPU backend), the class pair run on the
 * CUDA backend, verdicts, references within 1e-12, determinism, a planted
 * defect caught on both. Skips without a device. */
#include <stdio.h>
#include <string.h>

#include "gpu_common.h"
#include "model/module.h"
#include "numerics/formats.h"
#include "numerics/quant.h"
#include "model/check.h"
#include "numerics/decode.h"

/* The linear class's registry row (its production VJP and reference). */
#define LIN (qc_registry_find("linear"))


/* A generated linear module [M, K, N] under weight format fmt, and its dY. */
typedef struct {
  qc_module m;
  qc_tensor dy;
  int64_t M, K, N;
} lin_case;

static void case_make(lin_case *c, int64_t M, int64_t K, int64_t N, const char *fmt, const char *values, uint64_t seed) {
  memset(c, 0, sizeof *c);
  qc_gen g = {.nshape = 4, .shape = {M, K, N, 0}, .seed = seed, .values = values};
  qc_rng r;
  qc_rng_seed(&r, seed);
  int nd;
  int64_t ds[QC_MAXDIM];
  snprintf(c->m.path, sizeof c->m.path, "gen/linear[%lldx%lldx%lld]", (long long)M, (long long)K, (long long)N);
  c->m.cls = qc_registry_find("linear")->cls;
  cr_assert_eq(qc_contract_set(&c->m.contract, "weight_format", fmt, 0, 0), QC_OK);
  cr_assert_eq(c->m.cls->generate(&g, &r, &c->m, &nd, ds), QC_OK, "%s", qc_err_msg());
  cr_assert_eq(qc_tensor_alloc(&c->dy, "dy", QC_BF16, nd, ds), QC_OK);
  uint16_t *d = c->dy.data;
  for (int64_t i = 0; i < M * N; i++) d[i] = qc_f32_to_bf16((float)qc_rng_normal(&r));
  c->M = M; c->K = K; c->N = N;
}

static void case_free(lin_case *c) {
  qc_module_free(&c->m);
  qc_tensor_free(&c->dy);
}

/* Run a VJP on backend be and return its grads. */
static void run_vjp(const qc_backend *be, qc_vjp_fn f, const lin_case *c, qc_tset *out) {
  qc_ctx ctx = {.be = be, .profile = "vllm"};
  memset(out, 0, sizeof *out);
  cr_assert_eq(f(&ctx, &c->m, &c->dy, out), QC_OK, "%s", qc_err_msg());
}

/* Device copies of X, W, dY. */
typedef struct { void *x, *w, *dy, *dxc, *dwc; } dev_in;

static void dev_upload(const qc_backend *be, const lin_case *c, dev_in *d) {
  const qc_tensor *x = qc_tset_get(&c->m.inputs, "x"), *w = qc_tset_get(&c->m.params, "weight");
  memset(d, 0, sizeof *d);
  cr_assert_eq(be->buf_alloc(be, x->nbytes, "x", &d->x), QC_OK, "%s", qc_err_msg());
  cr_assert_eq(be->buf_alloc(be, w->nbytes, "w", &d->w), QC_OK, "%s", qc_err_msg());
  cr_assert_eq(be->buf_alloc(be, c->dy.nbytes, "dy", &d->dy), QC_OK, "%s", qc_err_msg());
  cr_assert_eq(be->upload(be, d->x, x->data, x->nbytes), QC_OK);
  cr_assert_eq(be->upload(be, d->w, w->data, w->nbytes), QC_OK);
  cr_assert_eq(be->upload(be, d->dy, c->dy.data, c->dy.nbytes), QC_OK);
}

static void dev_free(const qc_backend *be, dev_in *d) {
  be->buf_free(be, d->x); be->buf_free(be, d->w); be->buf_free(be, d->dy);
  be->buf_free(be, d->dxc); be->buf_free(be, d->dwc);
}

/* Metrics of a bf16 candidate tensor against a float64 one, on the CPU. */
static void cpu_metrics(const qc_tensor *cand, const qc_tensor *ref, qc_metrics *m) {
  int64_t n = qc_numel(ref);
  double *g = malloc((size_t)n * 8);
  cr_assert_eq(qc_tensor_to_f64(cand, g), QC_OK);
  qc_metrics_compute(g, ref->data, n, m);
  int64_t cols = ref->shape[ref->ndim - 1];
  cr_assert_eq(qc_bias_pass(g, ref->data, n / cols, cols, QC_BF16, m), QC_OK); /* the bias test, as the engine runs it */
  free(g);
}


/* The fused GPU audit against the CPU class pair, one case. */
static void audit_vs_cpu(const qc_backend *be, int64_t M, int64_t K, int64_t N, const char *fmt, const char *values) {
  lin_case c;
  case_make(&c, M, K, N, fmt, values, (uint64_t)(M * 131 + K * 7 + N));
  const qc_backend *cpu = qc_backend_cpu();
  qc_tset pc, rc;
  run_vjp(cpu, LIN->cls->production, &c, &pc);
  run_vjp(cpu, LIN->reference, &c, &rc);
  qc_metrics cdx, cdw;
  cpu_metrics(qc_tset_get(&pc, "d_x"), qc_tset_get(&rc, "d_x"), &cdx);
  cpu_metrics(qc_tset_get(&pc, "d_weight"), qc_tset_get(&rc, "d_weight"), &cdw);

  dev_in d;
  dev_upload(be, &c, &d);
  qc_linear_audit a = {.M = M, .K = K, .N = N, .x = d.x, .w = d.w, .dy = d.dy, .weight_format = fmt, .profile = "vllm"};
  qc_linear_audit_out o, o2;
  memset(&o, 0, sizeof o);
  o.dx_ref = malloc((size_t)(M * K) * 8);
  o.dw_ref = malloc((size_t)(N * K) * 8);
  o.dx_out = malloc((size_t)(M * K) * 2);
  o.dw_out = malloc((size_t)(N * K) * 2);
  cr_assert_eq(be->audit_linear(be, &a, &o), QC_OK, "%s", qc_err_msg());
  /* references: float64 on both sides, different summation order only */
  double ex = gpu_rel(o.dx_ref, qc_tset_get(&rc, "d_x")->data, M * K);
  double ew = gpu_rel(o.dw_ref, qc_tset_get(&rc, "d_weight")->data, N * K);
  cr_expect(ex <= 1e-12 && ew <= 1e-12, "%s %s [%lld %lld %lld]: reference rel diff d_x %.3g d_weight %.3g", fmt, values,
            (long long)M, (long long)K, (long long)N, ex, ew);
  /* candidates: the same bf16 GEMM up to fp32 summation order, so metrics agree closely */
  cr_expect(fabs(o.dx.rel_l2 - cdx.rel_l2) <= 0.05 * cdx.rel_l2 + 1e-12, "d_x rel_l2 gpu %.6g cpu %.6g", o.dx.rel_l2, cdx.rel_l2);
  cr_expect(fabs(o.dw.rel_l2 - cdw.rel_l2) <= 0.05 * cdw.rel_l2 + 1e-12, "d_weight rel_l2 gpu %.6g cpu %.6g", o.dw.rel_l2, cdw.rel_l2);
  cr_expect(fabs(o.dx.norm_r - cdx.norm_r) <= 1e-12 * cdx.norm_r);
  cr_expect(fabs(o.dw.norm_r - cdw.norm_r) <= 1e-12 * cdw.norm_r);
  cr_expect_eq(o.dx.nonfinite, cdx.nonfinite);
  /* verdicts at a pass bound and a fail bound */
  for (int i = 0; i < 2; i++) {
    double tol = i ? 1e-2 : 1e-5;
    cr_expect_eq(gpu_verdict(&o.dx, tol), gpu_verdict(&cdx, tol), "d_x verdict at %g", tol);
    cr_expect_eq(gpu_verdict(&o.dw, tol), gpu_verdict(&cdw, tol), "d_weight verdict at %g", tol);
  }
  cr_expect_eq(gpu_verdict(&o.dx, 1e-2), QC_V_PASS, "builtin candidate d_x rel_l2 %.3g", o.dx.rel_l2);
  /* the bias test of the builtin candidate: computed on the device, in bounds on both */
  cr_expect(!isnan(o.dx.bias_z) && !isnan(o.dw.bias_z), "the fused audit computes the bias test");
  cr_expect(fabs(o.dw.bias_z) <= 5 && fabs(cdw.bias_z) <= 5, "d_weight bias z gpu %.3g cpu %.3g: a correct candidate",
            o.dw.bias_z, cdw.bias_z);
  cr_expect(fabs(o.dw.e_par - cdw.e_par) <= 8 * fmax(cdw.bias_sd, o.dw.bias_sd) + 1e-12,
            "d_weight e_par gpu %.3g cpu %.3g (sd %.3g): the same candidate up to float32 summation order", o.dw.e_par,
            cdw.e_par, cdw.bias_sd);
  /* determinism: a second run is bit-identical */
  memset(&o2, 0, sizeof o2);
  cr_assert_eq(be->audit_linear(be, &a, &o2), QC_OK, "%s", qc_err_msg());
  cr_expect_eq(memcmp(&o.dx, &o2.dx, sizeof o.dx), 0, "d_x metrics differ between runs");
  cr_expect_eq(memcmp(&o.dw, &o2.dw, sizeof o.dw), 0, "d_weight metrics differ between runs");

  /* a planted defect: d_x from the master weight under a dequant contract
   * (fmt != none), or d_x scaled by 1.05: caught on both backends */
  {
    const qc_tensor *gx = qc_tset_get(&pc, "d_x");
    qc_tensor bad = {0};
    cr_assert_eq(qc_tensor_copy(&bad, gx), QC_OK);
    uint16_t *b = bad.data;
    for (int64_t i = 0; i < M * K; i++) b[i] = qc_f32_to_bf16(1.05f * qc_bf16_to_f32(b[i]));
    cr_assert_eq(be->buf_alloc(be, bad.nbytes, "bad d_x", &d.dxc), QC_OK);
    cr_assert_eq(be->upload(be, d.dxc, bad.data, bad.nbytes), QC_OK);
    qc_linear_audit ab = a;
    ab.dx_cand = d.dxc;
    qc_linear_audit_out ob;
    memset(&ob, 0, sizeof ob);
    cr_assert_eq(be->audit_linear(be, &ab, &ob), QC_OK, "%s", qc_err_msg());
    qc_metrics cb;
    cpu_metrics(&bad, qc_tset_get(&rc, "d_x"), &cb);
    cr_expect_eq(gpu_verdict(&ob.dx, 1e-2), QC_V_FAIL, "planted d_x defect passed on the GPU (rel_l2 %.3g)", ob.dx.rel_l2);
    cr_expect_eq(gpu_verdict(&cb, 1e-2), QC_V_FAIL, "planted d_x defect passed on the CPU");
    cr_expect(fabs(ob.dx.rel_l2 - cb.rel_l2) <= 1e-12 * cb.rel_l2, "given candidate: gpu %.17g cpu %.17g", ob.dx.rel_l2, cb.rel_l2);
    /* the bias test on the same candidate: the same sums up to summation order, the same verdict */
    cr_expect(fabs(ob.dx.e_par - cb.e_par) <= 1e-9 * fabs(cb.e_par), "given candidate e_par: gpu %.17g cpu %.17g", ob.dx.e_par, cb.e_par);
    cr_expect(fabs(ob.dx.bias_sd - cb.bias_sd) <= 1e-6 * cb.bias_sd, "given candidate bias sd: gpu %.17g cpu %.17g", ob.dx.bias_sd, cb.bias_sd);
    cr_expect(fabs(ob.dx.noise_floor - cb.noise_floor) <= 1e-9 * cb.noise_floor, "noise floor: gpu %.17g cpu %.17g", ob.dx.noise_floor, cb.noise_floor);
    cr_expect(fabs(ob.dx.bias_z) > 5 && fabs(cb.bias_z) > 5, "a 5%% scale fails the bias test: gpu z %.3g cpu z %.3g", ob.dx.bias_z, cb.bias_z);
    cr_expect_eq(ob.dx.worst, cb.worst);
    qc_tensor_free(&bad);
  }
  free(o.dx_ref); free(o.dw_ref); free(o.dx_out); free(o.dw_out);
  dev_free(be, &d);
  qc_tset_free(&pc);
  qc_tset_free(&rc);
  case_free(&c);
}

/* Formats whose CPU quantizer exists on this branch (the CPU side needs it). */
static const char *const g_fmts[] = {"none", "fp8_block128", "fp8_block128_ue8m0", "fp8_channel", "nvfp4", "mxfp8", "mxfp4"};

Test(gpu_linear, fused_audit_matches_cpu, .timeout = 600) {
  const qc_backend *be = gpu_or_skip();
  int ran = 0;
  for (size_t f = 0; f < sizeof g_fmts / sizeof g_fmts[0]; f++) {
    if (!qc_quant_known(g_fmts[f])) continue;
    audit_vs_cpu(be, 37, 200, 130, g_fmts[f], "normal");
    audit_vs_cpu(be, 1, 256, 64, g_fmts[f], "normal");
    audit_vs_cpu(be, 300, 384, 257, g_fmts[f], "special");
    ran++;
  }
  cr_expect(ran >= 1);
  qc_backend_close(be);
}

/* The class pair itself run on the CUDA backend (gemm_bf16 / gemm_f64 seam
 * ops) gives the CPU's references and the same verdicts. */
Test(gpu_linear, class_pair_on_cuda_backend) {
  const qc_backend *be = gpu_or_skip(), *cpu = qc_backend_cpu();
  lin_case c;
  case_make(&c, 96, 320, 160, "none", "heavy_tail", 9);
  qc_tset pc, rc, pg, rg;
  run_vjp(cpu, LIN->cls->production, &c, &pc);
  run_vjp(cpu, LIN->reference, &c, &rc);
  run_vjp(be, LIN->cls->production, &c, &pg);
  run_vjp(be, LIN->reference, &c, &rg);
  const char *names[2] = {"d_x", "d_weight"};
  for (int i = 0; i < 2; i++) {
    const qc_tensor *r1 = qc_tset_get(&rc, names[i]), *r2 = qc_tset_get(&rg, names[i]);
    double e = gpu_rel(r2->data, r1->data, qc_numel(r1));
    cr_expect(e <= 1e-12, "%s reference rel diff %.3g", names[i], e);
    qc_metrics mc, mg;
    cpu_metrics(qc_tset_get(&pc, names[i]), r1, &mc);
    cpu_metrics(qc_tset_get(&pg, names[i]), r2, &mg);
    cr_expect_eq(gpu_verdict(&mc, 1e-2), gpu_verdict(&mg, 1e-2));
    cr_expect(fabs(mc.rel_l2 - mg.rel_l2) <= 0.05 * mc.rel_l2, "%s rel_l2 cpu %.4g gpu %.4g", names[i], mc.rel_l2, mg.rel_l2);
  }
  qc_tset_free(&pc); qc_tset_free(&rc); qc_tset_free(&pg); qc_tset_free(&rg);
  case_free(&c);
  qc_backend_close(be);
}

Test(gpu_linear, too_big_is_input_error_with_amount) {
  const qc_backend *be = gpu_or_skip();
  qc_err_clear();
  void *p = NULL;
  int rc = be->buf_alloc(be, (size_t)1 << 50, "a 1 PiB tensor", &p);
  cr_expect_eq(rc, QC_EINPUT);
  cr_expect(strstr(qc_err_msg(), "needs") && strstr(qc_err_msg(), "GiB"), "message: %s", qc_err_msg());
  qc_backend_close(be);
}

Test(gpu_linear, nonfinite_weight_refused) {
  const qc_backend *be = gpu_or_skip();
  lin_case c;
  case_make(&c, 8, 128, 16, "none", "normal", 3);
  qc_tensor *w = qc_tset_get_mut(&c.m.params, "weight");
  ((uint16_t *)w->data)[77] = 0x7fc0; /* NaN */
  dev_in d;
  dev_upload(be, &c, &d);
  qc_linear_audit a = {.M = 8, .K = 128, .N = 16, .x = d.x, .w = d.w, .dy = d.dy, .weight_format = "fp8_block128"};
  qc_linear_audit_out o;
  memset(&o, 0, sizeof o);
  qc_err_clear();
  cr_expect_eq(be->audit_linear(be, &a, &o), QC_EINPUT);
  cr_expect(strstr(qc_err_msg(), "non-finite") != NULL, "message: %s", qc_err_msg());
  dev_free(be, &d);
  case_free(&c);
  qc_backend_close(be);
}

/* Two metrics of the same candidate against references that differ only
 * in float64 summation order: equal to 1e-9 relative, the same worst index
 * and the same counts. */
static void expect_same_metrics(const qc_metrics *a, const qc_metrics *b, const char *what) {
  const double va[] = {a->rel_l2, a->norm_r, a->norm_g, a->cosine, a->noise_floor, a->e_par, a->bias_sd, a->max_abs};
  const double vb[] = {b->rel_l2, b->norm_r, b->norm_g, b->cosine, b->noise_floor, b->e_par, b->bias_sd, b->max_abs};
  const char *nm[] = {"rel_l2", "norm_r", "norm_g", "cosine", "noise_floor", "e_par", "bias_sd", "max_abs"};
  for (size_t i = 0; i < sizeof va / sizeof va[0]; i++)
    cr_expect(fabs(va[i] - vb[i]) <= 1e-9 * fabs(vb[i]) + 1e-300, "%s %s: fused %.17g unfused %.17g", what, nm[i], va[i], vb[i]);
  cr_expect_eq(a->nonfinite, b->nonfinite, "%s nonfinite", what);
  cr_expect(fabs(a->bias_z - b->bias_z) <= 1e-6 * fabs(b->bias_z) + 1e-9, "%s bias_z fused %.17g unfused %.17g", what, a->bias_z, b->bias_z);
}

/* Decode shapes (M <= 16): the reference d_x summed inside the block128
 * quantizer (W_ref never written in float64) gives the metrics the
 * materialized float64 reference gives, on every shape and format, with a
 * builtin and a planted candidate. */
Test(gpu_linear, decode_fusion_matches_materialized, .timeout = 600) {
  const qc_backend *be = gpu_or_skip();
  const char *fmts[] = {"fp8_block128", "fp8_block128_ue8m0", "none", "nvfp4"};
  const int64_t shapes[][3] = {{1, 256, 128}, {7, 200, 130}, {16, 384, 257}, {16, 1000, 520}, {3, 64, 16}, {16, 130, 2050}};
  for (size_t f = 0; f < sizeof fmts / sizeof fmts[0]; f++)
    for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++) {
      const int64_t M = shapes[s][0], K = shapes[s][1], N = shapes[s][2];
      if (!qc_quant_known(fmts[f])) continue;
      lin_case c;
      case_make(&c, M, K, N, fmts[f], s % 2 ? "special" : "normal", (uint64_t)(M * 17 + K * 3 + N));
      dev_in d;
      dev_upload(be, &c, &d);
      qc_linear_audit a = {.M = M, .K = K, .N = N, .x = d.x, .w = d.w, .dy = d.dy, .weight_format = fmts[f], .profile = "vllm"};
      for (int planted = 0; planted < 2; planted++) {
        qc_linear_audit_out of, ou;
        if (planted) { /* the builtin d_weight scaled by 1.02 (1.001 is below half a bf16 ulp: it would round away) */
          qc_linear_audit_out oc;
          memset(&oc, 0, sizeof oc);
          uint16_t *cw = malloc((size_t)(N * K) * 2);
          oc.dw_out = cw;
          cr_assert_eq(be->audit_linear(be, &a, &oc), QC_OK, "%s", qc_err_msg());
          for (int64_t i = 0; i < N * K; i++) cw[i] = qc_f32_to_bf16(1.02f * qc_bf16_to_f32(cw[i]));
          if (!d.dwc) cr_assert_eq(be->buf_alloc(be, (size_t)(N * K) * 2, "planted d_weight", &d.dwc), QC_OK);
          cr_assert_eq(be->upload(be, d.dwc, cw, (size_t)(N * K) * 2), QC_OK);
          free(cw);
          a.dw_cand = d.dwc;
        }
        memset(&of, 0, sizeof of);
        memset(&ou, 0, sizeof ou);
        gpu_switch(be, "QC_CUDA_UNFUSED", 0);
        cr_assert_eq(be->audit_linear(be, &a, &of), QC_OK, "%s", qc_err_msg());
        gpu_switch(be, "QC_CUDA_UNFUSED", 1);
        cr_assert_eq(be->audit_linear(be, &a, &ou), QC_OK, "%s", qc_err_msg());
        gpu_switch(be, "QC_CUDA_UNFUSED", 0);
        char what[160];
        snprintf(what, sizeof what, "%s [%lld %lld %lld]%s d_x", fmts[f], (long long)M, (long long)K, (long long)N,
                 planted ? " planted" : "");
        expect_same_metrics(&of.dx, &ou.dx, what);
        what[strlen(what) - 3] = 0;
        strcat(what, "d_weight");
        expect_same_metrics(&of.dw, &ou.dw, what);
        if (planted && N * K >= 100000)
          cr_expect(fabs(of.dw.bias_z) > 5, "%s: a 2%% scale passed the bias test (z %.3g)", what, of.dw.bias_z);
      }
      dev_free(be, &d);
      case_free(&c);
    }
  qc_backend_close(be);
}
