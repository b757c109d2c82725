/* open.c: picks a backend from --device. Never falls back: asking for a GPU
 * that is not there is an error, not a quiet CPU run. The CUDA backend is a
 * shared object (libqatcheck_cuda.so) loaded here on demand, so the CPU tool
 * neither loads nor needs the CUDA libraries. */
#include <dlfcn.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "core/qc.h"
#include "numerics/metrics.h"
#include "backend/backend.h"
#include "backend/prof.h"

typedef int (*cuda_open_fn)(int device, const qc_backend **out);
typedef void (*cuda_close_fn)(const qc_backend *be);
static void *g_lib;
static cuda_open_fn g_open;
static cuda_close_fn g_close;

/* The .so opened as h (from path) carries this qatcheck's stamp (backend.h:
 * the hash of the headers they share, and sizeof(qc_backend)): QC_OK, else
 * QC_EINPUT with one line naming both stamps and builds, and a hint. Reads
 * its stamp only, calls nothing in it. */
static int check_stamp(void *h, const char *path) {
  static const qc_backend_stamp self = QC_BACKEND_STAMP_INIT;
  const qc_backend_stamp *st = dlsym(h, QC_BACKEND_STAMP_SYM);
  char built[sizeof self.build + 1], hash[sizeof self.hash + 1];
  int rc = QC_OK;
  if (!st) {
    rc = qc_err("'%s': backend without an ABI stamp (built before stamps), qatcheck's ABI stamp is %s (built %s)", path,
                self.hash, self.build);
    goto done;
  }
  /* NUL-terminated even if they are not */
  snprintf(built, sizeof built, "%.*s", (int)sizeof st->build, st->build);
  if (st->format != QC_BACKEND_STAMP_FORMAT) { /* a stamp of another format: no hash to read */
    rc = qc_err("'%s': backend ABI %u (built %s), qatcheck's ABI stamp is %s (built %s)", path, st->format, built,
                self.hash, self.build);
    goto done;
  }
  snprintf(hash, sizeof hash, "%.*s", (int)sizeof st->hash, st->hash);
  if (strcmp(hash, self.hash) != 0)
    rc = qc_err("'%s': backend ABI stamp %s (built %s), qatcheck's ABI stamp is %s (built %s)", path, hash, built,
                self.hash, self.build);
  else if (st->size != self.size) /* the same headers compiled another way */
    rc = qc_err("'%s': backend ABI stamp %s with a %u-byte qc_backend (built %s), qatcheck's ABI stamp is %s with %u "
                "bytes (built %s)", path, hash, st->size, built, self.hash, self.size, self.build);
  else if (qc_verbose && strcmp(built, self.build) != 0)
    fprintf(stderr, "qatcheck: '%s': backend built %s, qatcheck built %s: the same ABI stamp %s, loading it\n", path,
            built, self.build, self.hash);
done:
  if (rc) qc_hint("rebuild both with 'make' (libqatcheck_cuda.so beside the qatcheck it was built with), or set "
                  "QATCHECK_CUDA_LIB to the matching one");
  return rc;
}

/* Open the backend at path for use (every symbol bound now) with its stamp
 * checked before anything in it is called: the handle, or NULL with the
 * message set. A .so that cannot be bound (a stale one may miss symbols of
 * this qatcheck) is opened lazily just to read its stamp, so a mismatch is
 * still named as one. */
static void *open_checked(const char *device, const char *path) {
  void *h = dlopen(path, RTLD_NOW | RTLD_LOCAL);
  if (!h) {
    const char *e = dlerror();
    char why[1024];
    snprintf(why, sizeof why, "%s", e ? e : "unknown reason");
    void *lazy = dlopen(path, RTLD_LAZY | RTLD_LOCAL);
    int rc = lazy ? check_stamp(lazy, path) : QC_OK;
    if (lazy) dlclose(lazy);
    if (rc) return NULL;
    qc_err("--device '%s': cannot load the CUDA backend '%s': %s", device, path, why);
    qc_hint("the CUDA runtime and cuBLAS must be installed where qatcheck runs (LD_LIBRARY_PATH)");
    return NULL;
  }
  if (check_stamp(h, path)) {
    dlclose(h);
    return NULL;
  }
  return h;
}

