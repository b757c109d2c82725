/* run.c: the run's provenance, report paths, inputs and baselines (run.h). */
#include "report/run.h"

#include <cjson/cJSON.h>
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "core/qc.h"
#include "core/watchdog.h"
#include "core/sha256.h"
#include "report/baseline.h"
#include "report/report.h"

typedef struct run_input {
  char *role, *path;
  long long size;
  dev_t dev;
  ino_t ino;
  char sha[65];
  int hashed;           /* 1: sha holds the digest; -1: could not (or cancelled) */
  int started;
  pthread_t th;
} run_input;

static struct {
  char verb[32];
  int argc;
  char **argv;
  const char *path[QC_REP_KINDS];  /* requested (pointers into argv) */
  int refused[QC_REP_KINDS];       /* failed its check: never written */
  int ninput;
  run_input **in;                  /* each its own allocation: a hashing thread holds it */
  int nbase;
  cJSON *base[16];
  char *base_path[16];
  int fail_on, nreg;
  double factor;
  qc_sbuf regs;                    /* the regression lines for the console */
} R = {.factor = 1.1};

static atomic_int g_cancel;        /* stop hashing: the run ends without a report that needs it */

static const char *const kind_opt[QC_REP_KINDS] = {"--json", "--junit", "--markdown", "--html"};

const char *qc_run_verb(void) { return R.verb; }

void qc_run_no_files(void) {
  for (int k = 0; k < QC_REP_KINDS; k++) R.refused[k] = 1;
}
const char *qc_run_path(int kind) { return kind >= 0 && kind < QC_REP_KINDS && !R.refused[kind] ? R.path[kind] : NULL; }

/* What a file type is called in a message. */
static const char *type_name(mode_t m) {
  return S_ISDIR(m) ? "a directory" : S_ISCHR(m) ? "a character device" : S_ISBLK(m) ? "a block device"
       : S_ISFIFO(m) ? "a FIFO" : S_ISSOCK(m) ? "a socket" : S_ISLNK(m) ? "a symbolic link" : "not a regular file";
}

/* A report path is a regular file or absent, in a folder we may write. */
static int check_report_path(int kind) {
  const char *opt = kind_opt[kind], *p = R.path[kind];
  struct stat st;
  if (!p[0]) return qc_err("%s '': expected a file path", opt);
  if (p[strlen(p) - 1] == '/') return qc_err("%s '%s': names a folder: a report path must be a regular file or absent", opt, p);
  if (lstat(p, &st) == 0) {
    if (!S_ISREG(st.st_mode))
      return qc_err("%s '%s': is %s: a report path must be a regular file or absent", opt, p, type_name(st.st_mode));
  } else if (errno != ENOENT) {
    return qc_err("%s '%s': cannot use: %s", opt, p, strerror(errno));
  }
  char *dir = qc_report_dir(p);
  if (!dir) return qc_err_sys("out of memory");
  int rc = QC_OK;
  if (stat(dir, &st) != 0 || !S_ISDIR(st.st_mode)) {
    rc = qc_err("%s '%s': folder '%s' does not exist", opt, p, dir);
    qc_hint("create it first (mkdir -p '%s')", dir);
  } else if (access(dir, W_OK | X_OK) != 0) {
    rc = qc_err("%s '%s': folder '%s' is not writable: %s", opt, p, dir, strerror(errno));
  }
  free(dir);
  for (int k = 0; !rc && k < kind; k++) {
    struct stat a, b;
    if (R.path[k] && (strcmp(R.path[k], p) == 0 ||
                      (stat(R.path[k], &a) == 0 && stat(p, &b) == 0 && a.st_dev == b.st_dev && a.st_ino == b.st_ino)))
      rc = qc_err("%s and %s name the same file '%s': each report needs its own path", kind_opt[k], opt, p);
  }
  return rc;
}

static void on_timeout(void *ctx, const char *msg, const char *hint);

