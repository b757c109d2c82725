/* log_json.c: the JSON logs: JSONL (one object per step, metrics at the
 * top or under "data" as verl's file logger writes), Hugging Face
 * trainer_state.json (log_history: one such object per entry) and Megatron
 * golden values ({"lm loss": {"start_step", "end_step", "step_interval",
 * "values"}}). A scanner without a tree: a log of a million numbers is read
 * in one pass with no allocation per value. Bare NaN, Infinity and
 * -Infinity (Python's json) are values, as are the strings "NaN", "nan",
 * "Infinity", "inf", "-Infinity", "-inf"; null is an absent value. */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/qc.h"
#include "io/l3log.h"
#include "io/log_priv.h"

#define MAX_DEPTH 64

const char *qc_js_ws(const char *p, const char *e) {
  while (p < e && (*p == ' ' || *p == '\t' || *p == '\n' || *p == '\r')) p++;
  return p;
}

long qc_line_of(const char *buf, const char *p) {
  long line = 1;
  for (const char *q = buf; q < p; q++) line += *q == '\n';
  return line;
}

static int hexval(int c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  return -1;
}

static const char *hex4(const char *p, const char *e, unsigned *u) {
  if (e - p < 4) return NULL;
  *u = 0;
  for (int i = 0; i < 4; i++) {
    int h = hexval((unsigned char)p[i]);
    if (h < 0) return NULL;
    *u = *u << 4 | (unsigned)h;
  }
  return p + 4;
}

/* Append code point u as UTF-8. */
static int put_utf8(char *buf, size_t cap, size_t *k, unsigned u) {
  unsigned char t[4];
  int n;
  if (u < 0x80) { t[0] = (unsigned char)u; n = 1; }
  else if (u < 0x800) { t[0] = (unsigned char)(0xC0 | u >> 6); t[1] = (unsigned char)(0x80 | (u & 0x3F)); n = 2; }
  else if (u < 0x10000) {
    t[0] = (unsigned char)(0xE0 | u >> 12); t[1] = (unsigned char)(0x80 | ((u >> 6) & 0x3F)); t[2] = (unsigned char)(0x80 | (u & 0x3F)); n = 3;
  } else {
    t[0] = (unsigned char)(0xF0 | u >> 18); t[1] = (unsigned char)(0x80 | ((u >> 12) & 0x3F));
    t[2] = (unsigned char)(0x80 | ((u >> 6) & 0x3F)); t[3] = (unsigned char)(0x80 | (u & 0x3F)); n = 4;
  }
  if (*k + (size_t)n >= cap) return -1;
  memcpy(buf + *k, t, (size_t)n);
  *k += (size_t)n;
  return 0;
}

/* A string at p (p at its opening quote): its decoded text into
 * buf[0..cap) when buf is non-NULL (*len its length; a text that does not
 * fit is an error). Returns the end, or NULL (malformed; too long). */
static const char *qc_js_string(const char *p, const char *e, char *buf, size_t cap, size_t *len) {
  if (p >= e || *p != '"') return NULL;
  p++;
  size_t k = 0;
  while (p < e && *p != '"') {
    unsigned char c = (unsigned char)*p;
    if (c < 0x20) return NULL; /* a raw control character (a newline inside a string) */
    if (c != '\\') {
      if (buf) { if (k + 1 >= cap) return NULL; buf[k++] = (char)c; }
      p++;
      continue;
    }
    if (++p >= e) return NULL;
    unsigned u;
    switch (*p) {
      case '"': u = '"'; break;
      case '\\': u = '\\'; break;
      case '/': u = '/'; break;
      case 'b': u = '\b'; break;
      case 'f': u = '\f'; break;
      case 'n': u = '\n'; break;
      case 'r': u = '\r'; break;
      case 't': u = '\t'; break;
      case 'u': {
        const char *q = hex4(p + 1, e, &u);
        if (!q) return NULL;
        p = q - 1;
        if (u >= 0xD800 && u <= 0xDBFF && e - q >= 6 && q[0] == '\\' && q[1] == 'u') {
          unsigned lo;
          if (hex4(q + 2, e, &lo) && lo >= 0xDC00 && lo <= 0xDFFF) {
            u = 0x10000 + ((u - 0xD800) << 10) + (lo - 0xDC00);
            p = q + 5;
          }
        }
        break;
      }
      default: return NULL;
    }
    p++;
    if (buf && put_utf8(buf, cap, &k, u)) return NULL;
  }
  if (p >= e) return NULL;
  if (buf) buf[k] = 0;
  if (len) *len = k;
  return p + 1;
}

