/* tensor.h: the one host tensor type, for dumps and generated data alike.
 * Shapes are row-major. Packed formats keep their storage shape: a
 * float4_e2m1fn_x2 tensor of shape [N, K/2] holds N x K elements. */
#ifndef QC_TENSOR_H
#define QC_TENSOR_H

#include <stddef.h>
#include <stdint.h>

#define QC_MAXDIM 8
#define QC_NAMELEN 96

typedef enum {
  QC_F64 = 0,
  QC_F32,
  QC_F16,
  QC_BF16,     /* uint16 storage, attribute dtype=bfloat16 */
  QC_I32,
  QC_I64,
  QC_U8,
  QC_E4M3,     /* float8_e4m3fn payload bytes */
  QC_E5M2,     /* float8_e5m2 */
  QC_E8M0,     /* float8_e8m0fnu scale bytes */
  QC_E2M1X2,   /* float4_e2m1fn_x2: two elements a byte, element 2i low nibble */
  QC_I8,       /* int8 (safetensors I8) */
  QC_DTYPE_COUNT
} qc_dtype;

/* Reductions over ranks (qc_dist_allreduce_op, the backends' allreduce). */
typedef enum { QC_RED_SUM = 0, QC_RED_MAX = 1 } qc_redop;

typedef struct qc_tensor {
  char name[QC_NAMELEN];
  qc_dtype dtype;
  int ndim;
  int64_t shape[QC_MAXDIM];
  void *data;        /* owned; nbytes long */
  size_t nbytes;
} qc_tensor;

/* A named, growable set of tensors (a dump group's inputs/, params/, ...). */
typedef struct qc_tset {
  int n, cap;
  qc_tensor *t;
} qc_tset;

const char *qc_dtype_name(qc_dtype d);         /* spec name: "float32", "bfloat16", ... */
int qc_dtype_from_name(const char *s, qc_dtype *out); /* QC_OK or QC_EINPUT (no message) */
size_t qc_dtype_size(qc_dtype d);              /* bytes per stored element */
int qc_dtype_is_float(qc_dtype d);             /* decodable to a real number */

int64_t qc_numel(const qc_tensor *t);          /* stored elements (bytes for packed) */
int64_t qc_shape_numel(int ndim, const int64_t *shape);
/* Format "[a, b, c]" into buf. Returns buf. */
char *qc_shape_str(int ndim, const int64_t *shape, char *buf, size_t n);
int qc_shape_eq(const qc_tensor *a, const qc_tensor *b);

/* Allocate t's storage for the given shape (zeroed). Refuses absurd
 * dimensions (negative, or more than 2^40 elements) with a message naming
 * `name`. Returns QC_OK / QC_EINPUT / QC_ESYS. */
int qc_tensor_alloc(qc_tensor *t, const char *name, qc_dtype dt, int ndim, const int64_t *shape);
/* qc_tensor_alloc without the zeroing, for an output whose every element the
 * caller writes next (a GEMM's C with beta 0, a rounding pass): the heap's
 * reused memory is not cleared first (64 MiB of memset per 2048^3 linear
 * audit on the CPU). */
int qc_tensor_alloc_out(qc_tensor *t, const char *name, qc_dtype dt, int ndim, const int64_t *shape);
void qc_tensor_free(qc_tensor *t);
/* Deep copy. */
int qc_tensor_copy(qc_tensor *dst, const qc_tensor *src);

/* Tensor sets. qc_tset_add takes ownership of t's storage (t is cleared). */
int qc_tset_add(qc_tset *s, qc_tensor *t);
const qc_tensor *qc_tset_get(const qc_tset *s, const char *name);
qc_tensor *qc_tset_get_mut(qc_tset *s, const char *name);
void qc_tset_free(qc_tset *s);

#endif
