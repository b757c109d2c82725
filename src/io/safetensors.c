/* safetensors.c: qatcheck's own safetensors reader (see safetensors.h):
 * headers parsed with cJSON and validated whole when a file is opened
 * (folders and indexes: safetensors_files.c), tensor bytes copied out of the page
 * cache by pread, or (QATCHECK_ST_READ=mmap) by mmap of the tensor's range a
 * window at a time, unmapped after the copy. Either way a checkpoint larger
 * than memory streams without growing the process. pread is the default:
 * measured 1.3 to 1.5 times faster from the page cache (bench/RESULTS.md),
 * and it sends no TLB shootdowns to the other reader threads. */
#include "io/safetensors.h"

#include <cjson/cJSON.h>
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "core/file.h"
#include "core/qc.h"
#include "io/safetensors_priv.h"

#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "the safetensors reader takes the file's little-endian bytes as they are"
#endif

#define WINDOW (64u << 20) /* bytes mapped at a time */

/* The dtypes of the format: name, bits per element, qatcheck's type. */
static const struct {
  const char *name;
  int bits;
  int dtype;
} g_types[] = {
    {"BOOL", 8, -1},       {"U8", 8, QC_U8},          {"I8", 8, QC_I8},        {"I16", 16, -1},
    {"U16", 16, -1},       {"F16", 16, QC_F16},       {"BF16", 16, QC_BF16},   {"I32", 32, QC_I32},
    {"U32", 32, -1},       {"F32", 32, QC_F32},       {"F64", 64, QC_F64},     {"I64", 64, QC_I64},
    {"U64", 64, -1},       {"C64", 64, -1},           {"F8_E4M3", 8, QC_E4M3}, {"F8_E5M2", 8, QC_E5M2},
    {"F8_E8M0", 8, QC_E8M0}, {"F8_E4M3FNUZ", 8, -1},  {"F8_E5M2FNUZ", 8, -1},  {"F4", 4, QC_E2M1X2},
    {"F6_E2M3", 6, -1},    {"F6_E3M2", 6, -1},
};
#define NTYPES ((int)(sizeof g_types / sizeof g_types[0]))

const char *qc_st_path(const qc_st *st) { return st->path; }
int qc_st_count(const qc_st *st) { return st->n; }
const qc_st_tensor *qc_st_at(const qc_st *st, int i) { return i >= 0 && i < st->n ? &st->t[i] : NULL; }

void qc_st_close(qc_st *st) {
  if (!st) return;
  for (int i = 0; i < st->npart; i++)
    if (st->part[i].fd >= 0) close(st->part[i].fd);
  for (int i = 0; i < st->n; i++) free(st->t[i].name);
  free(st->part);
  free(st->t);
  free(st);
}

static int cmp_name(const void *a, const void *b) {
  return strcmp(((const qc_st_tensor *)a)->name, ((const qc_st_tensor *)b)->name);
}

const qc_st_tensor *qc_st_find(const qc_st *st, const char *name) {
  qc_st_tensor key;
  key.name = (char *)name;
  return st->n ? bsearch(&key, st->t, (size_t)st->n, sizeof *st->t, cmp_name) : NULL;
}

/* A JSON number that is a whole number in [0, 2^53]. */
static int whole(const cJSON *v, uint64_t *out) {
  if (!cJSON_IsNumber(v)) return 0;
  double d = v->valuedouble;
  if (!isfinite(d) || d < 0 || d > 9007199254740992.0 || d != floor(d)) return 0;
  *out = (uint64_t)d;
  return 1;
}

/* Room for one more tensor. */
static int grow(qc_st *st) {
  if (st->n < st->cap) return QC_OK;
  int nc = st->cap ? 2 * st->cap : 64;
  void *p = realloc(st->t, (size_t)nc * sizeof *st->t);
  if (!p) return qc_err_sys("out of memory reading a safetensors header");
  st->t = p;
  st->cap = nc;
  return QC_OK;
}

/* One header entry `e` (tensor `name`) of part `pi` whose data section
 * starts at data0 and holds dlen bytes. */
