/* log.c: an arm's log read whole (gzip decompressed transparently, told by
 * its magic bytes) and its format told by content (see l3log.h): TFRecord
 * framing whose first length CRC checks is TensorBoard; a single JSON
 * object holding log_history is trainer_state.json, one with a member
 * holding "values" Megatron golden values; other JSON is JSONL (whose
 * records need a step); anything else is CSV, whose header must name a step
 * column. A folder is read as TensorBoard event files. */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <limits.h>
#include <unistd.h>
#include <zlib.h>

#include "core/crc32c.h"
#include "core/file.h"
#include "core/qc.h"
#include "io/l3log.h"
#include "io/log_priv.h"

#define LOG_MAX ((size_t)1 << 30) /* a log of a long run is a few hundred MB at most (docs/robustness.md) */

/* A log file's bytes: mapped read-only (no copy, no fresh pages to clear:
 * a quarter of the time of reading a large log), or read whole where it
 * cannot be mapped. *mapped says which, for release_file. The parsers keep
 * to [buf, buf + n) and need no terminating NUL. */
static int map_file(const char *path, char **buf, size_t *n, int *mapped) {
  *buf = NULL;
  *n = 0;
  *mapped = 0;
  int fd = open(path, O_RDONLY | O_NONBLOCK | O_CLOEXEC);
  if (fd < 0) return qc_err("log '%s': cannot open: %s", path, strerror(errno));
  struct stat st;
  int ok = fstat(fd, &st) == 0 && S_ISREG(st.st_mode);
  if (ok && st.st_size > 0 && (size_t)st.st_size <= LOG_MAX) {
    void *p = mmap(NULL, (size_t)st.st_size, PROT_READ, MAP_PRIVATE | MAP_POPULATE, fd, 0);
    if (p != MAP_FAILED) {
      madvise(p, (size_t)st.st_size, MADV_SEQUENTIAL);
      close(fd);
      *buf = p;
      *n = (size_t)st.st_size;
      *mapped = 1;
      return QC_OK;
    }
  }
  close(fd);
  return qc_read_file_any(path, "log", LOG_MAX, buf, n);
}

static void release_file(char *buf, size_t n, int mapped) {
  if (mapped) munmap(buf, n);
  else free(buf);
}

/* Inflate the gzip data in[0, n) (one member or several, as `cat a.gz
 * b.gz` makes) into a malloc'd buffer, at most LOG_MAX bytes. QC_OK,
 * QC_EINPUT (corrupt or truncated, naming the file), QC_ESYS. */
static int gunzip(const char *path, const char *in, size_t n, char **out, size_t *outn) {
  z_stream z;
  memset(&z, 0, sizeof z);
  if (inflateInit2(&z, 16 + MAX_WBITS) != Z_OK) return qc_err_sys("log '%s': zlib cannot start", path);
  size_t cap = n < ((size_t)1 << 20) ? (size_t)4 << 20 : 4 * n, k = 0;
  char *b = malloc(cap);
  int rc = QC_OK, zr = Z_OK;
  if (!b) { inflateEnd(&z); return qc_err_sys("out of memory decompressing log '%s'", path); }
  z.next_in = (Bytef *)(uintptr_t)in;
  while (rc == QC_OK) {
    if (k == cap) {
      if (cap >= LOG_MAX) { rc = qc_err("log '%s': more than %zu bytes decompressed: over the limit", path, (size_t)LOG_MAX); break; }
      size_t nc = cap * 2 > LOG_MAX ? LOG_MAX : cap * 2;
      char *nb = realloc(b, nc);
      if (!nb) { rc = qc_err_sys("out of memory decompressing log '%s'", path); break; }
      b = nb;
      cap = nc;
    }
    size_t left = n - (size_t)((const char *)z.next_in - in);
    z.avail_in = left > UINT_MAX ? UINT_MAX : (uInt)left;
    size_t room = cap - k;
    z.next_out = (Bytef *)b + k;
    z.avail_out = room > UINT_MAX ? UINT_MAX : (uInt)room;
    uInt was = z.avail_out;
    zr = inflate(&z, Z_NO_FLUSH);
    k += was - z.avail_out;
    if (zr == Z_STREAM_END) {
      left = n - (size_t)((const char *)z.next_in - in);
      if (left < 2 || !qc_is_gzip(z.next_in, left)) break; /* the last member (trailing zeros are padding) */
      if (inflateReset(&z) != Z_OK) { rc = qc_err("log '%s': a corrupt gzip member", path); break; }
      continue;
    }
    if (zr == Z_BUF_ERROR && z.avail_out > 0) { rc = qc_err("log '%s': the gzip data ends early (truncated?)", path); break; }
    if (zr != Z_OK && zr != Z_BUF_ERROR) {
      rc = zr == Z_MEM_ERROR ? qc_err_sys("out of memory decompressing log '%s'", path)
                             : qc_err("log '%s': corrupt gzip data (%s)", path, z.msg ? z.msg : "inflate failed");
      break;
    }
  }
  inflateEnd(&z);
  if (rc) { free(b); return rc; }
  *out = b;
  *outn = k;
  return QC_OK;
}

