/* pattern.h: the regexes a user gives (--modules, a dump's module filter):
 * compiled as POSIX extended regexes, or refused with one message naming
 * where the pattern came from. */
#ifndef QC_PATTERN_H
#define QC_PATTERN_H

#include <regex.h>

/* Compile `pattern` into *re (REG_EXTENDED | REG_NOSUB; the caller
 * regfree's it on QC_OK). A bad pattern: QC_EINPUT with
 * "<what> '<pattern>': <regerror's words>", nothing to free. */
int qc_pattern_compile(regex_t *re, const char *pattern, const char *what);

#endif