static int parse_entry(qc_st *st, int pi, const cJSON *e, uint64_t data0, uint64_t dlen) {
  const char *where = st->part[pi].path, *name = e->string;
  if (strlen(name) >= QC_ST_NAMELEN)
    return qc_err("safetensors '%s': tensor name '%.60s...' is longer than %d characters", where, name, QC_ST_NAMELEN - 1);
  if (!cJSON_IsObject(e))
    return qc_err("safetensors '%s': header entry '%s' is not an object: expected {\"dtype\", \"shape\", \"data_offsets\"}",
                  where, name);
  const cJSON *dt = cJSON_GetObjectItemCaseSensitive(e, "dtype"), *sh = cJSON_GetObjectItemCaseSensitive(e, "shape"),
              *of = cJSON_GetObjectItemCaseSensitive(e, "data_offsets");
  if (!cJSON_IsString(dt) || !cJSON_IsArray(sh) || !cJSON_IsArray(of))
    return qc_err("safetensors '%s': tensor '%s': expected string 'dtype', array 'shape' and array 'data_offsets'", where, name);
  int ti = -1;
  for (int i = 0; i < NTYPES && ti < 0; i++)
    if (strcmp(dt->valuestring, g_types[i].name) == 0) ti = i;
  if (ti < 0) {
    qc_err("safetensors '%s': tensor '%s' has unknown dtype '%.32s'", where, name, dt->valuestring);
    qc_hint("the safetensors dtypes are BOOL, U8, I8, I16, U16, F16, BF16, I32, U32, F32, F64, I64, U64, C64, "
            "F8_E4M3, F8_E5M2, F8_E8M0, F8_E4M3FNUZ, F8_E5M2FNUZ, F4, F6_E2M3, F6_E3M2");
    return QC_EINPUT;
  }
  int nd = cJSON_GetArraySize(sh);
  if (nd > QC_MAXDIM) return qc_err("safetensors '%s': tensor '%s' has rank %d: expected at most %d", where, name, nd, QC_MAXDIM);
  uint64_t dims[QC_MAXDIM], numel = 1, b0, b1;
  int k = 0;
  for (const cJSON *d = sh->child; d; d = d->next, k++) {
    if (!whole(d, &dims[k]))
      return qc_err("safetensors '%s': tensor '%s': shape entry %d is not a whole number >= 0", where, name, k);
    if (dims[k] && numel > (UINT64_MAX >> 4) / dims[k])
      return qc_err("safetensors '%s': tensor '%s': shape overflows a byte count", where, name);
    numel *= dims[k];
  }
  if (cJSON_GetArraySize(of) != 2 || !whole(of->child, &b0) || !whole(of->child->next, &b1))
    return qc_err("safetensors '%s': tensor '%s': data_offsets must be [begin, end], whole numbers", where, name);
  int bits = g_types[ti].bits;
  if ((numel * (uint64_t)bits) % 8)
    return qc_err("safetensors '%s': tensor '%s' (%s): %llu elements of %d bits do not fill whole bytes", where, name,
                  g_types[ti].name, (unsigned long long)numel, bits);
  uint64_t want = numel * (uint64_t)bits / 8;
  if (b1 < b0) return qc_err("safetensors '%s': tensor '%s': data_offsets [%llu, %llu] end before they begin", where, name,
                             (unsigned long long)b0, (unsigned long long)b1);
  if (b1 - b0 != want)
    return qc_err("safetensors '%s': tensor '%s' holds %llu bytes: expected %llu (%s x %llu elements)", where, name,
                  (unsigned long long)(b1 - b0), (unsigned long long)want, g_types[ti].name, (unsigned long long)numel);
  if (b1 > dlen)
    return qc_err("safetensors '%s': tensor '%s': data_offsets [%llu, %llu] run past the end of the data (%llu bytes)",
                  where, name, (unsigned long long)b0, (unsigned long long)b1, (unsigned long long)dlen);
  int rc = grow(st);
  if (rc) return rc;
  qc_st_tensor *t = &st->t[st->n];
  memset(t, 0, sizeof *t);
  if (!(t->name = strdup(name))) return qc_err_sys("out of memory reading a safetensors header");
  st->n++;
  snprintf(t->st_dtype, sizeof t->st_dtype, "%s", g_types[ti].name);
  t->dtype = g_types[ti].dtype;
  t->ndim = nd;
  for (int i = 0; i < nd; i++) t->shape[i] = (int64_t)dims[i];
  t->st_last = nd ? (int64_t)dims[nd - 1] : 1;
  if (bits == 4) { /* F4: qatcheck's float4_e2m1fn_x2 keeps the storage shape */
    if (nd == 0 || dims[nd - 1] % 2)
      return qc_err("safetensors '%s': tensor '%s' (F4): last dimension %lld is odd: expected pairs of elements a byte",
                    where, name, nd ? (long long)dims[nd - 1] : 1LL);
    t->shape[nd - 1] /= 2;
  }
  t->part = pi;
  t->offset = data0 + b0;
  t->nbytes = want;
  return QC_OK;
}

