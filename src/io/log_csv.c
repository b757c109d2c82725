/* log_csv.c: CSV logs: a header row naming the columns, one of them a
 * step key (`step`, W&B's `Step` or `_step`, ...: QC_LOG_STEP_KEYS, the
 * most preferred present wins; or the case's step_key); one row per step
 * after it. Fields are separated by commas and may
 * be double-quoted ("" inside is a quote). An empty cell is an absent
 * value; NaN, nan, inf, -inf, Infinity and -Infinity are values. A column
 * whose first non-empty cell is not a number is a text column (a time
 * stamp, a phase name) and is not read; a number column that later holds
 * text is an error. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/qc.h"
#include "io/l3log.h"
#include "io/log_priv.h"

#define MAX_COLS 4096

typedef struct {
  char name[QC_L3_NAME];
  size_t len;
  int state;   /* 0 not seen a value yet, 1 numbers, 2 text (skipped) */
} ccol;

/* The next field of a line at p (the line ends at e): its text in
 * [*fs, *fe) (a quoted field unescaped into tmp); *more is 1 when a comma
 * followed it. Returns the position after it, or NULL (an unclosed quote,
 * text after a closing quote, a field over cap). */
static const char *field(const char *p, const char *e, char *tmp, size_t cap, const char **fs, const char **fe, int *more) {
  while (p < e && (*p == ' ' || *p == '\t')) p++;
  *more = 0;
  if (p < e && *p == '"') {
    size_t k = 0;
    for (p++;; p++) {
      if (p >= e) return NULL;
      if (*p == '"') {
        if (p + 1 < e && p[1] == '"') p++;
        else { p++; break; }
      }
      if (k + 1 >= cap) return NULL;
      tmp[k++] = *p;
    }
    tmp[k] = 0;
    *fs = tmp;
    *fe = tmp + k;
    while (p < e && (*p == ' ' || *p == '\t')) p++;
    if (p < e && *p != ',') return NULL;
    if (p < e) { *more = 1; p++; }
    return p;
  }
  const char *c = memchr(p, ',', (size_t)(e - p));
  const char *end = c ? c : e;
  const char *t = end;
  while (t > p && (t[-1] == ' ' || t[-1] == '\t')) t--;
  *fs = p;
  *fe = t;
  *more = c != NULL;
  return c ? c + 1 : e;
}

/* A cell as a number: 0 with *v, 1 when empty, -1 when text. */
static int cell(const char *s, const char *e, double *v) {
  if (s == e) return 1;
  const char *r = qc_num_special(s, e, v);
  if (r == e) return 0;
  r = qc_num_parse(s, e, v);
  return r == e ? 0 : -1;
}

/* The end of the line at p (before "\r\n" or "\n"), and where the next begins. */
static const char *line_end(const char *p, const char *e, const char **next) {
  const char *eol = memchr(p, '\n', (size_t)(e - p));
  if (!eol) eol = e;
  *next = eol < e ? eol + 1 : e;
  return eol > p && eol[-1] == '\r' ? eol - 1 : eol;
}

#define QCAP 65536

int qc_log_parse_csv(const char *buf, size_t n, qc_l3_log *out) {
  const char *p = buf, *e = buf + n, *next, *q, *fs, *fe;
  ccol *cols = calloc(MAX_COLS, sizeof *cols);
  char *tmp = malloc(QCAP);
  double *vals = malloc(MAX_COLS * sizeof *vals);
  int *kind = malloc(MAX_COLS * sizeof *kind);
  int ncol = 0, stepcol = -1, steprank = -1, rc = QC_OK, more = 1;
  snprintf(out->format, sizeof out->format, "csv");
  if (!cols || !tmp || !vals || !kind) { rc = qc_err_sys("out of memory reading log '%s'", out->path); goto done; }
  if (n >= 3 && memcmp(p, "\xEF\xBB\xBF", 3) == 0) p += 3; /* a byte-order mark */
  const char *le = line_end(p, e, &next);
  for (q = p; more;) {
    if (ncol == MAX_COLS) { rc = qc_err("log '%s': more than %d columns", out->path, MAX_COLS); goto done; }
    if (!(q = field(q, le, tmp, QCAP, &fs, &fe, &more))) { rc = qc_err("log '%s': line 1: a malformed quoted field", out->path); goto done; }
    size_t len = (size_t)(fe - fs);
    if (len >= QC_L3_NAME) { rc = qc_err("log '%s': line 1: a column name longer than %d characters", out->path, QC_L3_NAME - 1); goto done; }
    memcpy(cols[ncol].name, fs, len);
    cols[ncol].len = len;
    int rank = qc_log_step_rank(out, fs, len);
    if (rank >= 0 && (steprank < 0 || rank < steprank)) { stepcol = ncol; steprank = rank; }
    ncol++;
  }
  if (stepcol < 0 && out->step_want[0]) {
    rc = qc_err("log '%s': the header has no '%s' column (the case's step_key)", out->path, out->step_want);
    goto done;
  }
  if (stepcol < 0) {
    rc = qc_err("log '%s': the header has no step column: none of %s", out->path, QC_LOG_STEP_KEYS);
    qc_hint("the first line of a CSV log names its columns, one of them the step; name another with the arm's \"step_key\" in the case");
    goto done;
  }
  snprintf(out->step_key, sizeof out->step_key, "%s", cols[stepcol].name);
  p = next;
  for (long line = 2; p < e; line++) {
    le = line_end(p, e, &next);
    q = p;
    p = next;
    if (qc_js_ws(q, le) == le) continue; /* a blank line */
    int c = 0;
    for (more = 1; more; c++) {
      if (c == ncol) { rc = qc_err("log '%s': line %ld has more fields than the header's %d", out->path, line, ncol); goto done; }
      if (!(q = field(q, le, tmp, QCAP, &fs, &fe, &more))) { rc = qc_err("log '%s': line %ld: a malformed quoted field", out->path, line); goto done; }
      kind[c] = cell(fs, fe, &vals[c]);
    }
    for (; c < ncol; c++) kind[c] = 1; /* a short row: the missing cells are empty */
    double s = vals[stepcol];
    if (kind[stepcol] != 0 || !(s > -9007199254740992.0 && s < 9007199254740992.0 && s == (double)(int64_t)s)) {
      rc = qc_err("log '%s': line %ld has no step (column '%s' must hold an integer)", out->path, line, cols[stepcol].name);
      goto done;
    }
    if ((rc = qc_l3_log_row(out, (int64_t)s))) goto done;
    for (c = 0; c < ncol; c++) {
      if (c == stepcol || kind[c] == 1 || cols[c].state == 2) continue;
      if (kind[c] < 0) {
        if (cols[c].state == 0) { cols[c].state = 2; continue; } /* a text column */
        rc = qc_err("log '%s': line %ld, column '%s': not a number", out->path, line, cols[c].name);
        goto done;
      }
      cols[c].state = 1;
      if ((rc = qc_l3_log_set(out, cols[c].name, cols[c].len, vals[c]))) goto done;
    }
  }
done:
  free(cols);
  free(tmp);
  free(vals);
  free(kind);
  return rc;
}
