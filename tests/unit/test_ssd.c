/* test_ssd.c: the builtin SSD VJP (chunked, float32) against the float64
 * reference (the sequential recurrence and its reverse scan): L = 1, L not a
 * multiple of the chunk, several chunk sizes, an initial state, a very long
 * decay and near-resets; planted defects in a copy of the chunked VJP
 * (ssd_defect.c, equal to the production one bit for bit with the defects
 * off; the chunk
 * boundary state not passed, the decay of the wrong time step, d_A without
 * its within-chunk term, d_dt without its x (x) B term, the D skip's
 * gradient forgotten, d_Bm, d_Cm summed over the wrong heads of a group,
 * under the z gate d_z left at 0 or the gate's effect on dY forgotten);
 * the D skip (d_skip); the z gate (z_gate); ngroups > 1 (Bm, Cm [B, L, G,
 * N]); fd; bad input. */
#include <criterion/criterion.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend/backend.h"
#include "class_harness.h"
#include "engine/fd.h"
#include "modules/classes.h"
#include "core/qc.h"
#include "ssd_defect.h"

#define SSD_TOL 2.34e-6        /* cases/ssd.json d_x, d_Bm, d_Cm, d_initial_state */
#define SSD_TOL_DT 9.35e-6     /* cases/ssd.json d_dt (d_A: 9.57e-6); the sweeps judge every tensor by it */
#define SSD_TOL_HEAVY 9.35e-6  /* heavy_tail (x, Bm, Cm up to 20x: d_Bm, d_Cm measured <= 1.6e-6) and special (near-resets, 1e-4 decay) */

Test(ssd, builtin_matches_reference) {
  const char *shapes[] = {"1,1,2,8,16", "2,63,3,16,32", "1,200,2,8,16", "2,37,3,5,7"};
  const char *dflt[] = {NULL};
  const char *init[] = {"initial_state=true", NULL};
  const char *c16[] = {"chunk_size=16", NULL};
  const char *c7[] = {"chunk_size=7", "initial_state=true", NULL};
  const char *skip[] = {"d_skip=true", "chunk_size=16", NULL};
  const char *gate[] = {"z_gate=true", "d_skip=true", "chunk_size=16", NULL};
  const char *const *sets[] = {dflt, init, c16, c7, skip, gate};
  h_sweep("ssd", shapes, 4, sets, 6, 501, SSD_TOL_DT, SSD_TOL_HEAVY);
}

static int d_ok(const qc_ctx *c, const qc_module *m, const qc_tensor *dy, qc_tset *g) {
  (void)c;
  return t_ssd_vjp_defect(m, dy, g, SSD_OK);
}
static int d_no_pass(const qc_ctx *c, const qc_module *m, const qc_tensor *dy, qc_tset *g) {
  (void)c;
  return t_ssd_vjp_defect(m, dy, g, SSD_NO_STATE_PASS);
}
static int d_off_by_one(const qc_ctx *c, const qc_module *m, const qc_tensor *dy, qc_tset *g) {
  (void)c;
  return t_ssd_vjp_defect(m, dy, g, SSD_DECAY_OFF_BY_ONE);
}
static int d_da_no_intra(const qc_ctx *c, const qc_module *m, const qc_tensor *dy, qc_tset *g) {
  (void)c;
  return t_ssd_vjp_defect(m, dy, g, SSD_DA_NO_INTRA);
}
static int d_ddt_no_xb(const qc_ctx *c, const qc_module *m, const qc_tensor *dy, qc_tset *g) {
  (void)c;
  return t_ssd_vjp_defect(m, dy, g, SSD_DDT_NO_XB);
}

static int d_no_d_grad(const qc_ctx *c, const qc_module *m, const qc_tensor *dy, qc_tset *g) {
  (void)c;
  return t_ssd_vjp_defect(m, dy, g, SSD_NO_D_GRAD);
}

static int d_no_d_param(const qc_ctx *c, const qc_module *m, const qc_tensor *dy, qc_tset *g) {
  (void)c;
  return t_ssd_vjp_defect(m, dy, g, SSD_NO_D_PARAM);
}

