/* linear_plugin.c: a test plugin for the C ABI of include/qatcheck_plugin.h.
 * A linear VJP written as a third party would: bf16 operands, fp32
 * accumulation, bf16 results, plain loops. Exports:
 *   linear_vjp            correct
 *   linear_vjp_dw_scaled  d_weight scaled by 1.002 (a planted defect)
 *   linear_vjp_no_bias    never emits d_bias (a planted defect)
 *   linear_vjp_fails      reports an error (qatcheck must exit 2)
 *   linear_vjp_hangs      never returns (qatcheck's --timeout must end the run) */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "qatcheck_plugin.h"

static float bf2f(uint16_t h) {
  uint32_t u = (uint32_t)h << 16;
  float f;
  memcpy(&f, &u, 4);
  return f;
}

static uint16_t f2bf(float f) {
  uint32_t u;
  memcpy(&u, &f, 4);
  u += 0x7fffu + ((u >> 16) & 1u);
  return (uint16_t)(u >> 16);
}

static const qcp_tensor *find(const qcp_tensor *v, int n, const char *name) {
  for (int i = 0; i < n; i++)
    if (strcmp(v[i].name, name) == 0) return &v[i];
  return NULL;
}

static int fail(const qcp_call *c, const char *msg) {
  snprintf(c->err, c->err_len, "%s", msg);
  return 1;
}

/* The VJP with optional defects. */
static int vjp(const qcp_call *c, float dw_scale, int emit_bias) {
  if (c->abi != QATCHECK_PLUGIN_ABI) return fail(c, "abi mismatch");
  const qcp_tensor *x = find(c->inputs, c->n_inputs, "x"), *w = find(c->params, c->n_params, "weight");
  const qcp_tensor *b = find(c->params, c->n_params, "bias"), *dy = c->dy;
  if (!x || !w) return fail(c, "needs inputs/x and params/weight");
  if (x->dtype != QCP_BF16 || w->dtype != QCP_BF16 || dy->dtype != QCP_BF16) return fail(c, "expects bfloat16 tensors");
  int64_t K = x->shape[x->ndim - 1], N = w->shape[0], M = 1;
  for (int i = 0; i < x->ndim - 1; i++) M *= x->shape[i];
  const uint16_t *X = x->data, *W = w->data, *G = dy->data;
  float *acc = calloc((size_t)(M * K > N * K ? M * K : N * K) + (size_t)N, sizeof *acc);
  uint16_t *out = calloc((size_t)(M * K > N * K ? M * K : N * K) + (size_t)N, sizeof *out);
  if (!acc || !out) { free(acc); free(out); return fail(c, "out of memory"); }
  int rc = 0;
  /* d_x[m,k] = sum_n dy[m,n] w[n,k] */
  for (int64_t m = 0; m < M; m++)
    for (int64_t n = 0; n < N; n++) {
      float g = bf2f(G[m * N + n]);
      if (g == 0.0f) continue;
      for (int64_t k = 0; k < K; k++) acc[m * K + k] += g * bf2f(W[n * K + k]);
    }
  for (int64_t i = 0; i < M * K; i++) out[i] = f2bf(acc[i]);
  int64_t xs[2] = {M, K};
  rc |= c->emit(c->host, "d_x", QCP_BF16, x->ndim, x->ndim == 2 ? x->shape : xs, out);
  /* d_weight[n,k] = sum_m dy[m,n] x[m,k] */
  memset(acc, 0, (size_t)(N * K) * sizeof *acc);
  for (int64_t m = 0; m < M; m++)
    for (int64_t n = 0; n < N; n++) {
      float g = bf2f(G[m * N + n]);
      if (g == 0.0f) continue;
      for (int64_t k = 0; k < K; k++) acc[n * K + k] += g * bf2f(X[m * K + k]);
    }
  for (int64_t i = 0; i < N * K; i++) out[i] = f2bf(acc[i] * dw_scale);
  int64_t ws[2] = {N, K};
  rc |= c->emit(c->host, "d_weight", QCP_BF16, 2, ws, out);
  if (b && emit_bias) {
    for (int64_t n = 0; n < N; n++) acc[n] = 0;
    for (int64_t m = 0; m < M; m++)
      for (int64_t n = 0; n < N; n++) acc[n] += bf2f(G[m * N + n]);
    for (int64_t n = 0; n < N; n++) out[n] = f2bf(acc[n]);
    int64_t bs[1] = {N};
    rc |= c->emit(c->host, "d_bias", QCP_BF16, 1, bs, out);
  }
  free(acc);
  free(out);
  return rc ? fail(c, "emit refused a gradient") : 0;
}

/* The entry points a case names ("symbol"): qatcheck finds them by name
 * (dlsym); a plugin has no header of its own, so they are declared here. */
int linear_vjp(const qcp_call *c);
int linear_vjp_dw_scaled(const qcp_call *c);
int linear_vjp_no_bias(const qcp_call *c);
int linear_vjp_fails(const qcp_call *c);
int linear_vjp_hangs(const qcp_call *c);

int linear_vjp(const qcp_call *c) { return vjp(c, 1.0f, 1); }
int linear_vjp_dw_scaled(const qcp_call *c) { return vjp(c, 1.002f, 1); }
int linear_vjp_no_bias(const qcp_call *c) { return vjp(c, 1.0f, 0); }
int linear_vjp_fails(const qcp_call *c) { return fail(c, "the plugin could not run"); }
int linear_vjp_hangs(const qcp_call *c) {
  (void)c;
  for (;;) sleep(1);
}
