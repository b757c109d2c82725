/* quant_driver.c: qatcheck's numerics behind a byte pipe, for the
 * conformance scripts (scripts/conformance/conformance.py builds it).
 *   quant_driver enc e4m3|e5m2|e2m1|e8m0 START COUNT
 *       writes the encoding of float32 bit patterns START .. START+COUNT-1
 *       (e8m0: the byte of ceil2(x), the scale rule of mxfp8/mxfp4)
 *   quant_driver quant FMT PROFILE ROWS COLS [SEED SALT STEP]
 *       reads ROWS*COLS float32 from stdin, writes payload, scale and
 *       (nvfp4) global-scale bytes. Exit 2 with the error on bad input. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "numerics/formats.h"
#include "numerics/quant.h"
#include "core/qc.h"

static int enc(const char *fmt, unsigned long long start, unsigned long long count) {
  enum { CH = 1 << 20 };
  static uint8_t buf[CH];
  uint8_t (*f)(float) = strcmp(fmt, "e4m3") == 0   ? qc_f32_to_e4m3
                        : strcmp(fmt, "e5m2") == 0 ? qc_f32_to_e5m2
                        : strcmp(fmt, "e2m1") == 0 ? qc_f32_to_e2m1
                                                   : qc_e8m0_ceil;
  for (unsigned long long i = 0; i < count; i += CH) {
    size_t n = count - i < CH ? (size_t)(count - i) : CH;
    for (size_t j = 0; j < n; j++) {
      uint32_t u = (uint32_t)(start + i + j);
      float x;
      memcpy(&x, &u, 4);
      buf[j] = f(x);
    }
    if (fwrite(buf, 1, n, stdout) != n) return 3;
  }
  return 0;
}

int main(int argc, char **argv) {
  if (argc == 5 && strcmp(argv[1], "enc") == 0) return enc(argv[2], strtoull(argv[3], 0, 0), strtoull(argv[4], 0, 0));
  if (argc != 6 && argc != 9) {
    fprintf(stderr, "usage: quant_driver enc FMT START COUNT | quant FMT PROFILE ROWS COLS [SEED SALT STEP]\n");
    return 2;
  }
  qc_qfmt f;
  qc_qprof p;
  qc_sr sr = {0};
  if (qc_qfmt_parse(argv[2], &f) || qc_qprof_parse(argv[3], &p)) { qc_err_print(); return 2; }
  int64_t rows = atoll(argv[4]), cols = atoll(argv[5]);
  if (argc == 9) { sr.on = 1; sr.seed = strtoull(argv[6], 0, 0); sr.salt = (uint32_t)strtoul(argv[7], 0, 0); sr.step = (uint32_t)strtoul(argv[8], 0, 0); }
  float *x = malloc((size_t)(rows * cols) * 4 + 4);
  if (!x || fread(x, 4, (size_t)(rows * cols), stdin) != (size_t)(rows * cols)) { fprintf(stderr, "short input\n"); return 2; }
  qc_quantized z;
  if (qc_quantize(f, p, rows, cols, x, argc == 9 ? &sr : NULL, &z, "input")) { qc_err_print(); return 2; }
  fwrite(z.q.data, 1, z.q.nbytes, stdout);
  fwrite(z.scale.data, 1, z.scale.nbytes, stdout);
  if (z.gscale.data) fwrite(z.gscale.data, 1, z.gscale.nbytes, stdout);
  qc_quantized_free(&z);
  free(x);
  return 0;
}
