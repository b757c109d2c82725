/* names.c: the names layer 2 gives modules: class and layer of a path, a
 * routed expert's own name, the seed of generated data (see sweep.h). */
#include <ctype.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/qc.h"
#include "sweep/sweep.h"

/* Is [s, s+n) a non-empty run of digits? */
static int all_digits(const char *s, size_t n) {
  if (n == 0) return 0;
  for (size_t i = 0; i < n; i++)
    if (!isdigit((unsigned char)s[i])) return 0;
  return 1;
}

void qc_contract_classify(const char *path, char *cls, int clslen, int *layer, int *expert) {
  size_t o = 0, cap = (size_t)clslen;
  int prev_experts = 0;
  *layer = -1;
  *expert = -1;
  const char *p = path;
  while (*p && o + 1 < cap) {
    if (*p == '.' || *p == '/') {
      cls[o++] = *p++;
      continue;
    }
    size_t n = strcspn(p, "./");
    int star = 0;
    if (all_digits(p, n) && n < 10) {
      int v = atoi(p);
      if (prev_experts && *expert < 0) { *expert = v; star = 1; }
      else if (*layer < 0) { *layer = v; star = 1; }
    }
    prev_experts = n == 7 && strncmp(p, "experts", 7) == 0;
    if (star) cls[o++] = '*';
    else
      for (size_t i = 0; i < n && o + 1 < cap; i++) cls[o++] = p[i];
    p += n;
  }
  cls[o] = 0;
}

int qc_contract_expert_name(const char *path, int e, char *out, int outlen) {
  const char *p = path;
  while ((p = strstr(p, "experts")) != NULL) {
    int starts = p == path || p[-1] == '.' || p[-1] == '/';
    int ends = p[7] == 0 || p[7] == '.' || p[7] == '/';
    if (starts && ends) break;
    p += 7;
  }
  if (!p)
    return qc_err("'%s/params/weight' is 3-D but the module path has no 'experts' component: "
                  "expected a linear weight [N, K] or routed experts [E, N, K] under '...experts...'", path);
  int head = (int)(p + 7 - path);
  if (snprintf(out, (size_t)outlen, "%.*s.%d%s", head, path, e, p + 7) >= outlen)
    return qc_err("'%s': module path too long", path);
  return QC_OK;
}

uint64_t qc_contract_seed(uint64_t seed, const char *module, const char *what) {
  uint64_t h = 0xcbf29ce484222325ull;
  const char *parts[3] = {module, "#", what};
  for (int k = 0; k < 3; k++)
    for (const unsigned char *c = (const unsigned char *)parts[k]; *c; c++) h = (h ^ *c) * 0x100000001b3ull;
  return seed ^ h;
}
