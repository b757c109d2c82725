/* st_read.c: the safetensors reader alone (bench/contract.sh, FORMAT=
 * safetensors): every tensor of a checkpoint copied out of the page cache
 * into per-thread buffers by T threads (tensor i on thread i % T), once by
 * pread and once by mmap (QATCHECK_ST_READ=mmap), as the sweep's readers do
 * before their finiteness scan. Prints "st_read <mode> <threads> <GB> <s>".
 * usage: st_read CHECKPOINT [THREADS] */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/qc.h"
#include "io/safetensors.h"

typedef struct job {
  const qc_st *st;
  int tid, nt, rc;
  double bytes;
} job;

static void *run(void *arg) {
  job *j = arg;
  size_t cap = 0;
  void *buf = NULL;
  for (int i = j->tid; i < qc_st_count(j->st) && !j->rc; i += j->nt) {
    const qc_st_tensor *t = qc_st_at(j->st, i);
    if (t->nbytes > cap) {
      free(buf);
      cap = t->nbytes;
      if (!(buf = malloc(cap))) { j->rc = 1; break; }
      memset(buf, 0, cap); /* fault the pages in once, as the sweep's pinned slots are */
    }
    j->rc = qc_st_read(j->st, t, -1, buf, t->nbytes);
    j->bytes += (double)t->nbytes;
  }
  free(buf);
  return NULL;
}

int main(int argc, char **argv) {
  if (argc < 2) { fprintf(stderr, "usage: st_read CHECKPOINT [THREADS]\n"); return 2; }
  int nt = argc > 2 ? atoi(argv[2]) : 1;
  if (nt < 1 || nt > 64) nt = 1;
  for (int mode = 0; mode < 2; mode++) {
    if (mode) setenv("QATCHECK_ST_READ", "mmap", 1);
    qc_st *st;
    if (qc_st_open(argv[1], &st)) { qc_err_print(); return 2; }
    job j[64];
    pthread_t th[64];
    double t0 = qc_now_s(), bytes = 0;
    for (int k = 0; k < nt; k++) {
      j[k] = (job){.st = st, .tid = k, .nt = nt};
      if (pthread_create(&th[k], NULL, run, &j[k])) { fprintf(stderr, "st_read: cannot start a thread\n"); return 2; }
    }
    int bad = 0;
    for (int k = 0; k < nt; k++) {
      pthread_join(th[k], NULL);
      bad |= j[k].rc;
      bytes += j[k].bytes;
    }
    double t = qc_now_s() - t0;
    qc_st_close(st);
    if (bad) { fprintf(stderr, "st_read: a read failed\n"); return 2; }
    printf("st_read %s %d %.3f %.3f\n", mode ? "mmap" : "pread", nt, bytes / 1e9, t);
  }
  return 0;
}