static int d_wrong_heads(const qc_ctx *c, const qc_module *m, const qc_tensor *dy, qc_tset *g) {
  (void)c;
  return t_ssd_vjp_defect(m, dy, g, SSD_GROUP_WRONG_HEADS);
}

static int d_z_no_dz(const qc_ctx *c, const qc_module *m, const qc_tensor *dy, qc_tset *g) {
  (void)c;
  return t_ssd_vjp_defect(m, dy, g, SSD_Z_NO_DZ);
}

static int d_z_ungated(const qc_ctx *c, const qc_module *m, const qc_tensor *dy, qc_tset *g) {
  (void)c;
  return t_ssd_vjp_defect(m, dy, g, SSD_Z_UNGATED_DX);
}

/* The defect copy with every defect off is the production VJP bit for bit:
 * each default, initial state, D skip, z gate, ngroups, chunk size (one
 * step, L not a multiple, beyond L) and special values (near-resets). */
Test(ssd, defect_copy_is_production) {
  static const struct { const char *shape, *values; const char *sets[4]; } c[] = {
      {"2,200,3,16,32", "normal", {NULL}},
      {"1,150,2,8,16", "normal", {"initial_state=true", NULL}},
      {"2,100,3,16,32", "heavy_tail", {"d_skip=true", "chunk_size=7", NULL}},
      {"2,70,3,8,16", "normal", {"z_gate=true", "d_skip=true", "chunk_size=16", NULL}},
      {"2,41,4,3,5,2", "normal", {"chunk_size=1", "initial_state=true", NULL}},
      {"1,37,6,4,8,3", "normal", {"chunk_size=1000", NULL}},
      {"1,200,3,16,32", "special", {NULL}},
  };
  qc_ctx ctx = {.be = qc_backend_cpu(), .profile = "vllm"};
  for (size_t i = 0; i < sizeof c / sizeof c[0]; i++) {
    h_inst in;
    qc_tset p = {0}, d = {0};
    h_make(&in, "ssd", c[i].shape, 900 + i, c[i].values, c[i].sets);
    cr_assert_eq(in.row->cls->production(&ctx, &in.m, &in.dy, &p), QC_OK, "%s", qc_err_msg());
    cr_assert_eq(t_ssd_vjp_defect(&in.m, &in.dy, &d, SSD_OK), QC_OK, "%s", qc_err_msg());
    cr_expect_eq(d.n, p.n, "case %zu: %d gradients, the production %d", i, d.n, p.n);
    for (int k = 0; k < p.n; k++) {
      const qc_tensor *a = &p.t[k], *b = qc_tset_get(&d, a->name);
      cr_assert(b && b->nbytes == a->nbytes, "case %zu: the copy has no %s of its size", i, a->name);
      cr_expect(memcmp(a->data, b->data, a->nbytes) == 0, "case %zu (%s %s): %s differs from the production VJP", i, c[i].shape,
                c[i].values, a->name);
    }
    qc_tset_free(&p);
    qc_tset_free(&d);
    h_free(&in);
  }
}

/* h_expect_fail, logging the worst rel_l2 the defect reached */
static void expect_fail(h_inst *in, qc_vjp_fn cand, const char *what, const char *tensor) {
  char fail[256];
  double w;
  h_compare(in, cand, SSD_TOL_DT, fail, sizeof fail, &w);
  cr_log_info("ssd defect %-36s fails on %s, worst rel_l2 %.3g", what, fail, w);
  h_expect_fail(in, cand, SSD_TOL_DT, tensor);
}

