#!/usr/bin/env python3
"""make_diag_dump.py: write a qatcheck dump with one planted defect per
diagnosis hypothesis (docs/tolerances.md, "Diagnosis"), each in its own
module group, beside correct modules, so that tests/e2e/diagnose.sh can check
that every failed check's diagnosis names its planted cause and that nothing
is diagnosed where nothing failed. Candidates are computed as a BF16 trainer
computes them (bf16 operands, float32 accumulation, bf16 outputs) for the
linear groups; the attention group is a float32 flash backward.

    make_diag_dump.py OUT.h5 [--seed S]

Groups (linear [M=96, K=64, N=64] unless stated; the hypothesis expected):
  /ok.linear                        correct                          -
  /ok.mlp.experts.0.down_proj       correct                          -
  /defect.doubled                   d_weight x 2                     factor (2)
  /defect.halved                    d_x x 0.5                        factor (1/2)
  /defect.mlp.experts.1.down_proj   d_weight x 1/8 (expert path)     factor (1/8, expert-DP)
  /defect.sign                      d_x negated                      sign
  /defect.transposed_dw             d_weight transposed              transpose
  /defect.shifted_rows              d_x rows shifted by 2            rows
  /defect.permuted_rows             d_x rows permuted                rows
  /defect.dx_master                 fp8_channel contract, d_x from the master weight   dx_convention
  /defect.weight_t                  d_x = dY W^T                     weight_transposed
  /defect.stale_weight              d_x from a weight with 5% noise  other_weight
  /defect.dy_fp8                    d_x, d_weight from an e4m3-rounded dY (per-tensor scale)  dy_precision
  /defect.frozen_zero               params/weight frozen, d_weight present and zero   zero
  /defect.cut_dx                    d_x zero                          zero
  /defect.nan                       one NaN in d_x                    nonfinite
  /defect.attention_head            attention [B=1, Hq=4, Hkv=2, S=24, D=16]: d_q of head 2 zero   slice
  /ok.attention                     the same, correct                 -
"""
import argparse
import json
import sys

import h5py
import numpy as np

sys.path.insert(0, __file__.rsplit("/", 1)[0])
import bf16  # noqa: E402
from make_class_dump import attention_fwd, attention_vjp  # noqa: E402

F = np.float32


def e4m3(a):
    """float32 -> nearest float8_e4m3fn value (RNE, saturating at 448), as float32."""
    import ml_dtypes
    return np.clip(a, -448, 448).astype(ml_dtypes.float8_e4m3fn).astype(F)


def linear_grads(x, w, dy):
    return (bf16.round_(np.matmul(dy, w, dtype=F)), bf16.round_(np.matmul(dy.T, x, dtype=F)),
            bf16.round_(dy.sum(axis=0, dtype=F)))


def linear(f, path, x, w, b, dy, defect=None, rng=None, contract=None):
    g = f.create_group(path)
    g.attrs["class"] = "linear"
    g.attrs["contract"] = json.dumps(contract or {"weight_format": "none", "dx_weight": "master"})
    bf16.write(g.require_group("inputs"), "x", x)
    wd = bf16.write(g.require_group("params"), "weight", w)
    bf16.write(g["params"], "bias", b)
    bf16.write(g.require_group("grad_out"), "dy", dy)
    dx, dw, db = linear_grads(x, w, dy)
    acc_dx, acc_dw = np.matmul(dy, w, dtype=F), np.matmul(dy.T, x, dtype=F)
    if defect == "doubled":
        dw = bf16.round_(acc_dw * F(2))
    elif defect == "halved":
        dx = bf16.round_(acc_dx * F(0.5))
    elif defect == "eighth":
        dw = bf16.round_(acc_dw / F(8))
    elif defect == "sign":
        dx = -dx
    elif defect == "transposed_dw":
        dw = dw.T.copy()
    elif defect == "shifted_rows":
        dx = np.concatenate([np.zeros((2, dx.shape[1]), F), dx[:-2]])
    elif defect == "permuted_rows":
        p = np.arange(dx.shape[0])
        for i in range(0, 24, 2):
            p[[i, 40 + i]] = p[[40 + i, i]]
        dx = dx[p]
    elif defect == "weight_t":
        dx = bf16.round_(np.matmul(dy, w.T, dtype=F))
    elif defect == "stale_weight":
        ws = bf16.round_(w * (1 + 0.05 * rng.standard_normal(w.shape).astype(F)))
        dx = bf16.round_(np.matmul(dy, ws, dtype=F))
    elif defect == "dy_fp8":
        s = F(np.abs(dy).max() / 448)
        dq = e4m3(dy / s) * s
        dx, dw, _ = linear_grads(x, w, dq)
    elif defect == "frozen_zero":
        wd.attrs["frozen"] = "1"
        dw = np.zeros_like(dw)
    elif defect == "cut_dx":
        dx = np.zeros_like(dx)
    elif defect == "nan":
        dx = dx.copy()
        dx[50, 7] = np.nan
    gg = g.require_group("grads").require_group("dy")
    bf16.write(gg, "d_x", dx)
    bf16.write(gg, "d_weight", dw)
    bf16.write(gg, "d_bias", db)


