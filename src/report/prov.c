/* prov.c: the run's command line and input files with their SHA-256 (prov.h). */
#include "report/prov.h"

#include <cjson/cJSON.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "core/file.h"
#include "core/par.h"
#include "core/qc.h"
#include "core/sha256.h"

struct qc_prov_input {
  char *role, *path;
  long long size;
  dev_t dev;
  ino_t ino;
  char sha[65];
  int hashed;           /* 1: sha holds the digest; -1: could not (or cancelled) */
  int tree;             /* 1: sha is the SHA-256 tree's (size > QC_PROV_PIECE) */
  int started;
  pthread_t th;
  atomic_int *cancel;   /* the provenance's stop flag */
};

void qc_prov_init(qc_prov *p, int argc, char **argv) {
  memset(p, 0, sizeof *p);
  p->argc = argc;
  p->argv = argv;
  atomic_init(&p->cancel, 0);
  pthread_mutex_init(&p->join, NULL);
}

/* An input larger than QC_PROV_PIECE bytes is recorded by its SHA-256
 * tree: the SHA-256 of the 32-byte SHA-256 digests of its consecutive
 * QC_PROV_PIECE-byte pieces (the last one shorter), concatenated in file
 * order; the pieces are hashed on several threads at once (tree_workers).
 * One SHA-256 stream runs at about 1.2 to 1.4 GB/s on the SHA extensions:
 * a 7.2 GB dump took 6 s, longer than its audit on a GPU. The recipe that
 * checks it is in docs/interfaces.md ("inputs"). */
#define QC_PROV_PIECE ((long long)64 << 20)

typedef struct tree_job {
  qc_prov_input *in;
  int fd;
  long long npieces;
  atomic_llong next;    /* the next piece a worker takes */
  atomic_int bad;       /* a read failed, or the file ended early */
  uint8_t (*dig)[32];   /* [npieces] each piece's digest */
} tree_job;

/* Hash pieces of j until none is left (each piece by one worker, into its
 * own slot: the digest does not depend on the thread count). Always NULL. */
static void *tree_worker(void *arg) {
  tree_job *j = arg;
  const size_t cap = 1 << 20;
  unsigned char *buf = malloc(cap);
  long long i;
  if (!buf) atomic_store(&j->bad, 1);
  while (buf && !atomic_load(&j->bad) && !atomic_load(j->in->cancel) && (i = atomic_fetch_add(&j->next, 1)) < j->npieces) {
    qc_sha256 c;
    qc_sha256_init(&c);
    long long off = i * QC_PROV_PIECE, end = off + QC_PROV_PIECE < j->in->size ? off + QC_PROV_PIECE : j->in->size;
    while (off < end) {
      if (atomic_load(j->in->cancel)) { /* stopped: within a read of 1 MiB, as the single stream */
        atomic_store(&j->bad, 1);
        break;
      }
      const size_t k = (size_t)(end - off) < cap ? (size_t)(end - off) : cap;
      if (qc_pread_full(j->fd, buf, k, off)) { /* a read failed, or the file ended early */
        atomic_store(&j->bad, 1);
        break;
      }
      qc_sha256_update(&c, buf, k);
      off += (long long)k;
    }
    qc_sha256_final(&c, j->dig[i]);
  }
  free(buf);
  return NULL;
}

/* The hashing threads of the process's trees: half the cores, 2 to 8
 * (1 where the run has one thread), shared by its inputs: each input's own
 * thread, and extra ones while fewer than that many run (the audit runs
 * beside them on its thread pool; its first seconds share the cores, and
 * a short audit no longer waits for one stream). */
static atomic_int g_tree_extra; /* extra hashing threads running, every input's */

static int tree_workers(void) {
  const int t = qc_par_threads(), w = t / 2;
  return w < 2 ? (t < 2 ? 1 : 2) : w > 8 ? 8 : w;
}

/* in's SHA-256 tree from fd into in->sha (in->hashed 1), or nothing (a
 * read failed, the file changed size, or the provenance stopped). */
static void tree_hash(qc_prov_input *in, int fd) {
  tree_job j = {.in = in, .fd = fd, .npieces = (in->size + QC_PROV_PIECE - 1) / QC_PROV_PIECE};
  atomic_init(&j.next, 0);
  atomic_init(&j.bad, 0);
  pthread_t th[8];
  int nt = 0;
  if (!(j.dig = malloc((size_t)j.npieces * sizeof *j.dig))) return;
  for (int w = tree_workers(); nt < w - 1 && nt < 7; nt++) {
    if (atomic_fetch_add(&g_tree_extra, 1) >= w - 1 || pthread_create(&th[nt], NULL, tree_worker, &j) != 0) {
      atomic_fetch_sub(&g_tree_extra, 1); /* the process's extra threads are all busy, or none can start */
      break;
    }
  }
  tree_worker(&j);
  for (int t = 0; t < nt; t++) pthread_join(th[t], NULL);
  atomic_fetch_sub(&g_tree_extra, nt);
  struct stat st;
  if (!atomic_load(&j.bad) && !atomic_load(in->cancel) && fstat(fd, &st) == 0 && st.st_size == in->size) {
    qc_sha256 c;
    qc_sha256_init(&c);
    qc_sha256_update(&c, j.dig, (size_t)j.npieces * sizeof *j.dig);
    qc_sha256_final_hex(&c, in->sha);
    in->tree = 1;
    in->hashed = 1;
  }
  free(j.dig);
}

/* Hash one input's file into in->sha (in->hashed 1), or give up on it
 * (in->hashed -1: unreadable, or the provenance stopped). Always NULL. */
