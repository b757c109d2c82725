/* sft_read.c: the read side of bench/sft.sh: the logs of a case's arms
 * parsed by qatcheck's readers and nothing else (no configs, no checks):
 * what `qatcheck sft` cannot do without.
 *   usage: sft_read LOG... */
#include <stdio.h>

#include "core/qc.h"
#include "io/l3log.h"

int main(int argc, char **argv) {
  long rows = 0;
  for (int i = 1; i < argc; i++) {
    qc_l3_log l;
    if (qc_log_read(argv[i], &l)) {
      qc_err_print();
      return 2;
    }
    rows += (long)l.n;
    qc_l3_log_free(&l);
  }
  printf("%ld rows\n", rows);
  return 0;
}
