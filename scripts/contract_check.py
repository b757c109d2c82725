#!/usr/bin/python3
"""contract_check.py: an independent float64 numpy recomputation of a
`qatcheck contract --master-vs-dequant` JSON report.

For every row of the report whose format this script implements, it reads the
module's weight (or one expert of it), dY and X from the dump with h5py,
quantizes under the row's profile with the independent numpy oracle
(scripts/conformance/quant_oracle.py, not qatcheck's C code), computes the
two gradients in float64 and the
metrics, and compares cosine, norm ratio and rel-L2 with the report within
--rtol (default 1e-9) relative. It then recomputes the class summaries and the
outlier marks from the report's rows by the rule of docs/contract.md.

usage: contract_check.py DUMP.h5 REPORT.json [--rtol R] [--require FMT,...]
  --require: fail unless at least one row of each named format was checked.
Exit 0 when everything agrees, 1 otherwise.
"""
import argparse
import json
import math
import os
import sys

import qcpython  # noqa: E402  (scripts/qcpython.py: the right interpreter)

qcpython.need("h5py", "numpy")
import h5py
import numpy as np

F32 = np.float32

# ---- decoding --------------------------------------------------------------


def read(ds, index=None):
    """Dataset (or slice `index` of its first dimension) decoded to float64."""
    a = ds[index] if index is not None else ds[()]
    if ds.attrs.get("dtype", None) in ("bfloat16", b"bfloat16"):
        a = (a.astype(np.uint32) << 16).view(np.float32)
    return np.asarray(a, dtype=np.float64)


# ---- quantizers: the independent oracle (scripts/conformance/quant_oracle.py), every profile ----

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "conformance"))
import quant_oracle  # noqa: E402

QUANT = ["none"] + quant_oracle.FORMATS


def fake_quant(fmt, prof, x):
    """dequant(quant(x)) under the row's format and profile, float64."""
    return quant_oracle.fake_quant(fmt, prof, x).astype(np.float64)

# ---- generated data (qatcheck's rng.c: splitmix64, xoshiro256**, polar normals) ----

M64 = (1 << 64) - 1


def fnv1a64(s):
    h = 0xCBF29CE484222325
    for ch in s.encode():
        h = ((h ^ ch) * 0x100000001B3) & M64
    return h


class Rng:
    def __init__(self, seed):
        x = seed
        self.s = []
        for _ in range(4):
            x = (x + 0x9E3779B97F4A7C15) & M64
            z = x
            z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & M64
            z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & M64
            self.s.append(z ^ (z >> 31))
        self.spare = None

    def u64(self):
        s = self.s
        rotl = lambda x, k: ((x << k) | (x >> (64 - k))) & M64
        res = (rotl((s[1] * 5) & M64, 7) * 9) & M64
        t = (s[1] << 17) & M64
        s[2] ^= s[0]; s[3] ^= s[1]; s[1] ^= s[2]; s[0] ^= s[3]
        s[2] ^= t; s[3] = rotl(s[3], 45)
        return res

    def normal(self):
        if self.spare is not None:
            v, self.spare = self.spare, None
            return v
        while True:
            u = 2.0 * ((self.u64() >> 11) * 2.0 ** -53) - 1.0
            v = 2.0 * ((self.u64() >> 11) * 2.0 ** -53) - 1.0
            s = u * u + v * v
            if 0.0 < s < 1.0:
                break
        f = math.sqrt(-2.0 * math.log(s) / s)
        self.spare = v * f
        return u * f


def generated(seed, what, rows, cols):
    """qatcheck's generated dY / X: one per shape, shared by every module of that width."""
    r = Rng(seed ^ fnv1a64("%dx%d#%s" % (rows, cols, what)))
    return np.array([r.normal() for _ in range(rows * cols)]).reshape(rows, cols)


# ---- the check -------------------------------------------------------------------


def group_of(module, expert):
    """Dump group and expert index of a row module (the expert index follows 'experts')."""
    if expert is None:
        return module, None
    parts = module.split(".")
    i = parts.index("experts")
    assert parts[i + 1] == str(expert)
    return ".".join(parts[:i + 1] + parts[i + 2:]), expert


def metrics(g, r):
    ng, nr = np.linalg.norm(g), np.linalg.norm(r)
    cos = float(np.dot(g.ravel(), r.ravel()) / (ng * nr)) if ng > 0 and nr > 0 else None
    # as qatcheck: a norm ratio over a zero reference is not a number (null in the report)
    return {"cosine": cos, "norm_ratio": float(ng / nr) if nr > 0 else None,
            "rel_l2": float(np.linalg.norm(g - r) / max(nr, 1e-30))}


def close(a, b, rtol):
    if a is None or b is None:
        return a is None and b is None
    return abs(a - b) <= rtol * max(abs(a), abs(b), 1e-300)