Test(ssd, planted_defects_fail_naming_tensor) {
  h_inst in;
  char fail[256];
  double w;
  /* L = 200 with the default chunk 64: four chunks, the last one of 8 steps */
  h_make(&in, "ssd", "2,200,3,16,32", 11, "normal", NULL);
  cr_expect_eq(h_compare(&in, d_ok, SSD_TOL_DT, fail, sizeof fail, &w), 1, "defect switch off fails on %s (%.3g)", fail, w);
  expect_fail(&in, d_no_pass, "chunk state not passed", "d_x");
  expect_fail(&in, d_off_by_one, "decay exp(dt_{t-1} A)", "d_x");
  expect_fail(&in, d_da_no_intra, "d_A without the within-chunk term", "d_A");
  expect_fail(&in, d_ddt_no_xb, "d_dt without the x (x) B term", "d_dt");
  h_free(&in);
  /* with an initial state: the within-chunk d_A defect still fails on d_A */
  const char *init[] = {"initial_state=true", NULL};
  h_make(&in, "ssd", "1,150,2,8,16", 12, "normal", init);
  expect_fail(&in, d_no_pass, "chunk state not passed (initial state)", "d_x");
  expect_fail(&in, d_da_no_intra, "d_A without the within-chunk term (initial state)", "d_A");
  h_free(&in);
  /* the D skip (Mamba-2's y += D x): a backward that forgets the skip path
   * D dy in d_x fails on d_x, one that leaves d_D at 0 on d_D; the correct
   * one passes */
  const char *skip[] = {"d_skip=true", NULL};
  h_make(&in, "ssd", "2,100,3,16,32", 14, "normal", skip);
  cr_expect_eq(h_compare(&in, d_ok, SSD_TOL_DT, fail, sizeof fail, &w), 1, "d_skip: correct fails on %s (%.3g)", fail, w);
  cr_expect(qc_tset_get(&in.m.inputs, "D") != NULL, "d_skip generates inputs/D");
  expect_fail(&in, d_no_d_grad, "D skip gradient forgotten", "d_x");
  expect_fail(&in, d_no_d_param, "d_D not accumulated", "d_D");
  h_free(&in);
  /* the z gate (the output y silu(z)): d_z left at 0 fails on d_z, dY not
   * gated before the scan's VJP fails on d_x; the correct one passes */
  const char *gate[] = {"z_gate=true", "d_skip=true", "chunk_size=16", NULL};
  h_make(&in, "ssd", "2,70,3,8,16", 15, "normal", gate);
  cr_expect_eq(h_compare(&in, d_ok, SSD_TOL_DT, fail, sizeof fail, &w), 1, "z_gate: correct fails on %s (%.3g)", fail, w);
  cr_expect(qc_tset_get(&in.m.inputs, "z") != NULL, "z_gate generates inputs/z");
  expect_fail(&in, d_z_no_dz, "d_z left at 0", "d_z");
  expect_fail(&in, d_z_ungated, "the gate's effect on dY forgotten", "d_x");
  h_free(&in);
  /* one chunk (L = 63 < 64): there is no boundary, so the no-pass defect is invisible there;
   * the shipped case's L = 200 is what catches it */
  h_make(&in, "ssd", "2,63,3,16,32", 13, "normal", NULL);
  cr_expect_eq(h_compare(&in, d_no_pass, SSD_TOL_DT, fail, sizeof fail, &w), 1, "one chunk: no-pass differs (%s)", fail);
  h_free(&in);
}

/* The chunking is rounding only: every chunk size, from 1 to beyond L, gives
 * the reference's gradients; L = 1 without an initial state has d_A = 0. */
