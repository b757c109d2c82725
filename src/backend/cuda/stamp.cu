/* stamp.cu: the backend's ABI stamp (backend.h: QC_BACKEND_ABI, the bump
 * rule). Alone in its file, so that a new commit recompiles this file only
 * (the Makefile passes QC_BUILD_COMMIT to it and to open.c). */
#include "backend/cuda/cuda_priv.h"

/* What open.c compares with its own before it calls into this .so. */
extern "C" const qc_backend_stamp qc_backend_cuda_stamp = {QC_BACKEND_ABI, (uint32_t)sizeof(qc_backend), QC_BUILD_ID};
