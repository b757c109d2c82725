/* l3json.c: JSON helpers of layer 3's case files (see l3json.h). */
#include "model/l3json.h"

#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "core/file.h"
#include "core/qc.h"
#include "core/sha256.h"

int qc_lj_keys(const cJSON *obj, const char *const *allowed, const char *where) {
  for (const cJSON *it = obj->child; it; it = it->next) {
    for (const cJSON *p = obj->child; p != it; p = p->next)
      if (strcmp(p->string, it->string) == 0) return qc_err("%s: key '%s' appears twice", where, it->string);
    const char *const *a = allowed;
    while (*a && strcmp(*a, it->string) != 0) a++;
    if (*a) continue;
    char list[600] = "";
    size_t k = 0;
    for (a = allowed; *a && k < sizeof list; a++) k += (size_t)snprintf(list + k, sizeof list - k, "%s%s", a == allowed ? "" : ", ", *a);
    qc_err("%s: unknown key '%s'", where, it->string);
    qc_hint("allowed here: %s", list);
    return QC_EINPUT;
  }
  return QC_OK;
}

int qc_lj_str(const cJSON *obj, const char *key, const char *where, char *out, size_t n, int *found) {
  const cJSON *v = cJSON_GetObjectItemCaseSensitive(obj, key);
  if (found) *found = v != NULL;
  if (!v) return QC_OK;
  if (!cJSON_IsString(v)) return qc_err("%s: key '%s': expected a string", where, key);
  if (strlen(v->valuestring) >= n) return qc_err("%s: key '%s': longer than %zu characters", where, key, n - 1);
  snprintf(out, n, "%s", v->valuestring);
  return QC_OK;
}

int qc_lj_num(const cJSON *obj, const char *key, const char *where, double lo, double *out, int *found) {
  const cJSON *v = cJSON_GetObjectItemCaseSensitive(obj, key);
  if (found) *found = v != NULL;
  if (!v) return QC_OK;
  if (!cJSON_IsNumber(v) || !isfinite(v->valuedouble)) return qc_err("%s: key '%s': expected a finite number", where, key);
  if (v->valuedouble < lo) return qc_err("%s: key '%s': %g is below %g", where, key, v->valuedouble, lo);
  *out = v->valuedouble;
  return QC_OK;
}

int qc_lj_resolve(const char *dir, const char *p, char *out, size_t n) {
  if (!p[0]) return qc_err("an empty path");
  int k = (p[0] == '/' || !dir[0]) ? snprintf(out, n, "%s", p) : snprintf(out, n, "%s/%s", dir, p);
  if (k < 0 || (size_t)k >= n) return qc_err("path '%.60s...' is longer than %zu characters", p, n - 1);
  return QC_OK;
}

/* Read a case file (a regular file up to 64 MiB) into a malloc'd string,
 * its folder into dir, and its SHA-256 into sha (65 bytes). */
static int qc_lj_load(const char *path, char **text, char *dir, size_t dirlen, char *sha) {
  *text = NULL;
  if (strlen(path) >= dirlen) return qc_err("case '%.60s...': path longer than %zu characters", path, dirlen - 1);
  int fd = open(path, O_RDONLY | O_NONBLOCK | O_CLOEXEC);
  if (fd < 0) return qc_err("case '%s': cannot open: %s", path, strerror(errno));
  struct stat st;
  int rc = QC_OK;
  char *buf = NULL;
  if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode) || st.st_size > (64L << 20)) {
    rc = qc_err("case '%s': not a regular file of at most 64 MiB", path);
    goto done;
  }
  size_t n = (size_t)st.st_size, got = 0;
  if (!(buf = qc_malloc(n + 1, "case file"))) { rc = QC_ESYS; goto done; }
  while (got < n) {
    ssize_t r = read(fd, buf + got, n - got);
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) break;
    got += (size_t)r;
  }
  if (got != n) { rc = qc_err("case '%s': short read", path); goto done; }
  buf[n] = 0;
  if ((rc = qc_refuse_gzip("case", path, buf, n))) goto done;
  if (memchr(buf, 0, n)) { rc = qc_err("case '%s': holds a NUL byte: not a JSON text", path); goto done; }
  qc_sha256_hex(buf, n, sha);
  snprintf(dir, dirlen, "%s", path);
  char *s = strrchr(dir, '/');
  if (s) *s = 0;
  else snprintf(dir, dirlen, ".");
  *text = buf;
  buf = NULL;
done:
  free(buf);
  close(fd);
  return rc;
}

/* Parse JSON text, the error naming `where` and the line. */
static int qc_lj_parse(const char *text, const char *where, cJSON **root) {
  const char *endp = NULL;
  *root = cJSON_ParseWithOpts(text, &endp, 1);
  if (*root) return QC_OK;
  long line = 1;
  for (const char *p = text; endp && p < endp; p++) line += *p == '\n';
  return qc_err("case '%s': malformed JSON near line %ld", where, line);
}

int qc_lj_case_begin(const char *text, const char *where, const char *const *top, cJSON **root, char *w, size_t wn, char *name,
                     size_t nn) {
  int rc = qc_lj_parse(text, where, root), found;
  if (rc) return rc;
  snprintf(w, wn, "case '%s'", where);
  if (!cJSON_IsObject(*root)) return qc_err("%s: expected a JSON object", w);
  if ((rc = qc_lj_keys(*root, top, w)) || (rc = qc_lj_str(*root, "name", w, name, nn, &found))) return rc;
  if (!found) {
    const char *b = strrchr(where, '/');
    snprintf(name, nn, "%s", b ? b + 1 : where);
    char *dot = strrchr(name, '.');
    if (dot) *dot = 0;
  }
  const cJSON *v = cJSON_GetObjectItemCaseSensitive(*root, "description");
  if (v && !cJSON_IsString(v)) return qc_err("%s: 'description' must be a string", w);
  return QC_OK;
}

int qc_lj_case_load(const char *path, int (*parse)(const char *, const char *, const char *, void *), void *c, char *sha) {
  char *text, dir[1024];
  int rc = qc_lj_load(path, &text, dir, sizeof dir, sha);
  if (rc) return rc;
  rc = parse(text, path, dir, c);
  free(text);
  return rc;
}
