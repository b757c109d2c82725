/* rejudge.c: a JSON report read back is evidence, not a verdict
 * (report.h, qc_report_rejudge; docs/robustness.md, "Reports read back").
 * Its words are the exact ones qatcheck writes, each check that records
 * its metrics and bounds is judged again by model/check.c's qc_judge, and
 * its verdict must follow from its checks. */
#include <cjson/cJSON.h>
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "core/qc.h"
#include "model/check.h"
#include "report/audit.h"
#include "report/report.h"

/* What a check is in one verb's report, and how it is judged again. */
typedef struct rj_verb {
  const char *verb;
  const char *array;           /* the checks ("checks", "rows", "pairs"); NULL: the verb's reports hold none */
  const char *field;           /* each check's word ("verdict", "result"; "pass": a boolean) */
  const char *words[4];        /* the words qatcheck writes there, the pass word first (NULL words[0]: a boolean) */
  const char *fail_words[3];   /* the words "totals"."failed" counts (NULL: the boolean false) */
  const char *idkeys[5];       /* the fields that name a check in a message */
  int rejudge;                 /* RJ_TOL: metrics and "tolerance" (qc_judge); RJ_OPTIONS: metrics and the
                                  report's options (contract); RJ_BYTES: mismatching byte counts (quant
                                  --calibration); 0: the words only */
} rj_verb;

enum { RJ_TOL = 1, RJ_OPTIONS, RJ_BYTES };

static const rj_verb g_verbs[] = {
    {"vjp", "checks", "verdict", {"pass", "fail"}, {"fail"}, {"module", "dy", "tensor"}, RJ_TOL},
    {"contract", "rows", "verdict", {"pass", "fail"}, {"fail"}, {"module", "tensor", "weight_format", "activation_format", "dy"},
     RJ_OPTIONS},
    {"step", "checks", "verdict", {"pass", "fail", "unjudged"}, {"fail"}, {"arm", "param", "kind"}, RJ_TOL},
    {"sft", "pairs", "verdict", {"pass", "deviates", "inconclusive"}, {"deviates"}, {"a", "b"}, 0},
    {"quant", "checks", "result", {"reproduced", "mismatch", "not_made"}, {"mismatch", "not_made"}, {"module", "format", "profile"}, 0},
    {"fd", "rows", "pass", {NULL}, {NULL}, {"class", "tensor", "direction"}, 0},
    {"tol", NULL, NULL, {NULL}, {NULL}, {NULL}, 0},
    {"report", NULL, NULL, {NULL}, {NULL}, {NULL}, 0},
};
/* quant --calibration: one row per calibration path, judged by its mismatching bytes */
static const rj_verb g_calib = {"quant", "paths", NULL, {NULL}, {NULL}, {"profile", "format"}, RJ_BYTES};
/* an sft pair's metrics, each with its own word */
static const char *const g_sft_metric_words[] = {"pass", "fail", "inconclusive", NULL};
/* the words of a checked report's verdict ("error": the run could not be judged) */
static const char *const g_verdicts[] = {"pass", "fail", "error", NULL};
/* the comparisons that are bit for bit and record no metric: they pass on their word */
static const struct { const char *verb, *field, *value; } g_no_metrics[] = {
    {"vjp", "tensor", "quantizer"}, /* the deployed bytes against the quantizer (engine/vjp_prep.c; a stacked
                                       parameter's per expert: "quantizer/w1") */
    {"vjp", "kind", "selection"},   /* saved ids against the contract's selection (engine/forward_select.c) */
    {"step", "kind", "frozen"},     /* a frozen parameter left unchanged */
    {"step", "kind", "master"},     /* the master copy refreshed from the main */
};

static const cJSON *get(const cJSON *o, const char *k) { return o ? cJSON_GetObjectItemCaseSensitive(o, k) : NULL; }

/* The index of word w in the NULL-terminated list (at most n), -1 when absent. */
static int word_of(const char *w, const char *const *list, int n) {
  for (int i = 0; i < n && list[i]; i++)
    if (strcmp(w, list[i]) == 0) return i;
  return -1;
}

/* "\"pass\", \"fail\" or \"unjudged\"" into buf. */
static const char *word_list(const char *const *list, int n, char *buf, size_t size) {
  buf[0] = 0;
  int k = 0;
  while (k < n && list[k]) k++;
  for (int i = 0; i < k; i++) qc_cat(buf, size, "%s\"%s\"", i == 0 ? "" : i == k - 1 ? " or " : ", ", list[i]);
  return buf;
}

