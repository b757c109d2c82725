/* open.c: picks a backend from --device. Never falls back: asking for a GPU
 * that is not there is an error, not a quiet CPU run. */
#include <stdlib.h>
#include <string.h>

#include "../qc.h"
#include "backend.h"

#ifdef QC_HAVE_CUDA
int qc_backend_cuda_open(int device, const qc_backend **out);
void qc_backend_cuda_close(const qc_backend *be);
#endif

int qc_backend_open(const char *device, const qc_backend **out) {
  if (!device || strcmp(device, "cpu") == 0) {
    *out = qc_backend_cpu();
    return QC_OK;
  }
  if (strncmp(device, "cuda", 4) == 0 && (device[4] == 0 || device[4] == ':')) {
    int idx = 0;
    if (device[4] == ':') {
      char *end;
      long v = strtol(device + 5, &end, 10);
      if (!device[5] || *end || v < 0 || v > 1024)
        return qc_err("--device '%s': expected cpu, cuda or cuda:N with N a device index", device);
      idx = (int)v;
    }
#ifdef QC_HAVE_CUDA
    return qc_backend_cuda_open(idx, out);
#else
    (void)idx;
    qc_err("--device '%s': this qatcheck was built without CUDA", device);
    qc_hint("install the CUDA toolkit (nvcc) and rebuild, or use --device cpu");
    return QC_EINPUT;
#endif
  }
  return qc_err("--device '%s': expected cpu, cuda or cuda:N", device);
}

void qc_backend_close(const qc_backend *be) {
  if (!be || be == qc_backend_cpu()) return;
#ifdef QC_HAVE_CUDA
  qc_backend_cuda_close(be);
#endif
}
