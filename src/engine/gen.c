/* gen.c: generated instances and dY kinds (see gen.h). */
#include "engine/gen.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "numerics/formats.h"
#include "core/qc.h"

/* Make dY of kind `kind` with shape [ndim, shape] as bfloat16 (a BF16
 * trainer's upstream gradient), named `kind`, into out.
 *   random: N(0,1); zero: all 0; ones: all 1;
 *   sparse: about 1% non-zero: ~10% of rows x ~10% of columns chosen at
 *           random (at least one of each), N(0,1) there.
 * Unknown kind: QC_EINPUT. */
static int qc_gen_dy(const char *kind, int ndim, const int64_t *shape, qc_rng *rng, qc_tensor *out) {
  int rc = qc_tensor_alloc(out, kind, QC_BF16, ndim, shape);
  if (rc) return rc;
  uint16_t *p = out->data;
  int64_t n = qc_numel(out);
  int64_t cols = ndim ? shape[ndim - 1] : 1, rows = cols ? n / cols : 0;
  if (strcmp(kind, "random") == 0) {
    for (int64_t i = 0; i < n; i++) p[i] = qc_f32_to_bf16((float)qc_rng_normal(rng));
  } else if (strcmp(kind, "zero") == 0) {
    /* calloc'd: +0.0 everywhere */
  } else if (strcmp(kind, "ones") == 0) {
    for (int64_t i = 0; i < n; i++) p[i] = 0x3f80;
  } else if (strcmp(kind, "sparse") == 0) {
    if (n > 0) {
      char *rsel = calloc((size_t)rows, 1), *csel = calloc((size_t)cols, 1);
      if (!rsel || !csel) { free(rsel); free(csel); qc_tensor_free(out); return qc_err_sys("out of memory for sparse dY"); }
      for (int64_t r = 0; r < rows; r++) rsel[r] = qc_rng_uniform(rng) < 0.1;
      for (int64_t c = 0; c < cols; c++) csel[c] = qc_rng_uniform(rng) < 0.1;
      rsel[(int64_t)(qc_rng_uniform(rng) * (double)rows)] = 1; /* at least one of each */
      csel[(int64_t)(qc_rng_uniform(rng) * (double)cols)] = 1;
      for (int64_t r = 0; r < rows; r++)
        for (int64_t c = 0; c < cols; c++)
          if (rsel[r] && csel[c]) {
            float v = (float)qc_rng_normal(rng);
            p[r * cols + c] = qc_f32_to_bf16(v == 0.0f ? 1.0f : v);
          }
      free(rsel);
      free(csel);
    }
  } else {
    qc_tensor_free(out);
    qc_err("dy kind '%s' is not one of random, zero, sparse, ones", kind);
    return QC_EINPUT;
  }
  return QC_OK;
}

int qc_gen_module(const qc_registry_row *row, int n, const int64_t *shape, uint64_t seed, int index, const char *values,
                  const char (*kinds)[QC_NAMELEN], int nkinds, qc_module *m) {
  const qc_class *cls = row->cls;
  char sb[128] = "";
  for (int i = 0, o = 0; i < n && o < (int)sizeof sb; i++)
    o += snprintf(sb + o, sizeof sb - (size_t)o, "%s%lld", i ? "x" : "", (long long)shape[i]);
  snprintf(m->path, sizeof m->path, "%s[%s]%s%s", cls->name, sb, values && strcmp(values, "normal") ? ":" : "",
           values && strcmp(values, "normal") ? values : "");
  m->cls = cls;
  qc_gen g = {.nshape = n, .seed = seed, .values = values};
  memcpy(g.shape, shape, (size_t)n * sizeof *shape);
  qc_rng rng;
  /* each instance and each dY kind get their own stream */
  qc_rng_seed(&rng, seed * 1000003ull + (uint64_t)index);
  int dndim = 0;
  int64_t dshape[QC_MAXDIM];
  int rc = cls->generate(&g, &rng, m, &dndim, dshape);
  if (rc) {
    qc_err("%s: cannot generate inputs", m->path);
    return rc;
  }
  for (int k = 0; k < nkinds; k++) {
    qc_rng dr;
    qc_rng_seed(&dr, seed * 1000003ull + (uint64_t)index + 0x5bd1e995ull * (uint64_t)(k + 1));
    qc_tensor dy;
    if ((rc = qc_gen_dy(kinds[k], dndim, dshape, &dr, &dy))) return rc;
    if ((rc = qc_tset_add(&m->grad_out, &dy))) { qc_tensor_free(&dy); return rc; }
  }
  return QC_OK;
}