int qc_run_begin(const char *verb, int argc, char **argv) {
  snprintf(R.verb, sizeof R.verb, "%s", verb);
  R.argc = argc;
  R.argv = argv;
  /* the report options, as qc_opt_value reads them: --opt V or --opt=V; the last wins */
  for (int i = 1; i < argc; i++)
    for (int k = 0; k < QC_REP_KINDS; k++) {
      size_t n = strlen(kind_opt[k]);
      if (strncmp(argv[i], kind_opt[k], n) != 0) continue;
      if (argv[i][n] == '=') R.path[k] = argv[i] + n + 1;
      else if (argv[i][n] == 0 && i + 1 < argc) R.path[k] = argv[++i];
      else continue;
      break;
    }
  /* --timeout starts now, before any option opens an input (--baseline is
   * read while the options are parsed; the parser re-arms it, a moment later) */
  for (int i = 1; i < argc; i++) {
    const char *t = NULL;
    if (strncmp(argv[i], "--timeout=", 10) == 0) t = argv[i] + 10;
    else if (strcmp(argv[i], "--timeout") == 0 && i + 1 < argc) t = argv[++i];
    char *end;
    double sec = t ? strtod(t, &end) : -1;
    if (t && end != t && !*end && isfinite(sec) && sec >= 0 && sec <= 1e9 && qc_watchdog_arm(sec) != QC_OK) return QC_ESYS;
  }
  int rc = QC_OK;
  qc_watchdog_hook(on_timeout, NULL);
  for (int k = 0; k < QC_REP_KINDS; k++) {
    if (!R.path[k]) continue;
    int r = check_report_path(k);
    if (r) {
      R.refused[k] = 1;
      if (!rc) rc = r;
    }
  }
  return rc;
}

/* ---- inputs ---------------------------------------------------------------------- */

static void *hash_thread(void *arg) {
  run_input *in = arg;
  int fd = open(in->path, O_RDONLY | O_NONBLOCK | O_CLOEXEC);
  in->hashed = -1;
  if (fd < 0) return NULL;
  size_t cap = 1 << 20;
  unsigned char *buf = malloc(cap);
  qc_sha256 c;
  qc_sha256_init(&c);
  ssize_t k = 0;
  while (buf && !atomic_load(&g_cancel) && (k = read(fd, buf, cap)) > 0) qc_sha256_update(&c, buf, (size_t)k);
  if (buf && k == 0 && !atomic_load(&g_cancel)) {
    qc_sha256_final_hex(&c, in->sha);
    in->hashed = 1;
  }
  free(buf);
  close(fd);
  return NULL;
}

/* Wait for every input's hash (from the main thread or the watchdog's:
 * each thread is joined once). */
static pthread_mutex_t g_join = PTHREAD_MUTEX_INITIALIZER;
static void join_hashes(void) {
  pthread_mutex_lock(&g_join);
  for (int i = 0; i < R.ninput; i++)
    if (R.in[i]->started) {
      pthread_join(R.in[i]->th, NULL);
      R.in[i]->started = 0;
    }
  pthread_mutex_unlock(&g_join);
}

/* --timeout expired (core/watchdog.h; on the watchdog's thread, while no
 * report is being committed): the requested paths get the error report,
 * as at any exit 2. */
static void on_timeout(void *ctx, const char *msg, const char *hint) {
  (void)ctx;
  qc_err_clear();
  qc_err("%s", msg);
  qc_hint("%s", hint);
  atomic_store(&g_cancel, 1);
  join_hashes();
  for (int i = 0; i < R.ninput; i++)
    if (R.in[i]->hashed != 1) R.in[i]->hashed = -1;
  qc_report_error_commit(R.verb[0] ? R.verb : "qatcheck");
}

static int add_input(const char *role, const char *path);

int qc_run_input(const char *role, const char *path) {
  qc_watchdog_hold(); /* the watchdog's error report reads the inputs */
  int rc = add_input(role, path);
  qc_watchdog_release(0);
  return rc;
}

