/* test_split.c: one module split across ranks (engine/split.c) without
 * MPI: the block sums of qc_mparts equal one pass over the whole; a group
 * of one reproduces the one-process production bit for bit; a class's
 * slices run by a simulated group of W ranks in one process (its
 * all-reduces done over the ranks' captured buffers, in rank order in
 * float64, as the host all-reduce does) give the one-process production's
 * gradients: the linear's rows and d_x from its partial sums, the
 * logprob's vocab-parallel columns. */
#include <criterion/criterion.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend/backend.h"
#include "engine/fd.h"
#include "engine/gen.h"
#include "model/module.h"
#include "core/qc.h"
#include "core/rng.h"
#include "numerics/decode.h"
#include "numerics/formats.h"
#include "numerics/metrics.h"

/* A [rows, cols] (g, r) pair with a bias along r. */
static void pair(int64_t rows, int64_t cols, double *g, double *r) {
  qc_rng rng;
  qc_rng_seed(&rng, 11);
  for (int64_t i = 0; i < rows * cols; i++) {
    r[i] = qc_rng_normal(&rng);
    g[i] = qc_round_to(r[i] * 1.001, QC_BF16);
  }
}

/* Sum the parts of blocks (W row blocks or W column blocks) and finish. */
static void by_blocks(const double *g, const double *r, int64_t rows, int64_t cols, int W, int by_cols, qc_metrics *m) {
  int64_t len = qc_mparts_len(rows, cols);
  double *sum = calloc((size_t)len, sizeof *sum), *p = calloc((size_t)len, sizeof *p), top[2] = {-1, -1};
  double *gb = malloc((size_t)(rows * cols) * sizeof *gb), *rb = malloc((size_t)(rows * cols) * sizeof *rb);
  cr_assert(sum && p && gb && rb);
  for (int w = 0; w < W; w++) {
    int64_t r0 = by_cols ? 0 : rows * w / W, r1 = by_cols ? rows : rows * (w + 1) / W;
    int64_t c0 = by_cols ? cols * w / W : 0, c1 = by_cols ? cols * (w + 1) / W : cols, k = 0;
    for (int64_t i = r0; i < r1; i++)
      for (int64_t j = c0; j < c1; j++, k++) gb[k] = g[i * cols + j], rb[k] = r[i * cols + j];
    double mx[2];
    memset(p, 0, (size_t)len * sizeof *p);
    qc_mparts_add(gb, rb, r0, r1, c0, c1, rows, cols, QC_BF16, p, mx);
    for (int64_t i = 0; i < len; i++) sum[i] += p[i];
    if (mx[0] > top[0] || (mx[0] == top[0] && mx[1] < top[1])) top[0] = mx[0], top[1] = mx[1];
  }
  qc_mparts_finish(sum, top, rows, cols, m);
  free(sum); free(p); free(gb); free(rb);
}

Test(split, block_sums_equal_one_pass) {
  const int64_t rows = 96, cols = 80;
  double *g = malloc(sizeof(double) * rows * cols), *r = malloc(sizeof(double) * rows * cols);
  cr_assert(g && r);
  pair(rows, cols, g, r);
  qc_metrics one, b;
  qc_metrics_compute(g, r, rows * cols, &one);
  cr_assert_eq(qc_bias_pass(g, r, rows, cols, QC_BF16, &one), QC_OK);
  for (int by = 0; by < 2; by++)
    for (int W = 1; W <= 5; W += 2) {
      by_blocks(g, r, rows, cols, W, by, &b);
      const double a[] = {one.rel_l2, one.norm_ratio, one.cosine, one.noise_floor, one.e_par, one.bias_sd, one.bias_z_raw};
      const double c[] = {b.rel_l2, b.norm_ratio, b.cosine, b.noise_floor, b.e_par, b.bias_sd, b.bias_z_raw};
      for (int k = 0; k < 7; k++)
        cr_assert(fabs(a[k] - c[k]) <= 1e-12 * fabs(a[k]) + 1e-300, "W=%d by %s: metric %d: %.17g vs %.17g", W,
                  by ? "columns" : "rows", k, a[k], c[k]);
      cr_assert_eq(b.max_abs, one.max_abs);
      cr_assert_eq(b.worst, one.worst, "W=%d: worst %lld vs %lld", W, (long long)b.worst, (long long)one.worst);
    }
  free(g);
  free(r);
}

/* A group of one (the all-reduce has nothing to add): the split path's
 * arithmetic alone. */
static int one_reduce(const qc_group *g, void *buf, int64_t n, qc_dtype dt, qc_redop op) {
  (void)g; (void)buf; (void)n; (void)dt; (void)op;
  return QC_OK;
}

/* The production of class cls under a group of one over [0, len) equals
 * the one-process production bit for bit, every gradient. */
