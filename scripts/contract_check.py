#!/usr/bin/python3
"""contract_check.py: an independent float64 numpy recomputation of a
`qatcheck contract --master-vs-dequant` JSON report.

For every row of the report whose format this script implements, it reads the
module's weight (or one expert of it), dY and X from the dump with h5py,
quantizes with its own numpy quantizers (written from docs/numerics.md, not
from qatcheck's C code), computes the two gradients in float64 and the
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


# ---- element encodings ---------------------------------------------------------


def e4m3(v):
    """RNE to float8_e4m3fn, saturating at +-448 (values as float64)."""
    v = np.asarray(v, dtype=np.float64)
    a = np.abs(v)
    _, e = np.frexp(a)
    q = np.ldexp(1.0, np.maximum(e - 1, -6) - 3)  # 3 mantissa bits, subnormal step 2^-9
    r = np.minimum(np.round(a / q) * q, 448.0)
    return np.copysign(r, v)


def e2m1(v):
    """RNE (ties to the even code) to e2m1, saturating at 6."""
    v = np.asarray(v, dtype=np.float64)
    a = np.abs(v)
    r = np.where(a < 2, np.round(a * 2) / 2, np.where(a < 4, np.round(a), np.round(a / 2) * 2))
    return np.copysign(np.minimum(r, 6.0), v)


def ceil2(s):
    """Power-of-two ceiling by the bit rule: exponent + 1 when the mantissa is non-zero."""
    u = np.asarray(s, dtype=F32).view(np.uint32)
    exp = (u >> 23) & 0xFF
    exp = np.where((u & 0x7FFFFF) != 0, exp + 1, exp)
    return (exp << 23).astype(np.uint32).view(F32)


def rcp(s):
    return (F32(1) / np.asarray(s, dtype=F32)).astype(F32)


def f32(x):
    return np.asarray(x, dtype=F32)


# ---- quantizers (profile vllm): dequant(quant(x)) for [rows, cols] ----------------


def q_tensor(x):
    x = f32(x)
    s = F32(np.max(np.abs(x))) / F32(448)
    q = e4m3(np.clip(x * rcp(s), -448, 448))
    return f32(q) * s


def q_row(x):
    """fp8_channel / fp8_token: per row, s = max(amax / 448, 1/229376), true division."""
    x = f32(x)
    s = np.maximum(np.max(np.abs(x), axis=1, keepdims=True) / F32(448), F32(1.0 / 229376.0)).astype(F32)
    q = e4m3(np.clip(x / s, -448, 448))
    return f32(q) * s


def groups(x, g):
    """[rows, cols] -> [rows, ngroups, g], zero padded along cols."""
    r, c = x.shape
    n = -(-c // g)
    p = np.zeros((r, n * g), dtype=F32)
    p[:, :c] = x
    return p.reshape(r, n, g)


def q_group128(x):
    x = f32(x)
    r, c = x.shape
    b = groups(x, 128)
    s = (np.maximum(np.max(np.abs(b), axis=2, keepdims=True), F32(1e-10)) / F32(448)).astype(F32)
    q = e4m3(np.clip(b / s, -448, 448))
    return (f32(q) * s).reshape(r, -1)[:, :c]


def q_block128(x):
    x = f32(x)
    r, c = x.shape
    R, C = -(-r // 128) * 128, -(-c // 128) * 128
    p = np.zeros((R, C), dtype=F32)
    p[:r, :c] = x
    b = p.reshape(R // 128, 128, C // 128, 128)
    amax = np.max(np.abs(b), axis=(1, 3), keepdims=True)
    s = (np.maximum(amax, F32(1e-4)) / F32(448)).astype(F32)
    q = e4m3(f32(b * rcp(s)))
    return (f32(q) * s).reshape(R, C)[:r, :c]


def q_mxfp8(x):
    x = f32(x)
    r, c = x.shape
    b = groups(x, 32)
    s = ceil2((np.max(np.abs(b), axis=2, keepdims=True) / F32(448)).astype(F32))
    s = np.where(s == 0, F32(2.0 ** -127), s).astype(F32)  # an all-zero block: E8M0's smallest scale, payload 0
    q = e4m3(f32(b * rcp(s)))
    return (f32(q) * s).reshape(r, -1)[:, :c]


def q_nvfp4(x):
    x = f32(x)
    r, c = x.shape
    amax = F32(np.max(np.abs(x)))
    g = (F32(2688) / amax).astype(F32) if amax > 0 else F32(1)  # an all-zero tensor: global scale 1, payload 0
    b = groups(x, 16)
    bmax = np.max(np.abs(b), axis=2, keepdims=True)
    sf = f32(e4m3(np.minimum(g * f32(bmax * rcp(6)), F32(448))))
    with np.errstate(divide="ignore"):
        out = np.where(sf != 0, rcp(f32(sf * rcp(g))), F32(0)).astype(F32)
    q = e2m1(np.clip(f32(b * out), -6, 6))
    return (f32(q) * f32(sf / g)).reshape(r, -1)[:, :c]


QUANT = {"none": lambda x: x, "fp8_tensor": q_tensor, "fp8_channel": q_row, "fp8_token": q_row,
         "fp8_group128": q_group128, "fp8_block128": q_block128, "mxfp8": q_mxfp8, "nvfp4": q_nvfp4}

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
            Wq = W if fmt == "none" else QUANT[fmt](W).astype(np.float64)
            r, g = dy @ W, dy @ Wq
        else:
            M = dy.shape[0]
            if grp + "/inputs/x" in f:
                ds = f[grp + "/inputs/x"]
                X = read(ds, e if ds.ndim == 3 else None)
            else:
                X = generated(rep["generated"]["seed"], "x", M, K)
            r, g = dy.T @ X, dy.T @ QUANT[fmt](X).astype(np.float64)
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