/* A log file's bytes as map_file gives them, gzip decompressed
 * transparently (by its magic bytes, never its name). */
static int load_file(const char *path, char **buf, size_t *n, int *mapped) {
  int rc = map_file(path, buf, n, mapped);
  if (rc || !qc_is_gzip(*buf, *n)) return rc;
  char *plain = NULL;
  size_t pn = 0;
  rc = gunzip(path, *buf, *n, &plain, &pn);
  release_file(*buf, *n, *mapped);
  *buf = NULL;
  *n = 0;
  *mapped = 0;
  if (rc) return rc;
  *buf = plain;
  *n = pn;
  return QC_OK;
}

/* 1 when buf starts with a TFRecord header whose length CRC checks. */
static int is_tfrecord(const char *buf, size_t n) {
  if (n < 12) return 0;
  uint32_t crc;
  memcpy(&crc, buf + 8, 4);
  return qc_crc32c_mask(qc_crc32c(buf, 8)) == crc;
}

static int parse_into(const char *buf, size_t n, qc_l3_log *out) {
  if (is_tfrecord(buf, n)) return qc_log_parse_tfevents(buf, n, out);
  const char *e = buf + n, *p = buf;
  if (n >= 3 && memcmp(p, "\xEF\xBB\xBF", 3) == 0) p += 3;
  p = qc_js_ws(p, e);
  if (p == e) return qc_err("log '%s': empty: no steps", out->path);
  if (*p == '{') {
    int has_step, has_hist, mega;
    const char *end = qc_js_probe(p, e, &has_step, &has_hist, &mega);
    if (!end) return qc_err("log '%s': malformed JSON on line %ld", out->path, qc_line_of(buf, p));
    if (qc_js_ws(end, e) == e && !has_step && has_hist) return qc_log_parse_hf(p, (size_t)(e - p), out);
    if (qc_js_ws(end, e) == e && !has_step && mega) return qc_log_parse_megatron(p, (size_t)(e - p), out);
    /* JSONL, or a single object of none of the formats: read as JSONL, whose
     * records need a step (the message says so) */
    return qc_log_parse_jsonl(p, (size_t)(e - p), out);
  }
  if (*p == '[') return qc_err("log '%s': a JSON array: expected one object per line (JSONL)", out->path);
  return qc_log_parse_csv(buf, n, out);
}

static const char *const step_keys[] = {"step", "global_step", "Step", "current_steps", "iteration", "train/global_step", "_step"};

int qc_log_step_rank(const qc_l3_log *l, const char *name, size_t len) {
  if (l->step_want[0]) return strlen(l->step_want) == len && memcmp(l->step_want, name, len) == 0 ? 0 : -1;
  for (int i = 0; i < (int)(sizeof step_keys / sizeof *step_keys); i++)
    if (strlen(step_keys[i]) == len && memcmp(step_keys[i], name, len) == 0) return i;
  return -1;
}

/* Set out's wanted step key (NULL or "": the known ones). QC_EINPUT when
 * it is too long. */
static int want_step(qc_l3_log *out, const char *step_key) {
  if (!step_key || !step_key[0]) return QC_OK;
  if (strlen(step_key) >= sizeof out->step_want) return qc_err("log '%s': step key '%.40s...' is too long", out->path, step_key);
  snprintf(out->step_want, sizeof out->step_want, "%s", step_key);
  return QC_OK;
}

/* Verbose: what was read as absent or skipped, once per log. */
static void say_skipped(const qc_l3_log *l) {
  if (!qc_verbose) return;
  if (l->placeholders)
    fprintf(stderr, "log '%s': %lld \"nan\" placeholder(s) of Megatron's golden values read as absent (steps the run did not log)\n",
            l->path, (long long)l->placeholders);
  if (l->nskipped) fprintf(stderr, "log '%s': %d top-level scalar(s) skipped: not a metric (a value per step)\n", l->path, l->nskipped);
  if (l->step_key[0]) fprintf(stderr, "log '%s': steps read from '%s'\n", l->path, l->step_key);
}

