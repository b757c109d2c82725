/* commit.c: a run's reports written all or none, and the error reports of a
 * run that cannot be judged (see report.h).
 *
 * Each report is first written whole to a temporary made with mkstemp in
 * its target's folder, named ".<target>.qctmp-<pid>-XXXXXX" (any path
 * length: nothing is a fixed-size buffer), fsync'd; only when every
 * temporary is written does the first rename happen. A signal during the
 * commit removes the temporaries; those of a run killed outright (SIGKILL)
 * are removed by the next commit into that folder once their process is
 * gone, so orphans never accumulate. */
#include <cjson/cJSON.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "core/qc.h"
#include "core/watchdog.h"
#include "report/baseline.h"
#include "report/report.h"
#include "report/tlist.h"

#define TMP_TAG ".qctmp-"

void qc_report_out_init(qc_report_out *o, const char *json, const char *junit, const char *markdown) {
  memset(o, 0, sizeof *o);
  o->path[QC_REP_JSON] = json;
  o->path[QC_REP_JUNIT] = junit;
  o->path[QC_REP_MARKDOWN] = markdown;
}

void qc_report_out_run(qc_report_out *o, const char *verb, qc_prov *prov, struct qc_gate *gate) {
  o->prov = prov;
  o->gate = gate;
  o->want_json = qc_baseline_applies(gate, verb);
}

void qc_report_out_html(qc_report_out *o, const char *html) { o->path[QC_REP_HTML] = html; }

int qc_report_wants(const qc_report_out *o, int kind) {
  return o->path[kind] != NULL || (kind == QC_REP_JSON && o->want_json);
}

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
  struct stat st; /* as a report path: a regular file or absent (a link is never followed nor replaced) */
  if (lstat(path, &st) == 0 && !S_ISREG(st.st_mode))
    return qc_err("plot '%s': is %s: a report file must be a regular file or absent", path,
                  S_ISLNK(st.st_mode) ? "a symbolic link" : S_ISDIR(st.st_mode) ? "a directory" : "not a regular file");
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

/* ---- temporaries ------------------------------------------------------------------- */

/* The temporaries of the commit in progress, for the signal handler. */
static char *volatile *volatile g_tmp;
static volatile int g_ntmp;

static void on_signal(int sig) {
  for (int k = 0; g_tmp && k < g_ntmp; k++)
    if (g_tmp[k]) unlink(g_tmp[k]);
  signal(sig, SIG_DFL);
  raise(sig);
}

static const int g_sigs[] = {SIGINT, SIGTERM, SIGHUP, SIGQUIT};
#define NSIGS ((int)(sizeof g_sigs / sizeof g_sigs[0]))

/* Install (on) or restore the commit's handlers. A signal another handler
 * already catches (the watchdog's: core/watchdog.h, which waits for this
 * commit to end) keeps that handler. */
static void guard(struct sigaction *old, int on) {
  for (int i = 0; i < NSIGS; i++) {
    if (on) {
      if (sigaction(g_sigs[i], NULL, &old[i]) != 0 || old[i].sa_handler != SIG_DFL) continue;
      struct sigaction sa;
      memset(&sa, 0, sizeof sa);
      sa.sa_handler = on_signal;
      sigemptyset(&sa.sa_mask);
      sigaction(g_sigs[i], &sa, &old[i]);
    } else {
      sigaction(g_sigs[i], &old[i], NULL);
    }
  }
}

char *qc_report_dir(const char *path) {
  const char *slash = strrchr(path, '/');
  if (!slash) return strdup(".");
  size_t n = slash == path ? 1 : (size_t)(slash - path);
  char *d = malloc(n + 1);
  if (d) {
    memcpy(d, path, n);
    d[n] = 0;
  }
  return d;
}

/* Write n bytes of data to a new temporary beside path, fsync'd, with the
 * permissions a new file gets; *tmp is its malloc'd name (NULL when none
 * was made). */
static int write_tmp(const char *path, const char *data, size_t n, char **tmp) {
  const char *slash = strrchr(path, '/');
  const char *base = slash ? slash + 1 : path;
  char *dir = qc_report_dir(path);
  *tmp = NULL;
  if (!dir) return -1;
  size_t len = strlen(dir) + 96;
  char *t = malloc(len);
  if (!t) { free(dir); return -1; }
  /* at most 40 bytes of the target's name: the temporary's own name stays
   * far below NAME_MAX whatever the target's */
  snprintf(t, len, "%s/.%.40s" TMP_TAG "%ld-XXXXXX", dir, base, (long)getpid());
  free(dir);
  int fd = mkstemp(t);
  if (fd < 0) { free(t); return -1; }
  *tmp = t;
  mode_t um = umask(0);
  umask(um);
  int ok = fchmod(fd, 0666 & ~um) == 0;
  for (size_t off = 0; ok && off < n;) {
    ssize_t w = write(fd, data + off, n - off);
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) { ok = 0; if (w == 0) errno = ENOSPC; break; }
    off += (size_t)w;
  }
  int e = errno;
  ok = ok && fsync(fd) == 0;
  if (ok) e = errno;
  ok = close(fd) == 0 && ok;
  if (!ok) errno = e ? e : EIO;
  return ok ? 0 : -1;
}

