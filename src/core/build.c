/* build.c: the source commit this binary was built from (qc.h). The
 * Makefile passes QC_BUILD_COMMIT (git describe --always --dirty of the
 * checkout, "unknown" outside one) to this object alone, and rebuilds it
 * when the commit changes (the abi.stamp rule). */
#include "core/qc.h"

#ifndef QC_BUILD_COMMIT
#define QC_BUILD_COMMIT "unknown"
#endif

const char *qc_build_commit(void) { return QC_BUILD_COMMIT[0] ? QC_BUILD_COMMIT : "unknown"; }
