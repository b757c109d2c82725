/* prefetch.c: the read-ahead of items into slots (see prefetch.h). */
#include "io/prefetch.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/qc.h"

typedef struct job {
  qc_prefetch *p;
  qc_pf_slot *s;
} job;

/* Run the fetch of slot s's item; keep a failure's message in the slot. */
static void run_fetch(qc_prefetch *p, qc_pf_slot *s, int threaded) {
  if (threaded) qc_err_clear(); /* a worker thread starts fresh for each item */
  s->err[0] = s->hint[0] = 0;
  s->rc = p->fetch(p->arg, s->item, (int)(s - p->s));
  if (s->rc && threaded) {
    snprintf(s->err, sizeof s->err, "%s", qc_err_msg());
    snprintf(s->hint, sizeof s->hint, "%s", qc_err_hint());
  }
}

static void *slot_worker(void *arg) {
  job *j = arg;
  run_fetch(j->p, j->s, 1);
  free(j);
  return NULL;
}

/* Start item `item` in its slot: on a thread when ahead > 0 (in this thread
 * if no thread can be made), else here. */
static void launch(qc_prefetch *p, int item) {
  qc_pf_slot *s = &p->s[item % p->nslot];
  s->item = item;
  s->rc = 0;
  s->started = 0;
  if (p->ahead > 0) {
    job *j = malloc(sizeof *j);
    if (j) {
      j->p = p;
      j->s = s;
      if (pthread_create(&s->th, NULL, slot_worker, j) == 0) {
        s->started = 1;
        p->launched++;
        return;
      }
      free(j);
    }
  }
  run_fetch(p, s, 0);
  p->launched++;
}

static void join(qc_pf_slot *s) {
  if (!s->started) return;
  pthread_join(s->th, NULL);
  s->started = 0;
}

/* With ahead > 0: start the next item when its slot is free and fewer than
 * `ahead` fetches run (items launched but not yet waited for). Called after
 * every wait and release, so the caller may hold the previous item past the
 * wait for the current one. */
static void launch_next(qc_prefetch *p) {
  if (!p->ahead || p->launched >= p->n || p->launched - p->waited >= p->ahead) return;
  if (p->s[p->launched % p->nslot].item >= 0) return; /* its slot still holds an item the caller has */
  launch(p, p->launched);
}

int qc_prefetch_start(qc_prefetch *p, int n, int ahead, qc_fetch_fn fetch, void *arg) {
  memset(p, 0, sizeof *p);
  if (ahead > n - 1) ahead = n > 1 ? n - 1 : 0;
  if (ahead < 0) ahead = 0;
  p->fetch = fetch;
  p->arg = arg;
  p->n = n;
  p->ahead = ahead;
  p->nslot = ahead + 1;
  p->s = calloc((size_t)p->nslot, sizeof *p->s);
  if (!p->s) return qc_err_sys("out of memory for the read-ahead slots");
  for (int k = 0; k < p->nslot; k++) p->s[k].item = -1;
  for (int i = 0; i < (ahead ? ahead : 1) && i < n; i++) launch(p, i);
  return QC_OK;
}

int qc_prefetch_slots(const qc_prefetch *p) { return p->nslot; }

int qc_prefetch_wait(qc_prefetch *p, int i, int *slot) {
  qc_pf_slot *s = &p->s[i % p->nslot];
  if (s->item != i) return qc_err_sys("read-ahead: item %d was not started (slot holds %d)", i, s->item);
  join(s);
  *slot = i % p->nslot;
  if (s->rc) {
    /* the first failing item: let the other workers finish, then raise the
     * message its worker left in the slot */
    for (int k = 0; k < p->nslot; k++) join(&p->s[k]);
    if (p->ahead) {
      qc_err_clear(); /* replaced: the worker's message is the error */
      if (s->rc == QC_ESYS) qc_err_sys("%s", s->err[0] ? s->err : "reading failed on a worker thread");
      else qc_err("%s", s->err[0] ? s->err : "reading failed on a worker thread");
      if (s->hint[0]) qc_hint("%s", s->hint);
    }
    return s->rc;
  }
  p->waited = i + 1;
  launch_next(p); /* the slot of item i-1 is free unless the caller still holds it */
  return QC_OK;
}

int qc_prefetch_release(qc_prefetch *p, int i) {
  qc_pf_slot *s = &p->s[i % p->nslot];
  s->item = -1;
  if (!p->ahead && p->launched < p->n) launch(p, p->launched); /* one item in memory: read the next now */
  else launch_next(p);
  return QC_OK;
}

void qc_prefetch_stop(qc_prefetch *p) {
  for (int k = 0; p->s && k < p->nslot; k++) join(&p->s[k]);
  free(p->s);
  p->s = NULL;
}
