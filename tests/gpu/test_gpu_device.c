/* test_gpu_device.c: GPU tests. Without a device every test reports skipped. */
#include <criterion/criterion.h>

#include "backend/backend.h"
#include "core/qc.h"

Test(gpu, backend_opens) {
  const qc_backend *be = NULL;
  int rc = qc_backend_open("cuda:0", &be);
  if (rc != QC_OK) cr_skip_test("no CUDA device: %s", qc_err_msg());
  cr_expect_not_null(be);
  qc_backend_close(be);
}