static void *hash_thread(void *arg) {
  qc_prov_input *in = arg;
  int fd = open(in->path, O_RDONLY | O_NONBLOCK | O_CLOEXEC);
  in->hashed = -1;
  if (fd < 0) return NULL;
  if (in->size > QC_PROV_PIECE) {
    tree_hash(in, fd);
    close(fd);
    return NULL;
  }
  size_t cap = 1 << 20;
  unsigned char *buf = malloc(cap);
  qc_sha256 c;
  qc_sha256_init(&c);
  ssize_t k = 0;
  while (buf && !atomic_load(in->cancel) && (k = read(fd, buf, cap)) > 0) qc_sha256_update(&c, buf, (size_t)k);
  if (buf && k == 0 && !atomic_load(in->cancel)) {
    qc_sha256_final_hex(&c, in->sha);
    in->hashed = 1;
  }
  free(buf);
  close(fd);
  return NULL;
}

int qc_prov_has(const qc_prov *p, const char *role, dev_t dev, ino_t ino) {
  for (int i = 0; i < p->ninput; i++)
    if (p->in[i]->dev == dev && p->in[i]->ino == ino && strcmp(p->in[i]->role, role) == 0) return 1;
  return 0;
}

int qc_prov_add(qc_prov *p, const char *role, const char *path, long long size, dev_t dev, ino_t ino) {
  qc_prov_input **nv = realloc(p->in, (size_t)(p->ninput + 1) * sizeof *nv);
  if (!nv) return qc_err_sys("out of memory recording input '%s'", path);
  p->in = nv;
  qc_prov_input *in = calloc(1, sizeof *in);
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
  p->in[p->ninput] = in;
  in->size = size;
  in->dev = dev;
  in->ino = ino;
  in->cancel = &p->cancel;
  p->ninput++;
  if (pthread_create(&in->th, NULL, hash_thread, in) == 0) in->started = 1;
  else hash_thread(in); /* no thread: hash it here */
  return QC_OK;
}

/* Wait for every input's hash (from the main thread or the watchdog's). */
static void qc_prov_join(qc_prov *p) {
  pthread_mutex_lock(&p->join);
  for (int i = 0; i < p->ninput; i++)
    if (p->in[i]->started) {
      pthread_join(p->in[i]->th, NULL);
      p->in[i]->started = 0;
    }
  pthread_mutex_unlock(&p->join);
}

void qc_prov_stop(qc_prov *p) {
  atomic_store(&p->cancel, 1);
  qc_prov_join(p);
  for (int i = 0; i < p->ninput; i++)
    if (p->in[i]->hashed != 1) p->in[i]->hashed = -1;
}

void qc_prov_free(qc_prov *p) {
  qc_prov_join(p);
  for (int i = 0; i < p->ninput; i++) {
    free(p->in[i]->role);
    free(p->in[i]->path);
    free(p->in[i]);
  }
  free(p->in);
  pthread_mutex_destroy(&p->join);
  memset(p, 0, sizeof *p);
}

void qc_prov_json(qc_prov *p, cJSON *root) {
  cJSON *cl = cJSON_AddArrayToObject(root, "command_line");
  for (int i = 0; p && cl && p->argv && i < p->argc; i++) cJSON_AddItemToArray(cl, cJSON_CreateString(p->argv[i]));
  const double t0 = qc_now_s();
  if (p) qc_prov_join(p);
  if (qc_verbose && qc_now_s() - t0 >= 0.05) fprintf(stderr, "qatcheck: %.3f s waiting for the inputs' SHA-256\n", qc_now_s() - t0);
  cJSON *ins = cJSON_AddArrayToObject(root, "inputs");
  for (int i = 0; p && ins && i < p->ninput; i++) {
    const qc_prov_input *in = p->in[i];
    cJSON *o = cJSON_CreateObject();
    cJSON_AddStringToObject(o, "role", in->role);
    cJSON_AddStringToObject(o, "path", in->path);
    cJSON_AddNumberToObject(o, "size", (double)in->size);
    if (in->hashed == 1 && in->tree) {
      cJSON_AddStringToObject(o, "sha256_tree", in->sha);
      cJSON_AddNumberToObject(o, "tree_piece", (double)QC_PROV_PIECE);
    } else if (in->hashed == 1) {
      cJSON_AddStringToObject(o, "sha256", in->sha);
    } else {
      cJSON_AddNullToObject(o, "sha256");
    }
    cJSON_AddItemToArray(ins, o);
  }
}

void qc_prov_cmdline(const qc_prov *p, qc_sbuf *b) {
  qc_sbuf_printf(b, "qatcheck");
  for (int i = 0; p && p->argv && i < p->argc; i++) {
    const char *a = p->argv[i];
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

void qc_prov_markdown(qc_prov *p, qc_sbuf *b) {
  if (!p) return;
  if (p->argv) {
    qc_sbuf s = {0};
    qc_prov_cmdline(p, &s);
    qc_sbuf_printf(b, "- command: `");
    qc_sbuf_md(b, s.s ? s.s : "");
    qc_sbuf_printf(b, "`\n");
    qc_sbuf_free(&s);
  }
  qc_prov_join(p);
  for (int i = 0; i < p->ninput; i++) {
    const qc_prov_input *in = p->in[i];
    qc_sbuf_printf(b, "- %s: `", in->role);
    qc_sbuf_md(b, in->path);
    if (in->hashed == 1 && in->tree)
      qc_sbuf_printf(b, "`, %lld bytes, sha256 tree of %lld MiB pieces `%s`\n", in->size, QC_PROV_PIECE >> 20, in->sha);
    else
      qc_sbuf_printf(b, "`, %lld bytes, sha256 `%s`\n", in->size, in->hashed == 1 ? in->sha : "-");
  }
}
