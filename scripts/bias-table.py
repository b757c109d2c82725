#!/usr/bin/env python3
"""bias-table.py: the bias test's z on correct candidates (docs/tolerances.md,
"The bias test"). Runs `qatcheck vjp` on every case in cases/ under several
seeds (generated data; the dump case once) and on the correct modules of the
end-to-end dumps (scripts/make_linear_dump.py at 1, 48 and 96 tokens,
make_class_dump.py, make_diag_dump.py, each under several seeds), then prints
a Markdown table per source: checks, how many are exact (the candidate
equals the reference rounded to its precision: z = 0 by construction), and
over the others the raw z = e_par / sd (mean, sd, max |z|) and the judged z
(max |z|, how many over the default bound 5). A correct candidate must never
cross the bound.

    scripts/bias-table.py [--seeds N] [--qatcheck ./qatcheck] [--cases GLOB] [--keep DIR]

Needs the interpreter that has h5py and numpy (/usr/bin/python3 here).
Prints the table on stdout; exits 1 when a correct check failed its bias test.
"""
import argparse
import glob
import json
import math
import os
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)


def run(qc, case, out):
    p = subprocess.run([qc, "vjp", "--case", case, "--json", out, "--quiet"], capture_output=True, text=True)
    if p.returncode == 2:
        sys.exit("bias-table: %s: %s" % (case, p.stderr.strip()))
    return json.load(open(out))


def stats(zs):
    n = len(zs)
    if not n:
        return float("nan"), float("nan"), float("nan")
    mu = sum(zs) / n
    sd = math.sqrt(sum((z - mu) ** 2 for z in zs) / (n - 1)) if n > 1 else float("nan")
    return mu, sd, max(abs(z) for z in zs)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seeds", type=int, default=3)
    ap.add_argument("--qatcheck", default=os.path.join(ROOT, "qatcheck"))
    ap.add_argument("--cases", default=os.path.join(ROOT, "cases", "*.json"))
    ap.add_argument("--keep", help="keep the reports in this folder")
    a = ap.parse_args()
    tmp = a.keep or tempfile.mkdtemp(prefix="bias-table.")
    os.makedirs(tmp, exist_ok=True)
    rows = {}  # source -> list of (z_raw, z, exact, fail)

    def collect(source, report, correct=lambda m: True):
        for c in report["checks"]:
            m = c.get("metrics") or {}
            b = m.get("bias")
            if not b or not correct(c["module"]):
                continue
            exact = b["e_par"] == 0 and b["sd"] == 0
            zr = b["z_raw"] if b["z_raw"] is not None else float("inf")
            z = m["bias_z"] if m["bias_z"] is not None else float("inf")
            rows.setdefault(source, []).append((zr, z, exact, c["verdict"] == "fail" and c["why"].startswith("bias_z")))

    for f in sorted(glob.glob(a.cases)):
        c = json.load(open(f))
        name = os.path.basename(f)[:-5]
        seeds = range(a.seeds) if "generate" in c["data"] else [None]
        for s in seeds:
            if s is not None:
                c["data"]["generate"]["seed"] = 1000 * s + c["data"]["generate"].get("seed", 0)
            else:
                c["data"]["dump"] = os.path.join(os.path.dirname(os.path.abspath(f)), c["data"]["dump"])
            path = os.path.join(tmp, "%s.%s.json" % (name, s))
            json.dump(c, open(path, "w"))
            print("bias-table: %s seed %s" % (name, s), file=sys.stderr)
            collect("cases/" + name, run(a.qatcheck, path, path + ".r"))

    derive = {t: {"derive": True} for t in ("d_x", "d_weight", "d_bias", "d_q", "d_k", "d_v", "d_gate", "d_up", "d_logits")}
    for s in range(a.seeds):
        dumps = [("make_linear_dump.py M=%d" % m, ["make_linear_dump.py", "--m", str(m), "--seed", str(s)], "^/model")
                 for m in (1, 48, 96)]
        dumps += [("make_class_dump.py", ["make_class_dump.py", "--seed", str(s)], "^/model"),
                  ("make_diag_dump.py", ["make_diag_dump.py", "--seed", str(s)], "^/ok")]
        for source, cmd, regex in dumps:
            h5 = os.path.join(tmp, "dump.%d.%s.h5" % (s, cmd[0]))
            subprocess.run([sys.executable, os.path.join(HERE, cmd[0]), h5] + cmd[1:], check=True)
            case = {"data": {"dump": h5, "modules": regex}, "candidate": "dump", "tolerances": derive}
            path = h5 + ".case.json"
            json.dump(case, open(path, "w"))
            print("bias-table: %s seed %d" % (source, s), file=sys.stderr)
            collect("tests/e2e " + source, run(a.qatcheck, path, path + ".r"))

    print("| source | checks | exact | raw z mean | raw z sd | raw max \\|z\\| | judged max \\|z\\| | over 5 |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|")
    total_fail = 0
    allz = []
    for src in sorted(rows):
        r = rows[src]
        zr = [x[0] for x in r if not x[2]]
        allz += zr
        mu, sd, mx = stats(zr)
        jmax = max((abs(x[1]) for x in r), default=0)
        over = sum(1 for x in r if x[3])
        total_fail += over
        print("| %s | %d | %d | %s | %s | %s | %.3g | %d |" % (src, len(r), sum(1 for x in r if x[2]),
              "-" if math.isnan(mu) else "%.2f" % mu, "-" if math.isnan(sd) else "%.2f" % sd,
              "-" if math.isnan(mx) else "%.3g" % mx, jmax, over))
    mu, sd, mx = stats(allz)
    print("| all | %d | %d | %.2f | %.2f | %.3g | | %d |" % (sum(len(r) for r in rows.values()),
          sum(1 for r in rows.values() for x in r if x[2]), mu, sd, mx, total_fail))
    sys.exit(1 if total_fail else 0)


if __name__ == "__main__":
    main()