static const char *lit(const char *p, const char *e, const char *w) {
  size_t n = strlen(w);
  return (size_t)(e - p) >= n && memcmp(p, w, n) == 0 ? p + n : NULL;
}

/* Skip one value of any type, checking its syntax (bare NaN and Infinity
 * accepted). Returns the end, or NULL. */
static const char *qc_js_skip(const char *p, const char *e, int depth) {
  if (depth > MAX_DEPTH) return NULL;
  p = qc_js_ws(p, e);
  if (p >= e) return NULL;
  double v;
  switch (*p) {
    case '"': return qc_js_string(p, e, NULL, 0, NULL);
    case '{': case '[': {
      char close = *p == '{' ? '}' : ']';
      int obj = *p == '{';
      p = qc_js_ws(p + 1, e);
      if (p < e && *p == close) return p + 1;
      for (;;) {
        if (obj) {
          if (!(p = qc_js_string(qc_js_ws(p, e), e, NULL, 0, NULL))) return NULL;
          p = qc_js_ws(p, e);
          if (p >= e || *p != ':') return NULL;
          p++;
        }
        if (!(p = qc_js_skip(p, e, depth + 1))) return NULL;
        p = qc_js_ws(p, e);
        if (p < e && *p == ',') { p++; continue; }
        if (p < e && *p == close) return p + 1;
        return NULL;
      }
    }
    case 't': return lit(p, e, "true");
    case 'f': return lit(p, e, "false");
    case 'n': return lit(p, e, "null");
    default: {
      const char *r = qc_num_special(p, e, &v);
      return r ? r : qc_num_parse(p, e, &v);
    }
  }
}

/* A value that is a metric: a number, a non-finite spelling (bare or in a
 * string). *kind: 1 a number (in *v), 0 null or anything else (skipped).
 * Returns the end of the value, or NULL on a syntax error. */
static const char *metric_value(const char *p, const char *e, double *v, int *kind) {
  *kind = 0;
  if (p >= e) return NULL;
  const char *r;
  if (*p == '-' || (unsigned)(*p - '0') < 10) {
    if ((r = qc_num_parse(p, e, v))) { *kind = 1; return r; }
    if ((r = qc_num_special(p, e, v))) { *kind = 1; return r; }
    return NULL;
  }
  if (*p == 'N' || *p == 'I') {
    if ((r = qc_num_special(p, e, v))) { *kind = 1; return r; }
    return NULL;
  }
  if (*p == '"') {
    const char *s = qc_num_special(p + 1, e, v);
    if (s && s < e && *s == '"') { *kind = 1; return s + 1; }
    return qc_js_string(p, e, NULL, 0, NULL);
  }
  return qc_js_skip(p, e, 1);
}

/* A member of an object being walked, at p: its key into name[0..cap)
 * ("" when longer), and where its value starts (past ':' and space). NULL
 * when malformed. */
static const char *member(const char *p, const char *e, char *name, size_t cap) {
  size_t len;
  const char *k = qc_js_string(p, e, name, cap, &len);
  if (!k) {
    if (!(k = qc_js_string(p, e, NULL, 0, NULL))) return NULL;
    name[0] = 0;
  }
  p = qc_js_ws(k, e);
  return p < e && *p == ':' ? qc_js_ws(p + 1, e) : NULL;
}

/* Past a member's value: its ',' and space, if any. */
static const char *after(const char *p, const char *e) {
  p = qc_js_ws(p, e);
  return p < e && *p == ',' ? qc_js_ws(p + 1, e) : p;
}

/* ---- records: one object of metrics and a step ---------------------------------- */

typedef struct {
  const char *name;          /* into the buffer, or into the arena when decoded */
  size_t len;
  double v;
} kv;

typedef struct {
  kv *v;
  int n, cap;
  char arena[8192];          /* decoded (escaped) names of one record */
  size_t used;
} rec;

static int rec_add(rec *r, const char *name, size_t len, double v) {
  if (r->n == r->cap) {
    int cap = r->cap ? 2 * r->cap : 32;
    kv *nv = realloc(r->v, (size_t)cap * sizeof *nv);
    if (!nv) return qc_err_sys("out of memory reading a log");
    r->v = nv;
    r->cap = cap;
  }
  r->v[r->n++] = (kv){name, len, v};
  return QC_OK;
}

/* A key at p: its name without copying when it has no escape, else decoded
 * into the record's arena. */
