/* log_priv.h: inside io/'s log readers (log.c, log_json.c, log_csv.c,
 * log_tb.c, config.c): the number parser and the JSON scanner they share. */
#ifndef QC_LOG_PRIV_H
#define QC_LOG_PRIV_H

#include <stddef.h>

#include "model/layer3.h"

/* Parse a decimal number at [p, e) (JSON's grammar: -?digits(.digits)?
 * ([eE][+-]?digits)?), correctly rounded (as strtod). Returns the end of
 * the number, or NULL when none starts at p. */
const char *qc_num_parse(const char *p, const char *e, double *out);

/* The non-finite spellings loggers write: NaN, nan, Infinity, -Infinity,
 * inf, -inf (Python's json writes the first three bare). Returns the end,
 * or NULL. */
const char *qc_num_special(const char *p, const char *e, double *out);

/* ---- a JSON scanner without a tree (log_json.c) --------------------------- */

const char *qc_js_ws(const char *p, const char *e);

/* The keys of the top-level object at p, to tell the formats apart: sets
 * *has_step, *has_log_history, and *megatron when a member is an
 * object holding "values". Returns the end of the object, or NULL. */
const char *qc_js_probe(const char *p, const char *e, int *has_step, int *has_log_history, int *megatron);

/* Where a pointer lies, for messages: its 1-based line in buf. */
long qc_line_of(const char *buf, const char *p);

#endif
