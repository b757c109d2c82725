/* safetensors_files.c: which files a checkpoint is (see safetensors.h,
 * qc_st_open): one .safetensors file, the shards a
 * model.safetensors.index.json names (each must exist and hold the tensors
 * the index maps to it), or a folder holding either. */
#include <cjson/cJSON.h>
#include <dirent.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "core/qc.h"
#include "io/safetensors.h"
#include "io/safetensors_priv.h"

static int ends_with(const char *s, const char *suf) {
  size_t a = strlen(s), b = strlen(suf);
  return a >= b && strcmp(s + a - b, suf) == 0;
}

/* path's folder into dir ("." when none). */
static void dir_of(const char *path, char *dir, size_t n) {
  const char *s = strrchr(path, '/');
  if (!s) snprintf(dir, n, ".");
  else if (s == path) snprintf(dir, n, "/");
  else snprintf(dir, n, "%.*s", (int)(s - path), path);
}

static int cmp_str(const void *a, const void *b) { return strcmp(*(char *const *)a, *(char *const *)b); }

/* Open the shards an index names; every tensor it maps must be in its shard. */
static int open_index(qc_st *st, const char *path) {
  int fd = -1, rc;
  uint64_t size = 0;
  char *text = NULL, dir[1024], full[2200];
  const char **shard = NULL;
  int nshard = 0;
  cJSON *root = NULL;
  if ((rc = qc_st_open_regular(path, "checkpoint index", &fd, &size))) return rc;
  if (size > QC_ST_MAX_HEADER) { rc = qc_err("checkpoint index '%s': %llu bytes is over the 100 MB limit", path, (unsigned long long)size); goto done; }
  if (!(text = qc_malloc((size_t)size + 1, "checkpoint index"))) { rc = QC_ESYS; goto done; }
  if ((rc = qc_st_read_full(fd, path, 0, text, (size_t)size))) goto done;
  text[size] = 0;
  root = cJSON_ParseWithLength(text, (size_t)size);
  const cJSON *wm = root ? cJSON_GetObjectItemCaseSensitive(root, "weight_map") : NULL;
  if (!cJSON_IsObject(wm)) {
    rc = qc_err("checkpoint index '%s': %s", path, root ? "no object 'weight_map'" : "not valid JSON");
    qc_hint("an index is {\"metadata\": {...}, \"weight_map\": {\"tensor name\": \"shard.safetensors\", ...}}");
    goto done;
  }
  int nmap = cJSON_GetArraySize(wm);
  if (!(shard = calloc((size_t)(nmap ? nmap : 1), sizeof *shard))) { rc = qc_err_sys("out of memory reading an index"); goto done; }
  for (const cJSON *e = wm->child; e; e = e->next) {
    if (!cJSON_IsString(e)) { rc = qc_err("checkpoint index '%s': weight_map['%s'] is not a file name", path, e->string); goto done; }
    const char *f = e->valuestring;
    if (!f[0] || f[0] == '/' || strstr(f, "..")) {
      rc = qc_err("checkpoint index '%s': weight_map['%s'] = '%s': expected a file name beside the index", path, e->string, f);
      goto done;
    }
    shard[nshard++] = f;
  }
  if (nshard == 0) { rc = qc_err("checkpoint index '%s': weight_map is empty", path); goto done; }
  qsort(shard, (size_t)nshard, sizeof *shard, cmp_str);
  dir_of(path, dir, sizeof dir);
  for (int i = 0; i < nshard && !rc; i++) {
    if (i && strcmp(shard[i], shard[i - 1]) == 0) continue;
    snprintf(full, sizeof full, "%s/%s", dir, shard[i]);
    if (access(full, F_OK) != 0) {
      const char *who = "";
      for (const cJSON *e = wm->child; e && !who[0]; e = e->next)
        if (strcmp(e->valuestring, shard[i]) == 0) who = e->string;
      rc = qc_err("checkpoint index '%s': shard '%s' (holding '%s', ...) is missing", path, shard[i], who);
      goto done;
    }
    rc = qc_st_open_part(st, full);
  }
  if (rc || (rc = qc_st_finish(st))) goto done;
  for (const cJSON *e = wm->child; e && !rc; e = e->next) {
    const qc_st_tensor *t = qc_st_find(st, e->string);
    snprintf(full, sizeof full, "%s/%s", dir, e->valuestring);
    if (!t || strcmp(st->part[t->part].path, full) != 0)
      rc = qc_err("checkpoint index '%s': tensor '%s' is mapped to shard '%s' but that shard does not hold it", path,
                  e->string, e->valuestring);
  }
done:
  cJSON_Delete(root);
  free(shard);
  free(text);
  if (fd >= 0) close(fd);
  return rc;
}

