#!/usr/bin/env python3
"""bias-table.py: the bias test's z on correct candidates (docs/tolerances.md,
"The bias test"). Runs `qatcheck vjp` on every case in cases/ under several
seeds (generated data; the dump case once) and on the correct modules of the
end-to-end dumps (scripts/make_linear_dump.py at 1, 48 and 96 tokens,
make_class_dump.py, make_diag_dump.py, tests/e2e/judge_planted.py's torch-made
/ok modules, tabulated per class, each under several seeds), then prints
a Markdown table per source: checks, how many are exact (the candidate
equals the reference rounded to its precision: z = 0 by construction), and
over the others the raw z = e_par / sd (mean, sd, max |z|) and the judged z
(max |z|, how many over the default bound 5). A correct candidate must never
cross the bound. "untested": checks with fewer than 16 effective elements
((sum r^2)^2 / sum r^4), where no standard error can be estimated and the
test is not made.

    scripts/bias-table.py [--seeds N] [--qatcheck ./qatcheck] [--cases GLOB] [--keep DIR] [--dumps | --no-dumps]
    scripts/bias-table.py --from DIR          (tabulate the reports a --keep run left)

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


def tabulate(folder):
    """The table of every report in folder (cases: NAME.SEED.json.r; dumps:
    dump.SEED.SCRIPT[--m_M].h5.case.json.r)."""
    rows = {}  # source -> list of (z_raw, z, exact)
    for f in sorted(glob.glob(os.path.join(folder, "*.r"))):
        b = os.path.basename(f)
        if b.startswith("dump."):
            script = b.split(".")[2].split("--m_")[0]
            src = "tests/e2e %s.py%s" % (script, " M=" + b.split("--m_")[1].split(".")[0] if "--m_" in b else "")
        else:
            src = "cases/" + b.split(".")[0]
        per_class = b.startswith("dump.") and "judge_planted" in b
        for c in json.load(open(f))["checks"]:
            m = c.get("metrics") or {}
            bias = m.get("bias")
            if not bias:
                continue
            exact = bias["e_par"] == 0 and bias["sd"] == 0
            if bias["sd"] is None:  # too few elements: not tested
                exact = None
            zr = bias["z_raw"] if bias["z_raw"] is not None else float("inf")
            z = m["bias_z"] if m["bias_z"] is not None else float("inf")
            rows.setdefault(src + (" " + c["class"] if per_class else ""), []).append((zr, z, exact))
    return table(rows)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seeds", type=int, default=3)
    ap.add_argument("--qatcheck", default=os.path.join(ROOT, "qatcheck"))
    ap.add_argument("--cases", default=os.path.join(ROOT, "cases", "*.json"))
    ap.add_argument("--keep", help="keep the reports in this folder")
    ap.add_argument("--no-dumps", action="store_true", help="only the cases")
    ap.add_argument("--from", dest="from_", help="tabulate the reports in this folder (from --keep) without running")
    a = ap.parse_args()
    if a.from_:
        return tabulate(a.from_)
    tmp = a.keep or tempfile.mkdtemp(prefix="bias-table.")
    os.makedirs(tmp, exist_ok=True)
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
            run(a.qatcheck, path, path + ".r")
    derive = {t: {"derive": True} for t in ("d_x", "d_weight", "d_bias", "d_q", "d_k", "d_v", "d_gate", "d_up", "d_logits", "d_w1",
                                            "d_w2", "d_topk_weights", "d_shared_w1", "d_shared_w2", "d_shared_gate", "d_dt",
                                            "d_A", "d_Bm", "d_Cm")}
    for s in range(0 if a.no_dumps else a.seeds):
        dumps = [(["make_linear_dump.py", "--m", str(m), "--seed", str(s)], "^/model") for m in (1, 48, 96)]
        dumps += [(["make_class_dump.py", "--seed", str(s)], "^/model"), (["make_diag_dump.py", "--seed", str(s)], "^/ok")]
        dumps += [(["judge_planted.py", "--seed", str(s)], "^/ok")]
        for cmd, regex in dumps:
            h5 = os.path.join(tmp, "dump.%d.%s%s.h5" % (s, cmd[0][:-3], "--m_%s" % cmd[2] if "--m" in cmd else ""))
            where = os.path.join(ROOT, "tests", "e2e") if cmd[0] == "judge_planted.py" else HERE
            subprocess.run([sys.executable, os.path.join(where, cmd[0]), h5] + cmd[1:], check=True)
            case = {"data": {"dump": h5, "modules": regex}, "candidate": "dump", "tolerances": derive}
            path = h5 + ".case.json"
            json.dump(case, open(path, "w"))
            print("bias-table: %s seed %d" % (" ".join(cmd), s), file=sys.stderr)
            run(a.qatcheck, path, path + ".r")
    return tabulate(tmp)


def table(rows):
    """Print the Markdown table; 1 when a correct check crossed the bias bound."""
    print("| source | checks | untested | exact | raw z mean | raw z sd | raw max \\|z\\| | judged max \\|z\\| | over 5 |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|")
    over_all, allz = 0, []
    fmt = lambda v, p: "-" if math.isnan(v) else p % v  # noqa: E731
    for src in sorted(rows):
        r = rows[src]
        zr = [x[0] for x in r if x[2] is False]
        allz += zr
        mu, sd, mx = stats(zr)
        jmax = max((abs(x[1]) for x in r), default=0)
        over = sum(1 for x in r if abs(x[1]) > 5)
        over_all += over
        print("| %s | %d | %d | %d | %s | %s | %s | %.3g | %d |" % (src, len(r), sum(1 for x in r if x[2] is None),
              sum(1 for x in r if x[2] is True), fmt(mu, "%.2f"), fmt(sd, "%.2f"), fmt(mx, "%.3g"), jmax, over))
    mu, sd, mx = stats(allz)
    print("| all | %d | %d | %d | %.2f | %.2f | %.3g | | %d |" % (sum(len(r) for r in rows.values()),
          sum(1 for r in rows.values() for x in r if x[2] is None), sum(1 for r in rows.values() for x in r if x[2] is True),
          mu, sd, mx, over_all))
    return 1 if over_all else 0


if __name__ == "__main__":
    sys.exit(main())