static const char *key(const char *p, const char *e, rec *r, const char **name, size_t *len) {
  const char *q = p + 1;
  while (q < e && *q != '"' && *q != '\\' && (unsigned char)*q >= 0x20) q++;
  if (q < e && *q == '"') {
    *name = p + 1;
    *len = (size_t)(q - p - 1);
    return q + 1;
  }
  char *dst = r->arena + r->used;
  const char *end = qc_js_string(p, e, dst, sizeof r->arena - r->used, len);
  if (!end) return NULL;
  *name = dst;
  r->used += *len + 1;
  return end;
}

#define IS_KEY(n, l, w) ((l) == sizeof(w) - 1 && memcmp((n), (w), sizeof(w) - 1) == 0)

/* A record's step: the value of its most preferred step key. */
typedef struct {
  int rank;           /* qc_log_step_rank of the key read (-1: none yet) */
  double step;
  const char *name;   /* the key, for the log's step_key */
  size_t len;
} stepkey;

/* The members of an object at p into r (top: the step keys and "data" are
 * special; any step key is never a metric). Returns the end or NULL; *err
 * names what was wrong. */
static const char *object(const char *p, const char *e, rec *r, int top, const qc_l3_log *out, stepkey *sk, const char **err) {
  p = qc_js_ws(p, e);
  if (p >= e || *p != '{') { *err = "expected a JSON object"; return NULL; }
  p = qc_js_ws(p + 1, e);
  if (p < e && *p == '}') return p + 1;
  for (;;) {
    const char *name;
    size_t len;
    if (p >= e || *p != '"' || !(p = key(p, e, r, &name, &len))) { *err = "expected a quoted key"; return NULL; }
    p = qc_js_ws(p, e);
    if (p >= e || *p != ':') { *err = "expected ':' after a key"; return NULL; }
    p = qc_js_ws(p + 1, e);
    if (top && IS_KEY(name, len, "data") && p < e && *p == '{') {
      if (!(p = object(p, e, r, 0, out, sk, err))) return NULL;
    } else {
      double v;
      int kind, rank = top ? qc_log_step_rank(out, name, len) : -1;
      if (!(p = metric_value(p, e, &v, &kind))) { *err = "malformed value"; return NULL; }
      if (kind && rank >= 0) {
        if (sk->rank < 0 || rank < sk->rank) *sk = (stepkey){rank, v, name, len};
      } else if (kind) {
        if (len >= QC_L3_NAME) { *err = "a metric name longer than 127 characters"; return NULL; }
        if (rec_add(r, name, len, v)) { *err = "out of memory"; return NULL; }
      }
    }
    p = qc_js_ws(p, e);
    if (p < e && *p == ',') { p = qc_js_ws(p + 1, e); continue; }
    if (p < e && *p == '}') return p + 1;
    *err = "expected ',' or '}'";
    return NULL;
  }
}

/* A step value: an integer (a double holding one), |step| < 2^53. */
static int step_ok(double s) { return isfinite(s) && s == floor(s) && fabs(s) < 9007199254740992.0; }

/* One record object at p into the log; kind and idx name it in messages
 * ("line" 12, "log_history" 3), formatted only on an error. */
static const char *record(const char *p, const char *e, rec *r, qc_l3_log *out, const char *kind, long idx, int *rc) {
  const char *err = NULL;
  stepkey sk = {-1, 0, NULL, 0};
  r->n = 0;
  r->used = 0;
  const char *end = object(p, e, r, 1, out, &sk, &err);
  int has_step = sk.rank >= 0;
  double step = sk.step;
  if (end && has_step && step_ok(step)) {
    if (!out->step_key[0] && sk.len < sizeof out->step_key) {
      memcpy(out->step_key, sk.name, sk.len);
      out->step_key[sk.len] = 0;
    }
    if ((*rc = qc_l3_log_row(out, (int64_t)step))) return NULL;
    for (int i = 0; i < r->n; i++)
      if ((*rc = qc_l3_log_set(out, r->v[i].name, r->v[i].len, r->v[i].v))) return NULL;
    return end;
  }
  char what[48];
  if (strcmp(kind, "line") == 0) snprintf(what, sizeof what, "line %ld", idx);
  else snprintf(what, sizeof what, "%s[%ld]", kind, idx);
  if (!end) {
    *rc = err && strcmp(err, "out of memory") == 0 ? QC_ESYS : qc_err("log '%s': %s: %s", out->path, what, err ? err : "malformed JSON");
  } else if (!has_step && out->step_want[0]) {
    *rc = qc_err("log '%s': %s has no '%s' (the case's step_key)", out->path, what, out->step_want);
  } else if (!has_step) {
    *rc = qc_err("log '%s': %s has no step: none of %s", out->path, what, QC_LOG_STEP_KEYS);
    qc_hint("each record needs the optimizer step (an integer); name another key with the arm's \"step_key\" in the case");
  } else {
    *rc = qc_err("log '%s': %s: '%.*s' is %g: expected an integer", out->path, what, (int)sk.len, sk.name, step);
  }
  return NULL;
}

