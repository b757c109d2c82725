/* test_prefetch.c: the read-ahead (io/prefetch.h): every item fetched once,
 * in its slot, handed out in order, at most `ahead` fetches at once and
 * never into a slot still in use; a fetch's error comes back from wait with
 * its message, from a worker thread too; a caller that keeps the previous
 * item until the current one is handed out (the contract sweep's pipeline)
 * gets the same, and ahead = 0 cannot serve it (an error, not a hang). */
#include <criterion/criterion.h>
#include <pthread.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "core/qc.h"
#include "io/prefetch.h"

#define NMAX 64
typedef struct st {
  pthread_mutex_t mu;
  int slot_item[16];      /* what each slot holds, as the fetches wrote it */
  int fetched[NMAX];
  int inflight, max_inflight;
  int fail_at;            /* item whose fetch fails (-1 none) */
  int in_use[16];         /* the caller holds this slot */
} st;

static int fetch(void *arg, int item, int slot) {
  st *s = arg;
  pthread_mutex_lock(&s->mu);
  if (++s->inflight > s->max_inflight) s->max_inflight = s->inflight;
  int clash = s->in_use[slot];
  pthread_mutex_unlock(&s->mu);
  usleep(200 + (item % 3) * 300);
  pthread_mutex_lock(&s->mu);
  s->inflight--;
  s->fetched[item]++;
  s->slot_item[slot] = clash ? -999 : item;
  pthread_mutex_unlock(&s->mu);
  if (item == s->fail_at) return qc_err("item %d: bad data", item);
  return QC_OK;
}

static void run(int n, int ahead, int fail_at) {
  st s;
  memset(&s, 0, sizeof s);
  pthread_mutex_init(&s.mu, NULL);
  s.fail_at = fail_at;
  qc_err_clear();
  qc_prefetch p;
  cr_assert_eq(qc_prefetch_start(&p, n, ahead, fetch, &s), QC_OK);
  int want_ahead = ahead > n - 1 ? (n > 1 ? n - 1 : 0) : ahead;
  cr_expect_eq(qc_prefetch_slots(&p), want_ahead + 1);
  int i, rc = QC_OK, slot;
  for (i = 0; i < n; i++) {
    rc = qc_prefetch_wait(&p, i, &slot);
    if (rc) break;
    cr_expect_eq(slot, i % (want_ahead + 1));
    s.in_use[slot] = 1;
    cr_expect_eq(s.slot_item[slot], i, "n %d ahead %d: slot %d holds item %d, expected %d", n, ahead, slot, s.slot_item[slot], i);
    usleep(300);
    s.in_use[slot] = 0;
    cr_assert_eq(qc_prefetch_release(&p, i), QC_OK);
  }
  qc_prefetch_stop(&p);
  qc_prefetch_stop(&p); /* twice is harmless */
  if (fail_at >= 0 && fail_at < n) {
    cr_expect_eq(rc, QC_EINPUT);
    cr_expect_eq(i, fail_at, "the error comes back at its item");
    char want[64];
    snprintf(want, sizeof want, "item %d: bad data", fail_at);
    cr_expect_str_eq(qc_err_msg(), want);
  } else {
    cr_expect_eq(rc, QC_OK, "%s", qc_err_msg());
    for (int k = 0; k < n; k++) cr_expect_eq(s.fetched[k], 1, "item %d fetched %d times", k, s.fetched[k]);
  }
  cr_expect_leq(s.max_inflight, want_ahead ? want_ahead : 1, "n %d ahead %d: %d fetches at once", n, ahead, s.max_inflight);
  qc_err_clear();
}

Test(prefetch, every_item_in_order_in_its_slot) {
  for (int ahead = 0; ahead <= 4; ahead++)
    for (int n = 0; n <= 9; n++) run(n, ahead, -1);
}

Test(prefetch, a_failing_fetch_raises_its_message_at_its_item) {
  for (int ahead = 0; ahead <= 3; ahead++)
    for (int at = 0; at < 6; at++) run(6, ahead, at);
}

/* The pipeline's order: wait for item i, then release item i-1. */
static void run_lagged(int n, int ahead) {
  st s;
  memset(&s, 0, sizeof s);
  pthread_mutex_init(&s.mu, NULL);
  s.fail_at = -1;
  qc_err_clear();
  qc_prefetch p;
  cr_assert_eq(qc_prefetch_start(&p, n, ahead, fetch, &s), QC_OK);
  int nslot = qc_prefetch_slots(&p), rc = QC_OK, slot, prev = -1;
  for (int i = 0; i < n; i++) {
    rc = qc_prefetch_wait(&p, i, &slot);
    if (rc) break;
    cr_expect_eq(slot, i % nslot);
    pthread_mutex_lock(&s.mu);
    s.in_use[slot] = 1;
    pthread_mutex_unlock(&s.mu);
    cr_expect_eq(s.slot_item[slot], i, "n %d ahead %d: slot %d holds item %d, expected %d", n, ahead, slot, s.slot_item[slot], i);
    usleep(300);
    if (prev >= 0) {
      pthread_mutex_lock(&s.mu);
      s.in_use[prev] = 0;
      pthread_mutex_unlock(&s.mu);
      cr_assert_eq(qc_prefetch_release(&p, i - 1), QC_OK);
    }
    prev = slot;
  }
  if (!rc && prev >= 0) {
    s.in_use[prev] = 0;
    cr_assert_eq(qc_prefetch_release(&p, n - 1), QC_OK);
  }
  qc_prefetch_stop(&p);
  if (nslot == 1 && n > 1) {
    cr_expect_eq(rc, QC_ESYS, "n %d ahead %d: one slot cannot hold two items", n, ahead);
  } else {
    cr_expect_eq(rc, QC_OK, "n %d ahead %d: %s", n, ahead, qc_err_msg());
    for (int k = 0; k < n; k++) cr_expect_eq(s.fetched[k], 1, "item %d fetched %d times", k, s.fetched[k]);
  }
  cr_expect_leq(s.max_inflight, nslot > 1 ? nslot - 1 : 1, "n %d ahead %d: %d fetches at once", n, ahead, s.max_inflight);
  qc_err_clear();
}

Test(prefetch, previous_item_held_past_the_wait) {
  for (int ahead = 0; ahead <= 4; ahead++)
    for (int n = 0; n <= 9; n++) run_lagged(n, ahead);
}