/* "check 3 (/m dy d_x)" into buf: the check's place and its identity fields. */
static const char *check_name(const rj_verb *v, const cJSON *k, const cJSON *parent, int i, char *buf, size_t size) {
  snprintf(buf, size, "check %d (", i + 1);
  int any = 0;
  for (int j = 0; j < 5 && v->idkeys[j]; j++) {
    const cJSON *x = get(parent ? parent : k, v->idkeys[j]);
    if (cJSON_IsString(x)) qc_cat(buf, size, "%s%.160s", any++ ? " " : "", x->valuestring);
    else if (cJSON_IsNumber(x)) qc_cat(buf, size, "%s%s %g", any++ ? " " : "", v->idkeys[j], x->valuedouble);
  }
  if (parent) { /* an sft pair's metric */
    const cJSON *m = get(k, "metric");
    if (cJSON_IsString(m)) qc_cat(buf, size, "%smetric %.80s", any++ ? " " : "", m->valuestring);
  }
  qc_cat(buf, size, "%s)", any ? "" : "unnamed");
  return buf;
}

/* ---- the metrics and bounds of one check, as the run judged them -------------------------- */

/* A recorded number: its value; null or absent: NaN (a non-finite value is written as null). */
static double rec(const cJSON *o, const char *k) {
  const cJSON *v = get(o, k);
  return cJSON_IsNumber(v) ? v->valuedouble : NAN;
}

/* The metrics qc_judge reads, from a check's "metrics" as report/json.c,
 * report/step.c and report/contract.c write them. The norms ("norm",
 * "norm_reference"; null: infinite) are recorded by vjp and step; where
 * they are not (contract, older reports) whether each is zero follows from
 * the norm ratio (null: the reference is zero) and max_abs, and the terms'
 * scale (term_floor, which needs ||r||) is left out: the tighter judgement.
 * A null cosine is undefined where a norm is zero, else it was NaN; a null
 * bias_z beside its "bias" object was infinite (only |z| is judged). */
static void read_metrics(const cJSON *m, qc_metrics *q) {
  memset(q, 0, sizeof *q);
  q->rel_l2 = rec(m, "rel_l2");
  q->max_abs = rec(m, "max_abs");
  q->norm_ratio = rec(m, "norm_ratio");
  q->noise_multiple = rec(m, "noise_multiple");
  q->noise_floor = rec(m, "noise_floor");
  double nf = rec(m, "nonfinite");
  q->nonfinite = nf > 0 ? (nf < 9e15 ? (int64_t)ceil(nf) : (int64_t)9e15) : 0;
  const cJSON *bz = get(m, "bias_z");
  q->bias_z = cJSON_IsNumber(bz) ? bz->valuedouble : cJSON_IsNull(bz) && cJSON_IsObject(get(m, "bias")) ? INFINITY : NAN;
  q->e_par = rec(get(m, "bias"), "e_par");
  const cJSON *ng = get(m, "norm"), *nr = get(m, "norm_reference");
  if ((cJSON_IsNumber(ng) || cJSON_IsNull(ng)) && (cJSON_IsNumber(nr) || cJSON_IsNull(nr))) {
    q->norm_g = cJSON_IsNumber(ng) ? ng->valuedouble : INFINITY;
    q->norm_r = cJSON_IsNumber(nr) ? nr->valuedouble : INFINITY;
    double tf = rec(m, "term_floor");
    q->term_floor = tf > 0 ? tf : 0;
  } else {
    int r0 = !cJSON_IsNumber(get(m, "norm_ratio"));
    q->norm_r = r0 ? 0.0 : 1.0;
    q->norm_g = (r0 ? q->max_abs == 0 : q->norm_ratio == 0) ? 0.0 : 1.0;
  }
  const cJSON *c = get(m, "cosine");
  q->cosine = cJSON_IsNumber(c) ? c->valuedouble : NAN;
  q->cosine_null = !cJSON_IsNumber(c) && (q->norm_g == 0 || q->norm_r == 0);
}

/* A declared bound: absent, or a number (*has set); anything else is refused. */
static int bound(const cJSON *t, const char *k, int *has, double *v) {
  const cJSON *x = get(t, k);
  *has = 0;
  if (!x) return 0;
  if (!cJSON_IsNumber(x)) return -1;
  *has = 1;
  *v = x->valuedouble;
  return 0;
}

/* The bounds qc_judge reads, from a check's "tolerance" (qc_report_tol_json);
 * the name of a malformed one in *bad. */
