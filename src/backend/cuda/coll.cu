/* coll.cu: the CUDA backend's collectives across processes (backend.h):
 * an NCCL communicator bootstrapped as nccl-tests does (rank 0's
 * ncclGetUniqueId handed to every rank by the caller, src/dist/, then
 * ncclCommInitRank) and an in-place sum over the ranks on the backend's
 * stream. Built without NCCL, coll_id and coll_init say so (QC_EINPUT) and
 * coll_ready is 0, so callers take the host path. */
#include <stdio.h>
#include <string.h>

#include "backend/cuda/cuda_priv.h"

#ifdef QC_HAVE_NCCL
/* A failed NCCL call as the one error line (system error). */
static int nccl_fail(const cu *c, const char *what, ncclResult_t r) {
  return qc_err_sys("%s: %s: %s", c->name, what, ncclGetErrorString(r));
}
#endif

/* Rank 0's communicator id into id (n >= NCCL_UNIQUE_ID_BYTES). */
int cu_coll_id(const qc_backend *be, void *id, size_t n) {
  cu *c = C(be);
#ifdef QC_HAVE_NCCL
  static_assert(sizeof(ncclUniqueId) <= QC_COLL_ID_BYTES, "QC_COLL_ID_BYTES holds an ncclUniqueId");
  if (n < sizeof(ncclUniqueId)) return qc_err_sys("%s: a collectives id needs %zu bytes, got %zu", c->name, sizeof(ncclUniqueId), n);
  ncclUniqueId u;
  ncclResult_t r = ncclGetUniqueId(&u);
  if (r != ncclSuccess) return nccl_fail(c, "ncclGetUniqueId", r);
  memset(id, 0, n);
  memcpy(id, &u, sizeof u);
  return QC_OK;
#else
  (void)id;
  (void)n;
  return qc_err("%s: this qatcheck's CUDA backend was built without NCCL: no device collectives", c->name);
#endif
}

/* Join the communicator of id as rank `rank` of nranks (collective over
 * the ranks: each blocks until all have joined). */
int cu_coll_init(const qc_backend *be, const void *id, int nranks, int rank) {
  cu *c = C(be);
#ifdef QC_HAVE_NCCL
  int rc = QC_OK;
  ncclUniqueId u;
  ncclResult_t r;
  if (c->comm) return QC_OK;
  memcpy(&u, id, sizeof u);
  CK(cudaSetDevice(c->dev), "cudaSetDevice");
  if ((r = ncclCommInitRank(&c->comm, nranks, u, rank)) != ncclSuccess) {
    c->comm = NULL;
    rc = nccl_fail(c, "ncclCommInitRank", r);
    goto done;
  }
  c->coll_ready = 1;
  if (qc_verbose) fprintf(stderr, "qatcheck: %s: NCCL %d.%d.%d communicator, rank %d of %d\n", c->name, NCCL_MAJOR, NCCL_MINOR,
                          NCCL_PATCH, rank, nranks);
done:
  return rc;
#else
  (void)id;
  (void)nranks;
  (void)rank;
  return qc_err("%s: this qatcheck's CUDA backend was built without NCCL: no device collectives", c->name);
#endif
}

/* 1 once the communicator is up. */
int cu_coll_ready(const qc_backend *be) { return C(be)->coll_ready; }

/* Reduce device buffer buf (n elements of dt) over the ranks, in place, on
 * the backend's stream: the sum, or the maximum (ncclAllReduce with ncclSum
 * or ncclMax; ordered after the work queued before). */
int cu_allreduce(const qc_backend *be, void *buf, int64_t n, qc_dtype dt, qc_redop op) {
  cu *c = C(be);
#ifdef QC_HAVE_NCCL
  ncclDataType_t t = dt == QC_F64 ? ncclFloat64 : dt == QC_F32 ? ncclFloat32 : ncclBfloat16;
  if (dt != QC_F64 && dt != QC_F32 && dt != QC_BF16) return qc_err("%s: all-reduce of an element type other than float64, float32, bfloat16", c->name);
  if (!c->comm) return qc_err_sys("%s: all-reduce before the communicator was made (coll_init)", c->name);
  if (n <= 0) return QC_OK;
  ncclResult_t r = ncclAllReduce(buf, buf, (size_t)n, t, op == QC_RED_MAX ? ncclMax : ncclSum, c->comm, c->st);
  if (r != ncclSuccess) return nccl_fail(c, "ncclAllReduce", r);
  return QC_OK;
#else
  (void)buf;
  (void)n;
  (void)dt;
  (void)op;
  return qc_err("%s: this qatcheck's CUDA backend was built without NCCL: no device collectives", c->name);
#endif
}

/* Free device memory now, in bytes. */
int cu_mem_free(const qc_backend *be, size_t *bytes) {
  cu *c = C(be);
  size_t fr = 0, tot = 0;
  int rc = QC_OK;
  CK(cudaSetDevice(c->dev), "cudaSetDevice");
  CK(cudaMemGetInfo(&fr, &tot), "cudaMemGetInfo");
  *bytes = fr + c->keep_bytes; /* gemm_f64_x's kept copies go when an allocation needs their room (cu_dalloc) */
done:
  return rc;
}

/* Free the communicator (at close; the stream is synced first); rc as cu_keep. */
int cu_coll_free(cu *c, int rc) {
#ifdef QC_HAVE_NCCL
  if (c->comm) {
    if (c->st) rc = cu_keep(c, rc, cudaStreamSynchronize(c->st), "the collectives' last work");
    ncclResult_t r = ncclCommDestroy(c->comm);
    if (r != ncclSuccess && !rc) rc = nccl_fail(c, "ncclCommDestroy", r);
    c->comm = NULL;
  }
#endif
  c->coll_ready = 0;
  return rc;
}
