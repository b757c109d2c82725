/* test_fd.c: finite differences agree with every class's float64 reference
 * over its contract variants, and catch a reference that is wrong. */
#include <criterion/criterion.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend/backend.h"
#include "class_harness.h"
#include "engine/fd.h"
#include "core/qc.h"

/* Run fd on a generated instance; returns the number of failing rows. */
static int fd_fails(const char *cls, const char *shape, const char *const *sets, qc_vjp_fn vjp) {
  h_inst in;
  qc_ctx ctx = {.be = qc_backend_cpu(), .profile = "vllm"};
  qc_fd_opts o;
  qc_fd_row *rows;
  int n, bad = 0;
  qc_fd_defaults(&o);
  h_make(&in, cls, shape, 5, "normal", sets);
  qc_err_clear();
  cr_assert_eq(qc_fd_check(&ctx, &in.m, in.row->cls->forward, vjp ? vjp : in.row->reference, &o, &rows, &n), QC_OK,
               "%s: %s", cls, qc_err_msg());
  cr_assert(n >= 3);
  for (int i = 0; i < n; i++) bad += !rows[i].pass;
  free(rows);
  h_free(&in);
  return bad;
}

typedef struct {
  const char *cls, *shape, *sets[5];
} fd_case;

static const fd_case cases[] = {
    {"rmsnorm", "7,33", {NULL}},
    {"rmsnorm", "3,200", {"eps=1e-2", NULL}},
    {"rmsnorm", "7,33", {"zero_centered=true", NULL}},
    {"layernorm", "7,33", {NULL}},
    {"layernorm", "4,17,0", {"eps=1e-3", NULL}},
    {"rope", "5,2,12", {NULL}},
    {"rope", "5,3,16", {"layout=interleaved", "inverse=yes", "position_offset=9", "rotary_dim=8", NULL}},
    {"rope", "4,1,10", {"layout=half", "rotary_dim=6", "theta=500", NULL}},
    {"swiglu", "9,21", {NULL}},
    {"swiglu", "9,21", {"limit=7", NULL}},
    {"swiglu", "9,21", {"limit=2", "at_limit=block", NULL}},
    {"relu2", "9,21", {NULL}},
    {"gelu", "9,21", {NULL}},
    {"gelu", "9,21", {"approximate=tanh", NULL}},
    {"logprob", "3,6,40", {NULL}},
    {"logprob", "3,6,40", {"normalization=mean_tokens", "temperature=0.7", NULL}},
    {"logprob", "4,5,24", {"normalization=mean_sequences", "vocab_shards=4", NULL}},
    {"router", "6,8,3", {NULL}},
    {"router", "6,8,3", {"score=softmax", "normalize=yes", NULL}},
    {"router", "6,8,3", {"score=sigmoid", "normalize=yes", "route_scale=2.5", NULL}},
    {"router", "6,8,3", {"score=sqrt_softplus", "normalize=yes", NULL}},
    {"router", "6,8,3", {"score=sigmoid", "normalize=yes", "n_group=4", "topk_group=2", NULL}},
    {"attention", "2,4,2,5,6", {NULL}},
    {"attention", "1,8,2,7,9", {"causal=false", "softmax_scale=0.3", NULL}},
    {"moe", "5,6,4,4,2", {NULL}},
    {"moe", "6,8,5,4,3", {"limit=1", NULL}},
    {"moe", "6,8,5,4,3", {"limit=1", "at_limit=block", NULL}},
    {"moe", "9,8,5,5,4", {"activation=relu2", NULL}},
    {"moe", "5,6,4,4,2", {"shared_experts=2", NULL}},
    {"moe", "6,8,5,4,3", {"shared_experts=1", "shared_gate=true", "limit=1", NULL}},
    {"moe", "9,8,5,5,4", {"activation=relu2", "shared_experts=1", "shared_gate=true", NULL}},
    {"ssd", "2,9,2,3,4", {NULL}},
    {"ssd", "2,11,3,3,4", {"initial_state=true", "chunk_size=4", NULL}},
    {"ssd", "2,9,2,3,4", {"d_skip=true", "chunk_size=4", NULL}},
    {"ssd", "2,9,4,3,4,2", {"chunk_size=4", NULL}},
    {"conv1d", "2,9,5,4", {NULL}},
    {"conv1d", "1,7,3,4,0", {NULL}},
};