def attention(f, path, rng, defect=None):
    nrm = lambda *s: bf16.round_(rng.standard_normal(s).astype(F))  # noqa: E731
    q, k, v = nrm(1, 4, 24, 16), nrm(1, 2, 24, 16), nrm(1, 2, 24, 16)
    sc = 1 / np.sqrt(16)
    o64, lse64 = attention_fwd(q, k, v, sc, True)
    o, lse = o64.astype(F), lse64.astype(F)
    dy = nrm(1, 4, 24, 16)
    gr = attention_vjp(q, k, v, o, lse, dy, sc, True)
    if defect == "head":
        gr["d_q"][:, 2] = 0
    g = f.create_group(path)
    g.attrs["class"] = "attention"
    g.attrs["contract"] = json.dumps({"causal": True})
    for name, t in (("q", q), ("k", k), ("v", v)):
        bf16.write(g.require_group("inputs"), name, t)
    g.require_group("saved").create_dataset("out", data=o)
    g["saved"].create_dataset("lse", data=lse)
    bf16.write(g.require_group("grad_out"), "dy", dy)
    for name, t in gr.items():
        g.require_group("grads").require_group("dy").create_dataset(name, data=t)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("out")
    ap.add_argument("--seed", type=int, default=0)
    a = ap.parse_args()
    rng = np.random.default_rng(a.seed)
    m, k, n = 96, 64, 64
    x = bf16.round_(rng.standard_normal((m, k)).astype(F))
    w = bf16.round_((rng.standard_normal((n, k)) / np.sqrt(k)).astype(F))
    b = bf16.round_(0.1 * rng.standard_normal(n).astype(F))
    dy = bf16.round_(rng.standard_normal((m, n)).astype(F))
    with h5py.File(a.out, "w") as f:
        f.attrs["qatcheck_dump"] = 1
        linear(f, "/ok.linear", x, w, b, dy)
        linear(f, "/ok.mlp.experts.0.down_proj", x, w, b, dy)
        for name, d in (("doubled", "doubled"), ("halved", "halved"), ("mlp.experts.1.down_proj", "eighth"), ("sign", "sign"),
                        ("transposed_dw", "transposed_dw"), ("shifted_rows", "shifted_rows"),
                        ("permuted_rows", "permuted_rows"), ("weight_t", "weight_t"), ("stale_weight", "stale_weight"),
                        ("dy_fp8", "dy_fp8"), ("frozen_zero", "frozen_zero"), ("cut_dx", "cut_dx"), ("nan", "nan")):
            linear(f, "/defect." + name, x, w, b, dy, d, rng)
        linear(f, "/defect.dx_master", x, w, b, dy, None, rng, {"weight_format": "fp8_channel", "dx_weight": "dequant"})
        attention(f, "/ok.attention", np.random.default_rng(a.seed + 1))
        attention(f, "/defect.attention_head", np.random.default_rng(a.seed + 1), "head")


if __name__ == "__main__":
    main()