static int add_input(const char *role, const char *path) {
  struct stat st;
  int fd = open(path, O_RDONLY | O_NONBLOCK | O_CLOEXEC);
  if (fd < 0) return qc_err("%s '%s': cannot read: %s", role, path, strerror(errno));
  int ok = fstat(fd, &st) == 0;
  close(fd);
  if (!ok || !S_ISREG(st.st_mode)) return qc_err("%s '%s': is %s, expected a regular file", role, path, type_name(st.st_mode));
  for (int i = 0; i < R.ninput; i++)
    if (R.in[i]->dev == st.st_dev && R.in[i]->ino == st.st_ino && strcmp(R.in[i]->role, role) == 0) return QC_OK;
  for (int k = 0; k < QC_REP_KINDS; k++) {
    struct stat rs;
    if (R.path[k] && !R.refused[k] && stat(R.path[k], &rs) == 0 && rs.st_dev == st.st_dev && rs.st_ino == st.st_ino) {
      R.refused[k] = 1; /* never written, not even with the error report */
      return qc_err("%s '%s' names the %s file '%s': a report would overwrite an input", kind_opt[k], R.path[k], role, path);
    }
  }
  run_input **nv = realloc(R.in, (size_t)(R.ninput + 1) * sizeof *nv);
  if (!nv) return qc_err_sys("out of memory recording input '%s'", path);
  R.in = nv;
  run_input *in = calloc(1, sizeof *in);
  if (in) {
    in->role = strdup(role);
    in->path = strdup(path);
  }
  if (!in || !in->role || !in->path) {
    if (in) {
      free(in->role);
      free(in->path);
    }
    free(in);
    return qc_err_sys("out of memory recording input '%s'", path);
  }
  R.in[R.ninput] = in;
  in->size = (long long)st.st_size;
  in->dev = st.st_dev;
  in->ino = st.st_ino;
  R.ninput++;
  if (pthread_create(&in->th, NULL, hash_thread, in) == 0) in->started = 1;
  else hash_thread(in); /* no thread: hash it here */
  return QC_OK;
}

/* ---- baselines --------------------------------------------------------------------- */

int qc_run_baseline(const char *path) {
  int is_report = strcmp(R.verb, "report") == 0;
  if (!is_report && !qc_baseline_known(R.verb))
    return qc_err("%s: --baseline is not supported: its reports hold no checks to compare", R.verb);
  if (R.nbase && !is_report) return qc_err("--baseline given twice: expected one baseline report for '%s'", R.verb);
  if (R.nbase == (int)(sizeof R.base / sizeof R.base[0])) return qc_err("--baseline: at most %d baselines", R.nbase);
  char *text = NULL;
  size_t n = 0;
  int rc0 = qc_report_read_text(path, "--baseline", &text, &n); /* a FIFO is refused unopened */
  if (rc0) return rc0;
  cJSON *j = cJSON_ParseWithLength(text, n);
  free(text);
  int rc = QC_OK;
  const cJSON *v = j ? cJSON_GetObjectItemCaseSensitive(j, "verb") : NULL;
  const cJSON *vd = j ? cJSON_GetObjectItemCaseSensitive(j, "verdict") : NULL;
  if (!j || !cJSON_IsObject(j) || !cJSON_GetObjectItemCaseSensitive(j, "qatcheck_report") || !cJSON_IsString(v))
    rc = qc_err("--baseline '%s': not a qatcheck JSON report (expected \"qatcheck_report\" and \"verb\")", path);
  else if (!is_report && strcmp(v->valuestring, R.verb) != 0)
    rc = qc_err("--baseline '%s': is a '%s' report, expected a '%s' report", path, v->valuestring, R.verb);
  else if (cJSON_IsString(vd) && strcmp(vd->valuestring, "error") == 0)
    rc = qc_err("--baseline '%s': is the error report of a run that could not be judged: it holds no checks", path);
  if (!rc) rc = qc_run_input("baseline", path);
  if (rc) {
    cJSON_Delete(j);
    return rc;
  }
  R.base_path[R.nbase] = strdup(path);
  R.base[R.nbase++] = j;
  return QC_OK;
}

int qc_run_fail_on(const char *what) {
  if (strcmp(what, "regression") != 0) return qc_err("--fail-on '%s': expected 'regression'", what);
  R.fail_on = 1;
  return QC_OK;
}

int qc_run_regression_factor(const char *v) {
  char *end;
  errno = 0;
  double f = strtod(v, &end);
  if (!*v || *end || errno || !(f > 1) || !isfinite(f)) return qc_err("--regression-factor '%s': expected a number > 1", v);
  R.factor = f;
  return QC_OK;
}

