/* audit_need.c: what the method requires of a whole audit, and what the
 * reports given leave missing (audit.h, docs/audit.md "A whole audit").
 *
 * The method runs layer 1 -> 2 -> 3, and no layer replaces another:
 *  - layer 1 (vjp) always, and with it the one-step update (step): the
 *    method's layer 1 compares dX, dW "and a one-step update of every
 *    module", and its layer 3 compares the one-step update of under_test
 *    and gradient_reference before any curve;
 *  - layer 2 (contract) whenever a module layer 1 audited quantizes a
 *    weight or an activation: layer 2 measures "every quantized layer"
 *    under both conventions, and with dX from the master weight the method
 *    calls it mandatory. Each weight format (d_x rows) and activation
 *    format (d_weight rows) layer 1 saw must be measured: "measure each
 *    target precision combination separately". Without layer-1 module
 *    descriptions nothing shows the contracts quantize nothing, so layer 2
 *    is required then too;
 *  - layer 3 (sft) always, with its three arms: a report that compares
 *    under_test with gradient_reference and with native_baseline.
 * A report that could not be judged (an error report) counts as absent. */
#include <cjson/cJSON.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "core/qc.h"
#include "report/audit.h"

/* A non-error report of verb. */
static int has_verb(const qc_evidence *e, const char *verb) {
  for (int i = 0; i < e->nsrc; i++)
    if (!strcmp(e->src[i].verb, verb) && strcmp(e->src[i].verdict, "error")) return 1;
  return 0;
}

