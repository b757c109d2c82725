/* sft_gen.c: the logs of bench/sft.sh: three arms of N steps x 10 metrics,
 * each as JSONL (verl's {"step", "data"} lines, numbers as Python's repr
 * writes them: 17 significant digits) and as a TensorBoard event file (one
 * Event per scalar with wall_time, step and summary.value{tag, simple_value},
 * TFRecord-framed with masked CRC-32C, as the tensorboard writer does).
 *   usage: sft_gen DIR [STEPS] */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "core/crc32c.h"

static const char *const M[10] = {"loss", "val_nll", "grad_norm", "update_rms", "clip_ratio",
                                  "nonfinite", "tokens_per_s", "lr", "loss_scale", "tokens"};

static size_t varint(unsigned char *p, unsigned long long v) {
  size_t n = 0;
  do { p[n++] = (unsigned char)((v & 0x7f) | (v >= 0x80 ? 0x80 : 0)); v >>= 7; } while (v);
  return n;
}

static double metric(int k, long s, int arm) {
  double x = (double)s, w = 1e-3 * sin(0.37 * x + arm) * (arm != 0);
  switch (k) {
    case 0: return 2.0 * exp(-x / 30000.0) + 0.3 + w + 0.01 * sin(0.1 * x);
    case 1: return 2.1 * exp(-x / 30000.0) + 0.31 + w;
    case 2: return 1.0 + 0.5 * sin(x / 100.0) * sin(x / 7.0) + w;
    case 3: return 1e-4 * (1 + 0.1 * cos(x / 13.0)) * (1 + w);
    case 4: return 0.05 + 0.01 * sin(x / 1000.0);
    case 5: return 0;
    case 6: return 12345.678 + 100 * sin(x);
    case 7: return 1e-4 * fmin(1.0, x / 1000.0);
    case 8: return 1.0;
    default: return 4096.0 * x;
  }
}

static void record(FILE *f, const unsigned char *d, size_t n) {
  unsigned long long len = n;
  unsigned char h[12];
  memcpy(h, &len, 8);
  unsigned int c = qc_crc32c_mask(qc_crc32c(h, 8));
  memcpy(h + 8, &c, 4);
  fwrite(h, 1, 12, f);
  fwrite(d, 1, n, f);
  c = qc_crc32c_mask(qc_crc32c(d, n));
  fwrite(&c, 1, 4, f);
}

int main(int argc, char **argv) {
  if (argc < 2) { fprintf(stderr, "usage: sft_gen DIR [STEPS]\n"); return 2; }
  long steps = argc > 2 ? atol(argv[2]) : 100000;
  const char *arms[3] = {"under_test", "gradient_reference", "native_baseline"};
  char p[4096];
  for (int a = 0; a < 3; a++) {
    snprintf(p, sizeof p, "%s/%s", argv[1], arms[a]);
    mkdir(p, 0755);
    snprintf(p, sizeof p, "%s/%s/tb", argv[1], arms[a]);
    mkdir(p, 0755);
    snprintf(p, sizeof p, "%s/%s/metrics.jsonl", argv[1], arms[a]);
    FILE *j = fopen(p, "w");
    snprintf(p, sizeof p, "%s/%s/tb/events.out.tfevents.1700000000.bench", argv[1], arms[a]);
    FILE *t = fopen(p, "wb");
    if (!j || !t) { perror(p); return 1; }
    unsigned char ev[256];
    size_t n = 0;
    ev[n++] = 0x1a; /* file_version (field 3) */
    n += varint(ev + n, 13);
    memcpy(ev + n, "brain.Event:2", 13);
    record(t, ev, n + 13);
    for (long s = 1; s <= steps; s++) {
      fprintf(j, "{\"step\": %ld, \"data\": {", s);
      for (int k = 0; k < 10; k++) {
        double v = metric(k, s, a);
        fprintf(j, "%s\"%s\": %.17g", k ? ", " : "", M[k], v);
        /* Event {1: wall_time, 2: step, 5: Summary {1: Value {1: tag, 2: simple_value}}} */
        unsigned char val[64], sum[80];
        size_t nt = strlen(M[k]), nv = 0, ns = 0;
        val[nv++] = 0x0a;
        nv += varint(val + nv, nt);
        memcpy(val + nv, M[k], nt);
        nv += nt;
        val[nv++] = 0x15;
        float fv = (float)v;
        memcpy(val + nv, &fv, 4);
        nv += 4;
        sum[ns++] = 0x0a;
        ns += varint(sum + ns, nv);
        memcpy(sum + ns, val, nv);
        ns += nv;
        n = 0;
        ev[n++] = 0x09;
        double wt = 1.7e9 + 0.01 * (double)s;
        memcpy(ev + n, &wt, 8);
        n += 8;
        ev[n++] = 0x10;
        n += varint(ev + n, (unsigned long long)s);
        ev[n++] = 0x2a;
        n += varint(ev + n, ns);
        memcpy(ev + n, sum, ns);
        n += ns;
        record(t, ev, n);
      }
      fprintf(j, "}}\n");
    }
    fclose(j);
    fclose(t);
  }
  return 0;
}