static void same_as_whole(const char *cls, int n, const int64_t *shape, const char *const *sets, int64_t len) {
  static const char kinds[1][QC_NAMELEN] = {"random"};
  const qc_registry_row *row = qc_registry_find(cls);
  qc_module m;
  memset(&m, 0, sizeof m);
  cr_assert(row);
  m.cls = row->cls;
  for (int i = 0; sets && sets[i]; i++) cr_assert_eq(qc_fd_parse_set(&m.contract, sets[i]), QC_OK, "%s", qc_err_msg());
  cr_assert_eq(qc_gen_module(row, n, shape, 5, 0, "normal", kinds, 1, &m), QC_OK, "%s", qc_err_msg());
  const qc_tensor *dy = &m.grad_out.t[0];
  qc_group g = {.rank = 0, .size = 1, .lo = 0, .hi = len, .len = len, .allreduce = one_reduce};
  qc_ctx ctx = {.be = qc_backend_cpu(), .profile = "vllm"}, gctx = ctx;
  gctx.group = &g;
  qc_tset a = {0}, b = {0};
  cr_assert_eq(m.cls->production(&ctx, &m, dy, &a), QC_OK, "%s", qc_err_msg());
  cr_assert_eq(m.cls->production(&gctx, &m, dy, &b), QC_OK, "%s", qc_err_msg());
  cr_assert_eq(a.n, b.n);
  for (int j = 0; j < a.n; j++) {
    const qc_tensor *x = &a.t[j], *y = qc_tset_get(&b, x->name);
    cr_assert(y && x->nbytes == y->nbytes, "%s: %s", cls, x->name);
    cr_assert(memcmp(x->data, y->data, x->nbytes) == 0, "%s: the split path's %s differs from one process's", cls, x->name);
  }
  qc_tset_free(&a);
  qc_tset_free(&b);
  qc_module_free(&m);
}

Test(split, group_of_one_is_the_whole) {
  const char *lin[] = {NULL};
  const char *lp1[] = {"temperature=0.8", NULL};
  const char *lp4[] = {"vocab_shards=4", "normalization=mean_tokens", NULL};
  const int64_t ls[3] = {33, 96, 256}, ps[3] = {3, 9, 240};
  same_as_whole("linear", 3, ls, lin, 256);
  same_as_whole("logprob", 3, ps, lp1, 240);
  same_as_whole("logprob", 3, ps, lp4, 240); /* four shards of 60 on the one rank */
}

/* A simulated group of W ranks: pass p runs every rank; its all-reduce
 * call c < p is resolved from the buffers every rank gave at call c in
 * pass c, call c == p captures this rank's buffer, later calls are left
 * (their results are not used: the next pass runs again). */
typedef struct sim {
  int pass, call;
  float *cap[8][4];
} sim;

static int sim_reduce(const qc_group *g, void *buf, int64_t n, qc_dtype dt, qc_redop op) {
  sim *s = (sim *)g->arg;
  int c = s->call++;
  cr_assert_eq(dt, QC_F32);
  cr_assert(c < 4);
  float *b = buf;
  if (c == s->pass) {
    free(s->cap[g->rank][c]);
    s->cap[g->rank][c] = malloc((size_t)(n + 1) * sizeof(float));
    memcpy(s->cap[g->rank][c], b, (size_t)n * sizeof(float));
  } else if (c < s->pass) {
    for (int64_t i = 0; i < n; i++) {
      double acc = op == QC_RED_MAX ? -INFINITY : 0;
      for (int r = 0; r < g->size; r++) {
        double v = s->cap[r][c][i];
        acc = op == QC_RED_MAX ? fmax(acc, v) : acc + v;
      }
      b[i] = (float)acc;
    }
  }
  return QC_OK;
}

/* Module m's production run split over W simulated ranks (ncalls all-reduces
 * each): out[r] = rank r's gradients; lo[r] its slice's start. */
static void run_split(const qc_module *m, const qc_tensor *dy, int W, int ncalls, qc_tset *out, int64_t *lo) {
  const qc_split *sp = m->cls->split;
  int64_t len, align;
  cr_assert(sp);
  cr_assert_eq(sp->size(m, W, &len, &align), QC_OK, "%s", qc_err_msg());
  qc_module part[8];
  sim s;
  memset(&s, 0, sizeof s);
  for (int r = 0; r < W; r++) {
    lo[r] = len * r / W / align * align;
    int64_t hi = r + 1 < W ? len * (r + 1) / W / align * align : len;
    cr_assert_eq(sp->slice(m, lo[r], hi, &part[r]), QC_OK, "%s", qc_err_msg());
  }
  for (s.pass = 0; s.pass <= ncalls; s.pass++)
    for (int r = 0; r < W; r++) {
      int64_t hi = r + 1 < W ? lo[r + 1] : len;
      qc_group g = {.rank = r, .size = W, .lo = lo[r], .hi = hi, .len = len, .allreduce = sim_reduce, .arg = &s};
      qc_ctx ctx = {.be = qc_backend_cpu(), .profile = "vllm", .group = &g};
      qc_tset_free(&out[r]);
      s.call = 0;
      cr_assert_eq(m->cls->production(&ctx, &part[r], &part[r].grad_out.t[0], &out[r]), QC_OK, "%s", qc_err_msg());
      cr_assert_eq(s.call, ncalls, "rank %d made %d all-reduce(s), expected %d", r, s.call, ncalls);
    }
  for (int r = 0; r < W; r++) {
    qc_module_free(&part[r]);
    for (int c = 0; c < 4; c++) free(s.cap[r][c]);
  }
  (void)dy;
}

