/* test_calib.c: the calibration files of scripts/calibrate/ (io/qcal.c)
 * and their comparison with the host quantizers (engine/calib.c): the
 * golden subset that real producers made on an H200 is reproduced byte
 * for byte, path by path; malformed files are refused naming the file. */
#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/qc.h"
#include "engine/calib.h"
#include "io/qcal.h"

Test(calib, golden_subset_is_reproduced) {
  const char *paths[] = {"tests/data/calib"};
  qc_calib_row *r = NULL;
  int n = 0;
  cr_assert_eq(qc_calib_check(paths, 1, NULL, &r, &n), QC_OK, "%s", qc_err_msg());
  cr_expect_eq(n, 50, "producer paths");
  for (int i = 0; i < n; i++) {
    cr_expect(r[i].values > 40000, "%s/%s: %lld values", r[i].profile, r[i].format, (long long)r[i].values);
    cr_expect_eq(r[i].bad_payload + r[i].bad_scale + r[i].bad_global, 0, "%s/%s: %s", r[i].profile, r[i].format, r[i].first);
  }
  free(r);
}

/* Write bytes to a temporary file, return its path. */
static const char *tmpfile_with(const void *b, size_t n) {
  static char path[] = "/tmp/qc_calib_XXXXXX";
  strcpy(path, "/tmp/qc_calib_XXXXXX");
  int fd = mkstemp(path);
  cr_assert(fd >= 0);
  FILE *f = fdopen(fd, "wb");
  cr_assert(f && fwrite(b, 1, n, f) == n && fclose(f) == 0);
  return path;
}

Test(calib, malformed_files_are_refused) {
  qc_qcal q;
  uint8_t buf[256];
  memset(buf, 0, sizeof buf);
  memcpy(buf, "QCAL0001", 8);
  uint32_t tag = 7;
  memcpy(buf + 8, &tag, 4); /* an unknown chunk tag, empty body */
  const char *p = tmpfile_with(buf, 24);
  qc_err_clear();
  cr_expect_eq(qc_qcal_read(p, &q), QC_EINPUT);
  cr_expect(strstr(qc_err_msg(), "unknown chunk tag 7") && strstr(qc_err_msg(), p), "%s", qc_err_msg());
  remove(p);
  /* an input whose element count does not match its bytes */
  tag = 1;
  uint64_t len = 56 + 8;
  int64_t rows = 3, cols = 5;
  memcpy(buf + 8, &tag, 4);
  memcpy(buf + 16, &len, 8);
  memcpy(buf + 24 + 8, &rows, 8);
  memcpy(buf + 24 + 16, &cols, 8);
  p = tmpfile_with(buf, 24 + len);
  qc_err_clear();
  cr_expect_eq(qc_qcal_read(p, &q), QC_EINPUT);
  cr_expect(strstr(qc_err_msg(), "[3, 5]") != NULL, "%s", qc_err_msg());
  remove(p);
  /* an output naming an input that is not there */
  memset(buf + 8, 0, sizeof buf - 8);
  tag = 2;
  len = 72;
  memcpy(buf + 8, &tag, 4);
  memcpy(buf + 16, &len, 8);
  memcpy(buf + 24, "vllm", 4);
  memcpy(buf + 48, "fp8_block128", 12);
  p = tmpfile_with(buf, 24 + len);
  qc_err_clear();
  cr_expect_eq(qc_qcal_read(p, &q), QC_EINPUT);
  cr_expect(strstr(qc_err_msg(), "names input 0") != NULL, "%s", qc_err_msg());
  remove(p);
  qc_err_clear();
}