def check_rows(f, rep, rtol, required):
    checked, skipped, bad, worst = {}, {}, 0, 0.0
    for row in rep["rows"]:
        fmt = row["weight_format"] if row["tensor"] == "d_x" else row["activation_format"]
        if fmt not in QUANT:
            skipped[fmt] = skipped.get(fmt, 0) + 1
            continue
        grp, e = group_of(row["module"], row["expert"])
        W = read(f[grp + "/params/weight"], e)
        N, K = W.shape
        if row["dy"] == "generated":
            dy = generated(rep["generated"]["seed"], "dy", rep["generated"]["tokens"], N)
        else:
            ds = f[grp + "/grad_out/" + row["dy"]]
            dy = read(ds, e if ds.ndim == 3 else None)
        if row["tensor"] == "d_x":
            Wq = fake_quant(fmt, row.get("profile", "vllm"), W)
            r, g = dy @ W, dy @ Wq
        else:
            M = dy.shape[0]
            if grp + "/inputs/x" in f:
                ds = f[grp + "/inputs/x"]
                X = read(ds, e if ds.ndim == 3 else None)
            else:
                X = generated(rep["generated"]["seed"], "x", M, K)
            r, g = dy.T @ X, dy.T @ fake_quant(fmt, row.get("profile", "vllm"), X)
        mine, theirs = metrics(g, r), row["metrics"]
        ok = True
        for k in ("cosine", "norm_ratio", "rel_l2"):
            if not close(mine[k], theirs[k], rtol):
                ok = False
            elif mine[k] is not None:
                worst = max(worst, abs(mine[k] - theirs[k]) / max(abs(mine[k]), 1e-300))
        if list(g.shape) != row["shape"]:
            ok = False
        if not ok:
            bad += 1
            if bad <= 10:
                print("MISMATCH %s %s %s/%s dy=%s: mine %s, report %s" % (row["module"], row["tensor"],
                      row["weight_format"], row["activation_format"], row["dy"], mine, theirs))
        checked[fmt] = checked.get(fmt, 0) + 1
    for fmt in required:
        if checked.get(fmt, 0) == 0:
            print("FAIL: no row of required format %s was checked" % fmt)
            bad += 1
    print("contract_check: rows checked per format %s, skipped (format not implemented here) %s, "
          "max relative difference %.3g, mismatches %d" % (checked, skipped, worst, bad))
    return bad


def robust_outliers(rows):
    """The rule of docs/contract.md, recomputed from the rows' metrics."""
    lr = np.log10(np.maximum([r["metrics"]["rel_l2"] for r in rows], 1e-12))
    nr = np.array([r["metrics"]["norm_ratio"] for r in rows], dtype=np.float64)
    rel_med = float(np.median([r["metrics"]["rel_l2"] for r in rows]))
    if len(rows) < 4:
        return [False] * len(rows)
    lmed = np.median(lr)
    lscale = max(1.4826 * np.median(np.abs(lr - lmed)), 0.05)
    nmed = np.median(nr)
    nscale = max(1.4826 * np.median(np.abs(nr - nmed)), 0.1 * rel_med, 1e-12)
    return list((np.abs(lr - lmed) / lscale > 3.5) | (np.abs(nr - nmed) / nscale > 3.5))


def check_classes(rep):
    bad = 0
    groups_ = {}
    for r in rep["rows"]:
        groups_.setdefault((r["class"], r["tensor"], r["weight_format"], r["activation_format"]), []).append(r)
    if len(groups_) != len(rep["classes"]):
        print("FAIL: %d classes in the report, %d recomputed" % (len(rep["classes"]), len(groups_)))
        bad += 1
    for c in rep["classes"]:
        rows = groups_.get((c["class"], c["tensor"], c["weight_format"], c["activation_format"]), [])
        cos = [r["metrics"]["cosine"] for r in rows if r["metrics"]["cosine"] is not None]
        nrs = [r["metrics"]["norm_ratio"] for r in rows
               if r["metrics"]["norm_ratio"] is not None and math.isfinite(r["metrics"]["norm_ratio"])]
        span = lambda v: [min(v), float(np.median(v)), max(v)] if v else [None, None, None]  # none defined: null
        want = {"rows": len(rows), "layers": len({r["layer"] for r in rows}),
                "cosine": span(cos), "norm_ratio": span(nrs)}
        got = {"rows": c["rows"], "layers": c["layers"],
               "cosine": [c["cosine"]["min"], c["cosine"]["median"], c["cosine"]["max"]],
               "norm_ratio": [c["norm_ratio"]["min"], c["norm_ratio"]["median"], c["norm_ratio"]["max"]]}
        if want["rows"] != got["rows"] or want["layers"] != got["layers"] or not all(
                close(a, b, 1e-12) for k in ("cosine", "norm_ratio") for a, b in zip(want[k], got[k])):
            print("FAIL class %s: recomputed %s, report %s" % (c["class"], want, got))
            bad += 1
        flags = robust_outliers(rows)
        for r, fl in zip(rows, flags):
            if bool(fl) != r["outlier"]:
                print("FAIL outlier mark of %s %s %s/%s: recomputed %s, report %s" % (
                    r["module"], r["tensor"], r["weight_format"], r["activation_format"], bool(fl), r["outlier"]))
                bad += 1
    print("contract_check: %d classes recomputed, %d disagreements" % (len(rep["classes"]), bad))
    return bad


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("dump")
    ap.add_argument("report")
    ap.add_argument("--rtol", type=float, default=1e-9)
    ap.add_argument("--require", default="")
    a = ap.parse_args()
    with open(a.report) as fh:
        rep = json.load(fh)
    required = [s for s in a.require.split(",") if s]
    with h5py.File(a.dump, "r") as f:
        bad = check_rows(f, rep, a.rtol, required) + check_classes(rep)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
