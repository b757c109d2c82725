/* quant.c: format dispatch for fake quantization (see quant.h). */
#include "quant.h"

#include <math.h>
#include <string.h>

#include "../qc.h"

int qc_quant_known(const char *fmt) {
  return strcmp(fmt, "none") == 0;
}

int qc_fake_quant(const char *fmt, const char *profile, int64_t rows, int64_t cols, const float *in, float *out,
                  const char *what) {
  (void)profile;
  for (int64_t i = 0; i < rows * cols; i++)
    if (!isfinite(in[i])) return qc_err("%s: non-finite value at flat index %lld: a quantizer never maps NaN or Inf silently", what, (long long)i);
  if (strcmp(fmt, "none") == 0) {
    if (out != in) memmove(out, in, (size_t)(rows * cols) * sizeof *out);
    return QC_OK;
  }
  return qc_err("%s: format '%s' is not implemented", what, fmt);
}
