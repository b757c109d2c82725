#!/usr/bin/env python3
"""relabel.py: copy a calibration file with every record of profile FROM
(and format FMT, when given) relabeled as profile TO, or with one payload
byte flipped (--flip): planted defects for tests/e2e/quant_calibration.sh,
and a measure of how far two producer paths' bytes lie apart
(`qatcheck quant --calibration` on the copy counts them).

    relabel.py IN.qcal OUT.qcal --from P --to Q
    relabel.py IN.qcal OUT.qcal --flip N     (payload byte N of the first record)
    relabel.py IN.qcal OUT.qcal --drop P     (every record but profile P's: a path
                                               withdrawn from the golden subset)"""
import argparse
import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import qcal  # noqa: E402


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("inp")
    ap.add_argument("out")
    ap.add_argument("--from", dest="src")
    ap.add_argument("--to")
    ap.add_argument("--flip", type=int)
    ap.add_argument("--drop")
    a = ap.parse_args()
    recs = list(qcal.read(a.inp))
    w = qcal.Writer(a.out)
    ids = {}
    for kind, r in recs:
        if kind == "input":
            ids[r["id"]] = w.add_input(r["name"], np.ascontiguousarray(r["x"]))
    first = True
    for kind, r in recs:
        if kind != "output" or (a.src and r["profile"] != a.src) or (a.drop and r["profile"] == a.drop):
            continue
        pay = np.frombuffer(r["payload"], np.uint8).copy()
        if a.flip is not None and first:
            pay[a.flip] ^= 1
        first = False
        w.add_output(a.to or r["profile"], r["format"], ids[r["input"]], pay, np.frombuffer(r["scale"], np.uint8), r["gscale"])
    w.close()


if __name__ == "__main__":
    main()