static int cmp_offset(const void *a, const void *b) {
  const qc_st_tensor *x = *(qc_st_tensor *const *)a, *y = *(qc_st_tensor *const *)b;
  return x->offset < y->offset ? -1 : x->offset > y->offset ? 1 : 0;
}

/* No two non-empty tensors of part pi (entries [from, st->n)) share a byte. */
static int check_overlap(const qc_st *st, int pi, int from) {
  int n = st->n - from, rc = QC_OK;
  if (n < 2) return QC_OK;
  qc_st_tensor **v = malloc((size_t)n * sizeof *v);
  if (!v) return qc_err_sys("out of memory reading a safetensors header");
  int m = 0;
  for (int i = from; i < st->n; i++)
    if (st->t[i].nbytes) v[m++] = &st->t[i];
  qsort(v, (size_t)m, sizeof *v, cmp_offset);
  for (int i = 1; i < m && !rc; i++)
    if (v[i]->offset < v[i - 1]->offset + v[i - 1]->nbytes)
      rc = qc_err("safetensors '%s': tensors '%s' and '%s' overlap: their data_offsets share bytes", st->part[pi].path,
                  v[i - 1]->name, v[i]->name);
  free(v);
  return rc;
}

/* Parse and validate the header of part pi: hdr[0, hlen) is the JSON text,
 * the data section holds dlen bytes from file offset 8 + hlen. */
static int parse_header(qc_st *st, int pi, const char *hdr, uint64_t hlen, uint64_t dlen) {
  const char *where = st->part[pi].path, *end = NULL;
  cJSON *root = cJSON_ParseWithLengthOpts(hdr, (size_t)hlen, &end, 0);
  if (!root) {
    long at = end ? (long)(end - hdr) : -1;
    qc_err("safetensors '%s': the header is not valid JSON (near byte %ld of %llu)", where, at, (unsigned long long)hlen);
    qc_hint("a safetensors file starts with an 8-byte little-endian header length and a JSON header");
    return QC_EINPUT;
  }
  int rc = QC_OK, from = st->n;
  for (const char *p = end; p < hdr + hlen && !rc; p++) /* the writers pad the header with spaces */
    if (*p != ' ' && *p != '\t' && *p != '\n' && *p != '\r' && *p != 0)
      rc = qc_err("safetensors '%s': bytes after the header's JSON object (at byte %ld)", where, (long)(p - hdr));
  if (!rc && !cJSON_IsObject(root)) rc = qc_err("safetensors '%s': the header is not a JSON object", where);
  for (const cJSON *e = rc ? NULL : root->child; e && !rc; e = e->next) {
    if (strcmp(e->string, "__metadata__") == 0) {
      if (!cJSON_IsObject(e)) rc = qc_err("safetensors '%s': '__metadata__' is not an object of strings", where);
      continue;
    }
    rc = parse_entry(st, pi, e, 8 + hlen, dlen);
  }
  cJSON_Delete(root);
  if (!rc) rc = check_overlap(st, pi, from);
  return rc;
}

/* Split a whole-file image (or its first bytes: `have` of a file of `size`)
 * into the header length; checks the length against the limit and the file. */
static int header_len(const char *where, const unsigned char *b8, uint64_t size, uint64_t *hlen) {
  if (size < 8) return qc_err("safetensors '%s': %llu bytes: too short for the 8-byte header length", where, (unsigned long long)size);
  int rc = qc_refuse_gzip("safetensors", where, b8, 8);
  if (rc) return rc;
  uint64_t n = 0;
  for (int i = 7; i >= 0; i--) n = n << 8 | b8[i];
  if (n > QC_ST_MAX_HEADER) {
    qc_err("safetensors '%s': header length %llu bytes is over the 100 MB limit", where, (unsigned long long)n);
    qc_hint("not a safetensors file, or a corrupt one (the first 8 bytes are the header length, little-endian)");
    return QC_EINPUT;
  }
  if (n < 2 || n > size - 8)
    return qc_err("safetensors '%s': header length %llu does not fit the file (%llu bytes)", where, (unsigned long long)n,
                  (unsigned long long)size);
  *hlen = n;
  return QC_OK;
}