static int read_tol(const cJSON *t, qc_tol *o, const char **bad) {
  memset(o, 0, sizeof *o);
  static const char *const k[] = {"rel_l2", "max_abs", "cosine_min", "noise_multiple", "bias_z"};
  int *has[] = {&o->has_rel_l2, &o->has_max_abs, &o->has_cosine_min, &o->has_noise_multiple, &o->has_bias_z};
  double *v[] = {&o->rel_l2, &o->max_abs, &o->cosine_min, &o->noise_multiple, &o->bias_z};
  for (int i = 0; i < 5; i++)
    if (bound(t, k[i], has[i], v[i])) { *bad = k[i]; return -1; }
  const cJSON *nr = get(t, "norm_ratio");
  if (nr) {
    if (!cJSON_IsArray(nr) || cJSON_GetArraySize(nr) != 2 || !cJSON_IsNumber(cJSON_GetArrayItem(nr, 0)) ||
        !cJSON_IsNumber(cJSON_GetArrayItem(nr, 1))) {
      *bad = "norm_ratio";
      return -1;
    }
    o->has_norm_ratio = 1;
    o->norm_lo = cJSON_GetArrayItem(nr, 0)->valuedouble;
    o->norm_hi = cJSON_GetArrayItem(nr, 1)->valuedouble;
  }
  return 0;
}

/* A contract report's thresholds (its "options"), as sweep/pipeline.c judges its rows. */
static int read_options(const cJSON *r, qc_tol *o, const char **bad) {
  memset(o, 0, sizeof *o);
  const cJSON *op = get(r, "options"), *cm = get(op, "cosine_min"), *nr = get(op, "norm_ratio");
  if (cm && !cJSON_IsNull(cm)) {
    if (!cJSON_IsNumber(cm)) { *bad = "cosine_min"; return -1; }
    o->has_cosine_min = 1;
    o->cosine_min = cm->valuedouble;
  }
  if (nr && !cJSON_IsNull(nr)) {
    cJSON *t = cJSON_CreateObject();
    if (!t) return -2;
    cJSON_AddItemReferenceToObject(t, "norm_ratio", (cJSON *)nr);
    qc_tol x;
    int rc = read_tol(t, &x, bad);
    cJSON_Delete(t);
    if (rc) return rc;
    o->has_norm_ratio = 1;
    o->norm_lo = x.norm_lo;
    o->norm_hi = x.norm_hi;
  }
  return 0;
}

/* Check k judged again: QC_V_PASS or QC_V_FAIL with why, -1 when it records
 * no metrics or bounds to judge it by (*what says which), -2 with the error
 * set (a malformed bound). */
static int judge_again(const rj_verb *v, const cJSON *k, const qc_tol *options, const char *where, char *why, int whylen,
                       const char **what) {
  if (v->rejudge == RJ_BYTES) {
    static const char *const b[] = {"payload", "scale", "global_scale"};
    const cJSON *mm = get(k, "mismatching_bytes");
    double sum = 0;
    for (int i = 0; i < 3; i++) {
      const cJSON *x = get(mm, b[i]);
      if (!cJSON_IsNumber(x) || !(x->valuedouble >= 0)) { *what = "mismatching byte counts"; return -1; }
      sum += x->valuedouble;
    }
    snprintf(why, (size_t)whylen, "%.0f mismatching byte(s)", sum);
    return sum > 0 ? QC_V_FAIL : QC_V_PASS;
  }
  const cJSON *m = get(k, "metrics");
  if (!cJSON_IsObject(m)) { *what = "metrics"; return -1; }
  qc_tol t;
  const char *bad = NULL;
  if (v->rejudge == RJ_OPTIONS) t = *options;
  else if (!cJSON_IsObject(get(k, "tolerance"))) { *what = "bounds (\"tolerance\")"; return -1; }
  else if (read_tol(get(k, "tolerance"), &t, &bad)) {
    qc_err("%s: tolerance \"%s\" is not %s as qatcheck writes it", where, bad,
           strcmp(bad, "norm_ratio") == 0 ? "a list of two numbers" : "a number");
    return -2;
  }
  qc_metrics q;
  read_metrics(m, &q);
  return qc_judge(&q, &t, why, whylen);
}

/* 1 when check k of verb v passes on its word alone: a bit-for-bit comparison that records no metric. */
static int word_suffices(const rj_verb *v, const cJSON *k) {
  if (cJSON_IsObject(get(k, "metrics"))) return 0;
  for (size_t i = 0; i < sizeof g_no_metrics / sizeof *g_no_metrics; i++) {
    const cJSON *x = get(k, g_no_metrics[i].field);
    const size_t l = strlen(g_no_metrics[i].value);
    if (strcmp(v->verb, g_no_metrics[i].verb) == 0 && cJSON_IsString(x) && strncmp(x->valuestring, g_no_metrics[i].value, l) == 0 &&
        (x->valuestring[l] == 0 || (x->valuestring[l] == '/' && strcmp(g_no_metrics[i].value, "quantizer") == 0)))
      return 1;
  }
  return 0;
}

