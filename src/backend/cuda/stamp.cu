/* stamp.cu: the backend's ABI stamp (backend.h: the hash of the headers
 * that cross the boundary). Alone in its file, so that a new commit or hash
 * recompiles this file only (the Makefile passes QC_BUILD_COMMIT and
 * QC_ABI_HASH to it and to open.c). */
#include "backend/cuda/cuda_priv.h"

/* What open.c compares with its own before it calls into this .so. */
extern "C" const qc_backend_stamp qc_backend_cuda_stamp = QC_BACKEND_STAMP_INIT;
