/* number.h: numbers given as text, read one way: an option's value (the
 * tables of cli/opts.h declare each numeric option's range) and a numeric
 * environment variable (the table in number.c declares each one's range).
 * A number is the whole string read by strtod, finite, within its range;
 * anything else is refused with one line, never read as 0 or clamped. */
#ifndef QC_NUMBER_H
#define QC_NUMBER_H

#include <stddef.h>

/* How a range is read: lo excluded (a number above lo), a whole number. */
enum { QC_NUM_WHOLE = 1, QC_NUM_ABOVE = 2 };

/* s, the whole string, as a finite number in [lo, hi] (QC_NUM_ABOVE: lo
 * excluded; QC_NUM_WHOLE: a whole number, written in digits exactly the
 * double it reads as: 2^53 + 1 is refused, not read as 2^53): 1 with *out
 * set, or 0. */
int qc_num_read(const char *s, double lo, double hi, unsigned how, double *out);
/* What the range takes, for a message ("a whole number from 1 to 100", "a
 * number above 1, at most 1e15"), written into buf (n bytes); returns buf. */
const char *qc_num_expected(char *buf, size_t n, double lo, double hi, unsigned how);
/* The top of a range with no limit of its own worth naming. */
#define QC_NUM_HUGE 1e15

/* The numeric environment variable `name` (one the table of number.c
 * declares): *out = its value, or dflt when it is unset or empty. QC_OK, or
 * QC_EINPUT with *out = dflt and the message "environment variable NAME is
 * 'V': expected ..." when it is malformed or out of its range (or the name
 * is not declared). */
int qc_env_num(const char *name, double dflt, double *out);
/* The value of the numeric environment variable `name`, or dflt when it is
 * unset, empty or malformed; sets no message. For a reader that cannot
 * fail: qc_env_check has refused a malformed value before the run began. */
double qc_env_value(const char *name, double dflt);
/* Every declared numeric environment variable read as qc_env_num reads it:
 * QC_OK, or QC_EINPUT with the first malformed one's message. A run checks
 * them before it does any work (cli/opts.c). */
int qc_env_check(void);

#endif
