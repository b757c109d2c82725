/* tensor.c: host tensors and tensor sets (see tensor.h). */
#include "core/tensor.h"

#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/qc.h"

static const struct {
  const char *name;
  size_t size;
  int is_float;
} g_dt[QC_DTYPE_COUNT] = {
    [QC_F64] = {"float64", 8, 1},          [QC_F32] = {"float32", 4, 1},
    [QC_F16] = {"float16", 2, 1},          [QC_BF16] = {"bfloat16", 2, 1},
    [QC_I32] = {"int32", 4, 0},            [QC_I64] = {"int64", 8, 0},
    [QC_U8] = {"uint8", 1, 0},             [QC_E4M3] = {"float8_e4m3fn", 1, 1},
    [QC_E5M2] = {"float8_e5m2", 1, 1},     [QC_E8M0] = {"float8_e8m0fnu", 1, 1},
    [QC_E2M1X2] = {"float4_e2m1fn_x2", 1, 1}, [QC_I8] = {"int8", 1, 0},
};

const char *qc_dtype_name(qc_dtype d) {
  return (d >= 0 && d < QC_DTYPE_COUNT) ? g_dt[d].name : "?";
}

int qc_dtype_from_name(const char *s, qc_dtype *out) {
  for (int i = 0; i < QC_DTYPE_COUNT; i++)
    if (strcmp(s, g_dt[i].name) == 0) { *out = (qc_dtype)i; return QC_OK; }
  return QC_EINPUT;
}

size_t qc_dtype_size(qc_dtype d) { return g_dt[d].size; }
int qc_dtype_is_float(qc_dtype d) { return g_dt[d].is_float; }

int64_t qc_shape_numel(int ndim, const int64_t *shape) {
  int64_t n = 1;
  for (int i = 0; i < ndim; i++) n *= shape[i];
  return n;
}

int64_t qc_numel(const qc_tensor *t) { return qc_shape_numel(t->ndim, t->shape); }

char *qc_shape_str(int ndim, const int64_t *shape, char *buf, size_t n) {
  size_t o = 0;
  o += (size_t)snprintf(buf + o, n - o, "[");
  for (int i = 0; i < ndim && o < n; i++)
    o += (size_t)snprintf(buf + o, n - o, "%s%" PRId64, i ? ", " : "", shape[i]);
  if (o < n) snprintf(buf + o, n - o, "]");
  return buf;
}

int qc_shape_eq(const qc_tensor *a, const qc_tensor *b) {
  if (a->ndim != b->ndim) return 0;
  for (int i = 0; i < a->ndim; i++)
    if (a->shape[i] != b->shape[i]) return 0;
  return 1;
}

static int tensor_alloc(qc_tensor *t, const char *name, qc_dtype dt, int ndim, const int64_t *shape, int zero) {
  memset(t, 0, sizeof *t);
  snprintf(t->name, sizeof t->name, "%s", name);
  if (ndim < 0 || ndim > QC_MAXDIM)
    return qc_err("tensor '%s': rank %d is not supported: expected 0 to %d dimensions", name, ndim, QC_MAXDIM);
  int64_t n = 1;
  for (int i = 0; i < ndim; i++) {
    if (shape[i] < 0 || shape[i] > ((int64_t)1 << 40))
      return qc_err("tensor '%s': dimension %d is %" PRId64 ": expected 0 to 2^40", name, i, shape[i]);
    t->shape[i] = shape[i];
    if (shape[i] && n > ((int64_t)1 << 40) / shape[i])
      return qc_err("tensor '%s': more than 2^40 elements: expected a shape that fits in memory", name);
    n *= shape[i];
  }
  t->ndim = ndim;
  t->dtype = dt;
  t->nbytes = (size_t)n * qc_dtype_size(dt);
  t->data = qc_mem_huge(zero ? calloc(t->nbytes ? t->nbytes : 1, 1) : malloc(t->nbytes ? t->nbytes : 1), t->nbytes);
  if (!t->data) {
    char sb[128];
    return qc_err_sys("out of memory: tensor '%s' %s %s needs %zu bytes", name,
                      qc_shape_str(ndim, shape, sb, sizeof sb), qc_dtype_name(dt), t->nbytes);
  }
  return QC_OK;
}

int qc_tensor_alloc(qc_tensor *t, const char *name, qc_dtype dt, int ndim, const int64_t *shape) {
  return tensor_alloc(t, name, dt, ndim, shape, 1);
}

int qc_tensor_alloc_out(qc_tensor *t, const char *name, qc_dtype dt, int ndim, const int64_t *shape) {
  return tensor_alloc(t, name, dt, ndim, shape, 0);
}

void qc_tensor_free(qc_tensor *t) {
  if (!t) return;
  free(t->data);
  t->data = NULL;
  t->nbytes = 0;
}

int qc_tensor_copy(qc_tensor *dst, const qc_tensor *src) {
  int rc = qc_tensor_alloc(dst, src->name, src->dtype, src->ndim, src->shape);
  if (rc) return rc;
  memcpy(dst->data, src->data, src->nbytes);
  return QC_OK;
}

int qc_tset_add(qc_tset *s, qc_tensor *t) {
  for (int i = 0; i < s->n; i++)
    if (strcmp(s->t[i].name, t->name) == 0) {
      qc_tensor_free(&s->t[i]);
      s->t[i] = *t;
      memset(t, 0, sizeof *t);
      return QC_OK;
    }
  if (s->n == s->cap) {
    int cap = s->cap ? 2 * s->cap : 8;
    qc_tensor *nt = realloc(s->t, (size_t)cap * sizeof *nt);
    if (!nt) return qc_err_sys("out of memory growing a tensor set");
    s->t = nt;
    s->cap = cap;
  }
  s->t[s->n++] = *t;
  memset(t, 0, sizeof *t);
  return QC_OK;
}

const qc_tensor *qc_tset_get(const qc_tset *s, const char *name) {
  for (int i = 0; i < s->n; i++)
    if (strcmp(s->t[i].name, name) == 0) return &s->t[i];
  return NULL;
}

qc_tensor *qc_tset_get_mut(qc_tset *s, const char *name) {
  return (qc_tensor *)qc_tset_get(s, name);
}

void qc_tset_free(qc_tset *s) {
  for (int i = 0; i < s->n; i++) qc_tensor_free(&s->t[i]);
  free(s->t);
  memset(s, 0, sizeof *s);
}
