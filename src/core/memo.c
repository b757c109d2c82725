/* memo.c: see memo.h. */
#include "core/memo.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "core/par.h"

typedef struct memo_ent {
  const qc_tensor *t;
  char tag[96];
  int64_t n;
  float *v;
} memo_ent;

static _Thread_local struct {
  const qc_tset *sets[QC_MEMO_SETS];
  int nsets;
  int off; /* QATCHECK_MEMO=0: nothing kept (a side-by-side switch for the benchmarks), read at open */
  memo_ent *e;
  int n, cap;
  int64_t bytes;
} g_memo;

static _Atomic uint64_t g_gen = 1; /* scopes opened or closed, on every thread */

uint64_t qc_memo_gen(void) { return g_gen; }

int64_t qc_memo_budget(void) { return qc_host_memory() / 3; } /* read each time: see memo.h */

void qc_memo_scope(const qc_tset *const *sets, int n) {
  g_gen++;
  for (int i = 0; i < g_memo.n; i++) free(g_memo.e[i].v);
  free(g_memo.e);
  memset(&g_memo, 0, sizeof g_memo);
  for (int s = 0; s < n && s < QC_MEMO_SETS; s++) g_memo.sets[g_memo.nsets++] = sets[s];
  const char *e = n > 0 ? getenv("QATCHECK_MEMO") : NULL;
  g_memo.off = e && strcmp(e, "0") == 0;
}

/* 1 when t is an element of one of the scope's tensor sets. */
static int own(const qc_tensor *t) {
  for (int s = 0; t && s < g_memo.nsets; s++) {
    const qc_tset *q = g_memo.sets[s];
    if (q && q->n > 0 && (uintptr_t)t >= (uintptr_t)q->t && (uintptr_t)t < (uintptr_t)(q->t + q->n)) return 1;
  }
  return 0;
}

const float *qc_memo_get(const qc_tensor *t, const char *tag, int64_t n) {
  if (!own(t)) return NULL;
  for (int i = 0; i < g_memo.n; i++)
    if (g_memo.e[i].t == t && g_memo.e[i].n == n && strcmp(g_memo.e[i].tag, tag) == 0) return g_memo.e[i].v;
  return NULL;
}

int qc_memo_take(const qc_tensor *t, const char *tag, float *v, int64_t n) {
  if (g_memo.off || !own(t) || !v || n < 0 || strlen(tag) >= sizeof g_memo.e[0].tag || qc_memo_get(t, tag, n) ||
      g_memo.bytes + n * (int64_t)sizeof *v > qc_memo_budget())
    return 0;
  if (g_memo.n == g_memo.cap) {
    int cap = g_memo.cap ? 2 * g_memo.cap : 16;
    memo_ent *e = realloc(g_memo.e, (size_t)cap * sizeof *e);
    if (!e) return 0;
    g_memo.e = e, g_memo.cap = cap;
  }
  memo_ent *e = &g_memo.e[g_memo.n++];
  e->t = t;
  strcpy(e->tag, tag);
  e->n = n;
  e->v = v;
  g_memo.bytes += n * (int64_t)sizeof *v;
  return 1;
}

/* 1 when [p, p + bytes) lies inside [a, a + n). */
static int inside(const void *p, size_t bytes, const void *a, size_t n) {
  const uintptr_t u = (uintptr_t)p, b = (uintptr_t)a;
  return a && u >= b && bytes <= n && u - b <= n - bytes;
}

int qc_memo_holds(const void *p, size_t bytes) {
  if (g_memo.off || !p) return 0;
  for (int s = 0; s < g_memo.nsets; s++) {
    const qc_tset *q = g_memo.sets[s];
    for (int i = 0; q && i < q->n; i++)
      if (inside(p, bytes, q->t[i].data, q->t[i].nbytes)) return 1;
  }
  for (int i = 0; i < g_memo.n; i++)
    if (inside(p, bytes, g_memo.e[i].v, (size_t)g_memo.e[i].n * sizeof(float))) return 1;
  return 0;
}