/* Open every *.safetensors of folder `dir` (no index there). */
static int open_dir_files(qc_st *st, const char *dir) {
  DIR *d = opendir(dir);
  if (!d) return qc_err("checkpoint '%s': cannot list the folder: %s", dir, strerror(errno));
  char **names = NULL;
  int n = 0, cap = 0, rc = QC_OK;
  struct dirent *e;
  while ((e = readdir(d)) != NULL && !rc) {
    if (!ends_with(e->d_name, ".safetensors") || e->d_name[0] == '.') continue;
    if (n == cap) {
      cap = cap ? 2 * cap : 16;
      void *p = realloc(names, (size_t)cap * sizeof *names);
      if (!p) { rc = qc_err_sys("out of memory listing a checkpoint"); break; }
      names = p;
    }
    if (!(names[n] = strdup(e->d_name))) { rc = qc_err_sys("out of memory listing a checkpoint"); break; }
    n++;
  }
  closedir(d);
  if (!rc && n == 0) {
    rc = qc_err("checkpoint '%s': the folder holds no *.safetensors file and no model.safetensors.index.json", dir);
  }
  if (!rc) qsort(names, (size_t)n, sizeof *names, cmp_str);
  char full[2200];
  for (int i = 0; i < n && !rc; i++) {
    snprintf(full, sizeof full, "%s/%s", dir, names[i]);
    rc = qc_st_open_part(st, full);
  }
  for (int i = 0; i < n; i++) free(names[i]);
  free(names);
  return rc ? rc : qc_st_finish(st);
}

/* The index of folder `dir`: model.safetensors.index.json, else the one
 * *.safetensors.index.json there; "" when none. */
static int find_index(const char *dir, char *out, size_t n) {
  out[0] = 0;
  snprintf(out, n, "%s/model.safetensors.index.json", dir);
  if (access(out, F_OK) == 0) return QC_OK;
  out[0] = 0;
  DIR *d = opendir(dir);
  if (!d) return qc_err("checkpoint '%s': cannot list the folder: %s", dir, strerror(errno));
  struct dirent *e;
  int found = 0, rc = QC_OK;
  while ((e = readdir(d)) != NULL) {
    if (!ends_with(e->d_name, ".safetensors.index.json")) continue;
    if (found++) {
      rc = qc_err("checkpoint '%s': more than one *.safetensors.index.json in the folder: name the index to use", dir);
      break;
    }
    snprintf(out, n, "%s/%s", dir, e->d_name);
  }
  closedir(d);
  return rc;
}

int qc_st_open(const char *path, qc_st **out) {
  *out = NULL;
  struct stat sb;
  if (stat(path, &sb) != 0) return qc_err("checkpoint '%s': cannot open: %s", path, strerror(errno));
  qc_st *st = qc_st_new(path);
  if (!st) return QC_ESYS;
  int rc;
  if (S_ISDIR(sb.st_mode)) {
    char idx[2200];
    rc = find_index(path, idx, sizeof idx);
    if (!rc) rc = idx[0] ? open_index(st, idx) : open_dir_files(st, path);
  } else if (ends_with(path, ".json")) {
    rc = open_index(st, path);
  } else {
    rc = qc_st_open_part(st, path);
    if (!rc) rc = qc_st_finish(st);
  }
  if (rc) { qc_st_close(st); return rc; }
  *out = st;
  return QC_OK;
}

