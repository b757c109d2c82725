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
  for (int i = 0; i < o->nextra; i++) {
    free(o->extra[i].path);
    qc_sbuf_free(&o->extra[i].doc);
  }
  free(o->extra);
  o->extra = NULL;
  o->nextra = o->capextra = 0;
}

int qc_report_add_file(qc_report_out *o, const char *path, qc_sbuf *doc) {
  if (o->nextra == o->capextra) {
    int cap = o->capextra ? 2 * o->capextra : 8;
    qc_report_file *nv = realloc(o->extra, (size_t)cap * sizeof *nv);
    if (!nv) return qc_err_sys("out of memory adding report file '%s'", path);
    o->extra = nv;
    o->capextra = cap;
  }
  char *p = strdup(path);
  if (!p) return qc_err_sys("out of memory adding report file '%s'", path);
  o->extra[o->nextra].path = p;
  o->extra[o->nextra].doc = *doc;
  memset(doc, 0, sizeof *doc);
  o->nextra++;
  return QC_OK;
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

/* Entry k of a commit: the report kinds first, then the added files. */
static const char *entry_path(const qc_report_out *o, int k) { return k < QC_REP_KINDS ? o->path[k] : o->extra[k - QC_REP_KINDS].path; }
static const qc_sbuf *entry_doc(const qc_report_out *o, int k) { return k < QC_REP_KINDS ? &o->doc[k] : &o->extra[k - QC_REP_KINDS].doc; }

int qc_report_commit(qc_report_out *o) {
  int n = QC_REP_KINDS + o->nextra, k, rc = QC_OK;
  char (*tmp)[1200] = calloc((size_t)n, sizeof *tmp);
  int *made = calloc((size_t)n, sizeof *made);
  if (!tmp || !made) {
    free(tmp);
    free(made);
    return qc_err_sys("out of memory writing the reports");
  }
  for (k = 0; k < n; k++) {
    const char *path = entry_path(o, k);
    const qc_sbuf *doc = entry_doc(o, k);
    if (!path) continue;
    if (doc->oom) { rc = qc_err_sys("out of memory rendering report '%s'", path); break; }
    snprintf(tmp[k], sizeof tmp[k], "%s.tmp.%d", path, (int)getpid());
    if (write_file(tmp[k], doc->s ? doc->s : "", doc->n) != 0) {
      rc = qc_err("report '%s': cannot write: %s", path, strerror(errno));
      unlink(tmp[k]);
      break;
    }
    made[k] = 1;
  }
  for (k = 0; !rc && k < n; k++) {
    if (!made[k]) continue;
    if (rename(tmp[k], entry_path(o, k)) != 0) rc = qc_err("report '%s': cannot write: %s", entry_path(o, k), strerror(errno));
    else made[k] = 2;
  }
  if (rc) /* none: no temporary left, and no requested path holds a report */
    for (k = 0; k < n; k++) {
      if (made[k] == 1) unlink(tmp[k]);
      if (entry_path(o, k)) remove_report(entry_path(o, k));
    }
  free(tmp);
  free(made);
  return rc;
}