Test(ssd, chunk_sizes_and_edges) {
  const char *cs[] = {"chunk_size=1", "chunk_size=2", "chunk_size=13", "chunk_size=64", "chunk_size=1000"};
  for (int i = 0; i < 5; i++) {
    const char *sets[] = {cs[i], NULL};
    h_inst in;
    h_make(&in, "ssd", "2,41,2,6,9", 30 + (uint64_t)i, "normal", sets);
    h_expect_pass(&in, SSD_TOL_DT);
    h_free(&in);
  }
  h_inst in;
  qc_ctx ctx = {.be = qc_backend_cpu(), .profile = "vllm"};
  qc_tset g = {0};
  h_make(&in, "ssd", "3,1,4,8,16", 7, "normal", NULL);
  h_expect_pass(&in, SSD_TOL);
  cr_assert_eq(in.row->cls->production(&ctx, &in.m, &in.dy, &g), QC_OK);
  const qc_tensor *dA = qc_tset_get(&g, "d_A");
  for (int64_t h = 0; h < 4; h++) cr_expect_eq(((float *)dA->data)[h], 0.0f, "L = 1, h_0 = 0: d_A[%lld] != 0", (long long)h);
  qc_tset_free(&g);
  h_free(&in);
  /* special values: head 0 decays by ~1e-4 a step, the last head resets every 7th step (dt A <= -14.7) */
  h_make(&in, "ssd", "1,200,3,16,32", 8, "special", NULL);
  const qc_tensor *dt = qc_tset_get(&in.m.inputs, "dt"), *A = qc_tset_get(&in.m.inputs, "A");
  const float *d = dt->data, *a = A->data;
  cr_expect(d[0] * a[0] > -1e-3f && d[3 * 3 + 2] * a[2] < -10.0f, "special values: long decay %g, reset %g", d[0] * a[0],
            d[3 * 3 + 2] * a[2]);
  h_expect_pass(&in, SSD_TOL_HEAVY);
  h_free(&in);
}

/* ngroups > 1 (Mamba-2's ngroups): Bm, Cm [B, L, G, N], head h reading
 * group h / (H/G). The production matches the reference for G = 2 with
 * H = 4, G = 3 with H = 6, G = H and a rank-4 G = 1; a backward that sums
 * d_Bm, d_Cm over the wrong heads (interleaved, h mod G) fails on d_Bm
 * while d_x, d_dt, d_A still pass; the same defect is invisible at G = 1. */
Test(ssd, ngroups) {
  const char *shapes[] = {"2,37,4,5,7,2", "1,70,6,4,8,3", "1,20,4,4,6,1", "2,41,4,3,5,4"};
  const char *dflt[] = {NULL};
  const char *c16[] = {"chunk_size=16", "initial_state=true", NULL};
  const char *skip[] = {"d_skip=true", "chunk_size=7", NULL};
  const char *const *sets[] = {dflt, c16, skip};
  h_sweep("ssd", shapes, 4, sets, 3, 601, SSD_TOL_DT, SSD_TOL_HEAVY);
  h_inst in;
  char fail[256];
  double w;
  h_make(&in, "ssd", "2,100,4,8,16,2", 15, "normal", NULL);
  const qc_tensor *bm = qc_tset_get(&in.m.inputs, "Bm");
  cr_assert(bm->ndim == 4 && bm->shape[2] == 2 && bm->shape[3] == 16, "Bm is [B, L, G, N]");
  cr_expect_eq(h_compare(&in, d_ok, SSD_TOL_DT, fail, sizeof fail, &w), 1, "ngroups 2: correct fails on %s (%.3g)", fail, w);
  expect_fail(&in, d_wrong_heads, "d_Bm, d_Cm summed over the wrong heads", "d_Bm");
  h_free(&in);
  h_make(&in, "ssd", "2,30,4,8,16", 16, "normal", NULL);
  cr_expect_eq(h_compare(&in, d_wrong_heads, SSD_TOL_DT, fail, sizeof fail, &w), 1, "one group: the heads defect differs (%s)", fail);
  h_free(&in);
  /* G not dividing H, Cm of another group count or rank: refused */
  h_make(&in, "ssd", "1,10,4,3,5,2", 17, "normal", NULL);
  h_expect_pass(&in, SSD_TOL);
  qc_tensor *b = qc_tset_get_mut(&in.m.inputs, "Bm"), *c = qc_tset_get_mut(&in.m.inputs, "Cm");
  b->shape[2] = 3;
  b->shape[3] = 10;
  c->shape[2] = 3;
  c->shape[3] = 10;
  h_expect_refused(&in, "inputs/Bm");
  b->shape[2] = 2;
  b->shape[3] = 5;
  c->shape[2] = 1;
  h_expect_refused(&in, "inputs/Cm");
  c->shape[2] = 2;
  c->shape[3] = 5;
  c->ndim = 3;
  c->shape[2] = 10;
  h_expect_refused(&in, "inputs/Cm");
  c->ndim = 4;
  c->shape[2] = 2;
  c->shape[3] = 5;
  h_expect_pass(&in, SSD_TOL);
  h_free(&in);
}

