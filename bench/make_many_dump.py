#!/usr/bin/env python3
"""make_many_dump.py: a qatcheck dump of N bias-less linear modules of one
shape (bench/vjp_stream.sh: the audit's peak memory against the dump's
size). Random bf16 x, W (scaled 1/sqrt(K)) and dY; the candidate
gradients are the float32 products rounded to bf16, as a BF16 trainer's
(fp32 accumulation, bf16 outputs). numpy only, on the CPU.
    make_many_dump.py OUT.h5 N [--m 256 --k 2048 --n 2048]"""
import argparse
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "scripts"))
import qcpython  # noqa: E402  (scripts/qcpython.py: the right interpreter)

qcpython.need("h5py", "numpy")
import h5py
import numpy as np


def bf16(a):
    """float32 -> bfloat16 bits (round to nearest even), uint16."""
    u = np.ascontiguousarray(a, dtype=np.float32).view(np.uint32)
    return ((u + 0x7FFF + ((u >> 16) & 1)) >> 16).astype(np.uint16)


def f32(b):
    return (b.astype(np.uint32) << 16).view(np.float32)


def put(g, name, bits):
    g.create_dataset(name, data=bits).attrs["dtype"] = "bfloat16"


def put_linear(f, path, x, w, dy, dx, dw):
    """One bias-less linear module group at path of open dump f: x [M, K],
    w [N, K], dy [M, N] and the candidate's d_x, d_weight, each bf16 bits
    (uint16), the weight unquantized (bench/make_big_dump.py's too)."""
    m = f.create_group(path)
    m.attrs["class"] = "linear"
    m.attrs["contract"] = '{"weight_format": "none", "dx_weight": "master"}'
    put(m.require_group("inputs"), "x", x)
    put(m.require_group("params"), "weight", w)
    put(m.require_group("grad_out"), "dy", dy)
    gg = m.require_group("grads").require_group("dy")
    put(gg, "d_x", dx)
    put(gg, "d_weight", dw)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("out")
    ap.add_argument("n_modules", type=int)
    ap.add_argument("--m", type=int, default=256)
    ap.add_argument("--k", type=int, default=2048)
    ap.add_argument("--n", type=int, default=2048)
    a = ap.parse_args()
    r = np.random.default_rng(7)
    with h5py.File(a.out, "w") as f:
        f.attrs["qatcheck_dump"] = 1
        for i in range(a.n_modules):
            x = bf16(r.standard_normal((a.m, a.k), dtype=np.float32))
            w = bf16(r.standard_normal((a.n, a.k), dtype=np.float32) / np.float32(a.k ** 0.5))
            dy = bf16(r.standard_normal((a.m, a.n), dtype=np.float32))
            put_linear(f, "/model.layers.%d.proj" % i, x, w, dy, bf16(f32(dy) @ f32(w)), bf16(f32(dy).T @ f32(x)))


if __name__ == "__main__":
    main()
