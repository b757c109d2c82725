/* atomic.c: whole-or-nothing report files (see report.h). */
#include <errno.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "core/qc.h"
#include "report/report.h"

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
