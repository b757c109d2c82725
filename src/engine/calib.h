/* calib.h: qatcheck's quantizers against the bytes the real producers made
 * (calibration files of scripts/calibrate/, io/qcal.h): every record's
 * input is quantized under its (format, profile) by the host quantizer or a
 * device backend, and payload, scales and global scale are compared byte
 * for byte. */
#ifndef QC_CALIB_H
#define QC_CALIB_H

#include "backend/backend.h"
#include "model/deployed.h"

/* Compare every record of the calibration files paths[0..npaths) (a path
 * that is a folder: its *.qcal files, in name order) on be (NULL: the host
 * quantizers, qc_quantize), one row per (profile, format) in first-seen
 * order into *rows (malloc'd, *nrows). Unreadable or malformed files, an
 * unknown format or profile: QC_EINPUT naming the file. */
int qc_calib_check(const char *const *paths, int npaths, const qc_backend *be, qc_calib_row **rows, int *nrows);

#endif
