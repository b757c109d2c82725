/* test_qlayout.c: the scale-group grid of every format (qc_qlayout), which
 * the CUDA quantizers and their tests size their outputs by, and the fused
 * linear audit's device memory estimate. */
#include <criterion/criterion.h>
#include <string.h>

#include "backend/backend.h"
#include "core/qc.h"
#include "numerics/metrics.h"

Test(qlayout, grids_of_every_format) {
  struct { const char *f; int64_t gr, gc, sr, sc; int packed; } want[] = {
      {"fp8_tensor", 300, 456, 1, 1, 0},        {"fp8_token", 1, 456, 300, 1, 0},
      {"fp8_channel", 1, 456, 300, 1, 0},       {"fp8_group128", 1, 128, 300, 4, 0},
      {"fp8_group128_ue8m0", 1, 128, 300, 4, 0}, {"fp8_block128", 128, 128, 3, 4, 0},
      {"fp8_block128_ue8m0", 128, 128, 3, 4, 0}, {"nvfp4", 1, 16, 300, 29, 1},
      {"mxfp8", 1, 32, 300, 15, 0},             {"mxfp4", 1, 32, 300, 15, 1}};
  for (size_t i = 0; i < sizeof want / sizeof want[0]; i++) {
    int64_t gr, gc, sr, sc;
    int packed;
    cr_assert_eq(qc_qlayout(want[i].f, 300, 456, &gr, &gc, &sr, &sc, &packed), QC_OK, "%s", want[i].f);
    cr_expect(gr == want[i].gr && gc == want[i].gc && sr == want[i].sr && sc == want[i].sc && packed == want[i].packed,
              "%s: group %lldx%lld grid %lldx%lld packed %d", want[i].f, (long long)gr, (long long)gc, (long long)sr,
              (long long)sc, packed);
  }
}

Test(qlayout, unknown_format_named) {
  int64_t a, b, c, d;
  int p;
  qc_err_clear();
  cr_expect_eq(qc_qlayout("fp9_block", 4, 4, &a, &b, &c, &d, &p), QC_EINPUT);
  cr_expect(strstr(qc_err_msg(), "'fp9_block'") != NULL, "%s", qc_err_msg());
}

Test(qlayout, audit_bytes) {
  /* 8 bytes x (2NK + 2MK + MN + the fused pass's sums of both gradients,
   * which run at once on two streams) + 2 bytes x (2NK + MK) + 64 MiB; the
   * sums of [4, 2] and of [3, 2] (one block each: 13 doubles of block
   * partial, 2 a row a strip, 2 a column a chunk, 64 x 21 combined) */
  size_t want = 8 * (2 * 6 + 2 * 8 + 12 + (13 + 2 * 4 + 2 * 2 + 64 * 21) + (13 + 2 * 3 + 2 * 2 + 64 * 21)) + 2 * (2 * 6 + 8) +
                ((size_t)64 << 20);
  cr_expect_eq(qc_linear_audit_bytes(4, 2, 3), want);
  /* 8192 x 4096: 16 strips of 256 columns, 128 chunks of 64 rows */
  cr_expect_eq(qc_bias_dev_doubles(8192, 4096),
               (size_t)16 * 128 * 13 + (size_t)8192 * 16 * 2 + (size_t)128 * 4096 * 2 + 64 * 21);
}