int qc_run_nbaselines(void) { return R.nbase; }
const cJSON *qc_run_baseline_json(int i) { return i >= 0 && i < R.nbase ? R.base[i] : NULL; }
const char *qc_run_baseline_path(int i) { return i >= 0 && i < R.nbase ? R.base_path[i] : NULL; }
double qc_run_factor(void) { return R.factor; }
int qc_run_fails_on_regression(void) { return R.fail_on; }

void qc_run_regressions(int n, const char *summary) {
  R.nreg += n;
  if (summary && summary[0]) qc_sbuf_printf(&R.regs, "%s", summary);
}

/* ---- provenance ------------------------------------------------------------------------ */

void qc_run_json(cJSON *root) {
  cJSON *cl = cJSON_AddArrayToObject(root, "command_line");
  for (int i = 0; cl && R.argv && i < R.argc; i++) cJSON_AddItemToArray(cl, cJSON_CreateString(R.argv[i]));
  join_hashes();
  cJSON *ins = cJSON_AddArrayToObject(root, "inputs");
  for (int i = 0; ins && i < R.ninput; i++) {
    const run_input *in = R.in[i];
    cJSON *o = cJSON_CreateObject();
    cJSON_AddStringToObject(o, "role", in->role);
    cJSON_AddStringToObject(o, "path", in->path);
    cJSON_AddNumberToObject(o, "size", (double)in->size);
    if (in->hashed == 1) cJSON_AddStringToObject(o, "sha256", in->sha);
    else cJSON_AddNullToObject(o, "sha256");
    cJSON_AddItemToArray(ins, o);
  }
}

void qc_run_cmdline(qc_sbuf *b) {
  qc_sbuf_printf(b, "qatcheck");
  for (int i = 0; R.argv && i < R.argc; i++) {
    const char *a = R.argv[i];
    int plain = a[0] && strspn(a, "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789-_.=/+:,@%") == strlen(a);
    if (plain) {
      qc_sbuf_printf(b, " %s", a);
      continue;
    }
    qc_sbuf_printf(b, " '");
    for (; *a; a++) {
      if (*a == '\'') qc_sbuf_printf(b, "'\\''");
      else qc_sbuf_printf(b, "%c", *a);
    }
    qc_sbuf_printf(b, "'");
  }
}

void qc_run_markdown(qc_sbuf *b) {
  if (R.argv) {
    qc_sbuf s = {0};
    qc_run_cmdline(&s);
    qc_sbuf_printf(b, "- command: `");
    qc_sbuf_md(b, s.s ? s.s : "");
    qc_sbuf_printf(b, "`\n");
    qc_sbuf_free(&s);
  }
  join_hashes();
  for (int i = 0; i < R.ninput; i++) {
    const run_input *in = R.in[i];
    qc_sbuf_printf(b, "- %s: `", in->role);
    qc_sbuf_md(b, in->path);
    qc_sbuf_printf(b, "`, %lld bytes, sha256 `%s`\n", in->size, in->hashed == 1 ? in->sha : "-");
  }
}

/* ---- the end ------------------------------------------------------------------------------ */

int qc_run_end(int rc) {
  int status = rc >= QC_EINPUT ? 2 : rc;
  qc_watchdog_hold(); /* the run ends here: released disarmed, the watchdog has no more to do */
  if (status == 2) {
    atomic_store(&g_cancel, 1); /* an error report carries no hashes worth waiting for */
    join_hashes();
    for (int i = 0; i < R.ninput; i++)
      if (R.in[i]->hashed != 1) R.in[i]->hashed = -1;
    qc_report_error_commit(R.verb[0] ? R.verb : "qatcheck");
  } else {
    if (!qc_quiet && R.regs.s) printf("%s", R.regs.s);
    if (R.nreg > 0 && R.fail_on && status == 0) status = 1;
  }
  join_hashes();
  for (int i = 0; i < R.ninput; i++) {
    free(R.in[i]->role);
    free(R.in[i]->path);
    free(R.in[i]);
  }
  free(R.in);
  for (int i = 0; i < R.nbase; i++) {
    cJSON_Delete(R.base[i]);
    free(R.base_path[i]);
  }
  qc_sbuf_free(&R.regs);
  memset(&R, 0, sizeof R);
  R.factor = 1.1;
  atomic_store(&g_cancel, 0);
  qc_watchdog_release(1);
  return status;
}
