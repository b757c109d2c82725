#!/usr/bin/env python3
"""make_linear_dump.py: write a small qatcheck dump of linear modules whose
candidate gradients were computed the way a BF16 trainer computes them (bf16
operands, fp32 accumulation, bf16 outputs), optionally with planted defects,
one module group per defect. Used by the demo, the committed case data and
the end-to-end tests.

    make_linear_dump.py OUT.h5 [--defects all|none|a,b,...] [--seed S] [--m M --k K --n N]

Defects (module group /defect.<name>):
  wrong_weight   d_x computed from a weight with 5% noise (a stale weight)
  transposed_dw  d_weight transposed (square weight)
  shifted_rows   d_x rows shifted by one token (visible under sparse dY)
  scaled_dw      d_weight scaled by 1.002
  nan            one NaN in d_x
  missing_bias   no d_bias
"""
import argparse
import sys

import qcpython  # noqa: E402  (scripts/qcpython.py: the right interpreter)

qcpython.need("h5py", "numpy")
import h5py
import numpy as np

sys.path.insert(0, __file__.rsplit("/", 1)[0])
import bf16  # noqa: E402

DEFECTS = ["wrong_weight", "transposed_dw", "shifted_rows", "scaled_dw", "nan", "missing_bias"]


def candidate(x, w, dy):
    """bf16 trainer backward: float32 GEMMs on bf16 values, bf16 results."""
    dx = bf16.round_(np.matmul(dy, w, dtype=np.float32))
    dw = bf16.round_(np.matmul(dy.T, x, dtype=np.float32))
    db = bf16.round_(dy.sum(axis=0, dtype=np.float32))
    return dx, dw, db


def sparse_dy(rng, m, n):
    dy = np.zeros((m, n), np.float32)
    rows = rng.random(m) < 0.1
    cols = rng.random(n) < 0.1
    rows[rng.integers(m)] = True
    cols[rng.integers(n)] = True
    dy[np.ix_(rows, cols)] = rng.standard_normal((rows.sum(), cols.sum()))
    return bf16.round_(dy)


def write_module(f, path, x, w, b, dys, defect=None, seed=0):
    g = f.create_group(path)
    g.attrs["class"] = "linear"
    g.attrs["contract"] = '{"weight_format": "none", "dx_weight": "master"}'
    bf16.write(g.require_group("inputs"), "x", x)
    bf16.write(g.require_group("params"), "weight", w)
    bf16.write(g["params"], "bias", b)
    rng = np.random.default_rng(seed + 99)
    for name, dy in dys.items():
        bf16.write(g.require_group("grad_out"), name, dy)
        wx = w
        if defect == "wrong_weight":
            wx = bf16.round_(w * (1 + 0.05 * rng.standard_normal(w.shape).astype(np.float32)))
        dx, _, _ = candidate(x, wx, dy)
        _, dw, db = candidate(x, w, dy)
        if defect == "transposed_dw":
            dw = dw.T.copy()
        if defect == "shifted_rows":
            dx = np.roll(dx, 1, axis=0)
        if defect == "scaled_dw":  # a scale error inside the backward, before its bf16 output rounding
            dw = bf16.round_(np.matmul(dy.T, x, dtype=np.float32) * np.float32(1.002))
        if defect == "nan":
            dx = dx.copy()
            dx[dx.shape[0] // 2, 3] = np.nan
        gg = g.require_group("grads").require_group(name)
        bf16.write(gg, "d_x", dx)
        bf16.write(gg, "d_weight", dw)
        if defect != "missing_bias":
            bf16.write(gg, "d_bias", db)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("out")
    ap.add_argument("--defects", default="none")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--m", type=int, default=48)
    ap.add_argument("--k", type=int, default=64)
    ap.add_argument("--n", type=int, default=64)
    a = ap.parse_args()
    defects = DEFECTS if a.defects == "all" else [] if a.defects == "none" else a.defects.split(",")
    for d in defects:
        if d not in DEFECTS:
            sys.exit(f"make_linear_dump: unknown defect '{d}' (one of {', '.join(DEFECTS)})")
    if "transposed_dw" in defects and a.k != a.n:
        sys.exit("make_linear_dump: transposed_dw needs a square weight (--k == --n)")
    rng = np.random.default_rng(a.seed)
    m, k, n = a.m, a.k, a.n
    x = bf16.round_(rng.standard_normal((m, k)).astype(np.float32))
    w = bf16.round_((rng.standard_normal((n, k)) / np.sqrt(k)).astype(np.float32))
    b = bf16.round_(0.1 * rng.standard_normal(n).astype(np.float32))
    dys = {"dy": bf16.round_(rng.standard_normal((m, n)).astype(np.float32)), "dy_sparse": sparse_dy(rng, m, n)}
    with h5py.File(a.out, "w") as f:
        f.attrs["qatcheck_dump"] = 1
        write_module(f, "/model.layers.0.mlp.down_proj", x, w, b, dys, None, a.seed)
        for d in defects:
            write_module(f, f"/defect.{d}", x, w, b, dys, d, a.seed)


if __name__ == "__main__":
    main()