/* Remove the temporaries of runs that were killed before they could (their
 * process is gone and they are older than 10 s), in path's folder. */
static void sweep_orphans(const char *path) {
  char *dir = qc_report_dir(path);
  DIR *d = dir ? opendir(dir) : NULL;
  if (!d) { free(dir); return; }
  struct dirent *e;
  long self = (long)getpid();
  time_t now = time(NULL);
  while ((e = readdir(d)) != NULL) {
    const char *tag = e->d_name[0] == '.' ? strstr(e->d_name, TMP_TAG) : NULL;
    if (!tag) continue;
    char *end;
    long pid = strtol(tag + strlen(TMP_TAG), &end, 10);
    if (pid <= 0 || pid == self || *end != '-' || strlen(end + 1) != 6) continue;
    struct stat st;
    if (fstatat(dirfd(d), e->d_name, &st, AT_SYMLINK_NOFOLLOW) != 0 || !S_ISREG(st.st_mode) || st.st_uid != getuid() ||
        now - st.st_mtime < 10)
      continue;
    if (kill((pid_t)pid, 0) == -1 && errno == ESRCH) unlinkat(dirfd(d), e->d_name, 0);
  }
  closedir(d);
  free(dir);
}

/* Write docs[k] to path[k] for every k < n with a path: every temporary
 * first, then the renames. On failure *bad is the entry that failed,
 * nothing more is renamed and no temporary is left. */
static int commit_docs(const char *const *path, const qc_sbuf *docs, int n, int *bad) {
  char **tmp = calloc((size_t)n + 1, sizeof *tmp);
  struct sigaction old[NSIGS];
  int k, rc = QC_OK;
  *bad = -1;
  if (!tmp) return qc_err_sys("out of memory writing the reports");
  g_tmp = tmp;
  g_ntmp = n;
  guard(old, 1);
  for (k = 0; k < n && !rc; k++) {
    if (!path[k]) continue;
    if (docs[k].oom) { rc = qc_err_sys("out of memory rendering report '%s'", path[k]); *bad = k; break; }
    char *t = NULL;
    if (write_tmp(path[k], docs[k].s ? docs[k].s : "", docs[k].n, &t) != 0) {
      rc = qc_err("report '%s': cannot write: %s", path[k], strerror(errno));
      *bad = k;
    }
    tmp[k] = t;
  }
  for (k = 0; k < n && !rc; k++) {
    if (!tmp[k]) continue;
    if (rename(tmp[k], path[k]) != 0) {
      rc = qc_err("report '%s': cannot write: %s", path[k], strerror(errno));
      *bad = k;
      break;
    }
    char *t = tmp[k];
    tmp[k] = NULL;
    free(t);
  }
  for (k = 0; k < n; k++) {
    char *t = tmp[k];
    tmp[k] = NULL;
    if (t) unlink(t);
    free(t);
  }
  guard(old, 0);
  g_ntmp = 0;
  g_tmp = NULL;
  free(tmp);
  for (k = 0; k < n; k++)
    if (path[k]) sweep_orphans(path[k]);
  return rc;
}

int qc_report_commit(qc_report_out *o) {
  int rc = QC_OK, bad;
  if (o->want_json && o->doc[QC_REP_JSON].s && (rc = qc_baseline_apply(o))) return rc;
  /* the reports, then the files added to them (plots), in one commit */
  int n = QC_REP_KINDS + o->nextra;
  const char **path = calloc((size_t)n, sizeof *path);
  qc_sbuf *docs = calloc((size_t)n, sizeof *docs);
  if (!path || !docs) {
    free(path);
    free(docs);
    return qc_err_sys("out of memory writing the reports");
  }
  for (int k = 0; k < QC_REP_KINDS; k++) {
    path[k] = o->path[k];
    docs[k] = o->doc[k];
  }
  for (int i = 0; i < o->nextra; i++) {
    path[QC_REP_KINDS + i] = o->extra[i].path;
    docs[QC_REP_KINDS + i] = o->extra[i].doc;
  }
  qc_watchdog_hold(); /* a --timeout expiring now waits for the renames; once written, the verdict stands */
  rc = commit_docs(path, docs, n, &bad);
  qc_watchdog_release(rc == QC_OK);
  free(path);
  free(docs);
  return rc;
}

/* ---- error reports ------------------------------------------------------------------- */