/* Load libqatcheck_cuda.so from $QATCHECK_CUDA_LIB, else beside the
 * executable, else one folder above it (test binaries live in build/). */
static int load_cuda(const char *device) {
  if (g_lib) return QC_OK;
  char cand[3][PATH_MAX + 32];
  int n = 0;
  const char *env = getenv("QATCHECK_CUDA_LIB");
  if (env && env[0]) snprintf(cand[n++], sizeof cand[0], "%s", env);
  char exe[PATH_MAX];
  ssize_t l = readlink("/proc/self/exe", exe, sizeof exe - 1);
  if (l > 0) {
    exe[l] = 0;
    char *s = strrchr(exe, '/');
    if (s) *s = 0;
    snprintf(cand[n++], sizeof cand[0], "%s/libqatcheck_cuda.so", exe);
    snprintf(cand[n++], sizeof cand[0], "%s/../libqatcheck_cuda.so", exe);
  }
  for (int i = 0; i < n; i++) {
    if (access(cand[i], F_OK) != 0) continue;
    void *h = open_checked(device, cand[i]);
    if (!h) return QC_EINPUT;
    void *o = dlsym(h, "qc_backend_cuda_open"), *c = dlsym(h, "qc_backend_cuda_close");
    if (!o || !c) {
      dlclose(h);
      return qc_err("--device '%s': '%s' is not a qatcheck CUDA backend", device, cand[i]);
    }
    memcpy(&g_open, &o, sizeof g_open);
    memcpy(&g_close, &c, sizeof g_close);
    g_lib = h;
    return QC_OK;
  }
  qc_err("--device '%s': this qatcheck has no CUDA backend (libqatcheck_cuda.so is not beside it)", device);
  qc_hint("build where nvcc is found (make builds libqatcheck_cuda.so), set QATCHECK_CUDA_LIB, or use --device cpu");
  return QC_EINPUT;
}

void *qc_backend_cuda_sym(const char *name) { return g_lib ? dlsym(g_lib, name) : NULL; }

/* The backend named by device, without the profile. */
static int open_plain(const char *device, const qc_backend **out) {
  if (!device || strcmp(device, "cpu") == 0) {
    *out = qc_backend_cpu();
    return QC_OK;
  }
  if (strncmp(device, "cuda", 4) == 0 && (device[4] == 0 || device[4] == ':')) {
    int idx = 0;
    if (device[4] == ':') {
      char *end;
      long v = strtol(device + 5, &end, 10);
      if (!device[5] || *end || v < 0 || v > 1024)
        return qc_err("--device '%s': expected cpu, cuda or cuda:N with N a device index", device);
      idx = (int)v;
    }
    int rc = load_cuda(device);
    if (rc) return rc;
    return g_open(idx, out);
  }
  return qc_err("--device '%s': expected cpu, cuda or cuda:N", device);
}

/* open_plain; under QATCHECK_PROFILE (set, not "0") the backend's profile
 * (prof.c) wraps it, printed when it is closed. */
int qc_backend_open(const char *device, const qc_backend **out) {
  int rc = open_plain(device, out);
  const char *pf = getenv("QATCHECK_PROFILE");
  if (rc || !pf || !pf[0] || strcmp(pf, "0") == 0) return rc;
  const qc_backend *in = *out;
  if ((rc = qc_backend_profile_wrap(in, out))) {
    *out = NULL;
    qc_backend_close(in);
  }
  return rc;
}

void qc_backend_close(const qc_backend *be) {
  if (be && qc_backend_is_profile(be)) be = qc_backend_profile_end(be);
  if (!be || be == qc_backend_cpu()) return;
  if (g_close) g_close(be);
}

size_t qc_linear_audit_bytes(int64_t M, int64_t K, int64_t N) {
  size_t mk = (size_t)(M * K), nk = (size_t)(N * K), mn = (size_t)(M * N);
  size_t bx = qc_bias_dev_doubles(M, K), bw = qc_bias_dev_doubles(N, K);
  /* float64: W_ref, X, dY, two references, the bias test's sums of each
   * gradient (the two run at once on two streams); bf16: W_ref, two candidates */
  return 8 * (nk + mk + mn + mk + nk + bx + bw) + 2 * (nk + mk + nk) + ((size_t)64 << 20);
}