int qc_log_parse_jsonl(const char *buf, size_t n, qc_l3_log *out) {
  const char *p = buf, *e = buf + n;
  rec r = {0};
  int rc = QC_OK;
  long line = 1;
  snprintf(out->format, sizeof out->format, "jsonl");
  while (p < e) {
    const char *eol = memchr(p, '\n', (size_t)(e - p));
    if (!eol) eol = e;
    const char *q = qc_js_ws(p, eol);
    if (q < eol) {
      const char *end = record(q, eol, &r, out, "line", line, &rc);
      if (!end) break;
      if (qc_js_ws(end, eol) != eol) { rc = qc_err("log '%s': line %ld: text after the object (one JSON object per line)", out->path, line); break; }
    }
    p = eol + 1;
    line++;
  }
  free(r.v);
  return rc;
}

int qc_log_parse_hf(const char *buf, size_t n, qc_l3_log *out) {
  const char *p = qc_js_ws(buf, buf + n), *e = buf + n;
  rec r = {0};
  int rc = QC_OK, found = 0;
  snprintf(out->format, sizeof out->format, "hf_trainer_state");
  if (p >= e || *p != '{') return qc_err("log '%s': expected a JSON object (trainer_state.json)", out->path);
  p = qc_js_ws(p + 1, e);
  while (p < e && *p != '}') {
    char name[64];
    if (!(p = member(p, e, name, sizeof name))) goto bad;
    if (strcmp(name, "log_history") == 0) {
      found = 1;
      if (p >= e || *p != '[') { rc = qc_err("log '%s': 'log_history' is not an array", out->path); goto done; }
      p = qc_js_ws(p + 1, e);
      for (int i = 0; p < e && *p != ']'; i++) {
        if (!(p = record(p, e, &r, out, "log_history", i, &rc))) goto done;
        p = after(p, e);
      }
      if (p >= e) goto bad;
      p++;
    } else if (!(p = qc_js_skip(p, e, 1))) goto bad;
    p = after(p, e);
  }
  if (!found) rc = qc_err("log '%s': no 'log_history' array (a Hugging Face trainer_state.json has one)", out->path);
  goto done;
bad:
  rc = qc_err("log '%s': malformed JSON near line %ld", out->path, qc_line_of(buf, p ? p : e));
done:
  free(r.v);
  return rc;
}

/* One Megatron metric: {"start_step": S, "end_step": E, "step_interval": I,
 * "values": {"S": v, ...} or [v, ...]}. A dict's keys are iterations. A
 * list is positional, as Megatron's older tests sliced the TensorBoard
 * series (actual[start_step:end_step:step_interval], whose element 0 is
 * iteration 1): values[i] is iteration start_step + 1 + i * step_interval.
 * A string value is the placeholder Megatron's writer puts at a step the
 * run did not log ("nan"): an absent value, counted in out->placeholders;
 * a bare NaN is a logged non-finite value. */
