/* pattern.c: user regexes compiled or refused (see pattern.h). */
#include "core/pattern.h"

#include "core/qc.h"

int qc_pattern_compile(regex_t *re, const char *pattern, const char *what) {
  int e = regcomp(re, pattern, REG_EXTENDED | REG_NOSUB);
  if (!e) return QC_OK;
  char eb[128];
  regerror(e, re, eb, sizeof eb);
  return qc_err("%s '%s': %s", what, pattern, eb);
}
