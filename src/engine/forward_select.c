/* forward_select.c: see forward_priv.h. The check of a saved selection
 * (integer ids the forward chose and the backward reads: router's
 * saved/topk_ids) against the selection the contract defines, recomputed
 * by the class's reference (its registry row's `select`): exact, no
 * tolerance; rows the precision of the dump leaves open are taken either
 * way and counted. No class is named. Also the set-up of every saved
 * tensor's check (qc_fwd_saved_init), which forward.c uses. */
#include <stdio.h>
#include <string.h>

#include "core/qc.h"
#include "engine/forward_priv.h"

void qc_fwd_saved_init(qc_check *k, const qc_module *m, const qc_tensor *t, const char *kind) {
  qc_tol none;
  char what[QC_NAMELEN + 8];
  memset(&none, 0, sizeof none);
  snprintf(what, sizeof what, "saved/%s", t->name);
  qc_check_init(k, m, "forward", what, t->ndim, t->shape, &none);
  k->has_tol = 0;
  snprintf(k->kind, sizeof k->kind, "%s", kind);
  snprintf(k->cand_dtype, sizeof k->cand_dtype, "%s", qc_dtype_name(t->dtype));
}

int qc_fwd_select_check(qc_audit *a, const qc_module *m, const qc_registry_row *row, const qc_tensor *t) {
  qc_select_result r;
  memset(&r, 0, sizeof r);
  r.first = -1;
  int rc = row->select(a->ctx, m, t->name, &r);
  if (rc == QC_NA) return QC_OK;
  if (rc) return rc;
  qc_check k;
  qc_fwd_saved_init(&k, m, t, "selection");
  k.verdict = r.differ ? QC_V_FAIL : QC_V_PASS;
  const char *unit = r.unit ? r.unit : "rows";
  char amb[224] = "";
  if (r.ambiguous)
    snprintf(amb, sizeof amb, "; %lld ambiguous (a near-tie within the dump's precision, or an open exact tie): either taken",
             (long long)r.ambiguous);
  if (r.unjudged)
    snprintf(amb + strlen(amb), sizeof amb - strlen(amb), "; %lld not judged (a non-finite selection key)", (long long)r.unjudged);
  if (r.differ)
    snprintf(k.why, sizeof k.why, "%lld of %lld %s select differently from the contract (%s); the first: %s%s", (long long)r.differ,
             (long long)r.rows, unit, r.rule, r.first_says, amb);
  else
    snprintf(k.why, sizeof k.why, "%lld %s as the contract selects (%s)%s", (long long)r.rows, unit, r.rule, amb);
  if (qc_verbose || r.differ) fprintf(stderr, "qatcheck: %s: %s: %s\n", m->path, k.tensor, k.why);
  return qc_results_add(a->res, &k);
}
