/* commit.c: a run's reports written all or none (see report.h). */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "core/qc.h"
#include "report/report.h"

void qc_report_out_init(qc_report_out *o, const char *json, const char *junit, const char *markdown) {
  memset(o, 0, sizeof *o);
  o->path[QC_REP_JSON] = json;
  o->path[QC_REP_JUNIT] = junit;
  o->path[QC_REP_MARKDOWN] = markdown;
}

int qc_report_wants(const qc_report_out *o, int kind) { return o->path[kind] != NULL; }

void qc_report_out_free(qc_report_out *o) {
  for (int k = 0; k < QC_REP_KINDS; k++) qc_sbuf_free(&o->doc[k]);
}

/* Write n bytes to a new file `tmp`, fsync'd. */
static int write_file(const char *tmp, const char *data, size_t n) {
  FILE *f = fopen(tmp, "wb");
  if (!f) return -1;
  int ok = fwrite(data, 1, n, f) == n;
  ok = fflush(f) == 0 && ok;
  ok = fsync(fileno(f)) == 0 && ok;
  ok = fclose(f) == 0 && ok;
  return ok ? 0 : -1;
}

int qc_write_atomic(const char *path, const char *data, size_t n) {
  char tmp[1200];
  snprintf(tmp, sizeof tmp, "%s.tmp.%d", path, (int)getpid());
  if (write_file(tmp, data, n) != 0 || rename(tmp, path) != 0) {
    int e = errno;
    unlink(tmp);
    return qc_err("report '%s': cannot write: %s", path, strerror(e));
  }
  return QC_OK;
}

/* Remove a requested report path if it holds a regular file. */
static void remove_report(const char *path) {
  struct stat st;
  if (lstat(path, &st) == 0 && S_ISREG(st.st_mode)) unlink(path);
}

int qc_report_commit(qc_report_out *o) {
  char tmp[QC_REP_KINDS][1200];
  int made[QC_REP_KINDS] = {0}, k, rc = QC_OK;
  for (k = 0; k < QC_REP_KINDS; k++) {
    if (!o->path[k]) continue;
    if (o->doc[k].oom) { rc = qc_err_sys("out of memory rendering report '%s'", o->path[k]); break; }
    snprintf(tmp[k], sizeof tmp[k], "%s.tmp.%d", o->path[k], (int)getpid());
    if (write_file(tmp[k], o->doc[k].s ? o->doc[k].s : "", o->doc[k].n) != 0) {
      rc = qc_err("report '%s': cannot write: %s", o->path[k], strerror(errno));
      unlink(tmp[k]);
      break;
    }
    made[k] = 1;
  }
  for (k = 0; !rc && k < QC_REP_KINDS; k++) {
    if (!made[k]) continue;
    if (rename(tmp[k], o->path[k]) != 0) rc = qc_err("report '%s': cannot write: %s", o->path[k], strerror(errno));
    else made[k] = 2;
  }
  if (rc) /* none: no temporary left, and no requested path holds a report */
    for (k = 0; k < QC_REP_KINDS; k++) {
      if (made[k] == 1) unlink(tmp[k]);
      if (o->path[k]) remove_report(o->path[k]);
    }
  return rc;
}