/* Append file `path` as a part (not opened). */
static int qc_st_add_part(qc_st *st, const char *path) {
  void *p = realloc(st->part, (size_t)(st->npart + 1) * sizeof *st->part);
  if (!p) return qc_err_sys("out of memory opening a checkpoint");
  st->part = p;
  st_part *q = &st->part[st->npart++];
  memset(q, 0, sizeof *q);
  q->fd = -1;
  snprintf(q->path, sizeof q->path, "%s", path);
  return QC_OK;
}

qc_st *qc_st_new(const char *path) {
  qc_st *st = qc_calloc(1, sizeof *st, "checkpoint handle");
  const char *how = getenv("QATCHECK_ST_READ");
  if (!st) return NULL;
  snprintf(st->path, sizeof st->path, "%s", path);
  st->use_mmap = how && strcmp(how, "mmap") == 0;
  return st;
}

/* Sort by name; a name in two shards is refused. */
int qc_st_finish(qc_st *st) {
  if (st->n > 1) qsort(st->t, (size_t)st->n, sizeof *st->t, cmp_name);
  for (int i = 1; i < st->n; i++)
    if (strcmp(st->t[i].name, st->t[i - 1].name) == 0)
      return qc_err("checkpoint '%s': tensor '%s' is stored twice ('%s' and '%s')", st->path, st->t[i].name,
                    st->part[st->t[i - 1].part].path, st->part[st->t[i].part].path);
  return QC_OK;
}

int qc_st_parse(const void *data, size_t len, const char *where, qc_st **out) {
  *out = NULL;
  qc_st *st = qc_st_new(where);
  if (!st) return QC_ESYS;
  uint64_t hlen = 0;
  int rc = qc_st_add_part(st, where);
  if (!rc) rc = header_len(where, data, len, &hlen);
  if (!rc) {
    st->part[0].mem = data;
    st->part[0].size = len;
    rc = parse_header(st, 0, (const char *)data + 8, hlen, len - 8 - hlen);
  }
  if (!rc) rc = qc_st_finish(st);
  if (rc) { qc_st_close(st); return rc; }
  *out = st;
  return QC_OK;
}

/* pread all of [off, off + n) or fail naming the file. */
int qc_st_read_full(int fd, const char *path, uint64_t off, void *buf, size_t n) {
  const int e = qc_pread_full(fd, buf, n, (long long)off);
  if (e > 0) return qc_err_sys("safetensors '%s': read failed: %s", path, strerror(e));
  if (e < 0) return qc_err("safetensors '%s': the file ends early (truncated?)", path);
  return QC_OK;
}

/* Open a regular file read-only (a FIFO or device is refused before it is
 * opened, so it cannot block); its size into *size. */
int qc_st_open_regular(const char *path, const char *what, int *fd, uint64_t *size) {
  int64_t n = 0;
  int rc = qc_open_regular(path, what, fd, &n); /* a FIFO or device refused unopened */
  *size = (uint64_t)n;
  return rc;
}

/* Open file `path` as a new part and parse its header. */
int qc_st_open_part(qc_st *st, const char *path) {
  int rc = qc_st_add_part(st, path), pi = st->npart - 1;
  if (rc) return rc;
  st_part *p = &st->part[pi];
  unsigned char b8[8];
  uint64_t hlen;
  if ((rc = qc_st_open_regular(path, "safetensors", &p->fd, &p->size))) return rc;
  if ((rc = qc_st_read_full(p->fd, path, 0, b8, p->size < 8 ? (size_t)p->size : 8))) return rc;
  if ((rc = header_len(path, b8, p->size, &hlen))) return rc;
  char *hdr = qc_malloc((size_t)hlen, "safetensors header");
  if (!hdr) return QC_ESYS;
  rc = qc_st_read_full(p->fd, path, 8, hdr, (size_t)hlen);
  if (!rc) rc = parse_header(st, pi, hdr, hlen, p->size - 8 - hlen);
  free(hdr);
  return rc;
}

/* Copy [off, off + n) of part p into buf: from the image, by pread, or
 * (use_mmap) by mapping a window of the file at a time. */
