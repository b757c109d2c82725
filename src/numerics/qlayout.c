/* qlayout.c: the scale-group grid of each quantizer format (qlayout.h). */
#include <string.h>

#include "core/qc.h"
#include "numerics/qlayout.h"

/* One row per format: group rows x group cols (0 = the whole dimension). */
static const struct {
  const char *name;
  int64_t gr, gc;
  int packed;
} g_fmts[] = {
    {"fp8_tensor", 0, 0, 0},        {"fp8_token", 1, 0, 0},         {"fp8_channel", 1, 0, 0},
    {"fp8_group128", 1, 128, 0},    {"fp8_group128_ue8m0", 1, 128, 0}, {"fp8_block128", 128, 128, 0},
    {"fp8_block128_ue8m0", 128, 128, 0}, {"nvfp4", 1, 16, 1},      {"mxfp8", 1, 32, 0},
    {"mxfp4", 1, 32, 1},
};

int qc_qlayout(const char *fmt, int64_t rows, int64_t cols, int64_t *grows, int64_t *gcols, int64_t *srows,
               int64_t *scols, int *packed) {
  for (size_t i = 0; i < sizeof g_fmts / sizeof g_fmts[0]; i++) {
    if (strcmp(fmt, g_fmts[i].name) != 0) continue;
    int64_t gr = g_fmts[i].gr ? g_fmts[i].gr : (rows ? rows : 1);
    int64_t gc = g_fmts[i].gc ? g_fmts[i].gc : (cols ? cols : 1);
    *grows = gr;
    *gcols = gc;
    *srows = (rows + gr - 1) / gr;
    *scols = (cols + gc - 1) / gc;
    *packed = g_fmts[i].packed;
    return QC_OK;
  }
  return qc_err("quantizer format '%s': expected one of fp8_tensor, fp8_token, fp8_channel, fp8_group128, "
                "fp8_group128_ue8m0, fp8_block128, fp8_block128_ue8m0, nvfp4, mxfp8, mxfp4", fmt);
}