Test(ssd, fd_agrees) {
  static const char *const sets[][3] = {{NULL}, {"initial_state=true", "chunk_size=3", NULL}, {"d_skip=true", "chunk_size=4", NULL}};
  static const char *const shapes[] = {"2,9,2,3,4", "1,1,3,2,5", "1,12,1,4,3"};
  h_fd_agrees("ssd", shapes, 3, sets, 3, 21);
  static const char *const gshapes[] = {"2,9,4,3,4,2", "1,7,6,2,3,3"};
  h_fd_agrees("ssd", gshapes, 2, sets, 3, 31);
}

Test(ssd, bad_input_is_refused) {
  h_inst in;
  const char *init[] = {"initial_state=true", NULL};
  h_make(&in, "ssd", "2,10,3,4,5", 1, "normal", init);
  h_expect_pass(&in, SSD_TOL);
  /* A with a positive entry */
  qc_tensor *A = qc_tset_get_mut(&in.m.inputs, "A");
  float a1 = ((float *)A->data)[1];
  ((float *)A->data)[1] = 0.5f;
  h_expect_refused(&in, "inputs/A");
  ((float *)A->data)[1] = a1;
  /* dt negative */
  qc_tensor *dt = qc_tset_get_mut(&in.m.inputs, "dt");
  float d7 = ((float *)dt->data)[7];
  ((float *)dt->data)[7] = -0.1f;
  h_expect_refused(&in, "inputs/dt");
  ((float *)dt->data)[7] = d7;
  /* shape mismatches */
  dt->shape[2] = 2;
  h_expect_refused(&in, "inputs/dt");
  dt->shape[2] = 3;
  A->shape[0] = 4;
  h_expect_refused(&in, "inputs/A");
  A->shape[0] = 3;
  qc_tensor *bm = qc_tset_get_mut(&in.m.inputs, "Bm");
  bm->shape[1] = 9;
  h_expect_refused(&in, "inputs/Bm");
  bm->shape[1] = 10;
  qc_tensor *cm = qc_tset_get_mut(&in.m.inputs, "Cm");
  cm->shape[2] = 4;
  h_expect_refused(&in, "inputs/Cm");
  cm->shape[2] = 5;
  qc_tensor *h0 = qc_tset_get_mut(&in.m.inputs, "initial_state");
  h0->shape[3] = 4;
  h_expect_refused(&in, "initial_state");
  h0->shape[3] = 5;
  snprintf(h0->name, sizeof h0->name, "h0");
  h_expect_refused(&in, "initial_state");
  snprintf(h0->name, sizeof h0->name, "initial_state");
  /* chunk_size not a whole number >= 1 */
  qc_contract keep = in.m.contract;
  cr_assert_eq(qc_contract_set(&in.m.contract, "chunk_size", "", 0, 1), QC_OK);
  h_expect_refused(&in, "chunk_size");
  cr_assert_eq(qc_contract_set(&in.m.contract, "chunk_size", "", 2.5, 1), QC_OK);
  h_expect_refused(&in, "chunk_size");
  in.m.contract = keep;
  h_expect_pass(&in, SSD_TOL);
  h_free(&in);
  /* contract keys the class refuses, naming the key */
  const qc_class *cls = qc_registry_find("ssd")->cls;
  const char *bad[][2] = {{"initial_state", "maybe"}, {"chunk", "64"}, {"chunk_size", "big"}, {"D_skip", "true"}};
  for (int i = 0; i < 4; i++) {
    qc_contract c = {0};
    cr_assert_eq(qc_contract_set(&c, bad[i][0], bad[i][1], 0, 0), QC_OK);
    qc_err_clear();
    cr_expect_eq(qc_contract_validate(&c, cls->keys, "class 'ssd'"), QC_EINPUT, "%s=%s accepted", bad[i][0], bad[i][1]);
    cr_expect(strstr(qc_err_msg(), bad[i][0]) != NULL, "message '%s' does not name %s", qc_err_msg(), bad[i][0]);
  }
  qc_err_clear();
}