static int copy_out(const st_part *p, int use_mmap, const char *name, uint64_t off, void *buf, size_t n) {
  if (p->mem) {
    if (off + n > p->size) return qc_err("safetensors '%s': tensor '%s' runs past the image", p->path, name);
    memcpy(buf, p->mem + off, n);
    return QC_OK;
  }
  struct stat sb;
  if (fstat(p->fd, &sb) != 0 || (uint64_t)sb.st_size < off + n)
    return qc_err("safetensors '%s': tensor '%s': the file is shorter than when it was opened (truncated?)", p->path, name);
  if (!use_mmap) return qc_st_read_full(p->fd, p->path, off, buf, n);
  long page = sysconf(_SC_PAGESIZE) > 0 ? sysconf(_SC_PAGESIZE) : 4096;
  size_t done = 0;
  while (done < n) {
    uint64_t at = off + done, base = at - at % (uint64_t)page;
    size_t want = n - done < WINDOW ? n - done : WINDOW, len = (size_t)(at - base) + want;
    void *m = mmap(NULL, len, PROT_READ, MAP_PRIVATE | MAP_POPULATE, p->fd, (off_t)base);
    if (m == MAP_FAILED) return qc_err_sys("safetensors '%s': tensor '%s': mmap failed: %s", p->path, name, strerror(errno));
    memcpy((char *)buf + done, (const char *)m + (at - base), want);
    munmap(m, len);
    done += want;
  }
  return QC_OK;
}

int qc_st_read(const qc_st *st, const qc_st_tensor *t, long long index, void *buf, size_t nbytes) {
  uint64_t off = t->offset, len = t->nbytes;
  if (index >= 0) {
    if (t->ndim < 1 || (uint64_t)index >= (uint64_t)t->shape[0])
      return qc_err("checkpoint '%s': tensor '%s': slice %lld is out of range", st->path, t->name, index);
    len = t->nbytes / (uint64_t)t->shape[0];
    off += (uint64_t)index * len;
  }
  if (len != nbytes)
    return qc_err("checkpoint '%s': tensor '%s' holds %llu bytes: expected %zu", st->path, t->name, (unsigned long long)len,
                  nbytes);
  if (!nbytes) return QC_OK;
  return copy_out(&st->part[t->part], st->use_mmap, t->name, off, buf, nbytes);
}

int qc_st_pread(const qc_st *st, int part, uint64_t offset, void *buf, size_t nbytes, const char *name) {
  if (part < 0 || part >= st->npart) return qc_err("checkpoint '%s': tensor '%s': no file %d", st->path, name, part);
  return nbytes ? copy_out(&st->part[part], st->use_mmap, name, offset, buf, nbytes) : QC_OK;
}

int qc_st_load(const qc_st *st, const char *name, const char *as, qc_tensor *out) {
  memset(out, 0, sizeof *out);
  const qc_st_tensor *t = qc_st_find(st, name);
  if (!t) return qc_err("checkpoint '%s': tensor '%s' is missing", st->path, name);
  if (t->dtype < 0) {
    qc_err("checkpoint '%s': tensor '%s' has dtype %s, which qatcheck does not read", st->path, name, t->st_dtype);
    qc_hint("qatcheck reads BF16, F16, F32, F64, I8, U8, I32, I64, F8_E4M3, F8_E5M2, F8_E8M0 and F4");
    return QC_EINPUT;
  }
  int rc = qc_tensor_alloc(out, as ? as : name, (qc_dtype)t->dtype, t->ndim, t->shape);
  if (rc) return rc;
  if ((uint64_t)out->nbytes != t->nbytes) {
    qc_tensor_free(out);
    return qc_err("checkpoint '%s': tensor '%s': %llu bytes do not make a %s tensor", st->path, name,
                  (unsigned long long)t->nbytes, t->st_dtype);
  }
  if ((rc = qc_st_read(st, t, -1, out->data, out->nbytes))) qc_tensor_free(out);
  return rc;
}

const char *qc_st_config_of(const char *ckpt, char *buf, size_t n) {
  struct stat sb;
  if (stat(ckpt, &sb) == 0 && S_ISDIR(sb.st_mode)) snprintf(buf, n, "%s/config.json", ckpt);
  else {
    const char *s = strrchr(ckpt, '/');
    if (s) snprintf(buf, n, "%.*s/config.json", (int)(s - ckpt), ckpt);
    else snprintf(buf, n, "config.json");
  }
  return access(buf, R_OK) == 0 ? buf : NULL;
}
