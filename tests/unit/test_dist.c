/* test_dist.c: src/dist/ in one process (the multi-process paths run in
 * tests/e2e/mpi.sh under mpirun): the assignment of units to ranks, and
 * the agreement, gather and all-reduce of a world of one. */
#include <criterion/criterion.h>
#include <stdlib.h>
#include <string.h>

#include "backend/backend.h"
#include "core/qc.h"
#include "dist/dist.h"

Test(dist, equal_costs_go_round_robin) {
  double c[10];
  int o[10];
  for (int i = 0; i < 10; i++) c[i] = 1;
  cr_assert_eq(qc_dist_assign_n(c, 10, 4, o), QC_OK);
  for (int i = 0; i < 10; i++) cr_assert_eq(o[i], i % 4, "unit %d on rank %d", i, o[i]);
}

Test(dist, longest_first_balances_the_work) {
  /* 5 -> r0; 4 -> r1; 3 -> r1 (4 < 5); 3 -> r0 (5 < 7); 1 -> r1 (7 < 8) */
  const double c[5] = {5, 4, 3, 3, 1};
  const int want[5] = {0, 1, 1, 0, 1};
  int o[5];
  cr_assert_eq(qc_dist_assign_n(c, 5, 2, o), QC_OK);
  for (int i = 0; i < 5; i++) cr_assert_eq(o[i], want[i], "unit %d on rank %d, expected %d", i, o[i], want[i]);
  /* the largest unit first, whatever its index: a big one last still goes to an idle rank */
  const double d[4] = {1, 1, 1, 9};
  cr_assert_eq(qc_dist_assign_n(d, 4, 2, o), QC_OK);
  cr_assert_eq(o[3], 0);
  cr_assert(o[0] == 1 && o[1] == 1 && o[2] == 1, "the small units share rank 1: %d %d %d", o[0], o[1], o[2]);
}

Test(dist, one_process_is_rank_0_of_1) {
  cr_assert_eq(qc_dist_begin(), QC_OK); /* not started by mpirun: nothing to join */
  cr_assert_eq(qc_dist_active(), 0);
  cr_assert_eq(qc_dist_rank(), 0);
  cr_assert_eq(qc_dist_size(), 1);
  int o[3];
  const double c[3] = {1, 2, 3};
  cr_assert_eq(qc_dist_assign(c, 3, o), QC_OK);
  cr_assert(o[0] == 0 && o[1] == 0 && o[2] == 0);
}

Test(dist, agreement_of_one_keeps_the_message) {
  qc_err_clear();
  qc_err("dump 'x.h5': module '/m': no grad_out");
  cr_assert_eq(qc_dist_agree(QC_EINPUT, 3), QC_EINPUT);
  cr_assert_str_eq(qc_err_msg(), "dump 'x.h5': module '/m': no grad_out"); /* no "rank 0:" in one process */
  qc_err_clear();
  cr_assert_eq(qc_dist_agree(QC_FAIL, -1), QC_OK, "a verdict is not an error");
  cr_assert_eq(qc_dist_finish(QC_FAIL), QC_FAIL, "the verdict comes back");
  cr_assert_eq(qc_dist_finish(QC_ESYS), QC_ESYS);
}

Test(dist, gather_and_allreduce_of_one) {
  const char msg[] = "rows";
  void *all = NULL;
  size_t lens[1] = {0};
  cr_assert_eq(qc_dist_gather(msg, sizeof msg, &all, lens), QC_OK);
  cr_assert_eq(lens[0], sizeof msg);
  cr_assert_str_eq((const char *)all, "rows");
  free(all);
  double v[3] = {1, 2, 3};
  const qc_backend *be = qc_backend_cpu();
  cr_assert_eq(qc_dist_allreduce(be, v, 3, QC_F64), QC_OK);
  cr_assert(v[0] == 1 && v[1] == 2 && v[2] == 3, "a sum over one rank is the value");
  qc_err_clear();
  cr_assert_eq(qc_dist_allreduce(be, v, 3, QC_I32), QC_EINPUT);
  cr_assert(strstr(qc_err_msg(), "all-reduce of element type"), "%s", qc_err_msg());
  qc_err_clear();
  cr_assert_eq(qc_dist_device_begin(be), QC_OK, "a host backend has no device collectives");
}

Test(dist, rank_timeout_below_the_heartbeat_is_refused) {
  qc_err_clear();
  cr_assert_eq(qc_dist_rank_timeout(0.01), QC_EINPUT, "a heartbeat every 20 ms cannot keep a 10 ms timeout");
  cr_assert(strstr(qc_err_msg(), "option '--rank-timeout' is '0.01': below the minimum of 1 s") != NULL, "%s", qc_err_msg());
  qc_err_clear();
  cr_assert_eq(qc_dist_rank_timeout(QC_RANK_TIMEOUT_MIN - 0.001), QC_EINPUT);
  qc_err_clear();
  cr_assert_eq(qc_dist_rank_timeout(-1), QC_EINPUT);
  qc_err_clear();
  cr_assert_eq(qc_dist_rank_timeout(0), QC_OK, "0 turns the check off");
  cr_assert_eq(qc_dist_rank_timeout(QC_RANK_TIMEOUT_MIN), QC_OK);
  cr_assert_eq(qc_dist_rank_timeout(QC_RANK_TIMEOUT_DEFAULT), QC_OK);
}
