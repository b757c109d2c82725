/* number.c: numbers given as text (number.h), and the table of qatcheck's
 * numeric environment variables. */
#include "core/number.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/qc.h"

int qc_num_read(const char *s, double lo, double hi, unsigned how, double *out) {
  char *end;
  if (!s || !*s) return 0;
  errno = 0;
  double d = strtod(s, &end);
  if (end == s || *end || errno == ERANGE || !isfinite(d)) return 0;
  if ((how & QC_NUM_ABOVE) ? !(d > lo) : !(d >= lo)) return 0;
  if (d > hi) return 0;
  if ((how & QC_NUM_WHOLE) && d != floor(d)) return 0;
  if ((how & QC_NUM_WHOLE) && s[strspn(s, "+-0123456789")] == 0) { /* digits: the integer written, not its nearest double */
    errno = 0;
    long long i = strtoll(s, &end, 10);
    if (errno || *end || (double)i != d || (long long)d != i) return 0;
  }
  *out = d;
  return 1;
}

/* d as a message writes it: a large power of ten as 1eN, else every digit. */
static const char *num_text(char *buf, size_t n, double d) {
  double e = d >= 1e6 ? floor(log10(d) + 0.5) : 0;
  if (e > 0 && d == pow(10, e)) snprintf(buf, n, "1e%.0f", e);
  else snprintf(buf, n, "%.16g", d);
  return buf;
}

const char *qc_num_expected(char *buf, size_t n, double lo, double hi, unsigned how) {
  char l[32], h[32];
  snprintf(buf, n, (how & QC_NUM_ABOVE) ? "%s above %s, at most %s" : "%s from %s to %s",
           (how & QC_NUM_WHOLE) ? "a whole number" : "a number", num_text(l, sizeof l, lo), num_text(h, sizeof h, hi));
  return buf;
}

/* One numeric environment variable: its name and range (who reads it). */
typedef struct env_num {
  const char *name;
  double lo, hi;
  unsigned how;
} env_num;

static const env_num g_env[] = {
    {"QATCHECK_THREADS", 1, 65536, QC_NUM_WHOLE},             /* core/par.c: the host threads (at most QC_PAR_MAX used) */
    {"QATCHECK_AHEAD", 0, 8, QC_NUM_WHOLE},                   /* sweep/pipeline.c, engine/vjp.c: units read ahead (QC_MAX_AHEAD) */
    {"QATCHECK_MEM_FREE", 0, 9007199254740992.0, QC_NUM_WHOLE}, /* engine/split.c: free device bytes, pretended */
    {"QATCHECK_HOST_MEMORY", 1, 9007199254740992.0, QC_NUM_WHOLE}, /* engine/audit_vars.c: host bytes a diagnosis may assume */
    {"QATCHECK_RANK_TIMEOUT", 0, 1e9, 0},                     /* dist/dist.c: seconds, 0: off (as --rank-timeout) */
    {"QATCHECK_HDF5_DEADLINE", 0, 86400, QC_NUM_ABOVE},       /* io/dump_box.c: the dump sandbox's seconds of CPU */
};

/* The table's row for name, or NULL. */
static const env_num *env_find(const char *name) {
  for (size_t i = 0; i < sizeof g_env / sizeof g_env[0]; i++)
    if (strcmp(g_env[i].name, name) == 0) return &g_env[i];
  return NULL;
}

int qc_env_num(const char *name, double dflt, double *out) {
  const env_num *e = env_find(name);
  const char *v = getenv(name);
  *out = dflt;
  if (!e) return qc_err("environment variable %s: not a numeric variable qatcheck declares", name);
  if (!v || !*v) return QC_OK;
  if (qc_num_read(v, e->lo, e->hi, e->how, out)) return QC_OK;
  *out = dflt;
  char want[96];
  return qc_err("environment variable %s is '%s': expected %s", name, v, qc_num_expected(want, sizeof want, e->lo, e->hi, e->how));
}

double qc_env_value(const char *name, double dflt) {
  const env_num *e = env_find(name);
  double v;
  return e && qc_num_read(getenv(name), e->lo, e->hi, e->how, &v) ? v : dflt;
}

int qc_env_check(void) {
  for (size_t i = 0; i < sizeof g_env / sizeof g_env[0]; i++) {
    double v;
    int rc = qc_env_num(g_env[i].name, 0, &v);
    if (rc) return rc;
  }
  return QC_OK;
}