static int megatron_metric(const char *p, const char *e, const char *metric, qc_l3_log *out, const char *buf) {
  double start = 0, interval = 1, v;
  const char *vals = NULL;
  p = qc_js_ws(p, e);
  if (p >= e || *p != '{') return qc_err("log '%s': metric '%s': expected an object with 'values'", out->path, metric);
  p = qc_js_ws(p + 1, e);
  while (p < e && *p != '}') {
    char name[32];
    if (!(p = member(p, e, name, sizeof name))) goto bad;
    double *num = strcmp(name, "start_step") == 0 ? &start : strcmp(name, "step_interval") == 0 ? &interval : NULL;
    if (strcmp(name, "values") == 0) vals = p;
    if (num) {
      if (!(p = qc_num_parse(p, e, num)) || !step_ok(*num))
        return qc_err("log '%s': metric '%s': '%s' is not an integer", out->path, metric, name);
    } else if (!(p = qc_js_skip(p, e, 1))) goto bad;
    p = after(p, e);
  }
  if (!vals) return qc_err("log '%s': metric '%s' has no 'values'", out->path, metric);
  if (interval < 1) return qc_err("log '%s': metric '%s': 'step_interval' %g is below 1", out->path, metric, interval);
  int rc, kind, list = *vals == '[';
  if (*vals != '{' && !list) return qc_err("log '%s': metric '%s': 'values' is neither an object nor a list", out->path, metric);
  p = qc_js_ws(vals + 1, e);
  for (int64_t i = 0; p < e && *p != (list ? ']' : '}'); i++) {
    double step = start + 1 + (double)i * interval;
    if (!list) {
      char sk[32];
      size_t len;
      char *end;
      if (!(p = qc_js_string(p, e, sk, sizeof sk, &len))) goto bad;
      step = strtod(sk, &end);
      if (end == sk || *end || !step_ok(step))
        return qc_err("log '%s': metric '%s': values key '%s' is not a step", out->path, metric, sk);
      p = qc_js_ws(p, e);
      if (p >= e || *p != ':') goto bad;
      p = qc_js_ws(p + 1, e);
    }
    if (p < e && *p == '"') { /* the placeholder of a step not logged */
      if (!(p = qc_js_string(p, e, NULL, 0, NULL))) goto bad;
      out->placeholders++;
      kind = 0;
    } else if (!(p = metric_value(p, e, &v, &kind))) goto bad;
    if (kind) {
      if ((rc = qc_l3_log_row(out, (int64_t)step)) || (rc = qc_l3_log_set(out, metric, strlen(metric), v))) return rc;
    }
    p = after(p, e);
  }
  return p < e ? QC_OK : qc_err("log '%s': metric '%s': 'values' is not closed", out->path, metric);
bad:
  return qc_err("log '%s': malformed JSON near line %ld", out->path, qc_line_of(buf, p ? p : e));
}

int qc_log_parse_megatron(const char *buf, size_t n, qc_l3_log *out) {
  const char *p = qc_js_ws(buf, buf + n), *e = buf + n;
  snprintf(out->format, sizeof out->format, "megatron");
  if (p >= e || *p != '{') return qc_err("log '%s': expected a JSON object (Megatron golden values)", out->path);
  p = qc_js_ws(p + 1, e);
  int rc;
  while (p < e && *p != '}') {
    char metric[QC_L3_NAME];
    size_t len;
    const char *k = qc_js_string(p, e, metric, sizeof metric, &len);
    if (!k) return qc_err("log '%s': a malformed or over-long metric name near line %ld", out->path, qc_line_of(buf, p));
    p = qc_js_ws(k, e);
    if (p >= e || *p != ':') return qc_err("log '%s': malformed JSON near line %ld", out->path, qc_line_of(buf, p));
    const char *v = qc_js_ws(p + 1, e);
    if (v < e && *v != '{') { /* a scalar beside the metrics (iteration_timing_avg): no value per step */
      out->nskipped++;
      if (qc_verbose) fprintf(stderr, "log '%s': '%s' skipped: a single value, not a metric per step\n", out->path, metric);
    } else if ((rc = megatron_metric(v, e, metric, out, buf))) return rc;
    if (!(p = qc_js_skip(v, e, 1))) return qc_err("log '%s': malformed JSON near line %ld", out->path, qc_line_of(buf, v));
    p = after(p, e);
  }
  return QC_OK;
}

const char *qc_js_probe(const char *p, const char *e, int *has_step, int *has_log_history, int *megatron) {
  *has_step = *has_log_history = *megatron = 0;
  p = qc_js_ws(p, e);
  if (p >= e || *p != '{') return NULL;
  p = qc_js_ws(p + 1, e);
  while (p < e && *p != '}') {
    char name[64];
    const char *v = member(p, e, name, sizeof name);
    if (!v) return NULL;
    if (strcmp(name, "step") == 0) *has_step = 1;
    if (strcmp(name, "log_history") == 0) *has_log_history = 1;
    if (v < e && *v == '{') {
      /* a Megatron metric: an object with "values" among its keys */
      const char *q = qc_js_ws(v + 1, e);
      while (q < e && *q == '"') {
        char kn[16];
        if (!(q = member(q, e, kn, sizeof kn))) break;
        if (strcmp(kn, "values") == 0) *megatron = 1;
        if (!(q = qc_js_skip(q, e, 1))) break;
        q = after(q, e);
      }
    }
    if (!(p = qc_js_skip(v, e, 1))) return NULL;
    p = after(p, e);
  }
  return p < e ? p + 1 : NULL;
}