/* ---- the report ------------------------------------------------------------------------------ */

int qc_report_rejudge(const cJSON *r, const char *what, const char *path, qc_report_counts *out) {
  char where[1200], name[600], words[128], why[512];
  memset(out, 0, sizeof *out);
  snprintf(where, sizeof where, "%s '%s'", what, path);
  const cJSON *vb = get(r, "verb"), *vd = get(r, "verdict");
  const rj_verb *v = NULL;
  for (size_t i = 0; cJSON_IsString(vb) && i < sizeof g_verbs / sizeof *g_verbs; i++)
    if (strcmp(vb->valuestring, g_verbs[i].verb) == 0) v = &g_verbs[i];
  if (!v)
    return qc_err("%s: \"verb\" is %s%.60s%s: not a verb whose reports qatcheck reads (vjp, contract, sft, step, quant, fd, tol, "
                  "report)", where, cJSON_IsString(vb) ? "'" : "", cJSON_IsString(vb) ? vb->valuestring : "not a string",
                  cJSON_IsString(vb) ? "'" : "");
  const cJSON *mode = get(r, "mode");
  int identify = cJSON_IsString(mode) && strcmp(mode->valuestring, "identify") == 0;
  if (cJSON_IsString(mode) && strcmp(v->verb, "quant") == 0 && strcmp(mode->valuestring, "calibration") == 0) v = &g_calib;
  if (!cJSON_IsString(vd) || word_of(vd->valuestring, g_verdicts, 3) < 0)
    return qc_err("%s: \"verdict\" is %s%.60s%s: expected exactly %s", where, cJSON_IsString(vd) ? "\"" : "",
                  cJSON_IsString(vd) ? vd->valuestring : "not a string", cJSON_IsString(vd) ? "\"" : "",
                  word_list(g_verdicts, 3, words, sizeof words));
  int pass = strcmp(vd->valuestring, "pass") == 0, error = strcmp(vd->valuestring, "error") == 0;
  /* the totals, as the writer writes them: whole numbers an int holds */
  const cJSON *t = get(r, "totals");
  double tc = cJSON_IsNumber(get(t, "checks")) ? get(t, "checks")->valuedouble : 0;
  double tf = cJSON_IsNumber(get(t, "failed")) ? get(t, "failed")->valuedouble : 0;
  if (!(tc >= 0 && tc <= INT_MAX && tc == floor(tc)) || !(tf >= 0 && tf <= INT_MAX && tf == floor(tf)))
    return qc_err("%s: \"totals\" holds checks %g and failed %g: expected counts (whole numbers from 0 to %d)", where, tc, tf,
                  INT_MAX);
  const cJSON *a = v->array ? get(r, v->array) : NULL, *k;
  if (a && !cJSON_IsArray(a)) return qc_err("%s: \"%s\" is not a list", where, v->array);
  qc_tol options;
  memset(&options, 0, sizeof options);
  const char *bad = NULL;
  if (a && v->rejudge == RJ_OPTIONS && !error) {
    int rc = read_options(r, &options, &bad);
    if (rc == -2) return qc_err_sys("out of memory reading '%s'", path);
    if (rc) return qc_err("%s: options \"%s\" is not %s as qatcheck writes it", where, bad,
                          strcmp(bad, "norm_ratio") == 0 ? "null or a list of two numbers" : "null or a number");
  }
  int n = 0, nf = 0, hard = 0, judged = 0, npass = 0, i = 0;
  cJSON_ArrayForEach(k, a) {
    int w; /* the word's index in v->words: 0 the pass word */
    if (!v->words[0] && v->field) { /* a boolean */
      const cJSON *b = get(k, v->field);
      if (!cJSON_IsBool(b))
        return qc_err("%s: %s: \"%s\" is not true or false", where, check_name(v, k, NULL, i, name, sizeof name), v->field);
      w = cJSON_IsTrue(b) ? 0 : 1;
    } else if (v->field) {
      const cJSON *x = get(k, v->field);
      w = cJSON_IsString(x) ? word_of(x->valuestring, v->words, 4) : -1;
      if (w < 0)
        return qc_err("%s: %s: \"%s\" is %s%.60s%s: expected exactly %s", where, check_name(v, k, NULL, i, name, sizeof name),
                      v->field, cJSON_IsString(x) ? "\"" : "", cJSON_IsString(x) ? x->valuestring : "not a string",
                      cJSON_IsString(x) ? "\"" : "", word_list(v->words, 4, words, sizeof words));
    } else { /* quant --calibration: the row's word is its bytes */
      w = 0;
    }
    /* a pair of sft runs passes only when each of its metrics does */
    const cJSON *mt, *ms = strcmp(v->verb, "sft") == 0 ? get(k, "metrics") : NULL;
    int j = 0;
    cJSON_ArrayForEach(mt, ms) {
      const cJSON *x = get(mt, "verdict");
      int mw = cJSON_IsString(x) ? word_of(x->valuestring, g_sft_metric_words, 3) : -1;
      if (mw < 0)
        return qc_err("%s: %s: \"verdict\" is %s%.60s%s: expected exactly %s", where, check_name(v, mt, k, j, name, sizeof name),
                      cJSON_IsString(x) ? "\"" : "", cJSON_IsString(x) ? x->valuestring : "not a string",
                      cJSON_IsString(x) ? "\"" : "", word_list(g_sft_metric_words, 3, words, sizeof words));
      if (w == 0 && mw != 0)
        return qc_err("%s: contradicts itself: pair %d (%s) says \"pass\" but its metric %s says \"%s\"", where, i + 1,
                      check_name(v, k, NULL, i, name, sizeof name), cJSON_IsString(get(mt, "metric")) ? get(mt, "metric")->valuestring : "?",
                      x->valuestring);
      j++;
    }
    if (v->rejudge == RJ_BYTES) { /* quant --calibration: the row's verdict is its bytes */
      const char *miss = NULL;
      w = judge_again(v, k, NULL, NULL, why, sizeof why, &miss) == QC_V_PASS ? 0 : 1;
    }
    n++;
    npass += w == 0;
    judged += !(strcmp(v->verb, "step") == 0 && w == 2); /* "unjudged" */
    nf += w != 0 && !(strcmp(v->verb, "quant") == 0 && w == 2); /* quant --identify's "not_made" is no failure */
    hard += !v->field ? w != 0 : !v->words[0] ? w == 1 : word_of(v->words[w], v->fail_words, 3) >= 0;
    i++;
  }
  if (t && a && strcmp(v->verb, "sft") != 0) {
    if (tc != (double)n)
      return qc_err("%s: contradicts itself: \"totals\" says %.0f check(s), its \"%s\" array holds %d", where, tc, v->array, n);
    if (tf != (double)hard)
      return qc_err("%s: contradicts itself: \"totals\" says %.0f failed, its \"%s\" array holds %d failed", where, tf,
                    v->array, hard);
  }
  /* each check that says pass, judged again from what it records */
  const cJSON *ra = v->rejudge == RJ_TOL || v->rejudge == RJ_OPTIONS ? a : NULL;
  i = 0;
  cJSON_ArrayForEach(k, ra) {
    const cJSON *x = get(k, v->field);
    if (!error && cJSON_IsString(x) && strcmp(x->valuestring, v->words[0]) == 0 && !word_suffices(v, k)) {
      const char *miss = NULL;
      char at[1900];
      snprintf(at, sizeof at, "%s: %s", where, check_name(v, k, NULL, i, name, sizeof name));
      int again = judge_again(v, k, &options, at, why, sizeof why, &miss);
      if (again == -2) return QC_EINPUT;
      if (again != QC_V_PASS) {
        qc_hint("a report is re-judged from the metrics and bounds it records, never taken at its word: regenerate it with "
                "the run that made it");
        if (again == -1) return qc_err("%s: says \"%s\" but records no %s to judge it by", at, v->words[0], miss);
        return qc_err("%s: says \"%s\" but its recorded metrics fail its recorded bounds: %s", at, v->words[0], why);
      }
    }
    i++;
  }
  out->checks = t && !a ? (int)tc : n;
  out->failed = t && !a ? (int)tf : nf;
  out->judged = a ? judged : 0;
  if (!pass || !v->array) return QC_OK;
  /* a pass follows from its checks: at least one judged, none failed (quant --identify: one profile reproduces) */
  int failing = !a ? (int)tf : identify ? npass == 0 : strcmp(v->verb, "step") == 0 ? hard : n - npass;
  if (failing > 0) {
    qc_hint("a report is read as its checks say, never as its verdict string: regenerate it with the run that made it");
    return qc_err("%s: contradicts itself: \"verdict\" is \"pass\" but %d of its %d check(s) failed", where, failing,
                  out->checks);
  }
  if (judged == 0) {
    qc_hint("a report with no check judged nothing: it is not a pass");
    return qc_err("%s: contradicts itself: \"verdict\" is \"pass\" but it holds no %scheck", where, n ? "judged " : "");
  }
  return QC_OK;
}