int qc_log_parse(const char *buf, size_t n, const char *name, qc_l3_log *out) { return qc_log_parse_as(buf, n, name, NULL, out); }

int qc_log_parse_as(const char *buf, size_t n, const char *name, const char *step_key, qc_l3_log *out) {
  memset(out, 0, sizeof *out);
  snprintf(out->path, sizeof out->path, "%s", name);
  if (want_step(out, step_key)) return QC_EINPUT;
  int rc = parse_into(buf, n, out);
  if (!rc) rc = qc_l3_log_finish(out);
  if (!rc && out->n == 0) rc = qc_err("log '%s': no step holds a value", out->path);
  if (rc) qc_l3_log_free(out);
  if (rc) snprintf(out->path, sizeof out->path, "%s", name);
  return rc;
}

static int cmp_str(const void *a, const void *b) { return strcmp(*(char *const *)a, *(char *const *)b); }

/* Every events.out.tfevents.* file of a folder, in name order (their time
 * stamps), into one log. */
static int read_folder(const char *dir, qc_l3_log *out) {
  DIR *d = opendir(dir);
  if (!d) return qc_err("log '%s': cannot open the folder: %s", dir, strerror(errno));
  char **names = NULL;
  int nn = 0, cap = 0, rc = QC_OK;
  struct dirent *de;
  while ((de = readdir(d))) {
    if (strncmp(de->d_name, "events.out.tfevents.", 20) != 0) continue;
    if (nn == cap) {
      cap = cap ? 2 * cap : 8;
      char **nv = realloc(names, (size_t)cap * sizeof *nv);
      if (!nv) { rc = qc_err_sys("out of memory listing '%s'", dir); goto done; }
      names = nv;
    }
    if (!(names[nn] = strdup(de->d_name))) { rc = qc_err_sys("out of memory listing '%s'", dir); goto done; }
    nn++;
  }
  if (nn == 0) {
    rc = qc_err("log '%s': a folder without events.out.tfevents.* files", dir);
    qc_hint("a log is a file (JSONL, CSV, trainer_state.json, Megatron golden values) or a TensorBoard run folder");
    goto done;
  }
  qsort(names, (size_t)nn, sizeof *names, cmp_str);
  snprintf(out->format, sizeof out->format, "tfevents");
  for (int i = 0; i < nn && !rc; i++) {
    char path[QC_L3_PATH + 300];
    if (snprintf(path, sizeof path, "%s/%s", dir, names[i]) >= (int)sizeof path) { rc = qc_err("log '%s': path too long", dir); break; }
    char *buf;
    size_t n;
    int mapped;
    if ((rc = load_file(path, &buf, &n, &mapped))) break;
    char keep[QC_L3_PATH];
    snprintf(keep, sizeof keep, "%s", out->path);
    snprintf(out->path, sizeof out->path, "%s", path); /* errors name the file */
    if (!is_tfrecord(buf, n) && n > 0) rc = qc_err("log '%s': not a TensorBoard event file (no TFRecord header)", path);
    else rc = qc_log_parse_tfevents(buf, n, out);
    snprintf(out->path, sizeof out->path, "%s", keep);
    release_file(buf, n, mapped);
  }
done:
  for (int i = 0; i < nn; i++) free(names[i]);
  free(names);
  closedir(d);
  return rc;
}

int qc_log_read(const char *path, qc_l3_log *out) { return qc_log_read_as(path, NULL, out); }

int qc_log_read_as(const char *path, const char *step_key, qc_l3_log *out) {
  memset(out, 0, sizeof *out);
  if (strlen(path) >= sizeof out->path) return qc_err("log '%.60s...': path longer than %zu characters", path, sizeof out->path - 1);
  snprintf(out->path, sizeof out->path, "%s", path);
  if (want_step(out, step_key)) return QC_EINPUT;
  struct stat st;
  if (stat(path, &st) != 0) return qc_err("log '%s': cannot open: %s", path, strerror(errno));
  int rc;
  if (S_ISDIR(st.st_mode)) {
    rc = read_folder(path, out);
  } else {
    char *buf;
    size_t n;
    int mapped;
    if ((rc = load_file(path, &buf, &n, &mapped))) return rc;
    rc = parse_into(buf, n, out);
    release_file(buf, n, mapped);
  }
  if (!rc) rc = qc_l3_log_finish(out);
  if (!rc && out->n == 0) rc = qc_err("log '%s': no step holds a value", path);
  if (!rc) say_skipped(out);
  if (rc) {
    qc_l3_log_free(out);
    snprintf(out->path, sizeof out->path, "%s", path);
  }
  return rc;
}
