/* test_number.c: numbers given as text (src/core/number.h): the one
 * reader's range, whole and exclusive bounds, and the numeric environment
 * variables: a malformed or out-of-range value refused with one message,
 * never read as 0 (QATCHECK_RANK_TIMEOUT=abc turned the stall check off)
 * nor clamped; the readers that cannot fail fall back to their default. */
#include <criterion/criterion.h>
#include <stdlib.h>
#include <string.h>

#include "core/number.h"
#include "core/par.h"
#include "core/qc.h"

Test(number, read) {
  double d = 0;
  cr_expect(qc_num_read("3", 1, 5, QC_NUM_WHOLE, &d) && d == 3);
  cr_expect(qc_num_read("-0.5", -1, 1, 0, &d) && d == -0.5);
  cr_expect(qc_num_read("1e3", 0, 1e9, QC_NUM_WHOLE, &d) && d == 1000);
  cr_expect(!qc_num_read("4294967299", 2, 5, QC_NUM_WHOLE, &d)); /* no wrap to 3 */
  cr_expect(!qc_num_read("2.5", 0, 5, QC_NUM_WHOLE, &d));
  cr_expect(qc_num_read("9007199254740992", 0, 1e16, QC_NUM_WHOLE, &d) && d == 9007199254740992.0);
  cr_expect(!qc_num_read("9007199254740993", 0, 1e16, QC_NUM_WHOLE, &d)); /* not read as its nearest double, 2^53 */
  cr_expect(!qc_num_read("99999999999999999999", 0, 1e300, QC_NUM_WHOLE, &d));
  cr_expect(!qc_num_read("0", 0, 5, QC_NUM_ABOVE, &d));
  cr_expect(qc_num_read("1e-300", 0, 5, QC_NUM_ABOVE, &d));
  cr_expect(!qc_num_read("", 0, 5, 0, &d));
  cr_expect(!qc_num_read(NULL, 0, 5, 0, &d));
  cr_expect(!qc_num_read("abc", 0, 5, 0, &d));
  cr_expect(!qc_num_read("3x", 0, 5, 0, &d));
  cr_expect(!qc_num_read(" 3", 0, 5, 0, &d) || d == 3); /* strtod skips leading blanks: still the number */
  cr_expect(!qc_num_read("nan", -1e300, 1e300, 0, &d));
  cr_expect(!qc_num_read("inf", 0, 1e300, 0, &d));
  cr_expect(!qc_num_read("1e999", 0, 1e300, 0, &d));
  char buf[96];
  cr_expect_str_eq(qc_num_expected(buf, sizeof buf, 0, 1e9, 0), "a number from 0 to 1e9");
  cr_expect_str_eq(qc_num_expected(buf, sizeof buf, 1, 9007199254740992.0, QC_NUM_WHOLE),
                   "a whole number from 1 to 9007199254740992");
  cr_expect_str_eq(qc_num_expected(buf, sizeof buf, 1, 1e15, QC_NUM_ABOVE), "a number above 1, at most 1e15");
}

Test(number, environment) {
  double v = 0;
  setenv("QATCHECK_RANK_TIMEOUT", "abc", 1);
  qc_err_clear();
  cr_expect_eq(qc_env_num("QATCHECK_RANK_TIMEOUT", -1, &v), QC_EINPUT);
  cr_expect_eq(v, -1);
  cr_expect_str_eq(qc_err_msg(), "environment variable QATCHECK_RANK_TIMEOUT is 'abc': expected a number from 0 to 1e9");
  qc_err_clear();
  cr_expect_eq(qc_env_check(), QC_EINPUT);
  cr_expect_str_eq(qc_err_msg(), "environment variable QATCHECK_RANK_TIMEOUT is 'abc': expected a number from 0 to 1e9");
  setenv("QATCHECK_RANK_TIMEOUT", "5", 1);
  qc_err_clear();
  cr_expect_eq(qc_env_num("QATCHECK_RANK_TIMEOUT", -1, &v), QC_OK);
  cr_expect_eq(v, 5);
  unsetenv("QATCHECK_RANK_TIMEOUT");
  cr_expect_eq(qc_env_num("QATCHECK_RANK_TIMEOUT", -1, &v), QC_OK);
  cr_expect_eq(v, -1);
  /* out of range: refused, not clamped */
  setenv("QATCHECK_AHEAD", "9", 1);
  cr_expect_eq(qc_env_check(), QC_EINPUT);
  cr_expect_str_eq(qc_err_msg(), "environment variable QATCHECK_AHEAD is '9': expected a whole number from 0 to 8");
  qc_err_clear();
  cr_expect_eq(qc_env_value("QATCHECK_AHEAD", -1), -1); /* a reader that cannot fail: its default, no message */
  cr_expect_str_eq(qc_err_msg(), "");
  unsetenv("QATCHECK_AHEAD");
  setenv("QATCHECK_MEM_FREE", "-1", 1); /* was strtoull: 2^64 - 1 bytes */
  cr_expect_eq(qc_env_check(), QC_EINPUT);
  qc_err_clear();
  unsetenv("QATCHECK_MEM_FREE");
  setenv("QATCHECK_HDF5_DEADLINE", "0", 1); /* was ignored silently */
  cr_expect_eq(qc_env_check(), QC_EINPUT);
  qc_err_clear();
  unsetenv("QATCHECK_HDF5_DEADLINE");
  /* QATCHECK_THREADS=abc read as 1 thread before; now refused, and qc_par_threads keeps its default */
  setenv("QATCHECK_THREADS", "abc", 1);
  cr_expect_eq(qc_env_check(), QC_EINPUT);
  qc_err_clear();
  unsetenv("QATCHECK_THREADS");
  int dflt = qc_par_threads();
  setenv("QATCHECK_THREADS", "abc", 1);
  cr_expect_eq(qc_par_threads(), dflt);
  setenv("QATCHECK_THREADS", "2", 1);
  cr_expect_eq(qc_par_threads(), 2);
  unsetenv("QATCHECK_THREADS");
  cr_expect_eq(qc_env_check(), QC_OK);
  /* a name the table does not declare */
  cr_expect_eq(qc_env_num("QATCHECK_NO_SUCH", 0, &v), QC_EINPUT);
  qc_err_clear();
}
