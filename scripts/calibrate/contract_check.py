#!/usr/bin/env python3
"""contract_check.py: a `contract --json` report against torch's own float64
numbers (make_torch_data.py's torch_ckpt_expected.json): every expected row
(module, weight format, d_x) must be in the report with cosine, norm ratio
and rel-L2 within REL relative. Prints the worst relative difference.

    contract_check.py REPORT.json EXPECTED.json [--rel 1e-6]
exit 0: all within; 1: some differ or are missing."""
import argparse
import json
import sys


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("report")
    ap.add_argument("expected")
    ap.add_argument("--rel", type=float, default=1e-6)
    a = ap.parse_args()
    rep = json.load(open(a.report))
    exp = json.load(open(a.expected))
    worst, bad = 0.0, 0
    for x in exp["rows"]:
        m = [y for y in rep["rows"] if y["module"] == x["module"] and y["weight_format"] == x["weight_format"]
             and y["tensor"] == "d_x" and y["dy"] == x["dy"]]
        if len(m) != 1:
            print("missing: %s %s" % (x["module"], x["weight_format"]))
            bad += 1
            continue
        for k in ("cosine", "norm_ratio", "rel_l2"):
            got, want = m[0]["metrics"][k], x[k]
            rel = abs(got - want) / abs(want)
            worst = max(worst, rel)
            if rel > a.rel:
                print("%s %s %s: qatcheck %.17g torch %.17g (relative %.2e)" % (x["module"], x["weight_format"], k, got, want, rel))
                bad += 1
    print("contract_check: %d rows, worst relative difference %.3e (bound %.0e)%s"
          % (len(exp["rows"]), worst, a.rel, "" if not bad else ", %d beyond" % bad))
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
