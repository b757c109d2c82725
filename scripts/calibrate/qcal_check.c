/* qcal_check.c: the host quantizers against calibration files, without the
 * rest of qatcheck (no HDF5, no cJSON), for a GPU machine that has only a C
 * compiler: calibrate.sh builds it from src/core, src/numerics,
 * src/io/qcal.c and src/engine/calib.c. `qatcheck quant --calibration`
 * runs the same comparison (and on --device cuda, the kernels).
 *
 *   qcal_check PATH...   exit 0: no byte differs; 1: some do; 2: bad input */
#include <stdio.h>
#include <stdlib.h>

#include "core/qc.h"
#include "engine/calib.h"


int main(int argc, char **argv) {
  qc_calib_row *r = NULL;
  int n = 0;
  if (argc < 2) { fprintf(stderr, "usage: qcal_check PATH...\n"); return 2; }
  if (qc_calib_check((const char *const *)argv + 1, argc - 1, NULL, &r, &n)) { qc_err_print(); return 2; }
  long long bad = 0, vals = 0;
  printf("%-20s %-20s %12s %8s %10s %10s %8s\n", "profile", "format", "values", "records", "payload", "scale", "global");
  for (int i = 0; i < n; i++) {
    printf("%-20s %-20s %12lld %8lld %10lld %10lld %8lld\n", r[i].profile, r[i].format, (long long)r[i].values,
           (long long)r[i].records, (long long)r[i].bad_payload, (long long)r[i].bad_scale, (long long)r[i].bad_global);
    if (r[i].first[0]) printf("    first: %s\n", r[i].first);
    bad += r[i].bad_payload + r[i].bad_scale + r[i].bad_global;
    vals += r[i].values;
  }
  printf("total: %lld values, %lld mismatching bytes over %d paths\n", vals, bad, n);
  free(r);
  return bad ? 1 : 0;
}