/* The error report as JSON: the envelope (verdict "error", prov), the error and hint, totals. */
static int error_json(qc_sbuf *out, qc_prov *prov, const char *verb, const char *msg, const char *hint) {
  cJSON *root = qc_report_envelope(prov, verb, 2);
  if (!root) return qc_err_sys("out of memory");
  cJSON_AddStringToObject(root, "error", msg);
  if (hint[0]) cJSON_AddStringToObject(root, "hint", hint);
  qc_report_totals(root, 0, 0, 1);
  return qc_report_json_render(root, out);
}

/* The error report as JUnit: one <error> testcase named "run". */
static int error_junit(qc_sbuf *out, const char *verb, const char *msg, const char *hint) {
  qc_tlist l = {0};
  char suite[64], cls[64];
  snprintf(suite, sizeof suite, "qatcheck %s", verb);
  snprintf(cls, sizeof cls, "qatcheck.%s", verb);
  qc_sbuf m = {0};
  qc_sbuf_printf(&m, "%s%s%s", msg, hint[0] ? "; hint: " : "", hint);
  int rc = m.oom ? qc_err_sys("out of memory") : qc_tlist_add_error(&l, suite, cls, "run", m.s);
  if (!rc) rc = qc_tlist_junit(&l, verb, out);
  qc_tlist_free(&l);
  qc_sbuf_free(&m);
  return rc;
}

/* The error report as Markdown: the error, the hint, the version and the provenance. */
static void error_markdown(qc_sbuf *b, qc_prov *prov, const char *verb, const char *msg, const char *hint) {
  qc_sbuf_printf(b, "# qatcheck %s: error\n\nThe run could not be judged (exit status 2): nothing was checked, "
                    "and no earlier report stands in for this one.\n\n- error: ", verb);
  qc_sbuf_md(b, msg);
  qc_sbuf_printf(b, "\n");
  if (hint[0]) {
    qc_sbuf_printf(b, "- hint: ");
    qc_sbuf_md(b, hint);
    qc_sbuf_printf(b, "\n");
  }
  qc_report_tool_md(b);
  qc_prov_markdown(prov, b);
}

/* The error report as one HTML page: the error and the hint. */
static void error_html(qc_sbuf *b, const char *verb, const char *msg, const char *hint) {
  qc_sbuf_printf(b, "<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\"><title>qatcheck %s: error</title>"
                    "<style>body{font-family:sans-serif;margin:2em;max-width:60em}.e{color:#a00}</style></head>\n"
                    "<body><h1>qatcheck %s: <span class=\"e\">error</span></h1>\n<p>The run could not be judged (exit "
                    "status 2): nothing was checked, and no earlier report stands in for this one.</p>\n<p><b>error:</b> ",
                 verb, verb);
  qc_sbuf_xml(b, msg);
  if (hint[0]) {
    qc_sbuf_printf(b, "</p>\n<p><b>hint:</b> ");
    qc_sbuf_xml(b, hint);
  }
  qc_sbuf_printf(b, "</p>\n<p>qatcheck %s, source commit <code>", QC_VERSION);
  qc_sbuf_xml(b, qc_build_commit());
  qc_sbuf_printf(b, "</code></p>\n</body></html>\n");
}

void qc_report_error_commit(const char *verb, const char *const *want, qc_prov *prov) {
  const char *path[QC_REP_KINDS];
  qc_sbuf docs[QC_REP_KINDS];
  const char *msg = qc_err_msg()[0] ? qc_err_msg() : "the run could not be judged";
  char *m = strdup(msg), *h = strdup(qc_err_hint());
  int any = 0;
  memset(docs, 0, sizeof docs);
  for (int k = 0; k < QC_REP_KINDS; k++) any |= (path[k] = want[k]) != NULL;
  if (!any || !m || !h) goto done;
  if (path[QC_REP_JSON]) error_json(&docs[QC_REP_JSON], prov, verb, m, h);
  if (path[QC_REP_JUNIT]) error_junit(&docs[QC_REP_JUNIT], verb, m, h);
  if (path[QC_REP_MARKDOWN]) error_markdown(&docs[QC_REP_MARKDOWN], prov, verb, m, h);
  if (path[QC_REP_HTML]) error_html(&docs[QC_REP_HTML], verb, m, h);
  /* all or none as ever; whatever cannot take its error report is removed,
   * so no older report is left standing */
  for (int tries = 0; tries < QC_REP_KINDS; tries++) {
    int bad;
    if (commit_docs(path, docs, QC_REP_KINDS, &bad) == QC_OK || bad < 0) break;
    struct stat st;
    if (lstat(path[bad], &st) == 0 && S_ISREG(st.st_mode)) unlink(path[bad]);
    path[bad] = NULL;
  }
done:
  for (int k = 0; k < QC_REP_KINDS; k++) qc_sbuf_free(&docs[k]);
  free(m);
  free(h);
}
