#!/usr/bin/env python3
"""make_big_dump.py: a qatcheck dump of one prefill-sized linear module
(bias-less, as in most LLM projections) for bench/gpu_dump_e2e.sh. The
candidate gradients come from PyTorch on the GPU as a BF16 trainer computes
them (bf16 matmuls, fp32 accumulation, bf16 outputs).
    make_big_dump.py OUT.h5 [--m 8192 --k 7168 --n 4096]"""
import argparse

import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "scripts"))
import qcpython  # noqa: E402  (scripts/qcpython.py: the right interpreter)

qcpython.need("h5py", "numpy", "torch")
import h5py
import numpy as np
import torch

import make_many_dump  # noqa: E402  (bench/: the module group's writer)


def bits(t):
    """A bf16 tensor's bits as the dump schema stores them (uint16)."""
    return t.contiguous().view(torch.int16).cpu().numpy().view(np.uint16)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("out")
    ap.add_argument("--m", type=int, default=8192)
    ap.add_argument("--k", type=int, default=7168)
    ap.add_argument("--n", type=int, default=4096)
    a = ap.parse_args()
    g = torch.Generator(device="cuda").manual_seed(7)
    x = torch.randn(a.m, a.k, device="cuda", generator=g).bfloat16()
    w = (torch.randn(a.n, a.k, device="cuda", generator=g) / a.k ** 0.5).bfloat16()
    dy = torch.randn(a.m, a.n, device="cuda", generator=g).bfloat16()
    with h5py.File(a.out, "w") as f:
        f.attrs["qatcheck_dump"] = 1
        make_many_dump.put_linear(f, "/model.layers.0.mlp.down_proj", bits(x), bits(w), bits(dy), bits(dy @ w),
                                  bits(dy.t() @ x))


if __name__ == "__main__":
    main()
