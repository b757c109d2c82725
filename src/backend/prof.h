/* prof.h: the backend seam's profile (prof.c), QATCHECK_PROFILE. */
#ifndef QC_BACKEND_PROF_H
#define QC_BACKEND_PROF_H

#include "backend/backend.h"

/* A copy of inner's table that times and counts each operation (*out;
 * QC_ESYS when it cannot be allocated). */
int qc_backend_profile_wrap(const qc_backend *inner, const qc_backend **out);
/* 1 when be is such a copy. */
int qc_backend_is_profile(const qc_backend *be);
/* Print be's profile on stderr, free the copy and return the backend it
 * wrapped. */
const qc_backend *qc_backend_profile_end(const qc_backend *be);

#endif