/* A generated instance of cls (one random dY) with the contract settings. */
static void make(const char *cls, int n, const int64_t *shape, const char *const *sets, qc_module *m) {
  static const char kinds[1][QC_NAMELEN] = {"random"};
  const qc_registry_row *row = qc_registry_find(cls);
  memset(m, 0, sizeof *m);
  cr_assert(row);
  m->cls = row->cls;
  for (int i = 0; sets && sets[i]; i++) cr_assert_eq(qc_fd_parse_set(&m->contract, sets[i]), QC_OK, "%s", qc_err_msg());
  cr_assert_eq(qc_gen_module(row, n, shape, 9, 0, "normal", kinds, 1, m), QC_OK, "%s", qc_err_msg());
}

Test(split, linear_over_four_ranks_is_the_whole) {
  const int64_t shape[3] = {37, 96, 250}; /* N = 250: uneven slices */
  const char *sets[] = {NULL};
  qc_module m;
  make("linear", 3, shape, sets, &m);
  qc_ctx ctx = {.be = qc_backend_cpu(), .profile = "vllm"};
  qc_tset whole = {0}, out[4] = {{0}};
  int64_t lo[4];
  cr_assert_eq(m.cls->production(&ctx, &m, &m.grad_out.t[0], &whole), QC_OK);
  run_split(&m, &m.grad_out.t[0], 4, 1, out, lo);
  const qc_tensor *wx = qc_tset_get(&whole, "d_x"), *ww = qc_tset_get(&whole, "d_weight"), *wb = qc_tset_get(&whole, "d_bias");
  int64_t flips = 0, n = qc_numel(wx);
  for (int r = 0; r < 4; r++) {
    const qc_tensor *x = qc_tset_get(&out[r], "d_x"), *w = qc_tset_get(&out[r], "d_weight"), *b = qc_tset_get(&out[r], "d_bias");
    cr_assert(x && w && b && qc_numel(x) == n);
    int64_t hi = r < 3 ? lo[r + 1] : 250;
    cr_assert(memcmp(w->data, (const uint16_t *)ww->data + lo[r] * 96, (size_t)((hi - lo[r]) * 96) * 2) == 0, "rank %d: d_weight rows", r);
    cr_assert(memcmp(b->data, (const uint16_t *)wb->data + lo[r], (size_t)(hi - lo[r]) * 2) == 0, "rank %d: d_bias", r);
    for (int64_t i = 0; i < n; i++) { /* the all-reduced partial sums: the whole's sum up to its float32 order */
      uint16_t a = ((const uint16_t *)wx->data)[i], c = ((const uint16_t *)x->data)[i];
      if (a == c) continue;
      cr_assert(abs((int)a - (int)c) == 1, "rank %d: d_x[%lld] %04x vs %04x: more than one bf16 step", r, (long long)i, a, c);
      flips += r == 0;
    }
  }
  cr_assert(flips * 100 <= n, "%lld of %lld d_x elements rounded to the other neighbour", (long long)flips, (long long)n);
  for (int r = 0; r < 4; r++) qc_tset_free(&out[r]);
  qc_tset_free(&whole);
  qc_module_free(&m);
}

Test(split, logprob_over_four_ranks_is_the_whole) {
  const int64_t shape[3] = {3, 9, 240};
  const char *sets[] = {"vocab_shards=4", "temperature=0.9", "normalization=mean_tokens", NULL};
  qc_module m;
  make("logprob", 3, shape, sets, &m);
  qc_ctx ctx = {.be = qc_backend_cpu(), .profile = "vllm"};
  qc_tset whole = {0}, out[4] = {{0}};
  int64_t lo[4];
  cr_assert_eq(m.cls->production(&ctx, &m, &m.grad_out.t[0], &whole), QC_OK);
  run_split(&m, &m.grad_out.t[0], 4, 2, out, lo); /* two all-reduces: the max, the sums */
  const float *w = qc_tset_get(&whole, "d_logits")->data;
  double worst = 0, scale = 0;
  for (int64_t i = 0; i < 27 * 240; i++) scale = fmax(scale, fabs(w[i]));
  for (int r = 0; r < 4; r++) {
    const qc_tensor *d = qc_tset_get(&out[r], "d_logits");
    cr_assert(d && d->shape[d->ndim - 1] == 60, "rank %d: its 60 columns", r);
    for (int64_t i = 0; i < 27; i++)
      for (int64_t j = 0; j < 60; j++) worst = fmax(worst, fabs(((const float *)d->data)[i * 60 + j] - w[i * 240 + lo[r] + j]));
  }
  cr_assert(worst <= 1e-6 * scale, "d_logits differ by %g (scale %g)", worst, scale);
  for (int r = 0; r < 4; r++) qc_tset_free(&out[r]);
  qc_tset_free(&whole);
  qc_module_free(&m);
}
