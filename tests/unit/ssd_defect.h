/* ssd_defect.h: the production SSD VJP with planted defects
 * (ssd_defect.c), for tests/unit/test_ssd.c. */
#ifndef QC_TEST_SSD_DEFECT_H
#define QC_TEST_SSD_DEFECT_H

#include "model/module.h"

/* The defects: SSD_OK none; the chunk boundary state not passed; the decay
 * of step t taken from dt_{t-1}; d_A without its within-chunk term; d_dt
 * without its x (x) B term; the D skip's d_x term forgotten; d_D left at
 * 0; d_Bm, d_Cm summed over the wrong heads of a group (h mod G); under
 * the z gate d_z left at 0, or dY not gated before the scan's VJP. */
enum { SSD_OK = 0, SSD_NO_STATE_PASS = 1, SSD_DECAY_OFF_BY_ONE = 2, SSD_DA_NO_INTRA = 3, SSD_DDT_NO_XB = 4, SSD_NO_D_GRAD = 5, SSD_NO_D_PARAM = 6,
       SSD_GROUP_WRONG_HEADS = 7, SSD_Z_NO_DZ = 8, SSD_Z_UNGATED_DX = 9 };

/* The production SSD VJP of m for dyt into grads with planted defect
 * `defect` (an SSD_* above); returns a status. */
int t_ssd_vjp_defect(const qc_module *m, const qc_tensor *dyt, qc_tset *grads, int defect);

#endif
