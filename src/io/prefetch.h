/* prefetch.h: items read ahead, in order, on worker threads while the
 * caller works on the current one. The one read-ahead of qatcheck: `vjp`
 * reads the next module group of a dump this way, the contract sweep the
 * next units (a module, or one expert) into its pinned slots.
 *
 * Items 0 .. n-1 go through `nslot` = ahead + 1 slots: item i lives in slot
 * i % nslot from its fetch until the caller releases it. With ahead > 0 at
 * most `ahead` fetches run at once (never two for one slot), each on its
 * own thread; with ahead = 0 every fetch runs in the caller's thread, the
 * next one when the current item is released, so one item is in memory.
 *
 *   qc_prefetch p;
 *   qc_prefetch_start(&p, n, ahead, fetch, arg);
 *   for (i = 0; i < n; i++) {
 *     if ((rc = qc_prefetch_wait(&p, i, &slot))) break;   // the fetch's error, as if raised here
 *     ... use slot ...
 *     if ((rc = qc_prefetch_release(&p, i))) break;
 *   }
 *   qc_prefetch_stop(&p);                                   // always: joins the workers
 */
#ifndef QC_PREFETCH_H
#define QC_PREFETCH_H

#include <pthread.h>

/* Read item `item` into slot `slot` of the caller's arrays. Runs on a
 * worker thread when ahead > 0: it may not touch what the caller's thread
 * uses meanwhile (HDF5 included, unless under the caller's own lock).
 * Returns QC_OK or a status with qc_err set (in its own thread). */
typedef int (*qc_fetch_fn)(void *arg, int item, int slot);

typedef struct qc_pf_slot {
  pthread_t th;
  int started;        /* a worker thread is (or was) reading into it, not joined */
  int item;           /* the item it holds or is reading, -1 none */
  int rc;
  char err[1024], hint[512]; /* a worker's error message (qc_err is per thread) */
} qc_pf_slot;

typedef struct qc_prefetch {
  qc_fetch_fn fetch;
  void *arg;
  int n;              /* items */
  int ahead;          /* fetches in flight beside the current item */
  int nslot;          /* ahead + 1 */
  int launched;       /* items started so far */
  int waited;         /* items handed out by wait so far */
  qc_pf_slot *s;      /* [nslot] */
} qc_prefetch;

/* Start items 0 .. ahead-1 (item 0 in this thread when ahead is 0).
 * QC_OK, or QC_ESYS out of memory (nothing running). ahead is clamped to
 * [0, n - 1]. */
int qc_prefetch_start(qc_prefetch *p, int n, int ahead, qc_fetch_fn fetch, void *arg);
/* Wait for item i (the items in order, each once) and give its slot; start
 * item i + ahead in the slot released before. The caller may also keep item
 * i-1 until after this wait (a pipeline finishing item i-1 while item i is
 * under way; needs ahead >= 1): then item i + ahead starts when i-1 is
 * released, and at most ahead - 1 fetches run meanwhile. A failed fetch
 * returns its status with its message and hint as the current error, after
 * every other worker has finished. */
int qc_prefetch_wait(qc_prefetch *p, int i, int *slot);
/* The caller is done with item i: its slot may take another item (with
 * ahead = 0 the next item is fetched now, in this thread; its status comes
 * back from qc_prefetch_wait; with ahead > 0 the next item starts here when
 * it was waiting for this slot). */
int qc_prefetch_release(qc_prefetch *p, int i);
/* Join every worker still running; frees the slot table. Safe after any
 * return of the others, and twice. */
void qc_prefetch_stop(qc_prefetch *p);
/* Slots the caller must provide: ahead + 1 after the clamp (valid after start). */
int qc_prefetch_slots(const qc_prefetch *p);

#endif
