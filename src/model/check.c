/* results.c: the result list and atomic file writes (see check.h). */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "model/check.h"
#include "core/qc.h"

int qc_results_add(qc_results *r, const qc_check *c) {
  if (r->n == r->cap) {
    int cap = r->cap ? 2 * r->cap : 32;
    qc_check *nv = realloc(r->v, (size_t)cap * sizeof *nv);
    if (!nv) return qc_err_sys("out of memory recording checks");
    r->v = nv;
    r->cap = cap;
  }
  r->v[r->n++] = *c;
  return QC_OK;
}

void qc_results_free(qc_results *r) {
  free(r->v);
  memset(r, 0, sizeof *r);
}

int qc_results_verdict(const qc_results *r) {
  if (r->n == 0) return 2;
  for (int i = 0; i < r->n; i++)
    if (r->v[i].verdict != QC_V_PASS) return 1;
  return 0;
}

int qc_write_atomic(const char *path, const char *data, size_t n) {
  char tmp[1200];
  snprintf(tmp, sizeof tmp, "%s.tmp.%d", path, (int)getpid());
  FILE *f = fopen(tmp, "wb");
  if (!f) return qc_err("report '%s': cannot write: %s", path, strerror(errno));
  int ok = fwrite(data, 1, n, f) == n;
  ok = fflush(f) == 0 && ok;
  ok = fsync(fileno(f)) == 0 && ok;
  ok = fclose(f) == 0 && ok;
  if (!ok || rename(tmp, path) != 0) {
    int e = errno;
    unlink(tmp);
    return qc_err("report '%s': cannot write: %s", path, strerror(e));
  }
  return QC_OK;
}