static void need(qc_audit_need *n, const char *layer, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static void need(qc_audit_need *n, const char *layer, const char *fmt, ...) {
  if (n->n == QC_AUDIT_MAXNEED) return;
  snprintf(n->layer[n->n], sizeof n->layer[n->n], "%s", layer);
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(n->why[n->n], sizeof n->why[n->n], fmt, ap);
  va_end(ap);
  n->n++;
}

/* The string value of key in the contract's JSON text (into buf, "" when absent). */
static void contract_str(const cJSON *c, const char *key, char *buf, size_t size) {
  const cJSON *v = cJSON_GetObjectItemCaseSensitive(c, key);
  snprintf(buf, size, "%s", cJSON_IsString(v) ? v->valuestring : "");
}

static int quantizes(const char *fmt) { return fmt[0] && strcmp(fmt, "none") != 0; }

/* A contract row (not of an error report) of tensor `tensor` measured under format fmt. */
static int measured(const qc_evidence *e, const char *tensor, const char *fmt) {
  for (int j = 0; j < e->nl2; j++)
    for (int i = 0; i < e->l2[j].s.n; i++) {
      const qc_crow *r = &e->l2[j].s.rows[i];
      if (strcmp(r->tensor, tensor)) continue;
      if (!strcmp(!strcmp(tensor, "d_x") ? r->wfmt : r->afmt, fmt)) return 1;
    }
  return 0;
}

/* 1 when a need starting "<what><fmt> " is listed already. */
static int listed(const qc_audit_need *n, const char *what, const char *fmt) {
  char head[128];
  snprintf(head, sizeof head, "%s%s ", what, fmt);
  for (int k = 0; k < n->n; k++)
    if (!strncmp(n->why[k], head, strlen(head))) return 1;
  return 0;
}

/* Layer 2: required when a module quantizes (why names the first such module
 * and, before any other, one taking dX from the master weight). */
static void layer2(const qc_evidence *e, qc_audit_need *n) {
  char first[700] = "", master[700] = "", wf[64], af[64], dx[64];
  int mods = 0;
  for (int m = 0; m < e->nmod; m++) {
    const qc_modinfo *mi = &e->mod[m].mi;
    cJSON *c = cJSON_Parse(mi->contract);
    mods++;
    if (!c) continue;
    contract_str(c, "weight_format", wf, sizeof wf);
    contract_str(c, "activation_format", af, sizeof af);
    contract_str(c, "dx_weight", dx, sizeof dx);
    cJSON_Delete(c);
    if (!quantizes(wf) && !quantizes(af)) continue;
    if (!master[0] && quantizes(wf) && !strcmp(dx, "master"))
      snprintf(master, sizeof master, "%s (%s) takes dX from the master weight (dx_weight master, weight_format %s): the method makes "
               "the layer-2 comparison mandatory for it", mi->module, mi->cls, wf);
    if (!first[0])
      snprintf(first, sizeof first, "%s (%s) quantizes (weight_format %s, activation_format %s): layer 2 measures the contract's "
               "approximation on every quantized layer", mi->module, mi->cls, wf[0] ? wf : "none", af[0] ? af : "none");
    /* each precision layer 1 saw, measured by a contract report (once per format) */
    if (has_verb(e, "contract") && quantizes(wf) && !measured(e, "d_x", wf) && !listed(n, "weight format ", wf))
      need(n, "layer 2", "weight format %s (of %s) is measured by no contract report's d_x rows: the method measures each "
           "target precision combination separately (contract --weight-format %s)", wf, mi->module, wf);
    if (has_verb(e, "contract") && quantizes(af) && !measured(e, "d_weight", af) && !listed(n, "activation format ", af))
      need(n, "layer 2", "activation format %s (of %s) is measured by no contract report's d_weight rows: the method measures "
           "each target precision combination separately (contract --activation-format %s)", af, mi->module, af);
  }
  n->l2_required = first[0] || !mods;
  snprintf(n->l2_why, sizeof n->l2_why, "%s",
           master[0] ? master : first[0] ? first
           : mods ? "" : "no layer-1 module description shows that the contracts quantize nothing");
  if (n->l2_required && !has_verb(e, "contract")) need(n, "layer 2", "no contract report, and it is required: %s", n->l2_why);
}

/* Layer 3: a report comparing under_test with both other arms. */
static void layer3(const qc_evidence *e, qc_audit_need *n) {
  if (!has_verb(e, "sft")) {
    need(n, "layer 3", "no sft report: the proxy SFT of three arms (under_test, gradient_reference, native_baseline) is the "
         "only layer that sees the whole training chain, and layers 1 and 2 cannot replace it");
    return;
  }
  static const char *const other[2] = {"gradient_reference", "native_baseline"};
  int have[2] = {0, 0};
  for (int j = 0; j < e->nsft; j++) {
    int h[2] = {0, 0};
    for (int p = 0; p < e->sft[j].npair; p++) {
      const qc_ev_pair *q = &e->sft[j].pair[p];
      for (int k = 0; k < 2; k++)
        h[k] |= (!strcmp(q->a, "under_test") && !strcmp(q->b, other[k])) || (!strcmp(q->b, "under_test") && !strcmp(q->a, other[k]));
    }
    if (h[0] && h[1]) return; /* one report holds the three-arm comparison */
    have[0] |= h[0];
    have[1] |= h[1];
  }
  need(n, "layer 3", "no sft report compares under_test with both gradient_reference and native_baseline (%s%s%s): the method's "
       "comparison needs the three arms in one controlled run", have[0] ? "" : "no under_test~gradient_reference pair",
       !have[0] && !have[1] ? ", " : "", have[1] ? "" : "no under_test~native_baseline pair");
}

void qc_audit_needs(const qc_evidence *e, qc_audit_need *n) {
  memset(n, 0, sizeof *n);
  if (!has_verb(e, "vjp"))
    need(n, "layer 1", "no vjp report: the module-level VJP comparison comes first (the method runs 1 -> 2 -> 3), and no later "
         "layer replaces it");
  if (!has_verb(e, "step"))
    need(n, "one-step", "no step report: the method's layer 1 compares a one-step update besides dX and dW, and its layer 3 "
         "compares the one-step update of under_test and gradient_reference before any curve");
  layer2(e, n);
  layer3(e, n);
}

int qc_audit_need_has(const qc_audit_need *n, const char *verb) {
  const char *l = !verb ? NULL : !strcmp(verb, "vjp") ? "layer 1" : !strcmp(verb, "step") ? "one-step"
                  : !strcmp(verb, "contract") ? "layer 2" : !strcmp(verb, "sft") ? "layer 3" : NULL;
  for (int k = 0; l && k < n->n; k++)
    if (!strcmp(n->layer[k], l)) return 1;
  return 0;
}

/* Whether the audit is whole: what the method requires and is missing, each
 * with why; or that every layer it requires is there. */
void qc_audit_completeness(qc_doc *d, const qc_audit_ctx *a) {
  const qc_audit_need *n = &a->need;
  qc_doc_p(d);
  qc_doc_strong(d, "Completeness: ");
  if (!n->n) {
    qc_doc_text(d, "complete: layer 1 (vjp) with the one-step update (step), layer 2 (contract) %s and layer 3 (sft) with its "
                "three arms are all here, as the method (1 -> 2 -> 3) requires.",
                n->l2_required ? "as required" : "(not required: no audited module quantizes)");
    if (n->l2_required && n->l2_why[0]) qc_doc_text(d, " Layer 2 is required: %s.", n->l2_why);
    return;
  }
  qc_doc_verdict(d, "incomplete");
  qc_doc_text(d, ": %d requirement(s) of the method missing%s; no verdict of pass stands on it:", n->n,
              a->allow_incomplete ? " (accepted by --allow-incomplete: the audit still says incomplete)" : "");
  for (int k = 0; k < n->n; k++) {
    qc_doc_li(d);
    qc_doc_strong(d, "%s", n->layer[k]);
    qc_doc_text(d, ": %s.", n->why[k]);
  }
}