/* Every class of the registry with a forward, at its own fd shape and
 * default contract (a class added to the table is swept without a line
 * here), then the contract variants above. */
Test(fd, agrees_with_every_reference) {
  int n;
  const qc_registry_row *r = qc_registry_rows(&n);
  const char *none[] = {NULL};
  for (int i = 0; i < n; i++) {
    if (!r[i].cls->forward) continue;
    cr_expect(r[i].cls->fd_shape != NULL, "class %s has a forward but no fd_shape", r[i].cls->name);
    if (r[i].cls->fd_shape)
      cr_expect_eq(fd_fails(r[i].cls->name, r[i].cls->fd_shape, none, NULL), 0, "fd disagrees on %s [%s]",
                   r[i].cls->name, r[i].cls->fd_shape);
  }
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++)
    cr_expect_eq(fd_fails(cases[i].cls, cases[i].shape, cases[i].sets, NULL), 0, "fd disagrees on %s [%s] %s",
                 cases[i].cls, cases[i].shape, cases[i].sets[0] ? cases[i].sets[0] : "");
}

/* A reference 1e-4 too large (a subtle scale error). */
static int scaled_ref(const qc_ctx *ctx, const qc_module *m, const qc_tensor *dy, qc_tset *grads) {
  int rc = qc_registry_find(m->cls->name)->reference(ctx, m, dy, grads);
  if (rc) return rc;
  double *d = grads->t[0].data;
  for (int64_t i = 0; i < qc_numel(&grads->t[0]); i++) d[i] *= 1.0001;
  return QC_OK;
}

/* A reference with one wrong sign, on its largest element. */
static int one_sign_ref(const qc_ctx *ctx, const qc_module *m, const qc_tensor *dy, qc_tset *grads) {
  int rc = qc_registry_find(m->cls->name)->reference(ctx, m, dy, grads);
  if (rc) return rc;
  double *d = grads->t[0].data;
  int64_t big = 0;
  for (int64_t i = 1; i < qc_numel(&grads->t[0]); i++)
    if (fabs(d[i]) > fabs(d[big])) big = i;
  d[big] = -d[big];
  return QC_OK;
}

Test(fd, catches_a_wrong_reference) {
  const char *none[] = {NULL};
  const char *clamp[] = {"limit=7", NULL};
  cr_expect_gt(fd_fails("rmsnorm", "7,33", none, scaled_ref), 0);
  cr_expect_gt(fd_fails("gelu", "9,21", none, one_sign_ref), 0);
  cr_expect_gt(fd_fails("swiglu", "9,21", clamp, one_sign_ref), 0);
  cr_expect_gt(fd_fails("router", "6,8,3", none, scaled_ref), 0);
  cr_expect_gt(fd_fails("logprob", "3,6,40", none, one_sign_ref), 0);
  cr_expect_gt(fd_fails("attention", "2,4,2,5,6", none, scaled_ref), 0);
  cr_expect_gt(fd_fails("attention", "2,4,2,5,6", none, one_sign_ref), 0);
  cr_expect_gt(fd_fails("ssd", "2,9,2,3,4", none, scaled_ref), 0);
  cr_expect_gt(fd_fails("ssd", "2,9,2,3,4", none, one_sign_ref), 0);
}

Test(fd, refuses_a_class_without_forward) {
  qc_ctx ctx = {.be = qc_backend_cpu(), .profile = "vllm"};
  qc_fd_opts o;
  qc_fd_row *rows;
  int n;
  qc_module m = {0};
  qc_fd_defaults(&o);
  snprintf(m.path, sizeof m.path, "gen/x");
  qc_err_clear();
  cr_expect_eq(qc_fd_check(&ctx, &m, NULL, qc_registry_find("linear")->reference, &o, &rows, &n), QC_EINPUT);
  cr_expect(strstr(qc_err_msg(), "forward") != NULL, "%s", qc_err_msg());
}
