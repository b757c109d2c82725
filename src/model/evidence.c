/* evidence.c: freeing what an audit was assembled from (evidence.h). */
#include "model/evidence.h"

#include <stdlib.h>
#include <string.h>

static void series_free(qc_ev_series *s) {
  free(s->x);
  free(s->y);
  s->x = s->y = NULL;
  s->n = 0;
}

void qc_evidence_free(qc_evidence *e) {
  for (int i = 0; i < e->nl2; i++) qc_sweep_free(&e->l2[i].s);
  for (int i = 0; i < e->nsft; i++) {
    qc_ev_sft *s = &e->sft[i];
    for (int p = 0; p < s->npair; p++) {
      for (int m = 0; m < s->pair[p].n; m++)
        for (int k = 0; k < s->pair[p].m[m].nser; k++) series_free(&s->pair[p].m[m].ser[k]);
      free(s->pair[p].m);
    }
    for (int c = 0; c < s->ncurve; c++) series_free(&s->curve[c]);
    free(s->cfg);
    free(s->pair);
    free(s->curve);
  }
  free(e->src);
  free(e->l1);
  free(e->mod);
  free(e->l2);
  free(e->sft);
  free(e->step);
  memset(e, 0, sizeof *e);
}
