/* att_cfgs.h: the attention shapes and masks on which the device path of
 * the attention reference is compared with its host path, shared by the
 * CPU emulation (tests/unit/test_attention_dev.c) and the GPU test
 * (tests/gpu/test_gpu_attention.c), so both cover the same cases. */
#ifndef QC_TEST_ATT_CFGS_H
#define QC_TEST_ATT_CFGS_H

#include <stdint.h>

typedef struct {
  int64_t B, Hq, Hkv, S, D, Dv, W, off;
  int causal;
  double cap;
} att_cfg;

static const att_cfg g_att_cfgs[] = {
    {1, 4, 2, 300, 16, 16, 0, 0, 1, 0},   /* GQA, two blocks of rows */
    {1, 2, 2, 300, 24, 16, 0, 0, 1, 0},   /* MLA: D 24, Dv 16 */
    {2, 2, 1, 200, 8, 8, 64, 0, 1, 30},   /* a window of 64 under a softcap of 30, two batches */
    {1, 2, 2, 130, 8, 8, 0, -5, 1, 0},    /* causal offset -5: five rows see no key */
    {1, 2, 2, 100, 8, 8, 0, 0, 0, 0},     /* no mask */
    {1, 2, 1, 600, 8, 8, 64, 0, 1, 0},    /* a window of 64 over three blocks: the later blocks' keys start past 0 */
    {1, 2, 2, 300, 8, 8, 0, -270, 1, 0},  /* causal offset -270: the first block sees no key at all */
    {1, 2, 2, 300, 8, 8, 0, 7, 1, 0},     /* causal offset +7 */
};
#define ATT_NCFGS ((int)(sizeof g_att_cfgs / sizeof g_att_cfgs[0]))

#endif
