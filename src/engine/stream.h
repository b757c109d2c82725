/* stream.h: the sink the audit offers the contract's reference of one
 * (module, dY) (model/sink.h): a gradient the reference hands over in
 * blocks of rows is compared block by block against the dump's candidate
 * (numerics/metrics.h qc_cmp_rows), so its float64 reference is never
 * whole in memory, and its metrics are those of the whole compare bit for
 * bit. */
#ifndef QC_STREAM_H
#define QC_STREAM_H

#include "model/case.h"
#include "model/check.h"
#include "model/module.h"
#include "model/sink.h"

typedef struct qc_streams qc_streams;

/* The streams of module m against the candidates cand (the dump's
 * gradients for one dY), tolerances from cs: *out, or NULL with a status. */
int qc_streams_open(const qc_case *cs, const qc_module *m, const qc_tset *cand, qc_streams **out);
/* The stream of one candidate g alone (gradient g->name; held the
 * precision its values carry, as qc_streams_has gives it): a variant's
 * reference of the gradient the contract's was compared in blocks. */
int qc_streams_open_one(const qc_case *cs, const qc_module *m, const qc_tensor *g, qc_dtype held, qc_streams **out);
/* 1 and buf [n] saying which block of gradient `grad` held the largest
 * share of its squared difference, when it was taken in more than one
 * block and differs; 0 otherwise. */
int qc_streams_where(const qc_streams *s, const char *grad, char *buf, size_t n);
/* The sink to put in the reference's qc_ctx. */
const qc_grad_sink *qc_streams_sink(qc_streams *s);
/* 1 when gradient `grad` was taken in blocks, *held then the precision its
 * candidate's values carry (as the whole compare finds it). */
int qc_streams_has(const qc_streams *s, const char *grad, qc_dtype *held);
/* k's metrics, judged dtype and precision from grad's finished compare,
 * as qc_audit_compare fills them (a non-finite reference is the caller's
 * to refuse). A status: every row must have come. */
int qc_streams_finish(qc_streams *s, const char *grad, const qc_tol *t, qc_check *k);
/* Release s and any compare not finished (s may be NULL). */
void qc_streams_free(qc_streams *s);

#endif
